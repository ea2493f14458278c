"""Gradient rule of Resize in nearest and linear modes (ORT 1.19.2 has no CPU kernel for its ResizeGrad).

A nearest or linear Resize is one resize per axis in turn, each a fixed map
from the input's positions to the output's. The rule finds that map by
running the same Resize, axis by axis, on the positions themselves (a tensor
of 0, 1, ..., n-1 along the axis): nearest gives the position each output
copies, linear the (clamped) coordinate it interpolates at, whose floor and
fraction are the two neighbours and their weights. dY is then added back to
those positions (ScatterElements-16's "add"). The map is ONNX Runtime's own,
for every coordinate transformation and rounding mode, and no shape need be
known beforehand.

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from jaxort.training.artifacts.gradient._common import _attrs, _error, _filled, _text

_END = np.iinfo(np.int64).max
# Attributes the per-axis Resize copies; the others are refused or do not apply to one axis.
_COPIED = ("mode", "coordinate_transformation_mode", "nearest_mode")


def _resize(em, node, dys, needs):
    attrs = _attrs(node)
    mode = _text(attrs.get("mode", "nearest"))
    transform = _text(attrs.get("coordinate_transformation_mode", "half_pixel"))
    if mode not in ("nearest", "linear"):
        raise _error(node, f"resizes in {mode!r} mode; nearest and linear have gradient rules")
    if transform == "tf_crop_and_resize":
        raise _error(node, "crops (tf_crop_and_resize): its extrapolated values have no gradient rule")
    if int(attrs.get("antialias", 0)):
        raise _error(node, "resizes with antialias=1; the rule takes antialias=0")
    if _text(attrs.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        raise _error(node, "keeps the aspect ratio; the rule takes keep_aspect_ratio_policy 'stretch'")
    if em.opset < 16:
        raise _error(node, f"needs opset 16 or newer for its gradient (the model has {em.opset})")
    x = node.input[0]
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    rank = len(dims)
    given = [int(a) % rank for a in attrs.get("axes", range(rank))]  # Resize-18's axes
    inputs = list(node.input) + [""] * (4 - len(node.input))
    scales, sizes = inputs[2] or None, inputs[3] or None
    table = scales or sizes
    if table is None:
        raise _error(node, "has neither scales nor sizes")
    # The axes that change size: where the scales or sizes are constants, those not kept.
    static = em.static(table)
    if static is not None and static.size == 0 and sizes:
        table, static = sizes, em.static(sizes)
    moved = list(range(len(given)))
    if static is not None and static.size:
        if table == scales:
            moved = [i for i, s in enumerate(static.ravel()) if float(s) != 1.0]
        else:
            moved = [i for i, n in enumerate(static.ravel()) if dims[given[i]] != int(n)]
    elif static is not None and static.size == 0:
        raise _error(node, "has empty scales and no sizes")
    copied = [a for a in node.attribute if a.name in _COPIED]
    dx = dys[0]
    for i in moved:
        dx = _axis_transpose(em, x, dx, given[i], rank, table, i, table == scales, copied, mode == "linear")
    return [dx] + [None] * (len(node.input) - 1)


def _axis_transpose(em, x, dy, axis, rank, table, index, by_scales, copied, linear):
    """dY, of the output's length along ``axis``, added back onto x's positions there."""
    ints = em.ints
    length = em.op("Gather", [em.op("Shape", [x]), em.const(np.int64(axis), TensorProto.INT64)])
    positions = em.op("Cast", [em.op("Range", [em.const(np.int64(0), TensorProto.INT64), length,
                                              em.const(np.int64(1), TensorProto.INT64)])],
                      to=TensorProto.FLOAT)
    along = [1] * rank
    along[axis] = -1
    positions = em.op("Reshape", [positions, ints(along)])
    # The node's scale or size for this axis alone, 1 on the others.
    own = em.op("Slice", [table, ints([index]), ints([index + 1])])
    counts = (axis, rank - axis - 1)  # the axes before and after this one
    if by_scales:
        ones = [em.const(np.ones(n, np.float32), TensorProto.FLOAT) for n in counts]
        resize_inputs = [positions, "", em.op("Concat", [ones[0], own, ones[1]], axis=0)]
    else:
        ones = [ints([1] * n) for n in counts]
        resize_inputs = [positions, "", "", em.op("Concat", [ones[0], own, ones[1]], axis=0)]
    # Where each output position reads along this axis (a copy of the node's attributes).
    coordinate = em.name("Resize")
    em.nodes.append(helper.make_node("Resize", resize_inputs, [coordinate], name=em.name("Resize_node")))
    em.nodes[-1].attribute.extend(copied)
    shape = em.op("Shape", [dy])
    zeros = _filled(em, 0.0, x, em.op("Concat", [em.op("Slice", [shape, ints([0]), ints([axis])]),
                                                  em.op("Reshape", [length, ints([1])]),
                                                  em.op("Slice", [shape, ints([axis + 1]), ints([_END])])], axis=0))

    def add(into, where, values):
        indices = em.op("Expand", [em.op("Cast", [where], to=TensorProto.INT64), shape])
        return em.op("ScatterElements", [into, indices, values], axis=axis, reduction="add")

    if not linear:
        return add(zeros, coordinate, dy)
    low = em.op("Floor", [coordinate])
    weight = em.op("Cast", [em.op("Sub", [coordinate, low])], to=em.elem_type(x))
    last = em.op("Sub", [length, em.const(np.int64(1), TensorProto.INT64)])
    high = em.op("Min", [em.op("Add", [em.op("Cast", [low], to=TensorProto.INT64),
                                       em.const(np.int64(1), TensorProto.INT64)]), last])
    kept = em.op("Sub", [dy, em.op("Mul", [dy, weight])])
    return add(add(zeros, low, kept), high, em.op("Mul", [dy, weight]))


RULES: dict = {"Resize": _resize}
