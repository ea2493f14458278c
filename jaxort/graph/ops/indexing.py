"""Reading by index and along an axis: Gather, GatherElements, GatherND, OneHot, TopK, CumSum, CumProd."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static, static_ints
from jaxort.graph.ops._common import (
    array_module,
    check_indices_in_range,
    nd_index,
    normalize_axis,
    wrap_negative_indices,
)


@register("Gather", since=1)
def gather(data, indices, *, axis):
    """Gather-1+ (negative indices wrap)."""
    a = normalize_axis(axis, data.ndim)
    n = data.shape[a]
    check_indices_in_range(indices, n)
    idx = wrap_negative_indices(indices, n)
    if array_module(data, idx) is np:
        return np.take(data, idx, axis=a)
    return jnp.take(data, idx, axis=a, mode="clip")


@register("GatherElements", since=11)
def gather_elements(data, indices, *, axis):
    """GatherElements-11+ (negative indices wrap)."""
    a = normalize_axis(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise OpError(f"indices rank {indices.ndim} != data rank {data.ndim}")
    check_indices_in_range(indices, data.shape[a])
    idx = wrap_negative_indices(indices, data.shape[a])
    crop = tuple(slice(None) if i == a else slice(0, indices.shape[i]) for i in range(data.ndim))
    data = data[crop]
    if array_module(data, idx) is np:
        return np.take_along_axis(data, idx, axis=a)
    return jnp.take_along_axis(data, idx, axis=a, mode="clip")


def _gather_nd(data, indices, b):
    if data.shape[:b] != indices.shape[:b]:
        raise OpError(f"batch dims of data {list(data.shape)} and "
                      f"indices {list(indices.shape)} differ")
    index, nb = nd_index(data.shape, indices, b)
    xp = array_module(data, indices)
    d = xp.reshape(data, (nb,) + tuple(data.shape[b:]))
    out = d[index]
    k = indices.shape[-1]
    return xp.reshape(out, tuple(data.shape[:b]) + tuple(indices.shape[b:-1])
                      + tuple(data.shape[b + k:]))


@register("GatherND", since=11)
def gather_nd_11(data, indices):
    """GatherND-11 (negative indices wrap)."""
    return _gather_nd(data, indices, 0)


@register("GatherND", since=12)
def gather_nd(data, indices, *, batch_dims):
    """GatherND-12+ (batch_dims; negative indices wrap)."""
    return _gather_nd(data, indices, int(batch_dims))


@register("OneHot", since=9)
def one_hot(indices, depth, values, *, axis):
    """OneHot-9+ (negative indices wrap; out-of-range ones give all off_value)."""
    d = static(depth, "input 'depth'").reshape(-1)
    if d.size != 1:
        raise OpError("depth must be a scalar")
    d = int(d[0])
    if d < 1:
        raise OpError(f"depth {d} must be positive")
    xp = array_module(indices, values)
    idx = indices
    if np.dtype(idx.dtype).kind == "f" or np.dtype(idx.dtype) == jnp.bfloat16:
        idx = idx.astype(np.int64 if xp is np else jnp.int64)
    idx = wrap_negative_indices(idx, d)
    rank = idx.ndim
    a = axis + rank + 1 if axis < 0 else axis
    if not 0 <= a <= rank:
        raise OpError(f"axis {axis} out of range for rank {rank + 1}")
    targets = np.arange(d, dtype=np.dtype(idx.dtype)).reshape(
        (1,) * a + (d,) + (1,) * (rank - a))
    hot = xp.expand_dims(idx, a) == targets
    vals = xp.reshape(values, (-1,))
    return xp.where(hot, vals[1], vals[0])


def _top_k(x, k, axis, largest, sorted_):
    a = normalize_axis(axis, x.ndim)
    k = int(k)
    if not 0 <= k <= x.shape[a]:
        raise OpError(f"k={k} is out of range for axis {a} of size "
                      f"{x.shape[a]}")
    xm = jnp.moveaxis(jnp.asarray(x), a, -1)
    if largest:
        key = xm
    elif jnp.issubdtype(xm.dtype, jnp.integer):
        key = ~xm  # order-reversing without overflow, for signed and unsigned
    else:
        key = -xm
    _, idx = jax.lax.top_k(key, k)
    vals = jnp.take_along_axis(xm, idx, axis=-1)
    idx = idx.astype(jnp.int64)
    return jnp.moveaxis(vals, -1, a), jnp.moveaxis(idx, -1, a)


@register("TopK", since=1)
def top_k_1(X, *, k, axis):
    """TopK-1..9 (k attribute; largest, sorted)."""
    return _top_k(X, k, axis, True, True)


@register("TopK", since=10)
def top_k_10(X, K, *, axis):
    """TopK-10 (k as an input; largest, sorted)."""
    return _top_k(X, static_ints(K, "input 'K'")[0], axis, True, True)


@register("TopK", since=11)
def top_k(X, K, *, axis, largest, sorted):  # noqa: A002  (spec name)
    """TopK-11+ (ties keep the lower index first; always sorted)."""
    return _top_k(X, static_ints(K, "input 'K'")[0], axis, largest, sorted)


def _cumulative(x, axis, exclusive, reverse, product):
    a = normalize_axis(static_ints(axis, "input 'axis'")[0], x.ndim)
    y = jnp.asarray(x)
    if reverse:
        y = jnp.flip(y, a)
    c = (jnp.cumprod if product else jnp.cumsum)(y, axis=a, dtype=y.dtype)
    if exclusive:
        head_shape = list(y.shape)
        head_shape[a] = min(1, y.shape[a])
        head = (jnp.ones if product else jnp.zeros)(head_shape, y.dtype)
        body = jax.lax.slice_in_dim(c, 0, max(y.shape[a] - 1, 0), axis=a)
        c = jnp.concatenate([head, body], axis=a)
    if reverse:
        c = jnp.flip(c, a)
    return c


@register("CumSum", since=11)
def cum_sum(x, axis, *, exclusive, reverse):
    """CumSum-11+ (exclusive, reverse)."""
    return _cumulative(x, axis, exclusive, reverse, product=False)


@register("CumProd", since=26)
def cum_prod(x, axis, *, exclusive, reverse):
    """CumProd-26+ (exclusive, reverse)."""
    return _cumulative(x, axis, exclusive, reverse, product=True)
