"""Building blocks: :class:`Block` and the ops of ORT's ``onnxblock.blocks``.

A block is called with value names, appends nodes (and initializers, inputs)
to the model of the open :func:`jaxort.onnxblock.base` context, and returns
the name(s) of what it made. New names are ``onnx::<token>::<n>``, drawn in
the order ORT 1.19.2 draws them, so the nodes and names are ORT's.

Part of the training layer: it imports onnx, numpy and the artifact
generator's model checks, never the facades.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from jaxort.errors import TrainingError
from jaxort.graph import numpy_dtype, tensor_from_numpy
from jaxort.onnxblock import _context
from jaxort.training.artifacts._assemble import _check

__all__ = [
    "Abs",
    "Add",
    "Block",
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


class Block(abc.ABC):
    """Base class of every block, as ORT's ``onnxblock.Block``.

    A subclass implements :meth:`build`, which changes ``self.base`` (the open
    model) and returns the names of its outputs. Calling the block runs
    ``build`` inside the open :func:`jaxort.onnxblock.base` context; the
    outermost call then checks the model with ``onnx.checker`` (full check).

    Attributes:
      base: the ``onnx.ModelProto`` being built (set when the block is called).

    Example:
      >>> class WeightedSum(Block):
      ...     def __init__(self):
      ...         super().__init__()
      ...         self.add, self.mul, self.w = Add(), Mul(), Constant(0.5)
      ...
      ...     def build(self, a, b):
      ...         return self.add(a, self.mul(self.w(), b))
    """

    def __init__(self, temp_file_name: str = "temp.onnx"):
        """Makes the block.

        Args:
          temp_file_name: accepted for ORT's signature. ORT saves models it
            was given a path for to this file to check them; jaxort checks in
            memory and writes nothing.
        """
        del temp_file_name
        self.base: Optional[onnx.ModelProto] = None

    @abc.abstractmethod
    def build(self, *args, **kwargs):
        """Appends this block's nodes to ``self.base`` and returns its output name(s)."""

    def __call__(self, *args, **kwargs):
        """Runs :meth:`build` on the open model and checks the result.

        Raises:
          StateError: no base model context is open.
          TrainingError: the model the outermost block leaves is not valid ONNX.
        """
        return self._build_on_open_model(args, kwargs)[1]

    def _build_on_open_model(self, args, kwargs, *, check: bool = True):
        """``(accessor, output)``: :meth:`build` on the open model, checked when this call is the outermost."""
        accessor = _context.current(f"block {type(self).__name__}")
        self.base = accessor.model
        with accessor._building() as outermost:
            output = self.build(*args, **kwargs)
        if check and outermost:
            _check(accessor.model, f"model after block {type(self).__name__}")
        return accessor, output

    def infer_shapes_on_base(self) -> onnx.ModelProto:
        """The open model with inferred shapes (a copy; the open model is unchanged).

        Raises:
          StateError: no base model context is open.
        """
        return onnx.shape_inference.infer_shapes(_context.current("infer_shapes_on_base").model)


# --------------------------------------------------------------------------- helpers


def _name(token: str) -> str:
    return _context.current(f"a block drawing the name {token!r}")._name(token)


def _append_node(model: onnx.ModelProto, op_type: str, inputs: Sequence[str], output_token: str,
                 domain: str = "", **attrs) -> str:
    # ORT draws the output name first, then the node's.
    out = _name(output_token)
    # domain="" would be written as a field; ORT leaves it unset for the default domain.
    model.graph.node.append(helper.make_node(op_type, list(inputs), [out], _name(op_type), domain=domain or None,
                                             **attrs))
    return out


def _import(model: onnx.ModelProto, domain: str, version: int) -> None:
    # ORT adds no import for the domain of its ReduceAllL2 and LabelEncoder blocks
    # (its empty_base imports com.microsoft), and the checker then refuses the model.
    if not any(imp.domain == domain for imp in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, version))


def _float_initializer(model: onnx.ModelProto, token: str, value: float, elem_type: int = 0) -> str:
    # ORT writes these constants as float32 [1], whatever the model's type;
    # ``elem_type`` (a float type other than float32) writes them in that type.
    name = _name(token)
    if elem_type in (0, TensorProto.FLOAT):
        model.graph.initializer.append(helper.make_tensor(name, TensorProto.FLOAT, [1], [float(value)]))
    else:
        model.graph.initializer.append(tensor_from_numpy(np.full(1, value, numpy_dtype(elem_type)), name))
    return name


def _exists(model: onnx.ModelProto, name: str) -> bool:
    """Whether a node reads or writes ``name``, or it is a graph input or initializer.

    ORT's ``node_arg_exists`` looks at nodes only, and then adds a second
    input of the same name for a label that is already an unused graph input.
    """
    return (any(name in n.input or name in n.output for n in model.graph.node)
            or any(i.name == name for i in model.graph.input)
            or any(t.name == name for t in model.graph.initializer))


def _value_info(model: onnx.ModelProto, name: str, *, inputs_first: bool = False) -> onnx.ValueInfoProto:
    """A copy of the type of ``name``: a graph output or input (ORT's lookups), else inferred.

    Args:
      model: the model.
      name: the value.
      inputs_first: look at graph inputs before outputs (ORT's InputLike).

    Raises:
      TrainingError: ``name`` is not a value of the model, or its type cannot
        be inferred.
    """
    graph = model.graph
    order = (graph.input, graph.output) if inputs_first else (graph.output, graph.input)
    for values in order:
        for vi in values:
            if vi.name == name:
                return copy.deepcopy(vi)
    # ORT needs a graph input or output; jaxort also takes an inner value of known type.
    for vi in onnx.shape_inference.infer_shapes(model).graph.value_info:
        if vi.name == name:
            return copy.deepcopy(vi)
    raise TrainingError(
        f"{name!r} is not a graph input or output of the model, nor a value whose type onnx shape inference "
        f"knows; the outputs are {[o.name for o in graph.output]}")


# --------------------------------------------------------------------------- blocks


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


def _output_names(output: Any, what: str) -> list:
    """A block's result (a name, or a sequence of names) as a list of names.

    Raises:
      TrainingError: the result is not made of strings.
    """
    names = [output] if isinstance(output, str) else output
    if not isinstance(names, Sequence) or not names or not all(isinstance(n, str) for n in names):
        raise TrainingError(f"{what} returned {output!r}; a block's build must return an output name "
                            "or a sequence of them")
    return list(names)
