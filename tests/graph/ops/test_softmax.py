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
