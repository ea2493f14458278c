"""Helpers shared by several op modules: dtype rules and dtype limits.

A helper lives here once a second op module needs it, so each rule has one
name and one definition. The leading underscore keeps this module out of op
discovery (``jaxort/graph/ops/__init__.py`` imports only public modules); it
registers no op and imports nothing from the op modules.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def is_inexact(dtype) -> bool:
    """True for floating-point and complex dtypes (bfloat16 and float8 included)."""
    return jnp.issubdtype(np.dtype(dtype), jnp.inexact)


def is_floating(dtype) -> bool:
    """True for real floating-point dtypes (bfloat16 and float8 included), not complex."""
    return jnp.issubdtype(np.dtype(dtype), jnp.floating)


def is_integer(dtype) -> bool:
    """True for signed and unsigned integer dtypes; bool is not an integer here."""
    dtype = np.dtype(dtype)
    return jnp.issubdtype(dtype, jnp.integer) and dtype != np.bool_


def canonical_dtype(dtype) -> np.dtype:
    """The dtype JAX computes ``dtype`` in: int64/float64 become 32-bit unless x64 is on."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def at_least_float32(dtype) -> np.dtype:
    """float32 for floats narrower than 32 bits, else ``dtype`` itself.

    Statistics (means, variances, log-sum-exps) accumulated in float16 or
    bfloat16 drift; ORT computes them in float32 too and casts the result back.
    """
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def lowest_value(dtype) -> np.ndarray:
    """The smallest value of ``dtype`` (-inf for floats, False for bool), 0-d.

    The identity of max: the init of max-pooling windows, the padding value
    they never pick, and ReduceMax over an empty set.
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(False)
    if is_integer(dtype):
        return np.array(np.iinfo(dtype).min, dtype)
    return np.array(-np.inf, dtype)


def highest_value(dtype) -> np.ndarray:
    """The largest value of ``dtype`` (+inf for floats, True for bool), 0-d: min's identity."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(True)
    if is_integer(dtype):
        return np.array(np.iinfo(dtype).max, dtype)
    return np.array(np.inf, dtype)
