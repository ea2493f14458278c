"""The training and eval models of a forward + loss model, in ORT's layout.

The steps both :func:`jaxort.training.artifacts.generate_artifacts` and the
blocks' ``TrainingBlock`` (:mod:`jaxort.training.artifacts.blocks`) take
after a loss is built: parameters split and checked, outputs registered,
initializers moved to inputs, the eval model's training mode turned off,
gradient buffers and the gradient graph added. Kept apart from ``generate``
so that the blocks, which ``generate`` builds its losses and optimizer
models with, import no module that imports them.

Part of the training layer: it imports onnx, the graph layer's checker and the
gradient graph only.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Optional

import onnx
from onnx import TensorProto, helper

from jaxort.errors import ModelError, NoGradientGraphWarning, TrainingError
from jaxort.graph import check_model
from jaxort.training.artifacts.export import trim_inference_batchnorm_outputs
from jaxort.training.artifacts.gradient import add_gradient_graph, to_batch_norm_internal
from jaxort.training.artifacts.read import GRAD_BUFFER_SUFFIX, GRAD_OUTPUT_SUFFIX, LAZY_RESET_GRAD

__all__ = ["FLOAT_TYPES", "NO_GRADIENT_DOMAIN", "NO_GRADIENT_OP", "check_generated", "register_outputs",
           "split_params", "training_and_eval"]

# onnxruntime-training 1.19.2 reads models up to IR version 10 (ONNX 1.16).
_ORT_MAX_IR_VERSION = 10

#: The element types a trainable parameter may have.
FLOAT_TYPES = frozenset(
    {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})


def check_generated(model: onnx.ModelProto, what: str) -> None:
    """Checks a model jaxort built with ``onnx.checker`` (full check).

    Args:
      model: the model.
      what: how the error message names it (``"training model"``).

    Raises:
      TrainingError: the model is not valid ONNX.
    """
    try:
        check_model(model, full_check=True)
    except ModelError as e:
        raise TrainingError(f"the generated {what} is not a valid ONNX model: {e}") from e


def register_outputs(model: onnx.ModelProto, names: Sequence[str]) -> None:
    """Makes ``names`` the graph outputs, as onnxblock's ``register_graph_outputs``.

    Args:
      model: the model, changed in place; its outputs become exactly
        ``names``, typed from the existing outputs or the value infos
        (inferred shapes).
      names: the output values, in order.

    Raises:
      TrainingError: a name is neither an output nor a value of known type.
    """
    known = {vi.name: vi for vi in model.graph.value_info}
    known.update({o.name: o for o in model.graph.output})
    missing = [n for n in names if n not in known]
    if missing:
        raise TrainingError(f"{missing} are neither graph outputs nor values with known types")
    outputs = [copy.deepcopy(known[n]) for n in names]
    del model.graph.output[:]
    model.graph.output.extend(outputs)


def split_params(base: onnx.ModelProto, requires_grad: Optional[Sequence[str]],
                 frozen_params: Optional[Sequence[str]]) -> tuple:
    """The trainable and frozen parameter names, checked against the model's initializers.

    Args:
      base: the forward model.
      requires_grad: the initializers to train; None trains nothing, as in
        ORT 1.19.2.
      frozen_params: the initializers kept as frozen parameters, or None.

    Returns:
      ``(trainable, frozen)``, two sets of names.

    Raises:
      TrainingError: a name in both lists, a name that is no initializer,
        or a trainable initializer that is not floating point.
    """
    init_names = [t.name for t in base.graph.initializer]
    frozen = list(frozen_params or [])
    # As ORT 1.19.2: requires_grad=None trains nothing.
    trainable = list(requires_grad or [])
    both = sorted(set(trainable) & set(frozen))
    if both:
        raise TrainingError(
            f"a parameter cannot be frozen and require gradient computation at the same time {both}")
    unknown = [n for n in trainable + frozen if n not in init_names]
    if unknown:
        raise TrainingError(f"{unknown} are not initializers of the model; it has {init_names}")
    bad = [t.name for t in base.graph.initializer
           if t.name in set(trainable) and t.data_type not in FLOAT_TYPES]
    if bad:
        raise TrainingError(f"parameters {bad} are not floating point and cannot require gradients")
    return set(trainable), set(frozen)


def _move_initializers_to_inputs(model: onnx.ModelProto, names: set) -> None:
    # As onnxblock does: parameters become graph inputs (initializer order) so
    # the training and eval sessions can share them. With no parameters named,
    # ORT 1.19.2 moves every initializer; kept for the same files.
    keep = []
    for init in model.graph.initializer:
        if not names or init.name in names:
            model.graph.input.append(
                helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            keep.append(init)
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)


def _disable_training_mode(model: onnx.ModelProto) -> None:
    # onnxblock's eval model: Dropout loses its training_mode input,
    # BatchNormalization's training_mode attribute becomes 0.
    for node in model.graph.node:
        if node.op_type == "Dropout" and len(node.input) > 2:
            node.input[2] = ""
        elif node.op_type == "BatchNormalization":
            for attr in node.attribute:
                if attr.name == "training_mode":
                    attr.i = 0


def _ort_readable_ir(model: onnx.ModelProto) -> None:
    if model.ir_version <= _ORT_MAX_IR_VERSION:
        return
    needed = max(
        (helper.find_min_ir_version_for([imp], ignore_unknown=True) for imp in model.opset_import),
        default=3)
    model.ir_version = max(needed, min(model.ir_version, _ORT_MAX_IR_VERSION))


# The domain of the node that stands for a gradient graph jaxort did not write.
NO_GRADIENT_DOMAIN = "ai.jaxort"
NO_GRADIENT_OP = "NoGradientGraph"


def _mark_no_gradient_graph(model: onnx.ModelProto, trainable: Sequence[str]) -> None:
    # One node makes every <param>_grad.accumulation.out: jaxort ignores it (it
    # differentiates the loss slice), ONNX Runtime has no kernel for it and refuses
    # to load the model, rather than train it with zero gradients.
    outs = [f"{p}{GRAD_OUTPUT_SUFFIX}" for p in trainable]
    if not outs:
        return
    model.graph.node.append(helper.make_node(
        NO_GRADIENT_OP, [f"{p}{GRAD_BUFFER_SUFFIX}" for p in trainable] + [LAZY_RESET_GRAD], outs,
        name=NO_GRADIENT_OP, domain=NO_GRADIENT_DOMAIN,
        doc_string="jaxort wrote this training model without a gradient graph "
                   "(generate_artifacts(..., gradient_graph=False)): jaxort trains it, ONNX Runtime cannot"))
    model.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.BOOL, [1]) for o in outs)
    if not any(imp.domain == NO_GRADIENT_DOMAIN for imp in model.opset_import):
        model.opset_import.append(helper.make_opsetid(NO_GRADIENT_DOMAIN, 1))


def training_and_eval(forward: onnx.ModelProto, outputs: Sequence[str], trainable: set, frozen: set, *,
                      gradient_graph: Optional[bool] = True, properties: Optional[dict] = None) -> tuple:
    """The training and eval models of a forward + loss model, in ORT's layout.

    Shared by :func:`~jaxort.training.artifacts.generate_artifacts` and
    ``jaxort.onnxblock.TrainingBlock``.

    Args:
      forward: the checked forward + loss model (not changed).
      outputs: the graph outputs, the loss first.
      trainable, frozen: the parameter names.
      gradient_graph: write the gradient graph (else the NoGradientGraph
        marker); None: write it where every node on the loss path has a rule,
        else warn (:class:`jaxort.errors.NoGradientGraphWarning`, naming the
        node) and write the marker.
      properties: metadata props for both models.

    Returns:
      ``(training_model, eval_model, trainable, frozen)``: the parameters as
      TensorProto lists in initializer order.
    """
    inferred = onnx.shape_inference.infer_shapes(forward)
    register_outputs(inferred, list(outputs))
    trainable_list = [t for t in inferred.graph.initializer if t.name in trainable]
    frozen_list = [t for t in inferred.graph.initializer if t.name in frozen]
    _move_initializers_to_inputs(inferred, trainable | frozen)
    _ort_readable_ir(inferred)
    if properties:
        helper.set_model_props(inferred, properties)
    eval_model = copy.deepcopy(inferred)
    _disable_training_mode(eval_model)
    # Unlike ORT 1.19.2, whose eval model onnxruntime then refuses to load.
    trim_inference_batchnorm_outputs(eval_model.graph)
    training_model = inferred
    buffers = [helper.make_tensor_value_info(f"{vi.name}{GRAD_BUFFER_SUFFIX}",
                                             vi.type.tensor_type.elem_type,
                                             [d.dim_value for d in vi.type.tensor_type.shape.dim])
               for vi in training_model.graph.input if vi.name in trainable]
    training_model.graph.input.extend(buffers)
    training_model.graph.input.append(
        helper.make_tensor_value_info(LAZY_RESET_GRAD, TensorProto.BOOL, [1]))
    order = [vi.name for vi in training_model.graph.input if vi.name in trainable]
    if gradient_graph is None and order:
        training_model = _with_gradient_graph_or_warn(training_model, outputs[0], order)
    elif gradient_graph and order:
        to_batch_norm_internal(training_model)
        add_gradient_graph(training_model, outputs[0], order)
    else:
        _mark_no_gradient_graph(training_model, order)
    return training_model, eval_model, trainable_list, frozen_list


def _with_gradient_graph_or_warn(model: onnx.ModelProto, loss: str, trainable: list) -> onnx.ModelProto:
    """``model`` with the gradient graph, or with the NoGradientGraph marker and a warning when it cannot have one."""
    work = copy.deepcopy(model)
    try:
        to_batch_norm_internal(work)
        add_gradient_graph(work, loss, trainable)
    except TrainingError as err:
        warnings.warn(NoGradientGraphWarning(str(err)), stacklevel=5)
        _mark_no_gradient_graph(model, trainable)
        return model
    return work
