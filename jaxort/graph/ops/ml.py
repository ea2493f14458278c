"""ai.onnx.ml ops that ONNX's node cases use: Binarizer, ArrayFeatureExtractor, LabelEncoder."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import is_static, register, static, static_ints

ML = "ai.onnx.ml"


def _module(x):
    return np if is_static(x) else jnp


@register("Binarizer", since=1, domain=ML)
def binarizer(x, *, threshold):
    """ai.onnx.ml::Binarizer-1."""
    xp = _module(x)
    return xp.where(x > np.asarray(threshold, x.dtype), xp.ones((), x.dtype), xp.zeros((), x.dtype))


@register("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(x, indices):
    """ai.onnx.ml::ArrayFeatureExtractor-1; a 1-D input gives one row, as ONNX Runtime does."""
    index = static_ints(indices, "input 'Y' (indices)")
    size = x.shape[-1]
    bad = [i for i in index if not 0 <= i < size]
    if bad:
        raise OpError(f"indices {bad} are out of range for the last axis of size {size}")
    out = _module(x).take(x, np.asarray(index, np.int64), axis=-1)
    shape = (1, len(index)) if x.ndim == 1 else tuple(x.shape[:-1]) + (len(index),)
    return out.reshape(shape)


def _listed(*candidates):
    """The first given key/value list or tensor attribute, as a numpy array (or None)."""
    for value in candidates:
        if value is not None and np.size(value) > 0:
            return np.asarray(value)
    return None


@register("LabelEncoder", since=2, domain=ML)
def label_encoder(x, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
                  default_tensor=None, keys_floats=None, keys_int64s=None, keys_strings=None,
                  keys_tensor=None, values_floats=None, values_int64s=None, values_strings=None,
                  values_tensor=None):
    """ai.onnx.ml::LabelEncoder-2 and -4 (keys and values as lists, or tensors from 4).

    Keyword defaults are the schema's; ``*_tensor`` attributes exist from version 4.
    """
    keys = _listed(keys_floats, keys_int64s, keys_strings, keys_tensor)
    values = _listed(values_floats, values_int64s, values_strings, values_tensor)
    if keys is None or values is None or keys.size != values.size:
        raise OpError("LabelEncoder needs keys and values of the same length")
    keys, values = keys.reshape(-1), values.reshape(-1)
    if values_tensor is not None and np.size(values_tensor):
        dtype = np.asarray(values_tensor).dtype
        default = np.asarray(default_tensor).reshape(-1)[0] if default_tensor is not None else (
            "_Unused" if dtype.kind in "OSU" else 0)
    elif values_floats is not None and len(values_floats):
        dtype, default = np.dtype(np.float32), default_float
    elif values_int64s is not None and len(values_int64s):
        dtype, default = np.dtype(np.int64), default_int64
    else:
        dtype, default = np.dtype(object), default_string
    if dtype.kind in "OSU" or keys.dtype.kind in "OSU":
        # Strings are trace-time values: map them with a dict.
        table = dict(zip(keys.tolist(), values.tolist()))
        data = static(x, "input 'X' (strings)")
        out = np.array([table.get(k, default) for k in data.reshape(-1).tolist()], dtype=object)
        out = out.reshape(data.shape)
        return out if dtype.kind in "OSU" else out.astype(dtype)
    order = np.argsort(keys, kind="stable")
    sorted_keys, sorted_values = keys[order].astype(x.dtype), values[order].astype(dtype)
    xp = _module(x)
    pos = xp.clip(xp.searchsorted(sorted_keys, x), 0, len(sorted_keys) - 1)
    found = xp.asarray(sorted_keys)[pos] == x
    return xp.where(found, xp.asarray(sorted_values)[pos], xp.asarray(default, dtype))
