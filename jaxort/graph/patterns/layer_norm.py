"""Layer normalization and RMS (simplified) normalization, written out or as one op.

Matched forms:

- ``layer_norm``: ReduceMean(x) -> Sub(x, mean) -> Pow(d, 2) or Mul(d, d) ->
  ReduceMean -> Add(eps) -> Sqrt -> Div(d, std), or Mul(d, Reciprocal(std))
  (Keras/tf2onnx, with the scale possibly folded in: Mul(d, Mul(Reciprocal(std),
  scale))), then an optional Mul(scale) and Add(bias), operands in either order
  (PyTorch's and tf2onnx's exports). Also the LayerNormalization op when its
  Mean and InvStdDev outputs are unused.
- ``rms_norm``: Pow(x, 2) or Mul(x, x) -> ReduceMean -> Add(eps) -> Sqrt ->
  Div(x, std) or Mul(x, Reciprocal(std)), optional Mul(scale); and the
  RMSNormalization and SimplifiedLayerNormalization ops with only their first
  output used.

Statistics are computed in float32 for narrower inputs (as the ops' stash_type 1
and ONNX Runtime do). The derivative rules are ``custom_jvp`` (forward mode
works) whose transposes are the backward passes: two row sums for dx (one for
RMS norm), the column sums of dscale and dbias.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxort.graph.numerics import at_least_float32, fence, has_tangent, on_cpu_else, sum_tangents
from jaxort.graph.patterns._common import as_dtype, positive_axes
from jaxort.graph.patterns._match import Match, is_op, register_pattern


def _norm_axes(x, axes, begin_axis):
    if begin_axis is not None:
        begin = begin_axis + x.ndim if begin_axis < 0 else begin_axis
        return tuple(range(begin, x.ndim))
    return positive_axes(axes, x.ndim)


def _affine_keeps_shape(x, *others) -> bool:
    shapes = [np.shape(o) for o in others if o is not None]
    return tuple(np.broadcast_shapes(x.shape, *shapes)) == tuple(x.shape)


def _out_dtype(x, *others):
    return jnp.result_type(x, *[o for o in others if o is not None])


# ---------------------------------------------------------------- layer norm


def _ln_forward(x, scale, bias, axes, epsilon):
    cd = at_least_float32(x.dtype)
    xc = as_dtype(x, cd)
    mean = jnp.mean(xc, axis=axes, keepdims=True)
    d = xc - mean
    inv = lax.rsqrt(jnp.mean(d * d, axis=axes, keepdims=True) + epsilon)
    y = d * inv
    if scale is not None:
        y = y * as_dtype(scale, cd)
    if bias is not None:
        y = y + as_dtype(bias, cd)
    return as_dtype(y, _out_dtype(x, scale, bias)), mean, inv


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _layer_norm(x, scale, bias, axes, epsilon):
    return _ln_forward(x, scale, bias, axes, epsilon)[0]


def _layer_norm_jvp(axes, epsilon, primals, tangents):
    x, scale, bias = primals
    dx, dscale, dbias = tangents
    y, mean, inv = _ln_forward(x, scale, bias, axes, epsilon)
    cd = at_least_float32(x.dtype)
    xhat = (as_dtype(x, cd) - mean) * inv
    parts = []
    if has_tangent(dx):
        # scale * d xhat, d xhat = inv (dx - mean(dx) - xhat mean(dx xhat)); the
        # row statistics times k on their right, so that the transpose takes
        # the two row sums of g * k and g * k * xhat (the backward pass).
        # Fenced on CPU: transposed, the input gradient is computed once, not
        # copied by XLA's CPU fusion into each of its consumers (a transformer
        # step: 40 ms with the fence, 60 without). Elsewhere a fence is a
        # conditional, which a GPU pays a host round trip for.
        dxc = on_cpu_else(as_dtype(dx, cd), lambda t: fence(t, inv), lambda t: t)
        k = inv if scale is None else inv * as_dtype(scale, cd)
        mdx = jnp.mean(dxc, axis=axes, keepdims=True)
        mdxh = jnp.mean(dxc * xhat, axis=axes, keepdims=True)
        parts += [k * dxc, -(mdx * k), -((mdxh * k) * xhat)]
    if has_tangent(dscale):
        parts.append(as_dtype(dscale, cd) * xhat)
    if has_tangent(dbias):
        parts.append(as_dtype(dbias, cd))
    return y, sum_tangents(parts, y.shape, y.dtype)


_layer_norm.defjvp(_layer_norm_jvp, symbolic_zeros=True)


def layer_norm(x, scale=None, bias=None, *, axes=None, begin_axis=None, epsilon):
    """Layer normalization of ``x`` over ``axes`` (or ``begin_axis`` on), then scale and bias."""
    axes = _norm_axes(x, axes, begin_axis)
    if not _affine_keeps_shape(x, scale, bias):
        # A scale or bias that broadcasts x to a larger shape: the plain formula.
        y, _, _ = _ln_forward(x, None, None, axes, epsilon)
        y = y if scale is None else y * scale
        return y if bias is None else y + bias
    return _layer_norm(x, scale, bias, axes, float(epsilon))


# ---------------------------------------------------------------- RMS norm


def _rms_forward(x, scale, axes, epsilon):
    cd = at_least_float32(x.dtype)
    xc = as_dtype(x, cd)
    inv = lax.rsqrt(jnp.mean(xc * xc, axis=axes, keepdims=True) + epsilon)
    y = xc * inv
    if scale is not None:
        y = y * as_dtype(scale, cd)
    return as_dtype(y, _out_dtype(x, scale)), inv


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _rms_norm(x, scale, axes, epsilon):
    return _rms_forward(x, scale, axes, epsilon)[0]


def _rms_norm_jvp(axes, epsilon, primals, tangents):
    x, scale = primals
    dx, dscale = tangents
    y, inv = _rms_forward(x, scale, axes, epsilon)
    cd = at_least_float32(x.dtype)
    xhat = as_dtype(x, cd) * inv
    parts = []
    if has_tangent(dx):
        # scale * inv (dx - xhat mean(dx xhat)): transposed, one row sum of g * k * xhat.
        dxc = as_dtype(dx, cd)
        k = inv if scale is None else inv * as_dtype(scale, cd)
        mdxh = jnp.mean(dxc * xhat, axis=axes, keepdims=True)
        parts += [k * dxc, -((mdxh * k) * xhat)]
    if has_tangent(dscale):
        parts.append(as_dtype(dscale, cd) * xhat)
    return y, sum_tangents(parts, y.shape, y.dtype)


_rms_norm.defjvp(_rms_norm_jvp, symbolic_zeros=True)


def rms_norm(x, scale=None, *, axes=None, begin_axis=None, epsilon):
    """RMS normalization of ``x`` over ``axes`` (or ``begin_axis`` on), then scale."""
    axes = _norm_axes(x, axes, begin_axis)
    if not _affine_keeps_shape(x, scale):
        y, _ = _rms_forward(x, None, axes, epsilon)
        return y if scale is None else y * scale
    return _rms_norm(x, scale, axes, float(epsilon))


# ---------------------------------------------------------------- matchers


def _squares(g, node, x) -> bool:
    """Whether ``node`` computes x ** 2 (Pow(x, 2) or Mul(x, x))."""
    if is_op(node, "Pow"):
        return node.input[0] == x and g.scalar(node.input[1]) == 2.0
    return is_op(node, "Mul") and tuple(node.input) == (x, x)


def _eps_sqrt(g, var):
    """Add(var, eps) -> Sqrt from the variance ``var``: (nodes, eps, std) or None."""
    add = g.sole_consumer(var, "Add")
    if add is None:
        return None
    eps = g.scalar(g.other_input(add, var))
    sqrt = g.sole_consumer(add.output[0], "Sqrt")
    if eps is None or sqrt is None:
        return None
    return [add, sqrt], eps, sqrt.output[0]


def _divide(g, d, std, users):
    """The node of ``users`` dividing ``d`` by ``std``: (nodes, out, folded scale) or None.

    Div(d, std), Mul(d, Reciprocal(std)), or Mul(d, Mul(Reciprocal(std), scale)).
    """
    for node in users:
        if is_op(node, "Div") and tuple(node.input) == (d, std):
            return [node], node.output[0], None
    recip = g.sole_consumer(std, "Reciprocal")
    if recip is None:
        return None
    r = recip.output[0]
    folded = None
    nodes = [recip]
    user = g.sole_consumer(r, "Mul")
    if user is not None and d not in user.input:
        folded = g.other_input(user, r)
        nodes.append(user)
        r = user.output[0]
        user = g.sole_consumer(r, "Mul")
    if user is None or not any(user is u for u in users) or g.other_input(user, d) != r:
        return None
    return nodes + [user], user.output[0], folded


def _affine(g, out, nodes, *, scale=None, bias=True):
    """Extends a group by an optional Mul(scale) and Add(bias): (out, scale, bias)."""
    b = None
    if scale is None:
        mul = g.sole_consumer(out, "Mul")
        if mul is not None:
            scale = g.other_input(mul, out)
            nodes.append(mul)
            out = mul.output[0]
    if bias:
        add = g.sole_consumer(out, "Add")
        if add is not None:
            b = g.other_input(add, out)
            nodes.append(add)
            out = add.output[0]
    return out, scale, b


@register_pattern("layer_norm", anchors=("ReduceMean",), handler=layer_norm, priority=20)
def match_layer_norm(g, mean_node):
    """LayerNormalization written out, from the ReduceMean of its input."""
    found = g.reduce_axes(mean_node)
    if found is None or found[0] is None or not found[1]:
        return None
    axes = found[0]
    x, mean = mean_node.input[0], mean_node.output[0]
    sub = g.sole_consumer(mean, "Sub")
    if sub is None or tuple(sub.input) != (x, mean):
        return None
    d = sub.output[0]
    users = g.consumers(d)
    sq = [n for n in users if _squares(g, n, d)]
    if len(sq) != 1 or len(users) != 2:
        return None
    var_node = g.sole_consumer(sq[0].output[0], "ReduceMean")
    if var_node is None or g.reduce_axes(var_node) != (axes, 1):
        return None
    tail = _eps_sqrt(g, var_node.output[0])
    if tail is None:
        return None
    sqrt_nodes, eps, std = tail
    divided = _divide(g, d, std, [n for n in users if n is not sq[0]])
    if divided is None:
        return None
    div_nodes, out, folded = divided
    nodes = [mean_node, sub, sq[0], var_node] + sqrt_nodes + div_nodes
    out, scale, bias = _affine(g, out, nodes, scale=folded)
    return Match(tuple(nodes), (x, scale or "", bias or ""), (out,),
                 {"axes": axes, "epsilon": eps})


@register_pattern("layer_norm_op", anchors=("LayerNormalization",), handler=layer_norm,
                  priority=20)
def match_layer_norm_op(g, node):
    """The LayerNormalization op (its Mean and InvStdDev outputs unused)."""
    if int(g.attr(node, "stash_type", 1)) != 1:
        return None
    inputs = tuple(node.input) + ("",) * (3 - len(node.input))
    return Match((node,), inputs, (node.output[0],),
                 {"begin_axis": int(g.attr(node, "axis", -1)),
                  "epsilon": float(g.attr(node, "epsilon", 1e-5))})


@register_pattern("rms_norm", anchors=("Pow", "Mul"), handler=rms_norm, priority=10)
def match_rms_norm(g, sq):
    """RMS normalization written out, from the squaring of its input."""
    x = sq.input[0]
    if not _squares(g, sq, x):
        return None
    ms = g.sole_consumer(sq.output[0], "ReduceMean")
    found = None if ms is None else g.reduce_axes(ms)
    if found is None or found[0] is None or not found[1]:
        return None
    tail = _eps_sqrt(g, ms.output[0])
    if tail is None:
        return None
    sqrt_nodes, eps, std = tail
    divided = _divide(g, x, std, g.consumers(x))
    if divided is None:
        return None
    div_nodes, out, folded = divided
    nodes = [sq, ms] + sqrt_nodes + div_nodes
    out, scale, _ = _affine(g, out, nodes, scale=folded, bias=False)
    return Match(tuple(nodes), (x, scale or ""), (out,), {"axes": found[0], "epsilon": eps})


@register_pattern("rms_norm_op", anchors=("RMSNormalization", "SimplifiedLayerNormalization"),
                  handler=rms_norm, priority=10)
def match_rms_norm_op(g, node):
    """RMSNormalization-23, or ORT's SimplifiedLayerNormalization, with only Y used."""
    if int(g.attr(node, "stash_type", 1)) != 1:
        return None
    if node.op_type == "RMSNormalization" and g.opset() < 23:
        return None
    return Match((node,), (node.input[0], node.input[1] if len(node.input) > 1 else ""),
                 (node.output[0],),
                 {"begin_axis": int(g.attr(node, "axis", -1)),
                  "epsilon": float(g.attr(node, "epsilon", 1e-5))})

