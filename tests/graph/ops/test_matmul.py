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


# --------------------------------------------------------------------------- products of few columns


def test_few_column_products_match_numpy_and_finite_differences():
    """MatMul and Gemm with at most 16 columns take their own derivative rule (matmul._few_columns_product).

    Values and gradients against numpy's formulas (a^T g for the weight,
    g b^T for the input), and derivatives of order 2 in both modes against
    finite differences, for a 3-D input, a Gemm with transB, and beside
    them a 17-column product (the plain path).
    """
    import jax
    import jax.numpy as jnp
    from jax.test_util import check_grads

    from jaxort.graph.ops.matmul import gemm, matmul

    rng = np.random.default_rng(0)
    for cols in (1, 10, 16, 17):
        a = rng.standard_normal((4, 64, 48)).astype(np.float32)
        b = rng.standard_normal((48, cols)).astype(np.float32)
        g = rng.standard_normal((4, 64, cols)).astype(np.float32)
        y, vjp = jax.vjp(matmul, a, b)
        da, db = vjp(jnp.asarray(g))
        a64, b64, g64 = (v.astype(np.float64) for v in (a, b, g))
        np.testing.assert_allclose(y, a64 @ b64, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(db, a64.reshape(-1, 48).T @ g64.reshape(-1, cols), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(da, g64 @ b64.T, rtol=1e-5, atol=1e-5)
        w = rng.standard_normal((cols, 48)).astype(np.float32)
        dw = jax.grad(lambda w: jnp.sum(gemm(a[0], w, None, alpha=0.5, beta=1.0, transA=0, transB=1) * g[0]))(w)
        np.testing.assert_allclose(dw, 0.5 * g64[0].T @ a64[0], rtol=1e-4, atol=1e-4)

    with jax.enable_x64(True):
        a, b = rng.standard_normal((2, 5, 7)), rng.standard_normal((7, 3))
        check_grads(lambda a, b: jnp.tanh(matmul(a, b)), (a, b), order=2, modes=("fwd", "rev"))
        w = rng.standard_normal((3, 7))
        check_grads(lambda a, w: jnp.tanh(gemm(a, w, None, alpha=0.5, beta=1.0, transA=0, transB=1)),
                    (a[0], w), order=2, modes=("fwd", "rev"))


def test_few_column_products_under_vmap_and_in_float16():
    import jax
    import jax.numpy as jnp

    from jaxort.graph.ops.matmul import matmul

    rng = np.random.default_rng(1)
    xs = rng.standard_normal((3, 8, 6)).astype(np.float32)
    b = rng.standard_normal((6, 4)).astype(np.float32)
    per_example = jax.vmap(jax.grad(lambda b, x: jnp.sum(matmul(x, b) ** 2)), in_axes=(None, 0))(b, xs)
    for x, got in zip(xs, per_example):
        np.testing.assert_allclose(got, 2 * x.T @ (x @ b), rtol=1e-5, atol=1e-5)
    h = rng.standard_normal((8, 6)).astype(np.float16)
    y, vjp = jax.vjp(matmul, h, b.astype(np.float16))
    assert y.dtype == np.float16
    (db,) = vjp(jnp.ones_like(y))[1:]
    assert db.dtype == np.float16
    np.testing.assert_allclose(db.astype(np.float32), h.astype(np.float32).T @ np.ones((8, 4), np.float32),
                               rtol=1e-2, atol=1e-2)


def test_few_column_rule_is_taken_up_to_16_columns():
    """The weight gradient of a product of <= 16 columns goes through the rule (its two barriers)."""
    import jax

    from jaxort.graph.ops.matmul import matmul

    a = np.ones((32, 8), np.float32)
    for cols, barriers in ((16, 2), (17, 0)):
        jaxpr = jax.make_jaxpr(jax.grad(lambda b: matmul(a, b).sum()))(np.ones((8, cols), np.float32))
        assert str(jaxpr).count("optimization_barrier") == barriers, cols


# --------------------------------------------------------------------------- a 2-D weight applied to rows


def test_rows_times_weight_matches_numpy_and_finite_differences():
    """``(..., k) @ (k, n)`` runs as one 2-D product over the rows (matmul._product).

    Values and both gradients of 3-D and 4-D inputs against numpy (the
    weight's gradient is ``a^T g`` over all rows), integer products exact,
    derivatives of order 2 in both modes and per-example gradients under
    vmap against finite differences and numpy.
    """
    import jax
    import jax.numpy as jnp
    from jax.test_util import check_grads

    from jaxort.graph.ops.matmul import gemm, matmul

    rng = np.random.default_rng(2)
    for shape in ((3, 5, 24), (2, 3, 4, 24)):
        a = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal((24, 40)).astype(np.float32)
        g = rng.standard_normal(shape[:-1] + (40,)).astype(np.float32)
        y, vjp = jax.vjp(matmul, a, b)
        da, db = vjp(jnp.asarray(g))
        a64, b64, g64 = (v.astype(np.float64) for v in (a, b, g))
        assert y.shape == shape[:-1] + (40,)
        np.testing.assert_allclose(y, a64 @ b64, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(db, a64.reshape(-1, 24).T @ g64.reshape(-1, 40), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(da, g64 @ b64.T, rtol=1e-4, atol=1e-4)
        ints = rng.integers(-50, 50, shape).astype(np.int64), rng.integers(-50, 50, (24, 40)).astype(np.int64)
        np.testing.assert_array_equal(matmul(*ints), ints[0] @ ints[1])
    # Gemm's operands are 2-D: it keeps the plain product.
    np.testing.assert_allclose(gemm(a[0, 0], b, None, alpha=1.0, beta=1.0, transA=0, transB=0),
                               a64[0, 0] @ b64, rtol=1e-5, atol=1e-5)

    with jax.enable_x64(True):
        a, b = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((4, 20))
        check_grads(lambda a, b: jnp.tanh(matmul(a, b)), (a, b), order=2, modes=("fwd", "rev"))
        xs = rng.standard_normal((3, 6, 5, 4))
        per_example = jax.vmap(jax.grad(lambda b, x: jnp.sum(matmul(x, b) ** 2)), in_axes=(None, 0))(b, xs)
        for x, got in zip(xs, per_example):
            rows = x.reshape(-1, 4)
            np.testing.assert_allclose(got, 2 * rows.T @ (rows @ b), rtol=1e-10)


def test_rows_times_weight_gradient_contracts_one_axis():
    """The weight gradient of ``(batch, seq, k) @ (k, n)`` contracts the rows, not batch and seq.

    JAX's transpose of the 3-D product contracts two axes, which XLA's CPU
    backend runs after transposing the cotangent in memory (2.5x slower for
    W4's projections, alone); the rows product contracts one.
    """
    import jax

    from jaxort.graph.ops.matmul import matmul

    a = np.ones((4, 16, 8), np.float32)
    jaxpr = jax.make_jaxpr(jax.grad(lambda b: matmul(a, b).sum()))(np.ones((8, 32), np.float32))
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert dots, jaxpr
    for eqn in dots:
        (lhs_contract, rhs_contract), _ = eqn.params["dimension_numbers"]
        assert len(lhs_contract) == len(rhs_contract) == 1, eqn
        assert all(v.aval.ndim == 2 for v in eqn.invars), eqn
