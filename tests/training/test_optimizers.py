"""ORT optimizer transforms against a numpy transcription of ORT's CPU kernels."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import onnx
import optax
import pytest
from onnx import helper

from jaxort.errors import TrainingError
from jaxort.training import (
    linear_lr_schedule,
    optimizer_from_model,
    scale_by_ort_adamw,
    scale_by_ort_sgd,
)

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"
f32 = np.float32


def ort_adamw_numpy(w, g, m, v, lr, step, *, alpha, beta, eps, wd, adam_mode, correct_bias):
    """onnxruntime 1.19.2 AdamWOptimizer (cpu/optimizer/adamw/adamw.cc), float32 numpy."""
    alpha, beta, eps, wd, lr = f32(alpha), f32(beta), f32(eps), f32(wd), f32(lr)
    ac = bc = f32(1.0)
    lr_c = lr
    if correct_bias:
        # std::pow(float, int64) is computed in double and cast back to float.
        ac = f32(1.0) - f32(np.power(np.float64(alpha), step))
        bc = f32(1.0) - f32(np.power(np.float64(beta), step))
        lr_c = lr * (np.sqrt(bc) / ac)
    if adam_mode == 0:
        w = w - w * lr * wd
        m = alpha * m + (f32(1) - alpha) * g
        v = beta * v + (f32(1) - beta) * g * g
        w = w - (lr * m) / (ac * (np.sqrt(v / bc) + eps))
    else:
        m = alpha * m + (f32(1) - alpha) * g
        v = beta * v + (f32(1) - beta) * g * g
        w = w - lr_c * m / (np.sqrt(v) + eps)
        w = w - lr * wd * w
    return w, m, v


@pytest.mark.parametrize("adam_mode", [0, 1])
@pytest.mark.parametrize("correct_bias", [True, False])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adamw_matches_ort_kernel(adam_mode, correct_bias, wd):
    rng = np.random.default_rng(adam_mode * 10 + correct_bias * 2 + int(wd > 0))
    shapes = {"a": (7, 5), "b": (5,)}
    w = {k: rng.standard_normal(s).astype(f32) for k, s in shapes.items()}
    hp = dict(alpha=0.9, beta=0.999, eps=1e-6, wd=wd, adam_mode=adam_mode,
              correct_bias=correct_bias)
    tx = scale_by_ort_adamw(None, alpha=0.9, beta=0.999, epsilon=1e-6, weight_decay=wd,
                            adam_mode=adam_mode, correct_bias=correct_bias)
    update = jax.jit(tx.update)
    params = dict(w)
    state = tx.init(params)
    ref = {k: (w[k].copy(), np.zeros_like(w[k]), np.zeros_like(w[k])) for k in w}
    for step in range(1, 9):
        lr = f32(0.01 * step)
        g = {k: rng.standard_normal(s).astype(f32) * f32(10.0 ** rng.integers(-3, 1))
             for k, s in shapes.items()}
        updates, state = update(g, state, params, learning_rate=lr, step=step)
        params = optax.apply_updates(params, updates)
        for k in ref:
            ref[k] = ort_adamw_numpy(*ref[k][:1], g[k], *ref[k][1:], lr, step, **hp)
            np.testing.assert_allclose(np.asarray(params[k]), ref[k][0], rtol=2e-6, atol=1e-7)
            np.testing.assert_allclose(np.asarray(state.mu[k]), ref[k][1], rtol=1e-6, atol=1e-8)
            np.testing.assert_allclose(np.asarray(state.nu[k]), ref[k][2], rtol=1e-6, atol=1e-10)
    assert int(state.count) == 8


def test_adamw_standalone_uses_its_own_count_and_schedule():
    rng = np.random.default_rng(0)
    w = rng.standard_normal(6).astype(f32)
    schedule = lambda n: 0.1 / (n + 1.0)  # noqa: E731
    tx = scale_by_ort_adamw(schedule, adam_mode=1)
    params, state = {"w": w}, tx.init({"w": w})
    ref = (w.copy(), np.zeros_like(w), np.zeros_like(w))
    for n in range(4):
        g = rng.standard_normal(6).astype(f32)
        updates, state = tx.update({"w": g}, state, params)
        params = optax.apply_updates(params, updates)
        ref = ort_adamw_numpy(ref[0], g, ref[1], ref[2], f32(0.1 / (n + 1.0)), n + 1,
                              alpha=0.9, beta=0.999, eps=1e-6, wd=0.0, adam_mode=1,
                              correct_bias=True)
        np.testing.assert_allclose(np.asarray(params["w"]), ref[0], rtol=2e-6, atol=1e-7)


def test_sgd_matches_ort_kernel():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3)).astype(f32)
    g = rng.standard_normal((4, 3)).astype(f32)
    tx = scale_by_ort_sgd(None)
    updates, state = tx.update({"w": g}, tx.init({"w": w}), {"w": w}, learning_rate=f32(0.3))
    new = optax.apply_updates({"w": w}, updates)["w"]
    np.testing.assert_array_equal(np.asarray(new), w + (-f32(0.3)) * g)
    assert int(state.count) == 1


@pytest.mark.parametrize("case", ["mlp_adamw", "mlp_frozen", "mlp_sgd"])
def test_optimizer_model_attributes_are_read(case):
    manifest = json.loads((GOLDEN / case / "manifest.json").read_text())
    opt = optimizer_from_model(onnx.load(GOLDEN / case / "optimizer_model.onnx"))
    assert opt.optimizer_type == manifest["optimizer"]["type"]
    want = manifest["optimizer"]["attributes"]
    assert opt.hyperparameters.keys() >= want.keys()
    for k, v in want.items():
        assert np.float32(opt.hyperparameters[k]) == np.float32(v)


def test_unknown_optimizer_op_is_a_clear_error():
    node = helper.make_node("LambOptimizer", ["lr"], ["out"], domain="com.microsoft")
    graph = helper.make_graph([node], "opt", [], [])
    model = helper.make_model(graph)
    with pytest.raises(TrainingError, match="com.microsoft::LambOptimizer"):
        optimizer_from_model(model)


def test_nodes_beside_the_optimizer_node_are_refused_not_skipped():
    # onnxblock.optim.AdamW(clip_grad=ClipGradNorm(1.0)) puts an InplaceClipGradNorm on the
    # gradients before AdamWOptimizer; reading the model as plain AdamW would not clip.
    model = onnx.load(GOLDEN / "mlp_adamw" / "optimizer_model.onnx")
    (adamw,) = model.graph.node
    clip = helper.make_node("InplaceClipGradNorm", ["gradients"], ["clipped"], name="clip",
                            domain="com.microsoft", max_norm=1.0, norm_type="fro")
    adamw.input[3] = "clipped"
    model.graph.node.insert(0, clip)
    with pytest.raises(TrainingError, match=r"'clip' \(com.microsoft::InplaceClipGradNorm\).*"
                                            r"optax.clip_by_global_norm"):
        optimizer_from_model(model)


def test_linear_schedule_matches_ort_formula():
    for lr0, warmup, total in [(0.05, 2, 6), (1.0, 0, 4), (0.3, 5, 5), (0.1, 3, 10)]:
        s = jax.jit(linear_lr_schedule(lr0, warmup, total))
        for n in range(total + 3):
            if n < warmup:
                factor = f32(n) / f32(max(1, warmup))
            else:
                factor = max(f32(0), f32(total - n) / f32(max(1, total - warmup)))
            assert f32(s(n)) == f32(lr0) * f32(factor), (lr0, warmup, total, n)
