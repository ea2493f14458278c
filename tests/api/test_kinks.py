"""Gradients exactly on the kinks of Relu, LeakyRelu, Clip and Abs: ONNX Runtime's subgradients.

tests/fixtures/ort_kinks/ holds ORT Training 1.19.2's artifacts of a model
applying the four ops to ``x + b`` and what ORT computed for a batch with
values on every kink: the loss and ``b`` after one SGD step at learning rate
1 (tools/make_kink_fixtures.py). ORT's kernels take PyTorch's conventions
there (Relu' = 0 and Abs' = 0 at 0, LeakyRelu' = alpha at 0, Clip' = 1 at
both bounds), where jaxort's earlier formulas (JAX's rules for max, min and
abs, a select for LeakyRelu) gave 1/2, 1, 1 and 1/2: jaxort follows ORT.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from jaxort import session as js
from jaxort.api import CheckpointState, Module, Optimizer
from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

CASE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "ort_kinks"


@pytest.fixture(scope="module")
def expected():
    with np.load(CASE / "expected.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module", params=["ort", "jaxort"])
def folder(request, tmp_path_factory):
    if request.param == "ort":
        return CASE
    out = tmp_path_factory.mktemp("kinks")
    generate_artifacts(str(CASE / "model.onnx"), requires_grad=["b"], loss=LossType.MSELoss,
                       optimizer=OptimType.SGD, artifact_directory=str(out))
    return out


def test_api_step_gives_orts_subgradients(folder, expected):
    state = CheckpointState.load_checkpoint(str(folder / "checkpoint"))
    module = Module(str(folder / "training_model.onnx"), state, str(folder / "eval_model.onnx"))
    optimizer = Optimizer(str(folder / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(1.0)
    loss = module(expected["x"], expected["target"])
    optimizer.step()
    np.testing.assert_allclose(loss, expected["loss"], rtol=1e-6)
    np.testing.assert_allclose(module.get_contiguous_parameters().numpy().reshape(4, 6), expected["b_after"],
                               rtol=1e-6, atol=1e-7)


def test_session_gradients_are_orts(folder, expected):
    state = js.load_checkpoint(folder / "checkpoint")
    session = js.TrainingSession(state, folder / "training_model.onnx", folder / "eval_model.onnx",
                                 folder / "optimizer_model.onnx")
    (loss,) = session.train_step(expected["x"], expected["target"])
    np.testing.assert_allclose(loss, expected["loss"], rtol=1e-6)
    # SGD at learning rate 1 from b = 0: ORT's b after the step is minus its gradient.
    np.testing.assert_allclose(state.get_gradient("b"), -expected["b_after"], rtol=1e-6, atol=1e-7)
