"""Normalizations: BatchNormalization, LayerNormalization, RMSNormalization, InstanceNormalization,
GroupNormalization, LRN, LpNormalization and MeanVarianceNormalization.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxort.errors import OpError
from jaxort.graph import register
from jaxort.graph.ops._common import at_least_float32
from jaxort.graph.ops._common import batch_norm, channel_shape


def _stash_dtype(dtype, stash_type):
    """The dtype normalization statistics are computed in (stash_type 1 = float32 or wider)."""
    return at_least_float32(dtype) if stash_type == 1 else np.dtype(dtype)


def _wants_extra_outputs(ctx):
    return any(ctx.output_names[1:])


@register("BatchNormalization", since=1)
def batch_normalization_1(x, scale, b, mean, var, *, epsilon, is_test=None, momentum,
                          spatial=None, consumed_inputs=None, ctx):
    """BatchNormalization-1 (is_test=0 with extra outputs: training statistics)."""
    training = not is_test and _wants_extra_outputs(ctx)
    return batch_norm(x, scale, b, mean, var, epsilon=epsilon, momentum=momentum,
                       training=training, ctx=ctx)


@register("BatchNormalization", since=6)
def batch_normalization_6(x, scale, b, mean, var, *, epsilon, is_test=None, momentum,
                          spatial=None, ctx):
    """BatchNormalization-6 (is_test=0 with extra outputs: training statistics)."""
    training = not is_test and _wants_extra_outputs(ctx)
    return batch_norm(x, scale, b, mean, var, epsilon=epsilon, momentum=momentum,
                       training=training, ctx=ctx)


@register("BatchNormalization", since=7)
def batch_normalization_7(x, scale, b, mean, var, *, epsilon, momentum, spatial=None, ctx):
    """BatchNormalization-7..13 (training statistics when the extra outputs are used)."""
    return batch_norm(x, scale, b, mean, var, epsilon=epsilon, momentum=momentum,
                       training=_wants_extra_outputs(ctx), ctx=ctx)


@register("BatchNormalization", since=14)
def batch_normalization(x, scale, b, input_mean, input_var, *, epsilon, momentum,
                        training_mode, ctx):
    """BatchNormalization-14+ (training_mode attribute; jaxort training uses batch stats)."""
    return batch_norm(x, scale, b, input_mean, input_var, epsilon=epsilon, momentum=momentum,
                       training=bool(training_mode), ctx=ctx)[:3]


def _normalize(x, axes, epsilon, cd):
    xc = x.astype(cd)
    mean = jnp.mean(xc, axis=axes, keepdims=True)
    d = xc - mean
    var = jnp.mean(d * d, axis=axes, keepdims=True)
    inv = lax.rsqrt(var + epsilon)
    return d * inv, mean, inv


@register("LayerNormalization", since=17)
def layer_normalization(x, scale, b=None, *, axis, epsilon, stash_type, ctx):
    """LayerNormalization-17 (Mean/InvStdDev in the stash type)."""
    axis = axis + x.ndim if axis < 0 else axis
    cd = _stash_dtype(x.dtype, stash_type)
    y, mean, inv = _normalize(x, tuple(range(axis, x.ndim)), epsilon, cd)
    y = y.astype(x.dtype) * scale
    if b is not None:
        y = y + b
    return y, mean, inv


@register("RMSNormalization", since=23)
def rms_normalization(x, scale, *, axis, epsilon, stash_type):
    """RMSNormalization-23."""
    axis = axis + x.ndim if axis < 0 else axis
    cd = _stash_dtype(x.dtype, stash_type)
    xc = x.astype(cd)
    ms = jnp.mean(xc * xc, axis=tuple(range(axis, x.ndim)), keepdims=True)
    return (xc * lax.rsqrt(ms + epsilon)).astype(x.dtype) * scale


@register("InstanceNormalization", since=1)
def instance_normalization(x, scale, b, *, epsilon, consumed_inputs=None):
    """InstanceNormalization-1+."""
    cd = at_least_float32(x.dtype)
    y, _, _ = _normalize(x, tuple(range(2, x.ndim)), epsilon, cd)
    shape = channel_shape(x)
    y = y * jnp.reshape(scale, shape).astype(cd) + jnp.reshape(b, shape).astype(cd)
    return y.astype(x.dtype)


def _group_norm(x, scale, bias, epsilon, num_groups, cd, per_channel):
    n, c = x.shape[:2]
    g = x.reshape((n, num_groups, -1))
    y, _, _ = _normalize(g, (2,), epsilon, cd)
    if per_channel:
        y = y.reshape(x.shape)
        shape = channel_shape(x)
    else:
        shape = (1, num_groups, 1)
    y = y * jnp.reshape(scale, shape).astype(cd) + jnp.reshape(bias, shape).astype(cd)
    return y.reshape(x.shape).astype(x.dtype)


@register("GroupNormalization", since=18)
def group_normalization_18(x, scale, bias, *, epsilon, num_groups):
    """GroupNormalization-18 (scale and bias per group)."""
    return _group_norm(x, scale, bias, epsilon, num_groups, at_least_float32(x.dtype), False)


@register("GroupNormalization", since=21)
def group_normalization(x, scale, bias, *, epsilon, num_groups, stash_type):
    """GroupNormalization-21 (scale and bias per channel)."""
    return _group_norm(x, scale, bias, epsilon, num_groups, _stash_dtype(x.dtype, stash_type),
                       True)


@register("LRN", since=1)
def lrn(x, *, alpha, beta, bias, size):
    """LRN-1+."""
    c = x.shape[1]
    lo = (size - 1) // 2
    hi = size - 1 - lo
    sq = jnp.square(x)
    padded = jnp.pad(sq, ((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2))
    s = sum(padded[:, i:i + c] for i in range(size))
    return (x / (bias + (alpha / size) * s) ** beta).astype(x.dtype)


@register("LpNormalization", since=1)
def lp_normalization(x, *, axis, p):
    """LpNormalization-1+ (p 1 or 2)."""
    if p == 1:
        norm = jnp.sum(jnp.abs(x), axis=axis, keepdims=True)
    elif p == 2:
        norm = jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=True))
    else:
        raise OpError(f"p must be 1 or 2, got {p}")
    return (x / jnp.where(norm == 0, jnp.ones((), x.dtype), norm)).astype(x.dtype)


@register("MeanVarianceNormalization", since=9)
def mean_variance_normalization(x, *, axes):
    """MeanVarianceNormalization-9+ (epsilon 1e-9 as in the function body)."""
    axes = tuple(axes) if axes is not None else (0, 2, 3)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = jnp.mean(d * d, axis=axes, keepdims=True)
    return (d / (jnp.sqrt(var) + 1e-9)).astype(x.dtype)
