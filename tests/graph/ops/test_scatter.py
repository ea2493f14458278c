"""Scatter ops (ops/scatter.py) against ONNX's reference evaluator (Scatter-9 against
its ScatterElements, which it equals).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from jaxort.testing import run_reference

from ._harness import (
    OLD_REFERENCE, OpCase, node, table_tests, tensor_grad_inputs, tensor_gradient_test
)
from ._strategies import draw_shape, i64, values

COVERED_OPS = {
    "Scatter", "ScatterElements", "ScatterND", "TensorScatter",
}


@st.composite
def s_scatter_elements(draw):
    # onnx < 1.17's reference ScatterElements fails (or drops duplicate updates) above rank 3.
    x = values(draw, draw_shape(draw, 1, 3 if OLD_REFERENCE else 4),
               draw(st.sampled_from([np.float32, np.float64, np.int64])))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    a = axis % x.ndim
    n = x.shape[a]
    # onnx < 1.17's reference ScatterElements has no "mul" (it overwrites instead).
    reduction = draw(st.sampled_from(["none", "add", "max", "min"] if OLD_REFERENCE
                                     else ["none", "add", "mul", "max", "min"]))
    ishape = list(draw(st.integers(1, d)) for d in x.shape)
    if reduction == "none":  # distinct targets: order of duplicate writes is unspecified
        ishape[a] = draw(st.integers(1, n))
        rng = np.random.default_rng(draw(st.integers(0, 2**31)))
        idx = np.stack([rng.permutation(n)[:ishape[a]] for _ in range(
            int(np.prod(ishape)) // ishape[a])], -1).reshape(
            [ishape[a]] + [d for i, d in enumerate(ishape) if i != a])
        idx = np.moveaxis(idx, 0, a)
        idx = np.where(rng.random(idx.shape) < 0.3, idx - n, idx).astype(np.int64)
    else:
        idx = values(draw, tuple(ishape), np.int64, -n, n - 1)
    upd = values(draw, idx.shape, x.dtype)
    if reduction == "none" and draw(st.booleans()):
        op, opset = draw(st.sampled_from([("ScatterElements", 11), ("ScatterElements", 13),
                                          ("Scatter", 9)]))
        return node(op, [("x", x, False), ("i", idx, True), ("u", upd, False)], {"axis": axis},
                    opset=opset)
    return node("ScatterElements", [("x", x, False), ("i", idx, draw(st.booleans())),
                                    ("u", upd, False)],
                {"axis": axis, "reduction": reduction}, opset=18)


@st.composite
def s_scatter_nd(draw):
    x = values(draw, draw_shape(draw, 1, 3), draw(st.sampled_from([np.float32, np.float64,
                                                               np.int64])))
    k = draw(st.integers(1, x.ndim))
    # onnx < 1.17's reference ScatterND max/min index the data with the index row itself.
    reduction = draw(st.sampled_from(["none", "add", "mul"] if OLD_REFERENCE
                                     else ["none", "add", "mul", "max", "min"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    cells = np.array(list(np.ndindex(*x.shape[:k])), np.int64).reshape(-1, k)
    m = draw(st.integers(1, len(cells)))
    if reduction == "none":
        idx = cells[rng.permutation(len(cells))[:m]]
    else:
        idx = cells[rng.integers(0, len(cells), m)]
    idx = np.where(rng.random(idx.shape) < 0.3, idx - np.array(x.shape[:k]), idx)
    if draw(st.booleans()) and m % 2 == 0:
        idx = idx.reshape(2, m // 2, k)
    upd = values(draw, idx.shape[:-1] + x.shape[k:], x.dtype)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    return node("ScatterND", [("x", x, False), ("i", idx, draw(st.booleans())),
                              ("u", upd, False)], attrs,
                opset=18 if reduction != "none" else draw(st.sampled_from([11, 13, 18])))


@st.composite
def s_tensor_scatter(draw):
    b, max_len = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    axis = draw(st.integers(1, 3))
    shape = [b] + [draw(st.integers(1, 3)) for _ in range(3)]
    shape[axis] = max_len
    dtype = draw(st.sampled_from([np.float32, np.int64]))
    cache = values(draw, tuple(shape), dtype)
    ushape = list(shape)
    ushape[axis] = draw(st.integers(1, max_len))
    upd = values(draw, tuple(ushape), dtype)
    mode = draw(st.sampled_from(["linear", "circular"]))
    hi = max_len - ushape[axis] if mode == "linear" else 2 * max_len
    wi = values(draw, (b,), np.int64, 0, hi) if draw(st.booleans()) else None
    return node("TensorScatter", [("c", cache, False), ("u", upd, False),
                                  ("w", wi, draw(st.booleans()))],
                {"mode": mode, "axis": axis - 4 if draw(st.booleans()) else axis}, opset=24)


def _as_scatter_elements(case):
    """The reference of Scatter-9 is ScatterElements (its renamed successor)."""
    return run_reference(dataclasses.replace(case, op_type="ScatterElements"))


CASES = [
    OpCase("ScatterElements", s_scatter_elements(), scale=1, reference=_as_scatter_elements, max_examples=8),
    OpCase("ScatterND", s_scatter_nd(), scale=1, max_examples=8),
    OpCase("TensorScatter", s_tensor_scatter(), min_opset=24, max_examples=8),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS - {"Scatter"})  # Scatter: drawn by ScatterElements


# --------------------------------------------------------------------------- gradients


def _grad_case(name):
    rng, x, x4 = tensor_grad_inputs()
    if name == "ScatterElements":
        return node(name, [("x", x, False), ("i", i64([[1, -1], [0, 0]]), True),
                           ("u", rng.standard_normal((2, 2)), False)],
                    {"axis": 1, "reduction": "add"}, opset=18), (2,)
    raise KeyError(name)

test_gradient_finite_differences = tensor_gradient_test(_grad_case, ['ScatterElements'])
