"""A 2.6 GB model end to end (``make test-large``; not in ``make test``: ~15 GB of memory, minutes).

Four 12800 x 12800 float32 weights in an external data file: artifacts,
3 AdamW steps through ``jaxort.api`` against a float64 numpy reference on a
slice of the weights, the checkpoint (with its external data) saved and
reloaded, the inference export (over 2 GiB, so with external data) run in
onnxruntime. With ``JAXORT_ORT_TRAINING_PYTHON`` naming a Python that has
onnxruntime-training 1.19.2, ONNX Runtime also loads jaxort's checkpoint and
trains jaxort's artifacts. Each phase runs in its own process (large_worker.py),
so that its peak RSS is its own; the phases' times and memory are printed.
``JAXORT_LARGE_DIR`` keeps the files there (default: a temporary directory).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest
from _workers import run_worker

pytestmark = pytest.mark.large

WORKER = pathlib.Path(__file__).with_name("large_worker.py")
GB = 1e9


def _phase(python: str, phase: str, directory: pathlib.Path) -> dict:
    result = run_worker(WORKER, phase, directory, python=python, timeout=3600)
    print(f"\n{phase}: {json.dumps(result, indent=1)}")
    return result


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    given = os.environ.get("JAXORT_LARGE_DIR")
    if given:
        path = pathlib.Path(given)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("large")


def test_a_2_6_gb_model_trains_saves_and_exports(directory):
    made = _phase(sys.executable, "make", directory)
    weights = made["weights_bytes"]
    assert weights > 2.5e9

    arts = _phase(sys.executable, "artifacts", directory)
    # ORT's SaveCheckpoint layout above 1800 MiB: the tensors in checkpoint.data.
    assert arts["files"]["checkpoint.data"] >= weights and arts["files"]["checkpoint"] < 1 << 20
    assert max(arts["files"][f] for f in ("training_model.onnx", "eval_model.onnx")) < 1 << 20

    trained = _phase(sys.executable, "train", directory)
    assert trained["max_param_diff"] < 1e-6
    assert abs(trained["losses"][0] - trained["first_loss_ref"]) <= 1e-4 * trained["first_loss_ref"]
    # Parameters, gradients and two AdamW moments; activations are a few rows of 12800.
    floor = 4 * weights + 16 * 4 * 12800 * 4
    assert trained["steps_peak_rss"] <= 1.3 * floor, (trained["steps_peak_rss"] / GB, floor / GB)
    # The saved checkpoint: parameters and both moments in its external data file.
    assert trained["checkpoint_files"]["checkpoint.data"] >= 3 * weights
    assert trained["reload_equal"]
    assert trained["reload_moments"] == ["momentum0", "momentum1"] and trained["reload_step"] == 3
    assert trained["export_files"]["inference.onnx"] < 1 << 20
    assert trained["export_files"]["inference.onnx.data"] >= weights

    ran = _phase(sys.executable, "ort_run", directory)
    assert ran["max_diff"] <= 1e-4 * ran["scale"]


def test_onnx_runtime_training_reads_the_checkpoint_and_trains_the_artifacts(directory):
    python = os.environ.get("JAXORT_ORT_TRAINING_PYTHON")
    if not python:
        pytest.skip("JAXORT_ORT_TRAINING_PYTHON names no Python with onnxruntime-training 1.19.2")
    if not (directory / "trained_slices.npz").exists():
        pytest.skip("the jaxort phases did not run")
    result = _phase(python, "ort_checkpoint", directory)
    assert result["params_equal"]
    assert abs(result["first_loss"] - result["jaxort_first_loss"]) <= 1e-5 * result["first_loss"]
