"""Random ops: RandomNormal(Like), RandomUniform(Like), Bernoulli, Multinomial.

They draw from the PRNG key the caller gives (``apply(..., rng=key)``, one
key per node). Without one, a node with a ``seed`` attribute uses a key made
from that seed (the same numbers on every call); a node without either is an
error. The numbers are JAX's, not those of numpy or ONNX Runtime. Never folded.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import OpError
from jaxort.graph import register


def _key(ctx, seed):
    try:
        key = ctx.rng()
    except OpError:
        if seed is None:
            raise
        return jax.random.key(int(seed))
    return key if seed is None else jax.random.fold_in(key, int(seed))


def _float_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind != "f" and dtype != np.dtype("bfloat16"):
        raise OpError(f"dtype must be a floating-point type, given {dtype}")
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _normal(key, shape, dtype, mean, scale):
    dtype = _float_dtype(dtype)
    wide = np.dtype(np.float32) if dtype.itemsize < 4 else dtype
    return (jax.random.normal(key, shape, wide) * scale + mean).astype(dtype)


def _uniform(key, shape, dtype, low, high):
    dtype = _float_dtype(dtype)
    wide = np.dtype(np.float32) if dtype.itemsize < 4 else dtype
    return jax.random.uniform(key, shape, wide, minval=low, maxval=high).astype(dtype)


@register("RandomNormal", since=1, foldable=False)
def random_normal(*, shape, dtype, mean, scale, seed=None, ctx):
    """RandomNormal-1/22 (JAX's generator)."""
    return _normal(_key(ctx, seed), tuple(int(d) for d in shape), to_numpy_dtype(dtype),
                   mean, scale)


@register("RandomUniform", since=1, foldable=False)
def random_uniform(*, shape, dtype, low, high, seed=None, ctx):
    """RandomUniform-1/22 (JAX's generator)."""
    return _uniform(_key(ctx, seed), tuple(int(d) for d in shape), to_numpy_dtype(dtype),
                    low, high)


@register("RandomNormalLike", since=1, foldable=False)
def random_normal_like(x, *, dtype=None, mean, scale, seed=None, ctx):
    """RandomNormalLike-1/22 (JAX's generator)."""
    out = x.dtype if dtype is None else to_numpy_dtype(dtype)
    return _normal(_key(ctx, seed), tuple(jnp.shape(x)), out, mean, scale)


@register("RandomUniformLike", since=1, foldable=False)
def random_uniform_like(x, *, dtype=None, low, high, seed=None, ctx):
    """RandomUniformLike-1/22 (JAX's generator)."""
    out = x.dtype if dtype is None else to_numpy_dtype(dtype)
    return _uniform(_key(ctx, seed), tuple(jnp.shape(x)), out, low, high)


@register("Bernoulli", since=15, foldable=False)
def bernoulli(x, *, dtype=None, seed=None, ctx):
    """Bernoulli-15/22 (JAX's generator)."""
    out = np.dtype(x.dtype) if dtype is None else to_numpy_dtype(dtype)
    p = jnp.asarray(x)
    u = jax.random.uniform(_key(ctx, seed), p.shape, p.dtype)
    return (u < p).astype(jax.dtypes.canonicalize_dtype(out))


@register("Multinomial", since=7, foldable=False)
def multinomial(x, *, dtype, sample_size, seed=None, ctx):
    """Multinomial-7/22: x [batch, classes] unnormalized log-probabilities (JAX's generator)."""
    if jnp.ndim(x) != 2:
        raise OpError(f"input must be [batch, classes], given shape "
                      f"{list(jnp.shape(x))}")
    logits = jnp.asarray(x)
    samples = jax.random.categorical(_key(ctx, seed), logits, axis=-1,
                                     shape=(int(sample_size), logits.shape[0]))
    return samples.T.astype(jax.dtypes.canonicalize_dtype(to_numpy_dtype(dtype)))
