"""Gelu written out with Erf or Tanh, optionally with the bias Add before it.

Matched forms (operands of Add and Mul in either order):

- ``gelu``: x * 0.5 * (1 + Erf(x / sqrt(2))), the division also written as
  Mul(x, 1/sqrt(2)), the three factors x, 0.5 and (1 + Erf) multiplied in any
  grouping (PyTorch and tf2onnx exports).
- ``gelu`` with ``approximate="tanh"``: 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x +
  0.044715 * x^3))), the cube as Pow(x, 3) or Mul(x, Mul(x, x)).
- The Gelu op (opset 20+).
- Any of them with the Add that makes x (a bias, as BiasGelu and FastGelu
  take it) when nothing else reads x.

The derivative rule (a ``custom_jvp``: forward mode works, and its
transpose is the backward pass) reuses the Erf or Tanh value: d/dx = 0.5 (1 +
erf) + x exp(-x^2 / 2) / sqrt(2 pi), or 0.5 (1 + t) + 0.5 x (1 - t^2)
sqrt(2/pi) (1 + 3 * 0.044715 x^2). Narrower floats compute in float32 and are
cast back.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from jaxort.graph.numerics import at_least_float32, has_tangent, sum_tangents
from jaxort.graph.patterns._common import as_dtype
from jaxort.graph.patterns._match import Match, is_op, register_pattern

_SQRT_HALF = 1 / math.sqrt(2)
_SQRT_2_PI = math.sqrt(2 / math.pi)
_CUBIC = 0.044715


def _gelu_forward(h, tanh):
    if tanh:
        t = jnp.tanh(_SQRT_2_PI * (h + _CUBIC * h * h * h))
    else:
        t = jax.scipy.special.erf(h * _SQRT_HALF)
    return 0.5 * h * (1 + t), t


def _gelu_slope(h, t, tanh):
    if tanh:
        return 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * _SQRT_2_PI * (1 + 3 * _CUBIC * h * h)
    return 0.5 * (1 + t) + h * jnp.exp(-0.5 * h * h) * (1 / math.sqrt(2 * math.pi))


def _sum(a, b, cd):
    return as_dtype(a, cd) if b is None else as_dtype(a, cd) + as_dtype(b, cd)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _gelu(a, b, tanh):
    dtype = jnp.result_type(a) if b is None else jnp.result_type(a, b)
    return as_dtype(_gelu_forward(_sum(a, b, at_least_float32(dtype)), tanh)[0], dtype)


def _gelu_jvp(tanh, primals, tangents):
    a, b = primals
    da, db = tangents
    dtype = jnp.result_type(a) if b is None else jnp.result_type(a, b)
    cd = at_least_float32(dtype)
    h = _sum(a, b, cd)
    y, t = _gelu_forward(h, tanh)
    dh = sum_tangents([as_dtype(d, cd) for d in (da, db) if has_tangent(d)], h.shape, cd)
    # The slope times the tangent: transposed, the cotangent times the slope, one loop.
    return as_dtype(y, dtype), as_dtype(_gelu_slope(h, t, tanh) * dh, dtype)


_gelu.defjvp(_gelu_jvp, symbolic_zeros=True)


def gelu(a, b=None, *, approximate="none"):
    """Gelu(a + b) (b optional), exact with Erf or ``approximate="tanh"``."""
    return _gelu(a, b, approximate == "tanh")


def _near(value, target) -> bool:
    # bfloat16 keeps 8 bits of mantissa: its sqrt(2/pi) is 0.13% off.
    return value is not None and abs(value - target) <= 4e-3 * abs(target)


def _binary(g, node, name, op_type):
    """The other operand of ``node`` (a binary ``op_type`` reading ``name``), or None."""
    if not is_op(node, op_type):
        return None
    return g.other_input(node, name)


def _times_half_x(g, u, x):
    """The product x * 0.5 * u above ``u`` in any grouping: (nodes, out) or None."""
    m1 = g.sole_consumer(u, "Mul")
    if m1 is None:
        return None
    o = g.other_input(m1, u)
    if o == x or _near(g.scalar(o), 0.5):
        m2 = g.sole_consumer(m1.output[0], "Mul")
        rest = None if m2 is None else g.other_input(m2, m1.output[0])
        want_x = o != x
        if rest is None or (rest != x if want_x else not _near(g.scalar(rest), 0.5)):
            return None
        return [m1, m2], m2.output[0]
    half = g.producer(o)
    if is_op(half, "Mul") and x in half.input and _near(g.scalar(g.other_input(half, x)), 0.5):
        return [half, m1], m1.output[0]
    return None


def _with_bias(g, x, nodes, out, approximate):
    """The match, with the Add making x folded in when nothing else reads x."""
    add = g.producer(x)
    inside = {id(n) for n in nodes}
    if (is_op(add, "Add") and x not in g.protected
            and all(id(c) in inside for c in g.consumers(x))):
        return Match(tuple([add] + nodes), tuple(add.input), (out,), {"approximate": approximate})
    return Match(tuple(nodes), (x, ""), (out,), {"approximate": approximate})


@register_pattern("gelu", anchors=("Erf",), handler=gelu, priority=10)
def match_gelu(g, erf):
    """Gelu with Erf, from the Erf node."""
    scaled = g.producer(erf.input[0])
    if is_op(scaled, "Div") and _near(g.scalar(scaled.input[1]), math.sqrt(2)):
        x = scaled.input[0]
    elif is_op(scaled, "Mul"):
        x = next((i for i in scaled.input if _near(g.scalar(g.other_input(scaled, i)),
                                                   _SQRT_HALF)), None)
        if x is None:
            return None
    else:
        return None
    one = g.sole_consumer(erf.output[0], "Add")
    if one is None or not _near(g.scalar(g.other_input(one, erf.output[0])), 1.0):
        return None
    tail = _times_half_x(g, one.output[0], x)
    if tail is None:
        return None
    nodes = [scaled, erf, one] + tail[0]
    return _with_bias(g, x, nodes, tail[1], "none")


def _cube(g, name):
    """(x, nodes) when ``name`` is Pow(x, 3) or Mul(x, Mul(x, x)) in any order, else None."""
    node = g.producer(name)
    if is_op(node, "Pow") and g.scalar(node.input[1]) == 3.0:
        return node.input[0], [node]
    if not is_op(node, "Mul"):
        return None
    for i in node.input:
        sq = g.producer(g.other_input(node, i))
        if is_op(sq, "Mul") and tuple(sq.input) == (i, i):
            return i, [sq, node]
    return None


@register_pattern("gelu_tanh", anchors=("Tanh",), handler=gelu, priority=10)
def match_gelu_tanh(g, tanh):
    """Gelu's tanh approximation, from the Tanh node."""
    scaled = g.producer(tanh.input[0])
    if not is_op(scaled, "Mul"):
        return None
    inner = next((i for i in scaled.input
                  if _near(g.scalar(g.other_input(scaled, i)), _SQRT_2_PI)), None)
    add = g.producer(inner)
    if not is_op(add, "Add"):
        return None
    for x in add.input:
        k = g.producer(g.other_input(add, x))
        if not is_op(k, "Mul"):
            continue
        for c in k.input:
            found = _cube(g, g.other_input(k, c))
            if found is not None and found[0] == x and _near(g.scalar(c), _CUBIC):
                cube_nodes = found[1]
                break
        else:
            continue
        break
    else:
        return None
    one = g.sole_consumer(tanh.output[0], "Add")
    if one is None or not _near(g.scalar(g.other_input(one, tanh.output[0])), 1.0):
        return None
    tail = _times_half_x(g, one.output[0], x)
    if tail is None:
        return None
    nodes = cube_nodes + [k, add, scaled, tanh, one] + tail[0]
    return _with_bias(g, x, nodes, tail[1], "tanh")


@register_pattern("gelu_op", anchors=("Gelu",), handler=gelu, priority=10)
def match_gelu_op(g, node):
    """The Gelu op (opset 20+), with the Add making its input when nothing else reads it."""
    approximate = g.attr(node, "approximate", "none")
    if g.opset() < 20 or approximate not in ("none", "tanh"):
        return None
    return _with_bias(g, node.input[0], [node], node.output[0], approximate)
