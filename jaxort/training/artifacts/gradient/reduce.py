"""Gradient rules of reductions and pooling: ReduceSum, ReduceMean, ReduceMax/Min, the other Reduce ops, pools.

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper

from jaxort.training.artifacts.gradient._common import _attrs, _error, _filled, _ms_node, _second_output


def _reduce(spread: Callable, with_axes: bool = False) -> Callable:
    """A rule for a reduction: ``spread(em, x, y, dy)`` -> dX, with Y and dY of kept axes (rank of X);
    ``spread(em, x, y, dy, axes)`` with ``with_axes`` (the reduced axes, sorted, non-negative)."""
    def rule(em, node, dys, needs):
        x, y = node.input[0], node.output[0]
        attrs = _attrs(node)
        axes = attrs.get("axes")
        if len(node.input) > 1 and node.input[1]:
            static = em.static(node.input[1])
            if static is None:
                raise _error(node, "has axes that are not constant")
            axes = [int(a) for a in static.reshape(-1)]
        dims = em.dims(x)
        if dims is None:
            raise _error(node, "has an input of unknown rank")
        rest = [None] * (len(node.input) - 1)
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [dys[0]] + rest
            axes = list(range(len(dims)))
        axes = sorted(int(a) % len(dims) for a in axes)
        dy = dys[0]
        if not attrs.get("keepdims", 1):
            dy, y = (em.op("Unsqueeze", [v, em.ints(axes)]) for v in (dy, y))
        return [spread(em, x, y, dy, axes) if with_axes else spread(em, x, y, dy)] + rest

    return rule


def _sum(em, x, y, dy):
    return em.op("Expand", [dy, em.op("Shape", [x])])


def _mean(em, x, y, dy):
    # As ORT's builder: dY scaled down by the (int64) count, then spread.
    count = em.op("Div", [em.op("Size", [x]), em.op("Size", [y])])
    scaled = em.name("Scale")
    _ms_node(em, "Scale", [dy, count], [scaled], [helper.make_attribute("scale_down", 1)])
    return _sum(em, x, y, scaled)


def _chosen(em, x, y, dy):
    # ReduceMax, ReduceMin: dY where X is the chosen value (every tie gets it, as ORT's Max and
    # Min gradients do), in standard ops: ORT 1.19.2 has no rule for either.
    return em.op("Mul", [em.op("Cast", [em.op("Equal", [x, y])], to=em.elem_type(x)), dy])


def _global_max_pool(em, node, dys, needs):
    # dY where X is its channel's maximum (every tie gets it), spread over X's shape.
    x = node.input[0]
    return [_chosen(em, x, node.output[0], dys[0])]


def _prod(em, x, y, dy, axes):
    # Each value's gradient is the product of the others, without dividing by a zero (as
    # PyTorch's prod_backward): Y / X where no value reduced together is 0; where one is, the
    # product of the others at the zero and 0 elsewhere; where two or more are, 0. ORT 1.19.2
    # has no rule.
    t = em.elem_type(x)
    is_zero = em.op("Equal", [x, em.const(0.0, t)])
    kept = {"keepdims": 1}
    count = em.op("ReduceSum", [em.op("Cast", [is_zero], to=t), em.ints(axes)], **kept)
    nonzero = em.op("Where", [is_zero, em.const(1.0, t), x])
    if em.opset >= 18:  # ReduceProd took its axes as an attribute before opset 18
        others = em.op("ReduceProd", [nonzero, em.ints(axes)], **kept)
    else:
        others = em.op("ReduceProd", [nonzero], axes=list(axes), **kept)
    zero = em.const(0.0, t)
    at_the_zero = em.op("Where", [em.op("And", [em.op("Equal", [count, em.const(1.0, t)]), is_zero]), others, zero])
    grad = em.op("Where", [em.op("Equal", [count, zero]), em.op("Div", [others, x]), at_the_zero])
    return em.op("Mul", [dy, grad])


#: Reductions whose gradient is ``dY * f(X, Y)``, in standard ops (ORT 1.19.2 has no rules).
_SPREAD = {
    "ReduceSumSquare": lambda em, x, y, dy: em.op("Mul", [dy, em.op("Add", [x, x])]),
    "ReduceLogSumExp": lambda em, x, y, dy: em.op("Mul", [dy, em.op("Exp", [em.op("Sub", [x, y])])]),
    "ReduceLogSum": lambda em, x, y, dy: _sum(em, x, y, em.op("Div", [dy, em.op("Exp", [y])])),
    "ReduceL1": lambda em, x, y, dy: em.op("Mul", [dy, em.op("Sign", [x])]),
    "ReduceL2": lambda em, x, y, dy: em.op("Mul", [dy, em.op("Div", [x, y])]),
}


def _max_pool(em, node, dys, needs):
    x = node.input[0]
    attrs = _attrs(node)
    if em.opset < 16:
        raise _error(node, f"needs opset 16 or newer for its gradient (the model has {em.opset})")
    if attrs.get("storage_order", 0) != 0:
        raise _error(node, "uses storage_order=1")
    indices = _second_output(em, node, dys, "Indices")
    flat = em.ints([-1])
    size = em.op("Reshape", [em.op("Size", [x]), flat])
    zeros = _filled(em, 0.0, x, shape=size)
    scattered = em.op("ScatterElements", [zeros, em.op("Reshape", [indices, flat]),
                                          em.op("Reshape", [dys[0], flat])], axis=0, reduction="add")
    return [em.op("Reshape", [scattered, em.op("Shape", [x])])]


def _window_counts(sizes, kernel, strides, pads, outs, include_pad) -> np.ndarray:
    """What each of an AveragePool's windows divides by, shape ``[1, 1, *outs]``: the input
    values under it, or with ``include_pad`` its extent within the padded input (the whole
    kernel in floor mode, the only mode the rule takes with ``include_pad``)."""
    n = len(sizes)
    per_axis = []
    for i, (size, k, s, out) in enumerate(zip(sizes, kernel, strides, outs)):
        begin = np.arange(out) * s - pads[i]
        if include_pad:
            per_axis.append(np.minimum(begin + k, size + pads[i + n]) - begin)
        else:
            per_axis.append(np.minimum(begin + k, size) - np.maximum(begin, 0))
    counts = per_axis[0]
    for axis in per_axis[1:]:
        counts = np.multiply.outer(counts, axis)
    return counts.reshape((1, 1) + counts.shape)


def _pool_windows(em, node):
    """(channels, spatial sizes, kernel, strides, pads, output sizes) of an AveragePool or LpPool
    whose gradient spreads each window's value back over it; the forms it cannot are named."""
    x = node.input[0]
    attrs = _attrs(node)
    dims = em.dims(x)
    if dims is None or not all(isinstance(d, int) and d > 0 for d in dims[1:]):
        raise _error(node, f"has an input of shape {dims}; the rule needs its channels and spatial sizes")
    kernel = [int(k) for k in attrs["kernel_shape"]]
    n = len(kernel)
    strides = [int(s) for s in attrs.get("strides", [1] * n)]
    pads = [int(p) for p in attrs.get("pads", [0] * 2 * n)]
    if any(int(d) != 1 for d in attrs.get("dilations", [1] * n)):
        raise _error(node, "uses dilations; the rule covers pools without")
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise _error(node, f"uses auto_pad={attrs['auto_pad']!r}; give its pads explicitly")
    sizes = dims[2:]
    outs = []
    for i, (size, k, s) in enumerate(zip(sizes, kernel, strides)):
        span = size + pads[i] + pads[i + n] - k
        if attrs.get("ceil_mode", 0):
            out = -(-span // s) + 1
            outs.append(out - 1 if (out - 1) * s >= size + pads[i] else out)  # none starts in the end pad
        else:
            outs.append(span // s + 1)
    return dims[1], sizes, kernel, strides, pads, outs


def _spread(em, node, values, windows):
    """Each window's value added over its window: a depthwise ConvTranspose with a kernel of
    ones, in standard ops (ORT's AveragePoolGrad kernel crashes 1.19.2 where its output has no
    declared shape, as in a gradient graph). In ceil mode the end pad grows to hold the last
    window."""
    channels, sizes, kernel, strides, pads, outs = windows
    n = len(kernel)
    ones = em.const(np.ones([channels, 1] + kernel), em.elem_type(node.input[0]))
    ends = [max(pads[i + n], (out - 1) * s + k - size - pads[i])
            for i, (size, k, s, out) in enumerate(zip(sizes, kernel, strides, outs))]
    extra = [size - ((out - 1) * s + k - pads[i] - ends[i])
             for i, (size, k, s, out) in enumerate(zip(sizes, kernel, strides, outs))]
    return em.op("ConvTranspose", [values, ones], group=channels, kernel_shape=kernel, strides=strides,
                 pads=pads[:n] + ends, output_padding=extra)


def _average_pool(em, node, dys, needs):
    # dY divided by each window's count, spread back over its window.
    attrs = _attrs(node)
    if attrs.get("ceil_mode", 0) and attrs.get("count_include_pad", 0):
        raise _error(node, "uses ceil_mode=1 with count_include_pad=1: ORT 1.19.2 divides a window past "
                           "the end pad by the whole kernel, ONNX's reference (1.17+), PyTorch and jaxort "
                           "by its part inside the padded input, so no rule fits both")
    windows = _pool_windows(em, node)
    _, sizes, kernel, strides, pads, outs = windows
    counts = _window_counts(sizes, kernel, strides, pads, outs, attrs.get("count_include_pad", 0))
    return [_spread(em, node, em.op("Div", [dys[0], em.const(counts, em.elem_type(node.input[0]))]), windows)]


def _lp_factor(em, node):
    """sign(x) |x|^(p-1) and the exponent 1 - p of y: d y / d x = sign(x) |x|^(p-1) y^(1-p)."""
    x = node.input[0]
    t = em.elem_type(x)
    p = float(_attrs(node).get("p", 2))
    return em.op("Mul", [em.op("Sign", [x]), em.op("Pow", [em.op("Abs", [x]), em.const(p - 1.0, t)])]), \
        em.const(1.0 - p, t)


def _lp_pool(em, node, dys, needs):
    # Each window's dY * y^(1-p), spread over it, times sign(x) |x|^(p-1) (ORT 1.19.2 has no rule).
    factor, exponent = _lp_factor(em, node)
    per_window = em.op("Mul", [dys[0], em.op("Pow", [node.output[0], exponent])])
    return [em.op("Mul", [factor, _spread(em, node, per_window, _pool_windows(em, node))])]


def _global_lp_pool(em, node, dys, needs):
    factor, exponent = _lp_factor(em, node)
    return [em.op("Mul", [factor, em.op("Mul", [dys[0], em.op("Pow", [node.output[0], exponent])])])]


def _global_average_pool(em, node, dys, needs):
    # dY / (the pooled size), spread over X's shape: ORT's Scale, then Expand.
    x, y = node.input[0], node.output[0]
    t = em.elem_type(x)
    dims = em.dims(x)
    if dims is not None and all(isinstance(d, int) and d > 0 for d in dims[2:]):
        count = em.const(np.prod(dims[2:], dtype=np.int64), t)
    else:
        count = em.op("Div", [em.op("Cast", [em.op("Size", [x])], to=t), em.op("Cast", [em.op("Size", [y])], to=t)])
    scaled = em.name("Scale")
    _ms_node(em, "Scale", [dys[0], count], [scaled], [helper.make_attribute("scale_down", 1)])
    return [em.op("Expand", [scaled, em.op("Shape", [x])])]


#: op type -> rule.
RULES: dict = {
    "ReduceSum": _reduce(_sum), "ReduceMean": _reduce(_mean),
    "ReduceMax": _reduce(_chosen), "ReduceMin": _reduce(_chosen),
    **{op: _reduce(fn) for op, fn in _SPREAD.items()}, "ReduceProd": _reduce(_prod, with_axes=True),
    "MaxPool": _max_pool, "AveragePool": _average_pool, "GlobalAveragePool": _global_average_pool,
    "GlobalMaxPool": _global_max_pool, "LpPool": _lp_pool, "GlobalLpPool": _global_lp_pool,
}
