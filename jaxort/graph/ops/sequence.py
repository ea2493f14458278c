"""Sequence and optional ops.

A sequence is a Python list of arrays and an optional is None or its value;
both flow through the tracer as values (their lengths and presence are known
at trace time). Positions must be static. Elements that are static stay numpy,
so shape arithmetic on them keeps folding.

Handlers whose output may be a list return it inside a 1-tuple: the
dispatcher reads a bare list as several outputs.
"""

import jax.numpy as jnp
import numpy as np

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import OpError
from jaxort.graph import is_static, register, static_ints


def _seq(x, what="input_sequence"):
    x = _none_if_empty(x)
    if isinstance(x, tuple):
        return list(x)
    if not isinstance(x, list):
        raise OpError(f"{what} must be a sequence, given "
                      f"{type(x).__name__}")
    return list(x)


def _none_if_empty(x):
    """Maps the backend's encoding of an absent optional (a 0-d object array of None)."""
    if isinstance(x, np.ndarray) and x.dtype == object and x.shape == () and x.item() is None:
        return None
    return x


def _position(position, length, *, insert):
    pos = static_ints(position, "input 'position'")
    if len(pos) != 1:
        raise OpError(f"position must hold one value, given {pos}")
    p = pos[0]
    hi = length if insert else length - 1
    if not -length <= p <= hi:
        raise OpError(f"position {p} is out of range for a sequence of "
                      f"length {length}")
    return p + length if p < 0 else p


def _lib(*values):
    """numpy when every value is static (results stay static), else jax.numpy."""
    return np if all(is_static(v) for v in values) else jnp


@register("SequenceConstruct", since=11)
def sequence_construct(*inputs):
    """SequenceConstruct-11."""
    return (list(inputs),)


@register("SequenceEmpty", since=11)
def sequence_empty(*, dtype=None):
    """SequenceEmpty-11 (the element type is not recorded)."""
    if dtype is not None:
        to_numpy_dtype(dtype)  # validates the attribute
    return ([],)


@register("SequenceAt", since=11)
def sequence_at(input_sequence, position):
    """SequenceAt-11 (position must be static)."""
    seq = _seq(input_sequence)
    return (seq[_position(position, len(seq), insert=False)],)


@register("SequenceInsert", since=11)
def sequence_insert(input_sequence, tensor, position=None):
    """SequenceInsert-11 (position must be static)."""
    seq = _seq(input_sequence)
    if position is None:
        seq.append(tensor)
    else:
        seq.insert(_position(position, len(seq), insert=True), tensor)
    return (seq,)


@register("SequenceErase", since=11)
def sequence_erase(input_sequence, position=None):
    """SequenceErase-11 (position must be static)."""
    seq = _seq(input_sequence)
    if not seq:
        raise OpError("cannot erase from an empty sequence")
    p = len(seq) - 1 if position is None else _position(position, len(seq), insert=False)
    del seq[p]
    return (seq,)


@register("SequenceLength", since=11)
def sequence_length(input_sequence):
    """SequenceLength-11 (a static int64 scalar)."""
    return np.asarray(len(_seq(input_sequence)), np.int64)


@register("SplitToSequence", since=11)
def split_to_sequence(x, split=None, *, axis, keepdims):
    """SplitToSequence-11/24 (split must be static)."""
    rank = np.ndim(x)
    if not -rank <= axis < rank:
        raise OpError(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    dim = int(np.shape(x)[axis])
    xp = _lib(x)
    if split is None:
        parts = [1] * dim
    else:
        sizes = static_ints(split, "input 'split'")
        if np.ndim(split) == 0:
            n = sizes[0]
            if n <= 0:
                raise OpError(f"split must be positive, given {n}")
            parts = [n] * (dim // n) + ([dim % n] if dim % n else [])
        else:
            parts = sizes
            if sum(parts) != dim or any(p < 0 for p in parts):
                raise OpError(f"split {parts} does not sum to dimension "
                              f"{dim} of axis {axis}")
    out = []
    start = 0
    for p in parts:
        index = [slice(None)] * rank
        index[axis] = slice(start, start + p)
        piece = x[tuple(index)]
        if split is None and not keepdims:
            piece = xp.squeeze(piece, axis=axis)
        out.append(piece)
        start += p
    return (out,)


@register("ConcatFromSequence", since=11)
def concat_from_sequence(input_sequence, *, axis, new_axis):
    """ConcatFromSequence-11."""
    seq = _seq(input_sequence)
    if not seq:
        raise OpError("cannot concatenate an empty sequence")
    xp = _lib(*seq)
    rank = np.ndim(seq[0]) + (1 if new_axis else 0)
    if not -rank <= axis < rank:
        raise OpError(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if new_axis:
        return xp.stack(seq, axis=axis)
    return xp.concatenate(seq, axis=axis)


@register("SequenceMap", since=17, foldable=False)
def sequence_map(input_sequence, *additional_inputs, body):
    """SequenceMap-17 (the body is traced once per element)."""
    seq = _seq(input_sequence)
    extra = [_none_if_empty(a) for a in additional_inputs]
    for a in extra:
        if isinstance(a, list) and len(a) != len(seq):
            raise OpError(f"sequences of lengths {len(seq)} and {len(a)}")
    n_out = len(body.output_names)
    outs = [[] for _ in range(n_out)]
    for i, x in enumerate(seq):
        args = [a[i] if isinstance(a, list) else a for a in extra]
        for k, y in enumerate(body(x, *args)):
            outs[k].append(y)
    return tuple(outs)


@register("Optional", since=15)
def optional(x=None, *, type=None):  # noqa: A002 (spec name)
    """Optional-15/28: None, or the value itself."""
    return (_none_if_empty(x),)


@register("OptionalHasElement", since=15)
def optional_has_element(x=None):
    """OptionalHasElement-15/18/28 (a static bool)."""
    return np.asarray(_none_if_empty(x) is not None)


@register("OptionalGetElement", since=15)
def optional_get_element(x):
    """OptionalGetElement-15/18/28."""
    x = _none_if_empty(x)
    if x is None:
        raise OpError("the optional input has no value")
    return (x,)
