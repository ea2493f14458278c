"""Reading ONNX Runtime Training artifacts.

``training_model.onnx`` as written by ``onnxruntime.training.artifacts``
(verified against onnxruntime-training 1.19.2) has the inputs: user inputs,
labels, parameters, one ``<param>_grad.accumulation.buffer`` per trainable
parameter, and a bool ``lazy_reset_grad``; its outputs are the loss (and any
other user outputs) then one ``<param>_grad.accumulation.out`` per trainable
parameter. The gradient half of that graph (com.microsoft ops such as
SoftmaxCrossEntropyLossGrad and InPlaceAccumulatorV2) is never run: jaxort
keeps the backward slice of the user outputs, i.e. the forward graph and the
loss, and differentiates it with ``jax.grad``.

The same reader accepts artifacts whose training model has no accumulation
buffers (parameters given by a checkpoint or by name) and models that keep
parameters as initializers.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, Iterable, Sequence

import onnx

from jaxort.errors import TrainingError
from jaxort.graph import backward_slice, check_graph_structure

__all__ = [
    "GRAD_BUFFER_SUFFIX",
    "GRAD_OUTPUT_SUFFIX",
    "LAZY_RESET_GRAD",
    "CUSTOM_LOSS_KEY",
    "CUSTOM_LOSS_LABELS_KEY",
    "TrainingModelInfo",
    "custom_loss",
    "describe_training_model",
    "loss_label_names",
    "slice_model",
]

GRAD_BUFFER_SUFFIX = "_grad.accumulation.buffer"
GRAD_OUTPUT_SUFFIX = "_grad.accumulation.out"
LAZY_RESET_GRAD = "lazy_reset_grad"

# Metadata of a training model generated with a JAX callable loss: the
# callable's name and its label inputs. The model ends before the loss, so
# :func:`custom_loss` lets a reader refuse to train it without the callable.
CUSTOM_LOSS_KEY = "jaxort.custom_loss"
CUSTOM_LOSS_LABELS_KEY = "jaxort.custom_loss.label_names"


def loss_label_names(loss_fn: Callable, n_outputs: int) -> tuple:
    """The label names a JAX loss takes: its positional parameters after the model outputs.

    ``loss_fn(*model_outputs, *labels) -> scalar``; parameters with defaults
    are options, not labels.

    Args:
      loss_fn: the loss.
      n_outputs: how many model outputs it takes first.

    Returns:
      The label names, in order.

    Raises:
      TrainingError: the signature cannot be read (pass the names explicitly).
    """
    try:
        params = list(inspect.signature(loss_fn).parameters.values())
    except (TypeError, ValueError):
        raise TrainingError(f"cannot read the parameters of the loss {loss_fn!r}; pass label_names") from None
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return tuple(names[n_outputs:])


def custom_loss(model: onnx.ModelProto) -> tuple[str, tuple] | None:
    """The JAX loss a training model was generated with, as ``(name, label_names)``, or None.

    Args:
      model: a training or eval model.

    Returns:
      None for models that compute their loss; otherwise the callable's name
      and the label inputs it takes, read from the model's metadata.
    """
    props = {p.key: p.value for p in model.metadata_props}
    if CUSTOM_LOSS_KEY not in props:
        return None
    labels = props.get(CUSTOM_LOSS_LABELS_KEY, "")
    return props[CUSTOM_LOSS_KEY], tuple(n for n in labels.split(",") if n)


@dataclasses.dataclass(frozen=True)
class TrainingModelInfo:
    """What a training (or eval) model's inputs and outputs mean.

    Attributes:
      input_names: user inputs then labels (ORT's ``Module.input_names()``).
      output_names: user outputs, the loss first (ORT's ``Module.output_names()``).
      trainable_names: parameters that get gradients, in graph input order.
      frozen_names: the other parameters.
      param_inputs: parameters fed as graph inputs.
      param_initializers: parameters stored as initializers.
    """

    input_names: tuple
    output_names: tuple
    trainable_names: tuple
    frozen_names: tuple
    param_inputs: tuple
    param_initializers: tuple


def _graph_inputs(model: onnx.ModelProto) -> list:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def describe_training_model(
    model: onnx.ModelProto,
    *,
    parameter_names: Iterable[str] | None = None,
    trainable_names: Iterable[str] | None = None,
) -> TrainingModelInfo:
    """Sorts a training or eval model's inputs into user inputs and parameters.

    Trainable parameters are those with a ``<name>_grad.accumulation.buffer``
    input (or ``trainable_names`` when given). Frozen parameters are the other
    names of ``parameter_names`` (the checkpoint's parameters, which is how ORT
    itself tells them apart); without it, the graph inputs listed after the
    first trainable parameter. Frozen parameters listed *before* the first
    trainable one (ORT lists parameters in model order) can only be found from
    ``parameter_names``.

    Args:
      model: the training or eval model.
      parameter_names: every parameter name (trainable and frozen), e.g. the
        names in the checkpoint.
      trainable_names: overrides the accumulation-buffer rule.

    Returns:
      The model's ``TrainingModelInfo``.

    Raises:
      TrainingError: the model has no loss output or a named parameter is
        neither a graph input nor an initializer.
    """
    inputs = _graph_inputs(model)
    names = [i.name for i in inputs]
    init_names = [t.name for t in model.graph.initializer]
    buffers = [n[: -len(GRAD_BUFFER_SUFFIX)] for n in names if n.endswith(GRAD_BUFFER_SUFFIX)]
    special = {n for n in names if n.endswith(GRAD_BUFFER_SUFFIX) or n == LAZY_RESET_GRAD}
    candidates = [n for n in names if n not in special]

    if trainable_names is not None:
        trainable = list(trainable_names)
    elif buffers:
        trainable = [n for n in candidates if n in set(buffers)]
        missing = [b for b in buffers if b not in trainable]
        trainable += [b for b in missing if b in init_names]
    else:
        trainable = None

    if parameter_names is not None:
        pset = list(dict.fromkeys(parameter_names))
        unknown = [p for p in pset if p not in names and p not in init_names]
        if unknown:
            raise TrainingError(
                f"parameters {unknown} are neither graph inputs nor initializers of the model")
        params = [n for n in candidates if n in pset] + [n for n in init_names if n in pset]
        if trainable is None:
            trainable = list(params)
    else:
        if trainable is None:
            trainable = []
        tset = set(trainable)
        first = next((k for k, n in enumerate(candidates) if n in tset), len(candidates))
        params = [n for n in candidates[first:]]
        params += [n for n in trainable if n not in params]
    tset = set(trainable)
    frozen = [p for p in params if p not in tset]
    pset = set(params)
    input_names = [n for n in candidates if n not in pset]
    output_names = [o.name for o in model.graph.output if not o.name.endswith(GRAD_OUTPUT_SUFFIX)]
    if not output_names:
        raise TrainingError("the training model has no user outputs (it needs a loss output)")
    ordered_trainable = [p for p in params if p in tset]
    return TrainingModelInfo(
        input_names=tuple(input_names),
        output_names=tuple(output_names),
        trainable_names=tuple(ordered_trainable),
        frozen_names=tuple(frozen),
        param_inputs=tuple(p for p in params if p in set(names)),
        param_initializers=tuple(p for p in params if p not in set(names)),
    )


def slice_model(model: onnx.ModelProto, outputs: Sequence[str],
                keep_inputs: Sequence[str] = ()) -> onnx.ModelProto:
    """Returns a copy of ``model`` with only the nodes ``outputs`` depend on.

    This is how the gradient half of an ORT training model is dropped: the
    backward slice of the loss contains no com.microsoft gradient node.

    Args:
      model: the model.
      outputs: the values to keep as graph outputs (graph outputs or
        intermediate values).
      keep_inputs: graph inputs to keep even when unused.

    Returns:
      The sliced model (graph inputs and initializers that are not needed
      are dropped; opset imports and functions are kept).

    Raises:
      ModelError: the graph has a cycle, a value made twice, a dangling read
        or nodes out of order (:func:`jaxort.graph.check_graph_structure`).
      TrainingError: an output is not produced by the graph.
    """
    graph = model.graph
    check_graph_structure(graph)
    produced = {o for node in graph.node for o in node.output if o}
    available = produced | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    missing = [o for o in outputs if o not in available]
    if missing:
        raise TrainingError(f"outputs {missing} are not computed by the model")
    keep, needed = backward_slice(graph.node, outputs)
    new = onnx.ModelProto()
    new.CopyFrom(model)
    g = new.graph
    del g.node[:]
    g.node.extend(keep)
    keep_in = set(keep_inputs) | needed
    inputs = [i for i in graph.input if i.name in keep_in]
    del g.input[:]
    g.input.extend(inputs)
    inits = [t for t in graph.initializer if t.name in needed]
    del g.initializer[:]
    g.initializer.extend(inits)
    value_infos = {v.name: v for v in list(graph.value_info) + list(graph.output)}
    del g.output[:]
    for o in outputs:
        if o in value_infos:
            g.output.append(value_infos[o])
        else:
            g.output.append(onnx.helper.make_empty_tensor_value_info(o))
    vi = [v for v in graph.value_info if v.name in needed]
    del g.value_info[:]
    g.value_info.extend(vi)
    return new
