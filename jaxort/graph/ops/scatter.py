"""Writing by index: Scatter, ScatterElements, ScatterND and TensorScatter."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register
from jaxort.graph.ops._common import (
    array_module,
    check_indices_in_range,
    nd_index,
    normalize_axis,
    wrap_negative_indices,
)


def _scatter(data, index, updates, reduction):
    ref = jnp.asarray(data).at[index]
    updates = jnp.asarray(updates)
    if reduction in (None, "none"):
        return ref.set(updates)
    if reduction == "add":
        return ref.add(updates)
    if reduction == "mul":
        return ref.multiply(updates)
    if reduction == "max":
        return ref.max(updates)
    if reduction == "min":
        return ref.min(updates)
    raise OpError(f"unknown reduction {reduction!r}")


def _scatter_elements(data, indices, updates, axis, reduction):
    a = normalize_axis(axis, data.ndim)
    if indices.shape != updates.shape or indices.ndim != data.ndim:
        raise OpError(f"indices {list(indices.shape)} and updates "
                      f"{list(updates.shape)} must have one shape, of data's rank {data.ndim}")
    check_indices_in_range(indices, data.shape[a])
    idx = wrap_negative_indices(indices, data.shape[a])
    index = tuple(
        idx if i == a else
        np.arange(indices.shape[i]).reshape([-1 if j == i else 1 for j in range(data.ndim)])
        for i in range(data.ndim))
    return _scatter(data, index, updates, reduction)


@register("Scatter", since=9)
def scatter(data, indices, updates, *, axis):
    """Scatter-9..10 (deprecated alias of ScatterElements)."""
    return _scatter_elements(data, indices, updates, axis, None)


@register("ScatterElements", since=11)
def scatter_elements_11(data, indices, updates, *, axis):
    """ScatterElements-11..15 (no reduction)."""
    return _scatter_elements(data, indices, updates, axis, None)


@register("ScatterElements", since=16)
def scatter_elements(data, indices, updates, *, axis, reduction):
    """ScatterElements-16+ (reduction none/add/mul; max/min from 18)."""
    return _scatter_elements(data, indices, updates, axis, reduction)


def _scatter_nd(data, indices, updates, reduction):
    k = indices.shape[-1]
    want = tuple(indices.shape[:-1]) + tuple(data.shape[k:])
    if tuple(updates.shape) != want:
        raise OpError(f"updates shape {list(updates.shape)} != "
                      f"expected {list(want)}")
    index, _ = nd_index(data.shape, indices, 0)
    d = jnp.reshape(jnp.asarray(data), (1,) + tuple(data.shape))
    u = jnp.reshape(jnp.asarray(updates), (1,) + tuple(updates.shape))
    return _scatter(d, index, u, reduction)[0]


@register("ScatterND", since=11)
def scatter_nd_11(data, indices, updates):
    """ScatterND-11..15 (no reduction)."""
    return _scatter_nd(data, indices, updates, None)


@register("ScatterND", since=16)
def scatter_nd(data, indices, updates, *, reduction):
    """ScatterND-16+ (reduction none/add/mul; max/min from 18)."""
    return _scatter_nd(data, indices, updates, reduction)


@register("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, mode, axis):
    """TensorScatter-24+ (KV-cache update; write_indices may be traced)."""
    nd = past_cache.ndim
    a = normalize_axis(axis, nd)
    if a == 0:
        raise OpError("axis must not be the batch axis 0")
    other_dims_differ = any(u != c for i, (u, c) in enumerate(
        zip(update.shape, past_cache.shape)) if i != a)
    if update.ndim != nd or other_dims_differ or update.shape[a] > past_cache.shape[a]:
        raise OpError(f"update shape {list(update.shape)} does not fit "
                      f"cache shape {list(past_cache.shape)} on axis {a}")
    if mode not in ("linear", "circular"):
        raise OpError(f"unknown mode {mode!r}")
    b, seq, max_len = past_cache.shape[0], update.shape[a], past_cache.shape[a]
    if write_indices is None:
        write_indices = np.zeros((b,), np.int64)
    xp = array_module(write_indices)
    pos = xp.reshape(write_indices, (b, 1)) + np.arange(seq, dtype=np.dtype(
        write_indices.dtype)).reshape(1, seq)
    if mode == "circular":
        pos = pos % max_len
    index = []
    for i, d in enumerate(update.shape):
        shape = [1] * nd
        if i == a:
            shape[0], shape[a] = b, seq
            index.append(xp.reshape(pos, shape))
        else:
            shape[i] = d
            index.append(np.arange(d).reshape(shape))
    return _scatter(past_cache, tuple(index), update, None)
