"""Ops whose output shape depends on input values: NonZero, Compress and Unique.

They run only on static inputs (folded at trace time); a traced input is an error naming the node.
"""

from __future__ import annotations

import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static
from jaxort.graph.ops._common import array_module, normalize_axis


@register("NonZero", since=9)
def non_zero(X):
    """NonZero-9+ (needs a static input: the output shape depends on its values)."""
    x = static(X, "input 'X'")
    if x.ndim == 0:
        return np.zeros((0, int(bool(x))), np.int64)
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@register("Compress", since=9)
def compress(input, condition, *, axis=None):
    """Compress-9+ (condition must be static; input may be traced)."""
    cond = static(condition, "input 'condition'").astype(bool).reshape(-1)
    x = input
    xp = array_module(x)
    if axis is None:
        x = xp.reshape(x, (-1,))
        a = 0
    else:
        a = normalize_axis(axis, x.ndim)
    if cond.size > x.shape[a]:
        raise OpError(f"condition has {cond.size} entries, axis has "
                      f"{x.shape[a]}")
    keep = np.nonzero(cond)[0]
    return xp.take(x, keep, axis=a)


@register("Unique", since=11)
def unique(X, *, axis=None, sorted):  # noqa: A002  (spec name)
    """Unique-11+ (needs a static input: the output shape depends on its values)."""
    x = static(X, "input 'X'")
    if axis is None:
        y, first, inverse, counts = np.unique(x.reshape(-1), True, True, True)
        a = 0
        flat = x.reshape(-1)
    else:
        a = normalize_axis(axis, x.ndim)
        y, first, inverse, counts = np.unique(x, True, True, True, axis=a)
        flat = x
    inverse = inverse.reshape(-1)
    if not sorted:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first = first[order]
        y = np.take(flat, first, axis=a)
        inverse = rank[inverse]
        counts = counts[order]
    return (y.astype(x.dtype), first.astype(np.int64), inverse.astype(np.int64),
            counts.astype(np.int64))
