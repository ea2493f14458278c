"""Convolutions: Conv, ConvTranspose, DeformConv, Col2Im and the quantized ConvInteger and QLinearConv."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxort.errors import OpError
from jaxort.graph import register, static_ints
from jaxort.graph.ops._common import (
    MAX_TAPS,
    auto_pads,
    channel_shape,
    fence,
    gather_hw,
    has_tangent,
    on_cpu_else,
    per_axis,
    requantize,
    spatial_attrs,
    stacked_taps,
    sum_tangents,
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
    cols = stacked_taps(xt, w.shape[2:], strides, dilations, out, spatial=3, axis=2)
    cols = jnp.reshape(cols, (group, cg * taps, n * math.prod(out)))
    wm = jnp.reshape(w, (group, m, cg * taps))
    y = lax.dot_general(wm, cols, (((2,), (1,)), ((0,), (0,))))  # (group, m, n * positions)
    y = jnp.moveaxis(jnp.reshape(y, (group * m, n) + out), 1, 0)
    return y


def _conv_columns_last(x, w, spec):
    """A one-group convolution as a product with channels-last columns (batch, *out, taps x channels).

    Its transpose in the input (the input gradient) is one matrix product
    and a col2im sum of shifted slices, which beats XLA's CPU input
    gradient when the input has few channels (W3's 6 -> 16 5x5 over 64
    14x14 maps: 2.85 -> 1.07 ms; 3 -> 16 over 16 64x64 maps: 5.3 -> 1.9 ms)
    and loses from 16 channels on (16 -> 32 over 32 32x32 maps: 3.1 -> 5.7 ms).
    """
    strides, dilations, padding, _, out = spec
    n, c = x.shape[:2]
    taps = math.prod(w.shape[2:])
    xt = jnp.moveaxis(jnp.pad(x, ((0, 0), (0, 0)) + padding), 1, -1)
    cols = stacked_taps(xt, w.shape[2:], strides, dilations, out, spatial=1, axis=1 + len(out))
    cols = jnp.reshape(cols, (n,) + out + (taps * c,))
    wm = jnp.reshape(jnp.moveaxis(w, 1, -1), (w.shape[0], taps * c))
    y = lax.dot_general(cols, wm, (((cols.ndim - 1,), (1,)), ((), ())))  # (n, *out, m)
    return jnp.moveaxis(y, -1, 1)


def _conv_taps(x, w, spec):
    """A convolution as a sum of shifted inputs times weights, one term per (input channel, tap).

    One elementwise loop with no columns in memory: W3's 1 -> 6 channel
    5x5 conv of 64 28x28 images takes 0.46 ms this way (columns 1.17 ms,
    XLA's 3.6 ms on one core). XLA would copy so cheap-looking a loop into
    each of its consumers, so :func:`_conv_planned` fences its result.
    """
    strides, dilations, padding, group, out = spec
    n, c = x.shape[:2]
    cg, m = c // group, w.shape[0] // group
    ones = (1,) * len(out)
    padded = tuple(p + lo + hi for p, (lo, hi) in zip(x.shape[2:], padding))
    xg = jnp.reshape(jnp.pad(x, ((0, 0), (0, 0)) + padding), (n, group, cg) + padded)
    wg = jnp.reshape(w, (group, m, cg) + w.shape[2:])
    acc = None
    for offs, sl in tap_slices(w.shape[2:], strides, dilations, out):
        xs = xg[(slice(None),) * 3 + sl]  # (n, group, cg, *out)
        for ci in range(cg):
            term = xs[:, :, ci:ci + 1] * jnp.reshape(wg[(slice(None), slice(None), ci) + offs],
                                                      (1, group, m) + ones)
            acc = term if acc is None else acc + term
    return jnp.reshape(acc, (n, group * m) + out)


_FORMS = {"xla": _xla_conv, "columns": _conv_columns, "columns_last": _conv_columns_last,
          "taps": _conv_taps}


class _Plan(NamedTuple):
    """How a convolution runs on CPU: a form (``_FORMS``) per pass, and where to fence.

    ``input_grad`` and ``filter_grad`` name the forms of the tangent in the
    input and in the filter; reverse mode runs their transposes. A fence
    (:func:`fence`) keeps XLA from fusing a tensor into each of its users:
    ``fence_input`` the input of the forward form, ``fence_output`` its
    result, ``fence_input_grad`` the input gradient, ``fence_output_grad``
    the gradient of the output where the input gradient reads it, and
    ``fence_operand`` the input before every pass (forward and filter
    gradient) reads it.
    """

    forward: str
    input_grad: str
    filter_grad: str
    fence_input: bool = False
    fence_output: bool = False
    fence_input_grad: bool = False
    fence_output_grad: bool = False
    fence_operand: bool = False


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _conv_planned(x, w, spec, plan):
    """A convolution on CPU, each pass in the form ``plan`` (a :class:`_Plan`) picks."""
    if plan.fence_input:
        x = fence(x, w)
    y = _FORMS[plan.forward](x, w, spec)
    return fence(y, w) if plan.fence_output else y


def _conv_planned_jvp(spec, plan, primals, tangents):
    x, w = primals
    dx, dw = tangents
    y = _conv_planned(x, w, spec, plan)
    parts = []
    if has_tangent(dx):
        # A fence on the tangent is, transposed, a fence on the input gradient;
        # one on the form's result, a fence on the output's gradient.
        part = _FORMS[plan.input_grad](fence(dx, w) if plan.fence_input_grad else dx, w, spec)
        parts.append(fence(part, w) if plan.fence_output_grad else part)
    if has_tangent(dw):
        parts.append(_FORMS[plan.filter_grad](x, dw, spec))
    return y, sum_tangents(parts, y.shape, y.dtype)


_conv_planned.defjvp(_conv_planned_jvp, symbolic_zeros=True)


# Column gradients pay for small convolutions: below this many column
# values, XLA's CPU convolution costs more in fixed overhead than the work.
_SMALL_COLUMNS = 1 << 16
# A kernel larger than its map takes the columns from this many column values;
# below, XLA's swapped convolution costs less than three column passes (W6's
# ResNet-18 at widths 3-24 over 2x2 and 1x1 maps: 1.4 ms a step, 1.8 ms as columns).
_SWAP_COLUMNS = 1 << 13
# The tap form for at most this many (input channel, tap) terms a convolution...
_TAP_TERMS = 32
# ... with at least this many output values; fences for tensors of at least as many.
_FENCE_ELEMENTS = 1 << 15
# ... and fences the input of a convolution XLA runs itself from this many values.
_FENCE_OPERAND_ELEMENTS = 1 << 19


def _column_count(x, w, spec) -> int:
    """Values in a convolution's columns (all groups)."""
    return x.shape[1] * math.prod(w.shape[2:]) * x.shape[0] * math.prod(spec[4])


def _columns_fit(x, w, spec, preferred, limit: int | None = _COLUMN_ELEMENTS) -> bool:
    """Whether the column forms can express a convolution, within ``limit`` column values (None: any)."""
    _, _, padding, group, out = spec
    c = x.shape[1]
    return (preferred is None and x.dtype in (jnp.float32, jnp.float64) and w.dtype == x.dtype
            and c % group == 0 and w.shape[0] % group == 0 and w.shape[1] == c // group
            and all(o > 0 for o in out) and all(p >= 0 for pair in padding for p in pair)
            and (limit is None or _column_count(x, w, spec) <= limit))


def _cpu_plan(x, w, spec, preferred) -> _Plan | None:
    """The :class:`_Plan` of a convolution on CPU, or None for XLA's convolution and derivatives.

    Where XLA's CPU convolution is slow (few input channels per group) the passes run as taps or
    columns; a strided, small or 1x1 convolution's filter gradient is one product with the columns
    (XLA runs it as a window-dilated convolution, in a slow generic loop); grouped ones use columns
    throughout, or taps when their columns would not fit. Large tensors XLA would recompute in
    several fusions are fenced. The choices are measured train steps: docs/benchmarks.md, "What
    `_cpu_plan` picks".
    """
    strides, dilations, _, group, out = spec
    cg = x.shape[1] // group
    taps = math.prod(w.shape[2:])
    few = cg <= _COLUMN_CHANNELS and taps <= MAX_TAPS
    if not _columns_fit(x, w, spec, preferred):
        if group > 1 and few and _columns_fit(x, w, spec, preferred, limit=None):
            # A depthwise convolution over large maps: its columns would not fit, and XLA
            # computes its filter gradient as a full (channels x channels) convolution.
            return _Plan("taps", "taps", "taps", fence_output=True, fence_output_grad=True)
        return None
    strided = any(s != 1 for s in strides)
    if group > 1:
        return _Plan("columns", "columns", "columns", fence_output_grad=True) if few else None
    columns = _column_count(x, w, spec)
    if columns > _SWAP_COLUMNS and any(
            min(size, o) < (k - 1) * d + 1 for size, o, k, d in zip(x.shape[2:], out, w.shape[2:], dilations)):
        # A kernel larger than its input or output (a 3x3 over ResNet's last
        # 2x2 maps, or onto them): XLA swaps the operands of the convolution
        # (or of its input gradient) and runs the result at ~1 GFLOP/s; the
        # columns of so small a map are a few rows.
        return _Plan("columns", "columns", "columns")
    small = columns <= _SMALL_COLUMNS
    if taps == 1 and not few and not small:
        # A pointwise convolution is a matrix product over channels-last pixels: XLA's CPU
        # convolution ran ResNet-50's at 20-50 GFLOP/s forward and backward, the product
        # (transposes included) at 50-170.
        return _Plan("columns_last", "columns_last", "columns_last")
    large_input = x.size >= _FENCE_ELEMENTS
    fence_operand = x.size >= _FENCE_OPERAND_ELEMENTS
    if not (few or strided):
        if small:
            return _Plan("xla", "xla", "columns")
        # XLA's own passes on working-size maps (pointwise ones took the product above), the
        # input read once: XLA would recompute a residual stream's whole chain of elementwise
        # producers in each pass.
        return _Plan("xla", "xla", "xla", fence_operand=True) if fence_operand else None
    # A 1x1 convolution's columns are its input: one matrix product, nothing to slice or fence.
    if few and 1 < taps and cg * taps <= _TAP_TERMS and x.shape[0] * w.shape[0] * math.prod(out) >= _FENCE_ELEMENTS:
        forward, fence_input, fence_output = "taps", False, True
    elif few:
        forward, fence_input, fence_output = "columns", large_input and taps > 1, False
    else:
        forward, fence_input, fence_output = "xla", False, False
    if strided or not few:
        input_grad = "xla"
    else:
        input_grad = "columns" if small else "columns_last"
    filter_grad = "columns" if small or strided else "xla"
    return _Plan(forward, input_grad, filter_grad, fence_input, fence_output,
                 input_grad == "columns_last" and large_input,
                 fence_operand=not few and fence_operand)


def _conv(x, w, b, *, auto_pad, dilations, group, kernel_shape, pads, strides,
          preferred=None):
    kernel, strides, dilations = spatial_attrs(x, w.shape[2:], kernel_shape, strides, dilations)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    padding = auto_pads(x.shape[2:], eff, strides, auto_pad, pads)
    out = tuple((size + lo + hi - e) // s + 1
                for size, (lo, hi), e, s in zip(x.shape[2:], padding, eff, strides))
    spec = (tuple(strides), tuple(dilations), tuple(map(tuple, padding)), group, out)
    plan = _cpu_plan(x, w, spec, preferred) if list(kernel) == list(w.shape[2:]) else None
    if plan is not None:
        y = on_cpu_else(x, lambda x: _conv_planned(fence(x, w) if plan.fence_operand else x, w, spec, plan),
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
