"""The op blocks of ORT's ``onnxblock.blocks``: Add, Sub, Mul, Div, Pow, Neg, Abs, Log, ...

Each appends one node (and its constants) to the open model and returns the
name of its output; the losses and optimizers are built from them.
``jaxort.onnxblock.blocks`` exports them with :class:`~jaxort.training.artifacts.blocks.Block`.

Part of the training layer: it imports onnx, numpy and the blocks' base only.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from jaxort.errors import TrainingError
from jaxort.training.artifacts.blocks._base import Block, _append_node, _float_initializer, _import, _name, _value_info

__all__ = [
    "Abs",
    "Add",
    "Cast",
    "Clip",
    "Constant",
    "Div",
    "InputLike",
    "LabelEncoder",
    "Linear",
    "Log",
    "Mul",
    "Neg",
    "PassThrough",
    "Pow",
    "ReduceAllL2",
    "ReduceMean",
    "ReduceSum",
    "SequenceConstruct",
    "Sigmoid",
    "Sub",
]

_MS_DOMAIN = "com.microsoft"
_ML_DOMAIN = "ai.onnx.ml"


class _BinaryOp(Block):
    def __init__(self, op_name: str):
        super().__init__()
        self._op_name = op_name

    def build(self, input_name1: str, input_name2: str) -> str:
        """Appends the node; returns its output name."""
        return _append_node(self.base, self._op_name, [input_name1, input_name2],
                            f"{self._op_name.lower()}_output")


class Add(_BinaryOp):
    """An ``Add`` node."""

    def __init__(self):
        """Makes the block."""
        super().__init__("Add")


class Sub(_BinaryOp):
    """A ``Sub`` node."""

    def __init__(self):
        """Makes the block."""
        super().__init__("Sub")


class Mul(_BinaryOp):
    """A ``Mul`` node."""

    def __init__(self):
        """Makes the block."""
        super().__init__("Mul")


class Div(_BinaryOp):
    """A ``Div`` node."""

    def __init__(self):
        """Makes the block."""
        super().__init__("Div")


class Pow(Block):
    """A ``Pow`` node with a constant exponent (a float32 [1] initializer)."""

    def __init__(self, exponent: float):
        """Makes the block.

        Args:
          exponent: the exponent.
        """
        super().__init__()
        self._exponent = exponent

    def build(self, pow_input_name: str) -> str:
        """Appends the exponent and the node; returns the node's output name."""
        exponent = _float_initializer(self.base, "pow_exponent", self._exponent)
        return _append_node(self.base, "Pow", [pow_input_name, exponent], "pow_output")


class _UnaryOp(Block):
    def __init__(self, op_name: str, **attributes):
        super().__init__()
        self._op_name = op_name
        self._attributes = attributes

    def build(self, input_name: str) -> str:
        """Appends the node; returns its output name."""
        return _append_node(self.base, self._op_name, [input_name], f"{self._op_name.lower()}_output",
                            **self._attributes)


class ReduceMean(_UnaryOp):
    """A ``ReduceMean`` node over all axes."""

    def __init__(self, keepdims: bool = True):
        """Makes the block.

        Args:
          keepdims: keep the reduced axes (as ones).
        """
        super().__init__("ReduceMean", keepdims=keepdims)


class ReduceSum(_UnaryOp):
    """A ``ReduceSum`` node over all axes."""

    def __init__(self, keepdims: bool = True):
        """Makes the block.

        Args:
          keepdims: keep the reduced axes (as ones).
        """
        super().__init__("ReduceSum", keepdims=keepdims)


class Sigmoid(_UnaryOp):
    """A ``Sigmoid`` node."""

    def __init__(self):
        """Makes the block."""
        super().__init__("Sigmoid")


class Log(_UnaryOp):
    """A ``Log`` node."""

    def __init__(self):
        """Makes the block."""
        super().__init__("Log")


class Neg(_UnaryOp):
    """A ``Neg`` node."""

    def __init__(self):
        """Makes the block."""
        super().__init__("Neg")


class Abs(_UnaryOp):
    """An ``Abs`` node."""

    def __init__(self):
        """Makes the block."""
        super().__init__("Abs")


class Constant(Block):
    """A float32 [1] initializer (ORT's Constant makes floats only)."""

    def __init__(self, value_float: float):
        """Makes the block.

        Args:
          value_float: the value.
        """
        super().__init__()
        self._value = value_float

    def build(self) -> str:
        """Appends the initializer; returns its name."""
        return _float_initializer(self.base, "initializer", self._value)


class SequenceConstruct(Block):
    """A ``SequenceConstruct`` node of the given tensors."""

    def build(self, *sequence_input_names: str) -> str:
        """Appends the node; returns its output name."""
        return _append_node(self.base, "SequenceConstruct", sequence_input_names, "sequenceconstruct_output")


class ReduceAllL2(Block):
    """A ``com.microsoft::ReduceAllL2`` node: the L2 norm of all its inputs together, float32 [1]."""

    def build(self, *reduce_node_input_names: str) -> str:
        """Appends the node (and, as ORT, its output's value info); returns its output name."""
        _import(self.base, _MS_DOMAIN, 1)
        out = _append_node(self.base, "ReduceAllL2", reduce_node_input_names, "reducealll2_output",
                           domain=_MS_DOMAIN)
        self.base.graph.value_info.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [1]))
        return out


class Clip(Block):
    """A ``Clip`` node with optional float32 bounds."""

    def __init__(self, clip_min: Optional[float] = None, clip_max: Optional[float] = None):
        """Makes the block.

        Args:
          clip_min: the lower bound, or None for none.
          clip_max: the upper bound, or None for none.

        Raises:
          TrainingError: ``clip_min`` is greater than ``clip_max``.
        """
        super().__init__()
        if clip_min is not None and clip_max is not None and clip_min > clip_max:
            raise TrainingError(f"Clip: clip_min {clip_min} is greater than clip_max {clip_max}")
        self._min = clip_min
        self._max = clip_max

    def build(self, clip_input_name: str) -> str:
        """Appends the bounds and the node; returns its output name."""
        low = "" if self._min is None else _float_initializer(self.base, "clip_min", self._min)
        high = "" if self._max is None else _float_initializer(self.base, "clip_max", self._max)
        return _append_node(self.base, "Clip", [clip_input_name, low, high], "clip_output")


class PassThrough(Block):
    """Returns its inputs and changes nothing."""

    def build(self, *input_names: str) -> tuple:
        """Returns ``input_names``."""
        return input_names


class InputLike(Block):
    """A new graph input with the type and shape of a graph input or output."""

    def __init__(self, like: str):
        """Makes the block.

        Args:
          like: the graph input or output (looked for in that order) whose
            type and shape the new input takes. jaxort also takes an inner
            value whose type shape inference knows.
        """
        super().__init__()
        self._like = like

    def build(self, input_name: Optional[str] = None) -> str:
        """Appends the input; returns its name (``input_name``, or a new ``onnx::input::<n>``)."""
        vi = _value_info(self.base, self._like, inputs_first=True)
        vi.name = input_name or _name("input")
        self.base.graph.input.append(vi)
        return vi.name


class LabelEncoder(Block):
    """An ``ai.onnx.ml::LabelEncoder`` node (maps keys to values)."""

    def __init__(
        self,
        default_float: float = 0.0,
        default_int64: int = -1,
        default_string: str = "_Unused",
        keys_floats: Optional[list] = None,
        keys_int64s: Optional[list] = None,
        keys_strings: Optional[list] = None,
        values_floats: Optional[list] = None,
        values_int64s: Optional[list] = None,
        values_strings: Optional[list] = None,
    ):
        """Makes the block; the arguments are the node's attributes (None: absent)."""
        super().__init__()
        self._attributes = {"default_float": default_float, "default_int64": default_int64,
                            "default_string": default_string}
        for key, value in (("keys_floats", keys_floats), ("keys_int64s", keys_int64s),
                           ("keys_strings", keys_strings), ("values_floats", values_floats),
                           ("values_int64s", values_int64s), ("values_strings", values_strings)):
            if value is not None:
                self._attributes[key] = value

    def build(self, label_encoder_input_name: str) -> str:
        """Appends the node; returns its output name."""
        _import(self.base, _ML_DOMAIN, 2)  # version 2 has every attribute this block writes
        return _append_node(self.base, "LabelEncoder", [label_encoder_input_name], "label_encoder.output",
                            domain=_ML_DOMAIN, **self._attributes)


class Cast(Block):
    """A ``Cast`` node."""

    def __init__(self, to: int):
        """Makes the block.

        Args:
          to: the target element type (``onnx.TensorProto.FLOAT``, ...).
        """
        super().__init__()
        self._to = to

    def build(self, cast_input_name: str) -> str:
        """Appends the node; returns its output name."""
        return _append_node(self.base, "Cast", [cast_input_name], "cast.output", to=self._to)


class Linear(Block):
    """A ``Gemm`` with new float32 weight ``[in_features, out_features]`` and bias initializers.

    The initial values are standard normal from numpy's global generator,
    as in ORT (seed it with ``np.random.seed`` for repeatable models), or
    from ``rng``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, alpha: float = 1.0,
                 beta: float = 1.0, *, rng: Optional[np.random.Generator] = None):
        """Makes the block.

        Args:
          in_features: the size of the input's last axis.
          out_features: the size of the output's last axis.
          bias: add a bias.
          alpha: Gemm's ``alpha``.
          beta: Gemm's ``beta``.
          rng: a numpy Generator for the initial values (jaxort only).
        """
        super().__init__()
        self._in, self._out = int(in_features), int(out_features)
        self._bias, self._alpha, self._beta = bias, alpha, beta
        self._rng = rng

    def _normal(self, *shape: int) -> np.ndarray:
        draw = np.random.randn(*shape) if self._rng is None else self._rng.standard_normal(shape)
        return np.asarray(draw, np.float32)

    def build(self, linear_input_name: str) -> str:
        """Appends the initializers and the Gemm; returns its output name."""
        weight = _name("linear.weight")
        self.base.graph.initializer.append(numpy_helper.from_array(self._normal(self._in, self._out), weight))
        inputs = [linear_input_name, weight]
        if self._bias:
            bias = _name("linear.bias")
            self.base.graph.initializer.append(numpy_helper.from_array(self._normal(self._out), bias))
            inputs.append(bias)
        out = _name("linear.output")
        self.base.graph.node.append(helper.make_node(
            "Gemm", inputs, [out], _name("linear"), alpha=self._alpha, beta=self._beta))
        return out
