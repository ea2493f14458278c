"""The base of every block: :class:`Block`, and the helpers blocks build with.

A block is called with value names, appends nodes (and initializers, inputs)
to the model of the open :func:`~jaxort.training.artifacts.blocks.base` context, and returns
the name(s) of what it made. New names are ``onnx::<token>::<n>``, drawn in
the order ORT 1.19.2 draws them, so the nodes and names are ORT's.

Part of the training layer: it imports onnx, numpy, the graph layer's tensor
helpers and the artifacts' model check, never the facades.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper

from jaxort.errors import TrainingError
from jaxort.graph import numpy_dtype, tensor_from_numpy
from jaxort.training.artifacts.assemble import check_generated
from jaxort.training.artifacts.blocks._context import current

__all__ = ["Block", "output_names"]


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
        accessor = current(f"block {type(self).__name__}")
        self.base = accessor.model
        with accessor._building() as outermost:
            output = self.build(*args, **kwargs)
        if check and outermost:
            check_generated(accessor.model, f"model after block {type(self).__name__}")
        return accessor, output

    def infer_shapes_on_base(self) -> onnx.ModelProto:
        """The open model with inferred shapes (a copy; the open model is unchanged).

        Raises:
          StateError: no base model context is open.
        """
        return onnx.shape_inference.infer_shapes(current("infer_shapes_on_base").model)


# --------------------------------------------------------------------------- helpers


def _name(token: str) -> str:
    return current(f"a block drawing the name {token!r}")._name(token)


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


def output_names(output: Any, what: str) -> list:
    """A block's result (a name, or a sequence of names) as a list of names.

    Args:
      output: what a block's ``build`` returned.
      what: how the error message names the block (``"MyLoss.build"``).

    Returns:
      The names, as a list.

    Raises:
      TrainingError: the result is not made of strings.
    """
    names = [output] if isinstance(output, str) else output
    if not isinstance(names, Sequence) or not names or not all(isinstance(n, str) for n in names):
        raise TrainingError(f"{what} returned {output!r}; a block's build must return an output name "
                            "or a sequence of them")
    return list(names)
