"""Export of a trained model for inference (ORT's ExportModelForInferencing).

:func:`export_model_for_inferencing` cuts the eval model down to the graph
that computes the named outputs (labels and loss go), and turns the
parameter inputs into initializers holding the given values. The result is a
plain ONNX model that loads in ``onnxruntime.InferenceSession``.

Part of the training layer: imports the graph layer and onnx, never the
facades.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Union

import numpy as np
import onnx
from onnx import helper

from jaxort.dtypes import to_numpy_dtype, to_onnx_type
from jaxort.errors import InputError, ModelError, TrainingError
from jaxort.graph import (
    backward_slice,
    check_model,
    check_graph_structure,
    load_model,
    normalize_domain,
    outer_reads,
    tensor_from_numpy,
)

__all__ = ["export_model_for_inferencing", "trim_inference_batchnorm_outputs"]

# Metadata only meaningful to a jaxort training run (a custom JAX loss).
_JAXORT_TRAINING_KEYS = ("jaxort.custom_loss", "jaxort.custom_loss.label_names")


def trim_inference_batchnorm_outputs(graph: onnx.GraphProto) -> None:
    """Drops unused running-statistics outputs of BatchNormalization in inference mode.

    BatchNormalization with ``training_mode`` 0 (or absent) may have only
    one output. ORT 1.19.2's eval model turns training_mode off but keeps the
    three outputs, so neither onnxruntime inference nor ORT's own Module can
    load it; removing the unused outputs (and their value infos) fixes that.
    """
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for node in graph.node:
        used |= outer_reads(node)
    dropped = set()
    for node in graph.node:
        if node.op_type != "BatchNormalization" or normalize_domain(node.domain) != "":
            continue
        training = any(a.name == "training_mode" and a.i for a in node.attribute)
        extra = [o for o in node.output[1:] if o]
        if training or not extra or any(o in used for o in extra):
            continue
        dropped.update(extra)
        del node.output[1:]
    if dropped:
        kept = [vi for vi in graph.value_info if vi.name not in dropped]
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _param_array(name: str, value, vi: onnx.ValueInfoProto) -> np.ndarray:
    arr = np.asarray(value)
    tt = vi.type.tensor_type
    expected = to_numpy_dtype(tt.elem_type)
    if arr.dtype != expected:
        raise InputError(f"parameter {name!r}: expected dtype {expected}, given {arr.dtype}")
    if tt.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if len(dims) != arr.ndim or any(d is not None and d != s for d, s in zip(dims, arr.shape)):
            raise InputError(
                f"parameter {name!r}: expected shape {tuple(dims)}, given {arr.shape}")
    return arr


def _add_initializer(graph: onnx.GraphProto, name: str, arr: np.ndarray) -> None:
    """Appends ``arr`` as an initializer, its bytes copied once into the graph (not via a second proto)."""
    if arr.dtype.kind not in "biuf" or arr.dtype.itemsize not in (1, 2, 4, 8) or arr.dtype.names:
        graph.initializer.append(tensor_from_numpy(arr, name))  # narrow, complex and string types
        return
    code = to_onnx_type(arr.dtype)
    tensor = graph.initializer.add()
    tensor.name, tensor.data_type = name, code
    tensor.dims.extend(arr.shape)
    tensor.raw_data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def export_model_for_inferencing(
    eval_model, params: Mapping[str, object], output_names: Union[str, Sequence[str]]
) -> onnx.ModelProto:
    """Builds the inference model: the eval graph up to ``output_names``.

    Like ONNX Runtime's ``Module.export_model_for_inferencing`` (1.19.2): the
    graph outputs become ``output_names``, nodes they do not need are removed
    (the loss, and with it the labels), parameter inputs become initializers
    with the values in ``params``, and inputs nothing reads are dropped.
    Differences from ORT's file: the opset imports stay the eval model's
    (ORT adds every domain it knows), value infos of removed values are
    dropped (ORT keeps them), and BatchNormalization nodes in inference mode
    lose their unused running-statistics outputs, which onnxruntime rejects.

    Args:
      eval_model: the eval model (path, bytes or ModelProto), from ORT's or
        jaxort's ``generate_artifacts``.
      params: parameter name -> array (numpy or JAX), trainable and frozen;
        names that are not graph inputs of the eval model are ignored, and
        needed inputs without a value stay graph inputs.
      output_names: the values to export as outputs (graph outputs or any
        intermediate value, e.g. the model's logits "output").

    Returns:
      The inference ``ModelProto``.

    Raises:
      ModelError: the eval graph has a cycle, a value made twice, a dangling
        read or nodes out of order (:func:`jaxort.graph.check_graph_structure`).
      TrainingError: an unknown output name, or an invalid result.
      InputError: a parameter with the wrong dtype or shape.

    Example:
      >>> m = export_model_for_inferencing("eval_model.onnx", params, ["output"])  # doctest: +SKIP
    """
    if isinstance(output_names, str):
        output_names = [output_names]
    output_names = list(output_names)
    if not output_names:
        raise TrainingError("export_model_for_inferencing needs at least one output name")
    model = load_model(eval_model, check=False)
    check_graph_structure(model.graph)
    model = copy.deepcopy(model)
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    produced = {o for n in graph.node for o in n.output if o}
    unknown = [n for n in output_names if n not in produced and n not in inputs]
    if unknown:
        raise TrainingError(
            f"output names {unknown} are not values of the eval model; its outputs are "
            f"{[o.name for o in graph.output]}")

    known = {vi.name: vi for vi in list(graph.value_info) + list(graph.output) + list(graph.input)}
    if any(n not in known for n in output_names):
        inferred = onnx.shape_inference.infer_shapes(model)
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            known.setdefault(vi.name, vi)
    outputs = [copy.deepcopy(known[n]) if n in known else helper.make_empty_tensor_value_info(n)
               for n in output_names]
    for vi, name in zip(outputs, output_names):
        vi.name = name

    nodes, needed = backward_slice(graph.node, output_names)
    pruned = onnx.GraphProto()
    pruned.node.extend(nodes)
    pruned.output.extend(outputs)
    trim_inference_batchnorm_outputs(pruned)
    nodes = list(pruned.node)
    new_inputs, new_params = [], []
    for vi in graph.input:
        if vi.name not in needed:
            continue
        if vi.name in params:
            new_params.append((vi.name, _param_array(vi.name, params[vi.name], vi)))
        else:
            new_inputs.append(vi)
    constants = [t for t in graph.initializer if t.name in needed and t.name not in inputs]
    outs = set(output_names)
    value_info = [vi for vi in graph.value_info
                  if vi.name not in outs and any(vi.name in n.output for n in nodes)]

    del graph.node[:]
    graph.node.extend(nodes)
    del graph.input[:]
    graph.input.extend(new_inputs)
    del graph.initializer[:]
    for name, arr in new_params:
        _add_initializer(graph, name, arr)
    graph.initializer.extend(constants)
    del graph.output[:]
    graph.output.extend(outputs)
    del graph.value_info[:]
    graph.value_info.extend(value_info)
    kept_props = [p for p in model.metadata_props if p.key not in _JAXORT_TRAINING_KEYS]
    del model.metadata_props[:]
    model.metadata_props.extend(kept_props)
    try:
        check_model(model)
    except ModelError as e:
        raise TrainingError(f"the exported inference model is invalid: {e}") from e
    return model
