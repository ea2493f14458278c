"""Gradient rules of one-input elementwise ops ORT 1.19.2 has no builder for, in standard ONNX ops.

Trigonometric and hyperbolic functions and their inverses, Softplus,
Softsign, Elu, Selu, Celu, ThresholdedRelu, Mish, Gelu-20, Shrink; and Sign, Floor,
Ceil, Round and Hardmax, whose gradient is zero, as is that of EyeLike,
RandomNormalLike and RandomUniformLike (their outputs do not depend on the input's
values) and of Bernoulli (a draw). Each rule is ``dY * f'(X)`` with ``f'``
written from X (or the output Y, where that is cheaper).

Part of the training layer: it imports the rules' shared helpers only.
"""

from __future__ import annotations

import numpy as np

from jaxort.training.artifacts.gradient._common import _attrs, _scalar


def _times(fn):
    """A rule for ``node``: ``dY * fn(em, node, x, y)``."""
    def rule(em, node, dys, needs):
        return [em.op("Mul", [dys[0], fn(em, node, node.input[0], node.output[0])])]
    return rule


def _op(em, op_type, *inputs, **attrs):
    return em.op(op_type, list(inputs), **attrs)


def _one_minus_square(em, v, like=None):
    """1 - v^2, typed like ``like`` (a graph value; default ``v``)."""
    return _op(em, "Sub", _scalar(em, 1.0, like or v), _op(em, "Mul", v, v))


def _inverse_sqrt(em, value):
    return _op(em, "Reciprocal", _op(em, "Sqrt", value))


def _positive(em, x, then, otherwise):
    """``then`` where X > 0, else ``otherwise``."""
    return _op(em, "Where", _op(em, "Greater", x, _scalar(em, 0.0, x)), then, otherwise)


def _elu(em, node, x, y):
    alpha = float(_attrs(node).get("alpha", 1.0))
    return _positive(em, x, _scalar(em, 1.0, x), _op(em, "Add", y, _scalar(em, alpha, x)))


def _selu(em, node, x, y):
    attrs = _attrs(node)
    alpha = float(attrs.get("alpha", 1.67326319217681884765625))
    gamma = float(attrs.get("gamma", 1.05070102214813232421875))
    return _positive(em, x, _scalar(em, gamma, x), _op(em, "Add", y, _scalar(em, alpha * gamma, x)))


def _celu(em, node, x, y):
    alpha = float(_attrs(node).get("alpha", 1.0))
    return _positive(em, x, _scalar(em, 1.0, x), _op(em, "Exp", _op(em, "Div", x, _scalar(em, alpha, x))))


def _thresholded_relu(em, node, x, y):
    alpha = float(_attrs(node).get("alpha", 1.0))
    return _op(em, "Cast", _op(em, "Greater", x, _scalar(em, alpha, x)), to=em.elem_type(x))


def _mish(em, node, x, y):
    # tanh(softplus(x)) + x * sigmoid(x) * (1 - tanh(softplus(x))^2)
    t = _op(em, "Tanh", _op(em, "Softplus", x))
    return _op(em, "Add", t, _op(em, "Mul", _op(em, "Mul", x, _op(em, "Sigmoid", x)), _one_minus_square(em, t, x)))


def _gelu(em, node, x, y):
    """Gelu-20: Phi(x) + x * phi(x) (erf form), or the derivative of the tanh form."""
    c = lambda v: _scalar(em, v, x)  # noqa: E731
    if _attrs(node).get("approximate", "none") in ("tanh", b"tanh"):
        # 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(sqrt(2/pi)(x + 0.044715 x^3))
        k = float(np.sqrt(2 / np.pi))
        x2 = _op(em, "Mul", x, x)
        cubic = _op(em, "Mul", c(0.044715), _op(em, "Mul", x2, x))
        t = _op(em, "Tanh", _op(em, "Mul", c(k), _op(em, "Add", x, cubic)))
        inner = _op(em, "Mul", c(k), _op(em, "Add", c(1.0), _op(em, "Mul", c(3 * 0.044715), x2)))
        return _op(em, "Add", _op(em, "Mul", c(0.5), _op(em, "Add", c(1.0), t)),
                   _op(em, "Mul", _op(em, "Mul", c(0.5), x), _op(em, "Mul", _one_minus_square(em, t, x), inner)))
    cdf = _op(em, "Mul", c(0.5), _op(em, "Add", c(1.0), _op(em, "Erf", _op(em, "Mul", x, c(float(1 / np.sqrt(2)))))))
    gauss = _op(em, "Exp", _op(em, "Mul", c(-0.5), _op(em, "Mul", x, x)))
    pdf = _op(em, "Mul", c(float(1 / np.sqrt(2 * np.pi))), gauss)
    return _op(em, "Add", cdf, _op(em, "Mul", x, pdf))


def _zero(em, node, dys, needs):
    return [None]


#: op type -> rule.
RULES: dict = {
    "Sin": _times(lambda em, node, x, y: _op(em, "Cos", x)),
    "Cos": _times(lambda em, node, x, y: _op(em, "Neg", _op(em, "Sin", x))),
    "Tan": _times(lambda em, node, x, y: _op(em, "Add", _scalar(em, 1.0, x), _op(em, "Mul", y, y))),
    "Asin": _times(lambda em, node, x, y: _inverse_sqrt(em, _one_minus_square(em, x))),
    "Acos": _times(lambda em, node, x, y: _op(em, "Neg", _inverse_sqrt(em, _one_minus_square(em, x)))),
    "Atan": _times(lambda em, node, x, y: _op(em, "Reciprocal",
                                              _op(em, "Add", _scalar(em, 1.0, x), _op(em, "Mul", x, x)))),
    "Sinh": _times(lambda em, node, x, y: _op(em, "Cosh", x)),
    "Cosh": _times(lambda em, node, x, y: _op(em, "Sinh", x)),
    "Asinh": _times(lambda em, node, x, y: _inverse_sqrt(em, _op(em, "Add", _op(em, "Mul", x, x),
                                                                 _scalar(em, 1.0, x)))),
    "Acosh": _times(lambda em, node, x, y: _inverse_sqrt(em, _op(em, "Sub", _op(em, "Mul", x, x),
                                                                 _scalar(em, 1.0, x)))),
    "Atanh": _times(lambda em, node, x, y: _op(em, "Reciprocal", _one_minus_square(em, x))),
    "Softplus": _times(lambda em, node, x, y: _op(em, "Sigmoid", x)),
    "Softsign": _times(lambda em, node, x, y: _op(em, "Reciprocal", _op(
        em, "Mul", *([_op(em, "Add", _scalar(em, 1.0, x), _op(em, "Abs", x))] * 2)))),
    "Elu": _times(_elu), "Selu": _times(_selu), "Celu": _times(_celu),
    "ThresholdedRelu": _times(_thresholded_relu), "Mish": _times(_mish), "Gelu": _times(_gelu),
    "Shrink": _times(lambda em, node, x, y: _op(em, "Cast", _op(em, "Greater", _op(em, "Abs", x), _scalar(
        em, float(_attrs(node).get("lambd", 0.5)), x)), to=em.elem_type(x))),
    "Sign": _zero, "Floor": _zero, "Ceil": _zero, "Round": _zero, "Hardmax": _zero,
    # outputs that do not depend on the input's values, only on its shape and type, or are
    # draws (Bernoulli's 0/1 samples are piecewise constant in the probabilities)
    "EyeLike": _zero, "RandomNormalLike": _zero, "RandomUniformLike": _zero, "Bernoulli": _zero,
}
