"""Gradient rules of the normalizations (Layer, Instance, Group, MeanVariance, RMS, LRN, Lp) and com.microsoft
BatchNormInternal.

Also :func:`to_batch_norm_internal`, which writes BatchNormalization nodes
as the BatchNormInternal its rule reads, as ORT's generate_artifacts does.

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from jaxort.graph import normalize_domain
from jaxort.training.artifacts.gradient._common import _MS_DOMAIN, _attrs, _error, _ms_node, _unbroadcast


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


def _mean_over(em, axes, t):
    """``mean(v)``: the mean of ``v`` (of type ``t``) over ``axes``, kept as size-1 dimensions."""
    axes = em.ints(axes)

    def mean(v):
        total = em.op("ReduceSum", [v, axes], keepdims=1)
        return em.op("Div", [total, em.op("Cast", [em.op("Div", [em.op("Size", [v]), em.op("Size", [total])])], to=t)])
    return mean


def _normalized(em, x, axes, epsilon, t):
    """(X normalized over ``axes``, the inverse std, the mean over ``axes``), from X (of type ``t``) alone."""
    mean = _mean_over(em, axes, t)
    centred = em.op("Sub", [x, mean(x)])
    inv_std = em.op("Reciprocal", [em.op("Sqrt", [em.op("Add", [mean(em.op("Mul", [centred, centred])),
                                                               em.const(float(epsilon), t)])])])
    return em.op("Mul", [centred, inv_std]), inv_std, mean


def _through_normalization(em, g, xhat, inv_std, mean):
    """The gradient through x -> (x - mean) * inv_std of ``g``, the gradient at its output."""
    return em.op("Mul", [inv_std, em.op("Sub", [em.op("Sub", [g, mean(g)]),
                                               em.op("Mul", [xhat, mean(em.op("Mul", [g, xhat]))])])])


def _instance_normalization(em, node, dys, needs):
    # The normalization backward over each (sample, channel)'s spatial values, in standard
    # ops (ORT 1.19.2 has no rule): the statistics are recomputed from X.
    x, scale, _ = node.input
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    per_channel = em.ints([0] + list(range(2, len(dims))))
    xhat, inv_std, mean = _normalized(em, x, list(range(2, len(dims))), _attrs(node).get("epsilon", 1e-5),
                                      em.elem_type(x))
    dy = dys[0]
    g = em.op("Mul", [dy, em.op("Unsqueeze", [scale, em.ints(list(range(1, len(dims) - 1)))])])
    return [_through_normalization(em, g, xhat, inv_std, mean) if needs[0] else None,
            em.op("ReduceSum", [em.op("Mul", [dy, xhat]), per_channel], keepdims=0) if needs[1] else None,
            em.op("ReduceSum", [dy, per_channel], keepdims=0) if needs[2] else None]


def _group_normalization(em, node, dys, needs):
    # Instance normalization of X viewed as [N, groups, -1] (ORT 1.19.2 has no rule); scale and
    # bias per group (GroupNormalization-18) or per channel (21).
    x, scale, _ = node.input
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    attrs = _attrs(node)
    grouped = em.ints([0, int(attrs["num_groups"]), -1])
    shape = em.op("Shape", [x])
    xhat, inv_std, mean = _normalized(em, em.op("Reshape", [x, grouped]), [2], attrs.get("epsilon", 1e-5),
                                      em.elem_type(x))
    dy = dys[0]
    if em.opset >= 21:  # per channel: scale as [C, 1, ...]; sums over the batch and spatial axes
        others = em.ints([0] + list(range(2, len(dims))))
        g = em.op("Reshape", [em.op("Mul", [dy, em.op("Unsqueeze", [scale, em.ints(list(range(1, len(dims) - 1)))])]),
                              grouped])
        d_scale = em.op("ReduceSum", [em.op("Mul", [dy, em.op("Reshape", [xhat, shape])]), others], keepdims=0)
        d_bias = em.op("ReduceSum", [dy, others], keepdims=0)
    else:  # per group: scale as [G, 1] against [N, G, -1]
        dy_grouped = em.op("Reshape", [dy, grouped])
        g = em.op("Mul", [dy_grouped, em.op("Unsqueeze", [scale, em.ints([1])])])
        d_scale = em.op("ReduceSum", [em.op("Mul", [dy_grouped, xhat]), em.ints([0, 2])], keepdims=0)
        d_bias = em.op("ReduceSum", [dy_grouped, em.ints([0, 2])], keepdims=0)
    dx = em.op("Reshape", [_through_normalization(em, g, xhat, inv_std, mean), shape])
    return [dx if needs[0] else None, d_scale if needs[1] else None, d_bias if needs[2] else None]


def _mean_variance_normalization(em, node, dys, needs):
    # Y = C / (sqrt(mean(C^2)) + 1e-9), C = X - mean(X), over ``axes`` (the schema's function
    # body, epsilon outside the root): dX = (G - mean(G)) / D - C * mean(G * C) / (D^2 * S),
    # S = sqrt(mean(C^2)), D = S + 1e-9. ORT 1.19.2 has no rule.
    x = node.input[0]
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    t = em.elem_type(x)
    mean = _mean_over(em, [a % len(dims) for a in _attrs(node).get("axes", [0, 2, 3])], t)
    centred = em.op("Sub", [x, mean(x)])
    std = em.op("Sqrt", [mean(em.op("Mul", [centred, centred]))])
    denominator = em.op("Add", [std, em.const(1e-9, t)])
    g = dys[0]
    first = em.op("Div", [em.op("Sub", [g, mean(g)]), denominator])
    second = em.op("Div", [em.op("Mul", [centred, mean(em.op("Mul", [g, centred]))]),
                           em.op("Mul", [em.op("Mul", [denominator, denominator]), std])])
    return [em.op("Sub", [first, second])]


def _rms_normalization(em, node, dys, needs):
    # Y = X * R * scale, R = 1 / sqrt(mean(X^2) + epsilon) over the axes from ``axis`` on:
    # dX = R * (G - X^ * mean(G * X^)), G = dY * scale, X^ = X * R; dScale sums dY * X^ over
    # the axes scale was broadcast along. ORT 1.19.2 reads no opset 23 model, so has no rule.
    x, scale = node.input[:2]
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    attrs = _attrs(node)
    t = em.elem_type(x)
    mean = _mean_over(em, list(range(int(attrs.get("axis", -1)) % len(dims), len(dims))), t)
    inv_rms = em.op("Reciprocal", [em.op("Sqrt", [em.op("Add", [mean(em.op("Mul", [x, x])),
                                                               em.const(float(attrs.get("epsilon", 1e-5)), t)])])])
    xhat = em.op("Mul", [x, inv_rms])
    dy = dys[0]
    dx = d_scale = None
    if needs[0]:
        g = em.op("Mul", [dy, scale])
        dx = em.op("Mul", [inv_rms, em.op("Sub", [g, em.op("Mul", [xhat, mean(em.op("Mul", [g, xhat]))])])])
    if needs[1]:
        d_scale = _unbroadcast(em, node, em.op("Mul", [dy, xhat]), scale, node.output[0])
    return [dx, d_scale]


def _lrn(em, node, dys, needs):
    # Y = X * S^-beta, S = bias + alpha / size * (X^2 summed over the channels c - lo .. c + hi),
    # lo = (size - 1) // 2, hi = size - 1 - lo: dX = dY * S^-beta - 2 alpha beta / size * X *
    # (U summed over the channels i - hi .. i + lo), U = dY * X * S^(-beta - 1). Both window
    # sums are a Conv of a ones kernel along the channels of X seen as [N, 1, C, -1].
    # ORT 1.19.2 has no rule.
    x = node.input[0]
    attrs = _attrs(node)
    size = int(attrs["size"])
    alpha, beta, bias = (float(attrs.get(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    t = em.elem_type(x)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    shape = em.op("Shape", [x])
    channels = em.op("Concat", [em.op("Gather", [shape, em.ints([0])]), em.ints([1]),
                                em.op("Gather", [shape, em.ints([1])]), em.ints([-1])], axis=0)
    ones = em.const(np.ones((1, 1, size, 1)), t)

    def window(v, before, after):
        return em.op("Reshape", [em.op("Conv", [em.op("Reshape", [v, channels]), ones], pads=[before, 0, after, 0]),
                                 shape])

    s = em.op("Add", [em.const(bias, t), em.op("Mul", [em.const(alpha / size, t),
                                                      window(em.op("Mul", [x, x]), lo, hi)])])
    s_beta = em.op("Pow", [s, em.const(-beta, t)])
    dy = dys[0]
    u = em.op("Div", [em.op("Mul", [em.op("Mul", [dy, x]), s_beta]), s])
    spread = em.op("Mul", [em.op("Mul", [x, window(u, hi, lo)]), em.const(2.0 * alpha * beta / size, t)])
    return [em.op("Sub", [em.op("Mul", [dy, s_beta]), spread])]


def _lp_normalization(em, node, dys, needs):
    # Y = X / N along ``axis``: p = 2, N = sqrt(sum X^2): dX = (dY - Y * sum(dY * Y)) / N;
    # p = 1, N = sum |X|: dX = dY / N - sign(X) * sum(dY * X) / N^2; N of a zero vector is 1, as
    # jaxort's forward divides it (where dX is then dY). ORT 1.19.2 has no rule.
    x = node.input[0]
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    attrs = _attrs(node)
    p = int(attrs.get("p", 2))
    if p not in (1, 2):
        raise _error(node, f"has p={p}; the spec allows 1 and 2")
    axis = em.ints([int(attrs.get("axis", -1)) % len(dims)])
    dy = dys[0]

    def total(v):
        return em.op("ReduceSum", [v, axis], keepdims=1)

    def nonzero(norm):  # as the forward: a zero vector is divided by 1
        one = em.const(1.0, em.elem_type(x))
        return em.op("Where", [em.op("Equal", [norm, em.const(0.0, em.elem_type(x))]), one, norm])
    if p == 2:
        y = node.output[0]
        norm = nonzero(em.op("Sqrt", [total(em.op("Mul", [x, x]))]))
        return [em.op("Div", [em.op("Sub", [dy, em.op("Mul", [y, total(em.op("Mul", [dy, y]))])]), norm])]
    norm = nonzero(total(em.op("Abs", [x])))
    spread = em.op("Div", [em.op("Mul", [em.op("Sign", [x]), total(em.op("Mul", [dy, x]))]),
                           em.op("Mul", [norm, norm])])
    return [em.op("Sub", [em.op("Div", [dy, norm]), spread])]


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
RULES: dict = {"LayerNormalization": _layer_normalization, "InstanceNormalization": _instance_normalization,
               "GroupNormalization": _group_normalization, "MeanVarianceNormalization": _mean_variance_normalization,
               "RMSNormalization": _rms_normalization, "LRN": _lrn, "LpNormalization": _lp_normalization}

#: com.microsoft op type -> rule.
MS_RULES: dict = {"BatchNormInternal": _batch_norm_internal}
