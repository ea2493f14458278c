"""Neural-network families (ops/matmul, conv, pool, norm, softmax, attention, rnn, ...).

One table, ``CASES``: an entry per op (or op form) with a hypothesis strategy
drawing inputs and attributes, and a tolerance scale. Each entry is run jitted
under strict dtype promotion with 64-bit types enabled, so output dtypes must
match the reference exactly. ``GRAD_CASES`` are finite-difference gradient
checks in float64. Then the jaxort-specific training behaviours
(BatchNormalization running statistics, Dropout) and a few spec corners.
"""

from __future__ import annotations

import dataclasses

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from jaxort.graph import JaxGraph, x64_enabled_scope

COVERED_OPS = {
    "MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "LpPool", "BatchNormalization",
    "LayerNormalization", "InstanceNormalization", "GroupNormalization", "Dropout", "Softmax",
    "LogSoftmax", "Hardmax", "LRN", "LpNormalization", "MeanVarianceNormalization",
    "RMSNormalization", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv",
    "Attention", "RotaryEmbedding", "GridSample", "AffineGrid", "Col2Im", "MaxUnpool",
    "DeformConv", "RoiAlign", "RNN", "GRU", "LSTM",
}

F16 = np.dtype(np.float16)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
I8, U8, I32, I64 = (np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64))

# (rtol, atol) per dtype for tol=1; an entry's ``tol`` scales both.
TOL = {F16: (5e-3, 5e-3), F32: (1e-5, 1e-5), F64: (1e-10, 1e-10)}
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))

# The installed onnx: its newest opset, and whether its reference evaluator predates the
# fixes of onnx 1.17 (Conv auto_pad, grouped ConvTranspose, RNN/GRU/LSTM directions and
# LSTM layout=1), where the strategies below draw only the forms it computes correctly.
ONNX_OPSET = onnx.defs.onnx_opset_version()
OLD_REFERENCE = tuple(int(p) for p in onnx.__version__.split(".")[:2]) < (1, 17)


def require_opset(op: str, opset: int):
    if ONNX_OPSET < opset:
        pytest.skip(f"{op} needs opset {opset}; onnx {onnx.__version__} knows up to "
                    f"opset {ONNX_OPSET} (no schema, no reference)")


# --------------------------------------------------------------------------- model helpers


@dataclasses.dataclass(frozen=True)
class Example:
    """One drawn case: inputs (None = absent optional), attributes, opset, outputs used.

    ``static``: indices of inputs stored as initializers (trace-time constants).
    """

    inputs: tuple
    attrs: dict
    opset: int | None = None
    n_out: int = 1
    static: tuple = ()


def make_model(ex: Example, op: str):
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(ex.inputs)]
    while names and not names[-1]:
        names.pop()
    outs = [f"out{i}" for i in range(ex.n_out)]
    node = helper.make_node(op, names, outs, **ex.attrs)
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))
        for i, (n, x) in enumerate(zip(names, ex.inputs)) if n and i not in ex.static]
    inits = [numpy_helper.from_array(ex.inputs[i], names[i]) for i in ex.static]
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outs],
                              initializer=inits)
    opset = ex.opset or onnx.defs.onnx_opset_version()
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def dynamic_inputs(ex: Example):
    return [x for i, x in enumerate(ex.inputs) if x is not None and i not in ex.static]


def run_reference(model, ex: Example):
    feeds = {f"in{i}": x for i, x in enumerate(ex.inputs)
             if x is not None and i not in ex.static}
    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]


def run_jaxort(model, ex: Example):
    g = JaxGraph(model, params=[], check=False)
    with x64_enabled_scope(), jax.numpy_dtype_promotion("strict"):
        outs = jax.jit(g.apply)({}, *dynamic_inputs(ex))
        return [np.asarray(o) for o in outs]


def assert_matches(got, expected, tol=1.0):
    assert len(got) >= len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype, f"dtype {g.dtype} != expected {e.dtype}"
        assert g.shape == e.shape, f"shape {g.shape} != expected {e.shape}"
        if e.dtype in TOL:
            rtol, atol = TOL[e.dtype]
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64),
                                       rtol=rtol * tol, atol=atol * tol)
        else:
            np.testing.assert_array_equal(g, e)


# --------------------------------------------------------------------------- strategies


def arr(draw, dtype, shape, lo=-2.0, hi=2.0):
    """An array of ``dtype``; floats drawn on a coarse grid (robust to ties and rounding)."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo_i, hi_i = max(int(lo), int(info.min)), min(int(hi), int(info.max))
        return draw(hnp.arrays(dt, shape, elements=st.integers(lo_i, hi_i)))
    seed = draw(st.integers(0, 2**32 - 1))
    x = np.random.default_rng(seed).uniform(lo, hi, size=shape)
    return x.astype(dt)


def floats(draw, dtypes=(F32, F64)):
    return draw(st.sampled_from(dtypes))


@st.composite
def matmul_case(draw):
    dt = floats(draw, (F32, F64, I32, I64))
    b, m, k, n = (draw(st.integers(1, 4)) for _ in range(4))
    batch = draw(st.sampled_from([(), (b,), (2, b)]))
    return Example((arr(draw, dt, batch + (m, k)), arr(draw, dt, (k, n))), {})


@st.composite
def gemm_case(draw):
    dt = floats(draw)
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    ta, tb = draw(st.booleans()), draw(st.booleans())
    a = arr(draw, dt, (k, m) if ta else (m, k))
    b = arr(draw, dt, (n, k) if tb else (k, n))
    c_shape = draw(st.sampled_from([None, (), (n,), (1, n), (m, 1), (m, n)]))
    c = None if c_shape is None else arr(draw, dt, c_shape)
    attrs = dict(transA=int(ta), transB=int(tb), alpha=draw(st.sampled_from([1.0, 0.5, -2.0])),
                 beta=draw(st.sampled_from([1.0, 0.0, 3.0])))
    return Example((a, b, c), attrs)


EINSUMS = {
    "ij,jk->ik": "ij,jk", "bij,bjk->bik": "bij,bjk", "ii->i": "ii", "ij->ji": "ij",
    "i,i": "i,i", "...ij,...jk->...ik": "xij,xjk", "ij->": "ij", "ij,kj": "ij,kj",
}


@st.composite
def einsum_case(draw):
    dt = floats(draw, (F32, F64, I64))
    eq, pattern = draw(st.sampled_from(sorted(EINSUMS.items())))
    size = {ch: draw(st.integers(1, 3)) for ch in "bijkx"}
    size["j" if eq == "ii->i" else "_"] = size["i"]
    inputs = tuple(arr(draw, dt, tuple(size[ch] for ch in term)) for term in pattern.split(","))
    return Example(inputs, {"equation": eq})


def _conv_geometry(draw, nd, max_stride=2, max_dil=2, auto=True, pool=False):
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, max_stride)) for _ in range(nd)]
    dil = [draw(st.integers(1, max_dil)) for _ in range(nd)]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    size = [e + draw(st.integers(0, 3)) for e in eff]
    attrs = dict(kernel_shape=kernel, strides=strides, dilations=dil)
    mode = draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"] if auto
                                else ["NOTSET"]))
    if mode == "NOTSET":
        limit = [k - 1 for k in kernel] if pool else [e - 1 for e in eff]
        attrs["pads"] = ([draw(st.integers(0, lim)) for lim in limit]
                         + [draw(st.integers(0, lim)) for lim in limit])
    elif mode != "VALID" and any((-(-n // s) - 1) * s + e < n
                                 for n, s, e in zip(size, strides, eff)):
        attrs["auto_pad"] = "VALID"  # the reference fails on a negative SAME padding
    else:
        attrs["auto_pad"] = mode
    return size, attrs


@st.composite
def conv_case(draw):
    dt = floats(draw)
    nd = draw(st.integers(1, 3))
    # onnx < 1.17's reference Conv pads VALID like SAME and computes SAME from the wrong axes.
    size, attrs = _conv_geometry(draw, nd, auto=not OLD_REFERENCE)
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
    # The reference's grouped path fails unless the padding is explicit.
    form = draw(st.sampled_from(["pads", "output_shape", "same"] if group == 1 else ["pads"]))
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
def max_pool_case(draw):
    dt = floats(draw, (F32, F64, F16))
    nd = draw(st.integers(1, 3))
    size, attrs = _conv_geometry(draw, nd, pool=True)
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
    size, attrs = _conv_geometry(draw, nd, pool=True)
    if "pads" in attrs:
        attrs["ceil_mode"] = int(draw(st.booleans()))
        attrs["count_include_pad"] = int(draw(st.booleans()))
    x = arr(draw, dt, (draw(st.integers(1, 2)), draw(st.integers(1, 2)), *size))
    return Example((x,), attrs)


@st.composite
def lp_pool_case(draw):
    dt = floats(draw)
    nd = draw(st.integers(1, 2))
    size, attrs = _conv_geometry(draw, nd, pool=True)
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
def dropout_case(draw):
    dt = floats(draw, (F32, F64, F16))
    x = arr(draw, dt, tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 3)))))
    form = draw(st.sampled_from(["7", "12", "13-ratio", "13-train-false"]))
    if form == "7":
        return Example((x,), dict(ratio=0.3), 7)
    if form == "12":
        return Example((x,), {}, 12, n_out=2)
    ratio = np.array(0.25, np.float32)
    if form == "13-ratio":
        return Example((x, ratio), {}, 13, n_out=2)
    return Example((x, ratio, np.array(False)), {}, 13, n_out=2)


def softmax_case(opset):
    @st.composite
    def strat(draw):
        dt = floats(draw, (F32, F64, F16))
        shape = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 4))))
        x = arr(draw, dt, shape, -4, 4)
        return Example((x,), {"axis": draw(st.integers(-len(shape), len(shape) - 1))}, opset)

    return strat()


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


@st.composite
def matmul_integer_case(draw):
    dt = draw(st.sampled_from([I8, U8]))
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    a, b = arr(draw, dt, (m, k), -128, 255), arr(draw, dt, (k, n), -128, 255)
    azp = np.array(draw(st.integers(0, 100)), dt) if draw(st.booleans()) else None
    bzp = np.array(draw(st.integers(0, 100)), dt) if draw(st.booleans()) else None
    return Example((a, b, azp, bzp), {})


@st.composite
def conv_integer_case(draw):
    dt = U8
    size, attrs = _conv_geometry(draw, 2, auto=not OLD_REFERENCE)  # as conv_case
    c = draw(st.integers(1, 2))
    x = arr(draw, dt, (1, c, *size), 0, 255)
    w = arr(draw, dt, (2, c, *attrs["kernel_shape"]), 0, 255)
    return Example((x, w, np.array(draw(st.integers(0, 255)), dt),
                    np.array(draw(st.integers(0, 255)), dt)), attrs)


def _qparams(draw, dt):
    return (np.array(draw(st.sampled_from([0.01, 0.02, 0.05])), np.float32),
            np.array(draw(st.integers(0, 20)) if dt == U8 else draw(st.integers(-10, 10)), dt))


@st.composite
def qlinear_matmul_case(draw):
    dt = draw(st.sampled_from([I8, U8]))
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    lo, hi = (0, 255) if dt == U8 else (-128, 127)
    a, b = arr(draw, dt, (m, k), lo, hi), arr(draw, dt, (k, n), lo, hi)
    (sa, za), (sb, zb) = _qparams(draw, dt), _qparams(draw, dt)
    sy, zy = np.array(draw(st.sampled_from([2.0, 8.0, 30.0])), np.float32), _qparams(draw, dt)[1]
    return Example((a, sa, za, b, sb, zb, sy, zy), {})


@st.composite
def qlinear_conv_case(draw):
    size, attrs = _conv_geometry(draw, 2, auto=False)
    c = draw(st.integers(1, 2))
    x = arr(draw, U8, (1, c, *size), 0, 255)
    w = arr(draw, U8, (2, c, *attrs["kernel_shape"]), 0, 255)
    (sx, zx), (sw, zw) = _qparams(draw, U8), _qparams(draw, U8)
    sy = np.array(draw(st.sampled_from([4.0, 16.0])), np.float32)
    zy = _qparams(draw, U8)[1]
    b = arr(draw, I32, (2,), -100, 100) if draw(st.booleans()) else None
    return Example((x, sx, zx, w, sw, zw, sy, zy, b), attrs)


@st.composite
def attention_case(draw):
    dt = F32  # the reference rounds sqrt(scale) to float32 (attributes are float32)
    b, hq, s, kv, d = (draw(st.integers(1, 3)) for _ in range(5))
    hk = draw(st.sampled_from([h for h in (1, hq) if hq % h == 0]))
    rank3 = draw(st.booleans())
    past = draw(st.booleans())
    if rank3:
        q, k, v = (arr(draw, dt, (b, s, hq * d)), arr(draw, dt, (b, kv, hk * d)),
                   arr(draw, dt, (b, kv, hk * d)))
        attrs = dict(q_num_heads=hq, kv_num_heads=hk)
    else:
        q, k, v = (arr(draw, dt, (b, hq, s, d)), arr(draw, dt, (b, hk, kv, d)),
                   arr(draw, dt, (b, hk, kv, d)))
        attrs = {}
    p = draw(st.integers(1, 2)) if past else 0
    pk = arr(draw, dt, (b, hk, p, d)) if past else None
    pv = arr(draw, dt, (b, hk, p, d)) if past else None
    mask_kind = draw(st.sampled_from([None, "bool", "float"]))
    mask = None
    if mask_kind == "bool":
        mask = draw(hnp.arrays(np.bool_, (s, kv + p)))
        mask[:, 0] = True
    elif mask_kind == "float":
        mask = arr(draw, dt, (s, kv + p))
    attrs["is_causal"] = int(draw(st.booleans()))
    if draw(st.booleans()):
        attrs["scale"] = 0.5
    if draw(st.booleans()):
        attrs["softcap"] = 2.0
    attrs["qk_matmul_output_mode"] = draw(st.sampled_from([0, 1, 2, 3]))
    return Example((q, k, v, mask, pk, pv), attrs, 23, n_out=4)


@st.composite
def rotary_case(draw):
    dt = floats(draw)
    b, s, h = (draw(st.integers(1, 3)) for _ in range(3))
    d = 2 * draw(st.integers(1, 3))
    rot = draw(st.sampled_from([0, d])) if d > 2 else 0
    half = (rot or d) // 2
    rank3 = draw(st.booleans())
    x = arr(draw, dt, (b, s, h * d) if rank3 else (b, h, s, d))
    attrs = dict(interleaved=int(draw(st.booleans())), rotary_embedding_dim=rot)
    if rank3:
        attrs["num_heads"] = h
    if draw(st.booleans()):
        cos, sin = arr(draw, dt, (s + 2, half)), arr(draw, dt, (s + 2, half))
        pos = arr(draw, I64, (b, s), 0, s + 1)
        return Example((x, cos, sin, pos), attrs, 23)
    return Example((x, arr(draw, dt, (b, s, half)), arr(draw, dt, (b, s, half))), attrs, 23)


@st.composite
def grid_sample_case(draw):
    dt = F32  # the reference denormalizes coordinates in float32
    nd = draw(st.sampled_from([2, 2, 3]))
    x = arr(draw, dt, (1, draw(st.integers(1, 2))) + tuple(draw(st.integers(2, 4))
                                                          for _ in range(nd)))
    grid = arr(draw, dt, (1,) + tuple(draw(st.integers(1, 3)) for _ in range(nd)) + (nd,),
               -1.3, 1.3)
    modes = ["linear", "nearest"] + (["cubic"] if nd == 2 else [])
    attrs = dict(mode=draw(st.sampled_from(modes)),
                 padding_mode=draw(st.sampled_from(["zeros", "border", "reflection"])),
                 align_corners=int(draw(st.booleans())))
    return Example((x, grid), attrs, 22)


@st.composite
def affine_grid_case(draw):
    dt = F32  # the reference returns float32 for float64 theta
    nd = draw(st.sampled_from([2, 3]))
    n = draw(st.integers(1, 2))
    size = np.array([n, 1] + [draw(st.integers(1, 4)) for _ in range(nd)], np.int64)
    theta = arr(draw, dt, (n, nd, nd + 1))
    return Example((theta, size), dict(align_corners=int(draw(st.booleans()))), 20,
                   static=(1,))


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


@st.composite
def roi_align_case(draw):
    dt = floats(draw)
    x = arr(draw, dt, (2, draw(st.integers(1, 2)), 5, 6))
    r = draw(st.integers(1, 3))
    lo = arr(draw, dt, (r, 2), -1, 3)
    rois = np.concatenate([lo, lo + arr(draw, dt, (r, 2), 0.5, 4)], axis=1)
    idx = arr(draw, I64, (r,), 0, 1)
    attrs = dict(output_height=draw(st.integers(1, 3)), output_width=draw(st.integers(1, 3)),
                 sampling_ratio=draw(st.integers(1, 2)), spatial_scale=0.9,
                 mode=draw(st.sampled_from(["avg", "max"])),
                 coordinate_transformation_mode=draw(st.sampled_from(
                     ["half_pixel", "output_half_pixel"])))
    return Example((x, rois, idx), attrs, 16)


def recurrent_case(op):
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]

    @st.composite
    def strat(draw):
        dt = floats(draw)
        seq, batch, inp, hid = (draw(st.integers(1, 3)) for _ in range(4))
        # onnx < 1.17's reference runs every direction forward (and raises for
        # bidirectional), mixes up batch and sequence for layout=1 and has no LSTM Y_c.
        direction = draw(st.sampled_from(["forward"] if OLD_REFERENCE
                                         else ["forward", "reverse", "bidirectional"]))
        nd = 2 if direction == "bidirectional" else 1
        layout = 0 if OLD_REFERENCE else int(draw(st.booleans()))
        x = arr(draw, dt, (batch, seq, inp) if layout else (seq, batch, inp))
        w = arr(draw, dt, (nd, gates * hid, inp))
        r = arr(draw, dt, (nd, gates * hid, hid))
        b = arr(draw, dt, (nd, 2 * gates * hid)) if draw(st.booleans()) else None
        hshape = (batch, nd, hid) if layout else (nd, batch, hid)
        h0 = arr(draw, dt, hshape) if draw(st.booleans()) else None
        # The reference ignores sequence_lens and clip: see test_recurrent_sequence_lens_and_clip.
        inputs = [x, w, r, b, None, h0]
        attrs = dict(hidden_size=hid, direction=direction, layout=layout)
        if op == "LSTM":
            inputs.append(arr(draw, dt, hshape) if draw(st.booleans()) else None)
            inputs.append(arr(draw, dt, (nd, 3 * hid)) if draw(st.booleans()) else None)
        if op == "GRU":
            attrs["linear_before_reset"] = int(draw(st.booleans()))
        return Example(tuple(inputs), attrs, 22,
                       n_out=3 if op == "LSTM" and not OLD_REFERENCE else 2)

    return strat()


def coerced_2d(fn):
    """numpy reference of the opset < 13 softmax family: x coerced to 2-D at axis.

    (ONNX's reference evaluator applies the opset 13 axis semantics to every opset.)
    """

    def ref(model, ex):
        x = ex.inputs[0]
        axis = ex.attrs["axis"] % x.ndim
        x2 = x.astype(np.float64).reshape(int(np.prod(x.shape[:axis])), -1)
        return [fn(x2).reshape(x.shape).astype(x.dtype)]

    return ref


def _np_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _np_hardmax(x):
    return np.eye(x.shape[1])[np.argmax(x, axis=1)]


def _np_pool(kind):
    """Loop-based numpy pooling with ORT's geometry (the reference evaluator's pooling
    mis-sizes padded 1-D outputs and SAME_LOWER)."""

    def ref(model, ex):
        x = ex.inputs[0].astype(np.float64)
        a = ex.attrs
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


def _np_global_lp_pool(model, ex):
    """numpy reference (ONNX's reference evaluator has no GlobalLpPool)."""
    x, p = ex.inputs[0], ex.attrs["p"]
    s = (np.abs(x.astype(np.float64)) ** p).sum(axis=(2, 3), keepdims=True)
    return [(s ** (1.0 / p)).astype(x.dtype)]


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    strategy: st.SearchStrategy
    tol: float = 1.0
    name: str = ""
    reference: object = run_reference
    min_opset: int = 1  # the opset the op's drawn forms need from the installed onnx

    @property
    def id(self):
        return self.name or self.op


CASES = [
    Case("MatMul", matmul_case(), 10),
    Case("Gemm", gemm_case(), 10),
    Case("Einsum", einsum_case(), 10),
    Case("Conv", conv_case(), 10),
    Case("ConvTranspose", conv_transpose_case(), 10),
    Case("MaxPool", max_pool_case(), reference=_np_pool("max")),
    Case("AveragePool", average_pool_case(), 10, reference=_np_pool("avg")),
    Case("LpPool", lp_pool_case(), 10, reference=_np_pool("lp")),
    Case("GlobalAveragePool", global_pool_case(), 10),
    Case("GlobalMaxPool", global_pool_case()),
    Case("GlobalLpPool", global_pool_case(p=True), 10, reference=_np_global_lp_pool),
    Case("BatchNormalization", batch_norm_case(), 10),
    Case("LayerNormalization", layer_norm_case(), 100),
    Case("RMSNormalization", rms_norm_case(), 10, min_opset=23),
    Case("InstanceNormalization", instance_norm_case(), 100),
    Case("GroupNormalization", group_norm_case(), 100),
    Case("Dropout", dropout_case()),
    Case("Softmax", softmax_case(11), 10, "Softmax-11", coerced_2d(_np_softmax)),
    Case("Softmax", softmax_case(13), 10, "Softmax-13"),
    Case("LogSoftmax", softmax_case(11), 10, "LogSoftmax-11",
         coerced_2d(lambda x: np.log(_np_softmax(x)))),
    Case("LogSoftmax", softmax_case(13), 10, "LogSoftmax-13"),
    Case("Hardmax", softmax_case(11), 1, "Hardmax-11", coerced_2d(_np_hardmax)),
    Case("Hardmax", softmax_case(13), 1, "Hardmax-13"),
    Case("LRN", lrn_case(), 10),
    Case("LpNormalization", lp_norm_case(), 10),
    Case("MeanVarianceNormalization", mvn_case(), 100),
    Case("MatMulInteger", matmul_integer_case()),
    Case("ConvInteger", conv_integer_case()),
    Case("QLinearMatMul", qlinear_matmul_case()),
    Case("QLinearConv", qlinear_conv_case()),
    Case("Attention", attention_case(), 10, min_opset=23),
    Case("RotaryEmbedding", rotary_case(), 10, min_opset=23),
    Case("GridSample", grid_sample_case(), 100),
    Case("AffineGrid", affine_grid_case(), 10),
    Case("Col2Im", col2im_case(), 10),
    Case("MaxUnpool", max_unpool_case()),
    Case("DeformConv", deform_conv_case(), 100),
    Case("RoiAlign", roi_align_case(), 100),
    Case("RNN", recurrent_case("RNN"), 10),
    Case("GRU", recurrent_case("GRU"), 10),
    Case("LSTM", recurrent_case("LSTM"), 10),
]


def test_table_covers_every_op():
    assert {c.op for c in CASES} == COVERED_OPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_reference(case):
    require_opset(case.op, case.min_opset)

    @SETTINGS
    @given(ex=case.strategy)
    def check(ex):
        model = make_model(ex, case.op)
        expected = case.reference(model, ex)[:ex.n_out]
        got = run_jaxort(model, ex)[:ex.n_out]
        assert_matches(got, expected, case.tol)

    check()


# --------------------------------------------------------------------------- gradients


def _rand(*shape, seed=0, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed + sum(shape)).uniform(lo, hi, shape)


GRAD_CASES = [
    ("Conv", lambda: (_rand(2, 2, 5, 4), _rand(4, 1, 3, 2, seed=1), _rand(4, seed=2)),
     dict(pads=[1, 0, 1, 1], strides=[2, 1], dilations=[1, 2], group=2), None),
    ("Conv", lambda: (_rand(1, 2, 6), _rand(3, 2, 3, seed=1)), dict(auto_pad="SAME_LOWER"), None),
    ("ConvTranspose", lambda: (_rand(1, 2, 3, 3), _rand(2, 2, 2, 3, seed=1), _rand(4, seed=2)),
     dict(strides=[2, 1], pads=[0, 1, 1, 0], output_padding=[1, 0], group=2), None),
    ("MaxPool", lambda: (_rand(1, 2, 5, 5),),
     dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], ceil_mode=1), None),
    ("AveragePool", lambda: (_rand(1, 2, 5, 5),),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0), None),
    ("Gemm", lambda: (_rand(3, 4), _rand(5, 4, seed=1), _rand(5, seed=2)),
     dict(transB=1, alpha=0.5, beta=2.0), None),
    ("BatchNormalization", lambda: (_rand(3, 2, 2, 2), _rand(2, seed=1), _rand(2, seed=2),
                                    _rand(2, seed=3), _rand(2, seed=4, lo=0.5, hi=1.5)),
     dict(epsilon=1e-3), 15),
    ("BatchNormalization", lambda: (_rand(3, 2, 2, 2), _rand(2, seed=1), _rand(2, seed=2),
                                    _rand(2, seed=3), _rand(2, seed=4, lo=0.5, hi=1.5)),
     dict(epsilon=1e-3, training_mode=1), 15),
    ("LayerNormalization", lambda: (_rand(2, 3, 4), _rand(3, 4, seed=1), _rand(3, 4, seed=2)),
     dict(axis=1, epsilon=1e-3), None),
    ("Softmax", lambda: (_rand(2, 3, 4),), dict(axis=1), None),
    ("LogSoftmax", lambda: (_rand(2, 3, 4),), dict(axis=-1), None),
]


@pytest.mark.parametrize("op,make,attrs,opset", GRAD_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(GRAD_CASES)])
def test_gradient_matches_finite_differences(op, make, attrs, opset):
    inputs = make()
    ex = Example(tuple(inputs), attrs, opset)
    g = JaxGraph(make_model(ex, op), params=[], check=False)
    diff = [0, 1, 2] if op == "BatchNormalization" else list(range(len(inputs)))

    def f(*xs):
        args = list(inputs)
        for i, x in zip(diff, xs):
            args[i] = x
        return g.apply({}, *args)[0]

    with x64_enabled_scope():
        xs = tuple(jnp.asarray(inputs[i]) for i in diff)
        check_grads(f, xs, order=1, modes=["rev"], eps=1e-5, atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------- jaxort training


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
    x, s, b, m = (_rand(2, 2, 3, seed=i).astype(np.float32) if i == 0 else
                  _rand(2, seed=i).astype(np.float32) for i in range(4))
    v = _rand(2, seed=5, lo=0.5, hi=1.5).astype(np.float32)
    ex = Example((x, s, b, m, v), dict(epsilon=1e-5), 9)
    (y,) = run_jaxort(make_model(ex, "BatchNormalization"), ex)
    r = (1, 2, 1)
    expected = (x - m.reshape(r)) / np.sqrt(v.reshape(r) + 1e-5) * s.reshape(r) + b.reshape(r)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def _dropout_graph(ratio, training_mode):
    inits = [numpy_helper.from_array(np.array(ratio, np.float32), "ratio")]
    inputs = ["x", "ratio"]
    if training_mode is not None:
        inits.append(numpy_helper.from_array(np.array(training_mode), "training_mode"))
        inputs.append("training_mode")
    node = helper.make_node("Dropout", inputs, ["y", "mask"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_empty_tensor_value_info("y"), helper.make_empty_tensor_value_info("mask")],
        initializer=inits)
    return JaxGraph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                    check=False)


def test_dropout_training_drops_and_rescales():
    g = _dropout_graph(0.25, True)
    x = np.random.default_rng(0).uniform(1, 2, (64, 64)).astype(np.float32)
    apply = jax.jit(lambda p, x, k: g.apply(p, x, rng=k, training=True))
    y, mask = (np.asarray(v) for v in apply(g.params, x, jax.random.key(0)))
    assert mask.dtype == np.bool_ and y.dtype == np.float32
    np.testing.assert_allclose(y[mask], x[mask] / 0.75, rtol=1e-6)
    assert np.all(y[~mask] == 0)
    assert abs(mask.mean() - 0.75) < 0.03
    y2, _ = apply(g.params, x, jax.random.key(1))
    assert not np.array_equal(np.asarray(y2), y)
    grad = jax.grad(lambda x: g.apply(g.params, x, rng=jax.random.key(0), training=True)[0]
                    .sum())(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(grad), mask / 0.75, rtol=1e-6)


@pytest.mark.parametrize("ratio,training_mode,training", [
    (0.25, True, False), (0.25, False, True), (0.25, None, True), (0.0, True, True)])
def test_dropout_is_identity_unless_training(ratio, training_mode, training):
    g = _dropout_graph(ratio, training_mode)
    x = np.random.default_rng(0).uniform(1, 2, (64, 64)).astype(np.float32)
    y, mask = g.apply(g.params, x, rng=jax.random.key(0), training=training)
    np.testing.assert_array_equal(np.asarray(y), x)
    assert np.asarray(mask).dtype == np.bool_ and np.asarray(mask).all()


def test_dropout_is_never_folded():
    from jaxort.graph import lookup

    assert not lookup("", "Dropout", 13).foldable


# --------------------------------------------------------------------------- spec corners


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_sequence_lens(op, direction):
    """A batch row with sequence_lens L equals the op on its first L steps; Y is 0 after."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    nd = 2 if direction == "bidirectional" else 1
    seq, batch, inp, hid = 4, 2, 3, 2
    x = _rand(seq, batch, inp).astype(np.float32)
    w, r = _rand(nd, gates * hid, inp, seed=1), _rand(nd, gates * hid, hid, seed=2)
    b = _rand(nd, 2 * gates * hid, seed=3)
    w, r, b = (v.astype(np.float32) for v in (w, r, b))
    lens = np.array([2, 4], np.int32)
    attrs = dict(hidden_size=hid, direction=direction)
    n_out = 3 if op == "LSTM" else 2
    ex = Example((x, w, r, b, lens), attrs, 22, n_out=n_out)
    outs = run_jaxort(make_model(ex, op), ex)
    for i, n in enumerate(lens):
        sub = Example((x[:n, i:i + 1], w, r, b), attrs, 22, n_out=n_out)
        ref = run_jaxort(make_model(sub, op), sub)
        np.testing.assert_allclose(outs[0][:n, :, i:i + 1], ref[0], rtol=1e-5, atol=1e-6)
        assert np.all(outs[0][n:, :, i] == 0)
        for o, e in zip(outs[1:], ref[1:]):
            np.testing.assert_allclose(o[:, i:i + 1], e, rtol=1e-5, atol=1e-6)


def test_rnn_clip_bounds_the_activation_input():
    x = np.full((1, 1, 1), 3.0, np.float32)
    w, r = np.ones((1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32)
    ex = Example((x, w, r), dict(hidden_size=1, clip=0.5), 22, n_out=2)
    y, _ = run_jaxort(make_model(ex, "RNN"), ex)
    np.testing.assert_allclose(y.reshape(-1), np.tanh([0.5]), rtol=1e-6)


def test_conv_transpose_output_shape_extends_at_the_end():
    # Natural size 3*(3-1)+3 = 9; output_shape 11 adds zero-input rows at the end (as ORT).
    x = _rand(1, 1, 3).astype(np.float32)
    w = _rand(1, 1, 3, seed=1).astype(np.float32)
    natural = Example((x, w), dict(strides=[3]))
    bigger = Example((x, w), dict(strides=[3], output_shape=[11]))
    (a,) = run_jaxort(make_model(natural, "ConvTranspose"), natural)
    (b,) = run_jaxort(make_model(bigger, "ConvTranspose"), bigger)
    assert b.shape == (1, 1, 11)
    np.testing.assert_allclose(b[..., :9], a, rtol=1e-6)
    assert np.all(b[0, 0, 9:] == 0)


def test_max_pool_int8():
    x = np.arange(-8, 8, dtype=np.int8).reshape(1, 1, 4, 4)
    ex = Example((x,), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 0, 0]), 12)
    (y,) = run_jaxort(make_model(ex, "MaxPool"), ex)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, [[[[-8, -6], [0, 2]]]])
