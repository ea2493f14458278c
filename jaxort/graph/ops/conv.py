"""Convolutions: Conv, ConvTranspose, DeformConv, Col2Im and the quantized ConvInteger and QLinearConv."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jaxort.errors import OpError
from jaxort.graph import register, static_ints
from jaxort.graph.ops._common import (
    MAX_TAPS,
    auto_pads,
    channel_shape,
    gather_hw,
    on_cpu_else,
    per_axis,
    requantize,
    spatial_attrs,
    tap_slices,
)


def _dim_numbers(n: int):
    spec = tuple(range(n + 2))
    return lax.ConvDimensionNumbers(spec, spec, spec)


# Convolutions with at most this many input channels per group take the
# im2col form on CPU (see _conv_columns), while their columns stay under
# _COLUMN_ELEMENTS values (128 MB of float32).
_COLUMN_CHANNELS = 8
_COLUMN_ELEMENTS = 1 << 25


def _xla_conv(x, w, spec, preferred=None):
    strides, dilations, padding, group, _ = spec
    return lax.conv_general_dilated(
        x, w, window_strides=strides, padding=padding, rhs_dilation=dilations,
        dimension_numbers=_dim_numbers(x.ndim - 2), feature_group_count=group,
        preferred_element_type=preferred)


def _conv_columns(x, w, spec):
    """A convolution as one (batched over groups) matrix product with the input's columns.

    The columns hold, for every output position, the input values under each
    kernel tap: (group, channels per group x taps, batch x output positions),
    built from strided slices of the padded input (im2col). XLA's CPU
    convolution is slow when a group has few input channels (a grey image's
    first layer, depthwise convolutions): W3's 1 -> 6 channel 5x5 conv of 64
    28x28 images takes ~5 ms there and ~0.8 ms this way, a depthwise 3x3 of
    32 channels 8 ms and 1.7 ms, and its input gradient 8 ms and 0.6 ms.
    """
    strides, dilations, padding, group, out = spec
    n, c = x.shape[:2]
    cg, m = c // group, w.shape[0] // group
    taps = math.prod(w.shape[2:])
    xp = jnp.pad(x, ((0, 0), (0, 0)) + padding)
    # (group, cg, n, *padded) so that every slice below is already in column order
    xt = jnp.moveaxis(jnp.reshape(xp, (n, group, cg) + xp.shape[2:]), 0, 2)
    lead = (slice(None),) * 3
    cols = jnp.stack([xt[lead + sl] for _, sl in tap_slices(w.shape[2:], strides, dilations, out)],
                     axis=2)
    cols = jnp.reshape(cols, (group, cg * taps, n * math.prod(out)))
    wm = jnp.reshape(w, (group, m, cg * taps))
    y = lax.dot_general(wm, cols, (((2,), (1,)), ((0,), (0,))))  # (group, m, n * positions)
    y = jnp.moveaxis(jnp.reshape(y, (group * m, n) + out), 1, 0)
    return y


# Column gradients pay for small convolutions: below this many column
# values, XLA's CPU convolution costs more in fixed overhead than the work.
_SMALL_COLUMNS = 1 << 16


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _conv_picked_grads(x, w, spec, columns_forward):
    """A one-group convolution on CPU, each pass the faster of XLA's and the column form's.

    The forward pass is :func:`_conv_columns` when ``columns_forward``
    (few input channels, see :func:`_columns_pay`), else XLA's; the
    derivatives were picked by measuring train steps (W3, W6 of the
    benchmark suite, one core):

    - the filter gradient of a strided convolution is, through XLA, a
      window-dilated convolution that XLA's CPU backend runs in a slow
      generic loop (ResNet-18's 7x7 stride-2 stem: 270 us for 3 channels;
      a 1x1 stride-2 64 -> 128 one over 8 56x56 maps: 6.5 ms); as the
      transpose of the column form it is one matrix product with the
      columns (for the stem, fwd + filter gradient 468 -> 243 us; the 1x1
      one 2.1 ms). Small convolutions gain the same way (28 -> 13 us).
    - the input gradient of a small stride-1 convolution is cheaper as the
      column form's transpose (col2im); strided or large ones (W3's 6 -> 16
      5x5 over 64 12x12 maps) keep XLA's, which the column form loses to
      in a whole step (W3 0.59x with it).
    """
    return _conv_columns(x, w, spec) if columns_forward else _xla_conv(x, w, spec)


def _conv_picked_grads_jvp(spec, columns_forward, primals, tangents):
    x, w = primals
    dx, dw = tangents
    y = _conv_picked_grads(x, w, spec, columns_forward)
    strided = any(s != 1 for s in spec[0])
    small = _column_count(x, w, spec) <= _SMALL_COLUMNS
    parts = []
    if not isinstance(dx, SymbolicZero):
        columns = columns_forward and small and not strided
        parts.append(_conv_columns(dx, w, spec) if columns else _xla_conv(dx, w, spec))
    if not isinstance(dw, SymbolicZero):
        parts.append(_conv_columns(x, dw, spec) if small or strided else _xla_conv(x, dw, spec))
    dy = functools.reduce(jnp.add, parts) if parts else jnp.zeros_like(y)
    return y, dy


_conv_picked_grads.defjvp(_conv_picked_grads_jvp, symbolic_zeros=True)


def _conv_cpu(x, w, spec):
    if spec[3] == 1:
        return _conv_picked_grads(x, w, spec, True)
    # Grouped (depthwise): XLA's filter and input gradients are slow too.
    return _conv_columns(x, w, spec)


def _column_count(x, w, spec) -> int:
    """Values in a convolution's columns (all groups)."""
    return x.shape[1] * math.prod(w.shape[2:]) * x.shape[0] * math.prod(spec[4])


def _columns_fit(x, w, spec, preferred) -> bool:
    """Whether the column form can express a convolution, within _COLUMN_ELEMENTS values."""
    _, _, padding, group, out = spec
    c = x.shape[1]
    return (preferred is None and x.dtype in (jnp.float32, jnp.float64) and w.dtype == x.dtype
            and c % group == 0 and w.shape[0] % group == 0 and w.shape[1] == c // group
            and all(o > 0 for o in out) and all(p >= 0 for pair in padding for p in pair)
            and _column_count(x, w, spec) <= _COLUMN_ELEMENTS)


def _columns_pay(x, w, spec, preferred) -> bool:
    """Whether a convolution takes the column form when it runs on CPU."""
    return (_columns_fit(x, w, spec, preferred) and x.shape[1] // spec[3] <= _COLUMN_CHANNELS
            and math.prod(w.shape[2:]) <= MAX_TAPS)


def _filter_columns_pay(x, w, spec, preferred) -> bool:
    """Whether a convolution on XLA's forward path takes its filter gradient from columns on CPU."""
    return spec[3] == 1 and any(s != 1 for s in spec[0]) and _columns_fit(x, w, spec, preferred)


def _conv(x, w, b, *, auto_pad, dilations, group, kernel_shape, pads, strides,
          preferred=None):
    kernel, strides, dilations = spatial_attrs(x, w.shape[2:], kernel_shape, strides, dilations)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    padding = auto_pads(x.shape[2:], eff, strides, auto_pad, pads)
    out = tuple((size + lo + hi - e) // s + 1
                for size, (lo, hi), e, s in zip(x.shape[2:], padding, eff, strides))
    spec = (tuple(strides), tuple(dilations), tuple(map(tuple, padding)), group, out)
    if list(kernel) == list(w.shape[2:]) and _columns_pay(x, w, spec, preferred):
        y = on_cpu_else(x, lambda x: _conv_cpu(x, w, spec), lambda x: _xla_conv(x, w, spec))
    elif list(kernel) == list(w.shape[2:]) and _filter_columns_pay(x, w, spec, preferred):
        y = on_cpu_else(x, lambda x: _conv_picked_grads(x, w, spec, False),
                        lambda x: _xla_conv(x, w, spec))
    else:
        y = _xla_conv(x, w, spec, preferred)
    if b is not None:
        y = y + jnp.reshape(b, channel_shape(y)).astype(y.dtype)
    return y


@register("Conv", since=1)
def conv(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    """Conv-1+ (1-D/2-D/3-D, groups, dilations, auto_pad)."""
    return _conv(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)


@register("ConvInteger", since=10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad, dilations, group,
                 kernel_shape, pads, strides):
    """ConvInteger-10 (int32 accumulation; padding uses the zero point)."""
    xi = x.astype(jnp.int32)
    wi = w.astype(jnp.int32)
    if x_zero_point is not None:
        xi = xi - jnp.asarray(x_zero_point).astype(jnp.int32)
    if w_zero_point is not None:
        wi = wi - per_axis(w_zero_point, w.ndim, 0).astype(jnp.int32)
    return _conv(xi, wi, None, auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides,
                 preferred=jnp.int32)


@register("QLinearConv", since=10)
def q_linear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                  b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    """QLinearConv-10 (int32 accumulation, float32 requantization)."""
    acc = conv_integer(x, w, x_zero_point, w_zero_point, auto_pad=auto_pad,
                       dilations=dilations, group=group, kernel_shape=kernel_shape,
                       pads=pads, strides=strides)
    if b is not None:
        acc = acc + jnp.reshape(b, channel_shape(acc)).astype(jnp.int32)
    scale = (jnp.asarray(x_scale).astype(jnp.float32)
             * jnp.reshape(jnp.asarray(w_scale).astype(jnp.float32), (-1,) + (1,) * (acc.ndim - 2))
             if np.ndim(w_scale) == 1 else
             jnp.asarray(x_scale).astype(jnp.float32) * jnp.asarray(w_scale).astype(jnp.float32))
    y = acc.astype(jnp.float32) * scale / jnp.asarray(y_scale).astype(jnp.float32)
    return requantize(y, 1.0, y_zero_point, np.dtype(y_zero_point.dtype))


def _transpose_kernel(w, group):
    """(C_in, C_out/g, k...) -> (C_out, C_in/g, k...) flipped: ConvTranspose as a Conv."""
    c_in, c_out_g = w.shape[:2]
    k = w.shape[2:]
    w = jnp.reshape(w, (group, c_in // group, c_out_g) + k)
    w = jnp.swapaxes(w, 1, 2)
    w = jnp.reshape(w, (group * c_out_g, c_in // group) + k)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


@register("ConvTranspose", since=1)
def conv_transpose(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, output_padding,
                   output_shape, pads, strides):
    """ConvTranspose-1+ (output_shape takes precedence over pads, as the spec says)."""
    kernel, strides, dilations = spatial_attrs(x, w.shape[2:], kernel_shape, strides, dilations)
    n = x.ndim - 2
    in_sp = x.shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    out_pad = list(output_padding) if output_padding is not None else [0] * n
    out_pad = out_pad[-n:] if len(out_pad) >= n else out_pad + [0] * (n - len(out_pad))
    full = [strides[i] * (in_sp[i] - 1) + out_pad[i] + eff[i] for i in range(n)]
    if output_shape is not None or (pads is None and auto_pad in ("SAME_UPPER", "SAME_LOWER")):
        target = (list(output_shape)[-n:] if output_shape is not None
                  else [in_sp[i] * strides[i] for i in range(n)])
        padding = []
        for i in range(n):
            total = full[i] - target[i]
            small, big = total // 2, total - total // 2
            if total < 0:  # a larger output_shape extends at the end (ORT and the reference)
                padding.append((0, total))
            else:
                padding.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    elif pads is not None and auto_pad in ("NOTSET", "", None):
        padding = [(pads[i], pads[i + n]) for i in range(n)]
    else:
        padding = [(0, 0)] * n
    conv_pad = [(eff[i] - 1 - lo, eff[i] - 1 - hi + out_pad[i])
                for i, (lo, hi) in enumerate(padding)]
    y = lax.conv_general_dilated(
        x, _transpose_kernel(w, group), window_strides=[1] * n, padding=conv_pad,
        lhs_dilation=strides, rhs_dilation=dilations, dimension_numbers=_dim_numbers(n),
        feature_group_count=group)
    if b is not None:
        y = y + jnp.reshape(b, channel_shape(y)).astype(y.dtype)
    return y


@register("Col2Im", since=18)
def col2im(x, image_shape, block_shape, *, dilations, pads, strides):
    """Col2Im-18 (N-D)."""
    image = static_ints(image_shape, "input 'image_shape'")
    block = static_ints(block_shape, "input 'block_shape'")
    n = len(image)
    dilations = list(dilations) if dilations is not None else [1] * n
    strides = list(strides) if strides is not None else [1] * n
    pads = list(pads) if pads is not None else [0] * (2 * n)
    padded = [image[i] + pads[i] + pads[i + n] for i in range(n)]
    out = [(padded[i] - ((block[i] - 1) * dilations[i] + 1)) // strides[i] + 1 for i in range(n)]
    # Static map: (block tap, block position) -> flat index in the padded image.
    tap = np.stack(np.meshgrid(*[np.arange(b) for b in block], indexing="ij"), -1).reshape(-1, n)
    pos = np.stack(np.meshgrid(*[np.arange(o) for o in out], indexing="ij"), -1).reshape(-1, n)
    coord = tap[:, None, :] * np.array(dilations) + pos[None, :, :] * np.array(strides)
    pstrides = np.cumprod((1,) + tuple(padded[::-1]))[:-1][::-1]
    flat = (coord * pstrides).sum(-1).reshape(-1)
    nb, ck, _ = x.shape
    c = ck // int(np.prod(block))
    y = jnp.zeros((nb, c, int(np.prod(padded))), x.dtype)
    y = y.at[:, :, flat].add(x.reshape(nb, c, -1))
    y = y.reshape((nb, c) + tuple(padded))
    sl = tuple(slice(pads[i], pads[i] + image[i]) for i in range(n))
    return y[(slice(None), slice(None)) + sl]


def _bilinear_zeros(img, py, px, h, w):
    """Samples img (B, C, H*W) at pixel coords py, px (B, ...); zero outside (align_corners)."""
    y0 = jnp.floor(py)
    x0 = jnp.floor(px)
    out = 0
    for dy in (0, 1):
        for dx in (0, 1):
            yi = y0 + dy
            xi = x0 + dx
            wy = 1 - jnp.abs(py - yi)
            wx = 1 - jnp.abs(px - xi)
            valid = (yi >= 0) & (yi <= h - 1) & (xi >= 0) & (xi <= w - 1)
            idx = (jnp.clip(yi, 0, h - 1) * w + jnp.clip(xi, 0, w - 1)).astype(jnp.int32)
            wgt = jnp.where(valid, wy * wx, 0).astype(img.dtype)
            out = out + gather_hw(img, idx) * wgt[:, None]
    return out


@register("DeformConv", since=19)
def deform_conv(x, w, offset, b=None, mask=None, *, dilations, group, kernel_shape, offset_group,
                pads, strides):
    """DeformConv-19+ (2-D)."""
    if x.ndim != 4:
        raise OpError(f"jaxort implements 2-D DeformConv only, input shape "
                      f"{list(x.shape)}")
    n, c, h, wd = x.shape
    oc = w.shape[0]
    kh, kw = list(kernel_shape) if kernel_shape is not None else list(w.shape[2:])
    sh, sw = list(strides) if strides is not None else [1, 1]
    dh, dw = list(dilations) if dilations is not None else [1, 1]
    pads = list(pads) if pads is not None else [0, 0, 0, 0]
    oh, ow = offset.shape[2:]
    og = offset_group
    off = offset.reshape(n, og, kh, kw, 2, oh, ow)
    ky = (dh * np.arange(kh))[:, None, None, None]
    oy = (-pads[0] + sh * np.arange(oh))[None, None, :, None]
    kx = (dw * np.arange(kw))[None, :, None, None]
    ox = (-pads[1] + sw * np.arange(ow))[None, None, None, :]
    py = (ky + oy).astype(np.dtype(offset.dtype)) + off[:, :, :, :, 0]  # (N, og, kh, kw, oh, ow)
    px = (kx + ox).astype(np.dtype(offset.dtype)) + off[:, :, :, :, 1]
    img = x.reshape(n * og, c // og, h * wd)
    s = _bilinear_zeros(img, py.reshape((n * og,) + py.shape[2:]),
                        px.reshape((n * og,) + px.shape[2:]), h, wd)
    s = s.reshape(n, og, c // og, kh, kw, oh, ow)
    if mask is not None:
        s = s * mask.reshape(n, og, 1, kh, kw, oh, ow).astype(s.dtype)
    s = s.reshape(n, group, c // group, kh, kw, oh, ow)
    wg = w.reshape(group, oc // group, c // group, kh, kw)
    y = jnp.einsum("ngckhij,gockh->ngoij", s, wg).reshape(n, oc, oh, ow).astype(x.dtype)
    if b is not None:
        y = y + jnp.reshape(b, (1, -1, 1, 1)).astype(y.dtype)
    return y
