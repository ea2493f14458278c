"""Data movement without arithmetic: Transpose, Concat, Split, Slice, Tile, Pad, DepthToSpace,
SpaceToDepth, CenterCropPad, Trilu and ReverseSequence.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static_ints
from jaxort.graph.ops._common import array_module, normalize_axes, normalize_axis


def _empty(x) -> bool:
    return x is None or (hasattr(x, "shape") and 0 in np.shape(x) and np.ndim(x) > 0)


@register("Transpose", since=1)
def transpose(data, *, perm=None):
    """Transpose-1+ (no perm reverses the axes)."""
    perm = list(range(data.ndim))[::-1] if perm is None else normalize_axes(perm, data.ndim, "perm")
    if len(perm) != data.ndim:
        raise OpError(f"perm {perm} does not match rank {data.ndim}")
    return array_module(data).transpose(data, perm)


def concat_values(inputs, axis):
    """Concat of the present ``inputs`` along ``axis`` (numpy when all are static)."""
    inputs = [x for x in inputs if x is not None]
    if not inputs:
        raise OpError("Concat needs at least one input")
    a = normalize_axis(axis, inputs[0].ndim)
    return array_module(*inputs).concatenate(inputs, axis=a)


@register("Concat", since=1)
def concat_1(*inputs, axis=None):
    """Concat-1..3 (axis defaults to 1)."""
    return concat_values(inputs, 1 if axis is None else axis)


@register("Concat", since=4)
def concat(*inputs, axis):
    """Concat-4+ (negative axis from 11)."""
    return concat_values(inputs, axis)


def split_values(x, axis, sizes, n):
    """``x`` split along ``axis`` into ``sizes`` (or ``n`` near-equal parts, the last smaller)."""
    a = normalize_axis(axis, x.ndim)
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
    return split_values(input, 0 if axis is None else axis, sizes, len(ctx.output_names))


@register("Split", since=2)
def split_2(input, *, split=None, axis, ctx):
    """Split-2..12 (split attribute; negative axis from 11)."""
    return split_values(input, axis, split or None, len(ctx.output_names))


@register("Split", since=13)
def split_13(input, split=None, *, axis, ctx):
    """Split-13..17 (split as an optional input)."""
    sizes = None if _empty(split) else static_ints(split, "input 'split'")
    return split_values(input, axis, sizes, len(ctx.output_names))


@register("Split", since=18)
def split(input, split=None, *, axis, num_outputs=None, ctx):
    """Split-18+ (num_outputs: uneven splits make the last part smaller)."""
    sizes = None if _empty(split) else static_ints(split, "input 'split'")
    if sizes is not None and num_outputs is not None:
        raise OpError("both the split input and num_outputs are given")
    n = num_outputs if num_outputs is not None else len(ctx.output_names)
    return split_values(input, axis, sizes, n)


def slice_index(shape, starts, ends, axes, steps) -> tuple:
    """The index (a tuple of Python slices) ONNX's Slice reads from a tensor of ``shape``."""
    rank = len(shape)
    if axes is None:
        axes = list(range(len(starts)))
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise OpError("starts, ends, axes and steps differ in length")
    normalize_axes(axes, rank)  # validates range and duplicates
    idx = [slice(None)] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = normalize_axis(a, rank)
        dim = shape[a]
        if st == 0:
            raise OpError(f"step is 0 on axis {a}")
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        idx[a] = slice(s, e if e >= 0 else None, st)
    return tuple(idx)


def _slice(data, starts, ends, axes, steps):
    return data[slice_index(data.shape, starts, ends, axes, steps)]


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


@register("Tile", since=1)
def tile_1(input, tiles, axis):
    """Tile-1..5 (tiles copies along one axis, both inputs)."""
    reps = [1] * input.ndim
    reps[normalize_axis(static_ints(axis, "input 'axis'")[0], input.ndim)] = \
        static_ints(tiles, "input 'tiles'")[0]
    return array_module(input).tile(input, reps)


@register("Tile", since=6)
def tile(input, repeats):
    """Tile-6+."""
    reps = static_ints(repeats, "input 'repeats'")
    if len(reps) != input.ndim or any(r < 0 for r in reps):
        raise OpError(f"repeats {reps} does not fit rank {input.ndim}")
    return array_module(input).tile(input, reps)


def _pad(data, pads, mode, value, axes=None):
    rank = data.ndim
    axes = list(range(rank)) if axes is None else normalize_axes(axes, rank)
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
        xp = array_module(data, value)
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
    return array_module(data).pad(data, width, mode=mode)


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
    xp = array_module(x)
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
    xp = array_module(x)
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
    axes = list(range(x.ndim)) if axes is None else normalize_axes(axes, x.ndim)
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
    return array_module(x).pad(x, width, mode="constant")


@register("Trilu", since=14)
def trilu(input, k=None, *, upper):
    """Trilu-14+."""
    kk = 0 if k is None else static_ints(k, "input 'k'")[0]
    if input.ndim < 2:
        raise OpError("input must have rank >= 2")
    n, m = input.shape[-2:]
    ones = np.ones((n, m), bool)
    mask = np.triu(ones, kk) if upper else np.tril(ones, kk)
    xp = array_module(input)
    return xp.where(mask, input, xp.zeros((), input.dtype))


@register("ReverseSequence", since=10)
def reverse_sequence(input, sequence_lens, *, batch_axis, time_axis):
    """ReverseSequence-10+ (sequence_lens may be traced)."""
    x = input
    b, t = normalize_axis(batch_axis, x.ndim), normalize_axis(time_axis, x.ndim)
    xp = array_module(x, sequence_lens)
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
