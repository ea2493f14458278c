"""The working-size benchmark's smoke mode (``python benchmarks/scale.py --smoke``).

Exports tiny versions of S1 (ResNet-18) and S4 (BERT) and runs them for two
rounds in a subprocess, then checks what the benchmark reports, never how
fast anything is: every system has positive step times, jaxort.api starts
from ORT's loss on ORT's artifacts, each ratio is the median of the per-round
ratios, and the table names the command and the processor.

Needs torch, torchvision (imported through tools/make_model_corpus.py's
helper), transformers and onnxruntime-training (the oracle environment);
skipped elsewhere. Takes a few minutes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import statistics
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _require_oracle_libraries():
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime.training")
    spec = importlib.util.spec_from_file_location("make_model_corpus", ROOT / "tools" / "make_model_corpus.py")
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    try:
        corpus._import_torchvision()  # before transformers, which imports torchvision
    except ImportError as exc:
        pytest.skip(f"torchvision does not import: {exc}")
    pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    _require_oracle_libraries()
    out, cache = tmp_path_factory.mktemp("scale-out"), tmp_path_factory.mktemp("scale-cache")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--smoke", "--out", str(out),
                          "--cache", str(cache)], capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((out / "scale.json").read_text()), (out / "scale.md").read_text()


def _rows(report, threads="default"):
    return {c["model"]: c for c in report["configs"] if c["threads"] == threads}


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_s1_and_s4_run_every_system_with_positive_step_times(smoke):
    report, _ = smoke
    rows = _rows(report)
    assert set(rows) == {"S1", "S4"}
    for name, row in rows.items():
        assert {"ort", "api", "core", "torch"} <= set(row["systems"]), name
        for system, figures in row["systems"].items():
            assert len(figures["rounds_s"]) == report["rounds"] == 2, (name, system)
            assert all(_positive(t) for t in figures["rounds_s"]), (name, system)
            assert figures["s_per_step"]["min"] <= figures["s_per_step"]["median"] <= figures["s_per_step"]["max"]
            assert _positive(figures["first_step_s"]) and _positive(figures["build_s"]), (name, system)
        assert _positive(row["peak_rss_mb"])
        for when in ("cold", "warm"):
            assert _positive(row["api_compilation_cache"][when]["first_step_s"]), (name, when)


# BatchNorm over a batch of 2 (S1's last stage: 2 values per channel) leaves
# float32 rounding less room than BERT's layers do.
@pytest.mark.parametrize("name, rtol", [("S4", 1e-4), ("S1", 1e-3)])
def test_jaxort_starts_from_orts_loss(smoke, name, rtol):
    row = _rows(smoke[0])[name]
    ort = row["systems"]["ort"]["first_loss"]
    assert math.isfinite(ort)
    assert row["systems"]["api"]["first_loss"] == pytest.approx(ort, rel=rtol)
    assert row["systems"]["core"]["first_loss"] == pytest.approx(ort, rel=rtol)
    assert row["api_compilation_cache"]["cold"]["first_loss"] == pytest.approx(ort, rel=rtol)
    assert row["api_compilation_cache"]["warm"]["first_loss"] == pytest.approx(ort, rel=rtol)


def test_ratios_are_medians_of_paired_rounds(smoke):
    for row in _rows(smoke[0]).values():
        ort = row["systems"]["ort"]["rounds_s"]
        for system in ("api", "core", "torch"):
            paired = [o / t for t, o in zip(row["systems"][system]["rounds_s"], ort)]
            assert row["ratios"][f"{system}/ort"]["median"] == pytest.approx(statistics.median(paired), rel=1e-9)


def test_table_starts_with_the_command_and_names_the_machine(smoke):
    report, table = smoke
    assert table.startswith("`python benchmarks/scale.py --smoke")
    cpu = report["machine"]["cpu"]
    assert isinstance(cpu, str) and cpu and f"CPUs ({cpu})" in table
    for pkg in ("jax", "jaxlib", "onnxruntime-training", "torch"):
        assert f"{pkg} {report['machine']['versions'][pkg]}" in table
    assert "| S1 " in table and "| S4 " in table
