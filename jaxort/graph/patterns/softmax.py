"""Softmax and LogSoftmax, alone and followed by their loss.

Matched forms:

- ``softmax``: the Softmax and LogSoftmax ops, and softmax written out with
  the max subtracted: ReduceMax(x) -> Sub(x, max) -> Exp -> ReduceSum ->
  Div(exp, sum); LogSoftmax written out ends Log(sum) -> Sub(x - max, log).
- ``softmax_cross_entropy``: SoftmaxCrossEntropyLoss, and LogSoftmax(axis 1)
  -> NegativeLogLikelihoodLoss, both without class weights (weighted losses
  run op by op).

The derivative rules are ``custom_jvp`` (forward mode works) whose transposes
are the backward passes, from the softmax the forward computed: dx = y * (g -
sum(g * y)) for softmax, g - softmax * sum(g) for log-softmax, and (softmax -
onehot) * g for the loss. Narrower floats compute in float32 and are cast back.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.graph.numerics import at_least_float32
from jaxort.graph.patterns._common import as_dtype, positive_axes
from jaxort.graph.patterns._match import Match, is_op, register_pattern


# ---------------------------------------------------------------- softmax


def _softmax_forward(x, axes, log):
    xc = as_dtype(x, at_least_float32(x.dtype))
    d = xc - jax.lax.stop_gradient(jnp.max(xc, axis=axes, keepdims=True))
    e = jnp.exp(d)
    s = jnp.sum(e, axis=axes, keepdims=True)
    return d - jnp.log(s) if log else e / s


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _softmax(x, axes, log):
    return as_dtype(_softmax_forward(x, axes, log), x.dtype)


def _softmax_jvp(axes, log, primals, tangents):
    (x,), (dx,) = primals, tangents
    y = _softmax_forward(x, axes, log)
    dxc = as_dtype(dx, y.dtype)
    # Transposed: g - softmax * sum(g), and y * (g - sum(g * y)): one reduction each.
    if log:
        dy = dxc - jnp.sum(jnp.exp(y) * dxc, axis=axes, keepdims=True)
    else:
        dy = y * dxc - y * jnp.sum(y * dxc, axis=axes, keepdims=True)
    return as_dtype(y, x.dtype), as_dtype(dy, x.dtype)


_softmax.defjvp(_softmax_jvp)


def softmax(x, *, axes, log=False, coerce=False):
    """Softmax (log-softmax with ``log``) of ``x`` over ``axes``.

    ``coerce`` gives the opset < 13 ops' meaning: ``x`` flattened to 2-D at
    ``axes[0]``, the softmax taken over the second dimension.
    """
    if coerce:
        axis = positive_axes(axes, x.ndim)[0]
        lead = int(np.prod(x.shape[:axis], dtype=np.int64))
        return _softmax(x.reshape((lead, -1)), (1,), bool(log)).reshape(x.shape)
    return _softmax(x, positive_axes(axes, x.ndim), bool(log))


@register_pattern("softmax_op", anchors=("Softmax", "LogSoftmax"), handler=softmax, priority=10)
def match_softmax_op(g, node):
    """The Softmax and LogSoftmax ops (any opset)."""
    coerce = g.opset() < 13
    axis = int(g.attr(node, "axis", 1 if coerce else -1))
    return Match((node,), (node.input[0],), (node.output[0],),
                 {"axes": (axis,), "log": node.op_type == "LogSoftmax", "coerce": coerce})


@register_pattern("softmax", anchors=("ReduceMax",), handler=softmax, priority=10)
def match_softmax(g, max_node):
    """Softmax or log-softmax written out, from the ReduceMax of its input."""
    found = g.reduce_axes(max_node)
    if found is None or found[0] is None or not found[1]:
        return None
    axes = found[0]
    x, m = max_node.input[0], max_node.output[0]
    sub = g.sole_consumer(m, "Sub")
    if sub is None or tuple(sub.input) != (x, m):
        return None
    d = sub.output[0]
    users = g.consumers(d)
    exp = [n for n in users if is_op(n, "Exp")]
    if len(exp) != 1:
        return None
    e = exp[0].output[0]
    e_users = g.consumers(e)
    sums = [n for n in e_users if is_op(n, "ReduceSum")]
    if len(sums) != 1 or g.reduce_axes(sums[0]) != (axes, 1):
        return None
    s = sums[0].output[0]
    nodes = [max_node, sub, exp[0], sums[0]]
    if len(users) == 1 and len(e_users) == 2:
        div = [n for n in e_users if is_op(n, "Div") and tuple(n.input) == (e, s)]
        if len(div) != 1 or g.sole_consumer(s) is not div[0]:
            return None
        return Match(tuple(nodes + div), (x,), (div[0].output[0],), {"axes": axes, "log": False})
    log = g.sole_consumer(s, "Log")
    if log is None or len(users) != 2 or len(e_users) != 1:
        return None
    out = g.sole_consumer(log.output[0], "Sub")
    if out is None or tuple(out.input) != (d, log.output[0]):
        return None
    return Match(tuple(nodes + [log, out]), (x,), (out.output[0],), {"axes": axes, "log": True})


# ---------------------------------------------------------------- softmax + loss


def _picked(log_prob, labels, ignore_index):
    n_classes = log_prob.shape[1]
    labels = jnp.asarray(labels)
    if ignore_index is None:
        keep = jnp.ones(labels.shape, log_prob.dtype)
        safe = labels
    else:
        kept = labels != jnp.asarray(ignore_index, labels.dtype)
        keep = kept.astype(log_prob.dtype)
        safe = jnp.where(kept, labels, jnp.zeros((), labels.dtype))
    # Out-of-range labels are an error in ONNX; clip so XLA's gather stays defined.
    safe = jnp.clip(safe, 0, n_classes - 1)
    picked = jnp.squeeze(jnp.take_along_axis(log_prob, jnp.expand_dims(safe, 1), axis=1), 1)
    return picked, safe, keep


def _reduce(loss, keep, reduction):
    if reduction == "none":
        return loss, None
    total = jnp.sum(loss)
    if reduction == "sum":
        return total, None
    denom = jnp.sum(keep)
    return total / denom, denom


def _sce_forward(x, labels, reduction, ignore_index):
    xc = as_dtype(x, at_least_float32(x.dtype))
    log_prob = _softmax_forward(xc, (1,), True)
    picked, safe, keep = _picked(log_prob, labels, ignore_index)
    loss, denom = _reduce(-picked * keep, keep, reduction)
    return loss, log_prob, (safe, keep, denom)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def _sce(x, labels, reduction, ignore_index, with_log_prob):
    loss, log_prob, _ = _sce_forward(x, labels, reduction, ignore_index)
    loss = as_dtype(loss, x.dtype)
    return (loss, as_dtype(log_prob, x.dtype)) if with_log_prob else loss


def _sce_jvp(reduction, ignore_index, with_log_prob, primals, tangents):
    x, labels = primals
    dx, _ = tangents  # the labels are integers
    loss, log_prob, (safe, keep, denom) = _sce_forward(x, labels, reduction, ignore_index)
    dxc = as_dtype(dx, log_prob.dtype)
    # The log-softmax tangent at the labels, picked by a comparison with the
    # class index rather than a gather: transposed, (softmax - onehot) * g in
    # one loop and one reduction over the classes, where a gather's transpose
    # is a scatter into a zero tensor (the 20-16-5 MLP's step: 81 -> 69 us).
    dlp = dxc - jnp.sum(jnp.exp(log_prob) * dxc, axis=1, keepdims=True)
    classes = jnp.reshape(jnp.arange(dlp.shape[1], dtype=safe.dtype), (1, -1) + (1,) * (dlp.ndim - 2))
    at_label = classes == jnp.expand_dims(safe, 1)
    dpicked = jnp.sum(jnp.where(at_label, dlp, jnp.zeros((), dlp.dtype)), axis=1)
    dloss = -dpicked * keep
    if reduction != "none":
        dloss = jnp.sum(dloss)
        if reduction == "mean":
            dloss = dloss / denom
    out, dout = as_dtype(loss, x.dtype), as_dtype(dloss, x.dtype)
    if with_log_prob:
        return (out, as_dtype(log_prob, x.dtype)), (dout, as_dtype(dlp, x.dtype))
    return out, dout


_sce.defjvp(_sce_jvp)


def softmax_cross_entropy(scores, labels, *, reduction, ignore_index=None, log_prob=False,
                          axis=1):
    """Mean/sum/none softmax cross-entropy of ``scores`` [N, C, ...] at integer ``labels``.

    With ``log_prob`` it also returns the log-probabilities. ``axis`` is the
    LogSoftmax's axis of a LogSoftmax -> NegativeLogLikelihoodLoss pair; the
    fused rule needs it to be the class axis 1, else the pair runs as written.
    """
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"unknown reduction {reduction!r}")
    if (axis + scores.ndim if axis < 0 else axis) != 1 or scores.ndim < 2:
        lp = jax.nn.log_softmax(as_dtype(scores, at_least_float32(scores.dtype)), axis=axis)
        picked, _, keep = _picked(lp, labels, ignore_index)
        loss = as_dtype(_reduce(-picked * keep, keep, reduction)[0], scores.dtype)
        return (loss, as_dtype(lp, scores.dtype)) if log_prob else loss
    return _sce(scores, labels, reduction, ignore_index, bool(log_prob))


def _loss_attrs(g, node):
    return {"reduction": g.attr(node, "reduction", "mean"),
            "ignore_index": g.attr(node, "ignore_index")}


@register_pattern("softmax_cross_entropy_op", anchors=("SoftmaxCrossEntropyLoss",),
                  handler=softmax_cross_entropy, priority=30)
def match_softmax_cross_entropy_op(g, node):
    """SoftmaxCrossEntropyLoss without weights."""
    if len(node.input) > 2 and node.input[2]:
        return None
    outputs = tuple(node.output[:2])
    attrs = dict(_loss_attrs(g, node), log_prob=len(outputs) > 1 and bool(outputs[1]))
    return Match((node,), tuple(node.input[:2]), outputs if attrs["log_prob"] else outputs[:1],
                 attrs)


@register_pattern("log_softmax_nll", anchors=("NegativeLogLikelihoodLoss",),
                  handler=softmax_cross_entropy, priority=30)
def match_log_softmax_nll(g, node):
    """LogSoftmax -> NegativeLogLikelihoodLoss without weights (opset 13+ LogSoftmax)."""
    if (len(node.input) > 2 and node.input[2]) or g.opset() < 13:
        return None
    ls = g.producer(node.input[0])
    if not is_op(ls, "LogSoftmax") or g.sole_consumer(ls.output[0]) is not node:
        return None
    attrs = dict(_loss_attrs(g, node), axis=int(g.attr(ls, "axis", -1)))
    return Match((ls, node), (ls.input[0], node.input[1]), (node.output[0],), attrs)
