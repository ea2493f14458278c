"""The in-memory checkpoint: Checkpoint, OptimizerGroup, NominalTensor.

These are plain immutable containers of numpy arrays and Python scalars that
mirror the tables of an ONNX Runtime Training checkpoint. The training layer
registers Checkpoint as a JAX pytree; this module must not import JAX
(nor onnx): only numpy and the standard library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple, Union

import numpy as np

from jaxort.errors import InputError

__all__ = ["NominalTensor", "OptimizerGroup", "Checkpoint", "Tensor", "PropertyValue",
           "normalize_property"]

PropertyValue = Union[int, float, str]


def normalize_property(name: Any, value: Any) -> PropertyValue:
    """A property value as a checkpoint stores it: int (int64), float (float32) or str.

    This is the one rule for property values, used when a property is set
    and when a checkpoint is written. As in ONNX Runtime 1.19.2, a bool is
    stored as an int, and a float is rounded to float32 (reading it back
    gives the float32 value).

    Args:
      name: the property name (a str).
      value: an int, float, bool, numpy scalar or str.

    Returns:
      The normalized value: a Python int, float or str.

    Raises:
      InputError: a name that is not a str, an int outside int64, a float
        outside float32, or a value of another type.

    Example:
      >>> normalize_property("flag", True), normalize_property("lr", 0.1)
      (1, 0.10000000149011612)
    """
    if not isinstance(name, str):
        raise InputError(f"property names must be str, got {name!r}")
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        value = int(value)
        if not -(2**63) <= value < 2**63:
            raise InputError(f"property {name!r}: {value} does not fit in int64")
        return value
    if isinstance(value, (float, np.floating)):
        with np.errstate(over="ignore"):
            rounded = np.float32(value)
        if np.isinf(rounded) and not np.isinf(value):
            raise InputError(f"property {name!r}: {value!r} is not a float32 value")
        return float(rounded)
    if isinstance(value, str):
        return value
    raise InputError(f"property {name!r} must be an int, float or str, got {type(value).__name__}")


class NominalTensor(NamedTuple):
    """A parameter of a nominal checkpoint: name, shape and dtype, no data.

    ONNX Runtime 1.19.2 writes nominal tensors without dims, so a nominal
    checkpoint written by ONNX Runtime loads with ``shape == ()``.
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def size(self) -> int:
        """Number of elements the tensor would hold."""
        return int(np.prod(self.shape, dtype=object))

    @property
    def nbytes(self) -> int:
        """Bytes the tensor would hold (0 for strings, whose size is unknown)."""
        return 0 if self.dtype == np.dtype(object) else self.size * self.dtype.itemsize


Tensor = Union[np.ndarray, NominalTensor]


@dataclasses.dataclass(frozen=True)
class OptimizerGroup:
    """One optimizer group of a checkpoint (ONNX Runtime 1.19.2 writes one, "group0").

    Attributes:
      name: the group name.
      step: the number of optimizer steps taken.
      initial_learning_rate: the group's learning rate as saved (a float32
        value in the file).
      states: parameter name -> {state name -> array}, e.g.
        ``{"fc.weight": {"momentum0": m, "momentum1": v}}`` for AdamW.
    """

    name: str
    step: int
    initial_learning_rate: float
    states: Mapping[str, Mapping[str, np.ndarray]] = dataclasses.field(default_factory=dict)

    def replace(self, **changes: Any) -> "OptimizerGroup":
        """Returns a copy with the given fields replaced."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Everything an ONNX Runtime Training checkpoint holds.

    Mappings are plain insertion-ordered dicts; loading keeps the file's
    order. Arrays loaded from a file are read-only views of its bytes where
    the layout allows it.

    Attributes:
      trainable: parameters with ``requires_grad`` (name -> array).
      frozen: the other parameters.
      optimizer_groups: optimizer groups (empty when the file has none).
      properties: user properties; int is stored as int64, float as float32,
        str as a string.
      is_nominal: the parameters carry no data (values are NominalTensor).
      has_external_data: the file this state was loaded from kept tensor
        data in its external data file. Saving decides this afresh from
        ``external_data_threshold``.
    """

    trainable: Mapping[str, Tensor] = dataclasses.field(default_factory=dict)
    frozen: Mapping[str, Tensor] = dataclasses.field(default_factory=dict)
    optimizer_groups: tuple[OptimizerGroup, ...] = ()
    properties: Mapping[str, Union[int, float, str]] = dataclasses.field(default_factory=dict)
    is_nominal: bool = False
    has_external_data: bool = False

    def replace(self, **changes: Any) -> "Checkpoint":
        """Returns a copy with the given fields replaced.

        Example:
          >>> s = Checkpoint(trainable={"w": np.zeros(2, np.float32)})
          >>> s.replace(properties={"epoch": 1}).properties
          {'epoch': 1}
        """
        return dataclasses.replace(self, **changes)

    @property
    def parameters(self) -> dict[str, Tensor]:
        """All parameters, trainable first, then frozen."""
        merged = dict(self.trainable)
        merged.update(self.frozen)
        return merged

    def optimizer_group(self, name: str = "group0") -> OptimizerGroup:
        """Returns the optimizer group called ``name``.

        Raises:
          KeyError: when there is no such group.
        """
        for group in self.optimizer_groups:
            if group.name == name:
                return group
        raise KeyError(f"no optimizer group {name!r}; the checkpoint has {[g.name for g in self.optimizer_groups]}")
