"""Softmax, LogSoftmax and Hardmax (ops/softmax.py) against ONNX's reference (opset 13+)
and numpy (the opset < 13 coerced-to-2-D forms).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ._harness import Example, F16, F32, F64, OpCase, nn_gradient_test, table_tests
from ._strategies import arr, floats, rand

COVERED_OPS = {
    "Hardmax", "LogSoftmax", "Softmax",
}


def softmax_case(opset):
    @st.composite
    def strat(draw):
        dt = floats(draw, (F32, F64, F16))
        shape = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 4))))
        x = arr(draw, dt, shape, -4, 4)
        return Example((x,), {"axis": draw(st.integers(-len(shape), len(shape) - 1))}, opset)

    return strat()


def coerced_2d(fn):
    """numpy reference of the opset < 13 softmax family: x coerced to 2-D at axis.

    (ONNX's reference evaluator applies the opset 13 axis semantics to every opset.)
    """

    def ref(ex):
        x = ex.inputs[0]
        axis = ex.attributes["axis"] % x.ndim
        x2 = x.astype(np.float64).reshape(int(np.prod(x.shape[:axis])), -1)
        return [fn(x2).reshape(x.shape).astype(x.dtype)]

    return ref


def _np_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _np_hardmax(x):
    return np.eye(x.shape[1])[np.argmax(x, axis=1)]


CASES = [
    OpCase("Softmax", softmax_case(11), scale=10, id="Softmax-11", reference=coerced_2d(_np_softmax)),
    OpCase("Softmax", softmax_case(13), scale=10, id="Softmax-13"),
    OpCase("LogSoftmax", softmax_case(11), scale=10, id="LogSoftmax-11", reference=coerced_2d(lambda x: np.log(_np_softmax(x)))),
    OpCase("LogSoftmax", softmax_case(13), scale=10, id="LogSoftmax-13"),
    OpCase("Hardmax", softmax_case(11), scale=1, id="Hardmax-11", reference=coerced_2d(_np_hardmax)),
    OpCase("Hardmax", softmax_case(13), scale=1, id="Hardmax-13"),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- gradients


GRAD_CASES = [
    ("Softmax", lambda: (rand(2, 3, 4),), dict(axis=1), None),
    ("LogSoftmax", lambda: (rand(2, 3, 4),), dict(axis=-1), None),
]

test_gradient_matches_finite_differences = nn_gradient_test(GRAD_CASES)


def test_softmax_half_precision_rounds_each_step_of_the_function_body():
    # float16/bfloat16: Sub, Exp, ReduceSum (accumulated in float32) and Div as the schema's
    # function body writes them, each result correctly rounded to the input type: equal bit
    # for bit to numpy's float16 arithmetic (ONNX's reference). XLA's own float16 division
    # on CPU is 1-2 ulps off. The op handler runs where fusion is off (jaxort.backend); the
    # fused softmax computes in float32 and rounds once.
    import jax
    import ml_dtypes

    from jaxort.graph import JaxGraph, x64_enabled_scope
    from jaxort.testing import NodeCase

    # Values in [-2, 2]: no probability is subnormal (XLA on CPU flushes those to zero).
    x32 = np.random.default_rng(3).uniform(-2, 2, (4, 6, 33)).astype(np.float32)
    for dtype in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        x = x32.astype(dtype)
        e = np.exp((x - x.max(-1, keepdims=True)).astype(np.float32)).astype(dtype)
        total = e.astype(np.float32).sum(-1, keepdims=True).astype(dtype)
        expected = (e.astype(np.float64) / total.astype(np.float64)).astype(dtype)
        graph = JaxGraph(NodeCase("Softmax", (x,), {"axis": -1}, 13).model(), check=False,
                         params=[], fuse=False)
        with x64_enabled_scope():
            for fn in (graph.apply, jax.jit(graph.apply)):
                (got,) = fn(graph.params, x)
                assert got.dtype == dtype
                np.testing.assert_array_equal(np.asarray(got).astype(np.float64),
                                              expected.astype(np.float64))


def test_bfloat16_softmax_between_fused_ops_reads_and_writes_rounded_values():
    # On CPU XLA computes bfloat16 elementwise ops in float32 and drops the convert pairs
    # between fused ops, so a Softmax between a Mul and a Mul would read the producer's
    # unrounded product and hand on its unrounded quotient. The handler rounds its input
    # and its output, so the compiled graph equals numpy's bfloat16 arithmetic, op by op
    # (the case behind ONNX's 4d_attn_mask_causal_bf16_expanded Attention test).
    import jax
    import ml_dtypes
    from onnx import TensorProto, helper

    from jaxort.graph import JaxGraph

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(7)
    x = rng.uniform(-2, 2, (3, 5, 17)).astype(bf16)
    scale = np.array(0.3535, dtype=bf16)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["a"]),
         helper.make_node("Softmax", ["a"], ["p"], axis=-1),
         helper.make_node("Mul", ["p", "s"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, x.shape),
         helper.make_tensor_value_info("s", TensorProto.BFLOAT16, ())],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, x.shape)]),
        opset_imports=[helper.make_opsetid("", 13)])

    a = (x.astype(np.float32) * scale.astype(np.float32)).astype(bf16)
    e = np.exp((a - a.max(-1, keepdims=True)).astype(np.float32)).astype(bf16)
    total = e.astype(np.float32).sum(-1, keepdims=True).astype(bf16)
    p = (e.astype(np.float64) / total.astype(np.float64)).astype(bf16)
    expected = (p.astype(np.float32) * scale.astype(np.float32)).astype(bf16)

    graph = JaxGraph(model, check=False, params=[], fuse=False)
    (got,) = jax.jit(graph.apply)(graph.params, x, scale)
    assert got.dtype == bf16
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), expected.astype(np.float32))
