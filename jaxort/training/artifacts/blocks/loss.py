"""Loss blocks, as ORT's ``onnxblock.loss``: MSELoss, CrossEntropyLoss, BCEWithLogitsLoss, L1Loss.

Each adds its label input when the model has no value of that name yet
(``target``: the scores' type and shape; ``labels``: int64, the scores'
shape without its last axis) and returns the loss value's name. The nodes
and names are ORT 1.19.2's; ``jaxort.training.artifacts.generate_artifacts``
builds its ``LossType`` losses with these blocks.

Two departures, where ORT 1.19.2 fails: ``reduction="none"`` works for every
loss (ORT's MSELoss, BCEWithLogitsLoss and L1Loss raise a TypeError for it),
and CrossEntropyLoss takes a class-weight array of any length (ORT tests the
array's truth value, a ValueError for more than one class).

Part of the training layer: imports onnx, numpy, the graph layer's tensor helpers and the blocks.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from onnx import TensorProto, helper

from jaxort.errors import TrainingError
from jaxort.graph import default_opset, numpy_dtype, tensor_from_numpy
from jaxort.training.artifacts.blocks._base import Block, _exists, _float_initializer, _name, _value_info
from jaxort.training.artifacts.blocks.ops import (
    Abs,
    Add,
    InputLike,
    Log,
    Mul,
    Neg,
    Pow,
    ReduceMean,
    ReduceSum,
    Sigmoid,
    Sub,
)

__all__ = ["BCEWithLogitsLoss", "CrossEntropyLoss", "L1Loss", "MSELoss"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction, loss: str) -> str:
    if reduction not in _REDUCTIONS:
        raise TrainingError(f"{loss}: reduction must be one of {list(_REDUCTIONS)}, got {reduction!r}")
    return reduction


def _reducer(reduction: str) -> Optional[Block]:
    # The reductions run over all axes and drop them; "none" keeps the elementwise loss.
    return {"mean": ReduceMean(keepdims=False), "sum": ReduceSum(keepdims=False),
            "none": None}[reduction]


def _reduced(reducer: Optional[Block], name: str) -> str:
    return name if reducer is None else reducer(name)


def _weights(value, loss: str, what: str, like_type: int) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "fiu":
        raise TrainingError(f"{loss}: {what} must be a number or an array of numbers, got {value!r}")
    if like_type and array.dtype != numpy_dtype(like_type):
        # SoftmaxCrossEntropyLoss and Mul need the scores' type; ORT takes the array as given.
        array = array.astype(numpy_dtype(like_type))
    return array


def _elem_type(model, name: str) -> int:
    try:
        return _value_info(model, name).type.tensor_type.elem_type
    except TrainingError:
        return 0


class _DifferenceLoss(Block):
    """``reduce(elementwise(input - target))``."""

    def __init__(self, reduction: str, elementwise: Block):
        super().__init__()
        self._reduce = _reducer(_check_reduction(reduction, type(self).__name__))
        self._sub = Sub()
        self._elementwise = elementwise

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        """Appends the loss of ``loss_input_name`` against ``target_name`` (a new input if absent); returns its name."""
        if not _exists(self.base, target_name):
            target_name = InputLike(loss_input_name)(target_name)
        return _reduced(self._reduce, self._elementwise(self._sub(loss_input_name, target_name)))


class MSELoss(_DifferenceLoss):
    """Mean squared error: ``reduce((input - target) ** 2)``."""

    def __init__(self, reduction: str = "mean"):
        """Makes the block.

        Args:
          reduction: "mean", "sum" or "none".

        Raises:
          TrainingError: another reduction.
        """
        super().__init__(reduction, Pow(2.0))


class L1Loss(_DifferenceLoss):
    """Mean absolute error: ``reduce(abs(input - target))``."""

    def __init__(self, reduction: str = "mean"):
        """Makes the block; ``reduction`` as for :class:`MSELoss`."""
        super().__init__(reduction, Abs())


class CrossEntropyLoss(Block):
    """Softmax cross-entropy over classes (axis 1), one ``SoftmaxCrossEntropyLoss`` node.

    Needs opset 12 or newer.
    """

    def __init__(self, weight=None, reduction: str = "mean", ignore_index: Optional[int] = None):
        """Makes the block.

        Args:
          weight: a 1-D array, one rescaling weight per class, or None.
          reduction: "mean" (weighted by the labels' weights), "sum" or "none".
          ignore_index: a label value that contributes neither to the loss
            nor to the mean's denominator, or None.

        Raises:
          TrainingError: a bad reduction, weight or ignore_index.
        """
        super().__init__()
        self._reduction = _check_reduction(reduction, "CrossEntropyLoss")
        if weight is not None and np.ndim(weight) != 1:
            raise TrainingError(f"CrossEntropyLoss: weight must be a 1-D array (one weight per class), "
                                f"got shape {list(np.shape(weight))}")
        if ignore_index is not None and (isinstance(ignore_index, bool)
                                         or not isinstance(ignore_index, (int, np.integer))):
            raise TrainingError(f"CrossEntropyLoss: ignore_index must be an int or None, got {ignore_index!r}")
        self._weight = weight
        self._ignore_index = None if ignore_index is None else int(ignore_index)

    def build(self, scores_input_name: str, labels_name: str = "labels") -> str:
        """Appends the loss of ``scores_input_name`` against ``labels_name``; returns its name.

        ``labels_name`` becomes a new int64 input if the model has no such value.

        Raises:
          TrainingError: the model's opset is below 12, or the scores' type is unknown.
        """
        opset = default_opset(self.base)
        if opset < 12:
            raise TrainingError(
                f"CrossEntropyLoss needs SoftmaxCrossEntropyLoss (opset >= 12); the model has opset {opset}")
        weight_name = _name("celoss.weight")  # drawn with or without a weight, as ORT does
        if self._weight is not None:
            weight = _weights(self._weight, "CrossEntropyLoss", "weight", _elem_type(self.base, scores_input_name))
            self.base.graph.initializer.append(tensor_from_numpy(weight, weight_name))
        if not _exists(self.base, labels_name):
            # Classes are the last axis of the scores: (N, C) -> labels (N,).
            labels = _value_info(self.base, scores_input_name)
            labels.name = labels_name
            labels.type.tensor_type.elem_type = TensorProto.INT64
            if labels.type.tensor_type.HasField("shape") and labels.type.tensor_type.shape.dim:
                del labels.type.tensor_type.shape.dim[-1]
            self.base.graph.input.append(labels)
        inputs = [scores_input_name, labels_name] + ([weight_name] if self._weight is not None else [])
        loss = _name("loss")
        log_prob = _name("log_prob")
        self.base.graph.node.append(helper.make_node(
            "SoftmaxCrossEntropyLoss", inputs, [loss, log_prob], reduction=self._reduction,
            ignore_index=self._ignore_index, name=_name("SoftmaxCrossEntropyLoss")))
        return loss


class BCEWithLogitsLoss(Block):
    """Binary cross-entropy on logits: ``reduce(-w * (p * t * log(s) + (1 - t) * log(1 - s)))``, ``s = sigmoid(x)``.

    As ORT 1.19.2 writes it: Sigmoid then Log, not the log-sum-exp form, so
    very large logits give infinities where PyTorch's stays finite.
    """

    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
        """Makes the block.

        Args:
          weight: ``w``, a rescaling weight broadcast against the elementwise
            loss (a number or an array), or None.
          reduction: "mean", "sum" or "none".
          pos_weight: ``p``, the weight of the positive term, broadcast like
            ``weight`` (one per class: the scores' last axis), or None.

        Raises:
          TrainingError: a bad reduction or weights.
        """
        super().__init__()
        for what, value in (("weight", weight), ("pos_weight", pos_weight)):
            if value is not None:
                _weights(value, "BCEWithLogitsLoss", what, 0)
        self._weight = weight
        self._pos_weight = pos_weight
        self._reduce = _reducer(_check_reduction(reduction, "BCEWithLogitsLoss"))
        self._sigmoid = Sigmoid()
        self._log = Log()
        self._sub = Sub()
        self._add = Add()
        self._mul = Mul()
        self._neg = Neg()

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        """Appends the loss of ``loss_input_name`` against ``target_name`` (a new input if absent); returns its name."""
        like = _elem_type(self.base, loss_input_name)
        weights = {}
        for token, value in (("bceloss.pos_weight", self._pos_weight), ("bceloss.weight", self._weight)):
            weights[token] = _name(token)  # drawn with or without the weight, as ORT does
            if value is not None:
                array = _weights(value, "BCEWithLogitsLoss", token.split(".")[1], like)
                self.base.graph.initializer.append(tensor_from_numpy(array, weights[token]))
        # ORT writes the ones as float32 whatever the scores' type (an ill-typed
        # model for float16 or bfloat16 scores); jaxort writes them in that type.
        ones = [_float_initializer(self.base, "bceloss.sub_ones", 1.0, like) for _ in range(2)]
        if not _exists(self.base, target_name):
            target = _value_info(self.base, loss_input_name)
            target.name = target_name
            self.base.graph.input.append(target)
        sigmoid = self._sigmoid(loss_input_name)
        positive = self._mul(self._log(sigmoid), target_name)
        if self._pos_weight is not None:
            positive = self._mul(positive, weights["bceloss.pos_weight"])
        negative = self._mul(self._log(self._sub(ones[0], sigmoid)), self._sub(ones[1], target_name))
        loss = self._neg(self._add(positive, negative))
        if self._weight is not None:
            loss = self._mul(weights["bceloss.weight"], loss)
        return _reduced(self._reduce, loss)
