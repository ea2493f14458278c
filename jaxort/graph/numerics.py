"""Numeric helpers the op handlers, the fused patterns and the gradient-graph writer share.

Dtype widening for statistics, ONNX's auto_pad arithmetic, the CPU-only
lowering switch, a fusion fence, and the tangent helpers of ``custom_jvp``
rules. Re-exported by ``jaxort/graph/ops/_common.py`` for the op modules.
Layer: graph (imports JAX, numpy and jaxort.errors only).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Iterator, Optional

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jaxort.errors import OpError

__all__ = ["at_least_float32", "auto_pads", "fence", "has_tangent", "lowering_platform", "on_cpu_else",
           "sum_tangents"]


def at_least_float32(dtype) -> np.dtype:
    """float32 for floats narrower than 32 bits, else ``dtype`` itself.

    Statistics (means, variances, log-sum-exps) accumulated in float16 or
    bfloat16 drift; ORT computes them in float32 too and casts the result back.
    """
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def auto_pads(in_sp, eff_k, strides, auto_pad, pads):
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


_LOWERING_PLATFORM: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "jaxort_lowering_platform", default=None)


@contextlib.contextmanager
def lowering_platform(platform: Optional[str]) -> Iterator[None]:
    """Traces inside the block for one platform: each CPU-or-default choice is made at trace time.

    Without it (or with None) a choice traces both branches and XLA keeps the
    one of the platform it compiles for (``lax.platform_dependent``), which
    costs trace time and a conditional for autodiff to differentiate:
    ResNet-50's train step traced in 4.3 s that way and in 2.4 s knowing its
    platform. jaxort's compiled steps trace for the platform of the state
    they are first called with. A program traced inside the block and
    lowered for another platform computes the same values, through the
    other platform's forms.

    Args:
      platform: a JAX platform name ("cpu", "gpu", "tpu", ...) or None.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> with lowering_platform("cpu"):
      ...     jax.make_jaxpr(lambda x: on_cpu_else(x, jnp.sin, jnp.cos))(1.0).eqns[0].primitive.name
      'sin'
    """
    token = _LOWERING_PLATFORM.set(platform)
    try:
        yield
    finally:
        _LOWERING_PLATFORM.reset(token)


def on_cpu_else(x, cpu, default):
    """``cpu(x)`` when the computation is lowered for CPU, ``default(x)`` elsewhere.

    The choice is made when XLA compiles the program for its device, not from
    the default backend at trace time, so a model placed on a GPU keeps the
    default path; inside :func:`lowering_platform` it is made at trace time.
    """
    platform = _LOWERING_PLATFORM.get()
    if platform is None:
        return lax.platform_dependent(x, cpu=cpu, default=default)
    return cpu(x) if platform == "cpu" else default(x)


def fence(x, key):
    """``x`` unchanged, computed once: a boundary XLA's fusion does not cross.

    XLA copies a cheap elementwise producer into every fusion that consumes
    it, so a 25-term sum read by three fusions is computed three times, and
    a tensor read through 25 slices 25 times. A conditional's operands and
    results are materialized, so ``x`` passed through one is computed once.
    The predicate, ``k == k or k != k`` of ``key``'s first value, holds
    for every value (NaN included) but XLA cannot fold it, so the other
    branch (``-x``, different so that XLA cannot merge the two) never runs.
    ``lax.optimization_barrier`` would say this more plainly, but XLA's CPU
    pipeline drops it before fusion. Costs one copy of ``x`` and a few
    microseconds; differentiable, and under ``vmap`` a select.

    ``key`` must not depend on what is differentiated through ``x``: in a
    JVP rule, fence a tangent with a primal.
    """
    if np.size(key) == 0:
        return x  # nothing to key on; an empty key leaves the fence out
    k = jnp.reshape(key, (-1,))[0]
    return lax.cond((k == k) | (k != k), lambda v: v, lambda v: -v, x)


def has_tangent(t) -> bool:
    """Whether a ``custom_jvp`` rule's tangent (``symbolic_zeros=True``) is live.

    Not None (an absent optional input) and not a ``SymbolicZero`` (a
    constant input): the rule adds no term for it.
    """
    return t is not None and not isinstance(t, SymbolicZero)


def sum_tangents(parts, shape, dtype):
    """A rule's tangent terms summed, broadcast to ``shape`` and cast to ``dtype`` (zeros when none)."""
    total = functools.reduce(jnp.add, parts) if parts else jnp.zeros((), dtype)
    return jnp.broadcast_to(total, shape).astype(dtype)
