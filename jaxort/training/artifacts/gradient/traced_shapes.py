"""Shapes ONNX's shape inference leaves unknown, from jaxort's own tracer.

The rules need each value's rank and dtype (and its size along an axis where
they reduce a broadcast). onnx's best-effort inference loses ranks behind
shape arithmetic (Range -> Expand -> Reshape chains, as in the function body
of Attention). jaxort's tracer folds that arithmetic with numpy, so
:func:`traced_shapes` traces the graph abstractly (``jax.eval_shape``, no
arithmetic is run) for the values inference left without a rank. Symbolic
input dims stay symbolic: the graph is traced twice with those dims set to two
different sizes, and an output dim that differs between the traces is
returned as None.

Part of the training layer: it uses onnx, jax and the graph layer only.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
import onnx

# The sizes a symbolic input dim takes in the two traces.
_TRIAL_SIZES = (6, 10)


def traced_shapes(model: onnx.ModelProto, names: Sequence[str]) -> dict:
    """name -> (elem_type, dims) for those of ``names`` jaxort's tracer can give a shape,
    each dim an int or None (it follows a symbolic input dim). Empty when the graph cannot
    be traced abstractly (an input of unknown rank, an op that needs values)."""
    from jaxort.graph import JaxGraph, numpy_dtype, x64_enabled_scope

    graph = model.graph
    inputs = []
    for vi in graph.input:
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            return {}
        inputs.append((vi.name, t.elem_type, [d.dim_value if d.HasField("dim_value") else None
                                              for d in t.shape.dim]))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    runs = []
    try:
        g = JaxGraph(probe, params=[], check=False)
        with x64_enabled_scope():  # int64 inputs (token ids) as they are, as the graph declares them
            for size in _TRIAL_SIZES:
                args = [jax.ShapeDtypeStruct([size if d is None else d for d in dims], numpy_dtype(elem))
                        for _, elem, dims in inputs]
                runs.append(jax.eval_shape(lambda *a: g.apply({}, *a), *args))
    except Exception:  # noqa: BLE001 - any failure to trace leaves inference's answer as it was
        return {}
    out = {}
    for name, a, b in zip(names, *runs):
        if a.ndim != b.ndim:
            continue
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(a.dtype))
        out[name] = (elem, [int(x) if x == y else None for x, y in zip(a.shape, b.shape)])
    return out
