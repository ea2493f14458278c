"""Ops with data-dependent output shapes (ops/dynamic.py: NonZero, Unique, Compress)
against ONNX's reference evaluator.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.errors import StaticValueError

from ._harness import OLD_REFERENCE, OpCase, node, run_jax, table_tests
from ._strategies import DATA_ANY, DATA_NUMERIC, draw_shape, values

COVERED_OPS = {
    "Compress", "NonZero", "Unique",
}


@st.composite
def s_non_zero(draw):
    x = values(draw, draw_shape(draw, 1, 3, min_side=0), draw(st.sampled_from(DATA_ANY)))
    return node("NonZero", [("x", x, True)], opset=draw(st.sampled_from([9, 13])))


@st.composite
def s_unique(draw):
    x = values(draw, draw_shape(draw, 1, 3), draw(st.sampled_from([np.float32, np.int64])), -2, 2)
    attrs = {"sorted": draw(st.sampled_from([0, 1]))}
    if attrs["sorted"] == 0:  # the reference's unsorted path only works for 1-D, no axis
        x = x.reshape(-1)
    elif draw(st.booleans()):
        attrs["axis"] = draw(st.integers(-x.ndim, x.ndim - 1))
    if OLD_REFERENCE and "axis" not in attrs:
        # onnx < 1.17's reference (under numpy 2) gives inverse_indices x's shape, not 1-D.
        x = x.reshape(-1)
    return node("Unique", [("x", x, True)], attrs, opset=11, n_out=4)


@st.composite
def s_compress(draw):
    x = values(draw, draw_shape(draw), draw(st.sampled_from(DATA_NUMERIC)))
    attrs = {}
    n = x.size
    if draw(st.booleans()):
        attrs["axis"] = draw(st.integers(-x.ndim, x.ndim - 1))
        n = x.shape[attrs["axis"]]
    cond = values(draw, (draw(st.integers(0, n)),), np.bool_)
    return node("Compress", [("x", x, False), ("c", cond, True)], attrs,
                opset=draw(st.sampled_from([9, 11])))


CASES = [
    OpCase("Compress", s_compress(), max_examples=8),
    OpCase("NonZero", s_non_zero(), max_examples=8),
    OpCase("Unique", s_unique(), max_examples=8),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- examples


def test_unique_unsorted_with_axis():
    x = np.array([[3, 1], [0, 2], [3, 1], [0, 2], [5, 5]], np.int64)
    y, first, inverse, counts = run_jax(node("Unique", [("x", x, True)],
                                             {"sorted": 0, "axis": 0}, opset=11, n_out=4))
    assert y.tolist() == [[3, 1], [0, 2], [5, 5]]
    assert first.tolist() == [0, 1, 4] and inverse.tolist() == [0, 1, 0, 1, 2]
    assert counts.tolist() == [2, 2, 1]


def test_data_dependent_shapes_need_static_inputs():
    x = np.array([0.0, 1.0, 2.0], np.float32)
    for op, inputs in [("NonZero", [("x", x, False)]), ("Unique", [("x", x, False)]),
                       ("Compress", [("x", x, False), ("c", np.array([1, 0, 1], bool), False)])]:
        with pytest.raises(StaticValueError, match=op):
            run_jax(node(op, inputs, opset=13))
