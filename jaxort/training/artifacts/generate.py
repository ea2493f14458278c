"""Training artifact generation, shaped like ``onnxruntime.training.artifacts``.

:func:`generate_artifacts` turns a forward ONNX model into the four files of
ONNX Runtime Training: ``training_model.onnx``, ``eval_model.onnx``,
``optimizer_model.onnx`` and ``checkpoint``. The loss subgraphs, input and
output names, input order, optimizer node and checkpoint follow what
onnxruntime-training 1.19.2 writes (its ``onnxblock`` package), so the eval
model, optimizer model and checkpoint load in ONNX Runtime unchanged. The
losses and optimizer models are built with :mod:`jaxort.onnxblock`'s blocks
(defined in :mod:`jaxort.training.artifacts.blocks`), which ``loss`` and
``optimizer`` also take, as ORT's take its own.

The training model holds a gradient graph for ONNX Runtime
(:mod:`jaxort.training.artifacts.gradient`): one rule per forward node,
ORT's gradient kernels where ORT's gradient builder uses them and standard
ONNX ops elsewhere, ending in ORT's ``InPlaceAccumulatorV2`` per trainable
parameter, so ORT's ``Module`` trains the files as it trains its own; BatchNormalization nodes
become ORT's ``com.microsoft::BatchNormInternal`` there, as in ORT's files
(batch statistics, running statistics written back). jaxort itself never
runs the gradient graph (it differentiates the forward + loss graph with
``jax.grad``). Where a
node on the loss path has no rule yet, :func:`generate_artifacts` writes
jaxort-only artifacts and warns (:class:`jaxort.errors.NoGradientGraphWarning`,
naming the node): their accumulator outputs come from one
``ai.jaxort::NoGradientGraph`` node, so ONNX Runtime refuses the training
model when it loads it instead of training it with zero gradients.
``gradient_graph=True`` raises a TrainingError naming the node instead,
before writing anything; ``gradient_graph=False`` writes jaxort-only
artifacts without trying.

A second, smaller one: in the eval model, a BatchNormalization that was in
training mode loses its unused running-statistics outputs. ORT 1.19.2 keeps
them, and then neither onnxruntime inference nor ORT's own ``Module`` loads
its eval model.

Part of the training layer: it imports the graph and checkpoint layers and
the blocks of jaxort.training.artifacts.blocks, never jaxort.onnxblock (which
re-exports those blocks) or the facades.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Optional, Union

import onnx
from onnx import TensorProto

from jaxort import checkpoint as _ckpt
from jaxort.errors import TrainingError
from jaxort.graph import check_graph_structure, default_opset, load_model, save_model
from jaxort.training.artifacts.assemble import (
    FLOAT_TYPES,
    NO_GRADIENT_OP,
    check_generated,
    split_params,
    training_and_eval,
)
from jaxort.training.artifacts.blocks import Block, ForwardBlock, TrainingBlock, empty_base, output_names
from jaxort.training.artifacts.blocks import base as base_context
from jaxort.training.artifacts.blocks.loss import BCEWithLogitsLoss, CrossEntropyLoss, L1Loss, MSELoss
from jaxort.training.artifacts.blocks.optim import SGD, AdamW
from jaxort.training.artifacts.read import CUSTOM_LOSS_KEY, CUSTOM_LOSS_LABELS_KEY, loss_label_names

__all__ = [
    "Artifacts",
    "LossType",
    "OptimType",
    "build_eval_model",
    "build_optimizer_model",
    "build_training_model",
    "generate_artifacts",
]


class LossType(enum.Enum):
    """Loss added on top of the model's output (values as in ORT's enum)."""

    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4


class OptimType(enum.Enum):
    """Optimizer of the generated optimizer model (values as in ORT's enum)."""

    AdamW = 1
    SGD = 2


@dataclasses.dataclass(frozen=True)
class Artifacts:
    """What :func:`generate_artifacts` wrote.

    ONNX Runtime's ``generate_artifacts`` returns None; jaxort returns the paths
    and, for a JAX callable loss, the callable, which the files cannot hold.

    Attributes:
      training_model: path of ``<prefix>training_model.onnx``.
      eval_model: path of ``<prefix>eval_model.onnx``.
      checkpoint: path of ``<prefix>checkpoint``.
      optimizer_model: path of ``<prefix>optimizer_model.onnx`` (None without
        an optimizer).
      nominal_checkpoint: path of ``<prefix>nominal_checkpoint`` (None unless
        asked for).
      loss_fn: the JAX callable given as ``loss`` (None for a LossType).
      label_names: the label inputs: ``["labels"]`` or ``["target"]`` for a
        LossType, the callable's trailing parameter names for a custom loss.
      gradient_graph: whether the training model holds the gradient graph
        ONNX Runtime trains with (False: jaxort-only artifacts).
    """

    training_model: pathlib.Path
    eval_model: pathlib.Path
    checkpoint: pathlib.Path
    optimizer_model: Optional[pathlib.Path] = None
    nominal_checkpoint: Optional[pathlib.Path] = None
    loss_fn: Optional[Callable] = None
    label_names: tuple = ()
    gradient_graph: bool = True


def _find_output(model: onnx.ModelProto, name: str) -> onnx.ValueInfoProto:
    for out in model.graph.output:
        if out.name == name:
            return out
    raise TrainingError(
        f"{name!r} is not a graph output; the outputs are {[o.name for o in model.graph.output]}")


def _loss_block(loss: LossType):
    return {LossType.MSELoss: MSELoss, LossType.CrossEntropyLoss: CrossEntropyLoss,
            LossType.BCEWithLogitsLoss: BCEWithLogitsLoss, LossType.L1Loss: L1Loss}[loss]()


def _is_jax_loss(loss) -> bool:
    # A Block is callable too: it is an ONNX loss, not a JAX one.
    return callable(loss) and not isinstance(loss, (LossType, Block))


@dataclasses.dataclass
class _Built:
    training_model: onnx.ModelProto
    eval_model: onnx.ModelProto
    trainable: list
    frozen: list
    label_names: tuple


def _refuse_onnxblock(value, what: str) -> None:
    # ORT's Blocks are callables: without this they would pass for JAX losses. A
    # user's own block subclasses ORT's Block, so the whole MRO is looked at.
    ort = next((c for c in type(value).__mro__
                if (c.__module__ or "").startswith("onnxruntime.training.onnxblock")), None)
    if ort is None:
        return
    home = {"loss": "loss.", "optim": "optim.", "blocks": "blocks."}.get((ort.__module__.split(".") + [""])[3], "")
    raise TrainingError(
        f"{what} {type(value).__name__} is an onnxruntime.training.onnxblock block; jaxort takes the same "
        f"blocks from jaxort.onnxblock: change the import to `from jaxort import onnxblock` "
        f"(onnxblock.{home}{ort.__name__})")


def _loss_outputs(base: onnx.ModelProto, loss, scores: list) -> list:
    """Adds the loss to the open base model (a block, checked) and returns the output names."""
    if isinstance(loss, LossType):
        if not scores:
            raise TrainingError("the model has no outputs to put a loss on")
        _find_output(base, scores[0])
        block = _loss_block(loss)
    elif isinstance(loss, (ForwardBlock, TrainingBlock)):
        raise TrainingError(
            f"the loss {type(loss).__name__} is a {type(loss).__mro__[1].__name__}, which builds a whole model; "
            "give a plain onnxblock.Block whose build returns the loss name")
    elif isinstance(loss, Block):
        block = loss
    else:
        raise TrainingError(
            f"unknown loss {loss!r}: expected a jaxort LossType, a jaxort.onnxblock Block, a JAX callable, "
            "or None")
    return output_names(block(*scores), f"the loss {type(block).__name__}")


def _build(model, requires_grad, frozen_params, loss, additional_output_names, loss_input_names,
           name_offset=0, gradient_graph=None):
    _refuse_onnxblock(loss, "the loss")
    base = load_model(model, check=False)
    # Before onnx.checker, whose message names one node of a cycle.
    check_graph_structure(base.graph)
    load_model(base, check=True)
    trainable, frozen = split_params(base, requires_grad, frozen_params)
    scores = list(loss_input_names or [o.name for o in base.graph.output])
    extra = list(additional_output_names or [])
    n_inputs = len(base.graph.input)
    custom = _is_jax_loss(loss)
    if gradient_graph is None and custom:
        gradient_graph = False
    if gradient_graph and custom:
        raise TrainingError("gradient_graph=True needs a loss in ONNX (a LossType, an onnxblock Block, or None "
                            "with the loss as the model's first output); a JAX callable loss only trains in jaxort")
    with base_context(base, name_offset=name_offset) as handle:
        if loss is None or custom:
            outputs = scores
            check_generated(handle.model, "loss graph")
        else:
            outputs = _loss_outputs(handle.model, loss, scores)
    forward = handle.model
    label_names = tuple(i.name for i in forward.graph.input[n_inputs:])
    properties = None
    if custom:
        label_names = loss_label_names(loss, len(scores))
        properties = {CUSTOM_LOSS_KEY: getattr(loss, "__qualname__", "loss"),
                      CUSTOM_LOSS_LABELS_KEY: ",".join(label_names)}
    training_model, eval_model, trainable_list, frozen_list = training_and_eval(
        forward, outputs + extra, trainable, frozen, gradient_graph=gradient_graph, properties=properties)
    return _Built(training_model, eval_model, trainable_list, frozen_list, label_names), handle.name_count


def build_training_model(model, requires_grad=None, frozen_params=None, loss=None, *,
                         additional_output_names=None, loss_input_names=None, name_offset=0,
                         gradient_graph=None):
    """Builds the training and eval models in memory (no files).

    Args:
      model: the forward model (path, bytes or ModelProto).
      requires_grad, frozen_params, loss, additional_output_names,
        loss_input_names: as for :func:`generate_artifacts`.
      name_offset: start of the ``onnx::<token>::<n>`` counter. ORT 1.19.2
        counts across a whole process; pass the count ORT had reached to get
        its names exactly.
      gradient_graph: as for :func:`generate_artifacts`.

    Returns:
      ``(training_model, eval_model, trainable, frozen)``: two ModelProtos and
      the parameter TensorProtos, trainable then frozen, in initializer order.

    Raises:
      TrainingError: an unknown parameter or output, or a bad loss.
      ModelError: an invalid model (as for :func:`generate_artifacts`).
    """
    built, _ = _build(model, requires_grad, frozen_params, loss, additional_output_names,
                      loss_input_names, name_offset, gradient_graph)
    return built.training_model, built.eval_model, built.trainable, built.frozen


def build_eval_model(model, requires_grad=None, frozen_params=None, loss=None, **kwargs):
    """The eval model :func:`generate_artifacts` would write (a ModelProto)."""
    return build_training_model(model, requires_grad, frozen_params, loss, **kwargs)[1]


def build_optimizer_model(optimizer: OptimType, param_dtype: int = TensorProto.FLOAT,
                          opset: int = 17, *, name_offset: int = 0) -> onnx.ModelProto:
    """The optimizer model ORT 1.19.2's ``generate_artifacts`` writes for an OptimType.

    Built with ``jaxort.onnxblock.optim.AdamW()`` / ``SGD()``. One
    com.microsoft node: ``AdamWOptimizer`` with onnxblock's default
    attributes (alpha 0.9, beta 0.999, epsilon 1e-6, weight_decay 0,
    correct_bias 1, adam_mode 1), or ``SGDOptimizerV2``. Inputs are
    learning_rate, step, and tensor sequences params, gradients,
    first_order_moments (and second_order_moments for AdamW); the output is a
    bool "updated" flag. IR version 10, producer "orttraining", as ORT writes.

    Args:
      optimizer: the optimizer type.
      param_dtype: element type (TensorProto enum) of the parameter sequences.
      opset: the default-domain opset (the training model's).
      name_offset: counter value before the optimizer's names are drawn
        (ORT shares one counter with the loss names).

    Returns:
      The optimizer ModelProto.

    Raises:
      TrainingError: an unknown optimizer.
    """
    blocks = {OptimType.AdamW: AdamW, OptimType.SGD: SGD}
    if not isinstance(optimizer, OptimType):
        raise TrainingError(f"unknown optimizer {optimizer!r}: expected OptimType.AdamW or OptimType.SGD")
    # The block reads only the parameters' element type.
    parameters = ([TensorProto(name="param", data_type=param_dtype)], [])
    return _optimizer_model(blocks[optimizer](), parameters, opset, name_offset)


def _optimizer_model(block, parameters, opset: int, name_offset: int) -> onnx.ModelProto:
    """An optimizer block's model, built as ORT's generate_artifacts builds it (a fresh empty base)."""
    if not isinstance(block, ForwardBlock):
        raise TrainingError(
            f"the optimizer {type(block).__name__} is a plain Block; an optimizer block must be a ForwardBlock "
            "(onnxblock.optim.AdamW, onnxblock.optim.SGD, or a ForwardBlock of your own)")
    with empty_base(opset, name_offset=name_offset):
        block(parameters)
        return block.to_model_proto()


def float_initializers(model, exclude: Sequence[str] = ()) -> list:
    """Names of the model's floating-point initializers, in initializer order.

    What to pass as ``requires_grad`` to train every weight: ORT's (and
    :func:`generate_artifacts`') ``requires_grad=None`` trains nothing.

    Args:
      model: a path, bytes or ``onnx.ModelProto``.
      exclude: names to leave out (the ones to freeze, say).

    Example:
      >>> generate_artifacts(model, requires_grad=float_initializers(model),
      ...                    loss=LossType.MSELoss, optimizer=OptimType.SGD)  # doctest: +SKIP
    """
    skip = set(exclude)
    return [t.name for t in load_model(model).graph.initializer if t.data_type in FLOAT_TYPES and t.name not in skip]


def generate_artifacts(
    model,
    requires_grad: Optional[Sequence[str]] = None,
    frozen_params: Optional[Sequence[str]] = None,
    loss: Union[LossType, Block, Callable, None] = None,
    optimizer: Union[OptimType, Block, None] = None,
    artifact_directory: Union[str, os.PathLike, None] = None,
    prefix: str = "",
    ort_format: bool = False,
    custom_op_library=None,
    additional_output_names: Optional[Sequence[str]] = None,
    nominal_checkpoint: bool = False,
    loss_input_names: Optional[Sequence[str]] = None,
    *,
    gradient_graph: Optional[bool] = None,
) -> Artifacts:
    """Writes training artifacts for ``model``, like ORT's ``generate_artifacts``.

    The parameters are those of ``onnxruntime.training.artifacts.
    generate_artifacts`` (1.19.2), in the same order. Files:
    ``<prefix>training_model.onnx`` (forward + loss, parameters as inputs,
    gradient buffers and ``lazy_reset_grad``, and the gradient graph ORT
    runs: see the module docstring), ``<prefix>eval_model.onnx`` (forward + loss, standard
    ONNX ops only), ``<prefix>checkpoint`` (and ``<prefix>nominal_checkpoint``)
    and ``<prefix>optimizer_model.onnx``.

    Label inputs are named as ORT names them: ``labels`` (int64, the output
    shape without its last axis) for CrossEntropyLoss, ``target`` (the
    output's type and shape) for the others. Training model inputs: user
    inputs, labels, parameters (initializer order), one
    ``<param>_grad.accumulation.buffer`` per trainable parameter,
    ``lazy_reset_grad``; outputs: the loss, then ``additional_output_names``.

    Args:
      model: the forward model: a path, bytes or ``onnx.ModelProto``.
      requires_grad: initializers to train. None trains nothing, as in ORT
        (then an optimizer is refused): pass
        ``float_initializers(model)`` to train every weight.
      frozen_params: initializers kept as frozen parameters (in the
        checkpoint, not trained). Initializers in neither list stay constants.
      loss: a :class:`LossType`; a ``jaxort.onnxblock.Block`` (a custom loss,
        as ORT takes an ``onnxblock.Block``: it is called with the loss input
        names and returns the loss name, or the loss and other outputs); a
        JAX callable ``loss(*outputs, *labels) -> scalar`` (jaxort-only: the
        models then end at the loss inputs, and the callable comes back in
        the result for ``TrainProgram.from_artifacts(..., loss_fn=...)``); or
        None (the model's first output is the loss).
      optimizer: :class:`OptimType`, or a ``jaxort.onnxblock`` optimizer
        block (``onnxblock.optim.AdamW(weight_decay=0.01)``, ``SGD()``, or a
        ForwardBlock of your own) called with ``(trainable, frozen)``
        parameters in an empty base model, as ORT does; None writes no
        optimizer model.
      artifact_directory: where to write (created if missing); default the
        current directory.
      prefix: prepended to every file name.
      ort_format: ORT's flatbuffer model format; not supported (must be False).
      custom_op_library: not supported (must be None).
      additional_output_names: values returned after the loss.
      nominal_checkpoint: also write a nominal checkpoint (names, shapes and
        types without data).
      loss_input_names: the values the loss reads (default: every graph
        output); a second name, if it is an existing value, is the label.
      gradient_graph: write the gradient graph ONNX Runtime trains with
        (True: a TrainingError names the first node on the loss path without
        a gradient rule, :data:`jaxort.training.artifacts.gradient.RULES`), or
        jaxort-only artifacts that ORT refuses to load (False). Default
        (None): the gradient graph where every node on the loss path has a
        rule, else jaxort-only artifacts and a
        :class:`jaxort.errors.NoGradientGraphWarning` naming the node; a JAX
        callable loss (which has no ONNX form) always writes jaxort-only ones.
        :attr:`Artifacts.gradient_graph` says which was written.

    Returns:
      :class:`Artifacts` with the paths written (ORT returns None).

    Raises:
      TrainingError: unknown or conflicting parameters, an unknown loss or
        optimizer (ORT's own onnxblock blocks included: use jaxort.onnxblock's),
        an invalid resulting model, or an unsupported option. Nothing is
        written then.
      ModelError: an invalid model: :func:`jaxort.graph.check_graph_structure`
        names a cycle, a value made twice, a dangling read or nodes out of
        order; otherwise ``onnx.checker``'s message.

    Example:
      >>> generate_artifacts("model.onnx", loss=LossType.CrossEntropyLoss,
      ...                    optimizer=OptimType.AdamW, artifact_directory="out")  # doctest: +SKIP
    """
    if ort_format:
        raise TrainingError("ort_format=True is not supported: jaxort writes ONNX models only")
    if custom_op_library is not None:
        raise TrainingError("custom_op_library is not supported: jaxort runs no ORT kernels")
    _refuse_onnxblock(optimizer, "the optimizer")
    if optimizer is not None and not isinstance(optimizer, (OptimType, Block)):
        raise TrainingError(f"unknown optimizer {optimizer!r}: expected OptimType.AdamW, OptimType.SGD or a "
                            "jaxort.onnxblock optimizer block (onnxblock.optim.AdamW(...), SGD(...))")
    built, name_count = _build(model, requires_grad, frozen_params, loss, additional_output_names,
                               loss_input_names, gradient_graph=gradient_graph)
    opt = None
    if optimizer is not None:
        if not built.trainable:
            raise TrainingError(
                "an optimizer model needs at least one trainable parameter, and requires_grad names none "
                "(requires_grad=None trains nothing, as in ONNX Runtime); name the initializers to train, "
                "e.g. requires_grad=jaxort.training.artifacts.float_initializers(model)")
        # ORT builds the optimizer in a fresh empty model, its names continuing the loss's count.
        opset = default_opset(built.eval_model)
        if not opset:
            raise TrainingError("the model's opset_import has no entry for the default ONNX domain")
        if isinstance(optimizer, OptimType):
            opt = build_optimizer_model(optimizer, built.trainable[0].data_type, opset, name_offset=name_count)
        else:
            opt = _optimizer_model(optimizer, (built.trainable, built.frozen), opset, name_count)

    out_dir = pathlib.Path(artifact_directory) if artifact_directory is not None else pathlib.Path.cwd()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {k: out_dir / f"{prefix}{k}" for k in (
        "training_model.onnx", "eval_model.onnx", "checkpoint", "nominal_checkpoint",
        "optimizer_model.onnx")}
    save_model(built.training_model, paths["training_model.onnx"])
    save_model(built.eval_model, paths["eval_model.onnx"])
    _ckpt.save_tensors(built.trainable, built.frozen, paths["checkpoint"], nominal=False)
    if nominal_checkpoint:
        _ckpt.save_tensors(built.trainable, built.frozen, paths["nominal_checkpoint"], nominal=True)
    if opt is not None:
        save_model(opt, paths["optimizer_model.onnx"])
    custom = _is_jax_loss(loss)
    return Artifacts(
        training_model=paths["training_model.onnx"],
        eval_model=paths["eval_model.onnx"],
        checkpoint=paths["checkpoint"],
        optimizer_model=paths["optimizer_model.onnx"] if optimizer is not None else None,
        nominal_checkpoint=paths["nominal_checkpoint"] if nominal_checkpoint else None,
        loss_fn=loss if custom else None,
        label_names=built.label_names,
        gradient_graph=not any(n.op_type == NO_GRADIENT_OP for n in built.training_model.graph.node),
    )
