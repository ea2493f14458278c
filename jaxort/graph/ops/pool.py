"""Pooling: MaxPool, AveragePool, LpPool, their global forms, and MaxUnpool."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxort.errors import OpError
from jaxort.graph import register, static_ints
from jaxort.graph.ops._common import auto_pads, spatial_attrs
from jaxort.graph.ops._common import MAX_TAPS, lowest_value, on_cpu_else, tap_slices


def _pool_geometry(x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode):
    """Returns kernel, strides, dilations, output dims, explicit (lo, hi) pads, extra hi pads."""
    if kernel_shape is None:
        raise OpError("kernel_shape is required")
    kernel, strides, dilations = spatial_attrs(x, None, kernel_shape, strides, dilations)
    in_sp = x.shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    padding = auto_pads(in_sp, eff, strides, auto_pad, pads)
    out, extra = [], []
    for i, (lo, hi) in enumerate(padding):
        span = in_sp[i] + lo + hi - eff[i]
        if ceil_mode:
            o = -(-span // strides[i]) + 1
            # The last window must start inside the input or the low padding.
            if (o - 1) * strides[i] >= in_sp[i] + lo:
                o -= 1
        else:
            o = span // strides[i] + 1
        out.append(o)
        extra.append(max(0, (o - 1) * strides[i] + eff[i] - (in_sp[i] + lo + hi)))
    return kernel, strides, dilations, out, padding, extra


def _reduce_window(x, init, op, kernel, strides, dilations, padding):
    n = x.ndim - 2
    return lax.reduce_window(
        x, init, op, (1, 1) + tuple(kernel), (1, 1) + tuple(strides),
        ((0, 0), (0, 0)) + tuple(padding), window_dilation=(1, 1) + tuple(dilations)
        if n else None)


def _window_count(in_sp, kernel, strides, dilations, padding, extra, include_pad, out):
    """Number of elements each window averages over, in numpy (a trace-time constant)."""
    mask = np.pad(np.ones(tuple(in_sp)), tuple(padding), constant_values=1 if include_pad else 0)
    mask = np.pad(mask, [(0, e) for e in extra])
    count = np.zeros(tuple(out))
    for _, sl in tap_slices(kernel, strides, dilations, out):
        count += mask[sl]
    return count


def _max_of_taps(xp, geometry):
    kernel, strides, dilations, out = geometry
    lead = (slice(None), slice(None))
    y = None
    for _, sl in tap_slices(kernel, strides, dilations, out):
        tap = xp[lead + sl]
        y = tap if y is None else lax.max(y, tap)
    return y


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _max_pool_taps(xp, geometry):
    """Max pooling of the padded input ``xp`` as an elementwise max over kernel taps.

    XLA's CPU runtime runs ``reduce_window`` of small windows and max
    pooling's gradient (``select_and_scatter``) slowly; a max over strided
    slices fuses into one loop, and so does the tangent below and its
    transpose (each tap's share padded back into place). The derivative
    follows the first maximum of each window in row-major order, as
    ``select_and_scatter`` and ONNX Runtime's MaxPoolGrad (through
    MaxPool's Indices) do.
    """
    return _max_of_taps(xp, geometry)


@_max_pool_taps.defjvp
def _max_pool_taps_jvp(geometry, primals, tangents):
    (xp,), (dxp,) = primals, tangents
    kernel, strides, dilations, out = geometry
    y = _max_of_taps(xp, geometry)
    lead = (slice(None), slice(None))
    zero = np.array(0, dxp.dtype)
    taken = dy = None
    for _, sl in tap_slices(kernel, strides, dilations, out):
        hit = xp[lead + sl] == y
        if taken is not None:
            hit = hit & ~taken
        taken = hit if taken is None else taken | hit
        part = jnp.where(hit, dxp[lead + sl], zero)
        dy = part if dy is None else dy + part
    return y, dy


def _max_pool_values(x, kernel, strides, dilations, out, full_pad):
    init = lowest_value(x.dtype)

    def native(x):
        return _reduce_window(x, init, lax.max, kernel, strides, dilations, full_pad)

    if not (jnp.issubdtype(x.dtype, jnp.floating) and 0 < math.prod(kernel) <= MAX_TAPS
            and all(o > 0 for o in out) and all(p >= 0 for pair in full_pad for p in pair)):
        return native(x)

    def taps(x):
        xp = jnp.pad(x, ((0, 0), (0, 0)) + tuple(full_pad), constant_values=init)
        return _max_pool_taps(xp, (tuple(kernel), tuple(strides), tuple(dilations), tuple(out)))

    if any(d != 1 for d in dilations):
        # JAX has no reverse-mode rule for reduce_window's max with window dilation.
        return taps(x)
    return on_cpu_else(x, taps, native)


@register("MaxPool", since=1)
def max_pool(x, *, auto_pad, ceil_mode=None, dilations=None, kernel_shape, pads, storage_order=None,
             strides, ctx):
    """MaxPool-1+ (Indices computed only when the node uses them)."""
    kernel, strides, dilations, out, padding, extra = _pool_geometry(
        x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
    full_pad = [(lo, hi + e) for (lo, hi), e in zip(padding, extra)]
    y = _max_pool_values(x, kernel, strides, dilations, out, full_pad)
    if len(ctx.output_names) < 2 or not ctx.output_names[1]:
        return y
    return y, _max_pool_indices(x, kernel, strides, dilations, out, full_pad, storage_order)


def _max_pool_indices(x, kernel, strides, dilations, out, full_pad, storage_order):
    n = x.ndim - 2
    in_sp = x.shape[2:]
    xp = jnp.pad(x, ((0, 0), (0, 0)) + tuple(full_pad), constant_values=lowest_value(x.dtype))
    patches, positions = [], []
    for offs, sl in tap_slices(kernel, strides, dilations, out):
        patches.append(xp[(slice(None), slice(None)) + sl])
        # Input coordinate of this kernel tap for every output position.
        coords = [np.arange(m) * s + o * d - lo
                  for m, s, o, d, (lo, _) in zip(out, strides, offs, dilations, full_pad)]
        positions.append(np.stack(np.meshgrid(*coords, indexing="ij")))
    stacked = jnp.stack(patches)  # (K, N, C, *out)
    best = jnp.argmax(stacked, axis=0)  # (N, C, *out), first maximum
    pos = np.stack(positions)  # (K, n, *out), static
    # flat spatial index: row-major, or column-major for storage_order 1
    dims = list(in_sp)
    if storage_order:
        mult = np.cumprod([1] + dims[:-1]).tolist()
    else:
        mult = np.cumprod([1] + dims[::-1][:-1]).tolist()[::-1]
    spatial_flat = sum(pos[:, i] * int(mult[i]) for i in range(n))  # (K, *out)
    index_dtype = jax.dtypes.canonicalize_dtype(np.int64)  # int32 outside x64
    spatial_flat = jnp.asarray(spatial_flat.astype(index_dtype))
    idx = jnp.take_along_axis(spatial_flat[:, None, None], best[None], axis=0)[0]
    nc = (jnp.arange(x.shape[0] * x.shape[1], dtype=index_dtype).reshape(x.shape[:2] + (1,) * n)
          * int(np.prod(in_sp)))
    return idx + nc


@register("AveragePool", since=1)
def average_pool(x, *, auto_pad, ceil_mode=None, count_include_pad=None, dilations=None,
                 kernel_shape, pads, strides):
    """AveragePool-1+ (the ceil_mode overhang is never counted)."""
    kernel, strides, dilations, out, padding, extra = _pool_geometry(
        x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
    full_pad = [(lo, hi + e) for (lo, hi), e in zip(padding, extra)]
    s = _reduce_window(x, np.array(0, x.dtype), lax.add, kernel, strides, dilations, full_pad)
    count = _window_count(x.shape[2:], kernel, strides, dilations, padding, extra,
                          count_include_pad, out)
    return s / np.maximum(count, 1).astype(x.dtype)


@register("LpPool", since=1)
def lp_pool(x, *, auto_pad, ceil_mode=None, dilations=None, kernel_shape, p, pads, strides):
    """LpPool-1+ (p as a float attribute before opset 2)."""
    kernel, strides, dilations, out, padding, extra = _pool_geometry(
        x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
    full_pad = [(lo, hi + e) for (lo, hi), e in zip(padding, extra)]
    p = float(p)
    s = _reduce_window(jnp.abs(x) ** p, np.array(0, x.dtype), lax.add, kernel, strides,
                       dilations, full_pad)
    return (s ** (1.0 / p)).astype(x.dtype)


@register("GlobalAveragePool", since=1)
def global_average_pool(x):
    """GlobalAveragePool-1+."""
    return jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalMaxPool", since=1)
def global_max_pool(x):
    """GlobalMaxPool-1+."""
    return jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalLpPool", since=2)
def global_lp_pool(x, *, p):
    """GlobalLpPool-2+."""
    s = jnp.sum(jnp.abs(x) ** float(p), axis=tuple(range(2, x.ndim)), keepdims=True)
    return (s ** (1.0 / float(p))).astype(x.dtype)


@register("MaxUnpool", since=9)
def max_unpool(x, indices, output_shape=None, *, kernel_shape, pads, strides):
    """MaxUnpool-9+ (indices as MaxPool's flat Indices output)."""
    n = x.ndim - 2
    strides = list(strides) if strides is not None else [1] * n
    pads = list(pads) if pads is not None else [0] * (2 * n)
    inferred = list(x.shape[:2]) + [
        (x.shape[i + 2] - 1) * strides[i] - pads[i] - pads[i + n] + kernel_shape[i]
        for i in range(n)]
    y = jnp.zeros(int(np.prod(inferred)), x.dtype)
    y = y.at[jnp.reshape(indices, (-1,))].set(jnp.reshape(x, (-1,))).reshape(inferred)
    if output_shape is not None:
        target = static_ints(output_shape, "input 'output_shape'")
        y = jnp.pad(y, [(0, t - s) for t, s in zip(target, inferred)])
    return y
