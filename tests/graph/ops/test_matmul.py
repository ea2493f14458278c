"""MatMul, Gemm, Einsum and the integer/quantized matmuls (ops/matmul.py) against ONNX's reference.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ._harness import Example, F32, F64, I32, I64, I8, OpCase, U8, nn_gradient_test, table_tests
from ._strategies import arr, floats, qparams, rand

COVERED_OPS = {
    "Einsum", "Gemm", "MatMul", "MatMulInteger", "QLinearMatMul",
}


@st.composite
def matmul_case(draw):
    dt = floats(draw, (F32, F64, I32, I64))
    b, m, k, n = (draw(st.integers(1, 4)) for _ in range(4))
    batch = draw(st.sampled_from([(), (b,), (2, b)]))
    return Example((arr(draw, dt, batch + (m, k)), arr(draw, dt, (k, n))), {})


@st.composite
def gemm_case(draw):
    dt = floats(draw)
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    ta, tb = draw(st.booleans()), draw(st.booleans())
    a = arr(draw, dt, (k, m) if ta else (m, k))
    b = arr(draw, dt, (n, k) if tb else (k, n))
    c_shape = draw(st.sampled_from([None, (), (n,), (1, n), (m, 1), (m, n)]))
    c = None if c_shape is None else arr(draw, dt, c_shape)
    attrs = dict(transA=int(ta), transB=int(tb), alpha=draw(st.sampled_from([1.0, 0.5, -2.0])),
                 beta=draw(st.sampled_from([1.0, 0.0, 3.0])))
    return Example((a, b, c), attrs)


EINSUMS = {
    "ij,jk->ik": "ij,jk", "bij,bjk->bik": "bij,bjk", "ii->i": "ii", "ij->ji": "ij",
    "i,i": "i,i", "...ij,...jk->...ik": "xij,xjk", "ij->": "ij", "ij,kj": "ij,kj",
}


@st.composite
def einsum_case(draw):
    dt = floats(draw, (F32, F64, I64))
    eq, pattern = draw(st.sampled_from(sorted(EINSUMS.items())))
    size = {ch: draw(st.integers(1, 3)) for ch in "bijkx"}
    size["j" if eq == "ii->i" else "_"] = size["i"]
    inputs = tuple(arr(draw, dt, tuple(size[ch] for ch in term)) for term in pattern.split(","))
    return Example(inputs, {"equation": eq})


@st.composite
def matmul_integer_case(draw):
    dt = draw(st.sampled_from([I8, U8]))
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    a, b = arr(draw, dt, (m, k), -128, 255), arr(draw, dt, (k, n), -128, 255)
    azp = np.array(draw(st.integers(0, 100)), dt) if draw(st.booleans()) else None
    bzp = np.array(draw(st.integers(0, 100)), dt) if draw(st.booleans()) else None
    return Example((a, b, azp, bzp), {})


@st.composite
def qlinear_matmul_case(draw):
    dt = draw(st.sampled_from([I8, U8]))
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    lo, hi = (0, 255) if dt == U8 else (-128, 127)
    a, b = arr(draw, dt, (m, k), lo, hi), arr(draw, dt, (k, n), lo, hi)
    (sa, za), (sb, zb) = qparams(draw, dt), qparams(draw, dt)
    sy, zy = np.array(draw(st.sampled_from([2.0, 8.0, 30.0])), np.float32), qparams(draw, dt)[1]
    return Example((a, sa, za, b, sb, zb, sy, zy), {})


CASES = [
    OpCase("MatMul", matmul_case(), scale=10),
    OpCase("Gemm", gemm_case(), scale=10),
    OpCase("Einsum", einsum_case(), scale=10),
    OpCase("MatMulInteger", matmul_integer_case()),
    OpCase("QLinearMatMul", qlinear_matmul_case()),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- gradients


GRAD_CASES = [
    ("Gemm", lambda: (rand(3, 4), rand(5, 4, seed=1), rand(5, seed=2)),
     dict(transB=1, alpha=0.5, beta=2.0), None),
]

test_gradient_matches_finite_differences = nn_gradient_test(GRAD_CASES)
