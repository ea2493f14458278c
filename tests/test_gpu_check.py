"""tools/gpu_check.py, the accelerator check, in its CPU mode (so that it works when a device is lent).

The smoke run's W1 row trains the suite's MLP: its first loss is checked
against the same network's cross-entropy in numpy, its marked tests
against pytest's own counts; a failing marked test must fail the check.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402 - a script in tools/
import workloads  # noqa: E402 - a script in benchmarks/


def _w1_first_loss() -> float:
    w = workloads.build("W1")
    p = w.params
    x, y = (a.astype(np.float64) if a.dtype == np.float32 else a for a in w.batches[0])
    h = np.maximum(x @ p["fc1.weight"] + p["fc1.bias"], 0.0)
    logits = h @ p["fc2.weight"] + p["fc2.bias"]
    logits = logits - logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("OUT", None)
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--smoke", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def test_the_smoke_run_reports_the_environment_and_the_marked_tests(smoke):
    report, md = smoke
    env = report["environment"]
    assert env["backend"] == "cpu" and env["devices"][0].startswith("cpu:0")
    import jax
    import onnx

    assert env["versions"]["jax"] == jax.__version__ and env["versions"]["onnx"] == onnx.__version__
    tests = report["tests"]
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-m", "accelerator",
                                "-p", "no:cacheprovider", "tests/training/test_golden.py"],
                               cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    marked = sum(1 for line in collected.splitlines() if "::" in line)
    assert marked > 0 and tests["passed"] == marked and tests["failed"] == tests["errors"] == 0, tests
    assert tests["matmul_precision"] == "highest"
    assert report["passed"] is True
    assert f"{marked} passed, 0 failed" in md and "Backend **cpu**" in md


def test_the_smoke_run_trains_w1_from_the_suites_weights(smoke):
    report, md = smoke
    rows = {r["name"]: r for r in report["speed"]}
    assert set(rows) == {"W1", "S1"}
    jaxort = rows["W1"]["systems"]["jaxort"]
    assert jaxort["s_per_step"] > 0 and jaxort["first_step_s"] > 0
    np.testing.assert_allclose(jaxort["first_loss"], _w1_first_loss(), rtol=1e-5)
    for row in rows.values():  # where torch is not installed its systems say so instead of failing
        for system, figures in row["systems"].items():
            assert "error" not in figures, (row["name"], system, figures)
            assert "s_per_step" in figures or "ImportError" in figures["skipped"] or \
                "ModuleNotFoundError" in figures["skipped"]
    assert "| W1 " in md


def test_a_failing_marked_test_fails_the_check(tmp_path):
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.accelerator\n"
        "def test_fails():\n    assert 1 + 1 == 3, 'arithmetic'\n\n"
        "@pytest.mark.accelerator\n"
        "def test_passes():\n    assert 1 + 1 == 2\n\n"
        "def test_not_marked():\n    assert False\n")
    tests = gpu_check.run_tests(str(tmp_path), paths=[str(tmp_path / "test_marked.py")], timeout=120)
    assert (tests["passed"], tests["failed"], tests["errors"]) == (1, 1, 0)
    assert tests["failures"][0]["test"].endswith("test_fails") and "arithmetic" in tests["failures"][0]["message"]
    report = {"environment": gpu_check.environment(), "command": "x", "wall_s": 1.0, "tests": tests}
    assert gpu_check.passed(report) is False
    assert "FAILED `" in gpu_check.markdown(report)


def test_a_speed_row_that_errors_fails_the_check():
    def broken():
        raise ValueError("no such model")

    row = gpu_check._measure("X", "a model", {"jaxort": broken}, steps=1)
    assert row["systems"]["jaxort"] == {"error": "ValueError: no such model"}
    assert gpu_check.passed({"speed": [row]}) is False
    assert gpu_check.passed({"speed": [{"name": "S9", "skipped": "the speed budget of 1 s was spent"}]})


def test_unknown_sections_are_refused(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--sections", "tests,benchmarks"])
    assert "unknown sections ['benchmarks']" in capsys.readouterr().err


def test_a_test_run_past_its_time_is_stopped_and_keeps_its_results(tmp_path):
    (tmp_path / "test_slow.py").write_text(
        "import time\nimport pytest\n\n"
        "@pytest.mark.accelerator\n"
        "def test_a_passes():\n    assert 2 * 2 == 4\n\n"
        "@pytest.mark.accelerator\n"
        "def test_b_hangs():\n    time.sleep(120)\n")
    # Launched with SIGINT ignored, as from a background job, nohup or a pytest-xdist worker
    # (whose children inherit it): the check's interrupt still stops the run, which is not
    # killed 60 s later with its results lost.
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        tests = gpu_check.run_tests(str(tmp_path), paths=[str(tmp_path / "test_slow.py")], timeout=10, jobs=1)
    finally:
        signal.signal(signal.SIGINT, before)
    assert tests["interrupted"] == "stopped after 10 s" and tests["seconds"] < 60
    assert tests["passed"] == 1 and tests["errors"] >= 1
    assert gpu_check.passed({"tests": tests}) is False


def test_only_the_files_with_marked_tests_are_collected():
    # A device image lacks onnxruntime, which unmarked modules import: they are not collected.
    files = {os.path.relpath(p, ROOT) for p in gpu_check.marked_files()}
    assert {"tests/api/test_golden_replay.py", "tests/graph/ops/test_conv.py",
            "tests/training/test_sharding.py"} <= files
    assert "tests/api/test_api.py" not in files and "tests/training/test_artifacts.py" not in files
