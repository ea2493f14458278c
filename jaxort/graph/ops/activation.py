"""Activations: Relu and its variants, Sigmoid, Tanh, Softplus, Gelu, Mish, Swish, Shrink and Clip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register
from jaxort.graph.ops._common import clip as _clip
from jaxort.graph.ops._common import leaky_relu as _leaky_relu
from jaxort.graph.ops._common import relu as _relu
from jaxort.graph.ops._common import via_float


@register("Relu", since=6)
def relu(x):
    """Relu-6+ (derivative 0 at 0, as ORT's ReluGrad)."""
    return _relu(x)


@register("LeakyRelu", since=6)
def leaky_relu(x, *, alpha):
    """LeakyRelu-6+ (slope alpha at 0, as ORT's LeakyReluGrad)."""
    return _leaky_relu(x, alpha)


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

    return via_float(f, x)


@register("Clip", since=11)
def clip(x, min=None, max=None):  # noqa: A002  (spec input names)
    """Clip-11+ (bounds are optional inputs; min > max gives max, as numpy; derivative 1 at the bounds, as ORT)."""
    lo = None if min is None else jnp.asarray(min).astype(x.dtype)
    hi = None if max is None else jnp.asarray(max).astype(x.dtype)
    return _clip(x, lo, hi)


@register("Clip", since=6)
def clip_6(x, *, min=None, max=None):  # noqa: A002
    """Clip-6 (bounds as float attributes)."""
    return _clip(x, None if min is None else jnp.asarray(min, x.dtype),
                 None if max is None else jnp.asarray(max, x.dtype))
