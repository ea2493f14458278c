"""Image ops: Resize and the deprecated Upsample; ImageDecoder.

Resize is separable: for each resized axis the source taps (indices) and their
weights are computed with numpy at trace time from the static sizes/scales,
following ONNX's reference implementation, and applied with a gather and a
weighted sum along that axis (differentiable in the data). Nearest modes
reduce to a pure gather, so integer data and non-finite values stay exact.

ImageDecoder decodes with Pillow (the optional extra ``jaxort[image]``),
imported on first use, on an encoded stream known at trace time: the decoded
shape depends on the bytes.
"""

from __future__ import annotations

import io
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")


def _source_coords(mode, y, scale, in_w, out_w, out_int, roi):
    """Maps output positions ``y`` to input coordinates; returns (x, extrapolated mask)."""
    extrap = None
    if mode == "align_corners":
        x = np.zeros(out_int) if out_w == 1 else y * (in_w - 1) / (out_w - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    elif mode == "tf_crop_and_resize":
        if out_w == 1:
            x = np.full(out_int, (roi[1] - roi[0]) * (in_w - 1) / 2)
        else:
            x = y * (roi[1] - roi[0]) * (in_w - 1) / (out_w - 1)
        x = x + roi[0] * (in_w - 1)
        extrap = (x < 0) | (x > in_w - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out_int, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        adjustment = out_int / out_w
        offset = in_w / 2 * (1 - adjustment)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise OpError(f"unknown coordinate_transformation_mode {mode!r}")
    return np.asarray(x, np.float64), extrap


def _nearest_coeffs(ratio, nearest_mode, scale):
    if float(ratio).is_integer():
        return np.array([0.0, 1.0])
    if nearest_mode == "simple":  # opset < 11: floor when upsampling, ceil when downsampling
        nearest_mode = "ceil" if scale < 1 else "floor"
    if nearest_mode == "round_prefer_floor":
        return np.array([ratio <= 0.5, ratio > 0.5], np.float64)
    if nearest_mode == "round_prefer_ceil":
        return np.array([ratio < 0.5, ratio >= 0.5], np.float64)
    if nearest_mode == "floor":
        return np.array([1.0, 0.0])
    if nearest_mode == "ceil":
        return np.array([0.0, 1.0])
    raise OpError(f"unknown nearest_mode {nearest_mode!r}")


def _linear_coeffs(ratio, scale, antialias):
    if not antialias:
        return np.array([1 - ratio, ratio])
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, 2 - start) - ratio) * scale
    c = np.clip(1 - np.abs(args), 0, 1)
    return c / c.sum()


def _cubic_coeffs(ratio, scale, a, antialias):
    if not antialias:
        r = ratio
        return np.array([
            ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a,
        ])
    scale = min(scale, 1.0)
    start = int(np.floor(-2 / scale) + 1)
    x = np.abs(scale * (np.arange(start, 2 - start) - ratio))
    c = np.where(x <= 1, (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1,
                 np.where(x < 2, a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a, 0.0))
    return c / c.sum()


def _axis_taps(in_w, out_int, scale, roi, p):
    """Source indices (out, n), weights (out, n) and extrapolation mask for one axis."""
    out_w = scale * in_w
    y = np.arange(out_int, dtype=np.float64)
    x, extrap = _source_coords(p["ctm"], y, scale, in_w, out_w, out_int, roi)
    x_int = np.floor(x)
    ratios = np.where(x == x_int, 1.0, x - x_int)
    if p["mode"] == "nearest":
        coeffs = np.stack([_nearest_coeffs(r, p["nearest_mode"], scale) for r in ratios]) \
            if out_int else np.zeros((0, 2))
    elif p["mode"] == "linear":
        coeffs = np.stack([_linear_coeffs(r, scale, p["antialias"]) for r in ratios]) \
            if out_int else np.zeros((0, 2))
    elif p["mode"] == "cubic":
        coeffs = np.stack([_cubic_coeffs(r, scale, p["cubic_a"], p["antialias"])
                           for r in ratios]) if out_int else np.zeros((0, 4))
    else:
        raise OpError(f"unknown mode {p['mode']!r}")
    n = coeffs.shape[1]
    # The n input positions nearest to x (ties to the smaller index), as ONNX's reference.
    pad = int(np.ceil(n / 2))
    xp_ = x + pad
    p_int = np.floor(xp_).astype(np.int64)
    frac = xp_ - p_int
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    idx = (p_int + offset)[:, None] + np.arange(n)[None, :] - pad
    if p["exclude_outside"]:
        coeffs = np.where((idx < 0) | (idx >= in_w), 0.0, coeffs)
        total = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    idx = np.clip(idx, 0, in_w - 1)
    return idx, coeffs, extrap


def _resize_axis(x, axis, in_w, out_int, scale, roi, p, compute_dtype):
    idx, coeffs, extrap = _axis_taps(in_w, out_int, scale, roi, p)
    one_hot = (np.count_nonzero(coeffs, axis=1) == 1) & np.isclose(coeffs.max(axis=1, initial=0), 1)
    if coeffs.shape[0] == 0 or one_hot.all():
        src = idx[np.arange(idx.shape[0]), np.argmax(coeffs, axis=1)] if idx.size else \
            np.zeros((0,), np.int64)
        y = jnp.take(x, src, axis=axis)
    else:
        g = jnp.take(x, idx.reshape(-1), axis=axis)
        g = jnp.reshape(g, x.shape[:axis] + idx.shape + x.shape[axis + 1:])
        w = coeffs.astype(compute_dtype).reshape((1,) * axis + coeffs.shape
                                                 + (1,) * (x.ndim - axis - 1))
        y = jnp.sum(g.astype(compute_dtype) * w, axis=axis + 1)
    if extrap is not None and extrap.any():
        m = extrap.reshape((1,) * axis + (out_int,) + (1,) * (x.ndim - axis - 1))
        ev = p["extrapolation_value"]
        if np.dtype(y.dtype).kind in "iu":  # as the final saturating cast would round it
            info = np.iinfo(y.dtype)
            ev = np.clip(np.round(ev), info.min, info.max)
        y = jnp.where(m, jnp.asarray(ev, y.dtype), y)
    return y


def _interpolation_dtype(dtype):
    """The dtype Resize interpolates in: float32 for narrow inputs, else the widest float.

    float32 and float64 stay; float16, bfloat16 and 8/16-bit integers go to
    float32; wider integers go to float64 (float32 when x64 is off), so their
    coordinates and weighted sums do not lose integer precision.
    """
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        return dtype
    if dtype.kind == "f" or dtype == np.dtype(jnp.bfloat16) or dtype.itemsize <= 2:
        return np.dtype(np.float32)
    return np.dtype(jax.dtypes.canonicalize_dtype(np.float64))


def _resize(X, roi, scales, sizes, p, axes=None, policy="stretch"):
    x = jnp.asarray(X)
    r = x.ndim
    axes = list(range(r)) if axes is None else [a + r if a < 0 else a for a in axes]
    if any(not 0 <= a < r for a in axes) or len(set(axes)) != len(axes):
        raise OpError(f"invalid axes {axes} for rank {r}")
    n = len(axes)
    if scales is not None and sizes is not None:
        raise OpError("only one of scales and sizes may be given")
    if roi is not None:
        roi = list(roi)  # numpy scalars: (hi - lo) is computed in roi's precision, like ONNX's
        if len(roi) != 2 * n:
            raise OpError(f"roi has {len(roi)} values, expected {2 * n}")
    if sizes is not None:
        sizes = [int(v) for v in sizes]
        if len(sizes) != n:
            raise OpError(f"sizes has {len(sizes)} values, expected {n}")
        sc = [sizes[i] / x.shape[a] if x.shape[a] else 1.0 for i, a in enumerate(axes)]
        if policy != "stretch":
            if policy == "not_larger":
                s = min(sc)
            elif policy == "not_smaller":
                s = max(sc)
            else:
                raise OpError(f"unknown keep_aspect_ratio_policy {policy!r}")
            sc = [s] * n
            sizes = [int(s * x.shape[a] + 0.5) for a in axes]
    elif scales is not None:
        sc = [float(v) for v in scales]
        if len(sc) != n:
            raise OpError(f"scales has {len(sc)} values, expected {n}")
        if any(s <= 0 for s in sc):
            raise OpError(f"scales {sc} must be positive")
        sizes = [int(sc[i] * x.shape[a]) for i, a in enumerate(axes)]
    else:
        raise OpError("one of scales and sizes must be given")
    if p["mode"] == "nearest" and p["antialias"]:
        raise OpError("antialias is not supported with mode 'nearest'")
    if p["ctm"] not in _COORD_MODES:
        raise OpError(f"unknown coordinate_transformation_mode {p['ctm']!r}")
    dtype = x.dtype
    ct = _interpolation_dtype(dtype)
    y = x
    for i, a in enumerate(axes):
        lo, hi = (roi[i], roi[n + i]) if roi is not None else (0.0, 1.0)
        if (math.isclose(sc[i], 1.0) and sizes[i] == x.shape[a]
                and (p["ctm"] != "tf_crop_and_resize"
                     or (math.isclose(lo, 0.0) and math.isclose(hi, 1.0)))):
            continue
        if p["ctm"] == "tf_crop_and_resize" and roi is None:
            raise OpError("tf_crop_and_resize needs the roi input")
        if x.shape[a] == 0 and sizes[i]:
            raise OpError(f"cannot resize an empty axis {a}")
        y = _resize_axis(y, a, x.shape[a], sizes[i], sc[i], (lo, hi), p, ct)
    if y.dtype != dtype:
        if np.dtype(dtype).kind in "iu":
            info = jnp.iinfo(dtype)
            y = jnp.clip(jnp.round(y), info.min, info.max)
        y = y.astype(dtype)
    return y


def _opt(v, what):
    """A static optional float/int input, or None when absent or empty."""
    if v is None:
        return None
    v = static(v, what).reshape(-1)
    return None if v.size == 0 else v


def _params(mode, ctm="half_pixel", nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75,
            exclude_outside=0, extrapolation_value=0.0, antialias=0):
    return dict(mode=mode, ctm=ctm, nearest_mode=nearest_mode, cubic_a=float(cubic_coeff_a),
                exclude_outside=bool(exclude_outside),
                extrapolation_value=float(extrapolation_value), antialias=bool(antialias))


def _legacy(X, scales, mode):
    """Resize-10 / Upsample: asymmetric coordinates, nearest floors up and ceils down."""
    if mode not in ("nearest", "linear", "bilinear"):
        raise OpError(f"unsupported mode {mode!r}")
    mode = "linear" if mode == "bilinear" else mode
    return _resize(X, None, scales, None, _params(mode, "asymmetric", "simple"))


@register("Resize", since=10)
def resize_10(X, scales, *, mode):
    """Resize-10 (asymmetric coordinates, legacy nearest rounding)."""
    return _legacy(X, _opt(scales, "input 'scales'"), mode)


@register("Resize", since=11)
def resize_11(X, roi=None, scales=None, sizes=None, *, mode, coordinate_transformation_mode,
              nearest_mode, cubic_coeff_a, exclude_outside, extrapolation_value):
    """Resize-11..17 (roi/scales/sizes inputs; roi only used by tf_crop_and_resize)."""
    p = _params(mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a,
                exclude_outside, extrapolation_value)
    roi = _opt(roi, "input 'roi'") if coordinate_transformation_mode == "tf_crop_and_resize" \
        else None
    return _resize(X, roi, _opt(scales, "input 'scales'"), _opt(sizes, "input 'sizes'"), p)


@register("Resize", since=18)
def resize(X, roi=None, scales=None, sizes=None, *, mode, coordinate_transformation_mode,
           nearest_mode, cubic_coeff_a, exclude_outside, extrapolation_value, antialias,
           axes=None, keep_aspect_ratio_policy):
    """Resize-18+ (antialias, axes, keep_aspect_ratio_policy; half_pixel_symmetric from 19)."""
    p = _params(mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a,
                exclude_outside, extrapolation_value, antialias)
    roi = _opt(roi, "input 'roi'") if coordinate_transformation_mode == "tf_crop_and_resize" \
        else None
    return _resize(X, roi, _opt(scales, "input 'scales'"), _opt(sizes, "input 'sizes'"), p,
                   axes, keep_aspect_ratio_policy)


@register("Upsample", since=7)
def upsample_7(X, *, mode, scales):
    """Upsample-7..8 (scales attribute; asymmetric coordinates)."""
    return _legacy(X, np.asarray(scales, np.float32), mode)


@register("Upsample", since=9)
def upsample(X, scales, *, mode):
    """Upsample-9+ (scales input; asymmetric coordinates)."""
    return _legacy(X, _opt(scales, "input 'scales'"), mode)


_PIXEL_FORMATS = ("RGB", "BGR", "Grayscale")


@register("ImageDecoder", since=20)
def image_decoder(encoded_stream, *, pixel_format):
    """ImageDecoder-20 (Pillow decodes; static input only: the output shape depends on it)."""
    data = static(encoded_stream, "input 'encoded_stream' (the decoded image's shape depends on "
                  "its bytes)")
    if pixel_format not in _PIXEL_FORMATS:
        raise OpError(f"pixel_format must be one of {list(_PIXEL_FORMATS)}, got {pixel_format!r}")
    try:
        import PIL.Image
    except ImportError:
        raise OpError("ImageDecoder decodes with Pillow, which is not installed; install it with "
                      "pip install 'jaxort[image]'") from None
    try:
        with PIL.Image.open(io.BytesIO(np.asarray(data, np.uint8).tobytes())) as img:
            # RGB output is three channels whatever the file holds (gray, palette, alpha).
            img = img.convert("L" if pixel_format == "Grayscale" else "RGB")
            pixels = np.asarray(img, np.uint8)
    except (OSError, ValueError, SyntaxError) as e:  # Pillow's errors for unreadable data
        raise OpError(f"cannot decode input 'encoded_stream': {e}") from None
    if pixel_format == "Grayscale":
        return pixels[:, :, None]
    return np.ascontiguousarray(pixels[:, :, ::-1]) if pixel_format == "BGR" else pixels
