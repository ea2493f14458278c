"""Constants and generators (ops/constant.py: Constant, ConstantOfShape, EyeLike, Identity,
Range) against ONNX's reference evaluator.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import strategies as st

from jaxort.errors import StaticValueError

from ._harness import OpCase, node, run_jax, table_tests
from ._strategies import DATA_ANY, DATA_NUMERIC, draw_shape, i64, values

COVERED_OPS = {
    "Constant", "ConstantOfShape", "EyeLike", "Identity", "Range",
}


@st.composite
def s_identity(draw):
    x = values(draw, draw_shape(draw, 0), draw(st.sampled_from(DATA_ANY)))
    return node("Identity", [("x", x, False)], opset=draw(st.sampled_from([1, 13, 16, 21])))


@st.composite
def s_constant_of_shape(draw):
    shape = i64(draw_shape(draw, 0, 3, min_side=0))
    attrs = {}
    if draw(st.booleans()):
        v = values(draw, (1,), draw(st.sampled_from(DATA_NUMERIC + [np.bool_])))
        attrs["value"] = onnx.numpy_helper.from_array(v, "value")
    return node("ConstantOfShape", [("s", shape, True)], attrs,
                opset=draw(st.sampled_from([9, 20, 21])))


@st.composite
def s_constant(draw):
    kind = draw(st.sampled_from(["value", "value_float", "value_floats", "value_int",
                                 "value_ints", "value_string", "value_strings"]))
    if kind == "value":
        v = values(draw, draw_shape(draw, 0, 3), draw(st.sampled_from(DATA_ANY)))
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
    return node("Constant", [], attrs, opset=13)


@st.composite
def s_range(draw):
    dtype = draw(st.sampled_from([np.int64, np.int32, np.float32, np.float64]))
    if np.dtype(dtype).kind == "i":
        start, limit = draw(st.integers(-20, 20)), draw(st.integers(-20, 20))
        delta = draw(st.sampled_from([-3, -2, -1, 1, 2, 5]))
    else:
        start, limit = draw(st.floats(-10, 10)), draw(st.floats(-10, 10))
        delta = draw(st.sampled_from([-1.5, -0.5, 0.25, 1.0, 3.0]))
    return node("Range", [(n, np.asarray(v, dtype), True) for n, v in
                          (("s", start), ("l", limit), ("d", delta))], opset=11)


@st.composite
def s_eye_like(draw):
    x = values(draw, draw_shape(draw, 2, 2, max_side=5), draw(st.sampled_from(DATA_NUMERIC)))
    attrs = {"k": draw(st.integers(-5, 5))}
    if draw(st.booleans()):
        attrs["dtype"] = draw(st.sampled_from([onnx.TensorProto.FLOAT, onnx.TensorProto.INT64,
                                               onnx.TensorProto.DOUBLE]))
    return node("EyeLike", [("x", x, False)], attrs, opset=draw(st.sampled_from([9, 22])))


CASES = [
    OpCase("Constant", s_constant(), max_examples=8),
    OpCase("ConstantOfShape", s_constant_of_shape(), max_examples=8),
    OpCase("EyeLike", s_eye_like(), max_examples=8),
    OpCase("Identity", s_identity(), max_examples=8),
    OpCase("Range", s_range(), scale=0.1, max_examples=8),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- examples


def test_range_of_traced_values_needs_static_inputs():
    x = np.array([0.0, 1.0, 2.0], np.float32)
    with pytest.raises(StaticValueError, match="Range"):
        run_jax(node("Range", [("s", x[0], False), ("l", x[2], False), ("d", x[1], False)],
                     opset=13))
