"""Layout ops (ops/layout.py: Concat, Split, Slice, Pad, Tile, Transpose, ...) against
ONNX's reference evaluator.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ._harness import (
    INT64_MAX, INT64_MIN, OpCase, check, node, run_jax, table_tests, tensor_grad_inputs,
    tensor_gradient_test
)
from ._strategies import DATA_ANY, DATA_NUMERIC, draw_shape, i64, values

COVERED_OPS = {
    "CenterCropPad", "Concat", "DepthToSpace", "Pad", "ReverseSequence", "Slice",
    "SpaceToDepth", "Split", "Tile", "Transpose", "Trilu",
}


@st.composite
def s_transpose(draw):
    x = values(draw, draw_shape(draw, 1, 5, max_side=3), draw(st.sampled_from(DATA_ANY)))
    attrs = {}
    if draw(st.booleans()):
        attrs["perm"] = list(draw(st.permutations(range(x.ndim))))
    return node("Transpose", [("x", x, False)], attrs, opset=draw(st.sampled_from([1, 13, 21])))


@st.composite
def s_concat(draw):
    shape = list(draw_shape(draw))
    dtype = draw(st.sampled_from(DATA_ANY))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    xs = []
    for i in range(draw(st.integers(1, 4))):
        s = list(shape)
        s[axis] = draw(st.integers(0, 3))
        xs.append((f"x{i}", values(draw, tuple(s), dtype), draw(st.booleans())))
    if all(st_ for _, _, st_ in xs):
        xs[0] = (xs[0][0], xs[0][1], False)
    return node("Concat", xs, {"axis": axis}, opset=draw(st.sampled_from([11, 13])))


@st.composite
def s_split(draw):
    shape = list(draw_shape(draw, max_side=6))
    x = values(draw, tuple(shape), draw(st.sampled_from(DATA_NUMERIC)))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    dim = shape[axis]
    form = draw(st.sampled_from(["attr", "input", "num", "equal"]))
    if form == "num":
        n = draw(st.integers(1, max(1, dim)))
        n_out = n
        return node("Split", [("x", x, False)], {"axis": axis, "num_outputs": n},
                    opset=18, n_out=n_out)
    if form == "equal":
        divisors = [d for d in range(1, dim + 1) if dim % d == 0]
        n = draw(st.sampled_from(divisors))
        return node("Split", [("x", x, False)], {"axis": axis},
                    opset=draw(st.sampled_from([2, 11, 13])), n_out=n)
    cuts = sorted(draw(st.lists(st.integers(0, dim), max_size=3)))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [dim])]
    if form == "attr":
        return node("Split", [("x", x, False)], {"axis": axis, "split": sizes},
                    opset=draw(st.sampled_from([2, 11])), n_out=len(sizes))
    return node("Split", [("x", x, False), ("s", i64(sizes), True)], {"axis": axis},
                opset=draw(st.sampled_from([13, 18])), n_out=len(sizes))


@st.composite
def s_slice(draw):
    x = values(draw, draw_shape(draw, 1, 4, max_side=6), draw(st.sampled_from(DATA_ANY)))
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
        return node("Slice", [("x", x, False)],
                    {"starts": starts, "ends": ends, "axes": axes}, opset=1)
    neg_axes = [a - x.ndim if draw(st.booleans()) else a for a in axes]
    return node("Slice", [("x", x, False), ("s", i64(starts), True), ("e", i64(ends), True),
                          ("a", i64(neg_axes), True), ("t", i64(steps), True)],
                opset=draw(st.sampled_from([10, 11, 13])))


@st.composite
def s_tile(draw):
    x = values(draw, draw_shape(draw, 1, 3), draw(st.sampled_from(DATA_ANY)))
    reps = [draw(st.integers(0, 3)) for _ in range(x.ndim)]
    return node("Tile", [("x", x, False), ("r", i64(reps), True)],
                opset=draw(st.sampled_from([6, 13])))


@st.composite
def s_pad(draw):
    x = values(draw, draw_shape(draw, 1, 3, min_side=2), draw(st.sampled_from(DATA_NUMERIC)))
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
        return node("Pad", [("x", x, False)], {"pads": pads, "mode": mode,
                                               "value": float(value)}, opset=2)
    inputs = [("x", x, False), ("p", i64(pads), True),
              ("c", value if mode == "constant" and draw(st.booleans()) else None,
               draw(st.booleans()))]
    if form >= 18 and len(axes) != x.ndim or (form >= 18 and draw(st.booleans())):
        inputs.append(("a", i64(axes), True))
    elif len(axes) != x.ndim:
        inputs.append(("a", i64(axes), True))
    return node("Pad", inputs, {"mode": mode}, opset=form)


@st.composite
def s_trilu(draw):
    x = values(draw, draw_shape(draw, 2, 4, min_side=0, max_side=5), draw(st.sampled_from(DATA_ANY)))
    k = draw(st.one_of(st.none(), st.integers(-6, 6)))
    return node("Trilu", [("x", x, False), ("k", None if k is None else i64(k), True)],
                {"upper": draw(st.sampled_from([0, 1]))}, opset=14)


@st.composite
def s_depth_to_space(draw):
    b = draw(st.integers(1, 3))
    x = values(draw, (draw(st.integers(1, 2)), b * b * draw(st.integers(1, 3)),
                      draw(st.integers(1, 3)), draw(st.integers(1, 3))),
               draw(st.sampled_from(DATA_ANY)))
    opset = draw(st.sampled_from([1, 11, 13]))
    attrs = {"blocksize": b}
    if opset >= 11:
        attrs["mode"] = draw(st.sampled_from(["DCR", "CRD"]))
    return node("DepthToSpace", [("x", x, False)], attrs, opset=opset)


@st.composite
def s_space_to_depth(draw):
    b = draw(st.integers(1, 3))
    x = values(draw, (draw(st.integers(1, 2)), draw(st.integers(1, 3)),
                      b * draw(st.integers(1, 3)), b * draw(st.integers(1, 3))),
               draw(st.sampled_from(DATA_ANY)))
    return node("SpaceToDepth", [("x", x, False)], {"blocksize": b},
                opset=draw(st.sampled_from([1, 13])))


@st.composite
def s_reverse_sequence(draw):
    t, b = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    time_axis = draw(st.sampled_from([0, 1]))
    shape = [t, b] if time_axis == 0 else [b, t]
    x = values(draw, tuple(shape) + draw_shape(draw, 0, 2), draw(st.sampled_from(DATA_NUMERIC)))
    lens = values(draw, (b,), np.int64, 1, t)
    return node("ReverseSequence", [("x", x, False), ("l", lens, draw(st.booleans()))],
                {"time_axis": time_axis, "batch_axis": 1 - time_axis}, opset=10)


@st.composite
def s_center_crop_pad(draw):
    x = values(draw, draw_shape(draw, 1, 3, max_side=6), draw(st.sampled_from(DATA_NUMERIC)))
    attrs = {}
    axes = list(range(x.ndim))
    if draw(st.booleans()):
        axes = draw(st.lists(st.integers(-x.ndim, x.ndim - 1), min_size=1,
                             unique_by=lambda a: a % x.ndim))
        attrs["axes"] = axes
    target = [draw(st.integers(1, 8)) for _ in axes]
    return node("CenterCropPad", [("x", x, False), ("s", i64(target), True)], attrs, opset=18)


CASES = [
    OpCase("CenterCropPad", s_center_crop_pad(), max_examples=8),
    OpCase("Concat", s_concat(), max_examples=8),
    OpCase("DepthToSpace", s_depth_to_space(), max_examples=8),
    OpCase("Pad", s_pad(), max_examples=8),
    OpCase("ReverseSequence", s_reverse_sequence(), max_examples=8),
    OpCase("Slice", s_slice(), max_examples=8),
    OpCase("SpaceToDepth", s_space_to_depth(), max_examples=8),
    OpCase("Split", s_split(), max_examples=8),
    OpCase("Tile", s_tile(), max_examples=8),
    OpCase("Transpose", s_transpose(), max_examples=8),
    OpCase("Trilu", s_trilu(), max_examples=8),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- gradients


def _grad_case(name):
    rng, x, x4 = tensor_grad_inputs()
    if name == "Slice":
        return node(name, [("x", x, False), ("s", i64([-1, 0]), True),
                           ("e", i64([INT64_MIN, 4]), True), ("a", i64([0, 1]), True),
                           ("t", i64([-2, 2]), True)], opset=13), (0,)
    if name == "Pad":
        return node(name, [("x", x, False), ("p", i64([1, 2, 2, 1]), True)],
                    {"mode": "reflect"}, opset=18), (0,)
    if name == "Transpose":
        return node(name, [("x", x4, False)], {"perm": [3, 1, 0, 2]}, opset=13), (0,)
    if name == "Concat":
        return node(name, [("x", x, False), ("y", x[:1] * 2, True)], {"axis": 0}, opset=13), (0,)
    if name == "Tile":
        return node(name, [("x", x, False), ("r", i64([2, 3]), True)], opset=13), (0,)
    raise KeyError(name)

test_gradient_finite_differences = tensor_gradient_test(_grad_case, ['Slice', 'Pad', 'Transpose', 'Concat', 'Tile'])


# --------------------------------------------------------------------------- examples


def test_slice_sentinels_and_negative_steps():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    for starts, ends, steps in [([INT64_MAX], [INT64_MIN], [-1]), ([-1], [INT64_MIN], [-2]),
                                ([0], [INT64_MAX], [1]), ([INT64_MIN], [INT64_MAX], [3])]:
        case = node("Slice", [("x", x, False), ("s", i64(starts), True),
                              ("e", i64(ends), True), ("a", i64([1]), True),
                              ("t", i64(steps), True)], opset=13)
        check(case)


def test_slice_start_below_minus_dim_clamps_to_zero_for_negative_steps():
    """ONNX clamps start + dim to [0, dim - 1]; numpy's x[-9::-1] would be empty."""
    x = np.arange(4, dtype=np.int64)
    (y,) = run_jax(node("Slice", [("x", x, False), ("s", i64([-9]), True),
                                  ("e", i64([INT64_MIN]), True), ("a", i64([0]), True),
                                  ("t", i64([-1]), True)], opset=13))
    assert y.tolist() == [0]


def test_split_uneven_num_outputs():
    x = np.arange(7, dtype=np.int64)
    outs = run_jax(node("Split", [("x", x, False)], {"num_outputs": 3}, opset=18, n_out=3))
    assert [o.tolist() for o in outs] == [[0, 1, 2], [3, 4, 5], [6]]


def test_split_1_input_and_attribute_forms():
    x = np.arange(6, dtype=np.float32)
    outs = run_jax(node("Split", [("x", x, False), ("s", i64([2, 4]), True)], opset=1, n_out=2))
    assert [o.tolist() for o in outs] == [[0, 1], [2, 3, 4, 5]]
    outs = run_jax(node("Split", [("x", x, False)], {"split": [5, 1]}, opset=1, n_out=2))
    assert [o.tolist() for o in outs] == [[0, 1, 2, 3, 4], [5]]


def test_pad_1_and_negative_pads():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (y,) = run_jax(node("Pad", [("x", x, False)],
                        {"paddings": [1, 0, 0, 2], "value": 9.0}, opset=1))
    np.testing.assert_array_equal(y, np.pad(x, ((1, 0), (0, 2)), constant_values=9))
    (y,) = run_jax(node("Pad", [("x", x, False), ("p", i64([-1, 1, 0, -2]), True)], opset=11))
    np.testing.assert_array_equal(y, np.pad(x[1:, :2], ((0, 0), (1, 0))))


def test_slice_1_attribute_form():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (y,) = run_jax(node("Slice", [("x", x, False)],
                        {"starts": [1, -3], "ends": [1000, -1], "axes": [2, 1]}, opset=1))
    np.testing.assert_array_equal(y, x[:, -3:-1, 1:])


def test_tile_1():
    x = np.array([[1, 2], [3, 4]], np.float32)
    (y,) = run_jax(node("Tile", [("x", x, False), ("t", i64(3), True), ("a", i64(1), True)],
                        opset=1))
    np.testing.assert_array_equal(y, np.tile(x, (1, 3)))


def test_folded_concat_keeps_int64():
    """Data-movement ops on static inputs fold with numpy: int64 survives."""
    big = np.array([2**40, -(2**40), 7], np.int64)
    case = node("Concat", [("a", big, True), ("b", big[::-1].copy(), True)], {"axis": 0},
                opset=13)
    (y,) = run_jax(case)
    assert y.dtype == np.int64 and y.tolist() == big.tolist() + big[::-1].tolist()
