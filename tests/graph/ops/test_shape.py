"""Shape-family ops (ops/shape.py) against ONNX's reference evaluator.
"""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest
from hypothesis import strategies as st
from onnx import helper

from jaxort.errors import OpError, UnsupportedOpError
from jaxort.graph import JaxGraph

from ._harness import (
    INT64_MAX, OpCase, node, run_jax, table_tests, tensor_grad_inputs, tensor_gradient_test
)
from ._strategies import DATA_ANY, draw_shape, i64, values

COVERED_OPS = {
    "Expand", "Flatten", "Reshape", "Shape", "Size", "Squeeze",
    "Unsqueeze",
}


@st.composite
def s_reshape(draw):
    shape = draw_shape(draw)
    x = values(draw, shape, draw(st.sampled_from(DATA_ANY)))
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
    return node("Reshape", [("x", x, False), ("s", i64(target), True)], attrs, opset=opset)


@st.composite
def s_flatten(draw):
    x = values(draw, draw_shape(draw), draw(st.sampled_from(DATA_ANY)))
    axis = draw(st.integers(-x.ndim, x.ndim))
    return node("Flatten", [("x", x, False)], {"axis": axis}, opset=13)


@st.composite
def s_squeeze(draw):
    shape = tuple(draw(st.sampled_from([1, 1, 2, 3])) for _ in range(draw(st.integers(1, 5))))
    x = values(draw, shape, draw(st.sampled_from(DATA_ANY)))
    ones = [i for i, d in enumerate(shape) if d == 1]
    axes = None
    if ones and draw(st.booleans()):
        axes = draw(st.lists(st.sampled_from(ones), min_size=1, unique=True))
        axes = [a - x.ndim if draw(st.booleans()) else a for a in axes]
    opset = draw(st.sampled_from([1, 11, 13, 21]))
    if opset < 13:
        if axes:  # the reference squeezes one axis at a time
            axes = sorted(a % x.ndim for a in axes)
        return node("Squeeze", [("x", x, False)], {"axes": axes} if axes else {}, opset=opset)
    return node("Squeeze", [("x", x, False), ("a", None if axes is None else i64(axes), True)],
                opset=opset)


@st.composite
def s_unsqueeze(draw):
    x = values(draw, draw_shape(draw, 0, 3), draw(st.sampled_from(DATA_ANY)))
    k = draw(st.integers(1, 3))
    rank = x.ndim + k
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=k, max_size=k, unique=True))
    axes = [a - rank if draw(st.booleans()) else a for a in axes]
    opset = draw(st.sampled_from([1, 11, 13]))
    if opset < 13:
        axes = sorted(a % rank for a in axes)  # the reference inserts them one by one
        return node("Unsqueeze", [("x", x, False)], {"axes": axes}, opset=opset)
    return node("Unsqueeze", [("x", x, False), ("a", i64(axes), True)], opset=opset)


@st.composite
def s_expand(draw):
    shape = draw_shape(draw, 0, 3)
    x = values(draw, tuple(draw(st.sampled_from([1, d])) for d in shape),
               draw(st.sampled_from(DATA_ANY)))
    target = [draw(st.sampled_from([1, d])) for d in shape]
    target = list(draw_shape(draw, 0, 2)) + target
    return node("Expand", [("x", x, False), ("s", i64(target), True)],
                opset=draw(st.sampled_from([8, 13])))


@st.composite
def s_shape(draw):
    x = values(draw, draw_shape(draw, 0, 4), np.float32)
    if draw(st.booleans()):
        return node("Shape", [("x", x, False)], opset=draw(st.sampled_from([1, 13])))
    attrs = {"start": draw(st.integers(-6, 6))}
    if draw(st.booleans()):
        attrs["end"] = draw(st.integers(-6, 6))
    return node("Shape", [("x", x, False)], attrs, opset=draw(st.sampled_from([15, 19, 21])))


def _np_shape(ex):
    """Shape-15+ by the spec: start and end counted from the back when negative, then clamped
    to [0, rank]. ONNX's reference evaluator (1.23) does not clamp: end -4 of a rank-3 input
    gives it two dimensions where the spec gives none."""
    (x,) = ex.inputs
    rank = x.ndim

    def bound(value):
        return min(max(value + rank if value < 0 else value, 0), rank)

    start, end = bound(ex.attributes.get("start", 0)), bound(ex.attributes.get("end", rank))
    return [np.array(x.shape[start:end], np.int64)]


@st.composite
def s_size(draw):
    x = values(draw, draw_shape(draw, 0, 4, min_side=0), draw(st.sampled_from(DATA_ANY)))
    return node("Size", [("x", x, False)], opset=draw(st.sampled_from([1, 13, 19])))


CASES = [
    OpCase("Expand", s_expand(), max_examples=8),
    OpCase("Flatten", s_flatten(), max_examples=8),
    OpCase("Reshape", s_reshape(), max_examples=8),
    OpCase("Shape", s_shape(), max_examples=8, reference=_np_shape),
    OpCase("Size", s_size(), max_examples=8),
    OpCase("Squeeze", s_squeeze(), max_examples=8),
    OpCase("Unsqueeze", s_unsqueeze(), max_examples=8),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- gradients


def _grad_case(name):
    rng, x, x4 = tensor_grad_inputs()
    if name == "Expand":
        return node(name, [("x", x[:, :1], False), ("s", i64([2, 3, 4]), True)], opset=13), (0,)
    raise KeyError(name)

test_gradient_finite_differences = tensor_gradient_test(_grad_case, ['Expand'])


# --------------------------------------------------------------------------- examples


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


def test_reshape_1_attribute_form():
    x = np.array([[3, 1], [0, 2], [3, 1], [0, 2], [5, 5]], np.int64)
    (y,) = run_jax(node("Reshape", [("x", x, False)], {"shape": [0, -1, 1]}, opset=1))
    assert y.shape == (5, 2, 1)


def test_reshape_errors_name_the_node():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError, match="Reshape.*cannot reshape"):
        run_jax(node("Reshape", [("x", x, False), ("s", i64([4, 2]), True)], opset=13))
