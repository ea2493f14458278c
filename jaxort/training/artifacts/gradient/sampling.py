"""Gradient rules of GridSample and RoiAlign (ORT 1.19.2 has builders for neither), in standard ONNX ops.

GridSample reads each output value from a few input positions ("taps") near
the coordinate the grid gives, weighted by the coordinate's fraction: 1 tap
per axis for nearest, 2 for linear, 4 for cubic. The rule computes the taps
and weights as the forward does (the coordinate unnormalized, then clamped
or reflected by the padding mode) and then

- dX: dY times each combination of taps' weight, added back at the taps
  (ScatterElements-16's "add" over X flattened per image and channel);
- dGrid: along each axis, dY times X at the taps times the derivative of the
  weights by the coordinate, times the derivative of the coordinate by the
  grid value (the unnormalization's scale; 0 where the border padding clamps,
  -1 where reflection mirrors it). Nearest sampling's grid gradient is 0.

X's spatial dims must be known (the unnormalization scales by them); batch
and channels may be symbolic.

RoiAlign (mode avg, a fixed sampling_ratio) is the same kind of sampling: its
samples' bilinear weights, over dY / the samples per bin, are added back at
each roi's image; the rois themselves get no gradient (as in detection heads,
where they are proposals).

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

import itertools

import numpy as np
from onnx import TensorProto

from jaxort.training.artifacts.gradient._common import _attrs, _error, _text

_MODES = {"bilinear": "linear", "bicubic": "cubic"}  # GridSample-16's names
_CUBIC_A = -0.75


def _cubic_weights(em, t, t_type):
    """Cubic convolution weights of the 4 taps at fraction ``t`` and their derivatives by t."""
    a = _CUBIC_A

    def c(value):
        return em.const(value, t_type)

    def poly(x, coeffs):  # coeffs[0] * x^3 + coeffs[1] * x^2 + coeffs[2] * x + coeffs[3], Horner's way
        out = c(coeffs[0])
        for k in coeffs[1:]:
            out = em.op("Add", [em.op("Mul", [out, x]), c(k)])
        return out

    far = [a, -5 * a, 8 * a, -4 * a]  # |x| in [1, 2]
    near = [a + 2, -(a + 3), 0.0, 1.0]  # |x| in [0, 1]
    far_d, near_d = [3 * a, -10 * a, 8 * a], [3 * (a + 2), -2 * (a + 3), 0.0]
    one = c(1.0)
    distances = [em.op("Add", [t, one]), t, em.op("Sub", [one, t]), em.op("Sub", [c(2.0), t])]
    signs = [1.0, 1.0, -1.0, -1.0]  # d distance / d t
    weights, slopes = [], []
    for k, (x, sign) in enumerate(zip(distances, signs)):
        coeffs, deriv = (far, far_d) if k in (0, 3) else (near, near_d)
        weights.append(poly(x, coeffs))
        slopes.append(em.op("Mul", [poly(x, deriv), c(sign)]))
    return weights, slopes


def _full(em, value: float, like: str, t_type) -> str:
    """``value`` in ``like``'s shape (``like`` an emitted value, whose type the emitter does not know)."""
    return em.op("Expand", [em.const(value, t_type), em.op("Shape", [like])])


def _reflect(em, v, lo: float, hi: float, t_type):
    """The coordinate reflected into [lo, hi] by the near border, repeatedly (as the forward),
    and its derivative by the unreflected one (1 or -1)."""
    def c(value):
        return em.const(value, t_type)

    span = c(hi - lo)
    out, slope = v, _full(em, 1.0, v, t_type)
    for beyond, distance, back, forth in (
            (em.op("Less", [v, c(lo)]), em.op("Sub", [c(lo), v]), (lo, 1.0), (hi, -1.0)),
            (em.op("Greater", [v, c(hi)]), em.op("Sub", [v, c(hi)]), (hi, -1.0), (lo, 1.0))):
        turns = em.op("Floor", [em.op("Div", [distance, span])])
        rest = em.op("Sub", [distance, em.op("Mul", [turns, span])])
        even = em.op("Equal", [em.op("Mod", [turns, c(2.0)], fmod=1), c(0.0)])
        # Past a border by `rest` after an even number of crossings: mirrored back from it (the
        # value moves against v); after an odd number: counted from the other border (with v).
        value = em.op("Where", [even, em.op("Add", [c(back[0]), em.op("Mul", [rest, c(back[1])])]),
                                em.op("Add", [c(forth[0]), em.op("Mul", [rest, c(forth[1])])])])
        d = em.op("Where", [even, c(-1.0), c(1.0)])
        out = em.op("Where", [beyond, value, out])
        slope = em.op("Where", [beyond, d, slope])
    return out, slope


def _grid_sample(em, node, dys, needs):
    x, grid = node.input[0], node.input[1]
    attrs = _attrs(node)
    mode = _MODES.get(_text(attrs.get("mode", "linear")), _text(attrs.get("mode", "linear")))
    padding = _text(attrs.get("padding_mode", "zeros"))
    align = int(attrs.get("align_corners", 0))
    if em.opset < 16:
        raise _error(node, f"needs opset 16 or newer for its gradient (the model has {em.opset})")
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise _error(node, f"samples in mode {mode!r} with padding {padding!r}; the rule takes "
                           "nearest, linear and cubic with zeros, border and reflection")
    dims = em.dims(x)
    if dims is None or not all(isinstance(d, int) for d in dims[2:]):
        raise _error(node, "has an input of unknown spatial size")
    sizes = dims[2:]
    nd = len(sizes)
    t_grid = em.elem_type(grid)

    def c(value, t=t_grid):
        return em.const(value, t)

    int64 = TensorProto.INT64
    batch = em.op("Gather", [em.op("Shape", [x]), em.ints([0])])
    points = em.op("Reshape", [grid, em.op("Concat", [batch, em.ints([-1, nd])], axis=0)])  # [N, P, nd]
    taps_per_axis, scale_per_axis = [], []
    for i, length in enumerate(sizes):
        # The grid's last axis lists x, y(, z): X's last spatial axis first.
        g = em.op("Squeeze", [em.op("Gather", [points, em.ints([nd - 1 - i])], axis=2), em.ints([2])])  # [N, P]
        if align:
            v = em.op("Mul", [em.op("Add", [g, c(1.0)]), c((length - 1) / 2)])
            lo, hi, scale = 0.0, length - 1.0, (length - 1) / 2
        else:
            v = em.op("Div", [em.op("Sub", [em.op("Mul", [em.op("Add", [g, c(1.0)]), c(float(length))]), c(1.0)]),
                      c(2.0)])
            lo, hi, scale = -0.5, length - 0.5, length / 2
        scale = c(scale)
        if mode == "nearest":
            v = em.op("Round", [v])
        if padding == "border":
            inside = em.op("And", [em.op("GreaterOrEqual", [v, c(lo)]), em.op("LessOrEqual", [v, c(hi)])])
            v = em.op("Where", [inside, v, em.op("Clip", [v, c(0.0), c(length - 1.0)])])
            scale = em.op("Mul", [scale, em.op("Cast", [inside], to=t_grid)])
        elif padding == "reflection":
            v, slope = _reflect(em, v, lo, hi, t_grid)
            scale = em.op("Mul", [scale, slope])
        scale_per_axis.append(scale)

        def tap(index, weight, slope, length=length, lo=lo, hi=hi):
            """(index clamped into the axis, weight, d weight / d coordinate) of one tap."""
            if padding == "zeros":
                valid = em.op("Cast", [em.op("And", [em.op("GreaterOrEqual", [index, em.const(0, int64)]),
                                                     em.op("Less", [index, em.const(length, int64)])])], to=t_grid)
                weight, slope = em.op("Mul", [weight, valid]), em.op("Mul", [slope, valid])
            elif padding == "reflection":
                mirrored, _ = _reflect(em, em.op("Cast", [index], to=t_grid), lo, hi, t_grid)
                index = em.op("Cast", [mirrored], to=int64)  # truncates, as the forward
            index = em.op("Clip", [index, em.const(0, int64), em.const(length - 1, int64)])
            return index, weight, slope

        if mode == "nearest":
            zero = _full(em, 0.0, v, t_grid)
            taps_per_axis.append([tap(em.op("Cast", [v], to=int64), _full(em, 1.0, v, t_grid), zero)])
            continue
        floor = em.op("Floor", [v])
        t = em.op("Sub", [v, floor])
        first = em.op("Cast", [floor], to=int64)
        if mode == "linear":
            weights, offsets = [em.op("Sub", [c(1.0), t]), t], [0, 1]
            slopes = [_full(em, -1.0, t, t_grid), _full(em, 1.0, t, t_grid)]
        else:
            (weights, slopes), offsets = _cubic_weights(em, t, t_grid), [-1, 0, 1, 2]
        taps_per_axis.append([tap(em.op("Add", [first, em.const(o, int64)]), w, s)
                              for o, w, s in zip(offsets, weights, slopes)])

    strides = [int(s) for s in np.cumprod([1] + sizes[::-1])[:-1][::-1]]
    flats, weights, partials = [], [], [[] for _ in range(nd)]
    for combo in itertools.product(*taps_per_axis):
        flat = combo[0][0] if strides[0] == 1 else em.op("Mul", [combo[0][0], em.const(strides[0], int64)])
        for (index, _, _), stride in zip(combo[1:], strides[1:]):
            flat = em.op("Add", [flat, index if stride == 1 else em.op("Mul", [index, em.const(stride, int64)])])
        flats.append(flat)

        def product(parts):
            out = parts[0]
            for p in parts[1:]:
                out = em.op("Mul", [out, p])
            return out

        weights.append(product([w for _, w, _ in combo]))
        for d in range(nd):
            partials[d].append(product([s if e == d else w for e, (_, w, s) in enumerate(combo)]))

    # Everything per image and channel: [N, C, P * taps].
    x_type = em.elem_type(x)
    shape_x = em.op("Shape", [x])
    channels = em.op("Slice", [shape_x, em.ints([0]), em.ints([2])])
    flat_x = em.op("Reshape", [x, em.op("Concat", [channels, em.ints([-1])], axis=0)])  # [N, C, S]
    index = em.op("Unsqueeze", [em.op("Concat", flats, axis=1), em.ints([1])])  # [N, 1, P * taps]
    index = em.op("Expand", [index, em.op("Concat", [channels, em.ints([1])], axis=0)])
    dy = em.op("Reshape", [dys[0], em.op("Concat", [channels, em.ints([-1])], axis=0)])  # [N, C, P]
    taps = len(flats)
    dy_taps = em.op("Concat", [dy] * taps, axis=2)

    def per_channel(values):  # [N, P] per tap -> [N, 1, P * taps] in X's type
        return em.op("Cast", [em.op("Unsqueeze", [em.op("Concat", values, axis=1), em.ints([1])])], to=x_type)

    grads = [None, None]
    if needs[0]:
        added = em.op("Mul", [dy_taps, per_channel(weights)])
        scattered = em.op("ScatterElements", [_full(em, 0.0, flat_x, x_type), index, added], axis=2,
                          reduction="add")
        grads[0] = em.op("Reshape", [scattered, shape_x])
    if needs[1]:
        read = em.op("Mul", [dy_taps, em.op("GatherElements", [flat_x, index], axis=2)])  # [N, C, P * taps]
        per_axis = []
        for d in range(nd):
            total = em.op("ReduceSum", [em.op("Mul", [read, per_channel(partials[d])]), em.ints([1])],
                          keepdims=0)  # [N, P * taps]
            total = em.op("Cast", [total], to=t_grid)
            split = em.op("Reshape", [total, em.op("Concat", [batch, em.ints([taps, -1])], axis=0)])
            per_axis.append(em.op("Mul", [em.op("ReduceSum", [split, em.ints([1])], keepdims=0),
                                          scale_per_axis[d]]))  # [N, P]
        stacked = em.op("Concat", [em.op("Unsqueeze", [p, em.ints([2])]) for p in per_axis[::-1]], axis=2)
        grads[1] = em.op("Reshape", [stacked, em.op("Shape", [grid])])
    return grads


def _roi_axis(em, start, size, pooled: int, grid: int, length: int, t):
    """One axis of RoiAlign's samples, each [R, pooled, grid]: the two neighbours' indices, their
    weights, and whether the sample is inside (as the forward, and ORT's kernel, place them)."""
    def c(value):
        return em.const(value, t)

    k = np.arange(pooled)[:, None] + (np.arange(grid)[None, :] + 0.5) / grid  # [pooled, grid]
    at = em.ints([1, 2])
    v = em.op("Add", [em.op("Unsqueeze", [start, at]),
                      em.op("Mul", [em.op("Unsqueeze", [em.op("Div", [size, c(float(pooled))]), at]), c(k)])])
    inside = em.op("And", [em.op("GreaterOrEqual", [v, c(-1.0)]), em.op("LessOrEqual", [v, c(float(length))])])
    v = em.op("Max", [v, c(0.0)])
    low = em.op("Floor", [v])
    at_end = em.op("GreaterOrEqual", [low, c(length - 1.0)])
    last = c(length - 1.0)
    low = em.op("Where", [at_end, last, low])
    high = em.op("Where", [at_end, last, em.op("Add", [low, c(1.0)])])
    frac = em.op("Sub", [em.op("Where", [at_end, low, v]), low])
    int64 = TensorProto.INT64
    return ((em.op("Cast", [low], to=int64), em.op("Sub", [c(1.0), frac])),
            (em.op("Cast", [high], to=int64), frac)), em.op("Cast", [inside], to=t)


def _roi_align(em, node, dys, needs):
    # Each output is the mean of grid_h x grid_w bilinear samples in its bin: dY / count times
    # each sample's four weights, added back at the four pixels of the roi's image.
    x, rois, batch_indices = node.input[:3]
    attrs = _attrs(node)
    if needs[1]:
        raise _error(node, "has rois that depend on a trainable parameter; the rule differentiates X only")
    if em.opset < 16:  # ScatterElements adds from opset 16
        raise _error(node, f"needs opset 16 or newer for its gradient (the model has {em.opset})")
    if _text(attrs.get("mode", "avg")) != "avg":
        raise _error(node, "pools with mode 'max'; the rule takes 'avg'")
    ratio = int(attrs.get("sampling_ratio", 0))
    if ratio <= 0:
        raise _error(node, "has sampling_ratio 0 (a sample grid that depends on each roi's size); the rule "
                           "takes a fixed sampling_ratio")
    dims = em.dims(x)
    if dims is None or len(dims) != 4 or not all(isinstance(d, int) for d in dims[2:]):
        raise _error(node, "has an input of unknown spatial size")
    height, width = dims[2:]
    out_h, out_w = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    transform = _text(attrs.get("coordinate_transformation_mode", "half_pixel"))  # RoiAlign-16's default
    half_pixel = transform == "half_pixel"
    t = em.elem_type(rois)
    int64 = TensorProto.INT64

    def column(k):
        return em.op("Squeeze", [em.op("Gather", [boxes, em.ints([k])], axis=1), em.ints([1])])

    boxes = em.op("Mul", [rois, em.const(float(attrs.get("spatial_scale", 1.0)), t)])
    if half_pixel:
        boxes = em.op("Sub", [boxes, em.const(0.5, t)])
    x0, y0, x1, y1 = (column(k) for k in range(4))
    box_w, box_h = em.op("Sub", [x1, x0]), em.op("Sub", [y1, y0])
    if not half_pixel:
        box_w, box_h = em.op("Max", [box_w, em.const(1.0, t)]), em.op("Max", [box_h, em.const(1.0, t)])
    rows, inside_y = _roi_axis(em, y0, box_h, out_h, ratio, height, t)  # each [R, out_h, ratio]
    cols, inside_x = _roi_axis(em, x0, box_w, out_w, ratio, width, t)  # each [R, out_w, ratio]

    def by_y(value):  # [R, out_h, ratio] -> [R, out_h, ratio, 1, 1]
        return em.op("Unsqueeze", [value, em.ints([3, 4])])

    def by_x(value):  # [R, out_w, ratio] -> [R, 1, 1, out_w, ratio]
        return em.op("Unsqueeze", [value, em.ints([1, 2])])

    inside = em.op("Mul", [by_y(inside_y), by_x(inside_x)])
    image = em.op("Mul", [em.op("Cast", [batch_indices], to=int64), em.const(height * width, int64)])
    image = em.op("Unsqueeze", [image, em.ints([1, 2, 3, 4])])
    x_type = em.elem_type(x)
    dy = em.op("Unsqueeze", [dys[0], em.ints([3, 5])])  # [R, C, out_h, 1, out_w, 1]
    dy = em.op("Div", [dy, em.const(float(ratio * ratio), x_type)])
    indices, updates = [], []
    for row, weight_y in rows:
        for col, weight_x in cols:
            flat = em.op("Add", [em.op("Add", [em.op("Mul", [by_y(row), em.const(width, int64)]), by_x(col)]),
                                 image])  # [R, out_h, ratio, out_w, ratio]
            weight = em.op("Mul", [em.op("Mul", [by_y(weight_y), by_x(weight_x)]), inside])
            weight = em.op("Cast", [em.op("Unsqueeze", [weight, em.ints([1])])], to=x_type)  # [R, 1, ...]
            update = em.op("Mul", [dy, weight])  # [R, C, out_h, ratio, out_w, ratio]
            updates.append(em.op("Reshape", [em.op("Transpose", [update], perm=[1, 0, 2, 3, 4, 5]),
                                             em.ints([0, -1])]))  # [C, R * samples]
            flat = em.op("Reshape", [flat, em.ints([1, -1])])
            indices.append(em.op("Expand", [flat, em.op("Shape", [updates[-1]])]))
    # X as [C, N * H * W], so that one ScatterElements adds every roi's samples to its image.
    shape_x = em.op("Shape", [x])
    zeros = em.op("Reshape", [em.op("Transpose", [_full(em, 0.0, x, x_type)], perm=[1, 0, 2, 3]), em.ints([0, -1])])
    added = em.op("ScatterElements", [zeros, em.op("Concat", indices, axis=1), em.op("Concat", updates, axis=1)],
                  axis=1, reduction="add")
    swapped = em.op("Concat", [em.op("Slice", [shape_x, em.ints([1]), em.ints([2])]),
                               em.op("Slice", [shape_x, em.ints([0]), em.ints([1])]),
                               em.op("Slice", [shape_x, em.ints([2]), em.ints([4])])], axis=0)
    dx = em.op("Transpose", [em.op("Reshape", [added, swapped])], perm=[1, 0, 2, 3])
    return [dx, None, None]


def _deform_conv(em, node, dys, needs):
    # The forward samples X bilinearly at each kernel tap's offset position ("columns", zero
    # outside the image), scales them by the mask, and convolves them with W as a product per
    # group. Backwards: dW and dB as a Conv's from the columns (sampled again here); the
    # columns' gradient from dY and W; then dX added back at the samples' four pixels, the
    # offsets' gradient from the bilinear weights' slopes, the mask's from the samples.
    x, w, offset = node.input[:3]
    bias = node.input[3] if len(node.input) > 3 and node.input[3] else None
    mask = node.input[4] if len(node.input) > 4 and node.input[4] else None
    attrs = _attrs(node)
    if em.opset < 16:
        raise _error(node, f"needs opset 16 or newer for its gradient (the model has {em.opset})")
    dims_x, dims_w, dims_off = em.dims(x), em.dims(w), em.dims(offset)
    if (dims_x is None or dims_w is None or dims_off is None or len(dims_x) != 4
            or not all(isinstance(d, int) for d in dims_x[1:] + dims_w + dims_off[1:])):
        raise _error(node, "has inputs whose shapes are not known beyond the batch (2-D only)")
    _, channels, height, width = dims_x
    out_channels, _, kh, kw = dims_w
    out_h, out_w = dims_off[2:]
    group, offset_group = int(attrs.get("group", 1)), int(attrs.get("offset_group", 1))
    sh, sw = list(attrs.get("strides", [1, 1]))
    dh, dw = list(attrs.get("dilations", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    t, x_type, int64 = em.elem_type(offset), em.elem_type(x), TensorProto.INT64
    per_offset_group, taps = channels // offset_group, kh * kw * out_h * out_w

    def c(value, type_=t):
        return em.const(value, type_)

    def shaped(value, dims):
        return em.op("Reshape", [value, em.ints(dims)])

    # Sample positions [N, og, kh, kw, oh, ow]: the tap's place plus its offset.
    base_y = (dh * np.arange(kh))[:, None, None, None] + (-pads[0] + sh * np.arange(out_h))[None, None, :, None]
    base_x = (dw * np.arange(kw))[None, :, None, None] + (-pads[1] + sw * np.arange(out_w))[None, None, None, :]
    offsets = shaped(offset, [-1, offset_group, kh, kw, 2, out_h, out_w])
    positions = []
    for k, base in ((0, base_y), (1, base_x)):
        moved = em.op("Squeeze", [em.op("Gather", [offsets, em.ints([k])], axis=4), em.ints([4])])
        positions.append(shaped(em.op("Add", [moved, c(np.broadcast_to(base, (kh, kw, out_h, out_w)))]),
                                [0, offset_group, 1, taps]))  # [N, og, 1, taps]
    py, px = positions
    image = shaped(x, [-1, offset_group, per_offset_group, height * width])  # [N, og, Cg, H * W]
    spread = em.op("Concat", [em.op("Slice", [em.op("Shape", [image]), em.ints([0]), em.ints([3])]),
                              em.ints([taps])], axis=0)  # [N, og, Cg, taps]
    floors = [em.op("Floor", [p]) for p in (py, px)]
    corners = []  # (index [N, og, Cg, taps], weight, d weight / d py, d weight / d px), weights [N, og, 1, taps]
    for a in (0, 1):
        for b in (0, 1):
            yi, xi = em.op("Add", [floors[0], c(float(a))]), em.op("Add", [floors[1], c(float(b))])
            wy = em.op("Sub", [c(1.0), em.op("Abs", [em.op("Sub", [py, yi])])])
            wx = em.op("Sub", [c(1.0), em.op("Abs", [em.op("Sub", [px, xi])])])
            valid = em.op("Cast", [em.op("And", [
                em.op("And", [em.op("GreaterOrEqual", [yi, c(0.0)]), em.op("LessOrEqual", [yi, c(height - 1.0)])]),
                em.op("And", [em.op("GreaterOrEqual", [xi, c(0.0)]), em.op("LessOrEqual", [xi, c(width - 1.0)])])])],
                to=t)
            flat = em.op("Add", [em.op("Mul", [em.op("Clip", [yi, c(0.0), c(height - 1.0)]), c(float(width))]),
                                 em.op("Clip", [xi, c(0.0), c(width - 1.0)])])
            index = em.op("Expand", [em.op("Cast", [flat], to=int64), spread])
            weight = em.op("Mul", [em.op("Mul", [wy, wx]), valid])
            slope_y = em.op("Mul", [em.op("Mul", [wx, valid]), c(-1.0 if a == 0 else 1.0)])
            slope_x = em.op("Mul", [em.op("Mul", [wy, valid]), c(-1.0 if b == 0 else 1.0)])
            corners.append((index, weight, slope_y, slope_x))

    def as_x(value):
        return value if x_type == t else em.op("Cast", [value], to=x_type)

    read = [em.op("GatherElements", [image, index], axis=3) for index, _, _, _ in corners]
    samples = em.op("Sum", [em.op("Mul", [v, as_x(weight)]) for v, (_, weight, _, _) in zip(read, corners)])
    scale = as_x(shaped(mask, [-1, offset_group, 1, taps])) if mask is not None else None
    columns = em.op("Mul", [samples, scale]) if scale is not None else samples  # [N, og, Cg, taps]
    cg, og_ = channels // group, out_channels // group
    dy = shaped(dys[0], [-1, group, og_, out_h, out_w])
    grads = [None] * len(node.input)
    if needs[1]:
        cols = shaped(columns, [-1, group, cg, kh, kw, out_h, out_w])
        grads[1] = shaped(em.op("Einsum", [dy, cols], equation="ngoij,ngckhij->gockh"), dims_w)
    if bias is not None and needs[3]:
        grads[3] = em.op("ReduceSum", [dys[0], em.ints([0, 2, 3])], keepdims=0)
    if not (needs[0] or needs[2] or (mask is not None and needs[4])):
        return grads
    d_columns = em.op("Einsum", [dy, shaped(w, [group, og_, cg, kh, kw])], equation="ngoij,gockh->ngckhij")
    d_columns = shaped(d_columns, [-1, offset_group, per_offset_group, taps])
    if mask is not None and needs[4]:
        d_mask = em.op("ReduceSum", [em.op("Mul", [d_columns, samples]), em.ints([2])], keepdims=0)
        grads[4] = em.op("Reshape", [d_mask, em.op("Shape", [mask])])
    d_samples = em.op("Mul", [d_columns, scale]) if scale is not None else d_columns
    if needs[0]:
        updates = [em.op("Mul", [d_samples, as_x(weight)]) for _, weight, _, _ in corners]
        added = em.op("ScatterElements", [_full(em, 0.0, image, x_type),
                                          em.op("Concat", [index for index, _, _, _ in corners], axis=3),
                                          em.op("Concat", updates, axis=3)], axis=3, reduction="add")
        grads[0] = em.op("Reshape", [added, em.op("Shape", [x])])
    if needs[2]:
        per_axis = []
        for k in (2, 3):  # slope_y, slope_x
            along = em.op("Sum", [em.op("Mul", [v, as_x(corner[k])]) for v, corner in zip(read, corners)])
            total = em.op("ReduceSum", [em.op("Mul", [d_samples, along]), em.ints([2])], keepdims=0)
            total = total if x_type == t else em.op("Cast", [total], to=t)
            per_axis.append(shaped(total, [0, offset_group, kh, kw, 1, out_h, out_w]))
        grads[2] = em.op("Reshape", [em.op("Concat", per_axis, axis=4), em.op("Shape", [offset])])
    return grads


RULES: dict = {"GridSample": _grid_sample, "RoiAlign": _roi_align, "DeformConv": _deform_conv}
