"""SIGKILL during saves: every load afterwards is a complete version, and the next save leaves no temporary file.

The work is done by crash_driver.py in a fresh interpreter (it forks savers
and kills them: half at a random moment, half right after a chosen file
operation, i.e. between the two files' writes or between the renames).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

DRIVER = pathlib.Path(__file__).with_name("crash_driver.py")
ROOT = DRIVER.parents[2]


def run_driver(directory: pathlib.Path, mode: str, kills: int, seed: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(directory), mode, str(kills), str(seed)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("mode, kills", [("inline", 50), ("external", 50), ("mixed", 20)])
def test_killed_saves_leave_a_complete_version(tmp_path, mode, kills):
    out = run_driver(tmp_path, mode, kills, seed=kills)
    assert out["problems"] == []
    # The previous pair stays recoverable, so no load fails either.
    assert out["errors"] == []
    assert out["kills"] == out["complete"] == kills
    assert out["injected"] == kills // 2
    # Kills landed before and after renames (older and newer versions were
    # loaded), and some left temporary files that the next save removed.
    assert 0 < out["newer"] < kills
    assert out["temps_seen"] > 0 and out["cleanups"] >= kills // 3


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inline", "external", "mixed"])
def test_many_killed_saves(tmp_path, mode):
    out = run_driver(tmp_path, mode, 400, seed=7)
    assert out["problems"] == [] and out["errors"] == []
    assert out["kills"] == out["complete"] == 400
