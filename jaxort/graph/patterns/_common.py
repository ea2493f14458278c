"""Helpers shared by the pattern families (not a family: the leading underscore keeps it
out of discovery)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def positive_axes(axes, ndim: int) -> tuple:
    """``axes`` (None: all) as sorted non-negative ints."""
    if axes is None:
        return tuple(range(ndim))
    return tuple(sorted(a + ndim if a < 0 else a for a in axes))


def as_dtype(x, dtype):
    """``x`` cast to ``dtype`` (a no-op when it already is)."""
    return x if np.dtype(x.dtype) == np.dtype(dtype) else x.astype(dtype)
