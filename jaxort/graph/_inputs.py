"""The check of a value fed for a declared graph input: :func:`check_input`.

Shared by :class:`jaxort.graph.JaxGraph` and the training layer's input
checks, so that both accept and refuse the same values. Imports numpy, JAX
and :mod:`jaxort.errors` only.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from jaxort.errors import InputError

__all__ = ["check_input"]


def check_input(name: str, shape: Sequence | None, dtype: np.dtype | None, value: Any, *,
                what: str = "input", lists: bool = True, combined: bool = False) -> Any:
    """Checks ``value`` against a declared input; returns it, or the array a nested list makes.

    A JAX array whose dtype JAX narrowed (int32 for an int64 input while JAX's
    64-bit mode is off) stands for the declared dtype, as it would inside
    ``jax.jit``; any other dtype mismatch is refused, as ONNX Runtime refuses it.

    Args:
      name: the input's name, for messages.
      shape: the declared shape: ints for static dims, a ``dim_param`` string
        or None for symbolic ones; None when the rank is unknown.
      dtype: the declared numpy dtype, or None when the model does not say.
      value: a numpy or JAX array (a tracer under ``jax.jit``); with ``lists``,
        also a nested list or tuple or a Python number.
      what: the word naming the value in messages (``"input"``, ``"param"``).
      lists: turn a nested list, tuple or Python number into a numpy array of
        the declared dtype (integers and booleans keep their kind, floats
        take any float dtype); refuse it when False.
      combined: raise one message naming every mismatch (``"input 'x' has the
        wrong dtype and shape: expected shape ... dtype ..., given shape ...
        dtype ..."``) instead of the first one, the dtype mismatch with how to
        convert.

    Returns:
      ``value`` itself when it passes, or the numpy array a list became.

    Raises:
      InputError: ``value`` is not an array (nor, with ``lists``, a list of
        numbers), or its dtype or shape differs from the declared one; the
        message names the input and gives the expected and given shape and
        dtype.

    Example:
      >>> check_input("x", ("N", 2), np.dtype(np.float32), [[1, 2]]).dtype
      dtype('float32')
    """
    x = value
    if (type(x) is np.ndarray and dtype is not None and shape is not None and x.dtype == dtype
            and len(x.shape) == len(shape) and all(e == g for e, g in zip(shape, x.shape) if type(e) is int)):
        return x  # the common case; every other one is checked in full below
    if getattr(x, "dtype", None) is None or getattr(x, "shape", None) is None:
        x = _from_list(name, shape, dtype, x, what) if lists else None
        if x is None:
            raise InputError(f"{what} {name!r}: expected an array"
                             + (f" of dtype {dtype} shape {_shape_text(shape)}" if dtype is not None else "")
                             + f", given {type(value).__name__}")
    given = np.dtype(x.dtype)
    # JAX arrays cannot hold 64-bit values with JAX's 64-bit mode off: an
    # int32 jax.Array stands for an int64 input then. A numpy float64 for a
    # float32 input is the caller's mistake.
    wrong_dtype = dtype is not None and given != dtype and not (
        isinstance(x, jax.Array) and _canonical(given) == _canonical(dtype))
    wrong_shape = shape is not None and (len(x.shape) != len(shape) or any(
        isinstance(e, int) and e != g for e, g in zip(shape, x.shape)))
    expected_given = (f"expected shape {_shape_text(shape)} dtype {dtype}, given shape {list(x.shape)} "
                      f"dtype {given}")
    if combined and (wrong_dtype or wrong_shape):
        problems = " and ".join(p for p, bad in (("dtype", wrong_dtype), ("shape", wrong_shape)) if bad)
        raise InputError(f"{what} {name!r} has the wrong {problems}: {expected_given}")
    if wrong_dtype:
        raise InputError(
            f"{what} {name!r}: expected dtype {dtype}, given {given}; ONNX Runtime refuses it too, and "
            f"jaxort does not convert silently: pass it as {dtype} (e.g. x.astype(np.{dtype.name}))")
    if wrong_shape:
        raise InputError(f"{what} {name!r}: {expected_given}")
    return x


def _from_list(name: str, shape, dtype: np.dtype | None, value: Any, what: str) -> np.ndarray | None:
    """``value`` (a nested list or a number) as a numpy array of ``dtype``; None for other values."""
    if not isinstance(value, (list, tuple, int, float, bool)):
        return None
    array = np.asarray(value)
    if array.dtype == object:
        return None
    if dtype is not None and array.dtype != dtype:
        same_kind = (array.dtype.kind in "biu" and dtype.kind in "biuf"
                     and (array.dtype.kind == "b") == (dtype.kind == "b"))
        if not same_kind and not (array.dtype.kind == "f" and dtype.kind == "f"):
            raise InputError(f"{what} {name!r}: expected dtype {dtype}, given a list of {array.dtype} values")
        array = array.astype(dtype)
    return array


def _shape_text(shape) -> str:
    return "any" if shape is None else str(list(shape))


def _canonical(dtype) -> np.dtype:
    """``dtype`` as JAX holds it under its current 64-bit mode."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))
