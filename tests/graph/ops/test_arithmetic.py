"""Arithmetic ops (ops/arithmetic.py) against ONNX's reference evaluator.
Differentiable ops also get a finite-difference gradient check in float64.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.graph import JaxGraph, x64_enabled_scope
from jaxort.testing import NodeCase

from ._harness import (
    Example, F16, F32, F64, elementwise_gradient_test, folded_case, run1, table_tests
)
from ._strategies import (
    FLOATS, INTS, NUMERIC, REF_F32, SINTS, arrays, binary, shapes, unary, uniform, variadic
)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

COVERED_OPS = {
    "Abs", "Acos", "Acosh", "Add", "Asin", "Asinh",
    "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Det",
    "Div", "Erf", "Exp", "Floor", "Log", "Max",
    "Mean", "Min", "Mod", "Mul", "Neg", "Pow",
    "Reciprocal", "Round", "Sign", "Sin", "Sinh", "Sqrt",
    "Sub", "Sum", "Tan",
}


@st.composite
def pow_strategy(draw):
    base = draw(st.sampled_from((F32, F64, F16, np.dtype(np.int32), np.dtype(np.int64))))
    exp = draw(st.sampled_from((F32, F64, np.dtype(np.int32), np.dtype(np.int64))))
    (sa, sb), _ = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
    if base.kind == "f":
        x = draw(arrays(base, sa, 0.1, 4.0))
        y = draw(arrays(exp, sb, -3, 3)) if exp.kind == "f" else draw(arrays(exp, sb, 0, 4))
    else:
        x = draw(arrays(base, sa, -6, 6))
        # Integral-valued exponents: a fractional power of an int truncates, where
        # float rounding could legitimately land on either side.
        y = draw(arrays(np.dtype(np.int64), sb, 0, 4)).astype(exp)
    return Example((x, y), {})


@st.composite
def mod_strategy(draw):
    dt = draw(st.sampled_from(FLOATS[:3] + INTS))
    fmod = 1 if dt.kind == "f" else draw(st.sampled_from((0, 1)))
    (sa, sb), _ = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
    a = draw(arrays(dt, sa, -20, 20))
    b = draw(arrays(dt, sb, -7, 7, avoid=0, gap=0.5))
    if dt.kind in "iu":
        b = np.where(b == 0, np.array(3, dt), b)
    return Example((a, b), {"fmod": fmod})


@st.composite
def det_strategy(draw):
    dt = draw(st.sampled_from((F32, F64)))
    n = draw(st.integers(1, 4))
    batch = draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=3))
    x = draw(arrays(dt, batch + (n, n), -1, 1))
    return Example((x,), {})


@st.composite
def round_strategy(draw):
    dt = draw(st.sampled_from(FLOATS))
    q = draw(hnp.arrays(np.int64, draw(shapes), elements=st.integers(-40, 40)))
    return Example(((q / 4).astype(dt),), {})

CASES = [
    folded_case("Add", binary(NUMERIC, -20, 20)),
    folded_case("Sub", binary(NUMERIC, -20, 20)),
    folded_case("Mul", binary(NUMERIC, -10, 10)),
    folded_case("Div", binary(NUMERIC, -20, 20, -5, 5, avoid2=0)),
    folded_case("Pow", pow_strategy(), scale=4),
    folded_case("Mod", mod_strategy()),
    folded_case("Neg", unary(FLOATS + SINTS, -50, 50)),
    folded_case("Abs", unary(NUMERIC, -50, 50)),
    folded_case("Sign", unary(NUMERIC, -3, 3)),
    folded_case("Reciprocal", unary(FLOATS, avoid=0)),
    folded_case("Floor", unary(FLOATS)),
    folded_case("Ceil", unary(FLOATS)),
    folded_case("Round", round_strategy()),
    folded_case("Exp", unary(FLOATS, -5, 5), scale=2),
    folded_case("Log", unary(FLOATS, 0.01, 10), scale=2),
    folded_case("Sqrt", unary(FLOATS, 0, 10)),
    folded_case("Erf", unary(FLOATS, -3, 3), scale=2, tolerances={F64: REF_F32}),
    folded_case("Sin", unary(FLOATS), scale=2),
    folded_case("Cos", unary(FLOATS), scale=2),
    folded_case("Tan", unary(FLOATS, -1.3, 1.3), scale=4),
    folded_case("Asin", unary(FLOATS, -0.99, 0.99), scale=2),
    folded_case("Acos", unary(FLOATS, -0.99, 0.99), scale=2),
    folded_case("Atan", unary(FLOATS), scale=2),
    folded_case("Sinh", unary(FLOATS, -3, 3), scale=2),
    folded_case("Cosh", unary(FLOATS, -3, 3), scale=2),
    folded_case("Asinh", unary(FLOATS), scale=2),
    folded_case("Acosh", unary(FLOATS, 1.01, 6), scale=2),
    folded_case("Atanh", unary(FLOATS, -0.95, 0.95), scale=2),
    folded_case("Det", det_strategy(), scale=50),
    folded_case("Min", variadic(NUMERIC)),
    folded_case("Max", variadic(NUMERIC)),
    folded_case("Sum", variadic(NUMERIC, -20, 20), scale=2),
    folded_case("Mean", variadic(FLOATS, first_is_full=True), scale=2),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS, equal_nan=True)


# --------------------------------------------------------------------------- gradients

# op, attrs, inputs (float64), opset
GRAD_CASES = [
    ("Add", {}, lambda: (uniform((2, 3)), uniform((3,), seed=1))),
    ("Sub", {}, lambda: (uniform((2, 3)), uniform((3,), seed=1))),
    ("Mul", {}, lambda: (uniform((2, 3)), uniform((3,), seed=1))),
    ("Div", {}, lambda: (uniform((2, 3)), uniform((3,), 0.5, 2, seed=1))),
    ("Pow", {}, lambda: (uniform((2, 3), 0.5, 2), uniform((3,), -2, 2, seed=1))),
    ("Neg", {}, lambda: (uniform((4,)),)),
    ("Abs", {}, lambda: (uniform((4,), kinks=(0,)),)),
    ("Reciprocal", {}, lambda: (uniform((4,), 0.5, 2),)),
    ("Exp", {}, lambda: (uniform((4,)),)),
    ("Log", {}, lambda: (uniform((4,), 0.5, 3),)),
    ("Sqrt", {}, lambda: (uniform((4,), 0.5, 3),)),
    ("Erf", {}, lambda: (uniform((4,)),)),
    ("Sin", {}, lambda: (uniform((4,)),)),
    ("Cos", {}, lambda: (uniform((4,)),)),
    ("Tan", {}, lambda: (uniform((4,), -1, 1),)),
    ("Asin", {}, lambda: (uniform((4,), -0.8, 0.8),)),
    ("Acos", {}, lambda: (uniform((4,), -0.8, 0.8),)),
    ("Atan", {}, lambda: (uniform((4,)),)),
    ("Sinh", {}, lambda: (uniform((4,)),)),
    ("Cosh", {}, lambda: (uniform((4,)),)),
    ("Asinh", {}, lambda: (uniform((4,)),)),
    ("Acosh", {}, lambda: (uniform((4,), 1.2, 3),)),
    ("Atanh", {}, lambda: (uniform((4,), -0.8, 0.8),)),
    ("Det", {}, lambda: (uniform((2, 3, 3)) + 3 * np.eye(3),)),
    ("Min", {}, lambda: (uniform((3,)), uniform((2, 3), seed=1) + 0.3)),
    ("Max", {}, lambda: (uniform((3,)), uniform((2, 3), seed=1) + 0.3)),
    ("Sum", {}, lambda: (uniform((3,)), uniform((2, 3), seed=1), uniform((1, 3), seed=2))),
    ("Mean", {}, lambda: (uniform((3,)), uniform((2, 3), seed=1))),
]

test_gradient_matches_finite_differences = elementwise_gradient_test(GRAD_CASES)


# --------------------------------------------------------------------------- specific semantics


def test_integer_div_truncates_toward_zero():
    a = np.array([-7, 7, -7, 7], np.int32)
    b = np.array([2, 2, -2, -2], np.int32)
    np.testing.assert_array_equal(run1("Div", (a, b)), [-3, 3, 3, -3])


def test_round_halves_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.3, -4.5], np.float32)
    np.testing.assert_array_equal(run1("Round", (x,)), [0, 2, 2, -0, -2, -2, 2, -4])


def test_mod_sign_rules():
    a = np.array([-4, 7, 5, -5], np.int64)
    b = np.array([3, -3, 2, -2], np.int64)
    np.testing.assert_array_equal(run1("Mod", (a, b), {"fmod": 0}), np.mod(a, b))
    np.testing.assert_array_equal(run1("Mod", (a, b), {"fmod": 1}), np.fmod(a, b))


def test_pow_integer_base_float_exponent_keeps_base_dtype():
    out = run1("Pow", (np.array([1, 2, 3], np.int32), np.array([4.0, 5.0, 6.0], np.float32)))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [1, 32, 729])


def test_legacy_broadcast_add_6():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = np.array([10, 20, 30], np.float32)
    out = run1("Add", (a, b), {"broadcast": 1, "axis": 1}, opset=6)
    np.testing.assert_array_equal(out, a + b[None, :, None])


def test_folded_and_traced_agree_on_integer_shape_math():
    # Static int64 arithmetic (what exporters do with shapes) folds to numpy.
    g = JaxGraph(NodeCase("Mul", (np.array([2, 3], np.int64), np.array([4], np.int64)), {}).model(),
                 check=False)
    with x64_enabled_scope():
        out = g.apply({}, np.array([2, 3], np.int64), np.array([4], np.int64))[0]
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [8, 12])
