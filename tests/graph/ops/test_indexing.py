"""Indexing ops (ops/indexing.py: Gather*, CumSum, CumProd, OneHot, TopK) against ONNX's reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.errors import OpError

from ._harness import (
    OLD_REFERENCE, OpCase, node, run_jax, table_tests, tensor_grad_inputs, tensor_gradient_test
)
from ._strategies import DATA_ANY, DATA_NUMERIC, draw_shape, i64, values

COVERED_OPS = {
    "CumProd", "CumSum", "Gather", "GatherElements", "GatherND", "OneHot",
    "TopK",
}


@st.composite
def s_gather(draw):
    x = values(draw, draw_shape(draw), draw(st.sampled_from(DATA_ANY)))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    n = x.shape[axis]
    idx = values(draw, draw_shape(draw, 0, 2), draw(st.sampled_from([np.int64, np.int32])), -n,
                 n - 1)
    return node("Gather", [("x", x, False), ("i", idx, draw(st.booleans()))], {"axis": axis},
                opset=draw(st.sampled_from([1, 11, 13])))


@st.composite
def s_gather_elements(draw):
    x = values(draw, draw_shape(draw), draw(st.sampled_from(DATA_ANY)))
    axis = draw(st.integers(0, x.ndim - 1))  # the reference mishandles negative axes
    n = x.shape[axis]
    ishape = tuple(d if i != axis % x.ndim else draw(st.integers(1, 4))
                   for i, d in enumerate(x.shape))
    idx = values(draw, ishape, draw(st.sampled_from([np.int64, np.int32])), -n, n - 1)
    return node("GatherElements", [("x", x, False), ("i", idx, draw(st.booleans()))],
                {"axis": axis}, opset=draw(st.sampled_from([11, 13])))


@st.composite
def s_gather_nd(draw):
    b = draw(st.integers(0, 1))
    x = values(draw, draw_shape(draw, b + 1, 4), draw(st.sampled_from(DATA_NUMERIC)))
    k = draw(st.integers(1, x.ndim - b))
    mid = draw_shape(draw, 0, 2)
    dims = x.shape[b:b + k]
    idx = np.stack([values(draw, x.shape[:b] + mid, np.int64, -d, d - 1) for d in dims], -1)
    attrs = {"batch_dims": b} if b else {}
    return node("GatherND", [("x", x, False), ("i", idx, draw(st.booleans()))], attrs,
                opset=12 if b else draw(st.sampled_from([11, 12, 13])))


@st.composite
def s_cumsum(draw):
    # onnx < 1.17's reference returns int64 sums of int32 values.
    x = values(draw, draw_shape(draw), draw(st.sampled_from(
        [np.float32, np.float64] + ([] if OLD_REFERENCE else [np.int32]) + [np.int64])))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    attrs = {"exclusive": draw(st.sampled_from([0, 1])), "reverse": draw(st.sampled_from([0, 1]))}
    return node("CumSum", [("x", x, False), ("a", np.asarray(axis, draw(st.sampled_from(
        [np.int32, np.int64]))), True)], attrs, opset=draw(st.sampled_from([11, 14])))


@st.composite
def s_cum_prod(draw):
    x = values(draw, draw_shape(draw), draw(st.sampled_from([np.float32, np.float64, np.int32,
                                                        np.int64])), -3, 3)
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    attrs = {"exclusive": draw(st.sampled_from([0, 1])), "reverse": draw(st.sampled_from([0, 1]))}
    return node("CumProd", [("x", x, False), ("a", i64(axis), True)], attrs, opset=26)


@st.composite
def s_one_hot(draw):
    depth = draw(st.integers(1, 5))
    # onnx < 1.17's reference wraps out-of-range indices (mod depth) instead of all off_value.
    lo, hi = (-depth, depth - 1) if OLD_REFERENCE else (-depth - 1, depth)
    idx = values(draw, draw_shape(draw, 0, 3), np.int64, lo, hi).astype(
        draw(st.sampled_from([np.int64, np.int32, np.float32])))  # integral float indices
    axis = draw(st.integers(-idx.ndim - 1, idx.ndim))
    vals = values(draw, (2,), draw(st.sampled_from([np.float32, np.int64, np.int32])))
    return node("OneHot", [("i", idx, draw(st.booleans())),
                           ("d", np.asarray(depth, draw(st.sampled_from([np.int64,
                                                                         np.float32]))), True),
                           ("v", vals, draw(st.booleans()))],
                {"axis": axis}, opset=draw(st.sampled_from([11])))


@st.composite
def s_top_k(draw):
    # onnx < 1.17's reference gives wrong uint8 values here.
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int64, np.int32]
                                 + ([] if OLD_REFERENCE else [np.uint8])))
    x = values(draw, draw_shape(draw), dtype, -3, 3)  # small range: many ties
    if OLD_REFERENCE:  # onnx < 1.17's reference does not break ties by the lower index
        x = np.argsort(np.argsort(x.reshape(-1), kind="stable")).reshape(x.shape).astype(dtype)
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    k = draw(st.integers(0, x.shape[axis]))
    form = draw(st.sampled_from([1, 10, 11]))
    if form == 1:
        return node("TopK", [("x", x, False)], {"k": k, "axis": axis}, opset=1, n_out=2)
    attrs = {"axis": axis}
    if form == 11:
        attrs["largest"] = draw(st.sampled_from([0, 1]))
    return node("TopK", [("x", x, False), ("k", i64([k]), True)], attrs, opset=form, n_out=2)


CASES = [
    OpCase("CumProd", s_cum_prod(), scale=1, min_opset=26, max_examples=8),
    OpCase("CumSum", s_cumsum(), scale=1, max_examples=8),
    OpCase("Gather", s_gather(), max_examples=8),
    OpCase("GatherElements", s_gather_elements(), max_examples=8),
    OpCase("GatherND", s_gather_nd(), max_examples=8),
    OpCase("OneHot", s_one_hot(), scale=1, max_examples=8),  # the reference computes off + hot * (on - off)
    OpCase("TopK", s_top_k(), max_examples=8),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- gradients


def _grad_case(name):
    rng, x, x4 = tensor_grad_inputs()
    if name == "Gather":
        return node(name, [("x", x, False), ("i", i64([[2, -1], [0, 0]]), True)], {"axis": 1},
                    opset=13), (0,)
    if name == "GatherElements":
        return node(name, [("x", x, False), ("i", i64([[0, -1, 2, 1], [2, 2, 0, 1]]), True)],
                    {"axis": 0}, opset=13), (0,)
    if name == "CumSum":
        return node(name, [("x", x, False), ("a", i64(1), True)],
                    {"exclusive": 1, "reverse": 1}, opset=14), (0,)
    if name == "CumProd":
        return node(name, [("x", x, False), ("a", i64(-1), True)],
                    {"exclusive": 1, "reverse": 0}, opset=26), (0,)
    raise KeyError(name)

test_gradient_finite_differences = tensor_gradient_test(_grad_case, ['Gather', 'GatherElements', 'CumSum', 'CumProd'])


# --------------------------------------------------------------------------- examples


def test_gather_elements_negative_axis():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    idx = np.array([[[0, -1, 1, 2], [2, 2, 0, -3]]] * 2, np.int64)
    (y,) = run_jax(node("GatherElements", [("x", x, False), ("i", idx, False)], {"axis": -2},
                        opset=13))
    np.testing.assert_array_equal(y, np.take_along_axis(x, idx % 3, axis=1))


def test_top_k_smallest_unsigned_ties():
    u = np.array([3, 0, 255, 0, 7], np.uint64)
    vals, idx = run_jax(node("TopK", [("x", u, False), ("k", i64([3]), True)],
                             {"largest": 0}, opset=11, n_out=2))
    assert vals.tolist() == [0, 0, 3] and idx.tolist() == [1, 3, 0]
    assert vals.dtype == np.uint64 and idx.dtype == np.int64


def test_folded_gather_keeps_strings():
    s = np.array(["a", "b", "c"], dtype=object)
    (y,) = run_jax(node("Gather", [("s", s, True), ("i", i64([-1, 0]), True)], opset=13),
                   jit=False)
    assert y.tolist() == ["c", "a"]


def test_gather_errors_name_the_node():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError, match="Gather.*out of range"):
        run_jax(node("Gather", [("x", x, False), ("i", i64([3]), True)], opset=13))
