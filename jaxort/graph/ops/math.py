"""Elementwise arithmetic, comparison, logic and activation ops."""

import jax
import jax.numpy as jnp

from jaxort.graph import register


@register("Add", since=7)
def add(a, b):
    """Add-7+ (numpy broadcasting)."""
    return jnp.add(a, b)


@register("Relu", since=6)
def relu(x):
    """Relu-6+."""
    return jnp.maximum(x, jnp.zeros((), x.dtype))
