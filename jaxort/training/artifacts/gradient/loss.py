"""Gradient rules of SoftmaxCrossEntropyLoss (ORT's SoftmaxCrossEntropyLossGrad) and NegativeLogLikelihoodLoss.

Part of the training layer: it imports the rules' shared helpers only.
"""

from __future__ import annotations

from jaxort.training.artifacts.gradient._common import _attrs, _error, _ms_node, _second_output, _text


def _reduction(node, needs) -> str:
    """The loss node's reduction; an error for an unknown one or for trainable class weights."""
    if len(node.input) > 2 and node.input[2] and needs[2]:
        raise _error(node, "has class weights that depend on a trainable parameter")
    reduction = _attrs(node).get("reduction", b"mean")
    reduction = _text(reduction)
    if reduction not in ("mean", "sum", "none"):
        raise _error(node, f"has an unknown reduction {reduction!r}")
    return reduction


def _softmax_cross_entropy(em, node, dys, needs):
    _reduction(node, needs)
    log_prob = _second_output(em, node, dys, "log_prob")
    out = em.name("SoftmaxCrossEntropyLossGrad")
    _ms_node(em, "SoftmaxCrossEntropyLossGrad", [dys[0], log_prob, *node.input[1:]], [out], node.attribute)
    return [out] + [None] * (len(node.input) - 1)


def _negative_log_likelihood(em, node, dys, needs):
    # dInput[n, c, ...] = -[c == target[n, ...]] * w * g: w the target's class weight (1
    # without weights, 0 for an ignored target), g = dY (none, sum) or dY over the sum of w
    # (mean). ORT 1.19.2 has no rule.
    reduction = _reduction(node, needs)
    x, target = node.input[:2]
    weight = node.input[2] if len(node.input) > 2 else ""
    attrs = _attrs(node)
    t = em.elem_type(x)
    safe, w = target, None
    if "ignore_index" in attrs:
        kept = em.op("Not", [em.op("Equal", [target, em.const(int(attrs["ignore_index"]), em.elem_type(target))])])
        safe = em.op("Where", [kept, target, em.const(0, em.elem_type(target))])
        w = em.op("Cast", [kept], to=t)
    if weight:
        w = em.op("Gather", [weight, safe]) if w is None else em.op("Mul", [em.op("Gather", [weight, safe]), w])
    g = dys[0]
    if reduction == "mean":
        count = em.op("Cast", [em.op("Size", [target])], to=t) if w is None else em.op("ReduceSum", [w], keepdims=0)
        g = em.op("Div", [g, count])
    if w is not None:
        g = em.op("Mul", [g, w])
    elif reduction != "none":
        g = em.op("Expand", [g, em.op("Shape", [target])])
    hot = em.op("OneHot", [safe, em.op("Gather", [em.op("Shape", [x]), em.ints([1])]), em.const([0, 1], t)], axis=1)
    return [em.op("Mul", [hot, em.op("Unsqueeze", [em.op("Neg", [g]), em.ints([1])])])] + [None] * (len(node.input) - 1)


#: op type -> rule.
RULES: dict = {"SoftmaxCrossEntropyLoss": _softmax_cross_entropy,
               "NegativeLogLikelihoodLoss": _negative_log_likelihood}
