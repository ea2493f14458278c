"""Elementwise arithmetic, comparison, logic, activation and cast ops.

Every op here maps elements independently (with numpy broadcasting between
inputs), keeps the ONNX output dtype exactly, and is written with ``jnp`` so
it works on static (numpy) and traced values alike. String tensors only ever
exist as static numpy object arrays; the few ops that accept them (Equal,
Where, Cast, CastLike) handle them with numpy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
from jax import lax

from jaxort.dtypes import to_numpy_dtype, to_onnx_type
from jaxort.errors import OpError
from jaxort.graph import register, static
from jaxort.graph.ops._common import is_inexact, is_integer

# --------------------------------------------------------------------------- helpers


def _dtype(x) -> np.dtype:
    return np.dtype(x.dtype)


def _is_str(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "OUS"


def _legacy_broadcast(a, b, broadcast, axis):
    """Opset < 7 broadcasting: ``b`` aligns with ``a`` starting at ``axis``."""
    if not broadcast or b.ndim == a.ndim:
        return b
    if axis is None:
        axis = a.ndim - b.ndim
    if axis < 0:
        axis += a.ndim
    shape = (1,) * axis + tuple(b.shape) + (1,) * (a.ndim - axis - b.ndim)
    return jnp.reshape(b, shape) if not isinstance(b, np.ndarray) else b.reshape(shape)


def _where(cond, x, y):
    if _is_str(x) or _is_str(y):
        return np.where(np.asarray(cond), x, y)
    return jnp.where(cond, x, y)


# --------------------------------------------------------------------------- arithmetic


@register("Add", since=7)
def add(a, b):
    """Add-7+ (numpy broadcasting)."""
    return jnp.add(a, b)


@register("Add", since=1)
def add_1(a, b, *, broadcast=None, axis=None, consumed_inputs=None):
    """Add-1/6 (legacy axis broadcasting)."""
    return jnp.add(a, _legacy_broadcast(a, b, broadcast, axis))


@register("Sub", since=7)
def sub(a, b):
    """Sub-7+ (numpy broadcasting)."""
    return jnp.subtract(a, b)


@register("Sub", since=1)
def sub_1(a, b, *, broadcast=None, axis=None, consumed_inputs=None):
    """Sub-1/6 (legacy axis broadcasting)."""
    return jnp.subtract(a, _legacy_broadcast(a, b, broadcast, axis))


@register("Mul", since=7)
def mul(a, b):
    """Mul-7+ (numpy broadcasting)."""
    return jnp.multiply(a, b)


@register("Mul", since=1)
def mul_1(a, b, *, broadcast=None, axis=None, consumed_inputs=None):
    """Mul-1/6 (legacy axis broadcasting)."""
    return jnp.multiply(a, _legacy_broadcast(a, b, broadcast, axis))


def _div(a, b):
    if is_integer(_dtype(a)):
        a, b = jnp.broadcast_arrays(a, b)
        return lax.div(a, b)  # C semantics: truncates toward zero
    return jnp.divide(a, b)


@register("Div", since=7)
def div(a, b):
    """Div-7+ (numpy broadcasting; integer division truncates toward zero)."""
    return _div(a, b)


@register("Div", since=1)
def div_1(a, b, *, broadcast=None, axis=None, consumed_inputs=None):
    """Div-1/6 (legacy axis broadcasting)."""
    return _div(a, _legacy_broadcast(a, b, broadcast, axis))


def _pow(x, y):
    xd, yd = _dtype(x), _dtype(y)
    if is_inexact(xd):
        return jnp.power(x, y if yd == xd else jnp.asarray(y).astype(xd))
    if is_inexact(yd):
        # Integer base, float exponent: compute in the exponent's type. Results
        # within float rounding of an integer snap to it (pow(2., 5.) may come
        # out as 31.999998), the rest truncate like a C cast.
        r = jnp.power(jnp.asarray(x).astype(yd), y)
        near = jnp.round(r)
        r = jnp.where(jnp.abs(r - near) <= 1e-4 * jnp.maximum(jnp.abs(near), 1), near, r)
        return r.astype(xd)
    return jnp.power(x, jnp.asarray(y).astype(xd))


@register("Pow", since=7)
def pow_(x, y):
    """Pow-7+ (numpy broadcasting; exponent dtype may differ from 12, result has the base dtype)."""
    return _pow(x, y)


@register("Pow", since=1)
def pow_1(x, y, *, broadcast=None, axis=None):
    """Pow-1 (legacy axis broadcasting)."""
    return _pow(x, _legacy_broadcast(x, y, broadcast, axis))


@register("Mod", since=10)
def mod(a, b, *, fmod):
    """Mod-10+ (fmod=0: sign of the divisor; fmod=1: C fmod, sign of the dividend)."""
    return jnp.fmod(a, b) if fmod else jnp.remainder(a, b)


@register("Neg", since=6)
def neg(x):
    """Neg-6+."""
    return jnp.negative(x)


@register("Abs", since=6)
def abs_(x):
    """Abs-6+."""
    return jnp.abs(x)


@register("Sign", since=9)
def sign(x):
    """Sign-9+."""
    return jnp.sign(x)


@register("Reciprocal", since=6)
def reciprocal(x):
    """Reciprocal-6+."""
    return jnp.reciprocal(x)


@register("Floor", since=6)
def floor(x):
    """Floor-6+."""
    return jnp.floor(x)


@register("Ceil", since=6)
def ceil(x):
    """Ceil-6+."""
    return jnp.ceil(x)


@register("Round", since=11)
def round_(x):
    """Round-11+ (halves to even)."""
    return jnp.round(x)


@register("Exp", since=6)
def exp(x):
    """Exp-6+."""
    return jnp.exp(x)


@register("Log", since=6)
def log(x):
    """Log-6+."""
    return jnp.log(x)


@register("Sqrt", since=6)
def sqrt(x):
    """Sqrt-6+."""
    return jnp.sqrt(x)


def _via_float(fn, x):
    """Applies a float function to an integer tensor (schema allows ints), casting back."""
    dt = _dtype(x)
    if is_inexact(dt):
        return fn(x)
    work = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    return fn(jnp.asarray(x).astype(work)).astype(dt)


@register("Erf", since=9)
def erf(x):
    """Erf-9+ (integer inputs are computed in float and truncated back)."""
    return _via_float(jax.scipy.special.erf, x)


@register("Sin", since=7)
def sin(x):
    """Sin-7+."""
    return jnp.sin(x)


@register("Cos", since=7)
def cos(x):
    """Cos-7+."""
    return jnp.cos(x)


@register("Tan", since=7)
def tan(x):
    """Tan-7+."""
    return jnp.tan(x)


@register("Asin", since=7)
def asin(x):
    """Asin-7+."""
    return jnp.arcsin(x)


@register("Acos", since=7)
def acos(x):
    """Acos-7+."""
    return jnp.arccos(x)


@register("Atan", since=7)
def atan(x):
    """Atan-7+."""
    return jnp.arctan(x)


@register("Sinh", since=9)
def sinh(x):
    """Sinh-9+."""
    return jnp.sinh(x)


@register("Cosh", since=9)
def cosh(x):
    """Cosh-9+."""
    return jnp.cosh(x)


@register("Asinh", since=9)
def asinh(x):
    """Asinh-9+."""
    return jnp.arcsinh(x)


@register("Acosh", since=9)
def acosh(x):
    """Acosh-9+."""
    return jnp.arccosh(x)


@register("Atanh", since=9)
def atanh(x):
    """Atanh-9+."""
    return jnp.arctanh(x)


@register("Det", since=11)
def det(x):
    """Det-11+ (batched over leading dims)."""
    return jnp.linalg.det(x)


# --------------------------------------------------------------------------- variadic


def _fold(fn, inputs):
    if not inputs:
        raise OpError("needs at least one input")
    out = inputs[0]
    for x in inputs[1:]:
        out = fn(out, x)
    if len(inputs) == 1:
        out = jnp.asarray(out)
    return out


@register("Min", since=6)
def min_(*inputs):
    """Min-6+ (numpy broadcasting, which 6-7 did not need; NaN propagates)."""
    return _fold(jnp.minimum, inputs)


@register("Max", since=6)
def max_(*inputs):
    """Max-6+ (numpy broadcasting, which 6-7 did not need; NaN propagates)."""
    return _fold(jnp.maximum, inputs)


@register("Sum", since=6)
def sum_(*inputs):
    """Sum-6+ (numpy broadcasting, which 6-7 did not need)."""
    return _fold(jnp.add, inputs)


@register("Mean", since=6)
def mean(*inputs):
    """Mean-6+ (numpy broadcasting, which 6-7 did not need)."""
    return _fold(jnp.add, inputs) / len(inputs)


# --------------------------------------------------------------------------- activations


@register("Relu", since=6)
def relu(x):
    """Relu-6+."""
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@register("LeakyRelu", since=6)
def leaky_relu(x, *, alpha):
    """LeakyRelu-6+."""
    return jnp.where(x < 0, x * alpha, x)


@register("PRelu", since=7)
def prelu(x, slope):
    """PRelu-7+ (slope broadcasts to x)."""
    return jnp.where(x < 0, x * slope, x)


@register("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha):
    """ThresholdedRelu-10+."""
    return jnp.where(x > alpha, x, jnp.zeros((), x.dtype))


def _elu(x, alpha):
    # expm1 of min(x, 0): the unused branch never overflows, so gradients stay finite.
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


@register("Elu", since=6)
def elu(x, *, alpha):
    """Elu-6+."""
    return _elu(x, alpha)


@register("Selu", since=6)
def selu(x, *, alpha, gamma):
    """Selu-6+."""
    return gamma * _elu(x, alpha)


@register("Celu", since=12)
def celu(x, *, alpha):
    """Celu-12+."""
    return jnp.maximum(x, 0) + jnp.minimum(0, alpha * jnp.expm1(jnp.minimum(x, 0) / alpha))


@register("Sigmoid", since=6)
def sigmoid(x):
    """Sigmoid-6+."""
    return jax.nn.sigmoid(x)


@register("HardSigmoid", since=6)
def hard_sigmoid(x, *, alpha, beta):
    """HardSigmoid-6+."""
    return jnp.clip(x * alpha + beta, 0, 1)


@register("HardSwish", since=14)
def hard_swish(x):
    """HardSwish-14+ (x * HardSigmoid(x, alpha=1/6, beta=0.5))."""
    return x * jnp.clip(x * (1 / 6) + 0.5, 0, 1)


@register("Tanh", since=6)
def tanh(x):
    """Tanh-6+."""
    return jnp.tanh(x)


@register("Softplus", since=1)
def softplus(x):
    """Softplus-1+ (log(1 + exp(x)), computed without overflow)."""
    return jnp.logaddexp(x, jnp.zeros((), x.dtype))


@register("Softsign", since=1)
def softsign(x):
    """Softsign-1+."""
    return x / (1 + jnp.abs(x))


@register("Gelu", since=20)
def gelu(x, *, approximate):
    """Gelu-20+ (approximate "none" or "tanh")."""
    if approximate not in ("none", "tanh"):
        raise OpError(
            f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if approximate == "tanh":
        c = float(np.sqrt(2 / np.pi))
        return 0.5 * x * (1 + jnp.tanh(c * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + jax.scipy.special.erf(x * float(1 / np.sqrt(2))))


@register("Mish", since=18)
def mish(x):
    """Mish-18+ (x * tanh(softplus(x)))."""
    return x * jnp.tanh(softplus(x))


@register("Swish", since=24)
def swish(x, *, alpha):
    """Swish-24+ (x * sigmoid(alpha * x))."""
    return x * jax.nn.sigmoid(x * alpha)


@register("Shrink", since=9)
def shrink(x, *, bias, lambd):
    """Shrink-9+ (integer inputs: computed in float, truncated back)."""

    def f(v):
        zero = jnp.zeros((), v.dtype)
        return jnp.where(v < -lambd, v + bias, jnp.where(v > lambd, v - bias, zero))

    return _via_float(f, x)


# --------------------------------------------------------------------------- clip


def _clip(x, lo, hi):
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return jnp.asarray(x)


@register("Clip", since=11)
def clip(x, min=None, max=None):  # noqa: A002  (spec input names)
    """Clip-11+ (bounds are optional inputs; min > max gives max, as numpy)."""
    lo = None if min is None else jnp.asarray(min).astype(x.dtype)
    hi = None if max is None else jnp.asarray(max).astype(x.dtype)
    return _clip(x, lo, hi)


@register("Clip", since=6)
def clip_6(x, *, min=None, max=None):  # noqa: A002
    """Clip-6 (bounds as float attributes)."""
    return _clip(x, None if min is None else jnp.asarray(min, x.dtype),
                 None if max is None else jnp.asarray(max, x.dtype))


# --------------------------------------------------------------------------- comparison and logic


def _compare(fn, npfn, a, b):
    if _is_str(a) or _is_str(b):
        return npfn(np.asarray(a, dtype=object), np.asarray(b, dtype=object)).astype(np.bool_)
    return fn(a, b)


@register("Equal", since=7)
def equal(a, b):
    """Equal-7+ (strings from 19, compared statically)."""
    return _compare(jnp.equal, np.equal, a, b)


@register("Equal", since=1)
def equal_1(a, b, *, broadcast=None, axis=None):
    """Equal-1 (legacy axis broadcasting)."""
    return _compare(jnp.equal, np.equal, a, _legacy_broadcast(a, b, broadcast, axis))


@register("Less", since=7)
def less(a, b):
    """Less-7+."""
    return jnp.less(a, b)


@register("Less", since=1)
def less_1(a, b, *, broadcast=None, axis=None):
    """Less-1 (legacy axis broadcasting)."""
    return jnp.less(a, _legacy_broadcast(a, b, broadcast, axis))


@register("Greater", since=7)
def greater(a, b):
    """Greater-7+."""
    return jnp.greater(a, b)


@register("Greater", since=1)
def greater_1(a, b, *, broadcast=None, axis=None):
    """Greater-1 (legacy axis broadcasting)."""
    return jnp.greater(a, _legacy_broadcast(a, b, broadcast, axis))


@register("LessOrEqual", since=12)
def less_or_equal(a, b):
    """LessOrEqual-12+."""
    return jnp.less_equal(a, b)


@register("GreaterOrEqual", since=12)
def greater_or_equal(a, b):
    """GreaterOrEqual-12+."""
    return jnp.greater_equal(a, b)


@register("Not", since=1)
def not_(x):
    """Not-1+."""
    return jnp.logical_not(x)


@register("And", since=7)
def and_(a, b):
    """And-7+."""
    return jnp.logical_and(a, b)


@register("And", since=1)
def and_1(a, b, *, broadcast=None, axis=None):
    """And-1 (legacy axis broadcasting)."""
    return jnp.logical_and(a, _legacy_broadcast(a, b, broadcast, axis))


@register("Or", since=7)
def or_(a, b):
    """Or-7+."""
    return jnp.logical_or(a, b)


@register("Or", since=1)
def or_1(a, b, *, broadcast=None, axis=None):
    """Or-1 (legacy axis broadcasting)."""
    return jnp.logical_or(a, _legacy_broadcast(a, b, broadcast, axis))


@register("Xor", since=7)
def xor(a, b):
    """Xor-7+."""
    return jnp.logical_xor(a, b)


@register("Xor", since=1)
def xor_1(a, b, *, broadcast=None, axis=None):
    """Xor-1 (legacy axis broadcasting)."""
    return jnp.logical_xor(a, _legacy_broadcast(a, b, broadcast, axis))


@register("BitwiseAnd", since=18)
def bitwise_and(a, b):
    """BitwiseAnd-18+."""
    return jnp.bitwise_and(a, b)


@register("BitwiseOr", since=18)
def bitwise_or(a, b):
    """BitwiseOr-18+."""
    return jnp.bitwise_or(a, b)


@register("BitwiseXor", since=18)
def bitwise_xor(a, b):
    """BitwiseXor-18+."""
    return jnp.bitwise_xor(a, b)


@register("BitwiseNot", since=18)
def bitwise_not(x):
    """BitwiseNot-18+."""
    return jnp.bitwise_not(x)


@register("BitShift", since=11)
def bit_shift(x, y, *, direction):
    """BitShift-11+ (signed right shifts are arithmetic; shifts outside [0, bits) give 0 or -1)."""
    if direction not in ("LEFT", "RIGHT"):
        raise OpError(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    dt = _dtype(x)
    x, y = jnp.broadcast_arrays(x, jnp.asarray(y).astype(dt))
    bits = np.iinfo(dt).bits
    out_of_range = (y < 0) | (y >= bits)
    safe = jnp.where(out_of_range, jnp.zeros((), dt), y)
    if direction == "LEFT":
        return jnp.where(out_of_range, jnp.zeros((), dt), lax.shift_left(x, safe))
    if jnp.issubdtype(dt, jnp.signedinteger):
        fill = jnp.where(x < 0, jnp.asarray(-1, dt), jnp.zeros((), dt))
        return jnp.where(out_of_range, fill, lax.shift_right_arithmetic(x, safe))
    return jnp.where(out_of_range, jnp.zeros((), dt), lax.shift_right_logical(x, safe))


@register("IsNaN", since=9)
def is_nan(x):
    """IsNaN-9+."""
    return jnp.isnan(x)


@register("IsInf", since=10)
def is_inf(x, *, detect_negative, detect_positive):
    """IsInf-10+."""
    if detect_negative and detect_positive:
        return jnp.isinf(x)
    if detect_positive:
        return jnp.isposinf(x)
    if detect_negative:
        return jnp.isneginf(x)
    return jnp.zeros(jnp.shape(x), jnp.bool_)


@register("Where", since=9)
def where(condition, x, y):
    """Where-9+ (numpy broadcasting; string branches are evaluated statically)."""
    return _where(condition, x, y)


# --------------------------------------------------------------------------- casts

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
        if _is_str(x):
            return x
        return _cast_to_strings(static(x, "input (cast to string)"))
    dt = _onnx_dtype(to)
    if _is_str(x):
        return _cast_from_strings(x, dt)
    src = _dtype(x)
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
    src = _dtype(x)
    if _is_str(x) or dt.kind in "OUS":
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
