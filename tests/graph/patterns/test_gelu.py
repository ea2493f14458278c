"""Gelu patterns (Erf and Tanh, with and without the bias Add): fused vs op by op, finite
differences, near misses."""

import math

import numpy as np
import pytest

from jaxort.graph import JaxGraph

from ._models import (BF16, F16, F32, F64, Builder, check_against_unfused,
                      check_finite_differences, gelu_erf, gelu_tanh, rand)

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator


def _gelu_model(variant, shape, dtype, bias):
    rng = np.random.default_rng(0)
    b = Builder(dtype)
    x = b.input("x", shape)
    if bias:
        x = b.op("Add", x, b.init("bias", rng.standard_normal(shape[-1])))
    if variant.startswith("erf"):
        y = gelu_erf(b, x, order=int(variant[-1]))
    elif variant == "op":
        y = b.op("Gelu", x)
        return b.model([y], opset=20)
    else:
        y = gelu_tanh(b, x, cube="Pow" if variant == "tanh_pow" else "Mul")
    return b.model([y])


PATTERN = {"erf0": "gelu", "erf1": "gelu", "erf2": "gelu", "tanh_pow": "gelu_tanh",
           "tanh_mul": "gelu_tanh", "op": "gelu_op"}


@pytest.mark.parametrize("bias", [False, True], ids=["x", "bias"])
@pytest.mark.parametrize("variant", sorted(PATTERN))
@pytest.mark.parametrize("shape", [(4, 16), (2, 3, 8)])
def test_float32_matches_op_by_op(variant, shape, bias):
    rng = np.random.default_rng(1)
    check_against_unfused(_gelu_model(variant, shape, F32, bias), [rand(rng, shape, F32, 2)],
                          [PATTERN[variant]])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("variant", ["erf0", "tanh_pow"])
def test_narrow_floats_match_op_by_op(variant, dtype):
    rng = np.random.default_rng(2)
    check_against_unfused(_gelu_model(variant, (4, 32), dtype, True), [rand(rng, (4, 32), dtype)],
                          [PATTERN[variant]])


@pytest.mark.parametrize("bias", [False, True], ids=["x", "bias"])
@pytest.mark.parametrize("variant", sorted(PATTERN))
def test_gradients_match_finite_differences(variant, bias):
    rng = np.random.default_rng(3)
    check_finite_differences(_gelu_model(variant, (3, 5), F64, bias), [rand(rng, (3, 5), F64, 2)],
                             [PATTERN[variant]])


def _numpy_gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def test_biased_input_used_elsewhere_keeps_the_add_outside():
    rng = np.random.default_rng(4)
    b = Builder(F32)
    x = b.input("x", (4, 6))
    h = b.op("Add", x, b.init("bias", rng.standard_normal(6)))
    y = b.op("Add", gelu_erf(b, h), h)  # a residual reads the biased value
    model = b.model([y])
    graph = check_against_unfused(model, [rand(rng, (4, 6))], ["gelu"])
    assert graph.fusions[0][1][0].startswith("div")  # the bias Add is not in the group
    xv = rand(rng, (4, 6))
    hv = xv.astype(np.float64) + graph.params["bias"]
    np.testing.assert_allclose(np.asarray(graph.apply(graph.params, xv)[0]),
                               _numpy_gelu(hv) + hv, rtol=1e-5, atol=1e-6)


def test_wrong_constant_is_not_fused():
    rng = np.random.default_rng(5)
    b = Builder(F32)
    x = b.input("x", (4, 6))
    e = b.op("Erf", b.op("Div", x, b.const(2.0)))  # not sqrt(2)
    y = b.op("Mul", b.op("Mul", x, b.const(0.5)), b.op("Add", e, b.const(1.0)))
    graph = JaxGraph(b.model([y]), check=False)
    assert graph.fusions == ()
    xv = rand(rng, (4, 6))
    ref = 0.5 * xv * (1 + np.vectorize(math.erf)(xv.astype(np.float64) / 2))
    np.testing.assert_allclose(np.asarray(graph.apply(graph.params, xv)[0]), ref, rtol=1e-5,
                               atol=1e-6)


def test_erf_used_elsewhere_is_not_fused():
    rng = np.random.default_rng(6)
    b = Builder(F32)
    x = b.input("x", (4, 6))
    e = b.op("Erf", b.op("Div", x, b.const(math.sqrt(2))))
    y = b.op("Mul", b.op("Mul", x, b.const(0.5)), b.op("Add", e, b.const(1.0)))
    model = b.model([y, e])
    graph = JaxGraph(model, check=False)
    assert graph.fusions == ()
    xv = rand(rng, (4, 6))
    out, ev = graph.apply(graph.params, xv)
    np.testing.assert_allclose(np.asarray(out), _numpy_gelu(xv.astype(np.float64)), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(ev), np.vectorize(math.erf)(xv / math.sqrt(2)),
                               rtol=1e-5, atol=1e-6)
