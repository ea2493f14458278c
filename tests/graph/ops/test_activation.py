"""Activations (ops/activation.py) against ONNX's reference evaluator.
Gradients are checked against finite differences in float64, and stay finite
at extreme inputs.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.errors import OpError
from jaxort.graph import JaxGraph
from jaxort.testing import NodeCase, run_reference

from ._harness import (
    Example, F16, F32, F64, elementwise_gradient_test, folded_case, require_opset, run1,
    table_tests
)
from ._strategies import FLOATS, REF_F32, SINTS, UINTS, arrays, float_attr, shapes, unary, uniform

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

COVERED_OPS = {
    "Celu", "Clip", "Elu", "Gelu", "HardSigmoid", "HardSwish",
    "LeakyRelu", "Mish", "PRelu", "Relu", "Selu", "Shrink",
    "Sigmoid", "Softplus", "Softsign", "Swish", "Tanh", "ThresholdedRelu",
}


@st.composite
def prelu_strategy(draw):
    dt = draw(st.sampled_from(FLOATS))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=4))
    k = draw(st.integers(0, len(shape)))
    slope_shape = tuple(d if draw(st.booleans()) else 1 for d in shape[len(shape) - k:])
    return Example((draw(arrays(dt, shape)), draw(arrays(dt, slope_shape, 0, 1))), {})


@st.composite
def clip_strategy(draw):
    dt = draw(st.sampled_from(FLOATS + SINTS + UINTS))
    x = draw(arrays(dt, draw(shapes), -10, 10))
    lo = draw(st.none() | arrays(dt, (), -6, 6))
    hi = draw(st.none() | arrays(dt, (), -6, 6))
    return Example((x, lo, hi), {})


@st.composite
def clip6_strategy(draw):
    dt = draw(st.sampled_from((F32, F64, F16)))
    x = draw(arrays(dt, draw(shapes), -10, 10))
    attrs = {}
    for name in ("min", "max"):
        if draw(st.booleans()):
            attrs[name] = draw(st.integers(-6, 6)) / 2
    return Example((x,), attrs, opset=6)


def _reference_runs(op, dtype=F32, shape=(2,)) -> bool:
    """Whether the installed reference evaluator runs ``op`` on this dtype and shape.

    Old ones (onnx < 1.17 under numpy 2) break on a few forms the newer ones handle:
    HardSigmoid (and HardSwish, whose body uses it) returns float32 for float16, and
    Softplus (and Mish, likewise) fails on 0-d inputs. Those forms are left out of the
    strategies there, since there is nothing to compare against.
    """
    x = np.zeros(shape, dtype)
    try:
        run_reference(NodeCase(op, (x,)))
    except Exception:  # noqa: BLE001 -- any failure means no usable reference
        return False
    return True


def _floats_for(op):
    return tuple(dt for dt in FLOATS if dt == F32 or _reference_runs(op, dt))


def _shapes_for(op, strategy=shapes):
    if _reference_runs(op, shape=()):
        return strategy
    return hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)


UNIT = float_attr(0.05, 2.0)

CASES = [
    folded_case("Relu", unary(FLOATS + SINTS)),
    folded_case("LeakyRelu", unary(FLOATS, attrs=st.fixed_dictionaries({"alpha": float_attr(0, 1)}))),
    folded_case("PRelu", prelu_strategy()),
    folded_case("ThresholdedRelu", unary(FLOATS, attrs=st.fixed_dictionaries(
        {"alpha": float_attr(-1, 2)}))),
    folded_case("Elu", unary(FLOATS, attrs=st.fixed_dictionaries({"alpha": UNIT})), scale=2),
    folded_case("Selu", unary(FLOATS, attrs=st.fixed_dictionaries({"alpha": UNIT, "gamma": UNIT})),
           scale=2),
    folded_case("Celu", unary(FLOATS, attrs=st.fixed_dictionaries({"alpha": float_attr(0.2, 2)})),
           scale=2),
    folded_case("Sigmoid", unary(FLOATS, -8, 8), scale=2),
    folded_case("HardSigmoid", unary(_floats_for("HardSigmoid"), attrs=st.fixed_dictionaries(
        {"alpha": float_attr(0.05, 1), "beta": float_attr(-1, 1)}))),
    folded_case("HardSwish", unary(_floats_for("HardSwish")), scale=2, tolerances={F64: REF_F32}),  # reference: alpha=1/6 in float32
    folded_case("Tanh", unary(FLOATS, -4, 4), scale=2),
    folded_case("Softplus", unary(FLOATS, -8, 8, shape_strategy=_shapes_for("Softplus")), scale=2),
    folded_case("Softsign", unary(FLOATS, shape_strategy=hnp.array_shapes(min_dims=1, max_dims=3,
                                                                    max_side=4))),
    # (the reference's Softsign fails on 0-d inputs)
    folded_case("Gelu", unary(FLOATS, attrs=st.fixed_dictionaries(
        {"approximate": st.sampled_from(("none", "tanh"))})), scale=4, tolerances={F64: REF_F32}),
    folded_case("Mish", unary(FLOATS, shape_strategy=_shapes_for("Mish")), scale=4),
    folded_case("Swish", unary(FLOATS, attrs=st.fixed_dictionaries({"alpha": UNIT})), scale=2,
           min_opset=24),
    folded_case("Shrink", unary(FLOATS[:3] + (np.dtype(np.int8), np.dtype(np.int32)),
                           attrs=st.fixed_dictionaries({
                               "bias": st.sampled_from((0.0, 0.5, 1.0)),
                               "lambd": st.sampled_from((0.0, 0.5, 2.0))}))),
    folded_case("Clip", clip_strategy()),
    folded_case("Clip", clip6_strategy(), id="Clip-6"),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS, equal_nan=True)


# --------------------------------------------------------------------------- gradients

# op, attrs, inputs (float64), opset
GRAD_CASES = [
    ("Relu", {}, lambda: (uniform((5,), kinks=(0,)),)),
    ("LeakyRelu", {"alpha": 0.1}, lambda: (uniform((5,), kinks=(0,)),)),
    ("PRelu", {}, lambda: (uniform((2, 3), kinks=(0,)), uniform((3,), 0.1, 0.5, seed=1))),
    ("ThresholdedRelu", {"alpha": 0.5}, lambda: (uniform((5,), kinks=(0.5,)),)),
    ("Elu", {"alpha": 0.7}, lambda: (uniform((5,), kinks=(0,)),)),
    ("Selu", {}, lambda: (uniform((5,), kinks=(0,)),)),
    ("Celu", {"alpha": 0.8}, lambda: (uniform((5,), kinks=(0,)),)),
    ("Sigmoid", {}, lambda: (uniform((5,)),)),
    ("HardSigmoid", {"alpha": 0.4, "beta": 0.5}, lambda: (uniform((5,), kinks=(-1.25, 1.25)),)),
    ("HardSwish", {}, lambda: (uniform((5,), -4, 4, kinks=(-3, 3)),)),
    ("Tanh", {}, lambda: (uniform((5,)),)),
    ("Softplus", {}, lambda: (uniform((5,)),)),
    ("Softsign", {}, lambda: (uniform((5,), kinks=(0,)),)),
    ("Gelu", {"approximate": "none"}, lambda: (uniform((5,)),)),
    ("Gelu", {"approximate": "tanh"}, lambda: (uniform((5,)),)),
    ("Mish", {}, lambda: (uniform((5,)),)),
    ("Swish", {"alpha": 1.5}, lambda: (uniform((5,)),)),
    ("Shrink", {"bias": 0.2, "lambd": 0.5}, lambda: (uniform((5,), kinks=(-0.5, 0.5)),)),
    ("Clip", {}, lambda: (uniform((5,), kinks=(-1, 1)), np.array(-1.0), np.array(1.0))),
]

test_gradient_matches_finite_differences = elementwise_gradient_test(GRAD_CASES)


# d/dx at x = -500 and x = +500 (no NaN from an overflowing unused branch).
EXTREME_SLOPES = {"Elu": (0, 1), "Selu": (0, 1.0507010221481323), "Celu": (0, 1),
                  "Softplus": (0, 1), "Mish": (0, 1), "Swish": (0, 1), "Gelu": (0, 1),
                  "Sigmoid": (0, 0), "Tanh": (0, 0), "Softsign": (0, 0)}


@pytest.mark.parametrize("op", sorted(EXTREME_SLOPES))
def test_gradient_finite_at_extremes(op):
    if op == "Swish":
        require_opset(op, 24)
    x = np.array([-500.0, -30.0, 0.0, 30.0, 500.0], np.float32)
    g = JaxGraph(NodeCase(op, (x,), {}).model(), check=False)
    grad = jax.grad(lambda v: g.apply({}, v)[0].sum())(jnp.asarray(x))
    assert np.all(np.isfinite(np.asarray(grad)))
    np.testing.assert_allclose(np.asarray(grad)[[0, -1]], EXTREME_SLOPES[op], atol=1e-5)


def test_clip_min_greater_than_max_gives_max():
    x = np.array([-3.0, 0.0, 3.0], np.float32)
    out = run1("Clip", (x, np.array(2.0, np.float32), np.array(1.0, np.float32)))
    np.testing.assert_array_equal(out, [1.0, 1.0, 1.0])


def test_bad_gelu_approximation_raises_op_error():
    x = np.ones(3, np.float32)
    with pytest.raises(OpError, match="approximate"):
        run1("Gelu", (x,), {"approximate": "fast"})
