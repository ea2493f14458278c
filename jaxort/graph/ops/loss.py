"""Loss ops: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

Both take scores/log-probabilities [N, C, d1, ...] and integer targets
[N, d1, ...]; gradients flow to the scores (and weights). Half-precision
inputs are computed in float32 and the results cast back.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register
from jaxort.graph.ops._common import at_least_float32


def _nll(log_prob, target, weight, reduction, ignore_index):
    """Returns the NLL loss of ``log_prob`` [N, C, ...] (compute dtype) at ``target``."""
    if jnp.ndim(log_prob) < 2:
        raise OpError(f"input must have rank >= 2 [N, C, ...], "
                      f"given shape {list(jnp.shape(log_prob))}")
    expected = (log_prob.shape[0],) + tuple(log_prob.shape[2:])
    if tuple(jnp.shape(target)) != expected:
        raise OpError(f"target shape {list(jnp.shape(target))} does not "
                      f"match input shape {list(log_prob.shape)} (expected {list(expected)})")
    if reduction not in ("none", "sum", "mean"):
        raise OpError(f"unknown reduction {reduction!r}")
    n_classes = log_prob.shape[1]
    target = jnp.asarray(target)
    if ignore_index is not None:
        keep = target != jnp.asarray(ignore_index, target.dtype)
        safe = jnp.where(keep, target, jnp.zeros((), target.dtype))
    else:
        keep = None
        safe = target
    # Out-of-range targets are an error in ONNX; clip so XLA's gather stays defined.
    safe = jnp.clip(safe, 0, n_classes - 1)
    picked = jnp.take_along_axis(log_prob, jnp.expand_dims(safe, 1), axis=1)
    loss = -jnp.squeeze(picked, axis=1)
    w = None
    if weight is not None:
        w = jnp.take(jnp.asarray(weight).astype(log_prob.dtype), safe, axis=0)
    if keep is not None:
        mask = keep.astype(log_prob.dtype)
        w = mask if w is None else w * mask
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    total = jnp.sum(loss)
    if reduction == "sum":
        return total
    if w is None:
        return total / jnp.asarray(loss.size, log_prob.dtype)
    return total / jnp.sum(w)


@register("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(x, target, weight=None, *, reduction, ignore_index=None):
    """NegativeLogLikelihoodLoss-12/13/22; mean divides by the summed weights of kept targets."""
    dtype = np.dtype(x.dtype)
    xc = x.astype(at_least_float32(dtype))
    return _nll(xc, target, weight, reduction, ignore_index).astype(dtype)


@register("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(scores, labels, weights=None, *, reduction, ignore_index=None):
    """SoftmaxCrossEntropyLoss-12/13; returns (loss, log_prob)."""
    dtype = np.dtype(scores.dtype)
    x = scores.astype(at_least_float32(dtype))
    if jnp.ndim(x) < 2:
        raise OpError(f"scores must have rank >= 2 [N, C, ...], "
                      f"given shape {list(jnp.shape(x))}")
    log_prob = jax.nn.log_softmax(x, axis=1)
    loss = _nll(log_prob, labels, weights, reduction, ignore_index)
    return loss.astype(dtype), log_prob.astype(dtype)
