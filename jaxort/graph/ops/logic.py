"""Comparisons, boolean and bitwise logic, IsNaN, IsInf and Where."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxort.errors import OpError
from jaxort.graph import register
from jaxort.graph.ops._common import dtype_of, is_string, legacy_broadcast


def _where(cond, x, y):
    if is_string(x) or is_string(y):
        return np.where(np.asarray(cond), x, y)
    return jnp.where(cond, x, y)


def _compare(fn, npfn, a, b):
    if is_string(a) or is_string(b):
        return npfn(np.asarray(a, dtype=object), np.asarray(b, dtype=object)).astype(np.bool_)
    return fn(a, b)


@register("Equal", since=7)
def equal(a, b):
    """Equal-7+ (strings from 19, compared statically)."""
    return _compare(jnp.equal, np.equal, a, b)


@register("Equal", since=1)
def equal_1(a, b, *, broadcast=None, axis=None):
    """Equal-1 (legacy axis broadcasting)."""
    return _compare(jnp.equal, np.equal, a, legacy_broadcast(a, b, broadcast, axis))


@register("Less", since=7)
def less(a, b):
    """Less-7+."""
    return jnp.less(a, b)


@register("Less", since=1)
def less_1(a, b, *, broadcast=None, axis=None):
    """Less-1 (legacy axis broadcasting)."""
    return jnp.less(a, legacy_broadcast(a, b, broadcast, axis))


@register("Greater", since=7)
def greater(a, b):
    """Greater-7+."""
    return jnp.greater(a, b)


@register("Greater", since=1)
def greater_1(a, b, *, broadcast=None, axis=None):
    """Greater-1 (legacy axis broadcasting)."""
    return jnp.greater(a, legacy_broadcast(a, b, broadcast, axis))


@register("LessOrEqual", since=12)
def less_or_equal(a, b):
    """LessOrEqual-12+."""
    return jnp.less_equal(a, b)


@register("GreaterOrEqual", since=12)
def greater_or_equal(a, b):
    """GreaterOrEqual-12+."""
    return jnp.greater_equal(a, b)


@register("Not", since=1)
def not_(x):
    """Not-1+."""
    return jnp.logical_not(x)


@register("And", since=7)
def and_(a, b):
    """And-7+."""
    return jnp.logical_and(a, b)


@register("And", since=1)
def and_1(a, b, *, broadcast=None, axis=None):
    """And-1 (legacy axis broadcasting)."""
    return jnp.logical_and(a, legacy_broadcast(a, b, broadcast, axis))


@register("Or", since=7)
def or_(a, b):
    """Or-7+."""
    return jnp.logical_or(a, b)


@register("Or", since=1)
def or_1(a, b, *, broadcast=None, axis=None):
    """Or-1 (legacy axis broadcasting)."""
    return jnp.logical_or(a, legacy_broadcast(a, b, broadcast, axis))


@register("Xor", since=7)
def xor(a, b):
    """Xor-7+."""
    return jnp.logical_xor(a, b)


@register("Xor", since=1)
def xor_1(a, b, *, broadcast=None, axis=None):
    """Xor-1 (legacy axis broadcasting)."""
    return jnp.logical_xor(a, legacy_broadcast(a, b, broadcast, axis))


@register("BitwiseAnd", since=18)
def bitwise_and(a, b):
    """BitwiseAnd-18+."""
    return jnp.bitwise_and(a, b)


@register("BitwiseOr", since=18)
def bitwise_or(a, b):
    """BitwiseOr-18+."""
    return jnp.bitwise_or(a, b)


@register("BitwiseXor", since=18)
def bitwise_xor(a, b):
    """BitwiseXor-18+."""
    return jnp.bitwise_xor(a, b)


@register("BitwiseNot", since=18)
def bitwise_not(x):
    """BitwiseNot-18+."""
    return jnp.bitwise_not(x)


@register("BitShift", since=11)
def bit_shift(x, y, *, direction):
    """BitShift-11+ (signed right shifts are arithmetic; shifts outside [0, bits) give 0 or -1)."""
    if direction not in ("LEFT", "RIGHT"):
        raise OpError(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    dt = dtype_of(x)
    x, y = jnp.broadcast_arrays(x, jnp.asarray(y).astype(dt))
    bits = np.iinfo(dt).bits
    out_of_range = (y < 0) | (y >= bits)
    safe = jnp.where(out_of_range, jnp.zeros((), dt), y)
    if direction == "LEFT":
        return jnp.where(out_of_range, jnp.zeros((), dt), lax.shift_left(x, safe))
    if jnp.issubdtype(dt, jnp.signedinteger):
        fill = jnp.where(x < 0, jnp.asarray(-1, dt), jnp.zeros((), dt))
        return jnp.where(out_of_range, fill, lax.shift_right_arithmetic(x, safe))
    return jnp.where(out_of_range, jnp.zeros((), dt), lax.shift_right_logical(x, safe))


@register("IsNaN", since=9)
def is_nan(x):
    """IsNaN-9+."""
    return jnp.isnan(x)


@register("IsInf", since=10)
def is_inf(x, *, detect_negative, detect_positive):
    """IsInf-10+."""
    if detect_negative and detect_positive:
        return jnp.isinf(x)
    if detect_positive:
        return jnp.isposinf(x)
    if detect_negative:
        return jnp.isneginf(x)
    return jnp.zeros(jnp.shape(x), jnp.bool_)


@register("Where", since=9)
def where(condition, x, y):
    """Where-9+ (numpy broadcasting; string branches are evaluated statically)."""
    return _where(condition, x, y)
