"""Linear quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear.

Scales and zero points may be per tensor (scalar), per axis (1-D along
``axis``) or blocked (the input's shape with one axis divided by
``block_size``). Quantized outputs are not differentiable.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import OpError
from jaxort.graph import register

_INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(ml_dtypes.uint4): (0, 15),
    np.dtype(ml_dtypes.int4): (-8, 7),
}
for _name, _rng in (("uint2", (0, 3)), ("int2", (-2, 1))):
    if hasattr(ml_dtypes, _name):
        _INT_RANGES[np.dtype(getattr(ml_dtypes, _name))] = _rng
_FLOAT8 = {
    np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2), np.dtype(ml_dtypes.float8_e5m2fnuz),
}
_STANDARD_FLOATS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64),
                    np.dtype(ml_dtypes.bfloat16)}


def _np_dtype(code: int) -> np.dtype:
    try:
        return to_numpy_dtype(int(code))
    except Exception:  # noqa: BLE001
        raise OpError(f"unsupported element type {code}") from None


def _expand(value, shape, axis, block_size):
    """Makes a scale or zero point broadcastable to ``shape``."""
    v = jnp.asarray(value)
    if v.ndim == 0:
        return v
    if v.size == 1:
        return v.reshape(())
    rank = len(shape)
    axis = axis if axis is not None else 1
    if axis < 0:
        axis += rank
    if not 0 <= axis < rank:
        raise OpError(
            f"axis {axis} is out of range for input shape {list(shape)}")
    if not block_size:
        if v.ndim != 1 or v.shape[0] != shape[axis]:
            raise OpError(
                f"per-axis scale/zero point must be 1-D of length "
                f"{shape[axis]} (input shape {list(shape)}, axis {axis}), "
                f"got shape {list(v.shape)}")
        dims = [1] * rank
        dims[axis] = v.shape[0]
        return v.reshape(dims)
    if v.ndim != rank:
        raise OpError(f"blocked scale must have the input's rank {rank}, "
                      f"got shape {list(v.shape)}")
    v = jnp.repeat(v, int(block_size), axis=axis)
    v = lax.slice_in_dim(v, 0, shape[axis], axis=axis)
    if tuple(v.shape) != tuple(shape):
        raise OpError(f"blocked scale shape does not match input shape "
                      f"{list(shape)} with block_size {block_size}")
    return v


def _quantize(x, y_scale, y_zero_point, *, axis=None, saturate=None, block_size=None,
              output_dtype=None, precision=None):
    shape = tuple(jnp.shape(x))
    if y_zero_point is not None:
        out = np.dtype(y_zero_point.dtype)
        if output_dtype and _np_dtype(output_dtype) != out:
            raise OpError(f"output_dtype {output_dtype} differs from the "
                          f"zero point's type {out}")
    elif output_dtype:
        out = _np_dtype(output_dtype)
    else:
        out = np.dtype(np.uint8)
    scale = _expand(y_scale, shape, axis, block_size)
    x = jnp.asarray(x)
    if precision:
        work = _np_dtype(precision)
    else:
        sd = np.dtype(scale.dtype)
        sd = sd if sd in _STANDARD_FLOATS else np.dtype(np.float32)
        xd = np.dtype(x.dtype)
        work = np.dtype(jnp.promote_types(xd, sd)) if xd in _STANDARD_FLOATS else sd
    q = x.astype(work) / scale.astype(work)
    if out in _INT_RANGES:
        lo, hi = _INT_RANGES[out]
        qi = jnp.round(q).astype(jnp.int32)
        if y_zero_point is not None:
            qi = qi + _expand(y_zero_point, shape, axis, block_size).astype(jnp.int32)
        return jnp.clip(qi, lo, hi).astype(out)
    if out in _FLOAT8:
        if saturate is None or saturate:
            info = ml_dtypes.finfo(out)
            q = jnp.clip(q, float(info.min), float(info.max))
        return q.astype(out)
    if out.kind == "V" or out.kind == "f":  # float4 / float6: saturating by construction
        if y_zero_point is not None:
            q = q + _expand(y_zero_point, shape, axis, block_size).astype(work)
        return q.astype(out)
    raise OpError(f"{out} is not a quantized type")


def _dequantize(x, x_scale, x_zero_point, *, axis=None, block_size=None, output_dtype=None):
    shape = tuple(jnp.shape(x))
    xd = np.dtype(x.dtype)
    dx = jnp.asarray(x).astype(jnp.float32)
    if x_zero_point is not None and xd not in _FLOAT8 and xd.name != "float4_e2m1fn":
        dx = dx - _expand(x_zero_point, shape, axis, block_size).astype(jnp.float32)
    y = dx * _expand(x_scale, shape, axis, block_size).astype(jnp.float32)
    out = _np_dtype(output_dtype) if output_dtype else np.dtype(x_scale.dtype)
    return y.astype(out)


@register("QuantizeLinear", since=23)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis, saturate, block_size,
                    output_dtype, precision):
    """QuantizeLinear-23+ (division in ``precision`` when given)."""
    return _quantize(x, y_scale, y_zero_point, axis=axis, saturate=saturate,
                     block_size=block_size, output_dtype=output_dtype, precision=precision)


@register("QuantizeLinear", since=21)
def quantize_linear_21(x, y_scale, y_zero_point=None, *, axis, saturate, block_size,
                       output_dtype):
    """QuantizeLinear-21/22 (blocked quantization, output_dtype, int4)."""
    return _quantize(x, y_scale, y_zero_point, axis=axis, saturate=saturate,
                     block_size=block_size, output_dtype=output_dtype)


@register("QuantizeLinear", since=19)
def quantize_linear_19(x, y_scale, y_zero_point=None, *, axis, saturate):
    """QuantizeLinear-19/20 (float8 outputs, saturate)."""
    return _quantize(x, y_scale, y_zero_point, axis=axis, saturate=saturate)


@register("QuantizeLinear", since=13)
def quantize_linear_13(x, y_scale, y_zero_point=None, *, axis):
    """QuantizeLinear-13..18 (per-axis scales)."""
    return _quantize(x, y_scale, y_zero_point, axis=axis)


@register("QuantizeLinear", since=10)
def quantize_linear_10(x, y_scale, y_zero_point=None):
    """QuantizeLinear-10..12 (per-tensor only)."""
    return _quantize(x, y_scale, y_zero_point)


@register("DequantizeLinear", since=23)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis, block_size, output_dtype):
    """DequantizeLinear-23+ (output_dtype)."""
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size,
                       output_dtype=output_dtype)


@register("DequantizeLinear", since=21)
def dequantize_linear_21(x, x_scale, x_zero_point=None, *, axis, block_size):
    """DequantizeLinear-21/22 (blocked dequantization)."""
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size)


@register("DequantizeLinear", since=13)
def dequantize_linear_13(x, x_scale, x_zero_point=None, *, axis):
    """DequantizeLinear-13..20 (per-axis scales; float8 inputs from 19)."""
    return _dequantize(x, x_scale, x_zero_point, axis=axis)


@register("DequantizeLinear", since=10)
def dequantize_linear_10(x, x_scale, x_zero_point=None):
    """DequantizeLinear-10..12 (per-tensor only)."""
    return _dequantize(x, x_scale, x_zero_point)


@register("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x):
    """DynamicQuantizeLinear-11+ (uint8; the range always includes 0)."""
    x = jnp.asarray(x)
    f32 = jnp.float32
    maxx = jnp.maximum(0, jnp.max(x)).astype(f32)
    minx = jnp.minimum(0, jnp.min(x)).astype(f32)
    span = jnp.where(maxx == minx, jnp.ones((), f32), maxx - minx)
    scale = span / 255
    zp = jnp.round(jnp.clip(-minx / scale, 0, 255))
    y = jnp.clip(jnp.round(x.astype(f32) / scale) + zp, 0, 255)
    return y.astype(jnp.uint8), scale.astype(x.dtype), zp.astype(jnp.uint8)
