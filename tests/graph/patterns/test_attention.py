"""The attention pattern, and whole transformer blocks: fused vs op by op, finite
differences, near misses, the number of groups."""

import numpy as np
import pytest

from jaxort.graph import JaxGraph

from ._models import (BF16, F16, F32, F64, Builder, attention, check_against_unfused,
                      check_finite_differences, rand, transformer, transformer_inputs)

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator


def _attention_model(dtype, shape, scale_op="Div", mask=True, transpose=True):
    bsz, heads, seq, dh = shape
    b = Builder(dtype)
    q = b.input("q", shape)
    k = b.input("k", shape if transpose else (bsz, heads, dh, seq))
    v = b.input("v", shape)
    m = b.input("mask", (1, 1, seq, seq)) if mask else None
    return b.model([attention(b, q, k, v, m, dh, scale_op, transpose)])


def _inputs(rng, dtype, shape, mask=True, transpose=True):
    bsz, heads, seq, dh = shape
    xs = [rand(rng, shape, dtype), rand(rng, shape if transpose else (bsz, heads, dh, seq), dtype),
          rand(rng, shape, dtype)]
    if mask:
        xs.append(rand(rng, (1, 1, seq, seq), dtype))
    return xs


CASES = [("Div", True, True), ("Mul", True, True), ("none", False, True), ("Div", True, False)]


@pytest.mark.parametrize("scale_op,mask,transpose", CASES)
@pytest.mark.parametrize("shape", [(2, 2, 5, 4), (1, 3, 8, 8)])
def test_float32_matches_op_by_op(scale_op, mask, transpose, shape):
    rng = np.random.default_rng(0)
    check_against_unfused(_attention_model(F32, shape, scale_op, mask, transpose),
                          _inputs(rng, F32, shape, mask, transpose), ["attention"])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_narrow_floats_match_op_by_op(dtype):
    rng = np.random.default_rng(1)
    shape = (2, 2, 6, 8)
    check_against_unfused(_attention_model(dtype, shape), _inputs(rng, dtype, shape),
                          ["attention"])


@pytest.mark.parametrize("scale_op,mask,transpose", CASES)
def test_gradients_match_finite_differences(scale_op, mask, transpose):
    rng = np.random.default_rng(2)
    shape = (1, 2, 3, 4)
    check_finite_differences(_attention_model(F64, shape, scale_op, mask, transpose),
                             _inputs(rng, F64, shape, mask, transpose), ["attention"])


def test_softmax_over_another_axis_is_not_attention():
    rng = np.random.default_rng(3)
    b = Builder(F32)
    q, k, v = (b.input(n, (2, 4, 4)) for n in "qkv")
    p = b.op("Softmax", b.op("MatMul", q, k), axis=1)
    model = b.model([b.op("MatMul", p, v)])
    graph = JaxGraph(model, check=False)
    # The softmax alone is fused; the attention handler would be wrong here.
    assert [name for name, _ in graph.fusions] == ["softmax_op"]
    xs = [rand(rng, (2, 4, 4)) for _ in range(3)]
    s = xs[0].astype(np.float64) @ xs[1]
    e = np.exp(s - s.max(1, keepdims=True))
    ref = (e / e.sum(1, keepdims=True)) @ xs[2]
    np.testing.assert_allclose(np.asarray(graph.apply(graph.params, *xs)[0]), ref, rtol=1e-5,
                               atol=1e-5)
    check_against_unfused(model, xs, ["softmax_op"])


def test_probabilities_used_elsewhere_are_not_attention():
    rng = np.random.default_rng(4)
    b = Builder(F32)
    q, k, v = (b.input(n, (1, 2, 3, 4)) for n in "qkv")
    p = b.op("Softmax", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2])), axis=-1)
    model = b.model([b.op("MatMul", p, v), p])
    graph = JaxGraph(model, check=False)
    assert [name for name, _ in graph.fusions] == ["softmax_op"]
    check_against_unfused(model, [rand(rng, (1, 2, 3, 4)) for _ in range(3)], ["softmax_op"])


BLOCK = ["layer_norm", "attention", "layer_norm", "gelu"]


def test_transformer_block_has_the_expected_groups():
    model = transformer(np.random.default_rng(5), blocks=2)
    graph = JaxGraph(model, check=False)
    assert [name for name, _ in graph.fusions] == BLOCK * 2 + [
        "layer_norm", "softmax_cross_entropy_op"]
    assert JaxGraph(model, check=False, fuse=False).fusions == ()
    # 9 nodes per layer norm, 6 per attention (with the Transpose), 6 per Gelu with its bias Add.
    plain = JaxGraph(model, check=False, fuse=False).node_count
    assert graph.node_count == plain - 5 * 8 - 2 * 5 - 2 * 5


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
def test_transformer_matches_op_by_op(dtype):
    rng = np.random.default_rng(6)
    model = transformer(rng, blocks=1, dtype=dtype)
    check_against_unfused(model, transformer_inputs(rng, dtype=dtype),
                          BLOCK + ["layer_norm", "softmax_cross_entropy_op"])


def test_transformer_gradients_match_finite_differences():
    rng = np.random.default_rng(7)
    model = transformer(rng, blocks=1, dtype=F64, seq=4, d=8)
    check_finite_differences(model, transformer_inputs(rng, dtype=F64, seq=4, d=8),
                             BLOCK + ["layer_norm", "softmax_cross_entropy_op"])


def test_requested_intermediate_output_keeps_its_nodes_op_by_op():
    model = transformer(np.random.default_rng(8), blocks=1, with_loss=False)
    names = [n.output[0] for n in model.graph.node if n.op_type == "Softmax"]
    graph = JaxGraph(model, check=False, extra_outputs=names)
    assert [name for name, _ in graph.fusions] == ["layer_norm", "softmax_op", "layer_norm",
                                                   "gelu", "layer_norm"]
    plain = JaxGraph(model, check=False, extra_outputs=names, fuse=False)
    inputs = transformer_inputs(np.random.default_rng(9), with_loss=False)
    for a, b in zip(graph.apply(graph.params, *inputs), plain.apply(plain.params, *inputs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_a_malformed_softmax_axis_is_no_match():
    # axis given as a list of ints: the matcher must not crash; the nodes run op
    # by op, exactly as with fusion off.
    from onnx import TensorProto, helper

    from jaxort.errors import JaxortError
    from jaxort.graph import JaxGraph

    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=[1, 2], name="sm"),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4, 8]) for n in "qkv"]
    model = helper.make_model(helper.make_graph(nodes, "g", vi, [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8])]),
        opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype(np.float32)
    try:
        want = JaxGraph(model, check=False, fuse=False).apply({}, x, x, x)
    except JaxortError as e:
        with pytest.raises(JaxortError, match=str(e)):
            JaxGraph(model, check=False).apply({}, x, x, x)
    else:
        got = JaxGraph(model, check=False).apply({}, x, x, x)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
