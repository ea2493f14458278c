"""Dropout: the identity in inference, a random mask drawn from the node's key in training.

Dropout-12+ drops where its ``training_mode`` input is true inside a jaxort
training step, or wherever the caller passes a PRNG key (``apply(..., rng=key)``;
the ONNX backend passes a fresh one per run to a model with random nodes, as
ONNX Runtime draws anew on every run). Without a key, outside a training step,
it is the identity.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.graph import register


def _identity_dropout(x, mask_dtype=jnp.bool_):
    return x, jnp.ones(x.shape, mask_dtype)


@register("Dropout", since=1, foldable=False)
def dropout_1(data, *, is_test=None, ratio=None, consumed_inputs=None):
    """Dropout-1..9 (identity: jaxort never drops for the old forms)."""
    return _identity_dropout(data, data.dtype)


@register("Dropout", since=10, foldable=False)
def dropout_10(data, *, ratio=None):
    """Dropout-10..11 (identity, boolean mask)."""
    return _identity_dropout(data)


@register("Dropout", since=12, foldable=False)
def dropout(data, ratio=None, training_mode=None, *, seed=None, ctx):
    """Dropout-12+ (random with training_mode true in a training step or given a key; seed ignored)."""
    if training_mode is None or not (ctx.training or ctx.has_rng):
        return _identity_dropout(data)
    if ratio is not None and isinstance(ratio, (np.ndarray, np.generic, float)) and \
            float(np.asarray(ratio)) == 0.0:
        return _identity_dropout(data)
    r = 0.5 if ratio is None else jnp.asarray(ratio).astype(jnp.float32)
    mask = jax.random.bernoulli(ctx.rng(), 1.0 - r, data.shape)
    out = jnp.where(mask, data / jnp.asarray(1.0 - r).astype(data.dtype), jnp.zeros((), data.dtype))
    if isinstance(training_mode, (np.ndarray, np.generic, bool)):
        if not bool(np.asarray(training_mode)):
            return _identity_dropout(data)
        return out, mask
    flag = jnp.asarray(training_mode).astype(jnp.bool_)
    return jnp.where(flag, out, data), jnp.where(flag, mask, True)
