"""Neural-network ops: matrix products, convolution, pooling, normalization, softmax.

Also the quantized products (MatMulInteger, QLinearConv...), attention and the
sampling ops (GridSample, RoiAlign, AffineGrid). Recurrent ops live in ``rnn.py``.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxort.errors import OpError
from jaxort.graph import register, static, static_ints
from jaxort.graph.ops._common import at_least_float32, is_floating, lowest_value


# ---------------------------------------------------------------------------
# helpers


def _stash_dtype(dtype, stash_type):
    """The dtype normalization statistics are computed in (stash_type 1 = float32 or wider)."""
    return at_least_float32(dtype) if stash_type == 1 else np.dtype(dtype)


def _channel_shape(x):
    """Shape (1, C, 1, ..., 1) for broadcasting a per-channel vector onto ``x``."""
    return (1, -1) + (1,) * (x.ndim - 2)


def _spatial_attrs(x, w_spatial, kernel_shape, strides, dilations):
    n = x.ndim - 2
    kernel = list(kernel_shape) if kernel_shape is not None else list(w_spatial)
    strides = list(strides) if strides is not None else [1] * n
    dilations = list(dilations) if dilations is not None else [1] * n
    if len(kernel) != n or len(strides) != n or len(dilations) != n:
        raise OpError(
            f"input has {n} spatial dims (shape {list(x.shape)}) but "
            f"kernel_shape={kernel}, strides={strides}, dilations={dilations}")
    return kernel, strides, dilations


def _auto_pads(in_sp, eff_k, strides, auto_pad, pads):
    """(lo, hi) padding per spatial dim for auto_pad / explicit pads (Conv and pooling)."""
    n = len(in_sp)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(n):
            o = -(-in_sp[i] // strides[i])
            total = max(0, (o - 1) * strides[i] + eff_k[i] - in_sp[i])
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        return out
    if auto_pad == "VALID" or pads is None:
        return [(0, 0)] * n
    if auto_pad not in ("NOTSET", "", None):
        raise OpError(f"unknown auto_pad {auto_pad!r}")
    pads = list(pads)
    if len(pads) != 2 * n:
        raise OpError(f"pads {pads} should have {2 * n} values")
    return [(pads[i], pads[i + n]) for i in range(n)]


def _dim_numbers(n: int):
    spec = tuple(range(n + 2))
    return lax.ConvDimensionNumbers(spec, spec, spec)


def _conv(x, w, b, *, auto_pad, dilations, group, kernel_shape, pads, strides,
          preferred=None):
    kernel, strides, dilations = _spatial_attrs(x, w.shape[2:], kernel_shape, strides, dilations)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    padding = _auto_pads(x.shape[2:], eff, strides, auto_pad, pads)
    y = lax.conv_general_dilated(
        x, w, window_strides=strides, padding=padding, rhs_dilation=dilations,
        dimension_numbers=_dim_numbers(x.ndim - 2), feature_group_count=group,
        preferred_element_type=preferred)
    if b is not None:
        y = y + jnp.reshape(b, _channel_shape(y)).astype(y.dtype)
    return y


# ---------------------------------------------------------------------------
# matrix products


@register("MatMul", since=1)
def matmul(a, b):
    """MatMul-1+ (numpy matmul semantics)."""
    return jnp.matmul(a, b)


def _scale(y, alpha):
    if alpha == 1.0:
        return y
    return y * (alpha if is_floating(y.dtype) else jnp.asarray(alpha).astype(y.dtype))


@register("Gemm", since=1)
def gemm(a, b, c=None, *, alpha, beta, transA, transB, broadcast=None):
    """Gemm-1+ (C optional from 11; the old broadcast attribute is implied)."""
    a = a.T if transA else a
    b = b.T if transB else b
    y = _scale(jnp.matmul(a, b), alpha)
    if c is not None and beta != 0.0:
        y = y + _scale(jnp.asarray(c), beta).astype(y.dtype)
    return y


@register("Einsum", since=12)
def einsum(*inputs, equation):
    """Einsum-12+."""
    eq = equation.replace(" ", "")
    if "->" not in eq:
        # Implicit output: the letters used once, in alphabetical order, after the broadcast dims.
        lhs = eq
        letters = [ch for ch in lhs if ch.isalpha()]
        once = sorted(ch for ch in set(letters) if letters.count(ch) == 1)
        eq = f"{lhs}->{'...' if '...' in lhs else ''}{''.join(once)}"
    return jnp.einsum(eq, *inputs)


@register("MatMulInteger", since=10)
def mat_mul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """MatMulInteger-10 (int32 accumulation)."""
    a = a.astype(jnp.int32)
    b = b.astype(jnp.int32)
    if a_zero_point is not None:
        azp = jnp.asarray(a_zero_point).astype(jnp.int32)
        a = a - (azp.reshape(-1, 1) if azp.ndim == 1 and azp.shape[0] > 1 else azp)
    if b_zero_point is not None:
        b = b - jnp.asarray(b_zero_point).astype(jnp.int32)
    return jnp.matmul(a, b, preferred_element_type=jnp.int32)


def _quantize(y, scale, zero_point, dtype):
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    q = jnp.round(y / scale) + jnp.asarray(zero_point).astype(y.dtype)
    return jnp.clip(q, info.min, info.max).astype(dtype)


def _per_axis(v, ndim, axis):
    v = jnp.asarray(v)
    if v.ndim == 1 and v.shape[0] > 1:
        shape = [1] * ndim
        shape[axis] = -1
        return v.reshape(shape)
    return v


@register("QLinearMatMul", since=10)
def q_linear_mat_mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """QLinearMatMul-10+ (float32 rescale, exact int32 accumulation)."""
    fa = (a.astype(jnp.int32) - _per_axis(a_zero_point, a.ndim, -2).astype(jnp.int32))
    fb = (b.astype(jnp.int32) - _per_axis(b_zero_point, b.ndim, -1).astype(jnp.int32))
    acc = jnp.matmul(fa, fb, preferred_element_type=jnp.int32).astype(jnp.float32)
    sa = _per_axis(a_scale, a.ndim, -2).astype(jnp.float32)
    sb = _per_axis(b_scale, b.ndim, -1).astype(jnp.float32)
    ys = jnp.asarray(y_scale).astype(jnp.float32)
    return _quantize(acc * (sa * sb) / ys, 1.0, y_zero_point, np.dtype(y_zero_point.dtype))


# ---------------------------------------------------------------------------
# convolution


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
        wi = wi - _per_axis(w_zero_point, w.ndim, 0).astype(jnp.int32)
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
        acc = acc + jnp.reshape(b, _channel_shape(acc)).astype(jnp.int32)
    scale = (jnp.asarray(x_scale).astype(jnp.float32)
             * jnp.reshape(jnp.asarray(w_scale).astype(jnp.float32), (-1,) + (1,) * (acc.ndim - 2))
             if np.ndim(w_scale) == 1 else
             jnp.asarray(x_scale).astype(jnp.float32) * jnp.asarray(w_scale).astype(jnp.float32))
    y = acc.astype(jnp.float32) * scale / jnp.asarray(y_scale).astype(jnp.float32)
    return _quantize(y, 1.0, y_zero_point, np.dtype(y_zero_point.dtype))


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
    kernel, strides, dilations = _spatial_attrs(x, w.shape[2:], kernel_shape, strides, dilations)
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
        y = y + jnp.reshape(b, _channel_shape(y)).astype(y.dtype)
    return y


# ---------------------------------------------------------------------------
# pooling


def _pool_geometry(x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode):
    """Returns kernel, strides, dilations, output dims, explicit (lo, hi) pads, extra hi pads."""
    if kernel_shape is None:
        raise OpError("kernel_shape is required")
    kernel, strides, dilations = _spatial_attrs(x, None, kernel_shape, strides, dilations)
    in_sp = x.shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    padding = _auto_pads(in_sp, eff, strides, auto_pad, pads)
    out, extra = [], []
    for i, (lo, hi) in enumerate(padding):
        span = in_sp[i] + lo + hi - eff[i]
        if ceil_mode:
            o = -(-span // strides[i]) + 1
            # The last window must start inside the input or the low padding.
            if (o - 1) * strides[i] >= in_sp[i] + lo:
                o -= 1
        else:
            o = span // strides[i] + 1
        out.append(o)
        extra.append(max(0, (o - 1) * strides[i] + eff[i] - (in_sp[i] + lo + hi)))
    return kernel, strides, dilations, out, padding, extra


def _reduce_window(x, init, op, kernel, strides, dilations, padding):
    n = x.ndim - 2
    return lax.reduce_window(
        x, init, op, (1, 1) + tuple(kernel), (1, 1) + tuple(strides),
        ((0, 0), (0, 0)) + tuple(padding), window_dilation=(1, 1) + tuple(dilations)
        if n else None)


def _window_count(in_sp, kernel, strides, dilations, padding, extra, include_pad, out):
    """Number of elements each window averages over, in numpy (a trace-time constant)."""
    mask = np.pad(np.ones(tuple(in_sp)), tuple(padding), constant_values=1 if include_pad else 0)
    mask = np.pad(mask, [(0, e) for e in extra])
    count = np.zeros(tuple(out))
    for offs in itertools.product(*[range(k) for k in kernel]):
        count += mask[tuple(slice(o * d, o * d + (m - 1) * s + 1, s)
                            for o, d, m, s in zip(offs, dilations, out, strides))]
    return count


@register("MaxPool", since=1)
def max_pool(x, *, auto_pad, ceil_mode=None, dilations=None, kernel_shape, pads, storage_order=None,
             strides, ctx):
    """MaxPool-1+ (Indices computed only when the node uses them)."""
    kernel, strides, dilations, out, padding, extra = _pool_geometry(
        x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
    full_pad = [(lo, hi + e) for (lo, hi), e in zip(padding, extra)]
    y = _reduce_window(x, lowest_value(x.dtype), lax.max, kernel, strides, dilations, full_pad)
    if len(ctx.output_names) < 2 or not ctx.output_names[1]:
        return y
    return y, _max_pool_indices(x, kernel, strides, dilations, out, full_pad, storage_order)


def _max_pool_indices(x, kernel, strides, dilations, out, full_pad, storage_order):
    n = x.ndim - 2
    in_sp = x.shape[2:]
    xp = jnp.pad(x, ((0, 0), (0, 0)) + tuple(full_pad), constant_values=lowest_value(x.dtype))
    patches, positions = [], []
    for offs in itertools.product(*[range(k) for k in kernel]):
        sl = tuple(slice(o * d, o * d + (m - 1) * s + 1, s)
                   for o, d, m, s in zip(offs, dilations, out, strides))
        patches.append(xp[(slice(None), slice(None)) + sl])
        # Input coordinate of this kernel tap for every output position.
        coords = [np.arange(m) * s + o * d - lo
                  for m, s, o, d, (lo, _) in zip(out, strides, offs, dilations, full_pad)]
        positions.append(np.stack(np.meshgrid(*coords, indexing="ij")))
    stacked = jnp.stack(patches)  # (K, N, C, *out)
    best = jnp.argmax(stacked, axis=0)  # (N, C, *out), first maximum
    pos = np.stack(positions)  # (K, n, *out), static
    # flat spatial index: row-major, or column-major for storage_order 1
    dims = list(in_sp)
    if storage_order:
        mult = np.cumprod([1] + dims[:-1]).tolist()
    else:
        mult = np.cumprod([1] + dims[::-1][:-1]).tolist()[::-1]
    spatial_flat = sum(pos[:, i] * int(mult[i]) for i in range(n))  # (K, *out)
    index_dtype = jax.dtypes.canonicalize_dtype(np.int64)  # int32 outside x64
    spatial_flat = jnp.asarray(spatial_flat.astype(index_dtype))
    idx = jnp.take_along_axis(spatial_flat[:, None, None], best[None], axis=0)[0]
    nc = (jnp.arange(x.shape[0] * x.shape[1], dtype=index_dtype).reshape(x.shape[:2] + (1,) * n)
          * int(np.prod(in_sp)))
    return idx + nc


@register("AveragePool", since=1)
def average_pool(x, *, auto_pad, ceil_mode=None, count_include_pad=None, dilations=None,
                 kernel_shape, pads, strides):
    """AveragePool-1+ (the ceil_mode overhang is never counted)."""
    kernel, strides, dilations, out, padding, extra = _pool_geometry(
        x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
    full_pad = [(lo, hi + e) for (lo, hi), e in zip(padding, extra)]
    s = _reduce_window(x, np.array(0, x.dtype), lax.add, kernel, strides, dilations, full_pad)
    count = _window_count(x.shape[2:], kernel, strides, dilations, padding, extra,
                          count_include_pad, out)
    return s / np.maximum(count, 1).astype(x.dtype)


@register("LpPool", since=1)
def lp_pool(x, *, auto_pad, ceil_mode=None, dilations=None, kernel_shape, p, pads, strides):
    """LpPool-1+ (p as a float attribute before opset 2)."""
    kernel, strides, dilations, out, padding, extra = _pool_geometry(
        x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
    full_pad = [(lo, hi + e) for (lo, hi), e in zip(padding, extra)]
    p = float(p)
    s = _reduce_window(jnp.abs(x) ** p, np.array(0, x.dtype), lax.add, kernel, strides,
                       dilations, full_pad)
    return (s ** (1.0 / p)).astype(x.dtype)


@register("GlobalAveragePool", since=1)
def global_average_pool(x):
    """GlobalAveragePool-1+."""
    return jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalMaxPool", since=1)
def global_max_pool(x):
    """GlobalMaxPool-1+."""
    return jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalLpPool", since=2)
def global_lp_pool(x, *, p):
    """GlobalLpPool-2+."""
    s = jnp.sum(jnp.abs(x) ** float(p), axis=tuple(range(2, x.ndim)), keepdims=True)
    return (s ** (1.0 / float(p))).astype(x.dtype)


# ---------------------------------------------------------------------------
# normalization


def _bn_inference(x, scale, b, mean, var, epsilon):
    cd = at_least_float32(x.dtype)
    shape = _channel_shape(x)
    inv = lax.rsqrt(jnp.reshape(var, shape).astype(cd) + epsilon)
    y = (x.astype(cd) - jnp.reshape(mean, shape).astype(cd)) * inv
    y = y * jnp.reshape(scale, shape).astype(cd) + jnp.reshape(b, shape).astype(cd)
    return y.astype(x.dtype)


def _batch_stats(x):
    cd = at_least_float32(x.dtype)
    axes = (0,) + tuple(range(2, x.ndim))
    xc = x.astype(cd)
    mean = jnp.mean(xc, axis=axes)
    var = jnp.mean(jnp.square(xc - jnp.reshape(mean, _channel_shape(x))), axis=axes)
    return mean, var


def _batch_norm(x, scale, b, mean, var, *, epsilon, momentum, training, ctx):
    """Returns (Y, running_mean, running_var, saved_mean, saved_var)."""
    if training or ctx.training:
        bm, bv = _batch_stats(x)
        y = _bn_inference(x, scale, b, bm, bv, epsilon)
        run_mean = (mean * momentum + bm.astype(mean.dtype) * (1 - momentum)).astype(mean.dtype)
        run_var = (var * momentum + bv.astype(var.dtype) * (1 - momentum)).astype(var.dtype)
        if ctx.training:
            # In a jaxort training step the running statistics are written back
            # into the state (frozen parameters), like ORT Training 1.19.2's
            # BatchNormInternal, whether the node is in inference or training form.
            ctx.update_state(3, lax.stop_gradient(run_mean))
            ctx.update_state(4, lax.stop_gradient(run_var))
        return (y, run_mean, run_var, bm.astype(x.dtype), bv.astype(x.dtype))
    y = _bn_inference(x, scale, b, mean, var, epsilon)
    return (y, mean, var, mean, var)


def _wants_extra_outputs(ctx):
    return any(ctx.output_names[1:])


@register("BatchNormalization", since=1)
def batch_normalization_1(x, scale, b, mean, var, *, epsilon, is_test=None, momentum,
                          spatial=None, consumed_inputs=None, ctx):
    """BatchNormalization-1 (is_test=0 with extra outputs: training statistics)."""
    training = not is_test and _wants_extra_outputs(ctx)
    return _batch_norm(x, scale, b, mean, var, epsilon=epsilon, momentum=momentum,
                       training=training, ctx=ctx)


@register("BatchNormalization", since=6)
def batch_normalization_6(x, scale, b, mean, var, *, epsilon, is_test=None, momentum,
                          spatial=None, ctx):
    """BatchNormalization-6 (is_test=0 with extra outputs: training statistics)."""
    training = not is_test and _wants_extra_outputs(ctx)
    return _batch_norm(x, scale, b, mean, var, epsilon=epsilon, momentum=momentum,
                       training=training, ctx=ctx)


@register("BatchNormalization", since=7)
def batch_normalization_7(x, scale, b, mean, var, *, epsilon, momentum, spatial=None, ctx):
    """BatchNormalization-7..13 (training statistics when the extra outputs are used)."""
    return _batch_norm(x, scale, b, mean, var, epsilon=epsilon, momentum=momentum,
                       training=_wants_extra_outputs(ctx), ctx=ctx)


@register("BatchNormalization", since=14)
def batch_normalization(x, scale, b, input_mean, input_var, *, epsilon, momentum,
                        training_mode, ctx):
    """BatchNormalization-14+ (training_mode attribute; jaxort training uses batch stats)."""
    return _batch_norm(x, scale, b, input_mean, input_var, epsilon=epsilon, momentum=momentum,
                       training=bool(training_mode), ctx=ctx)[:3]


def _normalize(x, axes, epsilon, cd):
    xc = x.astype(cd)
    mean = jnp.mean(xc, axis=axes, keepdims=True)
    d = xc - mean
    var = jnp.mean(d * d, axis=axes, keepdims=True)
    inv = lax.rsqrt(var + epsilon)
    return d * inv, mean, inv


@register("LayerNormalization", since=17)
def layer_normalization(x, scale, b=None, *, axis, epsilon, stash_type, ctx):
    """LayerNormalization-17 (Mean/InvStdDev in the stash type)."""
    axis = axis + x.ndim if axis < 0 else axis
    cd = _stash_dtype(x.dtype, stash_type)
    y, mean, inv = _normalize(x, tuple(range(axis, x.ndim)), epsilon, cd)
    y = y.astype(x.dtype) * scale
    if b is not None:
        y = y + b
    return y, mean, inv


@register("RMSNormalization", since=23)
def rms_normalization(x, scale, *, axis, epsilon, stash_type):
    """RMSNormalization-23."""
    axis = axis + x.ndim if axis < 0 else axis
    cd = _stash_dtype(x.dtype, stash_type)
    xc = x.astype(cd)
    ms = jnp.mean(xc * xc, axis=tuple(range(axis, x.ndim)), keepdims=True)
    return (xc * lax.rsqrt(ms + epsilon)).astype(x.dtype) * scale


@register("InstanceNormalization", since=1)
def instance_normalization(x, scale, b, *, epsilon, consumed_inputs=None):
    """InstanceNormalization-1+."""
    cd = at_least_float32(x.dtype)
    y, _, _ = _normalize(x, tuple(range(2, x.ndim)), epsilon, cd)
    shape = _channel_shape(x)
    y = y * jnp.reshape(scale, shape).astype(cd) + jnp.reshape(b, shape).astype(cd)
    return y.astype(x.dtype)


def _group_norm(x, scale, bias, epsilon, num_groups, cd, per_channel):
    n, c = x.shape[:2]
    g = x.reshape((n, num_groups, -1))
    y, _, _ = _normalize(g, (2,), epsilon, cd)
    if per_channel:
        y = y.reshape(x.shape)
        shape = _channel_shape(x)
    else:
        shape = (1, num_groups, 1)
    y = y * jnp.reshape(scale, shape).astype(cd) + jnp.reshape(bias, shape).astype(cd)
    return y.reshape(x.shape).astype(x.dtype)


@register("GroupNormalization", since=18)
def group_normalization_18(x, scale, bias, *, epsilon, num_groups):
    """GroupNormalization-18 (scale and bias per group)."""
    return _group_norm(x, scale, bias, epsilon, num_groups, at_least_float32(x.dtype), False)


@register("GroupNormalization", since=21)
def group_normalization(x, scale, bias, *, epsilon, num_groups, stash_type):
    """GroupNormalization-21 (scale and bias per channel)."""
    return _group_norm(x, scale, bias, epsilon, num_groups, _stash_dtype(x.dtype, stash_type),
                       True)


@register("LRN", since=1)
def lrn(x, *, alpha, beta, bias, size):
    """LRN-1+."""
    c = x.shape[1]
    lo = (size - 1) // 2
    hi = size - 1 - lo
    sq = jnp.square(x)
    padded = jnp.pad(sq, ((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2))
    s = sum(padded[:, i:i + c] for i in range(size))
    return (x / (bias + (alpha / size) * s) ** beta).astype(x.dtype)


@register("LpNormalization", since=1)
def lp_normalization(x, *, axis, p):
    """LpNormalization-1+ (p 1 or 2)."""
    if p == 1:
        norm = jnp.sum(jnp.abs(x), axis=axis, keepdims=True)
    elif p == 2:
        norm = jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=True))
    else:
        raise OpError(f"p must be 1 or 2, got {p}")
    return (x / jnp.where(norm == 0, jnp.ones((), x.dtype), norm)).astype(x.dtype)


@register("MeanVarianceNormalization", since=9)
def mean_variance_normalization(x, *, axes):
    """MeanVarianceNormalization-9+ (epsilon 1e-9 as in the function body)."""
    axes = tuple(axes) if axes is not None else (0, 2, 3)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = jnp.mean(d * d, axis=axes, keepdims=True)
    return (d / (jnp.sqrt(var) + 1e-9)).astype(x.dtype)


# ---------------------------------------------------------------------------
# softmax family and dropout


def _coerce_2d(fn, x, axis):
    axis = axis + x.ndim if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return fn(x.reshape((lead, -1)), 1).reshape(x.shape)


def _softmax(x, axis):
    return jax.nn.softmax(x, axis=axis)


def _log_softmax(x, axis):
    return jax.nn.log_softmax(x, axis=axis)


def _hardmax(x, axis):
    return jax.nn.one_hot(jnp.argmax(x, axis=axis), x.shape[axis], dtype=x.dtype, axis=axis)


@register("Softmax", since=1)
def softmax_1(x, *, axis):
    """Softmax-1..12 (input coerced to 2-D at axis)."""
    return _coerce_2d(_softmax, x, axis)


@register("Softmax", since=13)
def softmax(x, *, axis):
    """Softmax-13+."""
    return _softmax(x, axis)


@register("LogSoftmax", since=1)
def log_softmax_1(x, *, axis):
    """LogSoftmax-1..12 (input coerced to 2-D at axis)."""
    return _coerce_2d(_log_softmax, x, axis)


@register("LogSoftmax", since=13)
def log_softmax(x, *, axis):
    """LogSoftmax-13+."""
    return _log_softmax(x, axis)


@register("Hardmax", since=1)
def hardmax_1(x, *, axis):
    """Hardmax-1..12 (input coerced to 2-D at axis)."""
    return _coerce_2d(_hardmax, x, axis)


@register("Hardmax", since=13)
def hardmax(x, *, axis):
    """Hardmax-13+ (first maximum wins)."""
    return _hardmax(x, axis)


def _identity_dropout(x, mask_dtype=jnp.bool_):
    return x, jnp.ones(x.shape, mask_dtype)


@register("Dropout", since=1, foldable=False)
def dropout_1(data, *, is_test=None, ratio=None, consumed_inputs=None):
    """Dropout-1..9 (identity: jaxort never drops for the old forms)."""
    return _identity_dropout(data, data.dtype)


@register("Dropout", since=10, foldable=False)
def dropout_10(data, *, ratio=None):
    """Dropout-10..11 (identity, boolean mask)."""
    return _identity_dropout(data)


@register("Dropout", since=12, foldable=False)
def dropout(data, ratio=None, training_mode=None, *, seed=None, ctx):
    """Dropout-12+ (random only in a jaxort training step with training_mode true; seed ignored)."""
    if training_mode is None or not ctx.training:
        return _identity_dropout(data)
    if ratio is not None and isinstance(ratio, (np.ndarray, np.generic, float)) and \
            float(np.asarray(ratio)) == 0.0:
        return _identity_dropout(data)
    r = 0.5 if ratio is None else jnp.asarray(ratio).astype(jnp.float32)
    mask = jax.random.bernoulli(ctx.rng(), 1.0 - r, data.shape)
    out = jnp.where(mask, data / jnp.asarray(1.0 - r).astype(data.dtype), jnp.zeros((), data.dtype))
    if isinstance(training_mode, (np.ndarray, np.generic, bool)):
        if not bool(np.asarray(training_mode)):
            return _identity_dropout(data)
        return out, mask
    flag = jnp.asarray(training_mode).astype(jnp.bool_)
    return jnp.where(flag, out, data), jnp.where(flag, mask, True)


# ---------------------------------------------------------------------------
# attention


def _neg_inf_where(allowed, dtype):
    return jnp.where(allowed, jnp.zeros((), dtype), jnp.full((), -jnp.inf, dtype))


def _window_bias(q_len, kv_len, offset, dtype, *, causal, left=-1, right=-1):
    """Additive (q, kv) bias, or (batch, 1, q, kv) for a per-batch offset."""
    i = jnp.arange(q_len, dtype=jnp.int32).reshape(q_len, 1)
    j = jnp.arange(kv_len, dtype=jnp.int32).reshape(1, kv_len)
    if jnp.ndim(offset) > 0:
        i = i + jnp.reshape(offset, (-1, 1, 1))
    else:
        i = i + offset
    diff = i - j
    allowed = jnp.ones(diff.shape, bool)
    if causal:
        allowed = allowed & (diff >= 0)
    if left >= 0:
        allowed = allowed & (diff <= left)
    if right >= 0:
        allowed = allowed & (-diff <= right)
    bias = _neg_inf_where(allowed, dtype)
    return bias[:, None] if bias.ndim == 3 else bias


def _bf16_round(a):
    return lax.reduce_precision(a, exponent_bits=8, mantissa_bits=7)


def _sequential_sum(e, rnd):
    """Sum over the last axis left to right, rounding after each addition."""
    cols = jnp.moveaxis(e, -1, 0)
    acc, _ = lax.scan(lambda acc, col: (rnd(acc + col), None), cols[0], cols[1:])
    return acc[..., None]


def _split_heads(x, heads):
    b, s, h = x.shape
    return jnp.transpose(x.reshape(b, s, heads, h // heads), (0, 2, 1, 3))


def _attention(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, *, scale, is_causal,
               q_num_heads, kv_num_heads, softmax_precision, softcap, qk_matmul_output_mode,
               left_window_size=-1, right_window_size=-1):
    rank3 = q.ndim == 3
    if rank3:
        if not q_num_heads or not kv_num_heads:
            raise OpError("3-D inputs need q_num_heads and kv_num_heads")
        q = _split_heads(q, q_num_heads)
        k = _split_heads(k, kv_num_heads)
        v = _split_heads(v, kv_num_heads)
    dt = q.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[3])
    # The spec scales Q and K by sqrt(scale) each, in the input type.
    sq = jnp.asarray(math.sqrt(scale), dt)
    if past_key is not None:
        k = jnp.concatenate([past_key, k], axis=2)
    if past_value is not None:
        v = jnp.concatenate([past_value, v], axis=2)
    present_key, present_value = k, v
    q_len, kv_len = q.shape[2], k.shape[2]

    if attn_mask is not None and attn_mask.shape[-1] < kv_len:
        pad = [(0, 0)] * (attn_mask.ndim - 1) + [(0, kv_len - attn_mask.shape[-1])]
        attn_mask = jnp.pad(attn_mask, pad,
                            constant_values=False if attn_mask.dtype == jnp.bool_ else -jnp.inf)
    if attn_mask is not None:
        bias = (_neg_inf_where(attn_mask, dt) if attn_mask.dtype == jnp.bool_
                else attn_mask.astype(dt))
    else:
        bias = jnp.zeros((q_len, kv_len), dt)
    if past_key is None and nonpad_kv_seqlen is not None:
        offset = jnp.reshape(nonpad_kv_seqlen, (-1,)).astype(jnp.int32) - q_len
    else:
        offset = past_key.shape[2] if past_key is not None else 0
    if is_causal:
        bias = bias + _window_bias(q_len, kv_len, offset, dt, causal=True)
    left = -1 if left_window_size is None else left_window_size
    right = -1 if right_window_size is None else right_window_size
    if left >= 0 or right >= 0:
        bias = bias + _window_bias(q_len, kv_len, offset, dt, causal=False, left=left, right=right)
    if nonpad_kv_seqlen is not None:
        keep = (jnp.arange(kv_len, dtype=jnp.int32)[None, :]
                < jnp.reshape(nonpad_kv_seqlen, (-1, 1)).astype(jnp.int32))
        bias = bias + _neg_inf_where(keep, dt)[:, None, None, :]

    hq, hk = q.shape[1], k.shape[1]
    if hq != hk and hq % hk == 0:
        k = jnp.repeat(k, hq // hk, axis=1)
        v = jnp.repeat(v, hq // hk, axis=1)
    # bfloat16: ONNX's reference (numpy + ml_dtypes) rounds to bfloat16 after every op and
    # sums the softmax denominator sequentially; XLA would keep float32 in between, which
    # differs by an ulp. Emulate it: float32 compute with explicit rounding.
    exact = dt == jnp.bfloat16
    rnd = _bf16_round if exact else (lambda a: a)
    if exact:
        q, k, v, bias, sq = (a.astype(jnp.float32) for a in (q, k, v, bias, sq))
    qk = rnd(jnp.matmul(rnd(q * sq), jnp.swapaxes(rnd(k * sq), -1, -2)))
    if softcap is not None and softcap > 0:
        qk = rnd(rnd(jnp.tanh(rnd(qk / softcap))) * softcap)
    logits = rnd(qk + bias)
    qk_out = logits if qk_matmul_output_mode == 2 else qk
    sm_rnd = rnd
    if softmax_precision is not None:
        from jaxort.dtypes import to_numpy_dtype

        sm_dtype = to_numpy_dtype(softmax_precision)
        if sm_dtype != dt:
            logits = logits.astype(sm_dtype)
            sm_rnd = lambda a: a  # noqa: E731
    m = jnp.max(logits, axis=-1, keepdims=True)
    m = jnp.where(jnp.isneginf(m), jnp.zeros((), m.dtype), lax.stop_gradient(m))
    e = sm_rnd(jnp.exp(sm_rnd(logits - m)))
    s = _sequential_sum(e, rnd) if sm_rnd is rnd and exact else jnp.sum(e, -1, keepdims=True)
    p = sm_rnd(e / jnp.where(s == 0, jnp.ones((), s.dtype), s))
    masked_row = jnp.isneginf(jnp.max(bias, axis=-1, keepdims=True))
    p = jnp.where(masked_row, jnp.zeros((), p.dtype), p)
    if qk_matmul_output_mode == 3:
        qk_out = p
    p = rnd(p.astype(v.dtype))
    y = rnd(jnp.matmul(p, v)).astype(dt)
    if rank3:
        y = jnp.transpose(y, (0, 2, 1, 3))
        y = y.reshape(y.shape[0], y.shape[1], -1)
    return y, present_key, present_value, qk_out.astype(dt)


@register("Attention", since=23)
def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal, kv_num_heads, q_num_heads, qk_matmul_output_mode, scale, softcap,
              softmax_precision, left_window_size=None, right_window_size=None):
    """Attention-23+ (nonpad_kv_seqlen from 24, sliding windows from 25)."""
    return _attention(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, scale=scale,
                      is_causal=is_causal, q_num_heads=q_num_heads, kv_num_heads=kv_num_heads,
                      softmax_precision=softmax_precision, softcap=softcap,
                      qk_matmul_output_mode=qk_matmul_output_mode,
                      left_window_size=left_window_size, right_window_size=right_window_size)


@register("RotaryEmbedding", since=23)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved, num_heads,
                     rotary_embedding_dim):
    """RotaryEmbedding-23."""
    shape = x.shape
    if x.ndim == 4:
        x = jnp.transpose(x, (0, 2, 1, 3))  # (batch, seq, heads, head)
    else:
        if not num_heads:
            raise OpError("3-D input needs num_heads")
        x = x.reshape(shape[0], shape[1], num_heads, shape[2] // num_heads)
    dim = rotary_embedding_dim or x.shape[3]
    rot, rest = x[..., :dim], x[..., dim:]
    if position_ids is not None:
        cos_cache = jnp.take(cos_cache, position_ids, axis=0)
        sin_cache = jnp.take(sin_cache, position_ids, axis=0)
    cos = cos_cache[:, :, None, :].astype(x.dtype)
    sin = sin_cache[:, :, None, :].astype(x.dtype)
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :dim // 2], rot[..., dim // 2:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rot = jnp.stack([real, imag], axis=-1).reshape(rot.shape)
    else:
        rot = jnp.concatenate([real, imag], axis=-1)
    out = jnp.concatenate([rot, rest], axis=-1)
    if len(shape) == 3:
        return out.reshape(shape)
    return jnp.transpose(out, (0, 2, 1, 3))


# ---------------------------------------------------------------------------
# sampling


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


@register("MaxUnpool", since=9)
def max_unpool(x, indices, output_shape=None, *, kernel_shape, pads, strides):
    """MaxUnpool-9+ (indices as MaxPool's flat Indices output)."""
    n = x.ndim - 2
    strides = list(strides) if strides is not None else [1] * n
    pads = list(pads) if pads is not None else [0] * (2 * n)
    inferred = list(x.shape[:2]) + [
        (x.shape[i + 2] - 1) * strides[i] - pads[i] - pads[i + n] + kernel_shape[i]
        for i in range(n)]
    y = jnp.zeros(int(np.prod(inferred)), x.dtype)
    y = y.at[jnp.reshape(indices, (-1,))].set(jnp.reshape(x, (-1,))).reshape(inferred)
    if output_shape is not None:
        target = static_ints(output_shape, "input 'output_shape'")
        y = jnp.pad(y, [(0, t - s) for t, s in zip(target, inferred)])
    return y


def _gather_hw(img, idx):
    """img (B, C, H*W), idx (B, ...) -> (B, C, ...)."""
    b, c = img.shape[:2]
    flat = idx.reshape(b, 1, -1)
    return jnp.take_along_axis(img, flat, axis=2).reshape((b, c) + idx.shape[1:])


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
            out = out + _gather_hw(img, idx) * wgt[:, None]
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
            terms.append(_gather_hw(img, idx) * wgt[:, None])
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
