"""Convolutions (ops/conv.py) against ONNX's reference evaluator.
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
from jaxort.graph.ops import conv as conv_ops
from jaxort.testing import run_jaxort, run_reference

from ._harness import Example, F32, I32, OLD_REFERENCE, OpCase, U8, nn_gradient_test, table_tests
from ._strategies import arr, conv_geometry, floats, qparams, rand

COVERED_OPS = {
    "Col2Im", "Conv", "ConvInteger", "ConvTranspose", "DeformConv", "QLinearConv",
}


@st.composite
def conv_case(draw):
    dt = floats(draw)
    nd = draw(st.integers(1, 3))
    # onnx < 1.17's reference Conv pads VALID like SAME and computes SAME from the wrong axes.
    size, attrs = conv_geometry(draw, nd, auto=not OLD_REFERENCE)
    group = draw(st.sampled_from([1, 2]))
    c, m = group * draw(st.integers(1, 2)), group * draw(st.integers(1, 2))
    n = draw(st.integers(1, 2))
    x = arr(draw, dt, (n, c, *size))
    w = arr(draw, dt, (m, c // group, *attrs["kernel_shape"]))
    b = arr(draw, dt, (m,)) if draw(st.booleans()) else None
    attrs["group"] = group
    return Example((x, w, b), attrs)


@st.composite
def conv_transpose_case(draw):
    dt = floats(draw)
    nd = draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    size = [draw(st.integers(1, 3)) for _ in range(nd)]
    # onnx < 1.17's reference ConvTranspose raises for group != 1.
    group = draw(st.sampled_from([1] if OLD_REFERENCE else [1, 2]))
    # The reference handles groups only with one output channel per group.
    # (and one input channel per group).
    c = group * (draw(st.integers(1, 2)) if group == 1 else 1)
    m = group * (draw(st.integers(1, 2)) if group == 1 else 1)
    x = arr(draw, dt, (draw(st.integers(1, 2)), c, *size))
    w = arr(draw, dt, (c, m // group, *kernel))
    # ... and adds the bias of group 0 to every group.
    b = arr(draw, dt, (m,)) if group == 1 and draw(st.booleans()) else None
    attrs = dict(kernel_shape=kernel, strides=strides, dilations=dil, group=group)
    out_pad = [draw(st.integers(0, s - 1)) for s in strides]
    full = [s * (i - 1) + op + e for s, i, op, e in zip(strides, size, out_pad, eff)]
    # The reference's grouped path fails unless the padding is explicit; onnx < 1.17's
    # reference puts SAME's odd padding on the other side.
    form = draw(st.sampled_from(["pads", "output_shape"] + ([] if OLD_REFERENCE else ["same"])
                                if group == 1 else ["pads"]))
    if form == "pads":
        lim = [min(e - 1, f - 1) // 2 for e, f in zip(eff, full)]
        attrs["pads"] = ([draw(st.integers(0, v)) for v in lim]
                         + [draw(st.integers(0, v)) for v in lim])
        attrs["output_padding"] = out_pad
    elif form == "output_shape":
        # The natural size (the reference evaluator fails on any other).
        attrs["output_shape"] = full
        attrs["output_padding"] = out_pad
    else:
        attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER"]))
    return Example((x, w, b), attrs)


@st.composite
def conv_integer_case(draw):
    dt = U8
    size, attrs = conv_geometry(draw, 2, auto=not OLD_REFERENCE)  # as conv_case
    c = draw(st.integers(1, 2))
    x = arr(draw, dt, (1, c, *size), 0, 255)
    w = arr(draw, dt, (2, c, *attrs["kernel_shape"]), 0, 255)
    return Example((x, w, np.array(draw(st.integers(0, 255)), dt),
                    np.array(draw(st.integers(0, 255)), dt)), attrs)


@st.composite
def qlinear_conv_case(draw):
    size, attrs = conv_geometry(draw, 2, auto=False)
    c = draw(st.integers(1, 2))
    x = arr(draw, U8, (1, c, *size), 0, 255)
    w = arr(draw, U8, (2, c, *attrs["kernel_shape"]), 0, 255)
    (sx, zx), (sw, zw) = qparams(draw, U8), qparams(draw, U8)
    sy = np.array(draw(st.sampled_from([4.0, 16.0])), np.float32)
    zy = qparams(draw, U8)[1]
    b = arr(draw, I32, (2,), -100, 100) if draw(st.booleans()) else None
    return Example((x, sx, zx, w, sw, zw, sy, zy, b), attrs)


@st.composite
def col2im_case(draw):
    dt = floats(draw)
    nd = draw(st.integers(1, 3))
    block = [draw(st.integers(1, 2)) for _ in range(nd)]
    strides = [draw(st.integers(1, 2)) for _ in range(nd)]
    dil = [draw(st.integers(1, 2)) for _ in range(nd)]
    pads = [draw(st.integers(0, 1)) for _ in range(2 * nd)]
    image = [(b - 1) * d + 1 + draw(st.integers(0, 2)) for b, d in zip(block, dil)]
    out = [(image[i] + pads[i] + pads[i + nd] - ((block[i] - 1) * dil[i] + 1)) // strides[i] + 1
           for i in range(nd)]
    c = draw(st.integers(1, 2))
    x = arr(draw, dt, (1, c * int(np.prod(block)), int(np.prod(out))))
    return Example((x, np.array(image, np.int64), np.array(block, np.int64)),
                   dict(strides=strides, dilations=dil, pads=pads), static=(1, 2))


@st.composite
def deform_conv_case(draw):
    dt = F32  # the reference samples through float32 GridSample coordinates
    og = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2]))
    c = 2 * draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    # The reference divides by (size - 1): at least 2 pixels.
    h, w = draw(st.integers(max(kh, 2), 4)), draw(st.integers(max(kw, 2), 4))
    pads = [draw(st.integers(0, 1)) for _ in range(4)]
    oh, ow = h + pads[0] + pads[2] - kh + 1, w + pads[1] + pads[3] - kw + 1
    x = arr(draw, dt, (1, c, h, w))
    wt = arr(draw, dt, (2, c // group, kh, kw))
    off = arr(draw, dt, (1, og * kh * kw * 2, oh, ow), -1.5, 1.5)
    b = arr(draw, dt, (2,)) if draw(st.booleans()) else None
    mask = arr(draw, dt, (1, og * kh * kw, oh, ow), 0, 1) if draw(st.booleans()) else None
    attrs = dict(kernel_shape=[kh, kw], pads=pads, group=group, offset_group=og)
    return Example((x, wt, off, b, mask), attrs, 19)


CASES = [
    OpCase("Conv", conv_case(), scale=10),
    OpCase("ConvTranspose", conv_transpose_case(), scale=10),
    OpCase("ConvInteger", conv_integer_case()),
    OpCase("QLinearConv", qlinear_conv_case()),
    OpCase("Col2Im", col2im_case(), scale=10),
    OpCase("DeformConv", deform_conv_case(), scale=100),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)
# Device-sensitive (`make gpu-check` runs them on an accelerator): the table, the
# gradients, and the CPU forms against XLA's convolution on the device at hand.
test_matches_reference = pytest.mark.accelerator(test_matches_reference)


# --------------------------------------------------------------------------- gradients


GRAD_CASES = [
    ("Conv", lambda: (rand(2, 2, 5, 4), rand(4, 1, 3, 2, seed=1), rand(4, seed=2)),
     dict(pads=[1, 0, 1, 1], strides=[2, 1], dilations=[1, 2], group=2), None),
    ("Conv", lambda: (rand(1, 2, 6), rand(3, 2, 3, seed=1)), dict(auto_pad="SAME_LOWER"), None),
    ("ConvTranspose", lambda: (rand(1, 2, 3, 3), rand(2, 2, 2, 3, seed=1), rand(4, seed=2)),
     dict(strides=[2, 1], pads=[0, 1, 1, 0], output_padding=[1, 0], group=2), None),
]

test_gradient_matches_finite_differences = pytest.mark.accelerator(nn_gradient_test(GRAD_CASES))


# --------------------------------------------------------------------------- specific behaviour


def test_conv_transpose_output_shape_extends_at_the_end():
    # Natural size 3*(3-1)+3 = 9; output_shape 11 adds zero-input rows at the end (as ORT).
    x = rand(1, 1, 3).astype(np.float32)
    w = rand(1, 1, 3, seed=1).astype(np.float32)
    natural = Example((x, w), dict(strides=[3]))
    bigger = Example((x, w), dict(strides=[3], output_shape=[11]))
    (a,) = run_jaxort(natural.node("ConvTranspose"))
    (b,) = run_jaxort(bigger.node("ConvTranspose"))
    assert b.shape == (1, 1, 11)
    np.testing.assert_allclose(b[..., :9], a, rtol=1e-6)
    assert np.all(b[0, 0, 9:] == 0)


# ------------------------------------- the column (im2col) form of Conv (on CPU, conv.py)

# (x shape, w shape, attributes): one input channel, a few, depthwise and grouped, strides,
# dilations, asymmetric and SAME padding, 1-D and 3-D. Every one takes the column form.
COLUMN_CASES = [
    ((2, 1, 9, 8), (3, 1, 5, 5), dict(pads=[2, 2, 2, 2])),
    ((2, 3, 9, 9), (4, 3, 3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 1])),
    ((1, 4, 8, 8), (4, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
    ((1, 4, 9, 7), (8, 2, 3, 2), dict(group=2, strides=[2, 1], dilations=[1, 2])),
    ((2, 2, 11), (3, 2, 3), dict(auto_pad="SAME_UPPER", strides=[2])),
    ((1, 2, 5, 6, 6), (2, 1, 2, 3, 3), dict(group=2, pads=[0, 1, 1, 1, 1, 0])),
    ((2, 12, 6, 6), (5, 12, 3, 3), dict(pads=[1, 1, 1, 1])),  # many channels: the filter gradient only
]
COLUMN_IDS = [f"columns-{i}" for i in range(len(COLUMN_CASES))]


def _conv_of(xs, ws, attrs, dtype):
    """jaxort's Conv (with a bias) as a JAX function of input, weight and bias."""
    case = Example((np.zeros(xs, dtype), np.zeros(ws, dtype), np.zeros(ws[0], dtype)),
                   attrs).node("Conv")
    g = JaxGraph(case.model(), check=False, params=[])
    return lambda x, w, b: g.apply(g.params, x, w, b)[0]


def _conv_inputs(xs, ws, dtype):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    return tuple(rng.standard_normal(s).astype(dtype) for s in (xs, ws, (ws[0],)))


def _same_as_pads(xs, ws, attrs):
    """``attrs`` with auto_pad SAME_* written as the explicit pads the ONNX spec defines."""
    strides = attrs.get("strides", [1] * (len(xs) - 2))
    dilations = attrs.get("dilations", [1] * (len(xs) - 2))
    lo, hi = [], []
    for size, k, s, d in zip(xs[2:], ws[2:], strides, dilations):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        lo.append(small if attrs["auto_pad"] == "SAME_UPPER" else big)
        hi.append(big if attrs["auto_pad"] == "SAME_UPPER" else small)
    return {**{k: v for k, v in attrs.items() if k != "auto_pad"}, "pads": lo + hi}


@pytest.mark.parametrize("xs,ws,attrs", COLUMN_CASES, ids=COLUMN_IDS)
def test_conv_columns_match_the_reference(xs, ws, attrs):
    inputs = _conv_inputs(xs, ws, np.float32)
    (y,) = run_jaxort(Example(inputs, attrs).node("Conv"))
    # onnx < 1.17's reference Conv computes SAME from the wrong axes: give it the pads.
    ref_attrs = _same_as_pads(xs, ws, attrs) if OLD_REFERENCE and "auto_pad" in attrs else attrs
    np.testing.assert_allclose(y, run_reference(Example(inputs, ref_attrs).node("Conv"))[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xs,ws,attrs", COLUMN_CASES, ids=COLUMN_IDS)
def test_conv_columns_derivatives_match_finite_differences(xs, ws, attrs):
    # Forward mode and reverse mode, w.r.t. input, weight and bias, second order too.
    with x64_enabled_scope():
        args = tuple(jnp.asarray(a) for a in _conv_inputs(xs, ws, np.float64))
        check_grads(_conv_of(xs, ws, attrs, np.float64), args, order=2, modes=["fwd", "rev"],
                    eps=1e-5, atol=1e-6, rtol=1e-6)


# Large enough for the other plans: a stride-1 convolution past _SMALL_COLUMNS (col2im input
# gradient, XLA's filter gradient), the same with an input to fence, a strided one, and one
# input channel over a large output (the tap form).
LARGE_COLUMN_CASES = [((4, 2, 48, 48), (3, 2, 5, 5), dict(pads=[1, 2, 0, 1])),
                      ((32, 6, 14, 14), (16, 6, 5, 5), {}),
                      ((4, 3, 48, 48), (4, 3, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
                      ((8, 1, 28, 28), (6, 1, 5, 5), dict(pads=[2, 2, 2, 2])),
                      # ResNet's last stage: a 3x3 over 2x2 maps, and a strided 3x3 onto them.
                      ((16, 256, 2, 2), (64, 256, 3, 3), dict(pads=[1, 1, 1, 1])),
                      ((16, 128, 4, 4), (64, 128, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]))]
LARGE_IDS = ["large-stride-1", "large-fenced", "large-strided", "large-taps", "kernel-over-input",
             "kernel-over-output"]


def _spec(xs, ws, attrs):
    strides = tuple(attrs.get("strides", (1,) * (len(xs) - 2)))
    dilations = tuple(attrs.get("dilations", (1,) * (len(xs) - 2)))
    pads = attrs.get("pads", [0] * 2 * (len(xs) - 2))
    n = len(xs) - 2
    padding = tuple((pads[i], pads[i + n]) for i in range(n))
    out = tuple((size + lo + hi - (k - 1) * d - 1) // s + 1 for size, (lo, hi), k, d, s in
                zip(xs[2:], padding, ws[2:], dilations, strides))
    return (strides, dilations, padding, attrs.get("group", 1), out)


def _assert_close_to(a, b):
    # float32 sums over up to 2304 terms in different orders: tolerances scale with the values.
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                               atol=1e-5 * max(1.0, float(np.abs(np.asarray(b)).max())))


@pytest.mark.accelerator
@pytest.mark.parametrize("xs,ws,attrs", COLUMN_CASES[:4] + LARGE_COLUMN_CASES,
                         ids=COLUMN_IDS[:4] + LARGE_IDS)
def test_conv_plans_equal_xla_convolution_and_its_gradients(xs, ws, attrs):
    # On GPU and TPU Conv stays lax.conv_general_dilated: both paths agree in value and gradient.
    x, w, _ = (jnp.asarray(a) for a in _conv_inputs(xs, ws, np.float32))
    spec = _spec(xs, ws, attrs)
    plan = conv_ops._cpu_plan(x, w, spec, None)
    assert plan is not None
    g = jnp.asarray(np.random.default_rng(5).standard_normal((xs[0], ws[0]) + spec[4]).astype(np.float32))
    (y_c, pb_c), (y_x, pb_x) = (jax.vjp(lambda x, w: conv_ops._conv_planned(x, w, spec, plan), x, w),
                                jax.vjp(lambda x, w: conv_ops._xla_conv(x, w, spec), x, w))
    _assert_close_to(y_c, y_x)
    for a, b in zip(pb_c(g), pb_x(g)):
        _assert_close_to(a, b)


def test_the_large_cases_take_the_plans_they_test():
    plans = [conv_ops._cpu_plan(jnp.zeros(xs), jnp.zeros(ws), _spec(xs, ws, attrs), None)
             for xs, ws, attrs in LARGE_COLUMN_CASES]
    assert plans[0] == conv_ops._Plan("columns", "columns_last", "xla")
    assert plans[1] == conv_ops._Plan("columns", "columns_last", "xla", fence_input=True,
                                      fence_input_grad=True)
    assert plans[2] == conv_ops._Plan("columns", "xla", "columns")
    assert plans[3] == conv_ops._Plan("taps", "columns_last", "xla", fence_output=True)
    # A kernel larger than the input or the output: XLA would swap the operands; columns throughout.
    assert plans[4] == plans[5] == conv_ops._Plan("columns", "columns", "columns")
    # A 1x1 convolution's columns are its input: a matrix product, never taps, never fenced.
    one = conv_ops._cpu_plan(jnp.zeros((8, 8, 16, 16)), jnp.zeros((48, 8, 1, 1)),
                             _spec((8, 8, 16, 16), (48, 8, 1, 1), {}), None)
    assert one == conv_ops._Plan("columns", "columns", "columns")
    # A depthwise convolution's input gradient reads the output's gradient once per tap: fenced.
    depthwise = conv_ops._cpu_plan(jnp.zeros((8, 48, 16, 16)), jnp.zeros((48, 1, 3, 3)),
                                   _spec((8, 48, 16, 16), (48, 1, 3, 3), dict(group=48, strides=[2, 2])), None)
    assert depthwise == conv_ops._Plan("columns", "columns", "columns", fence_output_grad=True)
    # Many input channels, stride 1: XLA's convolution but for a small one's filter gradient.
    xs, ws, attrs = COLUMN_CASES[-1]
    assert conv_ops._cpu_plan(jnp.zeros(xs), jnp.zeros(ws), _spec(xs, ws, attrs), None) == \
        conv_ops._Plan("xla", "xla", "columns")
    assert conv_ops._cpu_plan(jnp.zeros((8, 12, 48, 48)), jnp.zeros((5, 12, 3, 3)),
                              _spec((8, 12, 48, 48), (5, 12, 3, 3), {}), None) is None


@pytest.mark.parametrize("form", ["columns", "columns_last", "taps"])
@pytest.mark.parametrize("xs,ws,attrs", [COLUMN_CASES[1], COLUMN_CASES[3], COLUMN_CASES[4],
                                         LARGE_COLUMN_CASES[1]], ids=["strided", "grouped", "1-d", "c6"])
def test_every_form_is_the_convolution_and_transposes_to_its_derivatives(form, xs, ws, attrs):
    # Each form alone, whatever plan picks it: value and both derivatives equal XLA's.
    if form == "columns_last" and attrs.get("group", 1) != 1:
        pytest.skip("channels-last columns are for one group")
    x, w, _ = (jnp.asarray(a) for a in _conv_inputs(xs, ws, np.float32))
    spec = _spec(xs, ws, attrs)
    g = jnp.asarray(np.random.default_rng(6).standard_normal((xs[0], ws[0]) + spec[4]).astype(np.float32))
    (y_f, pb_f), (y_x, pb_x) = (jax.vjp(lambda x, w: conv_ops._FORMS[form](x, w, spec), x, w),
                                jax.vjp(lambda x, w: conv_ops._xla_conv(x, w, spec), x, w))
    _assert_close_to(y_f, y_x)
    for a, b in zip(pb_f(g), pb_x(g)):
        _assert_close_to(a, b)


@pytest.mark.parametrize("xs,ws,attrs", LARGE_COLUMN_CASES[1:2] + LARGE_COLUMN_CASES[3:4] + COLUMN_CASES[2:4],
                         ids=["large-fenced", "large-taps", "depthwise", "grouped"])
def test_fenced_plans_have_forward_mode_and_second_derivatives(xs, ws, attrs):
    # The fences are conditionals: jvp, grad of grad and vmap go through them (float64, small).
    with x64_enabled_scope():
        x, w, b = (jnp.asarray(a) for a in _conv_inputs(xs, ws, np.float64))
        x = x[:2]  # the plan stays the float32 one's (fences included): picked once below
        spec = _spec(x.shape, ws, attrs)
        plan = conv_ops._cpu_plan(jnp.zeros(xs), jnp.zeros(ws), _spec(xs, ws, attrs), None)
        assert plan.fence_input or plan.fence_output or plan.fence_output_grad
        f = lambda x, w: conv_ops._conv_planned(x, w, spec, plan)  # noqa: E731
        check_grads(f, (x, w), order=2, modes=["fwd", "rev"], eps=1e-5, atol=1e-6, rtol=1e-6)
        batched = jax.vmap(f, in_axes=(None, 0))(x, jnp.stack([w, 2 * w]))
        np.testing.assert_allclose(batched[1], 2 * np.asarray(conv_ops._xla_conv(x, w, spec)), rtol=1e-10, atol=1e-10)
        if plan.fence_output_grad and not (plan.fence_input or plan.fence_output):
            # The fence is in the input gradient's program only.
            forward = jax.jit(f).lower(x, w).compile().as_text()
            backward = jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2))).lower(x, w).compile().as_text()
            assert "conditional" not in forward and "conditional" in backward


def test_a_fence_is_a_conditional_that_returns_its_input():
    from jaxort.graph.ops._common import fence

    x = jnp.arange(6.0).reshape(2, 3)
    for key in (jnp.float32(np.nan), jnp.float32(-np.inf), jnp.float32(2.0)):
        np.testing.assert_array_equal(jax.jit(fence)(x, key), x)
    np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(fence(x, x[0, 0]) * x))(x), 2 * x)
    assert "conditional" in jax.jit(fence).lower(x, x[0, 0]).compile().as_text()
    np.testing.assert_array_equal(fence(x, jnp.zeros((0,))), x)  # no value to key on: no fence


def test_a_conv_with_no_output_channels_is_empty():
    # The plans key their fences on the filter: none to key on here, and no crash.
    x, w = jnp.ones((64, 2, 28, 28)), jnp.ones((0, 2, 5, 5))
    spec = _spec(x.shape, w.shape, {})
    y = jax.jit(lambda x, w: conv_ops._conv(x, w, None, auto_pad="NOTSET", dilations=None, group=1,
                                            kernel_shape=None, pads=None, strides=None))(x, w)
    assert y.shape == (64, 0) + spec[4]


@pytest.mark.parametrize("platform,conv,dot", [("cpu", False, True), ("cuda", True, False),
                                               ("tpu", True, False)])
def test_a_one_channel_conv_is_a_matrix_product_on_cpu_only(platform, conv, dot):
    # Lowered for each platform without its hardware (jax.export): the column form is CPU's.
    f = _conv_of((2, 1, 9, 8), (3, 1, 5, 5), COLUMN_CASES[0][2], np.float32)
    args = tuple(jnp.asarray(a) for a in _conv_inputs((2, 1, 9, 8), (3, 1, 5, 5), np.float32))
    text = export.export(jax.jit(f), platforms=[platform])(*args).mlir_module()
    assert ("stablehlo.convolution" in text, "stablehlo.dot_general" in text) == (conv, dot)
    # A small convolution's derivatives are the column form's on CPU, XLA's convolution elsewhere.
    grad = jax.jit(jax.grad(lambda x, w, b: jnp.sum(f(x, w, b) ** 2), argnums=(0, 1)))
    text = export.export(grad, platforms=[platform])(*args).mlir_module()
    assert ("stablehlo.convolution" in text) == conv


def test_a_large_stride_1_conv_keeps_xla_filter_gradient_on_cpu():
    # Past _SMALL_COLUMNS values the column form's filter gradient loses to XLA's.
    xs, ws = (4, 2, 48, 48), (3, 2, 5, 5)
    assert conv_ops._column_count(np.zeros(xs), np.zeros(ws), (None,) * 4 + ((44, 44),)) > \
        conv_ops._SMALL_COLUMNS
    f = _conv_of(xs, ws, {}, np.float32)
    args = tuple(jnp.asarray(a) for a in _conv_inputs(xs, ws, np.float32))
    forward = export.export(jax.jit(f), platforms=["cpu"])(*args).mlir_module()
    assert "stablehlo.convolution" not in forward
    grad = jax.jit(jax.grad(lambda x, w, b: jnp.sum(f(x, w, b) ** 2), argnums=1))
    assert "stablehlo.convolution" in export.export(grad, platforms=["cpu"])(*args).mlir_module()


@pytest.mark.parametrize("form", ["columns", "columns_last"])
def test_the_columns_of_a_large_kernel_compile_to_a_few_loops(form):
    # XLA's CPU compiler fuses a concatenation of at most 8 operands with the slices
    # it reads; the 49 taps of a 7x7 kernel stacked at once compile to a copy per tap
    # and a concatenation (~52 thunks), stacked one kernel axis at a time to one loop.
    # Their values against the reference are checked above (COLUMN_CASES).
    x, w = jnp.zeros((8, 3, 32, 32), jnp.float32), jnp.zeros((3, 3, 7, 7), jnp.float32)
    spec = ((2, 2), (1, 1), ((3, 3), (3, 3)), 1, (16, 16))
    text = jax.jit(lambda x, w: conv_ops._FORMS[form](x, w, spec)).lower(x, w).compile().as_text()
    entry = text[text.index("\nENTRY"):]
    fusions = entry.count(" fusion(")
    assert 0 < fusions <= 6, f"{fusions} fusions in the compiled {form} form"


# Working sizes (ResNet-50's and MobileNetV3's): plans picked on zeros, values on smaller copies.
WORKING_PLANS = [
    # a 1x1 convolution of many channels over large maps: matrix products over channels-last pixels
    ((8, 256, 56, 56), (64, 256, 1, 1), {}, conv_ops._Plan("columns_last", "columns_last", "columns_last")),
    # a 3x3 one: XLA's passes, its input fenced
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1]),
     conv_ops._Plan("xla", "xla", "xla", fence_operand=True)),
    # a strided 1x1 (a downsampling shortcut): the same
    ((8, 256, 56, 56), (512, 256, 1, 1), dict(strides=[2, 2]),
     conv_ops._Plan("columns_last", "columns_last", "columns_last")),
    # a depthwise 5x5 whose columns would pass _COLUMN_ELEMENTS: taps in every pass
    ((16, 120, 28, 28), (120, 1, 5, 5), dict(group=120, pads=[2, 2, 2, 2]),
     conv_ops._Plan("taps", "taps", "taps", fence_output=True, fence_output_grad=True)),
]


@pytest.mark.parametrize("xs,ws,attrs,plan", WORKING_PLANS, ids=["1x1", "3x3", "1x1-strided", "depthwise-taps"])
def test_working_size_convolutions_take_their_plans(xs, ws, attrs, plan):
    assert conv_ops._cpu_plan(jnp.zeros(xs), jnp.zeros(ws), _spec(xs, ws, attrs), None) == plan


@pytest.mark.accelerator
@pytest.mark.parametrize("xs,ws,attrs,plan", WORKING_PLANS, ids=["1x1", "3x3", "1x1-strided", "depthwise-taps"])
def test_working_size_plans_equal_xla_convolution_and_its_gradients(xs, ws, attrs, plan, monkeypatch):
    # The same plans on a copy small enough to test (batch 2, maps a quarter as wide),
    # through the Conv op (so fence_operand applies) against lax's convolution.
    monkeypatch.setattr(conv_ops, "_cpu_plan", lambda *args: plan)
    xs = (2, xs[1], xs[2] // 4, xs[3] // 4)
    x, w, b = (jnp.asarray(a) for a in _conv_inputs(xs, ws, np.float32))
    spec = _spec(xs, ws, attrs)
    ours = _conv_of(xs, ws, attrs, np.float32)
    g = jnp.asarray(np.random.default_rng(7).standard_normal((xs[0], ws[0]) + spec[4]).astype(np.float32))
    (y_p, pb_p), (y_x, pb_x) = (jax.vjp(lambda x, w: ours(x, w, b), x, w),
                                jax.vjp(lambda x, w: conv_ops._xla_conv(x, w, spec) + b[:, None, None], x, w))
    _assert_close_to(y_p, y_x)
    for a, ref in zip(pb_p(g), pb_x(g)):
        _assert_close_to(a, ref)
    text = jax.jit(lambda x, w: jax.vjp(lambda x, w: ours(x, w, b), x, w)[1](g)).lower(x, w).as_text()
    # A fence is a conditional whose other branch negates (numerics.fence); nothing else here negates.
    assert ("stablehlo.negate" in text) == (plan.fence_operand or plan.fence_output)


def test_a_depthwise_convolution_takes_taps_only_where_columns_do_not_fit():
    xs, ws, attrs = (16, 120, 14, 14), (120, 1, 5, 5), dict(group=120, pads=[2, 2, 2, 2])
    assert conv_ops._column_count(np.zeros(xs), np.zeros(ws), _spec(xs, ws, attrs)) <= conv_ops._COLUMN_ELEMENTS
    assert conv_ops._cpu_plan(jnp.zeros(xs), jnp.zeros(ws), _spec(xs, ws, attrs), None).forward == "columns"
