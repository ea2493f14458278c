"""Shape queries and reshapes: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Expand.

Shapes are static: a target shape or axes input must be known at trace time.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static_ints
from jaxort.graph.ops._common import array_module, int_prod, normalize_axes


@register("Shape", since=1)
def shape_1(data):
    """Shape-1..14; always static: shapes are known at trace time."""
    return np.array(np.shape(data), dtype=np.int64)


@register("Shape", since=15)
def shape(data, *, start, end=None):
    """Shape-15+ (start/end clamp like Python slicing); always static."""
    dims = np.array(np.shape(data), dtype=np.int64)
    return dims[start:end]


@register("Size", since=1)
def size(data):
    """Size-1+; always static."""
    return np.array(int_prod(np.shape(data)), dtype=np.int64)


def _reshape(data, target, allowzero):
    target = list(target)
    if not allowzero:
        if len(target) > data.ndim and any(d == 0 for d in target[data.ndim:]):
            raise OpError(f"shape {target} copies dimension "
                          f"{data.ndim}+ of a rank-{data.ndim} input")
        target = [data.shape[i] if d == 0 else d for i, d in enumerate(target)]
    if target.count(-1) > 1 or any(d < -1 for d in target):
        raise OpError(f"invalid shape {target}")
    known = int_prod(d for d in target if d != -1)
    total = int_prod(data.shape)
    if -1 in target:
        if known == 0 or total % known:
            raise OpError(f"cannot reshape input of shape "
                          f"{list(data.shape)} to {target}")
        target[target.index(-1)] = total // known
    elif known != total:
        raise OpError(f"cannot reshape input of shape "
                      f"{list(data.shape)} ({total} elements) to {target}")
    return array_module(data).reshape(data, target)


@register("Reshape", since=1)
def reshape_1(data, *, shape, consumed_inputs=None):
    """Reshape-1..4 (shape attribute)."""
    return _reshape(data, shape or [], False)


@register("Reshape", since=5)
def reshape_5(data, shape):
    """Reshape-5..13 (shape input; 0 copies the input dimension)."""
    return _reshape(data, static_ints(shape, "input 'shape'"), False)


@register("Reshape", since=14)
def reshape(data, shape, *, allowzero):
    """Reshape-14+ (allowzero)."""
    return _reshape(data, static_ints(shape, "input 'shape'"), allowzero)


@register("Flatten", since=1)
def flatten(input, *, axis):
    """Flatten-1+ (negative axis from 11)."""
    rank = input.ndim
    a = axis + rank if axis < 0 else axis
    if not 0 <= a <= rank:
        raise OpError(f"axis {axis} out of range for rank {rank}")
    return array_module(input).reshape(input, (int_prod(input.shape[:a]), int_prod(input.shape[a:])))


def _squeeze(data, axes):
    if axes is None:
        axes = [i for i, d in enumerate(data.shape) if d == 1]
    else:
        axes = normalize_axes(axes, data.ndim)
        bad = [a for a in axes if data.shape[a] != 1]
        if bad:
            raise OpError(f"cannot squeeze axes {bad} of shape "
                          f"{list(data.shape)}: size is not 1")
    return array_module(data).reshape(data, [d for i, d in enumerate(data.shape) if i not in axes])


@register("Squeeze", since=1)
def squeeze_1(data, *, axes=None):
    """Squeeze-1..12 (axes attribute; negative axes from 11)."""
    return _squeeze(data, axes if axes else None)


@register("Squeeze", since=13)
def squeeze(data, axes=None):
    """Squeeze-13+ (axes as an optional input)."""
    return _squeeze(data, None if axes is None else static_ints(axes, "input 'axes'"))


def _unsqueeze(data, axes):
    rank = data.ndim + len(axes)
    axes = normalize_axes(axes, rank)
    dims = iter(data.shape)
    return array_module(data).reshape(data, [1 if i in axes else next(dims) for i in range(rank)])


@register("Unsqueeze", since=1)
def unsqueeze_1(data, *, axes):
    """Unsqueeze-1..12 (axes attribute; negative axes from 11)."""
    return _unsqueeze(data, axes)


@register("Unsqueeze", since=13)
def unsqueeze(data, axes):
    """Unsqueeze-13+ (axes as an input)."""
    return _unsqueeze(data, static_ints(axes, "input 'axes'"))


@register("Expand", since=8)
def expand(input, shape):
    """Expand-8+ (bidirectional broadcast to ``shape``)."""
    target = tuple(static_ints(shape, "input 'shape'"))
    try:
        out = np.broadcast_shapes(np.shape(input), target)
    except ValueError:
        raise OpError(f"cannot broadcast input of shape "
                      f"{list(np.shape(input))} to {list(target)}") from None
    if isinstance(input, np.ndarray):
        return np.array(np.broadcast_to(input, out))
    return jnp.broadcast_to(input, out)
