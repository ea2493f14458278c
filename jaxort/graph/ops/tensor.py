"""Shape, layout, indexing and constant-producing ops.

Pure data-movement ops run with numpy when every input is static (so shape
arithmetic keeps int64 and string tensors work) and with ``jax.numpy``
otherwise; arithmetic ops use ``jax.numpy``, which the dispatcher evaluates at
trace time (64-bit) when their inputs are static. Ops whose output shape
depends on values (NonZero, Unique, Compress's condition, Range, ...) read
those values with :func:`static`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import OpError
from jaxort.graph import register, static, static_ints


# --------------------------------------------------------------------------- helpers


def _xp(*xs):
    """numpy when every given value is static (numpy or None), else jax.numpy."""
    if all(x is None or isinstance(x, (np.ndarray, np.generic)) for x in xs):
        return np
    return jnp


def _axis(axis, rank: int, what: str = "axis") -> int:
    """Normalizes a possibly negative axis into [0, rank)."""
    a = int(axis)
    if not -rank <= a < rank:
        raise OpError(f"{what} {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def _axes(axes, rank: int, what: str = "axes") -> list[int]:
    out = [_axis(a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise OpError(f"{what} {list(axes)} has duplicates")
    return out


def _wrap_indices(indices, size):
    """Maps negative indices into [0, size): ``i + size`` where ``i < 0``.

    ``size`` may be an int or a numpy array broadcasting against ``indices``.
    """
    if isinstance(size, np.ndarray):
        size = size.astype(indices.dtype)
    if isinstance(indices, np.ndarray):
        return np.where(indices < 0, indices + size, indices)
    return jnp.where(indices < 0, indices + size, indices)


def _check_in_range(indices, size, what="indices"):
    """Raises for static indices outside [-size, size) (traced ones cannot be checked)."""
    if isinstance(indices, np.ndarray) and indices.size:
        lo, hi = np.min(indices), np.max(indices)
        if np.any((indices < -np.asarray(size)) | (indices >= np.asarray(size))):
            raise OpError(
                f"{what} out of range (min {lo}, max {hi}) for a "
                f"dimension of size {size}")


def _empty(x) -> bool:
    return x is None or (hasattr(x, "shape") and 0 in np.shape(x) and np.ndim(x) > 0)


def _prod(xs) -> int:
    return int(math.prod(int(v) for v in xs))


# --------------------------------------------------------------------------- shape queries


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
    return np.array(_prod(np.shape(data)), dtype=np.int64)


# --------------------------------------------------------------------------- constants


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


# --------------------------------------------------------------------------- layout


@register("Identity", since=1)
def identity(input):
    """Identity-1+ (tensors, sequences and optionals)."""
    return input


def _reshape(data, target, allowzero):
    target = list(target)
    if not allowzero:
        if len(target) > data.ndim and any(d == 0 for d in target[data.ndim:]):
            raise OpError(f"shape {target} copies dimension "
                          f"{data.ndim}+ of a rank-{data.ndim} input")
        target = [data.shape[i] if d == 0 else d for i, d in enumerate(target)]
    if target.count(-1) > 1 or any(d < -1 for d in target):
        raise OpError(f"invalid shape {target}")
    known = _prod(d for d in target if d != -1)
    total = _prod(data.shape)
    if -1 in target:
        if known == 0 or total % known:
            raise OpError(f"cannot reshape input of shape "
                          f"{list(data.shape)} to {target}")
        target[target.index(-1)] = total // known
    elif known != total:
        raise OpError(f"cannot reshape input of shape "
                      f"{list(data.shape)} ({total} elements) to {target}")
    return _xp(data).reshape(data, target)


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
    return _xp(input).reshape(input, (_prod(input.shape[:a]), _prod(input.shape[a:])))


@register("Transpose", since=1)
def transpose(data, *, perm=None):
    """Transpose-1+ (no perm reverses the axes)."""
    perm = list(range(data.ndim))[::-1] if perm is None else _axes(perm, data.ndim, "perm")
    if len(perm) != data.ndim:
        raise OpError(f"perm {perm} does not match rank {data.ndim}")
    return _xp(data).transpose(data, perm)


def _squeeze(data, axes):
    if axes is None:
        axes = [i for i, d in enumerate(data.shape) if d == 1]
    else:
        axes = _axes(axes, data.ndim)
        bad = [a for a in axes if data.shape[a] != 1]
        if bad:
            raise OpError(f"cannot squeeze axes {bad} of shape "
                          f"{list(data.shape)}: size is not 1")
    return _xp(data).reshape(data, [d for i, d in enumerate(data.shape) if i not in axes])


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
    axes = _axes(axes, rank)
    dims = iter(data.shape)
    return _xp(data).reshape(data, [1 if i in axes else next(dims) for i in range(rank)])


@register("Unsqueeze", since=1)
def unsqueeze_1(data, *, axes):
    """Unsqueeze-1..12 (axes attribute; negative axes from 11)."""
    return _unsqueeze(data, axes)


@register("Unsqueeze", since=13)
def unsqueeze(data, axes):
    """Unsqueeze-13+ (axes as an input)."""
    return _unsqueeze(data, static_ints(axes, "input 'axes'"))


def _concat(inputs, axis):
    inputs = [x for x in inputs if x is not None]
    if not inputs:
        raise OpError("Concat needs at least one input")
    a = _axis(axis, inputs[0].ndim)
    return _xp(*inputs).concatenate(inputs, axis=a)


@register("Concat", since=1)
def concat_1(*inputs, axis=None):
    """Concat-1..3 (axis defaults to 1)."""
    return _concat(inputs, 1 if axis is None else axis)


@register("Concat", since=4)
def concat(*inputs, axis):
    """Concat-4+ (negative axis from 11)."""
    return _concat(inputs, axis)


def _split(x, axis, sizes, n):
    a = _axis(axis, x.ndim)
    dim = x.shape[a]
    if sizes is None:
        if n < 1:
            raise OpError("number of outputs must be >= 1")
        chunk = -(-dim // n)
        sizes = [max(0, min(chunk, dim - i * chunk)) for i in range(n)]
    sizes = [int(s) for s in sizes]
    if sum(sizes) != dim or any(s < 0 for s in sizes):
        raise OpError(f"split sizes {sizes} do not add up to the "
                      f"dimension {dim} of axis {a}")
    out, start = [], 0
    for s in sizes:
        idx = [slice(None)] * x.ndim
        idx[a] = slice(start, start + s)
        out.append(x[tuple(idx)])
        start += s
    return tuple(out)


@register("Split", since=1)
def split_1(input, split_input=None, *, axis=None, ctx, **attrs):
    """Split-1 (split sizes as an optional input or the ``split`` attribute)."""
    sizes = attrs.get("split") or None
    if split_input is not None and not _empty(split_input):
        sizes = static_ints(split_input, "input 'split'")
    return _split(input, 0 if axis is None else axis, sizes, len(ctx.output_names))


@register("Split", since=2)
def split_2(input, *, split=None, axis, ctx):
    """Split-2..12 (split attribute; negative axis from 11)."""
    return _split(input, axis, split or None, len(ctx.output_names))


@register("Split", since=13)
def split_13(input, split=None, *, axis, ctx):
    """Split-13..17 (split as an optional input)."""
    sizes = None if _empty(split) else static_ints(split, "input 'split'")
    return _split(input, axis, sizes, len(ctx.output_names))


@register("Split", since=18)
def split(input, split=None, *, axis, num_outputs=None, ctx):
    """Split-18+ (num_outputs: uneven splits make the last part smaller)."""
    sizes = None if _empty(split) else static_ints(split, "input 'split'")
    if sizes is not None and num_outputs is not None:
        raise OpError("both the split input and num_outputs are given")
    n = num_outputs if num_outputs is not None else len(ctx.output_names)
    return _split(input, axis, sizes, n)


def _slice(data, starts, ends, axes, steps):
    rank = data.ndim
    if axes is None:
        axes = list(range(len(starts)))
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise OpError("starts, ends, axes and steps differ in length")
    _axes(axes, rank)  # validates range and duplicates
    idx = [slice(None)] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, rank)
        dim = data.shape[a]
        if st == 0:
            raise OpError(f"step is 0 on axis {a}")
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        idx[a] = slice(s, e if e >= 0 else None, st)
    return data[tuple(idx)]


@register("Slice", since=1)
def slice_1(data, *, starts, ends, axes=None):
    """Slice-1..9 (starts/ends/axes attributes)."""
    return _slice(data, list(starts), list(ends), axes, None)


@register("Slice", since=10)
def slice_(data, starts, ends, axes=None, steps=None):
    """Slice-10+ (inputs; negative steps; INT64_MAX/MIN sentinels clamp)."""
    return _slice(
        data,
        static_ints(starts, "input 'starts'"),
        static_ints(ends, "input 'ends'"),
        None if axes is None else static_ints(axes, "input 'axes'"),
        None if steps is None else static_ints(steps, "input 'steps'"),
    )


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


@register("Tile", since=1)
def tile_1(input, tiles, axis):
    """Tile-1..5 (tiles copies along one axis, both inputs)."""
    reps = [1] * input.ndim
    reps[_axis(static_ints(axis, "input 'axis'")[0], input.ndim)] = \
        static_ints(tiles, "input 'tiles'")[0]
    return _xp(input).tile(input, reps)


@register("Tile", since=6)
def tile(input, repeats):
    """Tile-6+."""
    reps = static_ints(repeats, "input 'repeats'")
    if len(reps) != input.ndim or any(r < 0 for r in reps):
        raise OpError(f"repeats {reps} does not fit rank {input.ndim}")
    return _xp(input).tile(input, reps)


def _pad(data, pads, mode, value, axes=None):
    rank = data.ndim
    axes = list(range(rank)) if axes is None else _axes(axes, rank)
    n = len(axes)
    pads = [int(p) for p in pads]
    if len(pads) != 2 * n:
        raise OpError(f"pads has {len(pads)} values, expected {2 * n}")
    width = [(0, 0)] * rank
    for i, a in enumerate(axes):
        width[a] = (pads[i], pads[n + i])
    if any(b < 0 or e < 0 for b, e in width):  # negative pads crop
        crop = tuple(slice(max(-b, 0), data.shape[i] + e if e < 0 else None)
                     for i, (b, e) in enumerate(width))
        data = data[crop]
        width = [(max(b, 0), max(e, 0)) for b, e in width]
    if mode == "constant":
        xp = _xp(data, value)
        if value is None:
            return xp.pad(data, width, mode="constant")
        value = value.reshape(()) if hasattr(value, "reshape") else value
        if xp is np:
            return np.pad(data, width, mode="constant", constant_values=value).astype(data.dtype)
        return jnp.pad(data, width, mode="constant",
                       constant_values=jnp.asarray(value, data.dtype))
    if mode not in ("reflect", "edge", "wrap"):
        raise OpError(f"unknown pad mode {mode!r}")
    for a, (b, e) in enumerate(width):
        if (b or e) and data.shape[a] == 0:
            raise OpError(f"cannot {mode}-pad an empty axis {a}")
    return _xp(data).pad(data, width, mode=mode)


@register("Pad", since=1)
def pad_1(data, *, paddings, mode, value):
    """Pad-1 (paddings attribute)."""
    return _pad(data, paddings, mode, np.asarray(value, data.dtype))


@register("Pad", since=2)
def pad_2(data, *, pads, mode, value):
    """Pad-2..10 (pads attribute)."""
    return _pad(data, pads, mode, np.asarray(value, data.dtype))


@register("Pad", since=11)
def pad(data, pads, constant_value=None, axes=None, *, mode):
    """Pad-11+ (pads input; axes input from 18; wrap mode from 19)."""
    if _empty(constant_value):
        constant_value = None
    return _pad(data, static_ints(pads, "input 'pads'"), mode, constant_value,
                None if axes is None else static_ints(axes, "input 'axes'"))


def _depth_to_space(x, b, mode):
    if x.ndim != 4:
        raise OpError(f"input must be 4-D, got shape {list(x.shape)}")
    n, c, h, w = x.shape
    if c % (b * b):
        raise OpError(f"channels {c} not divisible by blocksize^2 {b * b}")
    xp = _xp(x)
    if mode == "DCR":
        y = xp.transpose(xp.reshape(x, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = xp.transpose(xp.reshape(x, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise OpError(f"unknown mode {mode!r}")
    return xp.reshape(y, (n, c // (b * b), h * b, w * b))


@register("DepthToSpace", since=1)
def depth_to_space_1(input, *, blocksize):
    """DepthToSpace-1..10 (DCR order)."""
    return _depth_to_space(input, blocksize, "DCR")


@register("DepthToSpace", since=11)
def depth_to_space(input, *, blocksize, mode):
    """DepthToSpace-11+ (DCR/CRD)."""
    return _depth_to_space(input, blocksize, mode)


def _space_to_depth(x, b, mode):
    if x.ndim != 4:
        raise OpError(f"input must be 4-D, got shape {list(x.shape)}")
    n, c, h, w = x.shape
    if h % b or w % b:
        raise OpError(f"spatial dims {h}x{w} not divisible by {b}")
    xp = _xp(x)
    y = xp.reshape(x, (n, c, h // b, b, w // b, b))
    if mode == "DCR":
        y = xp.transpose(y, (0, 3, 5, 1, 2, 4))
    elif mode == "CRD":
        y = xp.transpose(y, (0, 1, 3, 5, 2, 4))
    else:
        raise OpError(f"unknown mode {mode!r}")
    return xp.reshape(y, (n, c * b * b, h // b, w // b))


@register("SpaceToDepth", since=1)
def space_to_depth_1(input, *, blocksize):
    """SpaceToDepth-1..27 (DCR order)."""
    return _space_to_depth(input, blocksize, "DCR")


@register("SpaceToDepth", since=28)
def space_to_depth(input, *, blocksize, mode):
    """SpaceToDepth-28+ (DCR/CRD)."""
    return _space_to_depth(input, blocksize, mode)


@register("CenterCropPad", since=18)
def center_crop_pad(input_data, shape, *, axes=None):
    """CenterCropPad-18+ (crop or zero-pad each axis around its center)."""
    x = input_data
    target = static_ints(shape, "input 'shape'")
    axes = list(range(x.ndim)) if axes is None else _axes(axes, x.ndim)
    if len(axes) != len(target):
        raise OpError(f"shape {target} does not match axes {axes}")
    crop = [slice(None)] * x.ndim
    width = [(0, 0)] * x.ndim
    for a, t in zip(axes, target):
        dim = x.shape[a]
        if t < dim:
            lo = (dim - t) // 2
            crop[a] = slice(lo, lo + t)
        elif t > dim:
            lo = (t - dim) // 2
            width[a] = (lo, t - dim - lo)
    x = x[tuple(crop)]
    return _xp(x).pad(x, width, mode="constant")


@register("Trilu", since=14)
def trilu(input, k=None, *, upper):
    """Trilu-14+."""
    kk = 0 if k is None else static_ints(k, "input 'k'")[0]
    if input.ndim < 2:
        raise OpError("input must have rank >= 2")
    n, m = input.shape[-2:]
    ones = np.ones((n, m), bool)
    mask = np.triu(ones, kk) if upper else np.tril(ones, kk)
    xp = _xp(input)
    return xp.where(mask, input, xp.zeros((), input.dtype))


@register("ReverseSequence", since=10)
def reverse_sequence(input, sequence_lens, *, batch_axis, time_axis):
    """ReverseSequence-10+ (sequence_lens may be traced)."""
    x = input
    b, t = _axis(batch_axis, x.ndim), _axis(time_axis, x.ndim)
    xp = _xp(x, sequence_lens)
    lens_shape = [1] * x.ndim
    lens_shape[b] = x.shape[b]
    time_shape = [1] * x.ndim
    time_shape[t] = x.shape[t]
    lens = xp.reshape(sequence_lens, lens_shape)
    steps = np.arange(x.shape[t], dtype=np.asarray(sequence_lens).dtype
                      if isinstance(sequence_lens, np.ndarray) else sequence_lens.dtype)
    steps = steps.reshape(time_shape)
    src = xp.where(steps < lens, lens - 1 - steps, steps)
    src = xp.broadcast_to(src, x.shape)
    return xp.take_along_axis(x, src, axis=t)


# --------------------------------------------------------------------------- indexing


@register("Gather", since=1)
def gather(data, indices, *, axis):
    """Gather-1+ (negative indices wrap)."""
    a = _axis(axis, data.ndim)
    n = data.shape[a]
    _check_in_range(indices, n)
    idx = _wrap_indices(indices, n)
    if _xp(data, idx) is np:
        return np.take(data, idx, axis=a)
    return jnp.take(data, idx, axis=a, mode="clip")


@register("GatherElements", since=11)
def gather_elements(data, indices, *, axis):
    """GatherElements-11+ (negative indices wrap)."""
    a = _axis(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise OpError(f"indices rank {indices.ndim} != data rank {data.ndim}")
    _check_in_range(indices, data.shape[a])
    idx = _wrap_indices(indices, data.shape[a])
    crop = tuple(slice(None) if i == a else slice(0, indices.shape[i]) for i in range(data.ndim))
    data = data[crop]
    if _xp(data, idx) is np:
        return np.take_along_axis(data, idx, axis=a)
    return jnp.take_along_axis(data, idx, axis=a, mode="clip")


def _nd_index(data_shape, indices, batch_dims):
    """For GatherND/ScatterND: the advanced-index tuple into data reshaped to (B, ...)."""
    k = indices.shape[-1]
    if batch_dims + k > len(data_shape):
        raise OpError(f"indices' last dimension {k} plus batch_dims "
                      f"{batch_dims} exceeds data rank {len(data_shape)}")
    dims = np.array(data_shape[batch_dims:batch_dims + k], dtype=np.int64)
    _check_in_range(indices, dims)
    idx = _wrap_indices(indices, dims)
    nb = _prod(data_shape[:batch_dims])
    xp = _xp(idx)
    idx = xp.reshape(idx, (nb,) + tuple(indices.shape[batch_dims:]))
    bidx = np.arange(nb).reshape((nb,) + (1,) * (idx.ndim - 2))
    return (bidx,) + tuple(idx[..., j] for j in range(k)), nb


def _gather_nd(data, indices, b):
    if data.shape[:b] != indices.shape[:b]:
        raise OpError(f"batch dims of data {list(data.shape)} and "
                      f"indices {list(indices.shape)} differ")
    index, nb = _nd_index(data.shape, indices, b)
    xp = _xp(data, indices)
    d = xp.reshape(data, (nb,) + tuple(data.shape[b:]))
    out = d[index]
    k = indices.shape[-1]
    return xp.reshape(out, tuple(data.shape[:b]) + tuple(indices.shape[b:-1])
                      + tuple(data.shape[b + k:]))


@register("GatherND", since=11)
def gather_nd_11(data, indices):
    """GatherND-11 (negative indices wrap)."""
    return _gather_nd(data, indices, 0)


@register("GatherND", since=12)
def gather_nd(data, indices, *, batch_dims):
    """GatherND-12+ (batch_dims; negative indices wrap)."""
    return _gather_nd(data, indices, int(batch_dims))


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
    a = _axis(axis, data.ndim)
    if indices.shape != updates.shape or indices.ndim != data.ndim:
        raise OpError(f"indices {list(indices.shape)} and updates "
                      f"{list(updates.shape)} must have one shape, of data's rank {data.ndim}")
    _check_in_range(indices, data.shape[a])
    idx = _wrap_indices(indices, data.shape[a])
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
    index, _ = _nd_index(data.shape, indices, 0)
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


@register("OneHot", since=9)
def one_hot(indices, depth, values, *, axis):
    """OneHot-9+ (negative indices wrap; out-of-range ones give all off_value)."""
    d = static(depth, "input 'depth'").reshape(-1)
    if d.size != 1:
        raise OpError("depth must be a scalar")
    d = int(d[0])
    if d < 1:
        raise OpError(f"depth {d} must be positive")
    xp = _xp(indices, values)
    idx = indices
    if np.dtype(idx.dtype).kind == "f" or np.dtype(idx.dtype) == jnp.bfloat16:
        idx = idx.astype(np.int64 if xp is np else jnp.int64)
    idx = _wrap_indices(idx, d)
    rank = idx.ndim
    a = axis + rank + 1 if axis < 0 else axis
    if not 0 <= a <= rank:
        raise OpError(f"axis {axis} out of range for rank {rank + 1}")
    targets = np.arange(d, dtype=np.dtype(idx.dtype)).reshape(
        (1,) * a + (d,) + (1,) * (rank - a))
    hot = xp.expand_dims(idx, a) == targets
    vals = xp.reshape(values, (-1,))
    return xp.where(hot, vals[1], vals[0])


def _top_k(x, k, axis, largest, sorted_):
    a = _axis(axis, x.ndim)
    k = int(k)
    if not 0 <= k <= x.shape[a]:
        raise OpError(f"k={k} is out of range for axis {a} of size "
                      f"{x.shape[a]}")
    xm = jnp.moveaxis(jnp.asarray(x), a, -1)
    if largest:
        key = xm
    elif jnp.issubdtype(xm.dtype, jnp.integer):
        key = ~xm  # order-reversing without overflow, for signed and unsigned
    else:
        key = -xm
    _, idx = jax.lax.top_k(key, k)
    vals = jnp.take_along_axis(xm, idx, axis=-1)
    idx = idx.astype(jnp.int64)
    return jnp.moveaxis(vals, -1, a), jnp.moveaxis(idx, -1, a)


@register("TopK", since=1)
def top_k_1(X, *, k, axis):
    """TopK-1..9 (k attribute; largest, sorted)."""
    return _top_k(X, k, axis, True, True)


@register("TopK", since=10)
def top_k_10(X, K, *, axis):
    """TopK-10 (k as an input; largest, sorted)."""
    return _top_k(X, static_ints(K, "input 'K'")[0], axis, True, True)


@register("TopK", since=11)
def top_k(X, K, *, axis, largest, sorted):  # noqa: A002  (spec name)
    """TopK-11+ (ties keep the lower index first; always sorted)."""
    return _top_k(X, static_ints(K, "input 'K'")[0], axis, largest, sorted)


def _cumulative(x, axis, exclusive, reverse, product):
    a = _axis(static_ints(axis, "input 'axis'")[0], x.ndim)
    y = jnp.asarray(x)
    if reverse:
        y = jnp.flip(y, a)
    c = (jnp.cumprod if product else jnp.cumsum)(y, axis=a, dtype=y.dtype)
    if exclusive:
        head_shape = list(y.shape)
        head_shape[a] = min(1, y.shape[a])
        head = (jnp.ones if product else jnp.zeros)(head_shape, y.dtype)
        body = jax.lax.slice_in_dim(c, 0, max(y.shape[a] - 1, 0), axis=a)
        c = jnp.concatenate([head, body], axis=a)
    if reverse:
        c = jnp.flip(c, a)
    return c


@register("CumSum", since=11)
def cum_sum(x, axis, *, exclusive, reverse):
    """CumSum-11+ (exclusive, reverse)."""
    return _cumulative(x, axis, exclusive, reverse, product=False)


@register("CumProd", since=26)
def cum_prod(x, axis, *, exclusive, reverse):
    """CumProd-26+ (exclusive, reverse)."""
    return _cumulative(x, axis, exclusive, reverse, product=True)


@register("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, mode, axis):
    """TensorScatter-24+ (KV-cache update; write_indices may be traced)."""
    nd = past_cache.ndim
    a = _axis(axis, nd)
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
    xp = _xp(write_indices)
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


# --------------------------------------------------------------------------- data-dependent shapes


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
    xp = _xp(x)
    if axis is None:
        x = xp.reshape(x, (-1,))
        a = 0
    else:
        a = _axis(axis, x.ndim)
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
        a = _axis(axis, x.ndim)
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
