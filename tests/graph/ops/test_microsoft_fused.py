"""ONNX Runtime's fused inference ops (ops/microsoft_fused.py), against three references.

Each op has an entry in ``CASES``: a hypothesis strategy drawing inputs and
attributes (float32 and float16), and a numpy reference written from ORT's CPU
kernel (contrib_ops/cpu/..., core/providers/cpu/nn/layer_norm_impl.cc; for
BiasSoftmax, which has only GPU kernels, from its CUDA kernel and test). Every
drawn example runs through jaxort jitted (strict dtype promotion) and eager, and
is compared, output by output, with the numpy reference and with onnxruntime's
CPU provider wherever that runs the op. ``GRAD_CASES`` check the gradient of
a weighted sum of all outputs w.r.t. every float input against float64 central
finite differences. onnxruntime 1.32 (this suite's) runs every CPU kernel that
onnxruntime-training 1.19.2 has for these ops, so no recorded fixture is needed.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from jaxort.graph import JaxGraph, x64_enabled_scope

try:
    import onnxruntime as ort
except ImportError:  # pragma: no cover - the suite's environment has it
    ort = None

MS = "com.microsoft"
F16, F32, F64 = (np.dtype(t) for t in (np.float16, np.float32, np.float64))
# (rtol, atol) of jaxort against the float64 numpy reference and against onnxruntime.
TOL_NUMPY = {F32: (2e-5, 2e-5), F16: (5e-3, 5e-3)}
TOL_ORT = {F32: (1e-4, 2e-5), F16: (1e-2, 1e-2)}
SETTINGS = settings(max_examples=5, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


# --------------------------------------------------------------------------- one-node models


@dataclasses.dataclass(frozen=True)
class Case:
    """One drawn example: inputs (None = absent optional input), attributes, outputs wanted."""

    inputs: tuple
    attrs: dict
    n_out: int = 1


def one_node_model(op, case: Case, domain=MS, opset=17):
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(case.inputs)]
    while names and not names[-1]:
        names.pop()
    outs = [f"out{i}" for i in range(case.n_out)]
    node = helper.make_node(op, names, outs, domain=domain, **case.attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))
         for n, x in zip(names, case.inputs) if n],
        [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8  # what both onnxruntime 1.19 and 1.32 load
    return model


def feeds(case):
    return [x for x in case.inputs if x is not None]


def run_jaxort(model, case, jit=True):
    g = JaxGraph(model, params=[], check=False)
    fn = jax.jit(g.apply) if jit else g.apply
    with jax.numpy_dtype_promotion("strict"):
        return [np.asarray(o) for o in fn({}, *feeds(case))]


def run_ort(model, case):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, dict(zip(names, feeds(case))))


def assert_close(got, want, tol, what):
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.shape == w.shape, f"{what}, output {k}: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype, f"{what}, output {k}: dtype {g.dtype} != {w.dtype}"
        rtol, atol = tol[np.dtype(g.dtype)] if np.dtype(g.dtype) in tol else tol[F32]
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                   atol=atol, err_msg=f"{what}, output {k}")


# --------------------------------------------------------------------------- numpy references
# All in float64 from ORT's kernel formulas, then cast to the dtype ORT returns.

_erf = np.vectorize(math.erf)


def _f64(*xs):
    return [None if x is None else np.asarray(x, np.float64) for x in xs]


def ref_gelu(x):
    (v,) = _f64(x)
    return [(0.5 * v * (1 + _erf(v / math.sqrt(2)))).astype(x.dtype)]


def ref_bias_gelu(a, b):
    va, vb = _f64(a, b)
    return [ref_gelu(va + vb)[0].astype(a.dtype)]


def ref_fast_gelu(x, bias=None):
    v, b = _f64(x, bias)
    v = v if b is None else v + b
    return [(0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))))
            .astype(x.dtype)]


def ref_quick_gelu(x, alpha=1.702):
    (v,) = _f64(x)
    return [(v / (1 + np.exp(-alpha * v))).astype(x.dtype)]


def ref_fused_matmul(a, b, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    def operand(v, trans, trans_batch):
        if v.ndim >= 2 and trans_batch:
            v = np.moveaxis(v, 0, -2)
        if v.ndim >= 2 and trans:
            v = np.swapaxes(v, -1, -2)
        return v
    va, vb = _f64(a, b)
    return [(alpha * np.matmul(operand(va, transA, transBatchA), operand(vb, transB, transBatchB)))
            .astype(a.dtype)]


def _np_softplus(v):
    return np.logaddexp(v, 0)


def _np_elu(v, a):
    return np.where(v > 0, v, a * np.expm1(np.minimum(v, 0)))


NP_ACTIVATIONS = {
    "Relu": lambda v: np.maximum(v, 0),
    "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "Tanh": np.tanh,
    "Softsign": lambda v: v / (1 + np.abs(v)),
    "Softplus": _np_softplus,
    "LeakyRelu": lambda v, a: np.where(v >= 0, v, a * v),
    "HardSigmoid": lambda v, a, b: np.clip(a * v + b, 0, 1),
    "Clip": lambda v, lo, hi: np.clip(v, lo, hi),
    "Elu": _np_elu,
    "Celu": lambda v, a: np.maximum(v, 0) + np.minimum(0, a * np.expm1(v / a)),
    "Selu": lambda v, a, g: g * _np_elu(v, a),
    "ThresholdedRelu": lambda v, a: np.where(v > a, v, 0),
    "ParametricSoftplus": lambda v, a, b: a * _np_softplus(b * v),
    "ScaledTanh": lambda v, a, b: a * np.tanh(b * v),
}
# FusedGemm's activation_* attributes each activation reads (ORT's functors' Init).
GEMM_PARAMS = {"LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"), "Elu": ("alpha",),
               "Celu": ("alpha",), "Selu": ("alpha", "gamma"), "ThresholdedRelu": ("alpha",),
               "ParametricSoftplus": ("alpha", "beta"), "ScaledTanh": ("alpha", "beta")}
CONV_PARAMS = {"LeakyRelu": 1, "HardSigmoid": 2, "Clip": 2}


def ref_fused_gemm(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0, activation=None,
                   **params):
    va, vb, vc = _f64(a, b, c)
    y = alpha * ((va.T if transA else va) @ (vb.T if transB else vb))
    if vc is not None:
        y = y + beta * vc
    names = GEMM_PARAMS.get(activation, ())
    y = NP_ACTIVATIONS[activation](y, *(params[f"activation_{n}"] for n in names))
    return [y.astype(a.dtype)]


def ref_fused_conv(x, w, b=None, z=None, activation=None, activation_params=(), **conv_attrs):
    # The convolution itself from onnx's reference evaluator, in float64.
    names = ["x", "w"] + (["b"] if b is not None else [])
    node = helper.make_node("Conv", names, ["y"], **conv_attrs)
    vx, vw, vb, vz = _f64(x, w, b, z)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info(n, onnx.TensorProto.DOUBLE, None)
                         for n in names], [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    y = ReferenceEvaluator(model).run(None, dict(zip(names, [vx, vw, vb])))[0]
    if vz is not None:
        y = y + vz
    if activation:
        y = NP_ACTIVATIONS[activation](y, *activation_params)
    return [y.astype(x.dtype)]


def ref_bias_softmax(data, bias, axis=1, is_inner_broadcast=0):
    # ORT's BiasSoftmax test reference: bias broadcast numpy-style onto data, then
    # softmax over the flattened dims from axis on (Softmax-1 semantics).
    vd, vb = _f64(data, bias)
    axis = axis % data.ndim
    s = (vd + vb).reshape(int(np.prod(data.shape[:axis])), -1)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return [(e / e.sum(axis=1, keepdims=True)).reshape(data.shape).astype(data.dtype)]


def ref_scaled_sum(a, b, c=None, scale_0=None, scale_1=None, scale_2=1.0):
    # ORT's ScaledSum test reference (CUDA only): in0 * s0 + in1 * s1 (+ in2 * s2).
    va, vb, vc = _f64(a, b, c)
    y = va * np.float32(scale_0) + vb * np.float32(scale_1)
    if c is not None:
        y = y + vc * np.float32(scale_2)
    return [y.astype(a.dtype)]


def _np_layer_norm(v, scale, bias, axis, epsilon, simplified):
    """ORT's ComputeJob: mean and mean of squares per row, then sqrt(E[x^2] - mean^2 + eps)."""
    axis = axis % v.ndim
    lead = v.shape[:axis]
    rows = v.reshape(int(np.prod(lead)), -1)
    n = rows.shape[1]
    mean = rows.sum(1) / n
    mean_square = (rows * rows).sum(1) / n
    std = np.sqrt(mean_square + epsilon) if simplified else np.sqrt(mean_square - mean ** 2
                                                                    + epsilon)
    centered = rows if simplified else rows - mean[:, None]
    y = centered / std[:, None] * scale.reshape(-1)
    if bias is not None:
        y = y + bias.reshape(-1)
    stat_shape = lead + (1,) * (v.ndim - axis)
    return y.reshape(v.shape), mean.reshape(stat_shape), (1 / std).reshape(stat_shape)


def ref_layer_norm(x, scale, b=None, axis=-1, epsilon=1e-5, stash_type=1):
    vx, vs, vb = _f64(x, scale, b)
    y, mean, inv = _np_layer_norm(vx, vs, vb, axis, epsilon, False)
    return [y.astype(x.dtype), mean.astype(F32), inv.astype(F32)]


def ref_simplified_layer_norm(x, scale, axis=-1, epsilon=1e-5, stash_type=1):
    vx, vs = _f64(x, scale)
    y, _, inv = _np_layer_norm(vx, vs, None, axis, epsilon, True)
    return [y.astype(x.dtype), inv.astype(F32)]


def _np_skip_sum(x, skip, bias):
    vx, vs, vb = _f64(x, skip, bias)
    # ORT reads skip at (offset % skip_size): a smaller skip repeats over the batch.
    s = vx + np.resize(vs, vx.shape)
    return s if vb is None else s + vb


def ref_skip_layer_norm(x, skip, gamma, beta=None, bias=None, epsilon=1e-12):
    s = _np_skip_sum(x, skip, bias)
    vg, vbeta = _f64(gamma, beta)
    y, mean, inv = _np_layer_norm(s, vg, vbeta, -1, epsilon, False)
    return [y.astype(x.dtype), mean.astype(F32), inv.astype(F32), s.astype(x.dtype)]


def ref_skip_simplified_layer_norm(x, skip, gamma, bias=None, epsilon=1e-12):
    s = _np_skip_sum(x, skip, bias)
    (vg,) = _f64(gamma)
    y, mean, inv = _np_layer_norm(s, vg, None, -1, epsilon, True)
    return [y.astype(x.dtype), np.zeros_like(mean, F32), inv.astype(F32), s.astype(x.dtype)]


# --------------------------------------------------------------------------- strategies


def arr(draw, dtype, shape, lo=-2.0, hi=2.0):
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def dtype(draw):
    return draw(st.sampled_from([F32, F16]))


def shape(draw, min_rank=1, max_rank=3, lo=1, hi=5):
    return tuple(draw(st.integers(lo, hi)) for _ in range(draw(st.integers(min_rank, max_rank))))


@st.composite
def unary_case(draw, attrs=st.just({})):
    return Case((arr(draw, dtype(draw), shape(draw), -4, 4),), draw(attrs))


@st.composite
def bias_gelu_case(draw, optional_bias=False):
    dt, s = dtype(draw), shape(draw)
    bias = None if optional_bias and draw(st.booleans()) else arr(draw, dt, s[-1:])
    return Case((arr(draw, dt, s, -3, 3), bias), {})


@st.composite
def matmul_case(draw, batch_transposes=True):
    dt = dtype(draw)
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    batch = draw(st.sampled_from([(), (2,), (2, 3)]))
    b_batch = draw(st.sampled_from([b for b in [(), batch[-1:], batch] if len(b) <= len(batch)]))
    attrs = {"transA": int(draw(st.booleans())), "transB": int(draw(st.booleans()))}
    if batch_transposes and len(batch) == len(b_batch) >= 1:
        # ORT takes batch transposes only for inputs of one rank >= 3.
        attrs["transBatchA"] = int(draw(st.booleans()))
        attrs["transBatchB"] = int(draw(st.booleans()))
    if draw(st.booleans()):
        attrs["alpha"] = draw(st.sampled_from([0.5, -1.25, 2.0]))

    def physical(logical, trans, trans_batch):
        v = np.swapaxes(logical, -1, -2) if trans else logical
        return np.moveaxis(v, -2, 0) if trans_batch else v

    a = arr(draw, dt, batch + (m, k))
    b = arr(draw, dt, b_batch + (k, n))
    a = physical(a, attrs["transA"], attrs.get("transBatchA", 0))
    b = physical(b, attrs["transB"], attrs.get("transBatchB", 0))
    return Case((np.ascontiguousarray(a), np.ascontiguousarray(b)), attrs)


def _activation_params(draw, act):
    values = {"alpha": draw(st.sampled_from([0.1, 0.5, 1.5])),
              "beta": draw(st.sampled_from([0.25, 0.5, 0.9])),
              "gamma": draw(st.sampled_from([1.05, 2.0]))}
    return {f"activation_{n}": values[n] for n in GEMM_PARAMS.get(act, ())}


@st.composite
def fused_gemm_case(draw):
    dt = dtype(draw)
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    ta, tb = int(draw(st.booleans())), int(draw(st.booleans()))
    act = draw(st.sampled_from(sorted(NP_ACTIVATIONS.keys() - {"Clip"})))
    attrs = {"transA": ta, "transB": tb, "activation": act, **_activation_params(draw, act),
             "alpha": draw(st.sampled_from([1.0, 0.5])), "beta": draw(st.sampled_from([1.0, 2.0]))}
    c = arr(draw, dt, draw(st.sampled_from([(n,), (1, n), (m, n), (m, 1)])))
    return Case((arr(draw, dt, (k, m) if ta else (m, k)), arr(draw, dt, (n, k) if tb else (k, n)),
                 c), attrs)


@st.composite
def fused_conv_case(draw):
    dt = dtype(draw)
    nb, c_in, c_out = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(2)]
    strides = [draw(st.integers(1, 2)) for _ in range(2)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel] * 2
    size = [k + draw(st.integers(0, 3)) for k in kernel]
    out = [(s + 2 * p - k) // st_ + 1 for s, p, k, st_ in zip(size, pads, kernel, strides)]
    act = draw(st.sampled_from(["", "Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip",
                                "HardSigmoid"]))
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    params = {"LeakyRelu": [0.2], "HardSigmoid": [0.3, 0.4], "Clip": [-0.5, 0.75]}.get(act, [])
    if act:
        attrs["activation"] = act
    if params:
        attrs["activation_params"] = params
    b = arr(draw, dt, (c_out,)) if draw(st.booleans()) else None
    z = arr(draw, dt, (nb, c_out, *out)) if draw(st.booleans()) else None
    if z is not None and b is None:
        b = np.zeros((c_out,), dt)
    return Case((arr(draw, dt, (nb, c_in, *size)), arr(draw, dt, (c_out, c_in, *kernel), -1, 1),
                 b, z), attrs)


@st.composite
def scaled_sum_case(draw):
    dt, s = dtype(draw), shape(draw)
    n = draw(st.integers(2, 3))
    scales = [draw(st.sampled_from([0.5, -1.0, 0.125, 3.0])) for _ in range(n)]
    attrs = {f"scale_{i}": v for i, v in enumerate(scales)}
    if n == 3 and draw(st.booleans()):
        del attrs["scale_2"]  # defaults to 1
    return Case(tuple(arr(draw, dt, s) for _ in range(n)), attrs)


@st.composite
def bias_softmax_case(draw):
    dt = dtype(draw)
    # Bias rows both kept and broadcast (dims of 2 or more on each side of k), so that
    # inner and outer broadcasting give different results.
    s = shape(draw, 3, 4, 2, 4)
    axis = draw(st.integers(2, len(s) - 1))
    inner = int(draw(st.booleans()))
    k = draw(st.integers(1, axis - 1))
    if inner:  # bias keeps dims [0, k), is broadcast over [k, axis)
        b_shape = s[:k] + (1,) * (axis - k) + s[axis:]
    else:      # bias keeps dims [k, ...), is broadcast over [0, k)
        b_shape = draw(st.sampled_from([(), (1,)])) + s[k:]
    neg = draw(st.booleans())
    attrs = {"axis": axis - len(s) if neg else axis, "is_inner_broadcast": inner}
    return Case((arr(draw, dt, s, -3, 3), arr(draw, dt, b_shape, -3, 3)), attrs)


@st.composite
def layer_norm_case(draw, simplified=False):
    dt = dtype(draw)
    s = shape(draw, 2, 3, 1, 5)
    axis = draw(st.integers(1, len(s) - 1))
    attrs = {"axis": axis - len(s) if draw(st.booleans()) else axis}
    if draw(st.booleans()):
        attrs["epsilon"] = draw(st.sampled_from([1e-3, 1e-6]))
    x = arr(draw, dt, s, -2, 3)
    scale = arr(draw, dt, s[axis:], 0.5, 1.5)
    if simplified:
        return Case((x, scale), attrs, draw(st.integers(1, 2)))
    b = arr(draw, dt, s[axis:]) if draw(st.booleans()) else None
    return Case((x, scale, b), attrs, draw(st.integers(1, 3)))


@st.composite
def skip_layer_norm_case(draw, simplified=False):
    dt = dtype(draw)
    s = draw(st.sampled_from([(2, 3), (2, 3, 4), (1, 4, 5), (3, 2, 6)]))
    x = arr(draw, dt, s, -2, 3)
    skip_shape = draw(st.sampled_from([s, s[-2:], (1,) + s[-2:]] if len(s) == 3 else [s]))
    h = s[-1:]
    inputs = [x, arr(draw, dt, skip_shape), arr(draw, dt, h, 0.5, 1.5)]
    if not simplified:
        inputs.append(arr(draw, dt, h) if draw(st.booleans()) else None)
    inputs.append(arr(draw, dt, h) if draw(st.booleans()) else None)
    attrs = {"epsilon": draw(st.sampled_from([1e-5, 1e-3]))} if draw(st.booleans()) else {}
    return Case(tuple(inputs), attrs, draw(st.integers(1, 4)))


# (strategy, numpy reference, domain, opset of the default domain, onnxruntime 1.32 runs it)
CASES = {
    "Gelu": (unary_case(), ref_gelu, MS, 17, True),
    "BiasGelu": (bias_gelu_case(), ref_bias_gelu, MS, 17, True),
    "FastGelu": (bias_gelu_case(optional_bias=True), ref_fast_gelu, MS, 17, True),
    "QuickGelu": (unary_case(st.sampled_from([{}, {"alpha": 1.0}, {"alpha": -0.5}])),
                  ref_quick_gelu, MS, 17, True),
    "FusedMatMul": (matmul_case(), ref_fused_matmul, MS, 17, True),
    "TransposeMatMul": (matmul_case(batch_transposes=False), ref_fused_matmul, MS, 17, True),
    "FusedGemm": (fused_gemm_case(), ref_fused_gemm, MS, 17, True),
    "FusedConv": (fused_conv_case(), ref_fused_conv, MS, 17, True),
    # onnxruntime has BiasSoftmax and ScaledSum kernels for CUDA and ROCm only.
    "BiasSoftmax": (bias_softmax_case(), ref_bias_softmax, MS, 17, False),
    "ScaledSum": (scaled_sum_case(), ref_scaled_sum, MS, 17, False),
    # ORT's LayerNormalization-1 (default domain) is what opsets < 17 dispatch to.
    "LayerNormalization": (layer_norm_case(), ref_layer_norm, "", 16, True),
    "SimplifiedLayerNormalization": (layer_norm_case(simplified=True), ref_simplified_layer_norm,
                                     "", 17, True),
    "SkipLayerNormalization": (skip_layer_norm_case(), ref_skip_layer_norm, MS, 17, True),
    "SkipSimplifiedLayerNormalization": (skip_layer_norm_case(simplified=True),
                                         ref_skip_simplified_layer_norm, MS, 17, True),
}
COVERED_OPS = set(CASES)


_ORT_1_19 = ort is not None and ort.__version__.startswith("1.19.")


def _ort_skip_reason(op, case):
    if not CASES[op][4]:
        return f"onnxruntime's CPU provider has no {op} kernel"
    if op == "FusedGemm" and case.inputs[0].dtype == F16:
        return "onnxruntime's float16 FusedGemm fuses only Relu, LeakyRelu and Tanh"
    if op == "SkipSimplifiedLayerNormalization" and case.inputs[3] is not None and _ORT_1_19:
        return "onnxruntime 1.19's kernel ignores the bias (test_onnxruntime_1_19_ignores_the_bias_of_skip_simplified_layer_norm)"
    return None


@pytest.mark.skipif(not _ORT_1_19, reason="pins a bug of onnxruntime 1.19 (1.32 adds the bias)")
def test_onnxruntime_1_19_ignores_the_bias_of_skip_simplified_layer_norm():
    # The schema (and onnxruntime 1.32) compute input + skip + bias; 1.19's CPU kernel
    # drops the bias from both the output and input_skip_bias_sum. jaxort follows the
    # schema (docs/migration.md, "ONNX Runtime bugs jaxort does not reproduce").
    rng = np.random.default_rng(11)
    x, skip, gamma, bias = (rng.uniform(0.5, 1.5, s).astype(F32) for s in ((2, 3), (2, 3), (3,), (3,)))
    case = Case((x, skip, gamma, bias), {}, 4)
    model = one_node_model("SkipSimplifiedLayerNormalization", case, MS, 17)
    y, _, _, total = run_ort(model, case)
    without_bias = ref_skip_simplified_layer_norm(x, skip, gamma)
    np.testing.assert_allclose(y, without_bias[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(total, without_bias[3], rtol=1e-6, atol=1e-6)
    ours = run_jaxort(model, case)
    np.testing.assert_allclose(ours[0], ref_skip_simplified_layer_norm(x, skip, gamma, bias)[0],
                               rtol=1e-5, atol=1e-6)
    assert np.abs(ours[0] - y).max() > 0.05


@pytest.mark.parametrize("op", sorted(CASES))
def test_matches_numpy_onnxruntime_and_eager(op):
    strategy, reference, domain, opset, _ = CASES[op]

    @SETTINGS
    @given(strategy)
    def check(case):
        model = one_node_model(op, case, domain, opset)
        got = run_jaxort(model, case)
        want = reference(*case.inputs, **case.attrs)[:case.n_out]
        assert_close(got, want, TOL_NUMPY, f"{op} vs numpy")
        eager = run_jaxort(model, case, jit=False)
        assert_close(got, eager, {F32: (1e-6, 1e-6), F16: (1e-3, 1e-3)}, f"{op} jit vs eager")
        if ort is not None and _ort_skip_reason(op, case) is None:
            theirs = run_ort(model, case)
            # onnxruntime 1.19 leaves Skip(Simplified)LayerNormalization's optional mean and
            # inv_std_var outputs unset (None; 1.32 computes them): compare what it computed.
            unset = [k for k, w in enumerate(theirs) if w is None]
            assert not unset or (op.startswith("Skip") and set(unset) <= {1, 2}), (op, unset)
            kept = [k for k in range(len(theirs)) if k not in unset]
            assert_close([got[k] for k in kept], [theirs[k] for k in kept], TOL_ORT, f"{op} vs onnxruntime")

    check()


@pytest.mark.skipif(ort is None, reason="needs onnxruntime")
def test_float16_fused_gemm_matches_onnxruntime():
    rng = np.random.default_rng(3)
    for act, extra in (("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}), ("Tanh", {})):
        case = Case(tuple(rng.uniform(-2, 2, s).astype(F16) for s in ((3, 4), (4, 5), (5,))),
                    {"activation": act, **extra})
        model = one_node_model("FusedGemm", case)
        assert_close(run_jaxort(model, case), run_ort(model, case), TOL_ORT, act)


# --------------------------------------------------------------------------- gradients


def _r(*s, seed=0, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, size=s)


GRAD_CASES = [
    ("Gelu", (_r(2, 5),), {}, 1),
    ("BiasGelu", (_r(2, 3, 4), _r(4, seed=1)), {}, 1),
    ("FastGelu", (_r(3, 4), _r(4, seed=1)), {}, 1),
    ("FastGelu", (_r(3, 4),), {}, 1),
    ("QuickGelu", (_r(3, 4),), {"alpha": 1.3}, 1),
    ("FusedMatMul", (_r(3, 2, 4), _r(2, 5, 4, seed=1)),
     {"transBatchA": 1, "transB": 1, "alpha": 0.5}, 1),
    ("FusedMatMul", (_r(4, 2, 3), _r(4, 2, 5, seed=1)),
     {"transA": 1, "transBatchA": 1, "transBatchB": 1}, 1),
    ("TransposeMatMul", (_r(2, 4, 3), _r(4, 5, seed=1)), {"transA": 1, "alpha": -1.5}, 1),
    ("FusedGemm", (_r(3, 4), _r(5, 4, seed=1), _r(5, seed=2)),
     {"transB": 1, "alpha": 0.5, "beta": 2.0, "activation": "LeakyRelu",
      "activation_alpha": 0.1}, 1),
    ("FusedGemm", (_r(4, 3), _r(4, 2, seed=1), _r(3, 2, seed=2)),
     {"transA": 1, "activation": "Selu", "activation_alpha": 1.5, "activation_gamma": 1.1}, 1),
    ("FusedConv", (_r(1, 2, 4, 5), _r(3, 2, 2, 2, seed=1), _r(3, seed=2), _r(1, 3, 3, 4, seed=3)),
     {"activation": "Tanh"}, 1),
    ("FusedConv", (_r(2, 1, 5, 5), _r(2, 1, 3, 3, seed=1), _r(2, seed=2)),
     {"pads": [1, 1, 1, 1], "strides": [2, 1], "activation": "HardSigmoid",
      "activation_params": [0.2, 0.5]}, 1),
    ("BiasSoftmax", (_r(2, 3, 4), _r(2, 1, 4, seed=1)), {"axis": 2, "is_inner_broadcast": 1}, 1),
    ("ScaledSum", (_r(2, 3), _r(2, 3, seed=1), _r(2, 3, seed=2)), {"scale_0": 0.5, "scale_1": -2.0}, 1),
    ("BiasSoftmax", (_r(2, 3, 4), _r(3, 4, seed=1)), {"axis": 1, "is_inner_broadcast": 0}, 1),
    ("LayerNormalization", (_r(2, 3, 4), _r(3, 4, seed=1), _r(3, 4, seed=2)),
     {"axis": 1, "epsilon": 1e-3}, 3),
    ("SimplifiedLayerNormalization", (_r(3, 5), _r(5, seed=1)), {"epsilon": 1e-3}, 2),
    ("SkipLayerNormalization", (_r(2, 3, 4), _r(3, 4, seed=1), _r(4, seed=2), _r(4, seed=3),
                                _r(4, seed=4)), {"epsilon": 1e-3}, 4),
    ("SkipSimplifiedLayerNormalization", (_r(2, 3, 4), _r(2, 3, 4, seed=1), _r(4, seed=2),
                                          _r(4, seed=3)), {"epsilon": 1e-3}, 4),
]


@pytest.mark.parametrize("op,inputs,attrs,n_out", GRAD_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(GRAD_CASES)])
def test_gradient_matches_finite_differences(op, inputs, attrs, n_out):
    domain, opset = CASES[op][2], CASES[op][3]
    case = Case(tuple(inputs), attrs, n_out)
    g = JaxGraph(one_node_model(op, case, domain, opset), params=[], check=False)
    rng = np.random.default_rng(7)

    with x64_enabled_scope():
        outs = jax.jit(g.apply)({}, *inputs)
        weights = [jnp.asarray(rng.uniform(0.5, 1.5, np.shape(o))) for o in outs]

        def f(*xs):
            return sum(jnp.sum(w * o) for w, o in zip(weights, g.apply({}, *xs)))

        check_grads(jax.jit(f), tuple(jnp.asarray(x) for x in inputs), order=1, modes=["rev"],
                    eps=1e-5,
                    atol=1e-6, rtol=1e-6)



@pytest.mark.parametrize("activation, attrs, standard", [
    ("Relu", {}, ("Relu", {})),
    ("LeakyRelu", {"activation_alpha": 0.2}, ("LeakyRelu", {"alpha": 0.2})),
])
def test_fused_gemm_activation_takes_orts_subgradient_at_its_kink(activation, attrs, standard):
    # Gemm outputs exactly 0 (zero rows of A, zero bias) sit on the activation's
    # kink: the fused op's gradient must be the standard ops' (ORT's choice
    # there, checked against ORT in tests/api/test_kinks.py), not JAX's max rule.
    a = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]], np.float32)
    b = np.random.default_rng(0).uniform(-1, 1, (3, 4)).astype(np.float32)
    c = np.zeros(4, np.float32)
    fused = helper.make_node("FusedGemm", ["a", "b", "c"], ["y"], domain="com.microsoft", activation=activation,
                             **attrs)
    plain = [helper.make_node("Gemm", ["a", "b", "c"], ["g"]), helper.make_node(standard[0], ["g"], ["y"],
                                                                               **standard[1])]
    grads = []
    for nodes in ([fused], plain):
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, v.shape)
                                               for n, v in (("a", a), ("b", b), ("c", c))],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        g = JaxGraph(model, params=[], check=False)
        grads.append(jax.grad(lambda b_, c_: jnp.sum(g.apply({}, a, b_, c_)[0] * 1.5), argnums=(0, 1))(b, c))
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # Row 0 is all on the kink: its share of the bias gradient is ORT's slope at 0 (0 or alpha) times 1.5.
    slope = {"Relu": 0.0, "LeakyRelu": 0.2}[activation]
    y1 = a[1] @ b
    np.testing.assert_allclose(grads[0][1], 1.5 * (slope + np.where(y1 > 0, 1.0, slope)), rtol=1e-6)
