"""Shape, layout, indexing and constant-producing ops."""

import jax.numpy as jnp
import numpy as np

from jaxort.graph import register, static_ints
from jaxort.errors import OpError


@register("Shape", since=1)
def shape(data, *, start=0, end=None):
    """Shape-1+ (start/end from 15); always static: shapes are known at trace time."""
    dims = np.array(data.shape, dtype=np.int64)
    return dims[start:end]


@register("Identity", since=1)
def identity(x):
    """Identity-1+."""
    return x


@register("Gather", since=1)
def gather(data, indices, *, axis=0):
    """Gather-1+ (negative indices wrap)."""
    n = data.shape[axis]
    idx = jnp.where(indices < 0, indices + n, indices) if not isinstance(indices, np.ndarray) \
        else np.where(indices < 0, indices + n, indices)
    return jnp.take(data, idx, axis=axis)


@register("Unsqueeze", since=13)
def unsqueeze(data, axes):
    """Unsqueeze-13+ (axes as an input)."""
    ax = static_ints(axes, "input 'axes'")
    rank = data.ndim + len(ax)
    ax = sorted(a + rank if a < 0 else a for a in ax)
    out = data
    for a in ax:
        out = jnp.expand_dims(out, a)
    return out


@register("Concat", since=4)
def concat(*inputs, axis):
    """Concat-4+."""
    return jnp.concatenate(inputs, axis=axis)


@register("Reshape", since=5)
def reshape(data, shape, *, allowzero=0):
    """Reshape-5+ (allowzero from 14)."""
    target = static_ints(shape, "input 'shape'")
    if not allowzero:
        target = [data.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return jnp.reshape(data, target)


@register("Constant", since=1)
def constant(*, value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, value_string=None, value_strings=None, sparse_value=None):
    """Constant-1+ (every value_* attribute form)."""
    if value is not None:
        return value
    if sparse_value is not None:
        return sparse_value
    if value_float is not None:
        return np.array(value_float, np.float32)
    if value_floats is not None:
        return np.array(value_floats, np.float32)
    if value_int is not None:
        return np.array(value_int, np.int64)
    if value_ints is not None:
        return np.array(value_ints, np.int64)
    if value_string is not None:
        return np.array(value_string, dtype=object)
    if value_strings is not None:
        return np.array(value_strings, dtype=object)
    raise OpError("Constant has no value attribute")
