"""Sampling on coordinate grids: GridSample, AffineGrid and RoiAlign."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static, static_ints
from jaxort.graph.ops._common import gather_hw


def _reflect(x, lo, hi):
    """Reflects coordinates into [lo, hi] by the near border, repeatedly."""
    rng = hi - lo
    dlo = lo - x
    nlo = jnp.floor(dlo / rng)
    rlo = dlo - nlo * rng
    below = jnp.where(jnp.mod(nlo, 2) == 0, lo + rlo, hi - rlo)
    dhi = x - hi
    nhi = jnp.floor(dhi / rng)
    rhi = dhi - nhi * rng
    above = jnp.where(jnp.mod(nhi, 2) == 0, hi - rhi, lo + rhi)
    return jnp.where(x < lo, below, jnp.where(x > hi, above, x))


def _cubic_coeffs(t):
    a = -0.75
    t1, t2, t3 = t + 1, 1 - t, 2 - t
    return [((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1,
            ((a * t3 - 5 * a) * t3 + 8 * a) * t3 - 4 * a]


@register("GridSample", since=16)
def grid_sample(x, grid, *, align_corners, mode, padding_mode):
    """GridSample-16+ (bilinear/bicubic names of 16 accepted as linear/cubic; N-D from 20)."""
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    n, c = x.shape[:2]
    dims = x.shape[2:]
    nd = len(dims)
    out_sp = grid.shape[1:-1]
    cd = grid.dtype if np.dtype(grid.dtype).itemsize >= 4 else np.dtype(np.float32)
    coords = grid.astype(cd).reshape(n, -1, nd)[..., ::-1]  # (N, P, nd) in X's dim order
    taps_per_dim = []
    for i, length in enumerate(dims):
        v = coords[..., i]
        if align_corners:
            v = (v + 1) / 2 * (length - 1)
            lo, hi = 0.0, length - 1.0
        else:
            v = ((v + 1) * length - 1) / 2
            lo, hi = -0.5, length - 0.5
        if mode == "nearest":
            v = jnp.round(v)
        if padding_mode == "border":
            v = jnp.where((v < lo) | (v > hi), jnp.clip(v, 0, length - 1), v)
        elif padding_mode == "reflection":
            v = _reflect(v, lo, hi)

        def tap(idx, w, length=length, lo=lo, hi=hi):
            if padding_mode == "zeros":
                valid = (idx >= 0) & (idx < length)
                return jnp.clip(idx, 0, length - 1), jnp.where(valid, w, 0)
            if padding_mode == "border":
                return jnp.clip(idx, 0, length - 1), w
            r = jnp.trunc(_reflect(idx.astype(cd), lo, hi)).astype(jnp.int32)
            return jnp.clip(r, 0, length - 1), w

        if mode == "nearest":
            taps_per_dim.append([tap(v.astype(jnp.int32), jnp.ones_like(v))])
        else:
            f = jnp.floor(v)
            t = v - f
            i0 = f.astype(jnp.int32)
            if mode == "linear":
                ws, offs = [1 - t, t], [0, 1]
            elif mode == "cubic":
                ws, offs = _cubic_coeffs(t), [-1, 0, 1, 2]
            else:
                raise OpError(f"unknown mode {mode!r}")
            taps_per_dim.append([tap(i0 + o, w) for o, w in zip(offs, ws)])
    strides = np.cumprod((1,) + tuple(dims[::-1]))[:-1][::-1]
    flat_x = x.reshape(n, c, -1)
    y = jnp.zeros((n, c, coords.shape[1]), x.dtype)
    for combo in itertools.product(*taps_per_dim):
        flat = sum(idx * int(s) for (idx, _), s in zip(combo, strides))
        w = _product([w for _, w in combo])
        vals = jnp.take_along_axis(flat_x, flat[:, None, :], axis=2)
        y = y + (vals * w[:, None, :].astype(x.dtype)).astype(x.dtype)
    return y.reshape((n, c) + tuple(out_sp))


def _product(values):
    out = values[0]
    for v in values[1:]:
        out = out * v
    return out


@register("AffineGrid", since=20)
def affine_grid(theta, size, *, align_corners):
    """AffineGrid-20 (2-D and 3-D)."""
    size = static_ints(size, "input 'size'")
    n = size[0]
    sp = size[2:]
    axes = []
    for length in sp:
        if align_corners:
            a = np.linspace(-1.0, 1.0, length)
        else:
            a = (np.arange(length) * 2.0 + 1.0) / length - 1.0
        axes.append(a)
    # base coordinates in (x, y[, z]) order, i.e. reversed spatial dims, plus 1
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([m for m in mesh[::-1]] + [np.ones_like(mesh[0])], axis=-1)
    base = jnp.asarray(base.reshape(-1, len(sp) + 1).astype(np.dtype(theta.dtype)))
    grid = jnp.einsum("pk,nik->npi", base, theta)
    return grid.reshape((n,) + tuple(sp) + (len(sp),))


def _roi_axis(start, bin_size, pooled, grid, length):
    """Samples along one axis: low/high index, low/high weight, validity; (R, pooled, grid)."""
    p = jnp.arange(pooled, dtype=start.dtype).reshape(1, -1, 1)
    g = jnp.arange(grid, dtype=start.dtype).reshape(1, 1, -1)
    b = bin_size[:, None, None]
    v = start[:, None, None] + p * b + (g + 0.5) * b / grid
    valid = (v >= -1.0) & (v <= length)
    v = jnp.maximum(v, 0)
    lo = jnp.floor(v)
    at_end = lo >= length - 1
    lo = jnp.where(at_end, length - 1, lo)
    hi = jnp.where(at_end, length - 1, lo + 1)
    v = jnp.where(at_end, lo, v)
    frac = v - lo
    return lo.astype(jnp.int32), hi.astype(jnp.int32), 1 - frac, frac, valid


def _roi_align(x, rois, batch_indices, mode, oh, ow, grid_h, grid_w, scale, half_pixel):
    _, c, h, wd = x.shape
    offset = 0.5 if half_pixel else 0.0
    r = rois * scale - offset
    sw_, sh_, ew, eh = r[:, 0], r[:, 1], r[:, 2], r[:, 3]
    rw, rh = ew - sw_, eh - sh_
    if not half_pixel:
        rw, rh = jnp.maximum(rw, 1.0), jnp.maximum(rh, 1.0)
    ylo, yhi, wyl, wyh, vy = _roi_axis(sh_, rh / oh, oh, grid_h, h)
    xlo, xhi, wxl, wxh, vx = _roi_axis(sw_, rw / ow, ow, grid_w, wd)
    img = jnp.take(x, batch_indices.astype(jnp.int32), axis=0).reshape(rois.shape[0], c, h * wd)
    e = (slice(None), slice(None), slice(None), None, None)  # (R, oh, gh) -> (R, oh, gh, 1, 1)
    f = (slice(None), None, None, slice(None), slice(None))  # (R, ow, gw) -> (R, 1, 1, ow, gw)
    valid = (vy[e] & vx[f]).astype(x.dtype)
    terms = []
    for yi, wy in ((ylo, wyl), (yhi, wyh)):
        for xi, wx in ((xlo, wxl), (xhi, wxh)):
            idx = yi[e] * wd + xi[f]
            wgt = (wy[e] * wx[f]).astype(x.dtype) * valid
            terms.append(gather_hw(img, idx) * wgt[:, None])
    # terms: (R, C, oh, gh, ow, gw)
    if mode == "avg":
        y = sum(terms).sum(axis=(3, 5)) / max(grid_h * grid_w, 1)
    else:
        y = jnp.max(_maximum_all(terms), axis=(3, 5))
    return y.astype(x.dtype)


def _maximum_all(terms):
    out = terms[0]
    for t in terms[1:]:
        out = jnp.maximum(out, t)
    return out


@register("RoiAlign", since=10)
def roi_align(x, rois, batch_indices, *, mode, output_height, output_width, sampling_ratio,
              spatial_scale, coordinate_transformation_mode=None):
    """RoiAlign-10+ (half_pixel default from 16; sampling_ratio 0 needs static rois)."""
    half_pixel = coordinate_transformation_mode == "half_pixel"
    if sampling_ratio > 0:
        return _roi_align(x, rois, batch_indices, mode, output_height, output_width,
                          sampling_ratio, sampling_ratio, spatial_scale, half_pixel)
    r = np.asarray(static(rois, "input 'rois' (with sampling_ratio 0)"), np.float64)
    outs = []
    for i in range(r.shape[0]):
        box = r[i] * spatial_scale - (0.5 if half_pixel else 0.0)
        rh, rw = box[3] - box[1], box[2] - box[0]
        if not half_pixel:
            rh, rw = max(rh, 1.0), max(rw, 1.0)
        gh = max(int(np.ceil(rh / output_height)), 1)
        gw = max(int(np.ceil(rw / output_width)), 1)
        outs.append(_roi_align(x, rois[i:i + 1], batch_indices[i:i + 1], mode, output_height,
                               output_width, gh, gw, spatial_scale, half_pixel))
    return jnp.concatenate(outs, axis=0)
