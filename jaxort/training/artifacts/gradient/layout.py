"""Gradient rules of shape and layout ops: Reshape-likes, Expand, Transpose, Slice, Pad, Tile, Concat, Split.

Reshape-like: Flatten, Reshape, Squeeze, Unsqueeze. Also DepthToSpace and
SpaceToDepth, and the ops that read, write or keep elements by index or
position: Gather, GatherND, GatherElements, ScatterElements, ScatterND, TopK,
CumSum, Trilu.

Part of the training layer: it imports the rules' shared helpers only.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from jaxort.training.artifacts.gradient._common import _attrs, _error, _filled, _ms_node, _text, _unbroadcast


def _like_input(em, node, dys, needs):
    """Reshape-like ops (Flatten, Reshape, Squeeze, Unsqueeze): dx is dy in x's shape."""
    dx = em.op("Reshape", [dys[0], em.op("Shape", [node.input[0]])])
    return [dx] + [None] * (len(node.input) - 1)


def _slice(em, node, dys, needs):
    # SliceGrad(dY, Shape(x), starts, ends, axes, steps): dY written into zeros of x's shape
    # at run time, as ORT's builder writes it, so no shape need be known here. ORT 1.19.2's
    # kernel fails on negative steps ("narrowing_error"): those, and steps only known at run
    # time, take the route through x's flat indices instead.
    given = list(node.input[1:]) + [""] * (5 - len(node.input))  # Slice-10+ (the rules need opset 13)
    starts, ends, axes, steps = given[:4]
    if steps:
        values = em.static(steps)
        if values is None or any(int(k) < 0 for k in np.ravel(values)):
            return [_slice_by_indices(em, node, dys[0])] + [None] * (len(node.input) - 1)
    bounds = [starts, ends]
    if steps and not axes:  # an absent axes before steps: all axes in order
        zero, one = (em.const(v, TensorProto.INT64) for v in (0, 1))
        axes = em.op("Range", [zero, em.op("Size", [starts]), one])
    bounds += [axes] if axes else []
    bounds += [steps] if steps else []
    out = em.name("SliceGrad")
    _ms_node(em, "SliceGrad", [dys[0], em.op("Shape", [node.input[0]]), *bounds], [out], [])
    return [out] + [None] * (len(node.input) - 1)


def _slice_by_indices(em, node, dy):
    """dY scattered into zeros of x's shape at the flat indices the same Slice takes from
    x's indices ``Range(Size(x))``: exact for any steps, with no shape known beforehand."""
    x = node.input[0]
    shape = em.op("Shape", [x])
    zero, one = (em.const(v, TensorProto.INT64) for v in (0, 1))
    flat = em.op("Range", [zero, em.op("Size", [x]), one])
    taken = em.op("Slice", [em.op("Reshape", [flat, shape])] + list(node.input[1:]))
    column = em.ints([-1])
    zeros = em.op("Reshape", [_filled(em, 0.0, x), column])
    dx = em.op("ScatterElements", [zeros, em.op("Reshape", [taken, column]), em.op("Reshape", [dy, column])],
               axis=0)  # the indices are distinct: no reduction
    return em.op("Reshape", [dx, shape])


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


def _compress(em, node, dys, needs):
    # Compress is Gather at NonZero(condition) (of X flattened, without an axis), so its
    # gradient is GatherGrad's at those indices. ORT 1.19.2 has no rule.
    x, condition = node.input
    indices = em.op("Reshape", [em.op("NonZero", [condition]), em.ints([-1])])
    attrs = _attrs(node)
    out = em.name("GatherGrad")
    if "axis" in attrs:
        dims = em.dims(x)
        if dims is None:
            raise _error(node, "has an input of unknown rank")
        axis = helper.make_attribute("axis", int(attrs["axis"]) % len(dims))
        _ms_node(em, "GatherGrad", [em.op("Shape", [x]), indices, dys[0]], [out], [axis])
        return [out, None]
    _ms_node(em, "GatherGrad", [em.op("Reshape", [em.op("Size", [x]), em.ints([1])]), indices, dys[0]], [out],
             [helper.make_attribute("axis", 0)])
    return [em.op("Reshape", [out, em.op("Shape", [x])]), None]


def _max_unpool(em, node, dys, needs):
    # MaxUnpool writes each X value at its index into the flattened output (MaxPool's Indices,
    # which count across the batch and channels): dX is dY read back there. ORT 1.19.2 has no rule.
    x, indices = node.input[:2]
    flat = em.ints([-1])
    picked = em.op("Gather", [em.op("Reshape", [dys[0], flat]), em.op("Reshape", [indices, flat])], axis=0)
    return [em.op("Reshape", [picked, em.op("Shape", [x])])] + [None] * (len(node.input) - 1)


def _center_crop_pad(em, node, dys, needs):
    # Cropping and zero padding about the centre are each other's adjoints, with the same
    # offsets ((larger - smaller) // 2): dX is dY centre-cropped or padded back to X's shape.
    # ORT 1.19.2 has no rule.
    x = node.input[0]
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    axes = [int(a) % len(dims) for a in _attrs(node).get("axes", range(len(dims)))]
    sizes = em.op("Gather", [em.op("Shape", [x]), em.ints(axes)])
    return [em.op("CenterCropPad", [dys[0], sizes], axes=axes), None]


def _gather_nd(em, node, dys, needs):
    # GatherNDGrad(Shape(data), indices, dY): dY added where GatherND read, repeated indices
    # summed, as ORT's builder writes it.
    out = em.name("GatherNDGrad")
    _ms_node(em, "GatherNDGrad", [em.op("Shape", [node.input[0]]), node.input[1], dys[0]], [out],
             [a for a in node.attribute if a.name == "batch_dims"])
    return [out, None]


def _tile(em, node, dys, needs):
    # dY seen as (repeat, size) pairs per axis, summed over the repeats: constant repeats,
    # X's sizes read at run time.
    x = node.input[0]
    repeats = em.static(node.input[1])
    if repeats is None:
        raise _error(node, "has repeats that are not constant")
    shape = em.op("Shape", [x])
    pairs = []
    for axis, r in enumerate(repeats.reshape(-1)):
        pairs += [em.ints([int(r)]), em.op("Slice", [shape, em.ints([axis]), em.ints([axis + 1])])]
    split = em.op("Reshape", [dys[0], em.op("Concat", pairs, axis=0)])
    return [em.op("ReduceSum", [split, em.ints(list(range(0, 2 * repeats.size, 2)))], keepdims=0), None]


def _pad(em, node, dys, needs):
    # Constant mode with constant non-negative pads (an axes input from Pad-18 picks the axes
    # they are for): dY without the padding, one Slice from the pads before to the pads after.
    # Any other pads or mode (edge, reflect, wrap; no rule in ORT 1.19.2): through x's indices.
    mode = _attrs(node).get("mode", b"constant")
    mode = _text(mode)
    pads = em.static(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    axes = node.input[3] if len(node.input) > 3 and node.input[3] else None
    if mode != "constant" or pads is None or (pads < 0).any() or (axes and em.static(axes) is None):
        return [_pad_by_indices(em, node, dys[0])] + [None] * (len(node.input) - 1)
    pads = [int(p) for p in pads.reshape(-1)]
    n = len(pads) // 2
    axes = [int(a) for a in em.static(axes).reshape(-1)] if axes else list(range(n))
    ends = [-p if p else _END for p in pads[n:]]
    dx = em.op("Slice", [dys[0], em.ints(pads[:n]), em.ints(ends), em.ints(axes)])
    return [dx] + [None] * (len(node.input) - 1)


_END = np.iinfo(np.int64).max


def _pad_by_indices(em, node, dy):
    """dY added onto the values the padding read: the same Pad of x's flat indices plus 1
    (0 where a constant is written) says where each output came from; dY is scattered into
    a buffer with a slot 0 for the constants, which is then dropped. Exact for every mode and
    for pads known only at run time, negative (cropping) ones included."""
    if em.opset < 16:
        raise _error(node, f"needs opset 16 or newer for the gradient of these pads (the model has {em.opset})")
    x = node.input[0]
    shape = em.op("Shape", [x])
    one = em.const(np.int64(1), TensorProto.INT64)
    count = em.op("Size", [x])
    plus_one = em.op("Range", [one, em.op("Add", [count, one]), one])
    zero = em.const(np.int64(0), TensorProto.INT64)  # Pad's constant_value for the indices
    sources = em.op("Pad", [em.op("Reshape", [plus_one, shape]), node.input[1], zero] + list(node.input[3:4]),
                    mode=_attrs(node).get("mode", b"constant"))
    column = em.ints([-1])
    slots = _filled(em, 0.0, x, em.op("Add", [em.op("Reshape", [count, column]), em.ints([1])]))
    summed = em.op("ScatterElements", [slots, em.op("Reshape", [sources, column]), em.op("Reshape", [dy, column])],
                   axis=0, reduction="add")
    return em.op("Reshape", [em.op("Slice", [summed, em.ints([1]), em.ints([_END])]), shape])


def _gather_elements(em, node, dys, needs):
    # dY added into zeros of the data's shape where GatherElements read (ScatterElements-16's
    # "add" sums repeated indices).
    if em.opset < 16:
        raise _error(node, f"needs opset 16 or newer for its gradient (the model has {em.opset})")
    data, indices = node.input[:2]
    return [em.op("ScatterElements", [_filled(em, 0.0, data), indices, dys[0]], reduction="add",
                  axis=int(_attrs(node).get("axis", 0))), None]


def _scatter(gather: str):
    """ScatterElements or ScatterND (``gather`` the op that reads back where it wrote): the
    updates' gradient is dY read at the indices; the data's is dY, with the overwritten
    places zeroed (reduction "none") or whole (reduction "add")."""
    def rule(em, node, dys, needs):
        attrs = _attrs(node)
        reduction = attrs.get("reduction", b"none")
        reduction = _text(reduction)
        if reduction not in ("none", "add"):
            raise _error(node, f"reduces with {reduction!r}; the rule takes reduction 'none' or 'add'")
        data, indices, updates = node.input[:3]
        axis = {"axis": int(attrs.get("axis", 0))} if node.op_type == "ScatterElements" else {}
        d_data = dys[0]
        if reduction == "none":
            d_data = em.op(node.op_type, [dys[0], indices, _filled(em, 0.0, updates)], **axis)
        return [d_data, None, em.op(gather, [dys[0], indices], **axis)]
    return rule


def _depth_to_space(em, node, dys, needs):
    # DCR mode (the default) is SpaceToDepth's inverse; CRD (PyTorch's PixelShuffle) is undone
    # by hand: dY [N, C, H*b, W*b] -> [N, C, H, b, W, b] -> [N, C, b, b, H, W] -> X's shape.
    attrs = _attrs(node)
    b = int(attrs["blocksize"])
    mode = attrs.get("mode", b"DCR")
    if _text(mode) == "DCR":
        return [em.op("SpaceToDepth", [dys[0]], blocksize=b)]
    shape = em.op("Shape", [node.output[0]])

    def dim(i):
        return em.op("Slice", [shape, em.ints([i]), em.ints([i + 1])])

    split = em.op("Concat", [dim(0), dim(1), em.op("Div", [dim(2), em.ints([b])]), em.ints([b]),
                             em.op("Div", [dim(3), em.ints([b])]), em.ints([b])], axis=0)
    blocks = em.op("Transpose", [em.op("Reshape", [dys[0], split])], perm=[0, 1, 3, 5, 2, 4])
    return [em.op("Reshape", [blocks, em.op("Shape", [node.input[0]])])]


def _space_to_depth(em, node, dys, needs):
    return [em.op("DepthToSpace", [dys[0]], blocksize=int(_attrs(node)["blocksize"]), mode="DCR")]


def _top_k(em, node, dys, needs):
    # The values' gradient put back where TopK took them (its indices are distinct).
    if dys[1] is not None:
        raise _error(node, "has its indices output on the path to the loss")
    x = node.input[0]
    indices = node.output[1] if len(node.output) > 1 and node.output[1] else None
    if indices is None:
        raise _error(node, "has no indices output to put its gradient back with")
    return [em.op("ScatterElements", [_filled(em, 0.0, x), indices, dys[0]], axis=int(_attrs(node).get("axis", -1))),
            None]


def _cum_sum(em, node, dys, needs):
    # A cumulative sum the other way: each input adds to every output after it (before it, reversed).
    attrs = _attrs(node)
    out = em.op("CumSum", [dys[0], node.input[1]], exclusive=int(attrs.get("exclusive", 0)),
                reverse=1 - int(attrs.get("reverse", 0)))
    return [out, None]


def _cum_prod(em, node, dys, needs):
    # dX[i] = sum over outputs k that take x[i] of dY[k] * (their product without x[i]): row i
    # of a square [i, j] holding X with x[i] set to 1, cumulated the node's way, is that
    # product for every k; exact where X has zeros (dividing Y by X is not). Quadratic in the
    # axis' length, which must be known.
    x = node.input[0]
    attrs = _attrs(node)
    exclusive, reverse = int(attrs.get("exclusive", 0)), int(attrs.get("reverse", 0))
    axis_value, dims = em.static(node.input[1]), em.dims(x)
    if axis_value is None or dims is None:
        raise _error(node, "has an axis that is not constant or an input of unknown rank")
    rank = len(dims)
    axis = int(axis_value.reshape(-1)[0]) % rank
    n = dims[axis]
    if not isinstance(n, int):
        raise _error(node, "cumulates over an axis of unknown length")
    perm = [a for a in range(rank) if a != axis] + [axis]
    back = [int(a) for a in np.argsort(perm)]
    t = em.elem_type(x)
    i, k = np.arange(n)[:, None], np.arange(n)[None, :]
    takes = {(0, 0): i <= k, (1, 0): i < k, (0, 1): i >= k, (1, 1): i > k}[exclusive, reverse]
    last = em.ints([-1])
    row = em.op("Unsqueeze", [em.op("Transpose", [x], perm=perm), em.ints([-2])])  # [..., 1, j]
    square = em.op("Where", [em.const(np.eye(n, dtype=bool), TensorProto.BOOL), em.const(1.0, t), row])
    products = em.op("CumProd", [square, last], exclusive=exclusive, reverse=reverse)  # [..., i, k]
    dy = em.op("Unsqueeze", [em.op("Transpose", [dys[0]], perm=perm), em.ints([-2])])  # [..., 1, k]
    terms = em.op("Mul", [em.op("Mul", [products, em.const(takes, t)]), dy])
    dx = em.op("ReduceSum", [terms, last], keepdims=0)
    return [em.op("Transpose", [dx], perm=back), None]


def _tensor_scatter(em, node, dys, needs):
    # The cache's gradient is dY with the written window zeroed (the same scatter, of zeros);
    # the update's is dY read back from that window: position write_indices[b] + s along the
    # axis (modulo the cache's length in circular mode). ORT 1.19.2 reads no opset 24 model.
    past, update = node.input[0], node.input[1]
    indices = node.input[2] if len(node.input) > 2 and node.input[2] else None
    attrs = _attrs(node)
    dims = em.dims(update)
    if dims is None:
        raise _error(node, "has an update of unknown rank")
    rank = len(dims)
    axis = int(attrs.get("axis", -2)) % rank
    dy = dys[0]
    grads = [None, None, None][:len(node.input)]
    if needs[0]:
        grads[0] = em.op("TensorScatter", [dy, _filled(em, 0.0, update)] + list(node.input[2:]), **attrs)
    if needs[1]:
        def along(value: str, at: int) -> str:  # a 1-D value as the dims of ``at`` in a rank-``rank`` shape
            return em.op("Unsqueeze", [value, em.ints([a for a in range(rank) if a != at])])

        length = em.op("Gather", [em.op("Shape", [update]), em.const(axis, TensorProto.INT64)])
        steps = em.op("Range", [em.const(0, TensorProto.INT64), length, em.const(1, TensorProto.INT64)])
        where = along(steps, axis)
        if indices is not None:
            where = em.op("Add", [where, along(em.op("Cast", [indices], to=TensorProto.INT64), 0)])
        if _text(attrs.get("mode", b"linear")) == "circular":
            where = em.op("Mod", [where, em.op("Gather", [em.op("Shape", [past]), em.ints([axis])])])
        where = em.op("Expand", [where, em.op("Shape", [update])])
        grads[1] = em.op("GatherElements", [dy, where], axis=axis)
    return grads


def _trilu(em, node, dys, needs):
    # The same triangle of dY: Trilu keeps or zeroes each value, a linear mask.
    return [em.op("Trilu", [dys[0]] + list(node.input[1:]), upper=int(_attrs(node).get("upper", 1)))] + \
        [None] * (len(node.input) - 1)


def _reverse_sequence(em, node, dys, needs):
    # Reversing each sequence's first lengths[b] steps is its own inverse: dX is dY reversed alike.
    attrs = _attrs(node)
    return [em.op("ReverseSequence", [dys[0], node.input[1]], batch_axis=int(attrs.get("batch_axis", 1)),
                  time_axis=int(attrs.get("time_axis", 0))), None]


def _one_hot(em, node, dys, needs):
    # Y = values[1] where the one-hot mask is set, else values[0]: d values = [sum of dY off
    # the mask, sum of dY on it]. The indices and depth are integers (or only count).
    indices, depth, _ = node.input
    if not needs[2]:
        return [None, None, None]
    dy = dys[0]
    mask = em.op("OneHot", [indices, depth, em.const([0, 1], em.elem_type(node.output[0]))],
                 axis=int(_attrs(node).get("axis", -1)))
    on = em.op("ReduceSum", [em.op("Mul", [dy, mask])], keepdims=0)
    off = em.op("Sub", [em.op("ReduceSum", [dy], keepdims=0), on])
    return [None, None, em.op("Concat", [em.op("Unsqueeze", [v, em.ints([0])]) for v in (off, on)], axis=0)]


def _rotary_embedding(em, node, dys, needs):
    # Each rotated pair turns by its position's angle (cos, sin), the rest of the head passes:
    # the transpose turns back, dX = RotaryEmbedding(dY) with the sines negated. The caches
    # are constants of the model (no gradient). ORT 1.19.2 reads no opset 23 model.
    inputs = list(node.input)
    if any(needs[1:3]):
        raise _error(node, "has a cos or sin cache that depends on a trainable parameter")
    inputs[0], inputs[2] = dys[0], em.op("Neg", [node.input[2]])
    return [em.op("RotaryEmbedding", inputs, **_attrs(node))] + [None] * (len(node.input) - 1)


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
    "Gather": _gather, "GatherND": _gather_nd, "Compress": _compress, "MaxUnpool": _max_unpool,
    "CenterCropPad": _center_crop_pad,
    "Concat": _concat, "Split": _split, "Tile": _tile, "Pad": _pad,
    "GatherElements": _gather_elements, "TopK": _top_k, "CumSum": _cum_sum, "CumProd": _cum_prod,
    "TensorScatter": _tensor_scatter,
    "Trilu": _trilu,
    "ScatterElements": _scatter("GatherElements"), "ScatterND": _scatter("GatherND"),
    "DepthToSpace": _depth_to_space, "SpaceToDepth": _space_to_depth,
    "ReverseSequence": _reverse_sequence, "OneHot": _one_hot, "RotaryEmbedding": _rotary_embedding,
}
