"""Optimizer ops of the ai.onnx.preview.training domain: Adagrad, Adam, Momentum.

Each takes the learning rate R and step count T, then the tensors of n
parameters grouped by kind (all X, then all G, then the state tensors), and
returns the new values grouped the same way.
"""

import jax.numpy as jnp

from jaxort.errors import OpError
from jaxort.graph import register

_DOMAIN = "ai.onnx.preview.training"


def _groups(tensors, kinds):
    if len(tensors) % kinds:
        raise OpError(f"expected a multiple of {kinds} tensors after R and "
                      f"T, got {len(tensors)}")
    n = len(tensors) // kinds
    return [tensors[i * n:(i + 1) * n] for i in range(kinds)]


def _scalar(v, dtype):
    return jnp.reshape(jnp.asarray(v), ()).astype(dtype)


@register("Adagrad", since=1, domain=_DOMAIN)
def adagrad(r, t, *tensors, decay_factor, epsilon, norm_coefficient):
    """Adagrad-1."""
    xs, gs, hs = _groups(tensors, 3)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        lr = _scalar(r, x.dtype) / (1 + _scalar(t, x.dtype) * decay_factor)
        g = norm_coefficient * x + g
        h = h + g * g
        new_x.append((x - lr * g / (jnp.sqrt(h) + epsilon)).astype(x.dtype))
        new_h.append(h.astype(x.dtype))
    return tuple(new_x + new_h)


@register("Adam", since=1, domain=_DOMAIN)
def adam(r, t, *tensors, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post):
    """Adam-1 (bias correction from the first step on, T > 0)."""
    xs, gs, vs, hs = _groups(tensors, 4)
    outs_x, outs_v, outs_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        step = _scalar(t, x.dtype)
        lr = _scalar(r, x.dtype)
        g = norm_coefficient * x + g
        v = alpha * v + (1 - alpha) * g
        h = beta * h + (1 - beta) * (g * g)
        safe = jnp.maximum(step, 1)
        corrected = lr * jnp.sqrt(1 - beta ** safe) / (1 - alpha ** safe)
        lr = jnp.where(step > 0, corrected, lr)
        x = (1 - norm_coefficient_post) * (x - lr * (v / (jnp.sqrt(h) + epsilon)))
        outs_x.append(x.astype(xs[0].dtype))
        outs_v.append(v.astype(xs[0].dtype))
        outs_h.append(h.astype(xs[0].dtype))
    return tuple(outs_x + outs_v + outs_h)


@register("Momentum", since=1, domain=_DOMAIN)
def momentum(r, t, *tensors, alpha, beta, mode, norm_coefficient):
    """Momentum-1 (standard and nesterov modes)."""
    if mode not in ("standard", "nesterov"):
        raise OpError(f"mode must be 'standard' or 'nesterov', got {mode!r}")
    xs, gs, vs = _groups(tensors, 3)
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        lr = _scalar(r, x.dtype)
        g = norm_coefficient * x + g
        b = jnp.where(_scalar(t, x.dtype) > 0, beta, 1.0).astype(x.dtype)
        v = alpha * v + b * g
        x = x - lr * (g + alpha * v) if mode == "nesterov" else x - lr * v
        new_x.append(x.astype(xs[0].dtype))
        new_v.append(v.astype(xs[0].dtype))
    return tuple(new_x + new_v)
