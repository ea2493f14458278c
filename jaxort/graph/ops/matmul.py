"""Matrix products: MatMul, Gemm, Einsum and the quantized MatMulInteger and QLinearMatMul."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxort.graph import register
from jaxort.graph.ops._common import has_tangent, is_floating, on_cpu_else, sum_tangents
from jaxort.graph.ops._common import per_axis, requantize

# Products with at most this many columns (a classifier's head: 10 classes)
# take _few_columns_product's derivative rule.
_FEW_COLUMNS = 16


@jax.custom_jvp
def _few_columns_product(a, b):
    """``a @ b`` for a 2-D ``a`` (rows, k) and ``b`` (k, n) of few columns; see the rule below."""
    return jnp.matmul(a, b)


def _few_columns_jvp(primals, tangents):
    """The product's tangent, written so that its transpose in ``b`` is a fast product on CPU.

    JAX transposes ``a @ db`` into ``a^T g`` (contracting the rows), which
    XLA's CPU backend hands to Eigen, slow when the result has few columns:
    alone, W2's 2048 -> 10 head over 256 rows takes 0.71 ms on one core
    (0.58 ms on two). As ``(g^T a)^T`` with ``g^T`` materialized, a
    product in the layout XLA's CPU backend sends to YNNPACK, it takes
    0.15 ms. In a train step the gain is smaller (W1's step 6% at default
    threads, under 1% on one core). The two barriers keep XLA from folding
    either transpose back into the product (which undoes it). Transposed,
    the tangent below is exactly that backward pass; forward mode computes
    the same tangent the same way. Other backends keep ``a @ db``.
    """
    a, b = primals
    da, db = tangents
    parts = [jnp.matmul(da, b)] if has_tangent(da) else []
    if has_tangent(db):
        def cpu(operands):
            db_, a_ = operands
            barrier = lax.optimization_barrier
            # (n, k) x (rows, k) -> (n, rows): transposed, (n, rows) x (rows, k) -> (n, k)
            return jnp.transpose(barrier(lax.dot_general(barrier(jnp.transpose(db_)), a_,
                                                         (((1,), (1,)), ((), ())))))

        parts.append(on_cpu_else((db, a), cpu, lambda operands: jnp.matmul(operands[1], operands[0])))
    y = _few_columns_product(a, b)
    return y, sum_tangents(parts, y.shape, y.dtype)


_few_columns_product.defjvp(_few_columns_jvp, symbolic_zeros=True)


def matrix_product(a, b):
    """``jnp.matmul(a, b)``, a 2-D ``b`` applied to ``a``'s rows as one 2-D product.

    A float product with a 2-D ``b`` of few columns takes the rule above.
    Any other ``a`` of more than two axes times a 2-D ``b`` (a transformer's
    projections: ``(batch, seq, d) @ (d, n)``) is reshaped to
    ``(batch * seq, d)`` first: ``jnp.matmul`` of the 3-D ``a`` contracts one
    axis, and JAX transposes it into a weight gradient contracting two
    (batch and seq), which XLA's CPU backend turns into an Eigen product
    with the cotangent transposed in memory first. Measured alone on one
    core, W4's ``(16, 64, 128) @ (128, 512)``: the weight gradient 2.49 ms
    from the 3-D product, 1.00 ms from the 2-D one (the same product,
    contracting one axis of both operands in place).
    """
    if b.ndim != 2 or a.ndim < 2:
        return jnp.matmul(a, b)
    rows = jnp.reshape(a, (int(np.prod(a.shape[:-1])), a.shape[-1]))  # a itself when 2-D
    few = b.shape[1] <= _FEW_COLUMNS and a.dtype == b.dtype and is_floating(a.dtype)
    y = _few_columns_product(rows, b) if few else jnp.matmul(rows, b)
    return jnp.reshape(y, a.shape[:-1] + (b.shape[1],))


@register("MatMul", since=1)
def matmul(a, b):
    """MatMul-1+ (numpy matmul semantics)."""
    return matrix_product(a, b)


def _scale(y, alpha):
    if alpha == 1.0:
        return y
    return y * (alpha if is_floating(y.dtype) else jnp.asarray(alpha).astype(y.dtype))


@register("Gemm", since=1)
def gemm(a, b, c=None, *, alpha, beta, transA, transB, broadcast=None):
    """Gemm-1+ (C optional from 11; the old broadcast attribute is implied)."""
    a = a.T if transA else a
    b = b.T if transB else b
    y = _scale(matrix_product(a, b), alpha)
    if c is not None and beta != 0.0:
        y = y + _scale(jnp.asarray(c), beta).astype(y.dtype)
    return y


@register("Einsum", since=12)
def einsum(*inputs, equation):
    """Einsum-12+."""
    eq = equation.replace(" ", "")
    if "->" not in eq:
        # Implicit output: the letters used once, in alphabetical order, after the broadcast dims.
        lhs = eq
        letters = [ch for ch in lhs if ch.isalpha()]
        once = sorted(ch for ch in set(letters) if letters.count(ch) == 1)
        eq = f"{lhs}->{'...' if '...' in lhs else ''}{''.join(once)}"
    return jnp.einsum(eq, *inputs)


@register("MatMulInteger", since=10)
def mat_mul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """MatMulInteger-10 (int32 accumulation)."""
    a = a.astype(jnp.int32)
    b = b.astype(jnp.int32)
    if a_zero_point is not None:
        azp = jnp.asarray(a_zero_point).astype(jnp.int32)
        a = a - (azp.reshape(-1, 1) if azp.ndim == 1 and azp.shape[0] > 1 else azp)
    if b_zero_point is not None:
        b = b - jnp.asarray(b_zero_point).astype(jnp.int32)
    return jnp.matmul(a, b, preferred_element_type=jnp.int32)


@register("QLinearMatMul", since=10)
def q_linear_mat_mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """QLinearMatMul-10+ (float32 rescale, exact int32 accumulation)."""
    fa = (a.astype(jnp.int32) - per_axis(a_zero_point, a.ndim, -2).astype(jnp.int32))
    fb = (b.astype(jnp.int32) - per_axis(b_zero_point, b.ndim, -1).astype(jnp.int32))
    acc = jnp.matmul(fa, fb, preferred_element_type=jnp.int32).astype(jnp.float32)
    sa = per_axis(a_scale, a.ndim, -2).astype(jnp.float32)
    sb = per_axis(b_scale, b.ndim, -1).astype(jnp.float32)
    ys = jnp.asarray(y_scale).astype(jnp.float32)
    return requantize(acc * (sa * sb) / ys, 1.0, y_zero_point, np.dtype(y_zero_point.dtype))
