"""Tensor-family ops (shape, layout, indexing, constants, resize, strings).

Each op has an entry in ``TABLE``: a hypothesis strategy drawing one-node
cases (shapes, dtypes, attributes, opset forms) and a tolerance; every case is
run through ``JaxGraph`` (jitted, strict dtype promotion, 64-bit enabled so
int64/float64 keep their width) and compared with ONNX's ReferenceEvaluator.
Differentiable ops also get a float64 finite-difference gradient check.

Tolerances (rtol, atol): data movement and integer results are exact; float32
interpolation/accumulation 1e-5; float16 1e-3 relative on exact moves.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from onnx import helper
from onnx.reference import ReferenceEvaluator

from jaxort.dtypes import to_onnx_type
from jaxort.errors import OpError, StaticValueError, UnsupportedOpError
from jaxort.graph import JaxGraph, x64_enabled_scope

COVERED_OPS = {
    "Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split",
    "Slice", "Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "Scatter",
    "Expand", "Tile", "Pad", "Shape", "Size", "ConstantOfShape", "Constant", "Range", "Trilu",
    "CumSum", "OneHot", "TopK", "DepthToSpace", "SpaceToDepth", "Resize", "Upsample",
    "NonZero", "Unique", "Compress", "ReverseSequence", "EyeLike", "CenterCropPad",
    "StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch", "CumProd",
    "TensorScatter", "TfIdfVectorizer",
}

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min

EXACT = (0.0, 0.0)
F32 = (1e-5, 1e-5)

# The installed onnx: its newest opset, and whether its reference evaluator predates the
# fixes of onnx 1.17 (Scatter reductions, OneHot out-of-range indices, TopK ties, Unique
# under numpy 2, Resize's empty roi and integer saturation), where the strategies draw
# only the forms it computes correctly.
ONNX_OPSET = onnx.defs.onnx_opset_version()
OLD_REFERENCE = tuple(int(p) for p in onnx.__version__.split(".")[:2]) < (1, 17)


def require_opset(op: str, opset: int):
    if ONNX_OPSET < opset:
        pytest.skip(f"{op} needs opset {opset}; onnx {onnx.__version__} knows up to "
                    f"opset {ONNX_OPSET} (no schema, no reference)")


# --------------------------------------------------------------------------- harness


@dataclasses.dataclass
class Case:
    """One node: inputs are (name, value, static); value None is an absent input."""

    op: str
    inputs: list
    attrs: dict = dataclasses.field(default_factory=dict)
    opset: int = 18
    n_out: int = 1
    ref_op: str | None = None  # op the reference evaluator runs instead (Scatter)

    def model(self, reference: bool = False) -> onnx.ModelProto:
        graph_inputs, inits, names = [], [], []
        for name, value, is_static in self.inputs:
            if value is None:
                names.append("")
                continue
            names.append(name)
            value = np.asarray(value)
            if is_static:
                inits.append(helper.make_tensor(
                    name, to_onnx_type(value.dtype), value.shape,
                    value.reshape(-1).tolist() if value.dtype == object else
                    value.tobytes(), raw=value.dtype != object))
            else:
                graph_inputs.append(helper.make_tensor_value_info(
                    name, to_onnx_type(value.dtype), list(value.shape)))
        outs = [f"y{i}" for i in range(self.n_out)]
        op = self.ref_op if reference and self.ref_op else self.op
        node = helper.make_node(op, names, outs, **self.attrs)
        graph = helper.make_graph(
            [node], "g", graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outs],
            initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 10
        return model

    def feeds(self) -> dict:
        return {n: np.asarray(v) for n, v, s in self.inputs if v is not None and not s}


def run_jax(case: Case, jit: bool = True) -> list:
    model = case.model()
    feeds = case.feeds()
    with x64_enabled_scope(), jax.numpy_dtype_promotion("strict"):
        g = JaxGraph(model, params=[], check=False)
        args = [feeds[n] for n in g.input_names]
        strings = any(np.asarray(v).dtype == object for _, v, _ in case.inputs
                      if v is not None) or any("string" in k for k in case.attrs)
        fn = g.apply if (strings or not jit) else jax.jit(g.apply)
        outs = fn({}, *args)
    return [np.asarray(o) for o in outs]


def run_ref(case: Case) -> list:
    return list(ReferenceEvaluator(case.model(reference=True)).run(None, case.feeds()))


def assert_same(got, expected, tol=EXACT):
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        e = np.asarray(e)
        if e.dtype.kind == "U":
            e = e.astype(object)
        assert g.dtype == e.dtype, f"output {i}: dtype {g.dtype} != {e.dtype}"
        assert g.shape == e.shape, f"output {i}: shape {g.shape} != {e.shape}"
        if e.dtype == object or e.dtype.kind in "biu":
            np.testing.assert_array_equal(g, e, err_msg=f"output {i}")
        else:
            rtol, atol = tol
            if e.dtype == np.float16:
                rtol, atol = max(rtol, 1e-3), max(atol, 1e-3)
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64),
                                       rtol=rtol, atol=atol, err_msg=f"output {i}")


def check(case: Case, tol=EXACT):
    assert_same(run_jax(case), run_ref(case), tol)


# --------------------------------------------------------------------------- strategies

FLOATS = [np.float32, np.float64, np.float16]
NUMERIC = [np.float32, np.float64, np.int64, np.int32, np.int8, np.uint8]
ANY = NUMERIC + [np.bool_, np.float16]


def values(draw, shape, dtype, lo=-9, hi=9):
    """Random values of ``dtype`` (seeded by hypothesis)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 3).astype(dtype)
    if dtype.kind == "u":
        lo = max(lo, 0)
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


def shapes(draw, min_rank=1, max_rank=4, min_side=1, max_side=4):
    rank = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.integers(min_side, max_side)) for _ in range(rank))


def i64(v):
    return np.asarray(v, np.int64)


@st.composite
def s_identity(draw):
    x = values(draw, shapes(draw, 0), draw(st.sampled_from(ANY)))
    return Case("Identity", [("x", x, False)], opset=draw(st.sampled_from([1, 13, 16, 21])))


@st.composite
def s_reshape(draw):
    shape = shapes(draw)
    x = values(draw, shape, draw(st.sampled_from(ANY)))
    total = x.size
    kind = draw(st.sampled_from(["flat", "infer", "copy", "rev", "split"]))
    if kind == "flat":
        target = [total]
    elif kind == "infer":
        target = [shape[0], -1]
    elif kind == "copy":
        target = [0 if draw(st.booleans()) else d for d in shape]
    elif kind == "rev":
        target = list(shape[::-1])
    else:
        target = [1, total, 1]
    opset = draw(st.sampled_from([5, 13, 14, 19]))
    attrs = {}
    if opset >= 14 and kind != "copy":
        attrs["allowzero"] = draw(st.sampled_from([0, 1]))
    return Case("Reshape", [("x", x, False), ("s", i64(target), True)], attrs, opset=opset)


@st.composite
def s_flatten(draw):
    x = values(draw, shapes(draw), draw(st.sampled_from(ANY)))
    axis = draw(st.integers(-x.ndim, x.ndim))
    return Case("Flatten", [("x", x, False)], {"axis": axis}, opset=13)


@st.composite
def s_transpose(draw):
    x = values(draw, shapes(draw, 1, 5, max_side=3), draw(st.sampled_from(ANY)))
    attrs = {}
    if draw(st.booleans()):
        attrs["perm"] = list(draw(st.permutations(range(x.ndim))))
    return Case("Transpose", [("x", x, False)], attrs, opset=draw(st.sampled_from([1, 13, 21])))


@st.composite
def s_squeeze(draw):
    shape = tuple(draw(st.sampled_from([1, 1, 2, 3])) for _ in range(draw(st.integers(1, 5))))
    x = values(draw, shape, draw(st.sampled_from(ANY)))
    ones = [i for i, d in enumerate(shape) if d == 1]
    axes = None
    if ones and draw(st.booleans()):
        axes = draw(st.lists(st.sampled_from(ones), min_size=1, unique=True))
        axes = [a - x.ndim if draw(st.booleans()) else a for a in axes]
    opset = draw(st.sampled_from([1, 11, 13, 21]))
    if opset < 13:
        if axes:  # the reference squeezes one axis at a time
            axes = sorted(a % x.ndim for a in axes)
        return Case("Squeeze", [("x", x, False)], {"axes": axes} if axes else {}, opset=opset)
    return Case("Squeeze", [("x", x, False), ("a", None if axes is None else i64(axes), True)],
                opset=opset)


@st.composite
def s_unsqueeze(draw):
    x = values(draw, shapes(draw, 0, 3), draw(st.sampled_from(ANY)))
    k = draw(st.integers(1, 3))
    rank = x.ndim + k
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=k, max_size=k, unique=True))
    axes = [a - rank if draw(st.booleans()) else a for a in axes]
    opset = draw(st.sampled_from([1, 11, 13]))
    if opset < 13:
        axes = sorted(a % rank for a in axes)  # the reference inserts them one by one
        return Case("Unsqueeze", [("x", x, False)], {"axes": axes}, opset=opset)
    return Case("Unsqueeze", [("x", x, False), ("a", i64(axes), True)], opset=opset)


@st.composite
def s_concat(draw):
    shape = list(shapes(draw))
    dtype = draw(st.sampled_from(ANY))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    xs = []
    for i in range(draw(st.integers(1, 4))):
        s = list(shape)
        s[axis] = draw(st.integers(0, 3))
        xs.append((f"x{i}", values(draw, tuple(s), dtype), draw(st.booleans())))
    if all(st_ for _, _, st_ in xs):
        xs[0] = (xs[0][0], xs[0][1], False)
    return Case("Concat", xs, {"axis": axis}, opset=draw(st.sampled_from([11, 13])))


@st.composite
def s_split(draw):
    shape = list(shapes(draw, max_side=6))
    x = values(draw, tuple(shape), draw(st.sampled_from(NUMERIC)))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    dim = shape[axis]
    form = draw(st.sampled_from(["attr", "input", "num", "equal"]))
    if form == "num":
        n = draw(st.integers(1, max(1, dim)))
        n_out = n
        return Case("Split", [("x", x, False)], {"axis": axis, "num_outputs": n},
                    opset=18, n_out=n_out)
    if form == "equal":
        divisors = [d for d in range(1, dim + 1) if dim % d == 0]
        n = draw(st.sampled_from(divisors))
        return Case("Split", [("x", x, False)], {"axis": axis},
                    opset=draw(st.sampled_from([2, 11, 13])), n_out=n)
    cuts = sorted(draw(st.lists(st.integers(0, dim), max_size=3)))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [dim])]
    if form == "attr":
        return Case("Split", [("x", x, False)], {"axis": axis, "split": sizes},
                    opset=draw(st.sampled_from([2, 11])), n_out=len(sizes))
    return Case("Split", [("x", x, False), ("s", i64(sizes), True)], {"axis": axis},
                opset=draw(st.sampled_from([13, 18])), n_out=len(sizes))


@st.composite
def s_slice(draw):
    x = values(draw, shapes(draw, 1, 4, max_side=6), draw(st.sampled_from(ANY)))
    axes = draw(st.lists(st.integers(0, x.ndim - 1), min_size=1, max_size=x.ndim, unique=True))
    bound = st.one_of(st.integers(-8, 8), st.sampled_from([INT64_MAX, INT64_MIN]))
    starts = [draw(bound) for _ in axes]
    ends = [draw(bound) for _ in axes]
    steps = [draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    # numpy (the reference) empties x[s::-1] for s < -dim; ONNX clamps s to 0 (see
    # test_slice_sentinels_and_negative_steps)
    starts = [max(s, -x.shape[a]) if t < 0 else s for s, a, t in zip(starts, axes, steps)]
    if draw(st.booleans()):  # the opset-1 attribute form: step 1, no sentinels below INT32
        starts = [max(min(s, 8), -8) for s in starts]
        ends = [max(min(e, 8), -8) for e in ends]
        return Case("Slice", [("x", x, False)],
                    {"starts": starts, "ends": ends, "axes": axes}, opset=1)
    neg_axes = [a - x.ndim if draw(st.booleans()) else a for a in axes]
    return Case("Slice", [("x", x, False), ("s", i64(starts), True), ("e", i64(ends), True),
                          ("a", i64(neg_axes), True), ("t", i64(steps), True)],
                opset=draw(st.sampled_from([10, 11, 13])))


@st.composite
def s_gather(draw):
    x = values(draw, shapes(draw), draw(st.sampled_from(ANY)))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    n = x.shape[axis]
    idx = values(draw, shapes(draw, 0, 2), draw(st.sampled_from([np.int64, np.int32])), -n,
                 n - 1)
    return Case("Gather", [("x", x, False), ("i", idx, draw(st.booleans()))], {"axis": axis},
                opset=draw(st.sampled_from([1, 11, 13])))


@st.composite
def s_gather_elements(draw):
    x = values(draw, shapes(draw), draw(st.sampled_from(ANY)))
    axis = draw(st.integers(0, x.ndim - 1))  # the reference mishandles negative axes
    n = x.shape[axis]
    ishape = tuple(d if i != axis % x.ndim else draw(st.integers(1, 4))
                   for i, d in enumerate(x.shape))
    idx = values(draw, ishape, draw(st.sampled_from([np.int64, np.int32])), -n, n - 1)
    return Case("GatherElements", [("x", x, False), ("i", idx, draw(st.booleans()))],
                {"axis": axis}, opset=draw(st.sampled_from([11, 13])))


@st.composite
def s_gather_nd(draw):
    b = draw(st.integers(0, 1))
    x = values(draw, shapes(draw, b + 1, 4), draw(st.sampled_from(NUMERIC)))
    k = draw(st.integers(1, x.ndim - b))
    mid = shapes(draw, 0, 2)
    dims = x.shape[b:b + k]
    idx = np.stack([values(draw, x.shape[:b] + mid, np.int64, -d, d - 1) for d in dims], -1)
    attrs = {"batch_dims": b} if b else {}
    return Case("GatherND", [("x", x, False), ("i", idx, draw(st.booleans()))], attrs,
                opset=12 if b else draw(st.sampled_from([11, 12, 13])))


@st.composite
def s_scatter_elements(draw):
    # onnx < 1.17's reference ScatterElements fails (or drops duplicate updates) above rank 3.
    x = values(draw, shapes(draw, 1, 3 if OLD_REFERENCE else 4),
               draw(st.sampled_from([np.float32, np.float64, np.int64])))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    a = axis % x.ndim
    n = x.shape[a]
    # onnx < 1.17's reference ScatterElements has no "mul" (it overwrites instead).
    reduction = draw(st.sampled_from(["none", "add", "max", "min"] if OLD_REFERENCE
                                     else ["none", "add", "mul", "max", "min"]))
    ishape = list(draw(st.integers(1, d)) for d in x.shape)
    if reduction == "none":  # distinct targets: order of duplicate writes is unspecified
        ishape[a] = draw(st.integers(1, n))
        rng = np.random.default_rng(draw(st.integers(0, 2**31)))
        idx = np.stack([rng.permutation(n)[:ishape[a]] for _ in range(
            int(np.prod(ishape)) // ishape[a])], -1).reshape(
            [ishape[a]] + [d for i, d in enumerate(ishape) if i != a])
        idx = np.moveaxis(idx, 0, a)
        idx = np.where(rng.random(idx.shape) < 0.3, idx - n, idx).astype(np.int64)
    else:
        idx = values(draw, tuple(ishape), np.int64, -n, n - 1)
    upd = values(draw, idx.shape, x.dtype)
    if reduction == "none" and draw(st.booleans()):
        op, opset = draw(st.sampled_from([("ScatterElements", 11), ("ScatterElements", 13),
                                          ("Scatter", 9)]))
        return Case(op, [("x", x, False), ("i", idx, True), ("u", upd, False)], {"axis": axis},
                    opset=opset, ref_op="ScatterElements")
    return Case("ScatterElements", [("x", x, False), ("i", idx, draw(st.booleans())),
                                    ("u", upd, False)],
                {"axis": axis, "reduction": reduction}, opset=18)


@st.composite
def s_scatter_nd(draw):
    x = values(draw, shapes(draw, 1, 3), draw(st.sampled_from([np.float32, np.float64,
                                                               np.int64])))
    k = draw(st.integers(1, x.ndim))
    # onnx < 1.17's reference ScatterND max/min index the data with the index row itself.
    reduction = draw(st.sampled_from(["none", "add", "mul"] if OLD_REFERENCE
                                     else ["none", "add", "mul", "max", "min"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    cells = np.array(list(np.ndindex(*x.shape[:k])), np.int64).reshape(-1, k)
    m = draw(st.integers(1, len(cells)))
    if reduction == "none":
        idx = cells[rng.permutation(len(cells))[:m]]
    else:
        idx = cells[rng.integers(0, len(cells), m)]
    idx = np.where(rng.random(idx.shape) < 0.3, idx - np.array(x.shape[:k]), idx)
    if draw(st.booleans()) and m % 2 == 0:
        idx = idx.reshape(2, m // 2, k)
    upd = values(draw, idx.shape[:-1] + x.shape[k:], x.dtype)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    return Case("ScatterND", [("x", x, False), ("i", idx, draw(st.booleans())),
                              ("u", upd, False)], attrs,
                opset=18 if reduction != "none" else draw(st.sampled_from([11, 13, 18])))


@st.composite
def s_expand(draw):
    shape = shapes(draw, 0, 3)
    x = values(draw, tuple(draw(st.sampled_from([1, d])) for d in shape),
               draw(st.sampled_from(ANY)))
    target = [draw(st.sampled_from([1, d])) for d in shape]
    target = list(shapes(draw, 0, 2)) + target
    return Case("Expand", [("x", x, False), ("s", i64(target), True)],
                opset=draw(st.sampled_from([8, 13])))


@st.composite
def s_tile(draw):
    x = values(draw, shapes(draw, 1, 3), draw(st.sampled_from(ANY)))
    reps = [draw(st.integers(0, 3)) for _ in range(x.ndim)]
    return Case("Tile", [("x", x, False), ("r", i64(reps), True)],
                opset=draw(st.sampled_from([6, 13])))


@st.composite
def s_pad(draw):
    x = values(draw, shapes(draw, 1, 3, min_side=2), draw(st.sampled_from(NUMERIC)))
    form = draw(st.sampled_from([2, 11, 18, 19]))
    mode = draw(st.sampled_from(["constant", "reflect", "edge"] + (["wrap"] if form == 19
                                                                    else [])))
    axes = list(range(x.ndim))
    if form >= 18 and draw(st.booleans()):
        axes = draw(st.lists(st.integers(-x.ndim, x.ndim - 1), min_size=1, unique_by=lambda
                             a: a % x.ndim))
    lo_bound = 0  # the reference rejects negative (cropping) pads: see test_pad_1_and_negative_pads
    pads = []
    for side in range(2):
        for a in axes:
            hi = x.shape[a] - 1 if mode in ("reflect", "wrap") else 3
            pads.append(draw(st.integers(lo_bound, hi)))
    value = values(draw, (), x.dtype)
    if form == 2:
        return Case("Pad", [("x", x, False)], {"pads": pads, "mode": mode,
                                               "value": float(value)}, opset=2)
    inputs = [("x", x, False), ("p", i64(pads), True),
              ("c", value if mode == "constant" and draw(st.booleans()) else None,
               draw(st.booleans()))]
    if form >= 18 and len(axes) != x.ndim or (form >= 18 and draw(st.booleans())):
        inputs.append(("a", i64(axes), True))
    elif len(axes) != x.ndim:
        inputs.append(("a", i64(axes), True))
    return Case("Pad", inputs, {"mode": mode}, opset=form)


@st.composite
def s_shape(draw):
    x = values(draw, shapes(draw, 0, 4), np.float32)
    if draw(st.booleans()):
        return Case("Shape", [("x", x, False)], opset=draw(st.sampled_from([1, 13])))
    attrs = {"start": draw(st.integers(-6, 6))}
    if draw(st.booleans()):
        attrs["end"] = draw(st.integers(-6, 6))
    return Case("Shape", [("x", x, False)], attrs, opset=draw(st.sampled_from([15, 19, 21])))


@st.composite
def s_size(draw):
    x = values(draw, shapes(draw, 0, 4, min_side=0), draw(st.sampled_from(ANY)))
    return Case("Size", [("x", x, False)], opset=draw(st.sampled_from([1, 13, 19])))


@st.composite
def s_constant_of_shape(draw):
    shape = i64(shapes(draw, 0, 3, min_side=0))
    attrs = {}
    if draw(st.booleans()):
        v = values(draw, (1,), draw(st.sampled_from(NUMERIC + [np.bool_])))
        attrs["value"] = onnx.numpy_helper.from_array(v, "value")
    return Case("ConstantOfShape", [("s", shape, True)], attrs,
                opset=draw(st.sampled_from([9, 20, 21])))


@st.composite
def s_constant(draw):
    kind = draw(st.sampled_from(["value", "value_float", "value_floats", "value_int",
                                 "value_ints", "value_string", "value_strings"]))
    if kind == "value":
        v = values(draw, shapes(draw, 0, 3), draw(st.sampled_from(ANY)))
        attrs = {"value": onnx.numpy_helper.from_array(v, "v")}
    elif kind == "value_float":
        attrs = {kind: draw(st.floats(-5, 5, width=32))}
    elif kind == "value_floats":
        attrs = {kind: draw(st.lists(st.floats(-5, 5, width=32), min_size=1, max_size=4))}
    elif kind == "value_int":
        attrs = {kind: draw(st.integers(-100, 100))}
    elif kind == "value_ints":
        attrs = {kind: draw(st.lists(st.integers(-100, 100), min_size=1, max_size=4))}
    elif kind == "value_string":
        attrs = {kind: draw(st.text("abc xyz", max_size=5))}
    else:
        attrs = {kind: draw(st.lists(st.text("abc", max_size=3), min_size=1, max_size=3))}
    return Case("Constant", [], attrs, opset=13)


@st.composite
def s_range(draw):
    dtype = draw(st.sampled_from([np.int64, np.int32, np.float32, np.float64]))
    if np.dtype(dtype).kind == "i":
        start, limit = draw(st.integers(-20, 20)), draw(st.integers(-20, 20))
        delta = draw(st.sampled_from([-3, -2, -1, 1, 2, 5]))
    else:
        start, limit = draw(st.floats(-10, 10)), draw(st.floats(-10, 10))
        delta = draw(st.sampled_from([-1.5, -0.5, 0.25, 1.0, 3.0]))
    return Case("Range", [(n, np.asarray(v, dtype), True) for n, v in
                          (("s", start), ("l", limit), ("d", delta))], opset=11)


@st.composite
def s_trilu(draw):
    x = values(draw, shapes(draw, 2, 4, min_side=0, max_side=5), draw(st.sampled_from(ANY)))
    k = draw(st.one_of(st.none(), st.integers(-6, 6)))
    return Case("Trilu", [("x", x, False), ("k", None if k is None else i64(k), True)],
                {"upper": draw(st.sampled_from([0, 1]))}, opset=14)


@st.composite
def s_cumsum(draw):
    x = values(draw, shapes(draw), draw(st.sampled_from([np.float32, np.float64, np.int32,
                                                        np.int64])))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    attrs = {"exclusive": draw(st.sampled_from([0, 1])), "reverse": draw(st.sampled_from([0, 1]))}
    return Case("CumSum", [("x", x, False), ("a", np.asarray(axis, draw(st.sampled_from(
        [np.int32, np.int64]))), True)], attrs, opset=draw(st.sampled_from([11, 14])))


@st.composite
def s_cum_prod(draw):
    x = values(draw, shapes(draw), draw(st.sampled_from([np.float32, np.float64, np.int32,
                                                        np.int64])), -3, 3)
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    attrs = {"exclusive": draw(st.sampled_from([0, 1])), "reverse": draw(st.sampled_from([0, 1]))}
    return Case("CumProd", [("x", x, False), ("a", i64(axis), True)], attrs, opset=26)


@st.composite
def s_tensor_scatter(draw):
    b, max_len = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    axis = draw(st.integers(1, 3))
    shape = [b] + [draw(st.integers(1, 3)) for _ in range(3)]
    shape[axis] = max_len
    dtype = draw(st.sampled_from([np.float32, np.int64]))
    cache = values(draw, tuple(shape), dtype)
    ushape = list(shape)
    ushape[axis] = draw(st.integers(1, max_len))
    upd = values(draw, tuple(ushape), dtype)
    mode = draw(st.sampled_from(["linear", "circular"]))
    hi = max_len - ushape[axis] if mode == "linear" else 2 * max_len
    wi = values(draw, (b,), np.int64, 0, hi) if draw(st.booleans()) else None
    return Case("TensorScatter", [("c", cache, False), ("u", upd, False),
                                  ("w", wi, draw(st.booleans()))],
                {"mode": mode, "axis": axis - 4 if draw(st.booleans()) else axis}, opset=24)


@st.composite
def s_tf_idf_vectorizer(draw):
    strings = draw(st.booleans())
    vocab = ["a", "b", "c", "d"] if strings else [1, 2, 3, 4]
    length = draw(st.integers(3, 7))
    x = np.array([[draw(st.sampled_from(vocab)) for _ in range(length)]
                  for _ in range(draw(st.integers(1, 2)))], dtype=object if strings else
                 np.int64)
    if draw(st.booleans()):
        x = x[0]
    unigrams = draw(st.lists(st.sampled_from(vocab), min_size=1, max_size=3, unique=True))
    bigrams = draw(st.lists(st.tuples(st.sampled_from(vocab), st.sampled_from(vocab)),
                            max_size=3, unique=True))
    pool = unigrams + [v for g in bigrams for v in g]
    n = len(unigrams) + len(bigrams)
    mode = draw(st.sampled_from(["TF", "IDF", "TFIDF"]))
    attrs = {"mode": mode, "min_gram_length": draw(st.integers(1, 2)), "max_gram_length": 2,
             "max_skip_count": draw(st.integers(0, 3)), "ngram_counts": [0, len(unigrams)],
             "ngram_indexes": list(draw(st.permutations(range(n))))}
    attrs["pool_strings" if strings else "pool_int64s"] = pool
    if mode != "TF" or draw(st.booleans()):  # the reference needs weights for IDF/TFIDF
        attrs["weights"] = [float(draw(st.integers(1, 4))) for _ in range(n)]
    return Case("TfIdfVectorizer", [("x", x, True)], attrs, opset=9)


@st.composite
def s_one_hot(draw):
    depth = draw(st.integers(1, 5))
    # onnx < 1.17's reference wraps out-of-range indices (mod depth) instead of all off_value.
    lo, hi = (-depth, depth - 1) if OLD_REFERENCE else (-depth - 1, depth)
    idx = values(draw, shapes(draw, 0, 3), np.int64, lo, hi).astype(
        draw(st.sampled_from([np.int64, np.int32, np.float32])))  # integral float indices
    axis = draw(st.integers(-idx.ndim - 1, idx.ndim))
    vals = values(draw, (2,), draw(st.sampled_from([np.float32, np.int64, np.int32])))
    return Case("OneHot", [("i", idx, draw(st.booleans())),
                           ("d", np.asarray(depth, draw(st.sampled_from([np.int64,
                                                                         np.float32]))), True),
                           ("v", vals, draw(st.booleans()))],
                {"axis": axis}, opset=draw(st.sampled_from([11])))


@st.composite
def s_top_k(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int64, np.int32, np.uint8]))
    x = values(draw, shapes(draw), dtype, -3, 3)  # small range: many ties
    if OLD_REFERENCE:  # onnx < 1.17's reference does not break ties by the lower index
        x = np.argsort(np.argsort(x.reshape(-1), kind="stable")).reshape(x.shape).astype(dtype)
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    k = draw(st.integers(0, x.shape[axis]))
    form = draw(st.sampled_from([1, 10, 11]))
    if form == 1:
        return Case("TopK", [("x", x, False)], {"k": k, "axis": axis}, opset=1, n_out=2)
    attrs = {"axis": axis}
    if form == 11:
        attrs["largest"] = draw(st.sampled_from([0, 1]))
    return Case("TopK", [("x", x, False), ("k", i64([k]), True)], attrs, opset=form, n_out=2)


@st.composite
def s_depth_to_space(draw):
    b = draw(st.integers(1, 3))
    x = values(draw, (draw(st.integers(1, 2)), b * b * draw(st.integers(1, 3)),
                      draw(st.integers(1, 3)), draw(st.integers(1, 3))),
               draw(st.sampled_from(ANY)))
    opset = draw(st.sampled_from([1, 11, 13]))
    attrs = {"blocksize": b}
    if opset >= 11:
        attrs["mode"] = draw(st.sampled_from(["DCR", "CRD"]))
    return Case("DepthToSpace", [("x", x, False)], attrs, opset=opset)


@st.composite
def s_space_to_depth(draw):
    b = draw(st.integers(1, 3))
    x = values(draw, (draw(st.integers(1, 2)), draw(st.integers(1, 3)),
                      b * draw(st.integers(1, 3)), b * draw(st.integers(1, 3))),
               draw(st.sampled_from(ANY)))
    return Case("SpaceToDepth", [("x", x, False)], {"blocksize": b},
                opset=draw(st.sampled_from([1, 13])))


_CTM = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_crop_and_resize"]


@st.composite
def s_resize(draw):
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    dtype = np.float32 if mode != "nearest" else draw(st.sampled_from([np.float32,
                                                                        np.float64,
                                                                        np.uint8, np.int32]))
    x = values(draw, (1, draw(st.integers(1, 2)), draw(st.integers(1, 5)),
                      draw(st.integers(1, 5))), dtype)
    ctm = draw(st.sampled_from(_CTM))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(["round_prefer_floor", "round_prefer_ceil",
                                                      "floor", "ceil"]))
    elif draw(st.booleans()):
        attrs["antialias"] = 1
    if mode == "cubic":
        attrs["cubic_coeff_a"] = draw(st.sampled_from([-0.5, -0.75]))
        attrs["exclude_outside"] = draw(st.sampled_from([0, 1]))
    axes = [2, 3] if draw(st.booleans()) else None
    if axes is not None:
        attrs["axes"] = axes if draw(st.booleans()) else [3, 2]
        axes = attrs["axes"]
    n = 4 if axes is None else 2
    roi = None
    if ctm == "tf_crop_and_resize":
        lo = [draw(st.sampled_from([0.0, 0.2, -0.3])) for _ in range(n)]
        hi = [draw(st.sampled_from([1.0, 0.7, 1.2])) for _ in range(n)]
        roi = np.array(lo + hi, np.float32)
        attrs["extrapolation_value"] = draw(st.sampled_from([0.0, 7.5]))
    if draw(st.booleans()):
        sc = [draw(st.sampled_from([0.5, 0.6, 1.0, 1.5, 2.0, 2.5])) for _ in range(n)]
        if axes is None:
            sc[0] = sc[1] = 1.0
        inputs = [("x", x, False), ("r", roi, True), ("s", np.array(sc, np.float32), True)]
    else:
        dims = [x.shape[a] for a in (axes or range(4))]
        sz = [draw(st.integers(1, 8)) for _ in range(n)]
        if axes is None:
            sz[0], sz[1] = dims[0], dims[1]
            if ctm != "tf_crop_and_resize" and draw(st.booleans()):
                attrs["keep_aspect_ratio_policy"] = draw(st.sampled_from(["not_larger",
                                                                          "not_smaller"]))
                attrs["axes"] = [2, 3]
                sz = sz[2:]
                if roi is not None:
                    roi = np.concatenate([roi[2:4], roi[6:8]])
        inputs = [("x", x, False), ("r", roi, True), ("s", None, True),
                  ("z", i64(sz), True)]
    return Case("Resize", inputs, attrs, opset=19)


@st.composite
def s_upsample(draw):
    x = values(draw, (1, 2, draw(st.integers(1, 4)), draw(st.integers(1, 4))),
               draw(st.sampled_from([np.float32, np.int64])))
    sc = np.array([1, 1, draw(st.integers(1, 3)), draw(st.integers(1, 3))], np.float32)
    return Case("Upsample", [("x", x, False), ("s", sc, True)], {"mode": "nearest"}, opset=9)


@st.composite
def s_non_zero(draw):
    x = values(draw, shapes(draw, 1, 3, min_side=0), draw(st.sampled_from(ANY)))
    return Case("NonZero", [("x", x, True)], opset=draw(st.sampled_from([9, 13])))


@st.composite
def s_unique(draw):
    x = values(draw, shapes(draw, 1, 3), draw(st.sampled_from([np.float32, np.int64])), -2, 2)
    attrs = {"sorted": draw(st.sampled_from([0, 1]))}
    if attrs["sorted"] == 0:  # the reference's unsorted path only works for 1-D, no axis
        x = x.reshape(-1)
    elif draw(st.booleans()):
        attrs["axis"] = draw(st.integers(-x.ndim, x.ndim - 1))
    if OLD_REFERENCE and "axis" not in attrs:
        # onnx < 1.17's reference (under numpy 2) gives inverse_indices x's shape, not 1-D.
        x = x.reshape(-1)
    return Case("Unique", [("x", x, True)], attrs, opset=11, n_out=4)


@st.composite
def s_compress(draw):
    x = values(draw, shapes(draw), draw(st.sampled_from(NUMERIC)))
    attrs = {}
    n = x.size
    if draw(st.booleans()):
        attrs["axis"] = draw(st.integers(-x.ndim, x.ndim - 1))
        n = x.shape[attrs["axis"]]
    cond = values(draw, (draw(st.integers(0, n)),), np.bool_)
    return Case("Compress", [("x", x, False), ("c", cond, True)], attrs,
                opset=draw(st.sampled_from([9, 11])))


@st.composite
def s_reverse_sequence(draw):
    t, b = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    time_axis = draw(st.sampled_from([0, 1]))
    shape = [t, b] if time_axis == 0 else [b, t]
    x = values(draw, tuple(shape) + shapes(draw, 0, 2), draw(st.sampled_from(NUMERIC)))
    lens = values(draw, (b,), np.int64, 1, t)
    return Case("ReverseSequence", [("x", x, False), ("l", lens, draw(st.booleans()))],
                {"time_axis": time_axis, "batch_axis": 1 - time_axis}, opset=10)


@st.composite
def s_eye_like(draw):
    x = values(draw, shapes(draw, 2, 2, max_side=5), draw(st.sampled_from(NUMERIC)))
    attrs = {"k": draw(st.integers(-5, 5))}
    if draw(st.booleans()):
        attrs["dtype"] = draw(st.sampled_from([onnx.TensorProto.FLOAT, onnx.TensorProto.INT64,
                                               onnx.TensorProto.DOUBLE]))
    return Case("EyeLike", [("x", x, False)], attrs, opset=draw(st.sampled_from([9, 22])))


@st.composite
def s_center_crop_pad(draw):
    x = values(draw, shapes(draw, 1, 3, max_side=6), draw(st.sampled_from(NUMERIC)))
    attrs = {}
    axes = list(range(x.ndim))
    if draw(st.booleans()):
        axes = draw(st.lists(st.integers(-x.ndim, x.ndim - 1), min_size=1,
                             unique_by=lambda a: a % x.ndim))
        attrs["axes"] = axes
    target = [draw(st.integers(1, 8)) for _ in axes]
    return Case("CenterCropPad", [("x", x, False), ("s", i64(target), True)], attrs, opset=18)


WORDS = st.sampled_from(["monday", "Monday", "tuesday", "", "café", "a b", "x  y", "Straße"])


@st.composite
def s_string_normalizer(draw):
    # No empty strings: the reference drops them, ONNX Runtime (and jaxort) keep them.
    x = np.array(draw(st.lists(WORDS.filter(bool), min_size=1, max_size=4)), dtype=object)
    if draw(st.booleans()):
        x = x.reshape(1, -1)
    attrs = {"case_change_action": draw(st.sampled_from(["NONE", "LOWER", "UPPER"])),
             "is_case_sensitive": draw(st.sampled_from([0, 1]))}
    if draw(st.booleans()):
        attrs["stopwords"] = ["monday"]
    if attrs["case_change_action"] == "NONE" and not attrs["is_case_sensitive"]:
        attrs.pop("stopwords", None)  # the reference compares case-sensitively here
    return Case("StringNormalizer", [("x", x, False)], attrs, opset=10)


@st.composite
def s_string_concat(draw):
    a = np.array(draw(st.lists(WORDS, min_size=1, max_size=3)), dtype=object)
    b = np.array(draw(st.lists(WORDS, min_size=1, max_size=1)), dtype=object)
    if draw(st.booleans()):
        a, b = b, a
    return Case("StringConcat", [("a", a, False), ("b", b, False)], opset=20)


@st.composite
def s_string_split(draw):
    x = np.array(draw(st.lists(st.sampled_from(["a b c", "a,b,,c", "", " x  y ", "abc"]),
                               min_size=1, max_size=3)), dtype=object)
    attrs = {}
    if draw(st.booleans()):
        attrs["delimiter"] = draw(st.sampled_from([",", " ", "b"]))
    if draw(st.booleans()):
        attrs["maxsplit"] = draw(st.integers(0, 2))
    return Case("StringSplit", [("x", x, False)], attrs, opset=20, n_out=2)


@st.composite
def s_regex_full_match(draw):
    x = np.array(draw(st.lists(st.sampled_from(["abc", "a1", "x@y.com", "", "ABC"]),
                               min_size=1, max_size=4)), dtype=object)
    pattern = draw(st.sampled_from([r"[a-z]+", r"\w+@\w+\.com", r"a\d?", r".*"]))
    return Case("RegexFullMatch", [("x", x, False)], {"pattern": pattern}, opset=20)


# One entry per op: (strategy, (rtol, atol)).
TABLE = {
    "Identity": (s_identity, EXACT),
    "Reshape": (s_reshape, EXACT),
    "Flatten": (s_flatten, EXACT),
    "Transpose": (s_transpose, EXACT),
    "Squeeze": (s_squeeze, EXACT),
    "Unsqueeze": (s_unsqueeze, EXACT),
    "Concat": (s_concat, EXACT),
    "Split": (s_split, EXACT),
    "Slice": (s_slice, EXACT),
    "Gather": (s_gather, EXACT),
    "GatherElements": (s_gather_elements, EXACT),
    "GatherND": (s_gather_nd, EXACT),
    "ScatterElements": (s_scatter_elements, F32),
    "ScatterND": (s_scatter_nd, F32),
    "Expand": (s_expand, EXACT),
    "Tile": (s_tile, EXACT),
    "Pad": (s_pad, EXACT),
    "Shape": (s_shape, EXACT),
    "Size": (s_size, EXACT),
    "ConstantOfShape": (s_constant_of_shape, EXACT),
    "Constant": (s_constant, EXACT),
    "Range": (s_range, (1e-6, 1e-6)),
    "Trilu": (s_trilu, EXACT),
    "CumSum": (s_cumsum, F32),
    "CumProd": (s_cum_prod, F32),
    "TensorScatter": (s_tensor_scatter, EXACT),
    "TfIdfVectorizer": (s_tf_idf_vectorizer, EXACT),
    "OneHot": (s_one_hot, F32),  # the reference computes off + hot * (on - off)
    "TopK": (s_top_k, EXACT),
    "DepthToSpace": (s_depth_to_space, EXACT),
    "SpaceToDepth": (s_space_to_depth, EXACT),
    "Resize": (s_resize, (1e-4, 1e-4)),
    "Upsample": (s_upsample, EXACT),
    "NonZero": (s_non_zero, EXACT),
    "Unique": (s_unique, EXACT),
    "Compress": (s_compress, EXACT),
    "ReverseSequence": (s_reverse_sequence, EXACT),
    "EyeLike": (s_eye_like, EXACT),
    "CenterCropPad": (s_center_crop_pad, EXACT),
    "StringNormalizer": (s_string_normalizer, EXACT),
    "StringConcat": (s_string_concat, EXACT),
    "StringSplit": (s_string_split, EXACT),
    "RegexFullMatch": (s_regex_full_match, EXACT),
}


# Ops whose drawn forms need a newer opset than onnx 1.16 (opset 21) knows.
MIN_OPSET = {"CumProd": 26, "TensorScatter": 24}


def _regex_reference_runs() -> bool:
    """onnx < 1.17's reference RegexFullMatch imports re2; 1.17+ uses Python's re."""
    case = Case("RegexFullMatch", [("x", np.array(["a"], object), False)], {"pattern": "a"},
                opset=20)
    try:
        run_ref(case)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("op", sorted(TABLE))
def test_matches_reference(op):
    require_opset(op, MIN_OPSET.get(op, 1))
    if op == "RegexFullMatch" and not _regex_reference_runs():
        pytest.skip(f"onnx {onnx.__version__}'s reference RegexFullMatch needs the re2 "
                    "package, which is not installed")
    strategy, tol = TABLE[op]

    @settings(max_examples=8, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(strategy())
    def prop(case):
        check(case, tol)

    prop()


def test_table_covers_every_op():
    assert set(TABLE) | {"Scatter"} == COVERED_OPS  # Scatter is drawn by ScatterElements


# --------------------------------------------------------------------------- examples


def test_slice_sentinels_and_negative_steps():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    for starts, ends, steps in [([INT64_MAX], [INT64_MIN], [-1]), ([-1], [INT64_MIN], [-2]),
                                ([0], [INT64_MAX], [1]), ([INT64_MIN], [INT64_MAX], [3])]:
        case = Case("Slice", [("x", x, False), ("s", i64(starts), True),
                              ("e", i64(ends), True), ("a", i64([1]), True),
                              ("t", i64(steps), True)], opset=13)
        check(case)


def test_slice_start_below_minus_dim_clamps_to_zero_for_negative_steps():
    """ONNX clamps start + dim to [0, dim - 1]; numpy's x[-9::-1] would be empty."""
    x = np.arange(4, dtype=np.int64)
    (y,) = run_jax(Case("Slice", [("x", x, False), ("s", i64([-9]), True),
                                  ("e", i64([INT64_MIN]), True), ("a", i64([0]), True),
                                  ("t", i64([-1]), True)], opset=13))
    assert y.tolist() == [0]


def test_slice_1_attribute_form_and_gather_elements_negative_axis():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (y,) = run_jax(Case("Slice", [("x", x, False)],
                        {"starts": [1, -3], "ends": [1000, -1], "axes": [2, 1]}, opset=1))
    np.testing.assert_array_equal(y, x[:, -3:-1, 1:])
    idx = np.array([[[0, -1, 1, 2], [2, 2, 0, -3]]] * 2, np.int64)
    (y,) = run_jax(Case("GatherElements", [("x", x, False), ("i", idx, False)], {"axis": -2},
                        opset=13))
    np.testing.assert_array_equal(y, np.take_along_axis(x, idx % 3, axis=1))


def test_unique_unsorted_with_axis_and_reshape_1():
    x = np.array([[3, 1], [0, 2], [3, 1], [0, 2], [5, 5]], np.int64)
    y, first, inverse, counts = run_jax(Case("Unique", [("x", x, True)],
                                             {"sorted": 0, "axis": 0}, opset=11, n_out=4))
    assert y.tolist() == [[3, 1], [0, 2], [5, 5]]
    assert first.tolist() == [0, 1, 4] and inverse.tolist() == [0, 1, 0, 1, 2]
    assert counts.tolist() == [2, 2, 1]
    (y,) = run_jax(Case("Reshape", [("x", x, False)], {"shape": [0, -1, 1]}, opset=1))
    assert y.shape == (5, 2, 1)


def test_string_normalizer_keeps_empty_strings_and_drops_stopwords():
    x = np.array(["Monday", "", "monday", "Café"], dtype=object)
    (y,) = run_jax(Case("StringNormalizer", [("x", x, False)],
                        {"case_change_action": "UPPER", "is_case_sensitive": 0,
                         "stopwords": ["MONDAY"]}, opset=10))
    assert y.tolist() == ["", "CAFE"]
    (y,) = run_jax(Case("StringNormalizer", [("x", x[:1].reshape(1, 1), False)],
                        {"case_change_action": "NONE", "is_case_sensitive": 1,
                         "stopwords": ["Monday"]}, opset=10))
    assert y.tolist() == [[""]]


def test_resize_11_tf_half_pixel_for_nn():
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    (y,) = run_jax(Case("Resize", [("x", x, False), ("r", np.array([], np.float32), True),
                                   ("s", np.array([1, 1, 1, 2], np.float32), True)],
                        {"mode": "nearest", "coordinate_transformation_mode":
                         "tf_half_pixel_for_nn"}, opset=11))
    assert y[0, 0, 0].tolist() == [0, 1, 1, 2, 2, 3, 3, 3]


def test_resize_modes_exhaustive():
    x = np.random.default_rng(0).standard_normal((1, 1, 4, 5)).astype(np.float32)
    for mode in ["nearest", "linear", "cubic"]:
        for ctm in _CTM[:-1]:
            for sc in ([1, 1, 0.6, 1.7], [1, 1, 2.0, 0.5]):
                attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
                case = Case("Resize", [("x", x, False), ("r", None, True),
                                       ("s", np.array(sc, np.float32), True)], attrs, opset=19)
                check(case, (1e-5, 1e-5))


def test_resize_antialias_downsample():
    x = np.random.default_rng(1).standard_normal((1, 1, 9, 7)).astype(np.float32)
    for mode in ["linear", "cubic"]:
        case = Case("Resize", [("x", x, False), ("r", None, True),
                               ("s", np.array([1, 1, 0.4, 0.6], np.float32), True)],
                    {"mode": mode, "antialias": 1}, opset=18)
        check(case, (1e-5, 1e-5))


def test_resize_11_and_13_forms():
    if OLD_REFERENCE:
        pytest.skip(f"onnx {onnx.__version__}'s reference Resize indexes the empty roi that "
                    "opset 11/13 use for 'no roi' (IndexError); fixed in onnx 1.17")
    x = np.random.default_rng(2).standard_normal((1, 1, 3, 4)).astype(np.float32)
    sizes = i64([1, 1, 5, 2])
    for opset in (11, 13):
        case = Case("Resize", [("x", x, False), ("r", np.array([], np.float32), True),
                               ("s", np.array([], np.float32), True), ("z", sizes, True)],
                    {"mode": "linear"}, opset=opset)
        check(case, (1e-5, 1e-5))


def test_resize_10_and_upsample_legacy_nearest():
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)
    # Upsampling floors the source coordinate; downsampling takes its ceiling.
    up = Case("Resize", [("x", x, False), ("s", np.array([1, 1, 2, 1.5], np.float32), True)],
              {"mode": "nearest"}, opset=10)
    (y,) = run_jax(up)
    assert y.shape == (1, 1, 4, 6)
    np.testing.assert_array_equal(y[0, 0, :, :], x[0, 0][[0, 0, 1, 1]][:, [0, 0, 1, 2, 2, 3]])
    down = Case("Resize", [("x", x, False), ("s", np.array([1, 1, 1, 0.6], np.float32), True)],
                {"mode": "nearest"}, opset=10)
    np.testing.assert_array_equal(run_jax(down)[0], x[..., [0, 2]])
    lin = Case("Upsample", [("x", x, False)], {"mode": "linear", "scales": [1.0, 1.0, 1.0, 2.0]},
               opset=7)
    np.testing.assert_allclose(run_jax(lin)[0][0, 0, 0],
                               [0, 0.5, 1, 1.5, 2, 2.5, 3, 3], rtol=1e-6)


def test_split_uneven_num_outputs():
    x = np.arange(7, dtype=np.int64)
    outs = run_jax(Case("Split", [("x", x, False)], {"num_outputs": 3}, opset=18, n_out=3))
    assert [o.tolist() for o in outs] == [[0, 1, 2], [3, 4, 5], [6]]


def test_split_1_input_and_attribute_forms():
    x = np.arange(6, dtype=np.float32)
    outs = run_jax(Case("Split", [("x", x, False), ("s", i64([2, 4]), True)], opset=1, n_out=2))
    assert [o.tolist() for o in outs] == [[0, 1], [2, 3, 4, 5]]
    outs = run_jax(Case("Split", [("x", x, False)], {"split": [5, 1]}, opset=1, n_out=2))
    assert [o.tolist() for o in outs] == [[0, 1, 2, 3, 4], [5]]


def test_pad_1_and_negative_pads():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (y,) = run_jax(Case("Pad", [("x", x, False)],
                        {"paddings": [1, 0, 0, 2], "value": 9.0}, opset=1))
    np.testing.assert_array_equal(y, np.pad(x, ((1, 0), (0, 2)), constant_values=9))
    (y,) = run_jax(Case("Pad", [("x", x, False), ("p", i64([-1, 1, 0, -2]), True)], opset=11))
    np.testing.assert_array_equal(y, np.pad(x[1:, :2], ((0, 0), (1, 0))))


def test_tile_1_and_top_k_smallest_unsigned_ties():
    x = np.array([[1, 2], [3, 4]], np.float32)
    (y,) = run_jax(Case("Tile", [("x", x, False), ("t", i64(3), True), ("a", i64(1), True)],
                        opset=1))
    np.testing.assert_array_equal(y, np.tile(x, (1, 3)))
    u = np.array([3, 0, 255, 0, 7], np.uint64)
    vals, idx = run_jax(Case("TopK", [("x", u, False), ("k", i64([3]), True)],
                             {"largest": 0}, opset=11, n_out=2))
    assert vals.tolist() == [0, 0, 3] and idx.tolist() == [1, 3, 0]
    assert vals.dtype == np.uint64 and idx.dtype == np.int64


def test_resize_integer_and_bfloat16_linear_saturate():
    x = np.array([[[[0, 255], [255, 0]]]], np.uint8)
    case = Case("Resize", [("x", x, False), ("r", None, True),
                           ("s", np.array([1, 1, 1.5, 1.5], np.float32), True)],
                {"mode": "cubic"}, opset=19)
    if not OLD_REFERENCE:  # onnx < 1.17's reference wraps integer results, no saturation
        check(case)
    (y,) = run_jax(Case("Resize", [("x", x.astype(jnp.bfloat16), False), ("r", None, True),
                                   ("s", np.array([1, 1, 2, 2], np.float32), True)],
                        {"mode": "linear"}, opset=19))
    assert y.dtype == jnp.bfloat16 and y.shape == (1, 1, 4, 4)


def test_shape_arithmetic_folds_to_int64_without_x64():
    """PyTorch-style Shape->Gather->Unsqueeze->Concat->Reshape stays numpy int64."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "zero1"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Shape", ["flat"], ["fs"]),
        helper.make_node("ConstantOfShape", ["fs"], ["ones"],
                         value=onnx.numpy_helper.from_array(np.array([1], np.int64))),
        helper.make_node("Slice", ["fs", "i1", "imax"], ["n1"]),
        helper.make_node("Squeeze", ["n1", "zero1"], ["n"]),
        helper.make_node("Range", ["zero_s", "n", "one_s"], ["r"]),
        helper.make_node("Expand", ["r", "fs"], ["re"]),
        helper.make_node("Cast", ["re"], ["ref"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Add", ["flat", "ref"], ["y"]),
    ]
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in [
        ("zero", i64(0)), ("zero1", i64([0])), ("minus1", i64([-1])), ("zero_s", i64(0)),
        ("one_s", i64(1)), ("i1", i64([1])), ("imax", i64([INT64_MAX]))]]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 12]),
         helper.make_tensor_value_info("ones", onnx.TensorProto.INT64, [2, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    try:
        g = JaxGraph(model)
    except UnsupportedOpError as e:  # Cast/Add belong to other families
        pytest.skip(f"needs ops outside this family: {e}")
    x = np.ones((2, 3, 4), np.float32)
    with jax.numpy_dtype_promotion("strict"):
        y, ones = jax.jit(g.apply)({}, x)
    assert y.shape == (2, 12) and y.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(y), np.broadcast_to(
        1 + np.arange(12, dtype=np.float32), (2, 12)))
    assert ones.shape == (2, 12)


def test_folded_values_keep_int64_and_strings():
    """Data-movement ops on static inputs fold with numpy: int64 and strings survive."""
    big = np.array([2**40, -(2**40), 7], np.int64)
    case = Case("Concat", [("a", big, True), ("b", big[::-1].copy(), True)], {"axis": 0},
                opset=13)
    (y,) = run_jax(case)
    assert y.dtype == np.int64 and y.tolist() == big.tolist() + big[::-1].tolist()
    s = np.array(["a", "b", "c"], dtype=object)
    (y,) = run_jax(Case("Gather", [("s", s, True), ("i", i64([-1, 0]), True)], opset=13),
                   jit=False)
    assert y.tolist() == ["c", "a"]


def test_data_dependent_shapes_need_static_inputs():
    x = np.array([0.0, 1.0, 2.0], np.float32)
    for op, inputs in [("NonZero", [("x", x, False)]), ("Unique", [("x", x, False)]),
                       ("Compress", [("x", x, False), ("c", np.array([1, 0, 1], bool), False)]),
                       ("Range", [("s", x[0], False), ("l", x[2], False), ("d", x[1], False)])]:
        with pytest.raises(StaticValueError, match=op):
            run_jax(Case(op, inputs, opset=13))


def test_errors_name_the_node():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError, match="Reshape.*cannot reshape"):
        run_jax(Case("Reshape", [("x", x, False), ("s", i64([4, 2]), True)], opset=13))
    with pytest.raises(OpError, match="Gather.*out of range"):
        run_jax(Case("Gather", [("x", x, False), ("i", i64([3]), True)], opset=13))


# --------------------------------------------------------------------------- gradients


def _grad_case(name):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float64)
    x4 = rng.standard_normal((1, 2, 3, 4)).astype(np.float64)
    if name == "Gather":
        return Case(name, [("x", x, False), ("i", i64([[2, -1], [0, 0]]), True)], {"axis": 1},
                    opset=13), 0
    if name == "GatherElements":
        return Case(name, [("x", x, False), ("i", i64([[0, -1, 2, 1], [2, 2, 0, 1]]), True)],
                    {"axis": 0}, opset=13), 0
    if name == "ScatterElements":
        return Case(name, [("x", x, False), ("i", i64([[1, -1], [0, 0]]), True),
                           ("u", rng.standard_normal((2, 2)), False)],
                    {"axis": 1, "reduction": "add"}, opset=18), 2
    if name == "Slice":
        return Case(name, [("x", x, False), ("s", i64([-1, 0]), True),
                           ("e", i64([INT64_MIN, 4]), True), ("a", i64([0, 1]), True),
                           ("t", i64([-2, 2]), True)], opset=13), 0
    if name == "Pad":
        return Case(name, [("x", x, False), ("p", i64([1, 2, 2, 1]), True)],
                    {"mode": "reflect"}, opset=18), 0
    if name == "Transpose":
        return Case(name, [("x", x4, False)], {"perm": [3, 1, 0, 2]}, opset=13), 0
    if name == "Concat":
        return Case(name, [("x", x, False), ("y", x[:1] * 2, True)], {"axis": 0}, opset=13), 0
    if name == "Resize":
        return Case(name, [("x", x4, False), ("r", None, True),
                           ("s", np.array([1, 1, 1.7, 0.6], np.float32), True)],
                    {"mode": "linear", "antialias": 1}, opset=19), 0
    if name == "Expand":
        return Case(name, [("x", x[:, :1], False), ("s", i64([2, 3, 4]), True)], opset=13), 0
    if name == "Tile":
        return Case(name, [("x", x, False), ("r", i64([2, 3]), True)], opset=13), 0
    if name == "CumProd":
        return Case(name, [("x", x, False), ("a", i64(-1), True)],
                    {"exclusive": 1, "reverse": 0}, opset=26), 0
    if name == "CumSum":
        return Case(name, [("x", x, False), ("a", i64(1), True)],
                    {"exclusive": 1, "reverse": 1}, opset=14), 0
    raise KeyError(name)


@pytest.mark.parametrize("op", ["Gather", "GatherElements", "ScatterElements", "Slice", "Pad",
                                "Transpose", "Concat", "Resize", "Expand", "Tile", "CumSum",
                                "CumProd"])
def test_gradient_finite_differences(op):
    case, wrt = _grad_case(op)
    model = case.model()
    feeds = case.feeds()
    with x64_enabled_scope():
        g = JaxGraph(model, params=[], check=False)
        names = g.input_names
        args = [jnp.asarray(feeds[n]) for n in names]
        k = names.index(case.inputs[wrt][0])

        def f(v):
            a = list(args)
            a[k] = v
            return g.apply({}, *a)[0]

        check_grads(f, (args[k],), order=1, modes=["rev"], eps=1e-3, atol=1e-6, rtol=1e-6)
