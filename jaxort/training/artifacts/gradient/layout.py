"""Gradient rules of shape and layout ops: Reshape-like ops, Expand, Transpose, Slice, Gather, Concat, Split.

Reshape-like: Flatten, Reshape, Squeeze, Unsqueeze.

Part of the training layer: it imports the rules' shared helpers only.
"""

from __future__ import annotations

import numpy as np

from jaxort.training.artifacts.gradient._common import _attrs, _error, _filled, _ms_node, _unbroadcast


def _like_input(em, node, dys, needs):
    """Reshape-like ops (Flatten, Reshape, Squeeze, Unsqueeze): dx is dy in x's shape."""
    dx = em.op("Reshape", [dys[0], em.op("Shape", [node.input[0]])])
    return [dx] + [None] * (len(node.input) - 1)


def _slice(em, node, dys, needs):
    # dx is dy padded with zeros back to x's shape: static starts, ends, axes, steps of 1
    # (as exporters slice parameters, e.g. PyTorch reordering an LSTM's gates).
    dims = em.dims(node.input[0])
    given = [em.static(i) if i else None for i in list(node.input[1:]) + [""] * (5 - len(node.input))]
    starts, ends, axes, steps = given
    if dims is None or any(not isinstance(d, int) for d in dims):
        raise _error(node, "has an input of unknown shape")
    if starts is None or ends is None or (node.input[3:4] and node.input[3] and axes is None) or \
            (node.input[4:5] and node.input[4] and steps is None):
        raise _error(node, "has starts, ends, axes or steps that are not constants")
    axes = range(len(starts)) if axes is None else [int(a) % len(dims) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(k) for k in steps]
    if any(k != 1 for k in steps):
        raise _error(node, f"has steps {steps}; only steps of 1 have a gradient rule")
    begin, after = [0] * len(dims), [0] * len(dims)
    for axis, start, end in zip(axes, starts, ends):
        dim = dims[axis]
        start = min(max(int(start) + dim if start < 0 else int(start), 0), dim)
        end = min(max(int(end) + dim if end < 0 else int(end), 0), dim)
        begin[axis], after[axis] = start, dim - max(start, end)
    return [em.op("Pad", [dys[0], em.ints(begin + after)])] + [None] * (len(node.input) - 1)


def _expand(em, node, dys, needs):
    return [_unbroadcast(em, node, dys[0], node.input[0], node.output[0]), None]


def _transpose(em, node, dys, needs):
    dims = em.dims(node.input[0])
    perm = _attrs(node).get("perm")
    if perm is None:
        if dims is None:
            raise _error(node, "has an input of unknown rank")
        perm = list(reversed(range(len(dims))))
    inverse = list(np.argsort(perm))
    return [em.op("Transpose", [dys[0]], perm=[int(i) for i in inverse])]


def _gather(em, node, dys, needs):
    # GatherGrad(Shape(data), indices, dY): dY added where Gather read, repeated indices summed.
    out = em.name("GatherGrad")
    _ms_node(em, "GatherGrad", [em.op("Shape", [node.input[0]]), node.input[1], dys[0]], [out], node.attribute)
    return [out, None]


def _concat(em, node, dys, needs):
    dims = em.dims(node.output[0])
    if dims is None:
        raise _error(node, "has an output of unknown rank")
    axis = int(_attrs(node)["axis"]) % len(dims)
    shapes = [em.op("Shape", [x]) for x in node.input]
    sizes = em.op("Concat", [em.op("Gather", [s, em.ints([axis])]) for s in shapes], axis=0)
    parts = em.op("Split", [dys[0], sizes], n_out=len(node.input), axis=axis)
    parts = [parts] if isinstance(parts, str) else parts
    return [part if need else None for part, need in zip(parts, needs)]


def _split(em, node, dys, needs):
    # dx: the outputs' gradients joined again, zeros where an output does not reach the loss.
    dims = em.dims(node.input[0])
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    axis = int(_attrs(node).get("axis", 0)) % len(dims)
    parts = []
    for out, dy in zip(node.output, dys):
        if dy is None:
            dy = _filled(em, 0.0, node.input[0], shape=em.op("Shape", [out]))
        parts.append(dy)
    return [em.op("Concat", parts, axis=axis)] + [None] * (len(node.input) - 1)


#: op type -> rule.
RULES: dict = {
    "Flatten": _like_input, "Reshape": _like_input, "Squeeze": _like_input, "Unsqueeze": _like_input,
    "Expand": _expand, "Transpose": _transpose, "Slice": _slice,
    "Gather": _gather, "Concat": _concat, "Split": _split,
}
