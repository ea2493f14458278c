"""Parameter layout: the order, dtypes and shapes of a training model's parameters.

ONNX Runtime's parameter buffers (``CopyParametersToBuffer``,
``Module.get_contiguous_parameters``) concatenate the parameters, flattened,
in the order they are inputs of the training model (1.19.2); parameters kept
as initializers (possible in jaxort's artifacts) follow. A
:class:`ParameterLayout` knows that order and turns a mapping of parameters
into one float32 vector and back, with numpy only.

Part of the training layer; imports the format layer only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from jaxort.checkpoint import NominalTensor
from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import CheckpointError, InputError, UnknownNameError

__all__ = ["ParameterLayout"]


@dataclasses.dataclass(frozen=True)
class ParameterLayout:
    """Names, dtypes and shapes of the parameters, in ORT's buffer order.

    Attributes:
      names: every parameter, in buffer order.
      trainable: the trainable ones (a subset of ``names``).
      dtypes: name -> numpy dtype.
      shapes: name -> shape tuple.
    """

    names: tuple
    trainable: frozenset
    dtypes: Mapping
    shapes: Mapping

    @classmethod
    def from_model(cls, model, trainable: Iterable[str], frozen: Iterable[str]) -> "ParameterLayout":
        """The layout of ``model``'s parameters (graph inputs first, then initializers).

        Args:
          model: the training ``onnx.ModelProto``.
          trainable: the trainable parameter names.
          frozen: the frozen parameter names.

        Returns:
          The layout.
        """
        trainable = frozenset(trainable)
        wanted = trainable | frozenset(frozen)
        dtypes, shapes = {}, {}
        for vi in model.graph.input:
            if vi.name in wanted:
                tt = vi.type.tensor_type
                dtypes[vi.name] = np.dtype(to_numpy_dtype(tt.elem_type))
                shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
        for tensor in model.graph.initializer:
            if tensor.name in wanted and tensor.name not in dtypes:
                dtypes[tensor.name] = np.dtype(to_numpy_dtype(tensor.data_type))
                shapes[tensor.name] = tuple(int(d) for d in tensor.dims)
        return cls(tuple(dtypes), trainable, dtypes, shapes)

    def check_checkpoint(self, parameters: Mapping) -> None:
        """Checks a checkpoint's parameters (values or nominal tensors) against the layout.

        Every parameter of the layout must be there with its exact shape and
        dtype (ORT's buffers and optimizer moments rely on both; a float64
        tensor for a float32 parameter would otherwise train in float32).

        Args:
          parameters: name -> array, or anything with ``shape`` and ``dtype``.

        Raises:
          CheckpointError: listing every missing, extra or mismatched parameter at once.
        """
        problems = []
        for name in self.names:
            if name not in parameters:
                problems.append(f"{name!r} is missing (expected shape {list(self.shapes[name])} "
                                f"dtype {self.dtypes[name]})")
                continue
            value = parameters[name]
            shape, dtype = tuple(int(d) for d in np.shape(value)), np.dtype(value.dtype)
            # ORT 1.19.2 writes nominal tensors without dims: only their dtype is known.
            unknown_shape = isinstance(value, NominalTensor) and shape == ()
            if (shape != self.shapes[name] and not unknown_shape) or dtype != self.dtypes[name]:
                problems.append(f"{name!r}: expected shape {list(self.shapes[name])} dtype "
                                f"{self.dtypes[name]}, given shape {list(shape)} dtype {dtype}")
        extra = sorted(n for n in parameters if n not in self.dtypes)
        if extra:
            problems.append(f"{extra} are not parameters of the training model")
        if problems:
            raise CheckpointError(f"the checkpoint does not match the training model: {len(problems)} "
                                  f"parameter(s) differ: " + "; ".join(problems))

    def buffer_names(self, trainable_only: bool) -> tuple:
        """The parameters a buffer holds, in order."""
        if trainable_only:
            return tuple(n for n in self.names if n in self.trainable)
        return self.names

    def size(self, trainable_only: bool) -> int:
        """Number of elements of a buffer."""
        return int(sum(int(np.prod(self.shapes[n], dtype=np.int64))
                       for n in self.buffer_names(trainable_only)))

    def check_name(self, name: str) -> None:
        """Raises UnknownNameError (a KeyError) unless ``name`` is a parameter."""
        if name not in self.dtypes:
            raise UnknownNameError(f"Parameter {name} not found.")

    def check_value(self, name: str, value: Any) -> np.ndarray:
        """``value`` as a numpy array, checked against the parameter's shape and dtype.

        Raises:
          UnknownNameError: no such parameter.
          InputError: wrong shape or dtype.
        """
        self.check_name(name)
        array = np.asarray(value)
        dtype, shape = self.dtypes[name], self.shapes[name]
        if array.dtype != dtype or tuple(array.shape) != shape:
            raise InputError(f"parameter {name!r}: expected shape {shape} and dtype {dtype}, "
                             f"given shape {tuple(array.shape)} and dtype {array.dtype}")
        return array

    def _check_float32(self, names) -> None:
        other = [n for n in names if self.dtypes[n] != np.float32]
        if other:
            raise InputError(f"parameter buffers hold float32 only, as in ORT; parameters {other} "
                             "are not float32")

    def flatten(self, values: Mapping, trainable_only: bool) -> np.ndarray:
        """The parameters as one float32 vector, in buffer order.

        Args:
          values: name -> array (host or device) for at least the buffer's names.
          trainable_only: only the trainable parameters.

        Returns:
          A new 1-D float32 numpy array.

        Raises:
          InputError: a parameter of the buffer is not float32.
        """
        names = self.buffer_names(trainable_only)
        self._check_float32(names)
        if not names:
            return np.zeros(0, np.float32)
        return np.concatenate([np.ravel(np.asarray(values[n])) for n in names]).astype(np.float32, copy=False)

    def unflatten(self, buffer: Any, trainable_only: bool) -> dict:
        """Splits a float32 vector into parameters (new numpy arrays), in buffer order.

        Args:
          buffer: a float32 array of ``size(trainable_only)`` elements.
          trainable_only: the buffer holds only the trainable parameters.

        Returns:
          name -> array.

        Raises:
          InputError: wrong size or dtype, or a parameter that is not float32.
        """
        names = self.buffer_names(trainable_only)
        self._check_float32(names)
        array = np.asarray(buffer)
        size = self.size(trainable_only)
        if array.dtype != np.float32 or array.size != size:
            raise InputError(f"Parameters buffer size incorrect: expected {size} float32 elements, given "
                             f"{array.size} of {array.dtype}")
        array = array.reshape(-1)
        values, offset = {}, 0
        for name in names:
            count = int(np.prod(self.shapes[name], dtype=np.int64))
            values[name] = array[offset:offset + count].reshape(self.shapes[name]).copy()
            offset += count
        return values
