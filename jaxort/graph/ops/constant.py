"""Values made from attributes or shapes: Constant, ConstantOfShape, Range, EyeLike, Identity."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import OpError
from jaxort.graph import register, static, static_ints


@register("Constant", since=1)
def constant(*, value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, value_string=None, value_strings=None, sparse_value=None):
    """Constant-1+ (every value_* attribute form; sparse values are densified)."""
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


@register("ConstantOfShape", since=9)
def constant_of_shape(input, *, value=None):
    """ConstantOfShape-9+; always static (float32 zeros without a value)."""
    dims = static_ints(input, "input 'input'")
    if any(d < 0 for d in dims):
        raise OpError(f"negative dimension in shape {dims}")
    if value is None:
        return np.zeros(dims, np.float32)
    value = np.asarray(value)
    return np.full(dims, value.reshape(-1)[0], dtype=value.dtype)


def _range(start, limit, delta, compute_dtype=None):
    s, l, d = (static(v, f"input '{n}'").reshape(-1)
               for v, n in ((start, "start"), (limit, "limit"), (delta, "delta")))
    if s.size != 1 or l.size != 1 or d.size != 1:
        raise OpError("start, limit and delta must be scalars")
    dtype = np.dtype(start.dtype)
    if dtype.kind in "iu":
        s, l, d = int(s[0]), int(l[0]), int(d[0])
        if d == 0:
            raise OpError("delta is 0")
        n = max(-((s - l) // d), 0)  # ceil((l - s) / d)
        return (s + np.arange(n, dtype=np.int64) * d).astype(dtype)
    ct = np.dtype(compute_dtype or np.float64)
    s, l, d = (ct.type(v[0].astype(np.float64)) for v in (s, l, d))
    if d == 0:
        raise OpError("delta is 0")
    n = max(int(math.ceil(float(l - s) / float(d))), 0)
    return (s + np.arange(n, dtype=ct) * d).astype(ct).astype(dtype)


@register("Range", since=11)
def range_11(start, limit, delta):
    """Range-11..26; always static (the output length depends on the values)."""
    return _range(start, limit, delta)


@register("Range", since=27)
def range_(start, limit, delta, *, stash_type):
    """Range-27+ (float16/bfloat16 computed in the stash_type precision)."""
    dtype = np.dtype(start.dtype)
    low = dtype in (np.dtype(np.float16), np.dtype(jnp.bfloat16))
    ct = to_numpy_dtype(stash_type) if (low and stash_type is not None) else None
    return _range(start, limit, delta, ct)


@register("EyeLike", since=9)
def eye_like(input, *, dtype=None, k):
    """EyeLike-9+; always static (depends only on the input's shape)."""
    shp = np.shape(input)
    if len(shp) != 2:
        raise OpError(f"input must be 2-D, got shape {list(shp)}")
    out = to_numpy_dtype(dtype) if dtype is not None else np.dtype(input.dtype)
    return np.eye(shp[0], shp[1], k=int(k), dtype=np.float64).astype(out)


@register("Identity", since=1)
def identity(input):
    """Identity-1+ (tensors, sequences and optionals)."""
    return input
