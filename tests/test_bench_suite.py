"""The benchmark suite's smoke mode (``python benchmarks/suite.py --smoke``).

Runs W5 for a few seconds in a subprocess and checks what the suite reports,
never how fast anything is: every system trains the same model from the same
weights, so their first losses must agree with the hand-written JAX network's;
each ratio must be the median of the per-round ratios of the two systems'
figures; the checkpoint and soak sections must hold finite positive numbers;
the table names the processor.
"""

from __future__ import annotations

import json
import math
import pathlib
import statistics
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite.py"), "--smoke",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=600)
    return json.loads((out / "smoke.json").read_text()), (out / "smoke.md").read_text()


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_every_system_starts_from_the_hand_written_networks_loss(smoke):
    result, _ = smoke
    (config,) = result["configs"]
    systems = config["systems"]
    assert {"core", "core_steps", "api_own", "hand_jax"} <= set(systems)
    reference = systems["hand_jax"]["first_loss"]
    for name, figures in systems.items():
        assert figures["first_loss"] == pytest.approx(reference, rel=1e-5), name
        assert _positive(figures["train_steps_per_s"]["median"]), name
        lo, mid, hi = (figures["train_steps_per_s"][k] for k in ("min", "median", "max"))
        assert lo <= mid <= hi
        assert figures["train_steps_per_s"]["n"] == result["settings"]["rounds"]


def test_ratios_are_medians_of_paired_rounds(smoke):
    result, _ = smoke
    (config,) = result["configs"]
    assert config["ratios"]
    for key, summary in config["ratios"].items():
        pair, kind = key.split(":")
        a, b = pair.split("/")
        rounds = [x / y for x, y in zip(config["systems"][a][f"{kind}_rounds"],
                                        config["systems"][b][f"{kind}_rounds"])]
        assert summary["median"] == pytest.approx(statistics.median(rounds), rel=1e-9)


def test_checkpoint_soak_and_table(smoke):
    result, table = smoke
    assert all(_positive(v) for v in result["checkpoint"]["mb_per_s"].values())
    soak = result["soak"]
    assert soak["steps"] == result["settings"]["soak_steps"] and _positive(soak["steps_per_s"])
    steps = [row[0] for row in soak["rss_mb"]]
    assert steps == sorted(steps) and steps[-1] <= soak["steps"]
    assert "Train steps/s" in table and "W5" in table
    # Results differ from one processor to another: the table says which one made them.
    cpu = result["machine"]["cpu"]
    assert isinstance(cpu, str) and cpu and f"CPUs ({cpu})" in table
