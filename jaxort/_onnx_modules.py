"""What the framework modules over ONNX models share (:mod:`jaxort.nnx`, :mod:`jaxort.equinox`).

Which initializers train, the checkpoint of a module's values, and the model
with updated initializers. Imports neither flax nor equinox: each of those
modules may be installed without the other. Layer: facades.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from jaxort import checkpoint
from jaxort.errors import InputError, UnknownNameError
from jaxort.graph import normalize_domain, numpy_dtype, outer_reads, tensor_from_numpy

# Ops that write their running statistics (inputs 3 and 4) back in training mode.
RUNNING_STATS_OPS = {("", "BatchNormalization"), ("com.microsoft", "BatchNormInternal")}


def is_float(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype.name.startswith(("float", "bfloat"))


def some(names, limit: int = 8) -> str:
    names = list(names)
    return str(names) if len(names) <= limit else f"{names[:limit]} and {len(names) - limit} more"


def split_initializers(model: onnx.ModelProto, params) -> tuple[list[str], list[str]]:
    """(trainable, frozen) initializer names: ``params`` or the default, and the other floats read."""
    graph = model.graph
    dtypes = {t.name: numpy_dtype(t.data_type) for t in graph.initializer}
    read = {o.name for o in graph.output}
    for node in graph.node:
        read.update(i for i in node.input if i)
        read |= outer_reads(node)
    floats = [n for n, d in dtypes.items() if is_float(d) and n in read]
    if params is None:
        stats = set()
        for node in graph.node:
            if (normalize_domain(node.domain), node.op_type) in RUNNING_STATS_OPS:
                stats.update(node.input[3:5])
        trainable = [n for n in floats if n not in stats]
    else:
        trainable = [params] if isinstance(params, str) else list(dict.fromkeys(params))
        unknown = [n for n in trainable if n not in dtypes]
        if unknown:
            raise UnknownNameError(
                f"params {unknown} are not initializers of the model; its floating-point "
                f"initializers are {some(floats)}")
        ints = [f"{n} ({dtypes[n]})" for n in trainable if not is_float(dtypes[n])]
        if ints:
            raise InputError(f"params {ints} are not floating-point initializers and cannot be trained")
    chosen = set(trainable)
    return trainable, [n for n in floats if n not in chosen]


def module_checkpoint(values: Mapping, trainable: Sequence[str], frozen: Sequence[str],
                properties) -> checkpoint.Checkpoint:
    return checkpoint.Checkpoint(
        trainable={n: np.asarray(values[n]) for n in sorted(trainable)},
        frozen={n: np.asarray(values[n]) for n in sorted(frozen)},
        properties=dict(properties or {}))


def with_initializers(model: onnx.ModelProto, values: Mapping) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.name in values:
            init.CopyFrom(tensor_from_numpy(np.asarray(values[init.name]), init.name))
    return out


def weight_layout(model: onnx.ModelProto, name: str) -> bool:
    """True when the MatMul/Gemm weight ``name`` is stored ``[out, in]``, False for ``[in, out]``.

    Raises:
      InputError: ``name`` is read by another op, a subgraph, or nothing.
    """
    layouts = set()
    for node in model.graph.node:
        op = node.op_type if normalize_domain(node.domain) == "" else f"{node.domain}::{node.op_type}"
        if name in outer_reads(node):
            raise InputError(f"lora: initializer {name!r} is read inside a subgraph of {op} node "
                             f"{node.name!r}; LoRA applies to MatMul and Gemm weights")
        for index, used in enumerate(node.input):
            if used != name:
                continue
            if op == "MatMul" and index in (0, 1):
                layouts.add(index == 0)  # W @ x contracts W's second axis
            elif op == "Gemm" and index in (0, 1):
                trans = next((a.i for a in node.attribute if a.name == ("transA", "transB")[index]), 0)
                layouts.add(bool(trans) == (index == 1))
            else:
                raise InputError(f"lora: initializer {name!r} is input {index} of {op} node "
                                 f"{node.name!r}; LoRA applies to MatMul and Gemm weights")
    if not layouts:
        raise InputError(f"lora: no MatMul or Gemm node reads initializer {name!r}")
    if len(layouts) > 1:
        raise InputError(f"lora: initializer {name!r} is read both as [in, out] and as [out, in]")
    return layouts.pop()


def lora_names(names, rank, available, params) -> list:
    """The weight names of a LoRA request, checked: ``names`` (one or several) and ``rank``.

    Raises:
      InputError: a rank that is not a positive integer.
      UnknownNameError: a name not in ``available`` (the module's initializers).
    """
    names = [names] if isinstance(names, str) else list(dict.fromkeys(names))
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise InputError(f"lora: rank must be a positive integer, got {rank!r}")
    unknown = [n for n in names if n not in available]
    if unknown:
        raise UnknownNameError(f"lora: {unknown} are not floating-point initializers of the module; its "
                               f"parameters are {some(params)}")
    return names
