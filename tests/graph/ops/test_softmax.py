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
