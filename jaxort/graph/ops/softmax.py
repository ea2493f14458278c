"""Softmax, LogSoftmax and Hardmax, in their opset < 13 (coerced to 2-D) and opset 13+ forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.graph import register

from ._common import is_floating


def _coerce_2d(fn, x, axis):
    axis = axis + x.ndim if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return fn(x.reshape((lead, -1)), 1).reshape(x.shape)


def _softmax(x, axis):
    dtype = np.dtype(x.dtype)
    if not is_floating(dtype) or dtype.itemsize >= 4:
        return jax.nn.softmax(x, axis=axis)
    # float16 and bfloat16 follow the steps of the schema's function body (Sub, Exp,
    # ReduceSum, Div), each result rounded to the input type once; the sum accumulates
    # in float32. Every step runs in float32 and is then rounded: jax.nn.softmax's float16
    # division on XLA's CPU backend is 1-2 ulps off the correctly rounded quotient.
    # The roundings are reduce_precision ops: XLA may drop a float32 -> bfloat16 -> float32
    # convert pair (excess precision), never a reduce_precision. The input and the output
    # are rounded too: on CPU XLA computes bfloat16 ops in float32 and drops the convert
    # pairs between fused ops, so this op would otherwise read its producer's unrounded
    # float32 value, and its consumer this op's.
    info = jnp.finfo(dtype)

    def round_to_t(v):
        return jax.lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)

    x = round_to_t(jnp.asarray(x).astype(np.float32))
    shifted = round_to_t(x - jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True)))
    e = round_to_t(jnp.exp(shifted))
    total = round_to_t(jnp.sum(e, axis=axis, keepdims=True))
    return round_to_t(e / total).astype(dtype)


def _log_softmax(x, axis):
    return jax.nn.log_softmax(x, axis=axis)


def _hardmax(x, axis):
    return jax.nn.one_hot(jnp.argmax(x, axis=axis), x.shape[axis], dtype=x.dtype, axis=axis)


@register("Softmax", since=1)
def softmax_1(x, *, axis):
    """Softmax-1..12 (input coerced to 2-D at axis)."""
    return _coerce_2d(_softmax, x, axis)


@register("Softmax", since=13)
def softmax(x, *, axis):
    """Softmax-13+."""
    return _softmax(x, axis)


@register("LogSoftmax", since=1)
def log_softmax_1(x, *, axis):
    """LogSoftmax-1..12 (input coerced to 2-D at axis)."""
    return _coerce_2d(_log_softmax, x, axis)


@register("LogSoftmax", since=13)
def log_softmax(x, *, axis):
    """LogSoftmax-13+."""
    return _log_softmax(x, axis)


@register("Hardmax", since=1)
def hardmax_1(x, *, axis):
    """Hardmax-1..12 (input coerced to 2-D at axis)."""
    return _coerce_2d(_hardmax, x, axis)


@register("Hardmax", since=13)
def hardmax(x, *, axis):
    """Hardmax-13+ (first maximum wins)."""
    return _hardmax(x, axis)
