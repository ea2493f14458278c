"""Normalizations (ops/norm.py) against ONNX's reference evaluator, and
BatchNormalization's training behaviour (batch statistics, running-statistic updates).
"""

from __future__ import annotations

import jax
import pytest
import numpy as np
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from jaxort.graph import JaxGraph
from jaxort.testing import run_jaxort

from ._harness import Example, F16, F32, F64, OpCase, nn_gradient_test, node, table_tests
from ._strategies import arr, floats, rand

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator

COVERED_OPS = {
    "BatchNormalization", "GroupNormalization", "InstanceNormalization", "LRN", "LayerNormalization", "LpNormalization",
    "MeanVarianceNormalization", "RMSNormalization",
}


@st.composite
def batch_norm_case(draw):
    dt = floats(draw)
    c = draw(st.integers(1, 3))
    shape = (draw(st.integers(1, 3)), c) + tuple(draw(st.integers(1, 3))
                                                 for _ in range(draw(st.integers(0, 2))))
    x = arr(draw, dt, shape)
    scale, b, mean = (arr(draw, dt, (c,)) for _ in range(3))
    var = arr(draw, dt, (c,), 0.5, 2.0)
    form = draw(st.sampled_from(["inference15", "training15", "inference14"]))
    attrs = dict(epsilon=draw(st.sampled_from([1e-5, 1e-2])))
    if form == "training15":
        attrs.update(training_mode=1, momentum=draw(st.sampled_from([0.9, 0.5])))
        return Example((x, scale, b, mean, var), attrs, 15, n_out=3)
    return Example((x, scale, b, mean, var), attrs, 15 if form == "inference15" else 14)


@st.composite
def layer_norm_case(draw):
    dt = floats(draw, (F32, F64, F16))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 4))))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    a = axis % len(shape)
    x = arr(draw, dt, shape)
    scale = arr(draw, dt, shape[a:])
    b = arr(draw, dt, shape[a:]) if draw(st.booleans()) else None
    n_out = 1 if dt == F16 else draw(st.integers(1, 3))
    return Example((x, scale, b), dict(axis=axis, epsilon=1e-3), n_out=n_out)


@st.composite
def rms_norm_case(draw):
    dt = floats(draw)
    shape = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 4))))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return Example((arr(draw, dt, shape), arr(draw, dt, shape[axis % len(shape):])),
                   dict(axis=axis, epsilon=1e-3), 23)


@st.composite
def instance_norm_case(draw):
    dt = floats(draw)
    c = draw(st.integers(1, 3))
    shape = (draw(st.integers(1, 2)), c) + tuple(draw(st.integers(2, 4))
                                                 for _ in range(draw(st.integers(1, 2))))
    return Example((arr(draw, dt, shape), arr(draw, dt, (c,)), arr(draw, dt, (c,))),
                   dict(epsilon=1e-3))


@st.composite
def group_norm_case(draw):
    dt = F32  # the reference's function body computes float64 input in float32
    g = draw(st.integers(1, 3))
    c = g * draw(st.integers(1, 2))
    opset = draw(st.sampled_from([18, 21]))
    shape = (draw(st.integers(1, 2)), c) + tuple(draw(st.integers(1, 3))
                                                 for _ in range(draw(st.integers(1, 2))))
    p = g if opset == 18 else c
    return Example((arr(draw, dt, shape), arr(draw, dt, (p,)), arr(draw, dt, (p,))),
                   dict(epsilon=1e-3, num_groups=g), opset)


@st.composite
def lrn_case(draw):
    dt = floats(draw)
    c = draw(st.integers(1, 5))
    x = arr(draw, dt, (c, c, 3, 2))  # the reference loops over range(N) for channels
    return Example((x,), dict(size=draw(st.sampled_from([1, 2, 3, 5])), alpha=1e-2, beta=0.75,
                              bias=draw(st.sampled_from([1.0, 2.0]))))


@st.composite
def lp_norm_case(draw):
    dt = floats(draw)
    shape = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 3))))
    p = draw(st.sampled_from([1, 2]))
    # The reference's L1 norm forgets abs(): positive data for p=1.
    x = arr(draw, dt, shape, 0.1, 2.0) if p == 1 else arr(draw, dt, shape)
    return Example((x,), dict(axis=draw(st.integers(-len(shape), len(shape) - 1)), p=p))


@st.composite
def mvn_case(draw):
    dt = F32  # the reference's function body has float32 constants
    x = arr(draw, dt, (2, 3, draw(st.integers(1, 3)), draw(st.integers(2, 3))))
    axes = draw(st.sampled_from([None, [0, 2, 3], [2, 3], [1]]))
    return Example((x,), {} if axes is None else {"axes": axes})


CASES = [
    OpCase("BatchNormalization", batch_norm_case(), scale=10),
    OpCase("LayerNormalization", layer_norm_case(), scale=100),
    OpCase("RMSNormalization", rms_norm_case(), scale=10, min_opset=23),
    OpCase("InstanceNormalization", instance_norm_case(), scale=100),
    OpCase("GroupNormalization", group_norm_case(), scale=100),
    OpCase("LRN", lrn_case(), scale=10),
    OpCase("LpNormalization", lp_norm_case(), scale=10),
    OpCase("MeanVarianceNormalization", mvn_case(), scale=100),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- gradients


GRAD_CASES = [
    ("BatchNormalization", lambda: (rand(3, 2, 2, 2), rand(2, seed=1), rand(2, seed=2),
                                    rand(2, seed=3), rand(2, seed=4, lo=0.5, hi=1.5)),
     dict(epsilon=1e-3), 15),
    ("BatchNormalization", lambda: (rand(3, 2, 2, 2), rand(2, seed=1), rand(2, seed=2),
                                    rand(2, seed=3), rand(2, seed=4, lo=0.5, hi=1.5)),
     dict(epsilon=1e-3, training_mode=1), 15),
    ("LayerNormalization", lambda: (rand(2, 3, 4), rand(3, 4, seed=1), rand(3, 4, seed=2)),
     dict(axis=1, epsilon=1e-3), None),
]

test_gradient_matches_finite_differences = nn_gradient_test(GRAD_CASES)


# --------------------------------------------------------------------------- specific behaviour


def _bn_graph(x_shape, momentum=0.9):
    rng = np.random.default_rng(0)
    c = x_shape[1]
    params = {"scale": rng.uniform(0.5, 1.5, c).astype(np.float32),
              "bias": rng.uniform(-1, 1, c).astype(np.float32),
              "mean": rng.uniform(-1, 1, c).astype(np.float32),
              "var": rng.uniform(0.5, 1.5, c).astype(np.float32)}
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"],
                            epsilon=1e-5, momentum=momentum)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape))],
        initializer=[numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    return JaxGraph(model), params


def test_batch_norm_training_uses_batch_stats_and_updates_running_stats():
    g, p = _bn_graph((4, 3, 2, 2), momentum=0.8)
    x = np.random.default_rng(1).normal(size=(4, 3, 2, 2)).astype(np.float32)
    (y,), updates = jax.jit(lambda params, x: g.apply_with_updates(params, x, training=True))(
        g.params, x)
    bm = x.mean(axis=(0, 2, 3))
    bv = x.var(axis=(0, 2, 3))  # biased, as ORT Training's BatchNormInternal
    shape = (1, 3, 1, 1)
    expected = ((x - bm.reshape(shape)) / np.sqrt(bv.reshape(shape) + 1e-5)
                * p["scale"].reshape(shape) + p["bias"].reshape(shape))
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5)
    assert set(updates) == {"mean", "var"}
    np.testing.assert_allclose(np.asarray(updates["mean"]), 0.8 * p["mean"] + 0.2 * bm, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(updates["var"]), 0.8 * p["var"] + 0.2 * bv, rtol=1e-5)
    assert updates["mean"].dtype == np.float32


def test_batch_norm_inference_uses_running_stats_and_updates_nothing():
    g, p = _bn_graph((2, 3, 2))
    x = np.random.default_rng(1).normal(size=(2, 3, 2)).astype(np.float32)
    (y,), updates = g.apply_with_updates(g.params, x)
    shape = (1, 3, 1)
    expected = ((x - p["mean"].reshape(shape)) / np.sqrt(p["var"].reshape(shape) + 1e-5)
                * p["scale"].reshape(shape) + p["bias"].reshape(shape))
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5)
    assert updates == {}


def test_batch_norm_9_single_output_is_inference():
    # ONNX's reference evaluator uses batch statistics here; the spec says test mode.
    x, s, b, m = (rand(2, 2, 3, seed=i).astype(np.float32) if i == 0 else
                  rand(2, seed=i).astype(np.float32) for i in range(4))
    v = rand(2, seed=5, lo=0.5, hi=1.5).astype(np.float32)
    ex = Example((x, s, b, m, v), dict(epsilon=1e-5), 9)
    (y,) = run_jaxort(ex.node("BatchNormalization"))
    r = (1, 2, 1)
    expected = (x - m.reshape(r)) / np.sqrt(v.reshape(r) + 1e-5) * s.reshape(r) + b.reshape(r)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------- training-mode batch norm's own derivative rule


def _bn_written_out(x, scale, b, epsilon):
    """Training-mode batch normalization in plain jax.numpy (differentiated by JAX op by op)."""
    import jax.numpy as jnp

    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xc = x.astype(np.float32) if x.dtype == np.float16 else x
    mean = jnp.mean(xc, axis=axes)
    var = jnp.mean((xc - mean.reshape(shape)) ** 2, axis=axes)
    y = (xc - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + epsilon)
    y = y * scale.reshape(shape).astype(xc.dtype) + b.reshape(shape).astype(xc.dtype)
    return y.astype(x.dtype), mean, var


def _bn_inputs(shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    return (rng.normal(1.0, 2.0, shape).astype(dtype), rng.uniform(0.5, 1.5, c).astype(dtype),
            rng.normal(size=c).astype(dtype))


@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 5), (2, 3, 4, 5), (2, 2, 3, 2, 3)])
@pytest.mark.parametrize("outputs", ["y", "y+stats", "stats"])
def test_batch_norm_rule_gradients_equal_the_written_out_formula(shape, outputs):
    from jaxort.graph.ops._common import batch_norm_train

    with jax.enable_x64(True):
        x, scale, b = _bn_inputs(shape)
        rng = np.random.default_rng(1)
        wy, wm, wv = rng.normal(size=shape), rng.normal(size=shape[1]), rng.normal(size=shape[1])

        def loss(f):
            def fn(x, scale, b):
                y, m, v = f(x, scale, b, 1e-3)
                total = 0.0
                if "y" in outputs.split("+"):
                    total = total + (jax.numpy.sin(y) * wy).sum()
                if "stats" in outputs:
                    total = total + (m * wm).sum() + (v * wv).sum()
                return total
            return fn

        got = jax.jit(jax.grad(loss(batch_norm_train), (0, 1, 2)))(x, scale, b)
        want = jax.grad(loss(_bn_written_out), (0, 1, 2))(x, scale, b)
        for g, w_ in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w_), rtol=1e-9, atol=1e-11)
        values = batch_norm_train(x, scale, b, 1e-3)
        for g, w_ in zip(values, _bn_written_out(x, scale, b, 1e-3)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w_), rtol=1e-12, atol=1e-12)


def test_batch_norm_rule_second_order_and_forward_mode():
    from jax.test_util import check_grads

    from jaxort.graph.ops._common import batch_norm_train

    with jax.enable_x64(True):
        x, scale, b = _bn_inputs((3, 2, 2, 3))
        check_grads(lambda *a: batch_norm_train(*a, 1e-3), (x, scale, b), order=2, modes=("fwd", "rev"))
        # A tangent in one argument only (the others symbolic zeros).
        for i in range(3):
            t = [np.zeros_like(a) for a in (x, scale, b)]
            t[i] = np.random.default_rng(i).normal(size=t[i].shape)
            _, got = jax.jvp(lambda *a: batch_norm_train(*a, 1e-3), (x, scale, b), tuple(t))
            _, want = jax.jvp(lambda *a: _bn_written_out(*a, 1e-3), (x, scale, b), tuple(t))
            for g, w_ in zip(got, want):
                np.testing.assert_allclose(np.asarray(g), np.asarray(w_), rtol=1e-9, atol=1e-11)


def test_batch_norm_rule_under_vmap_and_in_float16():
    import jax.numpy as jnp

    from jaxort.graph.ops._common import batch_norm_train

    xs = np.stack([_bn_inputs((4, 3, 2, 2), np.float32, seed=s)[0] for s in range(3)])
    _, scale, b = _bn_inputs((4, 3, 2, 2), np.float32)

    def loss(f, x):
        return jnp.sum(jnp.tanh(f(x, scale, b, 1e-5)[0]))

    got = jax.vmap(jax.grad(lambda x: loss(batch_norm_train, x)))(xs)
    want = np.stack([np.asarray(jax.grad(lambda x: loss(_bn_written_out, x))(x)) for x in xs])
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-5)
    # float16 input: statistics and the rule in float32, the gradient back in float16.
    x16 = xs[0].astype(np.float16)
    g16 = jax.grad(lambda x: loss(batch_norm_train, x).astype(jnp.float32))(x16)
    assert g16.dtype == np.float16
    np.testing.assert_allclose(np.asarray(g16, np.float32), want[0], rtol=2e-2, atol=2e-3)
