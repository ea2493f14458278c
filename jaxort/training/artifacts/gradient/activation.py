"""Gradient rules of activations: Relu, Sigmoid, Tanh, LeakyRelu, PRelu, Clip, HardSigmoid, HardSwish, Softmax, QuickGelu.

Also the ``x * Sigmoid(x)`` -> com.microsoft QuickGelu fusion ORT's
generate_artifacts runs before it builds the gradient graph.

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from jaxort.graph import normalize_domain
from jaxort.training.artifacts.gradient._common import (
    _MS_DOMAIN,
    _attrs,
    _axis,
    _constant_sources,
    _error,
    _ms_node,
    _output_kernel,
    _scalar,
    _static,
    _unbroadcast,
)


def _leaky_relu(em, node, dys, needs):
    """ORT's LeakyReluGrad(dY, Y): dY where Y > 0, else alpha * dY (alpha at 0, as ORT)."""
    out = em.name("LeakyReluGrad")
    alpha = float(_attrs(node).get("alpha", 0.01))
    _ms_node(em, "LeakyReluGrad", [dys[0], node.output[0]], [out], [helper.make_attribute("alpha", alpha)])
    return [out]


def _clip(em, node, dys, needs):
    """dY where min <= X <= max (bounds included, as ORT's Clip gradient), else 0."""
    if any(needs[1:]):
        raise _error(node, "has a bound that depends on a trainable parameter")
    x = node.input[0]
    inputs = list(node.input) + ["", ""]  # Clip-11+ (the rules need opset 13): "" is an absent bound
    bounds = [inputs[1] or None, inputs[2] or None]
    masks = [em.op(op, [x, bound]) for op, bound in zip(("GreaterOrEqual", "LessOrEqual"), bounds)
             if bound is not None]
    if not masks:
        return [dys[0]]
    mask = masks[0] if len(masks) == 1 else em.op("And", masks)
    return [em.op("Mul", [dys[0], em.op("Cast", [mask], to=em.elem_type(x))])] + [None] * (len(node.input) - 1)


def _hard_sigmoid(em, node, dys, needs):
    """alpha * dY where 0 < alpha * X + beta < 1 (read from Y), else 0: standard ops (ORT 1.19.2 has no rule)."""
    y = node.output[0]
    alpha = float(_attrs(node).get("alpha", 0.2))
    inside = em.op("And", [em.op("Greater", [y, _scalar(em, 0.0, y)]), em.op("Less", [y, _scalar(em, 1.0, y)])])
    slope = em.op("Mul", [em.op("Cast", [inside], to=em.elem_type(y)), _scalar(em, alpha, y)])
    return [em.op("Mul", [dys[0], slope])]


def _prelu(em, node, dys, needs):
    """dY where X > 0, else slope * dY; the slope's gradient dY * X where X <= 0, summed where it was broadcast."""
    x, slope = node.input
    y = node.output[0]
    positive = em.op("Greater", [x, _scalar(em, 0.0, x)])
    dx = em.op("Mul", [dys[0], em.op("Where", [positive, _scalar(em, 1.0, x), slope])]) if needs[0] else None
    ds = None
    if needs[1]:
        ds = _unbroadcast(em, node, em.op("Mul", [dys[0], em.op("Where", [positive, _scalar(em, 0.0, x), x])]),
                          slope, y)
    return [dx, ds]


def _hard_swish(em, node, dys, needs):
    """dY * (X / 3 + 1/2) for -3 < X < 3, dY above, 0 below: standard ops (ORT 1.19.2 has no rule)."""
    x = node.input[0]
    ramp = em.op("Add", [em.op("Mul", [x, _scalar(em, 1.0 / 3.0, x)]), _scalar(em, 0.5, x)])
    slope = em.op("Where", [em.op("Less", [x, _scalar(em, -3.0, x)]), _scalar(em, 0.0, x),
                            em.op("Where", [em.op("Greater", [x, _scalar(em, 3.0, x)]), _scalar(em, 1.0, x),
                                            ramp])])
    return [em.op("Mul", [dys[0], slope])]


def _swish(em, node, dys, needs):
    """dY * s * (1 + alpha * X * (1 - s)), s = Sigmoid(alpha * X): standard ops (Swish is opset 24,
    newer than ORT 1.19.2 reads; ORT's own x * Sigmoid(alpha x) is QuickGelu, whose rule is ORT's kernel)."""
    x = node.input[0]
    alpha = _scalar(em, float(_attrs(node).get("alpha", 1.0)), x)
    scaled = em.op("Mul", [x, alpha])
    s = em.op("Sigmoid", [scaled])
    slope = em.op("Mul", [s, em.op("Add", [_scalar(em, 1.0, x), em.op("Mul", [scaled, em.op(
        "Sub", [_scalar(em, 1.0, x), s])])])])
    return [em.op("Mul", [dys[0], slope])]


def _softmax(em, node, dys, needs):
    # SoftmaxGrad_13(dY, Y): Y * (dY - sum(dY * Y, axis)); LogSoftmaxGrad_13 for LogSoftmax.
    if em.opset < 13:
        raise _error(node, f"is a {node.op_type} of opset < 13 (the 2-D coerced form)")
    _axis(em, node, -1)  # the input's rank must be known
    out = em.name(f"{node.op_type}Grad_13")
    _ms_node(em, f"{node.op_type}Grad_13", [dys[0], node.output[0]], [out], node.attribute)
    return [out]


def _quick_gelu(em, node, dys, needs):
    out = em.name("QuickGeluGrad")
    _ms_node(em, "QuickGeluGrad", [dys[0], node.input[0]], [out], [a for a in node.attribute if a.name == "alpha"])
    return [out]


def _fuse_quick_gelu(model: onnx.ModelProto) -> None:
    """Rewrites ``x * Sigmoid(x)`` and ``x * Sigmoid(alpha * x)`` as com.microsoft QuickGelu, in place.

    As ORT's generate_artifacts does before it builds the gradient graph (its
    QuickGeluFusion), so that the gradient is its one QuickGeluGrad kernel. The
    intermediate values must have no other reader and not be graph outputs.
    """
    graph = model.graph
    readers: dict = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    producer = {o: node for node in graph.node for o in node.output}
    constants = _constant_sources(graph)

    def private(name: str) -> bool:
        return readers.get(name, 0) == 1 and name not in outputs

    def default(node) -> bool:
        return node is not None and normalize_domain(node.domain) == ""

    dropped: set = set()
    for mul in graph.node:
        if mul.op_type != "Mul" or not default(mul) or len(mul.input) != 2:
            continue
        a, b = mul.input
        for x, s in ((a, b), (b, a)):
            sigmoid = producer.get(s)
            if not (default(sigmoid) and sigmoid.op_type == "Sigmoid" and private(s)):
                continue
            alpha, fused = 1.0, [sigmoid]
            if sigmoid.input[0] != x:  # x * Sigmoid(alpha * x)
                scaled = producer.get(sigmoid.input[0])
                if not (default(scaled) and scaled.op_type == "Mul" and private(sigmoid.input[0])):
                    continue
                p, q = scaled.input
                value = _static(constants.get(q if p == x else p)) if x in (p, q) else None
                if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.floating):
                    continue
                alpha = float(value.reshape(()))
                fused.append(scaled)
            dropped.update(id(n) for n in fused)
            mul.op_type, mul.domain = "QuickGelu", _MS_DOMAIN
            del mul.input[:]
            mul.input.append(x)
            mul.attribute.extend([helper.make_attribute("alpha", alpha)])
            break
    if dropped:
        kept = [n for n in graph.node if id(n) not in dropped]
        del graph.node[:]
        graph.node.extend(kept)
        if not any(imp.domain == _MS_DOMAIN for imp in model.opset_import):
            model.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))


#: op type -> rule.
RULES: dict = {
    "Relu": _output_kernel("ReluGrad"), "Sigmoid": _output_kernel("SigmoidGrad"),
    "Tanh": _output_kernel("TanhGrad"), "LeakyRelu": _leaky_relu, "Clip": _clip,
    "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish, "PRelu": _prelu, "Swish": _swish,
    "Softmax": _softmax, "LogSoftmax": _softmax,
}

#: com.microsoft op type -> rule.
MS_RULES: dict = {"QuickGelu": _quick_gelu}
