"""ForwardBlock and TrainingBlock: blocks that finish a model, as ORT's ``onnxblock.onnxblock``.

A :class:`ForwardBlock` makes its outputs the model's graph outputs (an
inference model, or an optimizer model). A :class:`TrainingBlock` builds
the loss and then the training and eval models in ORT's layout, with the
machinery of :func:`jaxort.training.artifacts.generate_artifacts`: parameters
become graph inputs, ``<param>_grad.accumulation.buffer`` inputs and
``lazy_reset_grad`` follow, and the gradient graph of
:mod:`jaxort.training.artifacts.gradient` ends in one ``InPlaceAccumulatorV2``
per trainable parameter.

Part of the training layer: imports the blocks' base and the artifacts' assembly, never the facades.
"""

from __future__ import annotations

import abc

import onnx

from jaxort.errors import StateError, TrainingError
from jaxort.training.artifacts.assemble import check_generated, register_outputs, split_params, training_and_eval
from jaxort.training.artifacts.blocks._base import Block, output_names

__all__ = ["ForwardBlock", "TrainingBlock"]


def _built(block: Block, value, what: str):
    if value is None:
        raise StateError(f"{type(block).__name__} has not built {what} yet: call it inside a base model "
                         "context first")
    return value


class ForwardBlock(Block):
    """A block whose outputs become the model's graph outputs, as ORT's ``onnxblock.ForwardBlock``.

    Example:
      >>> class WithLoss(ForwardBlock):  # doctest: +SKIP
      ...     def __init__(self):
      ...         super().__init__()
      ...         self.loss = onnxblock.loss.MSELoss()
      ...
      ...     def build(self, output_name):
      ...         return self.loss(output_name)
    """

    def __init__(self):
        """Makes the block."""
        super().__init__()
        self._model = None

    @abc.abstractmethod
    def build(self, *args, **kwargs):
        """Appends this block's nodes and returns the name(s) that become the graph outputs."""

    def to_model_proto(self) -> onnx.ModelProto:
        """The model built by the last call.

        Raises:
          StateError: the block was not called yet.
        """
        return _built(self, self._model, "its model")

    def __call__(self, *args, **kwargs):
        """Runs :meth:`build`, infers shapes and makes its outputs the graph outputs.

        Raises:
          StateError: no base model context is open.
          TrainingError: the result is not valid ONNX, or an output has no known type.
        """
        accessor, output = self._build_on_open_model(args, kwargs)
        model = onnx.shape_inference.infer_shapes(accessor.model)
        register_outputs(model, output_names(output, f"{type(self).__name__}.build"))
        accessor.model.CopyFrom(model)
        self._model = model
        return output


class TrainingBlock(Block):
    """A block that builds the loss and the gradient graph, as ORT's ``onnxblock.TrainingBlock``.

    :meth:`build` returns the loss (and any other outputs; the first is
    differentiated). Calling the block then makes the training and eval
    models (:meth:`to_model_proto`) and the parameters (:meth:`parameters`)
    that ``generate_artifacts`` would write. Only the initializers named with
    :meth:`requires_grad` train, as in ORT.

    Example:
      >>> class Training(TrainingBlock):  # doctest: +SKIP
      ...     def __init__(self):
      ...         super().__init__()
      ...         self.loss = onnxblock.loss.CrossEntropyLoss()
      ...
      ...     def build(self, output_name):
      ...         return self.loss(output_name)
      >>> block = Training()  # doctest: +SKIP
      >>> block.requires_grad("fc.weight")  # doctest: +SKIP
      >>> with onnxblock.base(model):  # doctest: +SKIP
      ...     block("output")
      >>> training_model, eval_model = block.to_model_proto()  # doctest: +SKIP
    """

    def __init__(self):
        """Makes the block; no parameter requires a gradient yet."""
        super().__init__()
        self._requires_grad: dict = {}
        self._frozen_params: dict = {}
        self._parameters = None
        self._models = None

    @abc.abstractmethod
    def build(self, *args, **kwargs):
        """Appends the loss and returns its name (or the loss first, then other outputs)."""

    def requires_grad(self, argument_name: str, value: bool = True) -> None:
        """Marks an initializer as trainable (True) or frozen (False).

        The name is checked when the block is built: it must then be an
        initializer of the model (floating point to be trainable).

        Args:
          argument_name: the initializer.
          value: True to train it, False to keep it as a frozen parameter.

        Raises:
          TrainingError: the name is not a string or ``value`` not a bool.
        """
        if not isinstance(argument_name, str) or not argument_name:
            raise TrainingError(f"requires_grad takes an initializer name, got {argument_name!r}")
        if not isinstance(value, bool):
            raise TrainingError(f"requires_grad({argument_name!r}, value) takes a bool, got {value!r}")
        self._state("requires_grad")
        keep, drop = (self._requires_grad, self._frozen_params) if value else (
            self._frozen_params, self._requires_grad)
        keep[argument_name] = None
        drop.pop(argument_name, None)

    def parameters(self) -> tuple:
        """The ``(trainable, frozen)`` parameters as onnx TensorProto lists, in initializer order.

        Raises:
          StateError: the block was not called yet.
        """
        return _built(self, self._parameters, "its parameters")

    def to_model_proto(self) -> tuple:
        """The ``(training_model, eval_model)`` ModelProtos.

        Raises:
          StateError: the block was not called yet.
        """
        return _built(self, self._models, "its models")

    def _state(self, what: str) -> None:
        if not hasattr(self, "_requires_grad"):
            raise StateError(f"{type(self).__name__}.{what}: its __init__ did not call super().__init__()")

    def __call__(self, *args, **kwargs):
        """Runs :meth:`build`, then builds the training and eval models.

        The open model becomes the training model, as in ORT.

        Raises:
          StateError: no base model context is open.
          TrainingError: an unknown or non-float parameter name, an invalid
            model, or a node on the loss path without a gradient rule (named).
        """
        self._state("__call__")
        accessor, output = self._build_on_open_model(args, kwargs, check=False)
        outputs = output_names(output, f"{type(self).__name__}.build")
        check_generated(accessor.model, f"model built by {type(self).__name__}")
        trainable, frozen = split_params(accessor.model, list(self._requires_grad), list(self._frozen_params))
        training, evaluation, params, frozen_params = training_and_eval(
            accessor.model, outputs, trainable, frozen)
        self._parameters = (params, frozen_params)
        self._models = (training, evaluation)
        accessor.model.CopyFrom(training)
        return output

