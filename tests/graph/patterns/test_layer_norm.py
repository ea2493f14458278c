"""Layer norm and RMS norm patterns: fused vs op by op, finite differences, near misses."""

import numpy as np
import pytest

from jaxort.graph import JaxGraph

from ._models import (BF16, F16, F32, F64, Builder, check_against_unfused,
                      check_finite_differences, layer_norm_keras, layer_norm_torch, rand)

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator


def _ln_model(variant, shape, axes, dtype, opset=17):
    rng = np.random.default_rng(len(shape) + len(axes))
    b = Builder(dtype)
    x = b.input("x", shape)
    norm_shape = [shape[a] for a in axes]
    scale = b.init("scale", rng.standard_normal(norm_shape))
    bias = b.init("bias", rng.standard_normal(norm_shape))
    if variant == "torch":
        y = layer_norm_torch(b, x, scale, bias, axes, opset=opset)
    elif variant == "torch_mul":
        y = layer_norm_torch(b, x, bias, scale, axes, opset=opset, square="Mul")
    elif variant == "plain":
        y = layer_norm_torch(b, x, None, None, axes, opset=opset)
    elif variant == "keras":
        y = layer_norm_keras(b, x, scale, bias, axes, opset=opset)
    elif variant == "rms":
        sq = b.op("Pow", x, b.const(2.0))
        std = b.op("Sqrt", b.op("Add", b.reduce("ReduceMean", sq, axes, opset), b.const(1e-6)))
        y = b.op("Mul", scale, b.op("Div", x, std))
    elif variant == "rms_reciprocal":
        sq = b.op("Mul", x, x)
        std = b.op("Sqrt", b.op("Add", b.reduce("ReduceMean", sq, axes, opset), b.const(1e-6)))
        y = b.op("Mul", b.op("Mul", x, b.op("Reciprocal", std)), scale)
    elif variant == "op":
        y = b.op("LayerNormalization", x, scale, bias, axis=-len(axes), epsilon=1e-5)
    return b.model([y], opset=opset), rng


PATTERN = {"torch": "layer_norm", "torch_mul": "layer_norm", "plain": "layer_norm",
           "keras": "layer_norm", "rms": "rms_norm", "rms_reciprocal": "rms_norm",
           "op": "layer_norm_op"}

SHAPES = [((4, 32), (-1,)), ((2, 3, 16), (-1,)), ((2, 5, 6), (-2, -1))]


@pytest.mark.parametrize("variant", sorted(PATTERN))
@pytest.mark.parametrize("shape,axes", SHAPES)
def test_float32_matches_op_by_op(variant, shape, axes):
    model, rng = _ln_model(variant, shape, axes, F32)
    check_against_unfused(model, [rand(rng, shape, F32, 3.0) + 1.0], [PATTERN[variant]])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("variant", ["torch", "rms", "op"])
def test_narrow_floats_match_op_by_op(variant, dtype):
    model, rng = _ln_model(variant, (3, 64), (-1,), dtype)
    check_against_unfused(model, [rand(rng, (3, 64), dtype)], [PATTERN[variant]])


def test_opset_18_axes_input():
    model, rng = _ln_model("torch", (2, 3, 16), (-1,), F32, opset=18)
    check_against_unfused(model, [rand(rng, (2, 3, 16))], ["layer_norm"])


@pytest.mark.parametrize("variant", sorted(PATTERN))
def test_gradients_match_finite_differences(variant):
    model, rng = _ln_model(variant, (3, 2, 8), (-1,), F64)
    check_finite_differences(model, [rand(rng, (3, 2, 8), F64)], [PATTERN[variant]])


def _numpy_ln(x, scale, bias, eps, eps_after_sqrt=False):
    d = x - x.mean(-1, keepdims=True)
    var = (d * d).mean(-1, keepdims=True)
    std = np.sqrt(var) + eps if eps_after_sqrt else np.sqrt(var + eps)
    return d / std * scale + bias


def test_epsilon_after_the_sqrt_is_not_fused():
    rng = np.random.default_rng(3)
    b = Builder(F32)
    x = b.input("x", [4, 8])
    scale, bias = b.init("s", rng.standard_normal(8)), b.init("b", rng.standard_normal(8))
    d = b.op("Sub", x, b.op("ReduceMean", x, axes=[-1]))
    var = b.op("ReduceMean", b.op("Pow", d, b.const(2.0)), axes=[-1])
    std = b.op("Add", b.op("Sqrt", var), b.const(1e-2))
    y = b.op("Add", b.op("Mul", b.op("Div", d, std), scale), bias)
    graph = JaxGraph(b.model([y]), check=False)
    assert graph.fusions == ()
    xv = rand(rng, (4, 8))
    (out,) = graph.apply(graph.params, xv)
    ref = _numpy_ln(xv.astype(np.float64), graph.params["s"], graph.params["b"], 1e-2, True)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


def test_intermediate_used_elsewhere_is_not_fused_as_layer_norm():
    rng = np.random.default_rng(4)
    b = Builder(F32)
    x = b.input("x", [4, 8])
    scale, bias = b.init("s", rng.standard_normal(8)), b.init("b", rng.standard_normal(8))
    y = layer_norm_torch(b, x, scale, bias)
    mean = b.nodes[0].output[0]
    model = b.model([y, mean])  # the mean is a requested output
    graph = JaxGraph(model, check=False)
    # The variance tail, RMS of (x - mean), is still a group; the mean stays visible.
    assert [p for p, _ in graph.fusions] == ["rms_norm"]
    xv = rand(rng, (4, 8))
    out, m = graph.apply(graph.params, xv)
    x64 = xv.astype(np.float64)
    np.testing.assert_allclose(np.asarray(out), _numpy_ln(x64, graph.params["s"],
                                                          graph.params["b"], 1e-5), atol=1e-5)
    np.testing.assert_allclose(np.asarray(m), x64.mean(-1, keepdims=True), atol=1e-6)
    check_against_unfused(model, [xv], ["rms_norm"])


def test_different_axes_are_not_fused():
    rng = np.random.default_rng(5)
    b = Builder(F32)
    x = b.input("x", [3, 4, 5])
    d = b.op("Sub", x, b.op("ReduceMean", x, axes=[-1]))
    var = b.op("ReduceMean", b.op("Pow", d, b.const(2.0)), axes=[-2])
    y = b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const(1e-5))))
    model = b.model([y])
    graph = JaxGraph(model, check=False)
    # Not a layer norm; the tail is an RMS norm of (x - mean) over axis -2.
    assert [p for p, _ in graph.fusions] == ["rms_norm"]
    check_against_unfused(model, [rand(rng, (3, 4, 5))], ["rms_norm"])
    xv = rand(rng, (3, 4, 5)).astype(np.float64)
    dv = xv - xv.mean(-1, keepdims=True)
    ref = dv / np.sqrt((dv * dv).mean(-2, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(graph.apply(graph.params, xv.astype(F32))[0]), ref,
                               rtol=1e-5, atol=1e-5)

