"""Softmax, LogSoftmax and Hardmax, in their opset < 13 (coerced to 2-D) and opset 13+ forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.graph import register


def _coerce_2d(fn, x, axis):
    axis = axis + x.ndim if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return fn(x.reshape((lead, -1)), 1).reshape(x.shape)


def _softmax(x, axis):
    return jax.nn.softmax(x, axis=axis)


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
