"""Matrix products: MatMul, Gemm, Einsum and the quantized MatMulInteger and QLinearMatMul."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxort.graph import register
from jaxort.graph.ops._common import is_floating
from jaxort.graph.ops._common import per_axis, requantize


@register("MatMul", since=1)
def matmul(a, b):
    """MatMul-1+ (numpy matmul semantics)."""
    return jnp.matmul(a, b)


def _scale(y, alpha):
    if alpha == 1.0:
        return y
    return y * (alpha if is_floating(y.dtype) else jnp.asarray(alpha).astype(y.dtype))


@register("Gemm", since=1)
def gemm(a, b, c=None, *, alpha, beta, transA, transB, broadcast=None):
    """Gemm-1+ (C optional from 11; the old broadcast attribute is implied)."""
    a = a.T if transA else a
    b = b.T if transB else b
    y = _scale(jnp.matmul(a, b), alpha)
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
