"""Pooling and MaxUnpool (ops/pool.py) against ONNX's reference evaluator or numpy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from jax import export
from jax.test_util import check_grads

from jaxort.graph import JaxGraph, x64_enabled_scope
from jaxort.graph.ops import pool as pool_ops
from jaxort.testing import run_jaxort, run_reference

from ._harness import Example, F16, F32, F64, OpCase, nn_gradient_test, table_tests
from ._strategies import arr, conv_geometry, floats, rand

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator

COVERED_OPS = {
    "AveragePool", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "LpPool", "MaxPool",
    "MaxUnpool",
}


@st.composite
def max_pool_case(draw):
    dt = floats(draw, (F32, F64, F16))
    nd = draw(st.integers(1, 3))
    size, attrs = conv_geometry(draw, nd, pool=True)
    if "pads" in attrs:
        attrs["ceil_mode"] = int(draw(st.booleans()))
    n_out = 1
    if nd == 2 and draw(st.booleans()):
        n_out = 2
        attrs["storage_order"] = int(draw(st.booleans()))
    x = arr(draw, dt, (draw(st.integers(1, 2)), draw(st.integers(1, 2)), *size))
    return Example((x,), attrs, n_out=n_out)


@st.composite
def average_pool_case(draw):
    dt = floats(draw, (F32, F64, F16))
    nd = draw(st.integers(1, 3))
    size, attrs = conv_geometry(draw, nd, pool=True)
    if "pads" in attrs:
        attrs["ceil_mode"] = int(draw(st.booleans()))
        attrs["count_include_pad"] = int(draw(st.booleans()))
    x = arr(draw, dt, (draw(st.integers(1, 2)), draw(st.integers(1, 2)), *size))
    return Example((x,), attrs)


@st.composite
def lp_pool_case(draw):
    dt = floats(draw)
    nd = draw(st.integers(1, 2))
    size, attrs = conv_geometry(draw, nd, pool=True)
    attrs["p"] = draw(st.sampled_from([1, 2, 3]))
    x = arr(draw, dt, (1, draw(st.integers(1, 2)), *size))
    return Example((x,), attrs)


def global_pool_case(p=False):
    @st.composite
    def strat(draw):
        dt = floats(draw, (F32, F64, F16))
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3))) + tuple(
            draw(st.integers(1, 4)) for _ in range(2))  # the reference assumes rank 4
        attrs = {"p": draw(st.sampled_from([1, 2, 3]))} if p else {}
        return Example((arr(draw, dt, shape),), attrs)

    return strat()


@st.composite
def max_unpool_case(draw):
    dt = floats(draw)
    n, c = 1, draw(st.integers(1, 2))
    h, w = 2 * draw(st.integers(1, 3)), 2 * draw(st.integers(1, 3))
    x = arr(draw, dt, (n, c, h // 2, w // 2))
    # Indices of a 2x2/2 max pool: one position per window.
    rng = np.random.default_rng(draw(st.integers(0, 1000)))
    oy, ox = rng.integers(0, 2, x.shape), rng.integers(0, 2, x.shape)
    yy = np.arange(h // 2)[:, None] * 2 + oy
    xx = np.arange(w // 2)[None, :] * 2 + ox
    base = (np.arange(n * c) * h * w).reshape(n, c, 1, 1)
    idx = (base + yy * w + xx).astype(np.int64)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    if draw(st.booleans()):
        return Example((x, idx, np.array([n, c, h + 1, w], np.int64)), attrs, static=(2,))
    return Example((x, idx), attrs)


def _np_pool(kind):
    """Loop-based numpy pooling with ORT's geometry (the reference evaluator's pooling
    mis-sizes padded 1-D outputs and SAME_LOWER)."""

    def ref(ex):
        x = ex.inputs[0].astype(np.float64)
        a = ex.attributes
        nd = x.ndim - 2
        k, s, d = a["kernel_shape"], a.get("strides", [1] * nd), a.get("dilations", [1] * nd)
        eff = [(kk - 1) * dd + 1 for kk, dd in zip(k, d)]
        size = x.shape[2:]
        mode = a.get("auto_pad", "NOTSET")
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            out = [-(-n // ss) for n, ss in zip(size, s)]
            tot = [max(0, (o - 1) * ss + e - n) for o, ss, e, n in zip(out, s, eff, size)]
            lo = [t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in tot]
            hi = [t - l for t, l in zip(tot, lo)]
        else:
            pads = a.get("pads", [0] * 2 * nd)
            lo, hi = pads[:nd], pads[nd:]
            out = []
            for i in range(nd):
                span = size[i] + lo[i] + hi[i] - eff[i]
                o = (-(-span // s[i]) if a.get("ceil_mode") else span // s[i]) + 1
                if a.get("ceil_mode") and (o - 1) * s[i] >= size[i] + lo[i]:
                    o -= 1
                out.append(o)
        y = np.zeros(x.shape[:2] + tuple(out))
        idx = np.zeros(y.shape, np.int64)
        for pos in np.ndindex(*out):
            taps = [[p * ss + t * dd - l for t in range(kk)]
                    for p, ss, dd, l, kk in zip(pos, s, d, lo, k)]
            inside, padded = [], 0
            for tap in np.ndindex(*k):
                c = [taps[i][tap[i]] for i in range(nd)]
                if all(0 <= c[i] < size[i] for i in range(nd)):
                    inside.append(c)
                elif all(-lo[i] <= c[i] < size[i] + hi[i] for i in range(nd)):
                    padded += 1
            sel = (slice(None), slice(None))
            vals = np.stack([x[sel + tuple(c)] for c in inside], -1)
            if kind == "max":
                y[sel + pos] = vals.max(-1)
                best = np.argmax(vals, -1)
                cs = np.array(inside)[best]  # (N, C, nd)
                if a.get("storage_order"):
                    flat = cs[..., 0] + cs[..., 1] * size[0]
                else:
                    flat = np.ravel_multi_index(tuple(np.moveaxis(cs, -1, 0)), size)
                base = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2]) * np.prod(size)
                idx[sel + pos] = flat + base
            elif kind == "avg":
                n = len(inside) + (padded if a.get("count_include_pad") else 0)
                y[sel + pos] = vals.sum(-1) / n
            else:
                y[sel + pos] = (np.abs(vals) ** a["p"]).sum(-1) ** (1.0 / a["p"])
        return [y.astype(ex.inputs[0].dtype), idx]

    return ref


def _np_global_lp_pool(ex):
    """numpy reference (ONNX's reference evaluator has no GlobalLpPool)."""
    x, p = ex.inputs[0], ex.attributes["p"]
    s = (np.abs(x.astype(np.float64)) ** p).sum(axis=(2, 3), keepdims=True)
    return [(s ** (1.0 / p)).astype(x.dtype)]


CASES = [
    OpCase("MaxPool", max_pool_case(), reference=_np_pool("max")),
    OpCase("AveragePool", average_pool_case(), scale=10, reference=_np_pool("avg")),
    OpCase("LpPool", lp_pool_case(), scale=10, reference=_np_pool("lp")),
    OpCase("GlobalAveragePool", global_pool_case(), scale=10),
    OpCase("GlobalMaxPool", global_pool_case()),
    OpCase("GlobalLpPool", global_pool_case(p=True), scale=10, reference=_np_global_lp_pool),
    OpCase("MaxUnpool", max_unpool_case()),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- gradients


GRAD_CASES = [
    ("MaxPool", lambda: (rand(1, 2, 5, 5),),
     dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], ceil_mode=1), None),
    ("AveragePool", lambda: (rand(1, 2, 5, 5),),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0), None),
]

test_gradient_matches_finite_differences = nn_gradient_test(GRAD_CASES)


# --------------------------------------------------------------------------- specific behaviour


def test_max_pool_int8():
    x = np.arange(-8, 8, dtype=np.int8).reshape(1, 1, 4, 4)
    ex = Example((x,), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 0, 0]), 12)
    (y,) = run_jaxort(ex.node("MaxPool"))
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, [[[[-8, -6], [0, 2]]]])


# ------------------------------------------- the tap form of MaxPool (on CPU, pool.py)

# (input shape, attributes): non-overlapping and overlapping windows, padding,
# ceil_mode, dilation, 1-D and 3-D.
TAP_CASES = [
    ((2, 3, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 2, 9, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], ceil_mode=1)),
    ((1, 1, 9, 9), dict(kernel_shape=[2, 2], strides=[1, 1], dilations=[2, 2])),
    ((2, 2, 11), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((1, 2, 4, 5, 5), dict(kernel_shape=[2, 2, 2], strides=[1, 2, 2])),
]


def _max_pool_of(shape, attrs, dtype=np.float32):
    """jaxort's MaxPool output 0 as a JAX function of its input."""
    case = Example((np.zeros(shape, dtype),), attrs).node("MaxPool")
    g = JaxGraph(case.model(), check=False, params=[])
    return lambda x: g.apply(g.params, x)[0]


def _first_maximum_gradient(x, attrs, cotangent):
    """dL/dx from the reference evaluator's Indices: each window's cotangent goes to the
    input element Indices names (its first maximum in row-major order), as ORT's MaxPoolGrad."""
    y, indices = run_reference(Example((x,), attrs, n_out=2).node("MaxPool"))
    assert y.shape == cotangent.shape
    dx = np.zeros(x.size, np.float64)
    np.add.at(dx, indices.ravel(), cotangent.ravel())
    return dx.reshape(x.shape)


@pytest.mark.parametrize("shape,attrs", TAP_CASES, ids=[f"tap-{i}" for i in range(len(TAP_CASES))])
def test_max_pool_gradient_goes_to_each_windows_first_maximum(shape, attrs):
    rng = np.random.default_rng(len(shape))
    # Values on a coarse grid: many windows hold their maximum twice or more.
    x = rng.integers(-3, 4, shape).astype(np.float32)
    f = _max_pool_of(shape, attrs)
    y, pullback = jax.vjp(jax.jit(f), jnp.asarray(x))
    cotangent = rng.standard_normal(y.shape).astype(np.float32)
    (dx,) = pullback(jnp.asarray(cotangent))
    np.testing.assert_allclose(np.asarray(y), run_reference(Example((x,), attrs).node("MaxPool"))[0])
    np.testing.assert_allclose(np.asarray(dx), _first_maximum_gradient(x, attrs, cotangent),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,attrs", TAP_CASES[:3], ids=[f"tap-{i}" for i in range(3)])
def test_max_pool_forward_mode_matches_reverse_mode_and_finite_differences(shape, attrs):
    x = np.random.default_rng(1).standard_normal(shape)  # distinct values: no ties
    with x64_enabled_scope():
        check_grads(_max_pool_of(shape, attrs, np.float64), (jnp.asarray(x),), order=2, modes=["fwd", "rev"],
                    eps=1e-5, atol=1e-6, rtol=1e-6)


def test_max_pool_taps_equal_xla_reduce_window_and_its_gradient():
    # On GPU and TPU MaxPool stays lax.reduce_window: both paths give the same values and the
    # same (first-maximum) gradient.
    x = jnp.asarray(np.random.default_rng(2).integers(-2, 3, (2, 3, 9, 9)).astype(np.float32))
    kernel, strides, dilations, out = (3, 3), (2, 2), (1, 1), (5, 5)
    pads = ((1, 1), (1, 1))

    def taps(x):
        xp = jnp.pad(x, ((0, 0), (0, 0)) + pads, constant_values=-np.inf)
        return pool_ops._max_pool_taps(xp, (kernel, strides, dilations, out))

    def native(x):
        return pool_ops._reduce_window(x, np.float32(-np.inf), jax.lax.max, kernel, strides,
                                       dilations, pads)

    g = jnp.asarray(np.random.default_rng(3).standard_normal((2, 3, 5, 5)).astype(np.float32))
    (y_t, pb_t), (y_n, pb_n) = jax.vjp(taps, x), jax.vjp(native, x)
    np.testing.assert_array_equal(np.asarray(y_t), np.asarray(y_n))
    np.testing.assert_allclose(np.asarray(pb_t(g)[0]), np.asarray(pb_n(g)[0]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("platform,native", [("cpu", False), ("cuda", True), ("tpu", True)])
def test_max_pool_takes_the_tap_form_on_cpu_only(platform, native):
    # Lowered for each platform without its hardware (jax.export).
    f = _max_pool_of((2, 3, 8, 8), TAP_CASES[0][1])
    grad = jax.jit(jax.grad(lambda x: jnp.sum(f(x) ** 2)))
    text = export.export(grad, platforms=[platform])(jnp.zeros((2, 3, 8, 8), jnp.float32)).mlir_module()
    assert ("stablehlo.reduce_window" in text) == native
    assert ("stablehlo.select_and_scatter" in text) == native


def test_dilated_max_pool_takes_the_tap_form_everywhere():
    # JAX has no reverse-mode rule for reduce_window's max with window dilation.
    f = _max_pool_of((1, 1, 9, 9), TAP_CASES[3][1])
    grad = jax.jit(jax.grad(lambda x: jnp.sum(f(x) ** 2)))
    text = export.export(grad, platforms=["cuda"])(jnp.zeros((1, 1, 9, 9), jnp.float32)).mlir_module()
    assert "reduce_window" not in text
