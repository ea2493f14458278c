"""Neural-network ops: matrix products, convolution, pooling, normalization, softmax."""

import jax.numpy as jnp

from jaxort.graph import register


@register("MatMul", since=1)
def matmul(a, b):
    """MatMul-1+ (numpy matmul semantics)."""
    return jnp.matmul(a, b)
