"""Gradient rules of arithmetic and other elementwise ops: Add ... Pow, Max, Min, Mean, Erf, Where, Cast, Dropout.

Part of the training layer: it imports the rules' shared helpers only.
"""

from __future__ import annotations

import numpy as np

from jaxort.training.artifacts.gradient._common import _attrs, _elementwise, _error, _scalar, _second_output, _unbroadcast


def _add(em, node, dys, needs):
    a, b = node.input
    return [_unbroadcast(em, node, dys[0], a, node.output[0]) if needs[0] else None,
            _unbroadcast(em, node, dys[0], b, node.output[0]) if needs[1] else None]


def _sub(em, node, dys, needs):
    a, b = node.input
    return [_unbroadcast(em, node, dys[0], a, node.output[0]) if needs[0] else None,
            _unbroadcast(em, node, em.op("Neg", [dys[0]]), b, node.output[0]) if needs[1] else None]


def _mul(em, node, dys, needs):
    a, b = node.input
    y = node.output[0]
    return [_unbroadcast(em, node, em.op("Mul", [dys[0], b]), a, y) if needs[0] else None,
            _unbroadcast(em, node, em.op("Mul", [dys[0], a]), b, y) if needs[1] else None]


def _div(em, node, dys, needs):
    a, b = node.input
    y = node.output[0]
    da = _unbroadcast(em, node, em.op("Div", [dys[0], b]), a, y) if needs[0] else None
    db = None
    if needs[1]:
        db = _unbroadcast(em, node, em.op("Neg", [em.op("Div", [em.op("Mul", [dys[0], y]), b])]), b, y)
    return [da, db]


def _mod(em, node, dys, needs):
    # Y = A - B * trunc(A / B) (fmod=1, which floating-point inputs must set): dA = dY,
    # dB = -dY * trunc(A / B), each summed over the axes it was broadcast along. ORT 1.19.2
    # has no rule.
    if not int(_attrs(node).get("fmod", 0)):
        raise _error(node, "has floating-point inputs with fmod=0; the spec asks fmod=1 for them")
    a, b = node.input
    y = node.output[0]
    q = em.op("Div", [a, b])
    q = em.op("Mul", [em.op("Sign", [q]), em.op("Floor", [em.op("Abs", [q])])])
    return [_unbroadcast(em, node, dys[0], a, y) if needs[0] else None,
            _unbroadcast(em, node, em.op("Neg", [em.op("Mul", [dys[0], q])]), b, y) if needs[1] else None]


def _sum(em, node, dys, needs):
    return [_unbroadcast(em, node, dys[0], x, node.output[0]) if need else None
            for x, need in zip(node.input, needs)]


def _where(em, node, dys, needs):
    # dY where the condition picks the input, else 0, summed back over the axes along
    # which the input was broadcast (ORT 1.19.2 leaves a broadcast input's gradient
    # unreduced: docs/gradient-graph.md).
    _, a, b = node.input
    y = node.output[0]
    cond = node.input[0]
    zero = _scalar(em, 0.0, y)
    return [None,
            _unbroadcast(em, node, em.op("Where", [cond, dys[0], zero]), a, y) if needs[1] else None,
            _unbroadcast(em, node, em.op("Where", [cond, zero, dys[0]]), b, y) if needs[2] else None]


def _chosen(em, node, dys, needs):
    # Max, Min: dY where an input is the chosen value (every tie gets it, as ORT's builder
    # does), summed over the axes along which the input was broadcast.
    y = node.output[0]
    return [_unbroadcast(em, node, em.op("Mul", [dys[0], em.op("Cast", [em.op("Equal", [x, y])],
                                                                   to=em.elem_type(y))]), x, y)
            if need else None for x, need in zip(node.input, needs)]


def _mean(em, node, dys, needs):
    y = node.output[0]
    share = em.op("Div", [dys[0], _scalar(em, float(len(node.input)), y)])
    return [_unbroadcast(em, node, share, x, y) if need else None for x, need in zip(node.input, needs)]


def _pow(em, node, dys, needs):
    x, e = node.input
    if needs[1]:
        raise _error(node, "has an exponent that depends on a trainable parameter")
    exponent = em.static(e)
    if exponent is None or exponent.size != 1:
        raise _error(node, f"has an exponent {e!r} that is not a constant scalar")
    k = float(exponent.reshape(()))
    if k == 2.0:
        factor = em.op("Mul", [_scalar(em, 2.0, x), x])
    else:
        factor = em.op("Mul", [_scalar(em, k, x), em.op("Pow", [x, _scalar(em, k - 1.0, x)])])
    return [em.op("Mul", [dys[0], factor]), None]


def _erf(em, x, y, dy):
    # d erf(x) = 2 / sqrt(pi) * exp(-x^2)
    gauss = em.op("Exp", [em.op("Neg", [em.op("Mul", [x, x])])])
    return em.op("Mul", [dy, em.op("Mul", [_scalar(em, 2.0 / np.sqrt(np.pi), x), gauss])])


def _identity(em, node, dys, needs):
    return [dys[0]]


def _cast(em, node, dys, needs):
    return [em.op("Cast", [dys[0]], to=em.elem_type(node.input[0]))]


def _cast_like(em, node, dys, needs):
    return _cast(em, node, dys, needs) + [None]  # the target only gives its type


def _dropout(em, node, dys, needs):
    # y = x * mask / (1 - ratio) when training_mode is true, else y = x. Without a
    # training_mode input Dropout is the identity, and so is its gradient (ORT's
    # DropoutGrad scales it by 1 / (1 - ratio) all the same).
    training = node.input[2] if len(node.input) > 2 and node.input[2] else None
    out = [None] * len(node.input)
    if training is None:
        out[0] = dys[0]
        return out
    mask = _second_output(em, node, dys, "mask")
    x = node.input[0]
    t = em.elem_type(x)
    ratio = node.input[1] if len(node.input) > 1 and node.input[1] else em.const(0.5, t)
    ratio = em.op("Cast", [ratio], to=t)
    scale = em.op("Div", [em.op("Cast", [mask], to=t), em.op("Sub", [_scalar(em, 1.0, x), ratio])])
    out[0] = em.op("Where", [training, em.op("Mul", [dys[0], scale]), dys[0]])
    return out


#: op type -> rule.
RULES: dict = {
    "Add": _add, "Sub": _sub, "Mul": _mul, "Div": _div, "Mod": _mod, "Sum": _sum,
    "Max": _chosen, "Min": _chosen, "Mean": _mean,
    "Neg": _elementwise(lambda em, x, y, dy: em.op("Neg", [dy])),
    "Abs": _elementwise(lambda em, x, y, dy: em.op("Mul", [dy, em.op("Sign", [x])])),
    "Exp": _elementwise(lambda em, x, y, dy: em.op("Mul", [dy, y])),
    "Log": _elementwise(lambda em, x, y, dy: em.op("Div", [dy, x])),
    "Sqrt": _elementwise(lambda em, x, y, dy: em.op("Div", [dy, em.op("Mul", [_scalar(em, 2.0, y), y])])),
    "Reciprocal": _elementwise(lambda em, x, y, dy: em.op("Neg", [em.op("Mul", [dy, em.op("Mul", [y, y])])])),
    "Pow": _pow, "Erf": _elementwise(_erf), "Where": _where,
    "Identity": _identity, "Cast": _cast, "CastLike": _cast_like, "Dropout": _dropout,
}
