"""com.microsoft ops of ONNX Runtime Training graphs, against numpy.

The training test uses ``tests/fixtures/ort_generated/bn_dropout_bce_sgd``,
artifacts written by onnxruntime-training 1.19.2 (see that folder's README):
ORT turns the model's BatchNormalization into com.microsoft::BatchNormInternal.
"""

import pathlib

import jax
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from jaxort import checkpoint
from jaxort.graph import JaxGraph
from jaxort.training import TrainProgram

COVERED_OPS = {"BatchNormInternal"}

_BN_CASE = pathlib.Path(__file__).parents[2] / "fixtures" / "ort_generated" / "bn_dropout_bce_sgd"


def _bn_internal_model(c, eps, momentum):
    node = helper.make_node(
        "BatchNormInternal", ["x", "scale", "b", "mean", "var"],
        ["y", "run_mean", "run_var", "saved_mean", "saved_inv_std"],
        domain="com.microsoft", epsilon=eps, momentum=momentum)
    outs = [helper.make_tensor_value_info(n, T.FLOAT, None)
            for n in ("y", "run_mean", "run_var", "saved_mean", "saved_inv_std")]
    graph = helper.make_graph(
        [node], "bn", [helper.make_tensor_value_info("x", T.FLOAT, ["N", c, 3])], outs,
        initializer=[numpy_helper.from_array(v, n) for n, v in (
            ("scale", np.linspace(0.5, 1.5, c, dtype=np.float32)),
            ("b", np.linspace(-1, 1, c, dtype=np.float32)),
            ("mean", np.full(c, 0.2, np.float32)),
            ("var", np.full(c, 1.5, np.float32)))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("training", [False, True])
def test_batch_norm_internal_matches_numpy(training):
    c, eps, momentum = 4, 1e-3, 0.8
    g = JaxGraph(_bn_internal_model(c, eps, momentum), check=False)
    x = np.random.default_rng(0).standard_normal((5, c, 3)).astype(np.float32)
    outs, updates = jax.jit(g.apply_with_updates, static_argnames="training")(
        g.params, x, training=training)
    y, run_mean, run_var, saved_mean, saved_inv_std = map(np.asarray, outs)
    p = {k: np.asarray(v, np.float64) for k, v in g.params.items()}
    bm = x.mean(axis=(0, 2), dtype=np.float64)
    bv = x.astype(np.float64).var(axis=(0, 2))
    ref_y = ((x - bm[:, None]) / np.sqrt(bv[:, None] + eps)) * p["scale"][:, None] + p["b"][:, None]
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_mean, momentum * p["mean"] + (1 - momentum) * bm, rtol=1e-6)
    np.testing.assert_allclose(run_var, momentum * p["var"] + (1 - momentum) * bv, rtol=1e-6)
    np.testing.assert_allclose(saved_mean, bm, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(saved_inv_std, 1 / np.sqrt(bv + eps), rtol=1e-5)
    if training:
        np.testing.assert_allclose(np.asarray(updates["mean"]), run_mean, rtol=0)
        np.testing.assert_allclose(np.asarray(updates["var"]), run_var, rtol=0)
    else:
        assert updates == {}


def test_ort_training_model_with_batchnorm_updates_running_stats():
    ckpt = checkpoint.load(_BN_CASE / "checkpoint")
    program = TrainProgram.from_artifacts(
        _BN_CASE / "training_model.onnx", _BN_CASE / "eval_model.onnx",
        _BN_CASE / "optimizer_model.onnx", checkpoint=ckpt)
    state = program.init_state(ckpt)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    target = (rng.random((8, 4)) > 0.5).astype(np.float32)
    frozen_before = {k: np.asarray(v) for k, v in state.frozen.items()}
    params = {k: np.asarray(v, np.float64) for k, v in state.params.items()}
    state, (loss,) = program.train_step(state, x, target)
    fc = x.astype(np.float64) @ params["fc.weight"] + params["fc.bias"]
    momentum = 0.9
    np.testing.assert_allclose(
        np.asarray(state.frozen["bn.running_mean"]),
        momentum * frozen_before["bn.running_mean"] + (1 - momentum) * fc.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(state.frozen["bn.running_var"]),
        momentum * frozen_before["bn.running_var"] + (1 - momentum) * fc.var(0), rtol=1e-5, atol=1e-6)
    assert np.isfinite(float(loss))
