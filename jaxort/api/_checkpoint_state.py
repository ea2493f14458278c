"""CheckpointState, Parameters, Parameter and Properties of ``jaxort.api``.

Same names and behaviour as ``onnxruntime.training.api.checkpoint_state``
(ORT 1.19.2). A :class:`CheckpointState` holds one immutable
:class:`jaxort.training.SessionState` and replaces it after every change;
the views here only delegate to it. Facade code: it imports the training
layer and must not be imported by the layers below.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Optional, Union

import numpy as np

from jaxort import checkpoint as _ckpt
from jaxort import training as _training
from jaxort.errors import ArgumentTypeError
from jaxort.training.session_state import SessionCell, SessionHandle

__all__ = ["CheckpointState", "Parameter", "Parameters", "Properties"]


class Parameter:
    """One model parameter: its name, data, gradient and whether it is trained.

    Returned by ``state.parameters[name]``; not made directly. Reads give
    numpy copies; setting ``data`` writes through to the state (and the
    Module's training state, if a Module was created from it).
    """

    def __init__(self, name: str, state: "CheckpointState"):
        self._name = name
        self._state = state

    @property
    def name(self) -> str:
        """The parameter's name (the ONNX initializer name)."""
        return self._name

    @property
    def data(self) -> np.ndarray:
        """The parameter's value (a numpy copy)."""
        return self._state.cell.read(lambda st: st.parameter(self._name))

    @data.setter
    def data(self, value: np.ndarray) -> None:
        """Replaces the value; shape and dtype must match (InputError otherwise)."""
        self._state.cell.update(lambda st: st.update_parameter(self._name, value))

    @property
    def grad(self) -> Optional[np.ndarray]:
        """The accumulated gradient, or None (frozen parameter, or no Module yet)."""
        return self._state.cell.read(lambda st: st.gradient(self._name))

    @property
    def requires_grad(self) -> bool:
        """Whether the parameter is trainable."""
        return self._state.session_state.requires_grad(self._name)

    def __repr__(self) -> str:
        return f"Parameter(name={self.name}, requires_grad={self.requires_grad})"


class Parameters:
    """The parameters of a checkpoint state, by name (``state.parameters``).

    As in ORT 1.19.2: ``params[name]`` gives a :class:`Parameter`,
    ``params[name] = array`` replaces a value, ``name in params``, ``len``,
    and iteration yields ``(name, Parameter)`` pairs, sorted by name.
    ``keys()``, ``values()`` and ``items()`` are jaxort additions.
    """

    def __init__(self, state: "CheckpointState"):
        self._state = state

    def __getitem__(self, name: str) -> Parameter:
        """The parameter called ``name``.

        Raises:
          KeyError (jaxort.errors.UnknownNameError): no such parameter.
          StateError: the state is nominal (no values yet).
        """
        st = self._state.session_state
        st.check_parameter(name)
        st.check_values("get a parameter from")
        return Parameter(name, self._state)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        """Replaces a parameter's value (KeyError, InputError or StateError when it cannot)."""
        self._state.cell.update(lambda st: st.update_parameter(name, value))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._state.session_state.has_parameter(name)

    def __iter__(self) -> Iterator[tuple[str, Parameter]]:
        # ORT 1.19.2 yields (name, Parameter) pairs, not names, and refuses
        # on a nominal state.
        st = self._state.session_state
        st.check_values("get a parameter from")
        for name in st.parameter_names():
            yield name, Parameter(name, self._state)

    def __len__(self) -> int:
        return len(self._state.session_state.parameter_names())

    def keys(self) -> list[str]:
        """Parameter names, sorted (also works on nominal states)."""
        return self._state.session_state.parameter_names()

    def values(self) -> list[Parameter]:
        """The parameters, sorted by name."""
        return [p for _, p in self]

    def items(self) -> list[tuple[str, Parameter]]:
        """``(name, Parameter)`` pairs, sorted by name."""
        return list(self)

    def __repr__(self) -> str:
        return f"Parameters({self.keys()})"


class Properties:
    """The property bag of a checkpoint state (``state.properties``).

    Values are int (saved as int64), float (saved as float32, so reading one
    back gives the float32 value) or str. ``props[name]``, ``props[name] =
    value``, ``in``, ``len``; iteration yields ``(name, value)`` pairs sorted
    by name, as in ORT 1.19.2.
    """

    def __init__(self, state: "CheckpointState"):
        self._state = state

    def __getitem__(self, name: str) -> Union[int, float, str]:
        """The property's value; KeyError (jaxort.errors.UnknownNameError) when there is none."""
        return self._state.session_state.get_property(name)

    def __setitem__(self, name: str, value: Union[int, float, str]) -> None:
        """Adds or replaces a property; InputError for a value that is not int, float or str."""
        self._state.cell.update(lambda st: st.add_property(name, value))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._state.session_state.properties

    def __iter__(self) -> Iterator[tuple[str, Union[int, float, str]]]:
        st = self._state.session_state
        for name in st.property_names():
            yield name, st.properties[name]

    def __len__(self) -> int:
        return len(self._state.session_state.properties)

    def keys(self) -> list[str]:
        """Property names, sorted."""
        return self._state.session_state.property_names()

    def items(self) -> list[tuple[str, Union[int, float, str]]]:
        """``(name, value)`` pairs, sorted by name."""
        return list(self)

    def __repr__(self) -> str:
        return f"Properties({dict(self)})"


class CheckpointState(SessionHandle):
    """The state of a training run: parameters, gradients, optimizer state, properties.

    Make one with :meth:`load_checkpoint`. A :class:`jaxort.api.Module`
    created from it shares it: parameter reads and writes go to the Module's
    training state on its device.

    Attributes:
      cell: the :class:`jaxort.training.session_state.SessionCell` holding
        the current :class:`jaxort.training.SessionState`; every call
        replaces it under the cell's lock, so a state, its Module and its
        Optimizer may be used from several threads: calls are serialized.

    Example:
      >>> state = CheckpointState.load_checkpoint("checkpoint")       # doctest: +SKIP
      >>> state.properties["epoch"] = 3                               # doctest: +SKIP
      >>> CheckpointState.save_checkpoint(state, "checkpoint_out")    # doctest: +SKIP
    """

    def __init__(self, state: Union[_ckpt.Checkpoint, _training.SessionState]):
        """Wraps a loaded :class:`jaxort.checkpoint.Checkpoint` (or a SessionState).

        Raises:
          ArgumentTypeError (a TypeError): another type.
        """
        if isinstance(state, _ckpt.Checkpoint):
            state = _training.SessionState.from_checkpoint(state)
        if not isinstance(state, _training.SessionState):
            raise ArgumentTypeError(f"Invalid argument for CheckpointState received {type(state)}")
        self.cell = SessionCell(state)
        self._parameters = Parameters(self)
        self._properties = Properties(self)

    @classmethod
    def load_checkpoint(cls, checkpoint_uri: Union[str, os.PathLike]) -> "CheckpointState":
        """Loads a complete or nominal checkpoint file; CheckpointError if missing or malformed."""
        return cls(_ckpt.load(_path(checkpoint_uri, "checkpoint_uri")))

    @classmethod
    def save_checkpoint(cls, state: "CheckpointState", checkpoint_uri: Union[str, os.PathLike],
                        include_optimizer_state: bool = False) -> None:
        """Saves the state as an ORT Training checkpoint, atomically.

        Args:
          state: the state.
          checkpoint_uri: the file.
          include_optimizer_state: also save the optimizer's step, initial
            learning rate and moments (when an Optimizer exists).
        """
        if not isinstance(state, CheckpointState):
            raise ArgumentTypeError(f"state must be a jaxort.api.CheckpointState, got {type(state).__name__}")
        path = _path(checkpoint_uri, "checkpoint_uri")
        data = state.cell.read(lambda st: st.to_checkpoint(bool(include_optimizer_state)))
        _ckpt.save(data, path, include_optimizer_state=bool(include_optimizer_state))

    @property
    def parameters(self) -> Parameters:
        """The parameters, by name."""
        return self._parameters

    @property
    def properties(self) -> Properties:
        """The property bag."""
        return self._properties


def _path(value, what: str) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(f"{what} must be a path (str or os.PathLike), got {type(value).__name__}")
    return os.fspath(value)
