"""Rematerialisation (``TrainProgram.from_artifacts(..., remat=...)``): the same gradients for less memory.

Its memory at working sizes is measured by ``benchmarks/remat.py``
(benchmarks/results/remat.md), not here.
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest

from jaxort import checkpoint as ckpt
from jaxort.errors import TrainingError
from jaxort.training import TrainProgram

MODELS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "models"


def _first_gradients(case: str, remat):
    root = MODELS / case
    info = json.loads((root / "case.json").read_text())
    start = ckpt.load(root / "checkpoint")
    program = TrainProgram.from_artifacts(root / "training_model.onnx", None, root / "optimizer_model.onnx",
                                          checkpoint=start, remat=remat)
    with np.load(root / "batches.npz") as f:
        inputs = [f[f"train::{name}"][0] for name in info["input_names"] + ["labels"]]
    state, outs = program.train_step(program.init_state(start), *inputs)
    grads = {k: np.asarray(v) for k, v in state.grads.items()}
    # BatchNorm's running statistics, written back by the train step
    grads.update({f"frozen::{k}": np.asarray(v) for k, v in state.frozen.items()})
    return grads, float(np.asarray(outs[0]))


@pytest.mark.parametrize("case", ["gpt2", "vit"])
@pytest.mark.parametrize("remat", ["dots", "nothing_saveable", jax.checkpoint_policies.everything_saveable])
def test_gradients_are_those_without_remat(case, remat):
    want, want_loss = _first_gradients(case, None)
    got, loss = _first_gradients(case, remat)
    assert loss == want_loss
    assert got.keys() == want.keys()
    # rtol 1e-6 on each tensor's scale (recomputed values fuse, and round, differently), and 1e-9
    # absolute for the gradients that are zero but for rounding (ViT's attention key bias).
    for name in want:
        atol = max(1e-6 * float(np.abs(want[name]).max()), 1e-9)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=atol, err_msg=name)


def test_batch_norm_statistics_and_shape_arithmetic_cross_segments():
    # ResNet-18's train step writes running statistics (updates made inside segments) and
    # reads shapes computed with numpy (static values crossing segments).
    want, want_loss = _first_gradients("resnet18", None)
    got, loss = _first_gradients("resnet18", "nothing_saveable")
    assert loss == want_loss and got.keys() == want.keys()
    assert any(k.startswith("frozen::") for k in want)
    # rtol 2e-5: the BatchNorm gradients sum 2048 products, in another order once fused apart.
    for name in want:
        atol = max(2e-5 * float(np.abs(want[name]).max()), 1e-9)
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=atol, err_msg=name)


def test_gradients_with_remat_are_ort_s():
    # The independent reference: ORT 1.19.2's first loss on its own artifacts, and float64
    # PyTorch's first gradients.
    grads, loss = _first_gradients("gpt2", "dots")
    with np.load(MODELS / "gpt2" / "expected.npz") as f:
        np.testing.assert_allclose(loss, f["losses"][0], rtol=1e-6)
    with np.load(MODELS / "gpt2" / "torch_reference.npz") as f:
        for name, g in grads.items():
            np.testing.assert_allclose(g, f[f"float64::grad0::{name}"], rtol=1e-3, atol=1e-5, err_msg=name)


def test_an_unknown_remat_is_named():
    root = MODELS / "gpt2"
    with pytest.raises(TrainingError, match=r"remat must be None, one of \['dots', 'dots_no_batch', "
                                            r"'nothing_saveable'\] or a jax.checkpoint policy, got 'some'"):
        TrainProgram.from_artifacts(root / "training_model.onnx", remat="some")


def test_the_facades_take_remat_and_train_to_ort_s_losses():
    # jaxort.api.Module(remat=...) and jaxort.session.TrainingSession(remat=...): ORT's own
    # losses on its GPT-2 artifacts (3 steps), and a program of their own per option.
    from jaxort import session
    from jaxort.api import CheckpointState, Module, Optimizer

    root = MODELS / "gpt2"
    info = json.loads((root / "case.json").read_text())
    with np.load(root / "batches.npz") as f:
        batches = [[f[f"train::{name}"][step] for name in info["input_names"] + ["labels"]] for step in range(3)]
    with np.load(root / "expected.npz") as f:
        want = f["losses"][:3]

    state = CheckpointState.load_checkpoint(str(root / "checkpoint"))
    module = Module(str(root / "training_model.onnx"), state, remat="dots")
    optimizer = Optimizer(str(root / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(info["learning_rate"])
    api_losses = []
    for batch in batches:
        api_losses.append(float(np.asarray(module(*batch))))
        optimizer.step()
        module.lazy_reset_grad()
    program = module._state.session_state.program
    assert program.remat == "dots"

    handle = session.load_checkpoint(root / "checkpoint")
    with session.TrainingSession(handle, root / "training_model.onnx", None, root / "optimizer_model.onnx",
                                 remat="nothing_saveable") as s:
        s.set_learning_rate(info["learning_rate"])
        session_losses = []
        for batch in batches:
            session_losses.append(float(s.train_step(*batch)[0]))
            s.optimizer_step()
            s.lazy_reset_grad()
        assert s._program.remat == "nothing_saveable" and s._program is not program
    np.testing.assert_allclose(api_losses, want, rtol=1e-5)
    np.testing.assert_allclose(session_losses, want, rtol=1e-5)
