"""Scaled dot-product attention written out.

Matched form: MatMul(Q, Kt) -> an optional Mul or Div by a constant scalar ->
an optional Add(mask) -> Softmax over the last axis -> MatMul(., V), where Kt
is either a Transpose of K swapping its last two axes (folded into the group
when nothing else reads it) or any value. Leading (batch, head) axes
broadcast as MatMul's do.

The derivative rule is a ``custom_jvp`` (forward mode works) whose
transpose is the backward pass, from the forward's probabilities: dV = P^T g,
dS = P * (dP - sum(dP * P)) with dP = g V^T, then dQ and dK from dS. Products
run in the input dtype (as the op-by-op path does); the softmax runs in
float32 for narrower floats.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxort.graph.numerics import at_least_float32, has_tangent, sum_tangents
from jaxort.graph.patterns._common import as_dtype
from jaxort.graph.patterns._match import Match, is_op, register_pattern


def _swap(a):
    return jnp.swapaxes(a, -1, -2)


def _scaled(s, scale, divide):
    if scale is None:
        return s
    c = jnp.asarray(scale, s.dtype)
    return s / c if divide else s * c


def _probs(q, kt, mask, scale, divide):
    s = _scaled(jnp.matmul(q, kt), scale, divide)
    if mask is not None:
        s = s + mask
    return jax.nn.softmax(as_dtype(s, at_least_float32(s.dtype)), axis=-1)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _attention(q, kt, v, mask, scale, divide):
    p = _probs(q, kt, mask, scale, divide)
    return jnp.matmul(as_dtype(p, v.dtype), v)


def _attention_jvp(scale, divide, primals, tangents):
    q, kt, v, mask = primals
    dq, dkt, dv, dmask = tangents
    p = _probs(q, kt, mask, scale, divide)
    pd = as_dtype(p, v.dtype)
    y = jnp.matmul(pd, v)
    parts = []
    scores = []
    if has_tangent(dq):
        scores.append(jnp.matmul(dq, kt))
    if has_tangent(dkt):
        scores.append(jnp.matmul(q, dkt))
    ds = _scaled(functools.reduce(jnp.add, scores), scale, divide) if scores else None
    if has_tangent(dmask):
        dm = as_dtype(dmask, p.dtype)
        ds = dm if ds is None else as_dtype(ds, p.dtype) + dm
    if ds is not None:
        # The softmax tangent p * (ds - sum(p * ds)): transposed, the backward's
        # dS = P * (dP - sum(dP * P)) with dP = g V^T, one reduction.
        dsc = as_dtype(ds, p.dtype)
        dp = p * dsc - p * jnp.sum(p * dsc, axis=-1, keepdims=True)
        parts.append(jnp.matmul(as_dtype(dp, v.dtype), v))
    if has_tangent(dv):
        parts.append(jnp.matmul(pd, dv))
    return y, sum_tangents(parts, y.shape, y.dtype)


_attention.defjvp(_attention_jvp, symbolic_zeros=True)


def attention(q, k, v, mask=None, *, scale=None, divide=False, transpose_k=False, axis=-1):
    """softmax(Q Kt * scale (or / scale) + mask) V, Kt = K with its last axes swapped if asked.

    ``axis`` is the Softmax's axis; the fused rule needs the last one, else the
    group runs as written.
    """
    kt = _swap(k) if transpose_k else k
    if jnp.ndim(q) < 2 or jnp.ndim(kt) < 2 or (axis + jnp.ndim(q) if axis < 0 else axis) \
            != max(jnp.ndim(q), jnp.ndim(kt)) - 1:
        s = _scaled(jnp.matmul(q, kt), scale, divide)
        s = s if mask is None else s + mask
        return jnp.matmul(jax.nn.softmax(s, axis=axis), v)
    return _attention(q, kt, v, mask, scale, divide)


def _score_path(g, name):
    """The nodes from the scores MatMul to ``name``: (nodes, matmul, scale, divide) or None."""
    node = g.producer(name)
    scale, divide, nodes = None, False, []
    if is_op(node, "Mul") or is_op(node, "Div"):
        for i in (node.input if is_op(node, "Mul") else node.input[:1]):
            c = g.scalar(g.other_input(node, i))
            if c is not None:
                scale, divide = c, is_op(node, "Div")
                nodes.append(node)
                node = g.producer(i)
                break
        else:
            return None
    if not is_op(node, "MatMul"):
        return None
    return [node] + nodes, node, scale, divide


@register_pattern("attention", anchors=("Softmax",), handler=attention, priority=40)
def match_attention(g, sm):
    """Scaled dot-product attention, from its Softmax."""
    # Without shapes only axis -1 is known to be the last one (below opset 13 it is
    # also the only axis whose coercion to 2-D changes nothing).
    axis = int(g.attr(sm, "axis", -1 if g.opset() >= 13 else 1))
    if axis != -1:
        return None
    out = g.sole_consumer(sm.output[0], "MatMul")
    if out is None or out.input[0] != sm.output[0]:
        return None
    mask, path = "", None
    add = g.producer(sm.input[0])
    if is_op(add, "Add"):
        for i in add.input:
            path = _score_path(g, i)
            if path is not None:
                mask = g.other_input(add, i)
                path = (path[0] + [add],) + path[1:]
                break
    if path is None:
        path = _score_path(g, sm.input[0])
    if path is None:
        return None
    nodes, mm, scale, divide = path
    q, k = mm.input
    transpose_k = False
    tr = g.producer(k)
    if is_op(tr, "Transpose") and g.sole_consumer(k) is mm:
        perm = g.attr(tr, "perm")
        n = 0 if perm is None else len(perm)
        if n >= 2 and list(perm) == list(range(n - 2)) + [n - 1, n - 2]:
            nodes.insert(0, tr)
            k, transpose_k = tr.input[0], True
    return Match(tuple(nodes + [sm, out]), (q, k, out.input[1], mask), (out.output[0],),
                 {"scale": scale, "divide": divide, "transpose_k": transpose_k, "axis": axis})
