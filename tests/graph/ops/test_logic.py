"""Comparisons, logical and bitwise ops and Where (ops/logic.py) against ONNX's reference.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.errors import OpError

from ._harness import BOOL, Example, F64, elementwise_gradient_test, folded_case, run1, table_tests
from ._strategies import FLOATS, INTS, arrays, binary, shapes, unary, uniform

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

COVERED_OPS = {
    "And", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor",
    "Equal", "Greater", "GreaterOrEqual", "IsInf", "IsNaN", "Less",
    "LessOrEqual", "Not", "Or", "Where", "Xor",
}


@st.composite
def compare_strategy(draw, with_bool=False):
    dtypes = FLOATS + INTS + ((BOOL,) if with_bool else ())
    dt = draw(st.sampled_from(dtypes))
    (sa, sb), _ = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
    # Few distinct values, so equality happens.
    a = draw(arrays(dt, sa, -2, 2)).round() if dt.kind == "f" else draw(arrays(dt, sa, -2, 2))
    b = draw(arrays(dt, sb, -2, 2)).round() if dt.kind == "f" else draw(arrays(dt, sb, -2, 2))
    return Example((a.astype(dt), b.astype(dt)), {})


@st.composite
def string_equal_strategy(draw):
    (sa, sb), _ = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3))
    words = st.sampled_from(["a", "b", "jax", ""])
    a = np.array(draw(hnp.arrays(object, sa, elements=words)), dtype=object)
    b = np.array(draw(hnp.arrays(object, sb, elements=words)), dtype=object)
    return Example((a, b), {})


@st.composite
def bitshift_strategy(draw):
    dt = draw(st.sampled_from(INTS))
    bits = dt.itemsize * 8
    (sa, sb), _ = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
    x = draw(arrays(dt, sa, -1000, 1000))
    y = draw(arrays(dt, sb, -2 if dt.kind == "i" else 0, bits + 2))
    return Example((x, y), {"direction": draw(st.sampled_from(("LEFT", "RIGHT")))})


@st.composite
def special_floats(draw, attrs=st.just({})):
    dt = draw(st.sampled_from(FLOATS))
    x = draw(hnp.arrays(F64, draw(shapes), elements=st.sampled_from(
        [0.0, -1.5, 2.0, np.nan, np.inf, -np.inf, 1e300])))
    return Example((x.astype(dt),), draw(attrs))


@st.composite
def where_strategy(draw):
    dt = draw(st.sampled_from(FLOATS + INTS + (BOOL,)))
    shp, _ = draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4))
    return Example((draw(arrays(BOOL, shp[0])), draw(arrays(dt, shp[1])),
                    draw(arrays(dt, shp[2]))), {})

CASES = [
    folded_case("Equal", compare_strategy(with_bool=True)),
    folded_case("Equal", string_equal_strategy(), id="Equal-string", static_only=True),
    folded_case("Less", compare_strategy()),
    folded_case("Greater", compare_strategy()),
    folded_case("LessOrEqual", compare_strategy()),
    folded_case("GreaterOrEqual", compare_strategy()),
    folded_case("Not", unary((BOOL,))),
    folded_case("And", binary((BOOL,))),
    folded_case("Or", binary((BOOL,))),
    folded_case("Xor", binary((BOOL,))),
    folded_case("BitwiseAnd", binary(INTS, -1000, 1000)),
    folded_case("BitwiseOr", binary(INTS, -1000, 1000)),
    folded_case("BitwiseXor", binary(INTS, -1000, 1000)),
    folded_case("BitwiseNot", unary(INTS, -1000, 1000)),
    folded_case("BitShift", bitshift_strategy()),
    folded_case("IsNaN", special_floats()),
    folded_case("IsInf", special_floats(st.fixed_dictionaries(
        {"detect_negative": st.sampled_from((0, 1)), "detect_positive": st.sampled_from((0, 1))}))),
    folded_case("Where", where_strategy()),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS, equal_nan=True)


# --------------------------------------------------------------------------- gradients

# op, attrs, inputs (float64), opset
GRAD_CASES = [
    ("Where", {}, lambda: (np.array([True, False, True]), uniform((3,)), uniform((2, 3), seed=1))),
]

test_gradient_matches_finite_differences = elementwise_gradient_test(GRAD_CASES)


def test_comparisons_return_bool_on_empty_inputs():
    a = np.zeros((0, 3), np.float32)
    b = np.zeros((3,), np.float32)
    for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        out = run1(op, (a, b))
        assert out.dtype == np.bool_ and out.shape == (0, 3)


def test_bad_bitshift_direction_raises_op_error():
    with pytest.raises(OpError, match="direction"):
        run1("BitShift", (np.ones(3, np.uint8), np.ones(3, np.uint8)), {"direction": "UP"})
