"""Gradient rules of LayerNormalization, InstanceNormalization and com.microsoft BatchNormInternal.

Also :func:`to_batch_norm_internal`, which writes BatchNormalization nodes
as the BatchNormInternal its rule reads, as ORT's generate_artifacts does.

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

import onnx
from onnx import helper

from jaxort.graph import normalize_domain
from jaxort.training.artifacts.gradient._common import _MS_DOMAIN, _attrs, _error, _ms_node


def _layer_normalization(em, node, dys, needs):
    # LayerNormalizationGrad(dY, X, scale, Mean, InvStdDev) -> dX, dScale, dBias, the forward
    # node gaining its Mean and InvStdDev outputs where it has none, as ORT's builder does.
    if any(d is not None for d in dys[1:]):
        raise _error(node, "has its Mean or InvStdDev output on the path to the loss")
    x, scale = node.input[:2]
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    axis = int(_attrs(node).get("axis", -1)) % len(dims)
    for i, param in enumerate(node.input[1:3], 1):
        if param and needs[i] and not _same_shape(em.dims(param), dims[axis:]):
            raise _error(node, f"has a {'scale' if i == 1 else 'bias'} of shape {em.dims(param)}, "
                               f"not the normalized shape {dims[axis:]}")
    outputs = list(node.output) + [""] * (3 - len(node.output))
    outputs = [o or em.name(what) for o, what in zip(outputs, ("Y", "Mean", "InvStdDev"))]
    del node.output[:]
    node.output.extend(outputs)
    outs = [em.name("LayerNormalizationGrad") for _ in range(3)]
    _ms_node(em, "LayerNormalizationGrad", [dys[0], x, scale, *outputs[1:3]], outs, node.attribute)
    return [o if need else None for o, need in zip(outs, needs)]


def _instance_normalization(em, node, dys, needs):
    # The normalization backward over each (sample, channel)'s spatial values, in standard
    # ops (ORT 1.19.2 has no rule): the statistics are recomputed from X.
    x, scale, _ = node.input
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    t = em.elem_type(x)
    spatial = em.ints(list(range(2, len(dims))))
    per_channel = em.ints([0] + list(range(2, len(dims))))

    def mean(v):
        total = em.op("ReduceSum", [v, spatial], keepdims=1)
        return em.op("Div", [total, em.op("Cast", [em.op("Div", [em.op("Size", [v]), em.op("Size", [total])])], to=t)])

    centred = em.op("Sub", [x, mean(x)])
    eps = em.const(float(_attrs(node).get("epsilon", 1e-5)), t)
    inv_std = em.op("Reciprocal", [em.op("Sqrt", [em.op("Add", [mean(em.op("Mul", [centred, centred])), eps])])])
    xhat = em.op("Mul", [centred, inv_std])
    dy = dys[0]
    g = em.op("Mul", [dy, em.op("Unsqueeze", [scale, per_channel])])
    spread = em.op("Sub", [em.op("Sub", [g, mean(g)]), em.op("Mul", [xhat, mean(em.op("Mul", [g, xhat]))])])
    return [em.op("Mul", [inv_std, spread]) if needs[0] else None,
            em.op("ReduceSum", [em.op("Mul", [dy, xhat]), per_channel], keepdims=0) if needs[1] else None,
            em.op("ReduceSum", [dy, per_channel], keepdims=0) if needs[2] else None]


def _same_shape(dims, normalized) -> bool:
    """Whether a scale or bias of ``dims`` is as large as the ``normalized`` shape (not broadcast).

    A dimension shape inference left symbolic (behind Shape -> Concat -> Reshape
    chains) matches any size but 1, which could be a broadcast.
    """
    return dims is not None and len(dims) == len(normalized) and all(
        a == b or (not isinstance(b, int) and a != 1) for a, b in zip(dims, normalized))


def _batch_norm_internal(em, node, dys, needs):
    # BatchNormalizationGrad(dY, X, scale, saved mean, saved inverse std) -> dX, dScale, dB.
    if any(d is not None for d in dys[1:]):
        raise _error(node, "has a statistics output on the path to the loss")
    if len(node.output) < 5:
        raise _error(node, "lacks its saved mean and inverse std outputs")
    outs = [em.name("BatchNormalizationGrad") for _ in range(3)]
    eps = helper.make_attribute("epsilon", float(_attrs(node).get("epsilon", 1e-5)))
    _ms_node(em, "BatchNormalizationGrad", [dys[0], *node.input[:2], *node.output[3:5]], outs, [eps])
    return [o if need else None for o, need in zip(outs, needs)] + [None] * (len(node.input) - 3)


def to_batch_norm_internal(model: onnx.ModelProto) -> None:
    """Rewrites BatchNormalization nodes as ORT's BatchNormInternal, in place.

    As ORT's generate_artifacts does: a training step normalizes with the
    batch statistics, updates the running mean and variance (ORT writes them
    back into the frozen parameters), and saves the batch mean and inverse std
    for the backward pass (outputs 3 and 4).
    """
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or normalize_domain(node.domain) != "":
            continue
        attrs = _attrs(node)
        # Inference form (one output) or training form (with the running statistics,
        # as PyTorch exports in training mode): both train with batch statistics.
        base = node.output[0]
        outputs = list(node.output) + [""] * (3 - len(node.output))
        outputs = [o or f"{base}_{what}" for o, what in zip(outputs, ("", "running_mean", "running_var"))]
        del node.output[:]
        node.output.extend(outputs + [f"{base}_saved_mean", f"{base}_saved_inv_std"])
        node.op_type, node.domain = "BatchNormInternal", _MS_DOMAIN
        del node.attribute[:]
        node.attribute.extend([helper.make_attribute("epsilon", float(attrs.get("epsilon", 1e-5))),
                               helper.make_attribute("momentum", float(attrs.get("momentum", 0.9))),
                               helper.make_attribute("training_mode", 1)])
    if any(n.domain == _MS_DOMAIN for n in model.graph.node) and not any(
            imp.domain == _MS_DOMAIN for imp in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))


#: op type -> rule.
RULES: dict = {"LayerNormalization": _layer_normalization, "InstanceNormalization": _instance_normalization}

#: com.microsoft op type -> rule.
MS_RULES: dict = {"BatchNormInternal": _batch_norm_internal}
