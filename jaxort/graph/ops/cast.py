"""Type conversions: Cast, CastLike and BitCast (saturating float8, sub-byte ints, strings)."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
from jax import lax

from jaxort.dtypes import to_numpy_dtype, to_onnx_type
from jaxort.errors import OpError
from jaxort.graph import register, static
from jaxort.graph.ops._common import dtype_of, is_string
from jaxort.graph.ops._common import is_inexact, is_integer


_FLOAT8 = {17, 18, 19, 20}


_SUBBYTE_INT = {21, 22, 25, 26}  # uint4, int4, uint2, int2


_E8M0 = 24


def _onnx_dtype(code: int) -> np.dtype:
    try:
        return to_numpy_dtype(code)
    except KeyError:
        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
        except Exception:  # noqa: BLE001  (onnx raises KeyError or ValueError)
            names = {v: k for k, v in onnx.TensorProto.DataType.items()}
            raise OpError(f"cannot cast to ONNX element type {code} "
                          f"({names.get(code, 'unknown')}): numpy has no such dtype") from None


def _code_of(dtype) -> int:
    dt = np.dtype(dtype)
    if dt.kind in "OUS":
        return onnx.TensorProto.STRING
    try:
        return to_onnx_type(dt)
    except KeyError:  # types newer than jaxort's table, where onnx knows them
        return int(onnx.helper.np_dtype_to_tensor_dtype(dt))


def _parse_string(s) -> float:
    if isinstance(s, bytes):
        s = s.decode("utf-8")
    return float(str(s).strip())


def _cast_from_strings(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    flat = x.reshape(-1)
    if is_integer(dt):
        vals = []
        for s in flat:
            text = s.decode("utf-8") if isinstance(s, bytes) else str(s)
            try:
                vals.append(int(text.strip()))
            except ValueError:
                vals.append(int(float(text.strip())))
        return np.array(vals, dtype=np.int64).reshape(x.shape).astype(dt)
    vals = np.array([_parse_string(s) for s in flat], dtype=np.float64).reshape(x.shape)
    if dt == np.bool_:
        return vals != 0
    return vals.astype(dt)


def _cast_to_strings(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind == "V":  # ml_dtypes floats and ints print through float32
        x = x.astype(np.float32)
    return x.astype(np.str_).astype(object)


def _to_e8m0(x, saturate, round_mode):
    """float8e8m0 (exponent only) from float32 bits; mirrors onnx.numpy_helper.to_float8e8m0."""
    f = jnp.asarray(x).astype(jnp.float32)
    bits = lax.bitcast_convert_type(f, jnp.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(jnp.uint16)
    special = exponent == 0xFF
    if round_mode == "nearest":
        g = (bits & 0x400000) > 0
        r = (bits & 0x200000) > 0
        s = (bits & 0x1FFFFF) > 0
        lsb = exponent > 0
        up = g & (r | s | lsb)
    elif round_mode == "up":
        up = (bits & 0x7FFFFF) > 0
    elif round_mode == "down":
        up = jnp.zeros(exponent.shape, jnp.bool_)
    else:
        raise OpError(f"round_mode must be 'up', 'down' or 'nearest', "
                      f"got {round_mode!r}")
    up = up & ~special
    if saturate:
        up = up & (exponent != 0xFE)
    exponent = exponent + up.astype(jnp.uint16)
    out = jnp.where(special, jnp.asarray(0xFF, jnp.uint16), exponent).astype(jnp.uint8)
    return lax.bitcast_convert_type(out, jnp.dtype(ml_dtypes.float8_e8m0fnu))


def _cast(x, to: int, saturate, round_mode):
    if to == onnx.TensorProto.STRING:
        if is_string(x):
            return x
        return _cast_to_strings(static(x, "input (cast to string)"))
    dt = _onnx_dtype(to)
    if is_string(x):
        return _cast_from_strings(x, dt)
    src = dtype_of(x)
    if src == dt:
        return x
    x = jnp.asarray(x)
    saturate = True if saturate is None else bool(saturate)
    if to == _E8M0:
        return _to_e8m0(x, saturate, round_mode or "up")
    if to in _FLOAT8 and saturate:
        if not is_inexact(src):
            x = x.astype(jnp.float32)
        info = ml_dtypes.finfo(dt)
        x = jnp.clip(x, float(info.min), float(info.max))
        return x.astype(dt)
    if to in _SUBBYTE_INT and (is_inexact(src) or src == np.bool_):
        # Out-of-range values become 0, as ml_dtypes (the reference) does; XLA would saturate.
        info = ml_dtypes.iinfo(dt)
        t = jnp.trunc(x.astype(jnp.float32))
        ok = (t >= int(info.min)) & (t <= int(info.max))
        return jnp.where(ok, t, 0).astype(jnp.int8).astype(dt)
    return x.astype(dt)


@register("Cast", since=6)
def cast(x, *, to, saturate=None, round_mode=None):
    """Cast-6+ (saturate 19+, float8e8m0 24+; strings static only; f64->f16/bf16 rounds via f32)."""
    return _cast(x, int(to), saturate, round_mode)


@register("Cast", since=1)
def cast_1(x, *, to):
    """Cast-1 (``to`` is a type name such as "FLOAT")."""
    try:
        code = onnx.TensorProto.DataType.Value(str(to).upper())
    except ValueError:
        raise OpError(f"unknown type name to={to!r}") from None
    return _cast(x, code, None, None)


@register("CastLike", since=15)
def cast_like(x, target_type, *, saturate=None, round_mode=None):
    """CastLike-15+ (saturate from 19, round_mode from 24)."""
    return _cast(x, _code_of(target_type.dtype), saturate, round_mode)


@register("BitCast", since=26)
def bit_cast(x, *, to):
    """BitCast-26+ (reinterprets bits; both types must have the same width)."""
    dt = _onnx_dtype(int(to))
    src = dtype_of(x)
    if is_string(x) or dt.kind in "OUS":
        raise OpError("BitCast does not support strings")
    if src.itemsize != dt.itemsize:
        raise OpError(f"BitCast needs types of equal width, got {src} "
                      f"({src.itemsize * 8} bits) and {dt} ({dt.itemsize * 8} bits)")
    if src == dt:
        return x
    if src == np.bool_:
        x, src = jnp.asarray(x).astype(jnp.uint8), np.dtype(np.uint8)
    if dt == np.bool_:
        return lax.bitcast_convert_type(x, jnp.uint8) != 0
    return lax.bitcast_convert_type(x, dt)
