"""Gradient rule of SoftmaxCrossEntropyLoss (ORT's SoftmaxCrossEntropyLossGrad).

Part of the training layer: it imports the rules' shared helpers only.
"""

from __future__ import annotations

from jaxort.training.artifacts.gradient._common import _attrs, _error, _ms_node, _second_output


def _softmax_cross_entropy(em, node, dys, needs):
    if len(node.input) > 2 and node.input[2] and needs[2]:
        raise _error(node, "has class weights that depend on a trainable parameter")
    reduction = _attrs(node).get("reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("mean", "sum", "none"):
        raise _error(node, f"has an unknown reduction {reduction!r}")
    log_prob = _second_output(em, node, dys, "log_prob")
    out = em.name("SoftmaxCrossEntropyLossGrad")
    _ms_node(em, "SoftmaxCrossEntropyLossGrad", [dys[0], log_prob, *node.input[1:]], [out], node.attribute)
    return [out] + [None] * (len(node.input) - 1)


#: op type -> rule.
RULES: dict = {"SoftmaxCrossEntropyLoss": _softmax_cross_entropy}
