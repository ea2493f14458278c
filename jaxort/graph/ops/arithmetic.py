"""Elementwise arithmetic: Add, Sub, Mul, Div, Pow, Mod, the unary functions (Neg .. Atanh), Det,
and the variadic Min, Max, Sum and Mean.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxort.errors import OpError
from jaxort.graph import register
from jaxort.graph.ops._common import abs_ as _abs
from jaxort.graph.ops._common import dtype_of, legacy_broadcast, via_float
from jaxort.graph.ops._common import is_inexact, is_integer


@register("Add", since=7)
def add(a, b):
    """Add-7+ (numpy broadcasting)."""
    return jnp.add(a, b)


@register("Add", since=1)
def add_1(a, b, *, broadcast=None, axis=None, consumed_inputs=None):
    """Add-1/6 (legacy axis broadcasting)."""
    return jnp.add(a, legacy_broadcast(a, b, broadcast, axis))


@register("Sub", since=7)
def sub(a, b):
    """Sub-7+ (numpy broadcasting)."""
    return jnp.subtract(a, b)


@register("Sub", since=1)
def sub_1(a, b, *, broadcast=None, axis=None, consumed_inputs=None):
    """Sub-1/6 (legacy axis broadcasting)."""
    return jnp.subtract(a, legacy_broadcast(a, b, broadcast, axis))


@register("Mul", since=7)
def mul(a, b):
    """Mul-7+ (numpy broadcasting)."""
    return jnp.multiply(a, b)


@register("Mul", since=1)
def mul_1(a, b, *, broadcast=None, axis=None, consumed_inputs=None):
    """Mul-1/6 (legacy axis broadcasting)."""
    return jnp.multiply(a, legacy_broadcast(a, b, broadcast, axis))


def _div(a, b):
    if is_integer(dtype_of(a)):
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
    return _div(a, legacy_broadcast(a, b, broadcast, axis))


def _pow(x, y):
    xd, yd = dtype_of(x), dtype_of(y)
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
    return _pow(x, legacy_broadcast(x, y, broadcast, axis))


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
    """Abs-6+ (derivative 0 at 0, as ORT's Abs gradient)."""
    return _abs(x)


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


@register("Erf", since=9)
def erf(x):
    """Erf-9+ (integer inputs are computed in float and truncated back)."""
    return via_float(jax.scipy.special.erf, x)


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
