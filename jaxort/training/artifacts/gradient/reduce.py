"""Gradient rules of reductions and pooling: ReduceSum, ReduceMean, MaxPool, GlobalAveragePool.

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper

from jaxort.training.artifacts.gradient._common import _attrs, _error, _filled, _ms_node, _second_output


def _reduce(mean: bool) -> Callable:
    def rule(em, node, dys, needs):
        x, y = node.input[0], node.output[0]
        attrs = _attrs(node)
        keepdims = attrs.get("keepdims", 1)
        axes = attrs.get("axes")
        if len(node.input) > 1 and node.input[1]:
            static = em.static(node.input[1])
            if static is None:
                raise _error(node, "has axes that are not constant")
            axes = [int(a) for a in static.reshape(-1)]
        dims = em.dims(x)
        if dims is None:
            raise _error(node, "has an input of unknown rank")
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [dys[0]] + [None] * (len(node.input) - 1)
            axes = list(range(len(dims)))
        axes = sorted(int(a) % len(dims) for a in axes)
        dy = dys[0]
        if not keepdims:
            dy = em.op("Unsqueeze", [dy, em.ints(axes)])
        if mean:  # as ORT's builder: dY scaled down by the (int64) count, then spread
            count = em.op("Div", [em.op("Size", [x]), em.op("Size", [y])])
            scaled = em.name("Scale")
            _ms_node(em, "Scale", [dy, count], [scaled], [helper.make_attribute("scale_down", 1)])
            dy = scaled
        return [em.op("Expand", [dy, em.op("Shape", [x])])] + [None] * (len(node.input) - 1)

    return rule


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
    "ReduceSum": _reduce(mean=False), "ReduceMean": _reduce(mean=True),
    "MaxPool": _max_pool, "GlobalAveragePool": _global_average_pool,
}
