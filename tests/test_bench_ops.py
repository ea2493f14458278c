"""The per-op benchmark's smoke mode (``python benchmarks/ops_vs_ort.py --smoke``).

Runs the tiny synthetic ops in a subprocess and checks what the benchmark
reports, never how fast anything is: jaxort's forward of every op matches the
reference (ORT, and onnx.reference's numpy forward), its gradients match ORT's
kernels where the installed onnxruntime has them (else the row says so), every
time is finite and positive, the FLOP counts follow the formula, the ratios
are medians of paired rounds, and the markdown shows the JSON's fields.
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
    out = tmp_path_factory.mktemp("bench-ops")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ops_vs_ort.py"), "--smoke", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    return json.loads((out / "ops_vs_ort.json").read_text()), (out / "ops_vs_ort.md").read_text()


def _rows(result):
    (config,) = result["configs"]
    return config["rows"]


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _row(result, cls, x_shape):
    (row,) = [r for r in _rows(result) if r["class"] == cls and r["inputs"][0] == x_shape]
    return row


def test_every_op_is_measured_without_error(smoke):
    result, _ = smoke
    rows = _rows(result)
    assert {r["op"] for r in rows} == {"Conv", "BatchNormalization", "Relu", "MaxPool", "GlobalAveragePool",
                                       "AveragePool"}
    assert {"stem/kxk", "3x3 s1", "3x3 s2", "pointwise 1x1", "depthwise 3x3", "depthwise 5x5"} <= {
        r["class"] for r in rows}
    assert [r["error"] for r in rows] == [None] * len(rows)


def test_jaxort_forward_matches_the_reference(smoke):
    result, _ = smoke
    for row in _rows(result):
        name = f"{row['class']} {row['shape']}"
        # onnx.reference in smoke mode always, and ORT when its forward ran.
        assert row["fwd_numpy_ok"] is True, (name, row["fwd_numpy_max_diff"])
        assert row["fwd_reference"] in ("ORT", "onnx.reference"), name
        assert row["fwd_ok"] is True, (name, row["fwd_max_diff"])
        if row["fwd_reference"] == "ORT":
            assert _positive(row["ort_fwd_ms"]), name


def test_backward_matches_ort_or_says_why_not(smoke):
    result, _ = smoke
    for row in _rows(result):
        name = f"{row['class']} {row['shape']}"
        if row["ort_bwd_ms"] is None:
            assert row["ort_bwd_missing"], name
            assert row["bwd_ok"] is None and row["bwd_max_diff"] is None, name
        else:
            assert row["ort_bwd_missing"] is None and row["ort_bwd_op"], name
            assert row["bwd_ok"] is True, (name, row["bwd_max_diff"])
    try:
        import onnxruntime.training  # noqa: F401
    except ImportError:
        # The inference package has none of ORT's gradient kernels.
        assert all(r["ort_bwd_missing"].startswith("no ORT kernel") for r in _rows(result)
                   if r["ort_fwd_ms"] is not None)
    else:
        assert all(r["ort_bwd_ms"] is not None for r in _rows(result))


def test_times_are_finite_and_positive(smoke):
    result, _ = smoke
    rounds = result["settings"]["rounds"]
    for row in _rows(result):
        for system, times in row["rounds_ms"].items():
            assert len(times) == rounds and all(_positive(t) for t in times), (row["shape"], system)
            if system != "matmul":  # matmul_ms is scaled to the Conv's FLOPs
                assert row[f"{system}_ms"] == pytest.approx(statistics.median(times))
        for key in ("jaxort_fwd_ms", "jaxort_bwd_ms", "rate_jaxort_fwd", "rate_jaxort_bwd"):
            assert _positive(row[key]), (row["shape"], key)
        if row["op"] == "Conv":
            assert _positive(row["matmul_ms"]) and _positive(row["matmul_gflops"]), row["shape"]
            assert _positive(row["jaxort_fwd_of_matmul"])
        else:
            assert row["matmul_ms"] is None


def test_ratios_are_medians_of_paired_rounds(smoke):
    result, _ = smoke
    for row in _rows(result):
        for phase in ("fwd", "bwd"):
            ort, jax = row["rounds_ms"].get(f"ort_{phase}"), row["rounds_ms"][f"jaxort_{phase}"]
            if ort is None:
                assert row[f"{phase}_ratio"] is None
                continue
            expected = statistics.median(o / j for o, j in zip(ort, jax))
            assert row[f"{phase}_ratio"]["median"] == pytest.approx(expected, rel=1e-9)


def test_work_follows_the_formula(smoke):
    result, _ = smoke
    # A 3x3 Conv 4 -> 8 channels over 8x8, batch 2, pads 1, stride 1: 2 N Co (Ci/group) k k H W.
    conv = _row(result, "3x3 s1", [2, 4, 8, 8])
    assert conv["flops_fwd"] == 2 * 2 * 8 * 4 * 3 * 3 * 8 * 8 == 73728
    assert conv["flops_bwd"] == 2 * conv["flops_fwd"]  # dX and dW
    # Depthwise 3x3 over 8 channels: one input channel per group.
    dw = _row(result, "depthwise 3x3", [2, 8, 8, 8])
    assert dw["flops_fwd"] == 2 * 2 * 8 * 1 * 3 * 3 * 8 * 8
    # The stem's input needs no gradient: dW alone.
    stem = _row(result, "stem/kxk", [2, 3, 16, 16])
    assert stem["flops_fwd"] == 2 * 2 * 8 * 3 * 7 * 7 * 8 * 8 and stem["flops_bwd"] == stem["flops_fwd"]
    # Memory-bound ops count float32 bytes: Relu reads X and writes Y; its gradient reads dY, Y and writes dX.
    relu = _row(result, "Relu", [2, 8, 8, 8])
    assert relu["flops_fwd"] is None
    assert relu["bytes_fwd"] == 4 * 2 * 1024 and relu["bytes_bwd"] == 4 * 3 * 1024
    assert relu["rate_jaxort_fwd"] == pytest.approx(relu["bytes_fwd"] / (relu["jaxort_fwd_ms"] * 1e-3) / 1e9)
    assert conv["rate_jaxort_fwd"] == pytest.approx(conv["flops_fwd"] / (conv["jaxort_fwd_ms"] * 1e-3) / 1e9)


def test_markdown_shows_the_json_fields(smoke):
    result, table = smoke
    assert table.startswith("`python benchmarks/ops_vs_ort.py --smoke")
    # Results differ from one processor to another: the table says which one made them.
    cpu = result["machine"]["cpu"]
    assert isinstance(cpu, str) and cpu and f"CPUs ({cpu})" in table
    assert "jax " in table and "onnx " in table
    headers = [h for h, _ in result["columns"]]
    assert "| " + " | ".join(headers) + " |" in table
    for row in _rows(result):
        for _, keys in result["columns"]:
            assert all(k in row for k in keys), keys
        assert f"| {row['model']} | {row['class']} | {row['shape']} | {row['count']} |" in table
    (config,) = result["configs"]
    total = [s for s in config["summary"] if s["class"] == "all classes"]
    assert len(total) == 1
    # The summary sums count x median ms over the instances.
    assert total[0]["jaxort_fwd_ms"] == pytest.approx(sum(r["count"] * r["jaxort_fwd_ms"] for r in _rows(result)))
    assert "Where the step's time goes" in table
