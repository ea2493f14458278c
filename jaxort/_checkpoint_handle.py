"""The checkpoint state handle of :mod:`jaxort.session` (ORT's ``OrtCheckpointState``).

A facade: it imports the layers below and nothing below imports it.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from jaxort import checkpoint as _ckpt
from jaxort import training as _training
from jaxort.training.session_state import SessionCell, SessionHandle

__all__ = ["CheckpointHandle"]


class CheckpointHandle(SessionHandle):
    """A checkpoint state handle (ORT's ``OrtCheckpointState``), mutable.

    It holds one :class:`jaxort.training.SessionState` in
    :attr:`session_state`: the parameters read from the checkpoint and the
    property bag; once a :class:`TrainingSession` is created from it, that
    session's training state too (on the session's device), so reads and
    writes through the handle see the session's current values, as ORT's
    state is shared with its session. A handle drives one session at a
    time: creating a second session from it detaches the first.

    Attributes:
      cell: the :class:`jaxort.training.session_state.SessionCell` holding
        the value; every call replaces it under the cell's lock, so calls
        from several threads (on the handle or its session) are serialized.
    """

    def __init__(self, data: Union[_ckpt.Checkpoint, _training.SessionState]):
        """Wraps a loaded :class:`jaxort.checkpoint.Checkpoint` (or a SessionState).

        Raises:
          InputError: another type, or an invalid property.
        """
        if not isinstance(data, _training.SessionState):
            data = _training.SessionState.from_checkpoint(data)
        self.cell = SessionCell(data)

    def has_parameter(self, name: str) -> bool:
        """Whether ``name`` is a parameter of the state."""
        return self.session_state.has_parameter(name)

    def parameter_names(self) -> list[str]:
        """Parameter names, sorted (ORT 1.19.2 lists them sorted)."""
        return self.session_state.parameter_names()

    def requires_grad(self, name: str) -> bool:
        """Whether the parameter ``name`` is trainable."""
        return self.session_state.requires_grad(name)

    @property
    def is_nominal(self) -> bool:
        """True while the parameters have no values (a nominal checkpoint not yet filled)."""
        return self.session_state.is_nominal

    def get_parameter(self, name: str) -> np.ndarray:
        """The parameter's current value (a numpy copy); UnknownNameError / StateError (nominal)."""
        return self.cell.read(lambda st: st.parameter(name))

    def get_gradient(self, name: str) -> Optional[np.ndarray]:
        """The accumulated gradient of a trainable parameter, or None (frozen, or no session yet)."""
        return self.cell.read(lambda st: st.gradient(name))

    def get_parameter_type_and_shape(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        """The parameter's dtype and shape (works on nominal states)."""
        return self.session_state.parameter_type_and_shape(name)

    def update_parameter(self, name: str, value: Any) -> None:
        """Replaces a parameter's value; shape and dtype must match (InputError otherwise)."""
        self.cell.update(lambda st: st.update_parameter(name, value))

    def add_property(self, name: str, value: Union[int, float, str]) -> None:
        """Adds or replaces a property: int (int64), float (stored as float32) or str."""
        self.cell.update(lambda st: st.add_property(name, value))

    def get_property(self, name: str) -> Union[int, float, str]:
        """A property's value; UnknownNameError when there is none."""
        return self.session_state.get_property(name)

    def has_property(self, name: str) -> bool:
        """Whether the property exists."""
        return name in self.session_state.properties

    def property_names(self) -> list[str]:
        """Property names, sorted (ORT 1.19.2 lists them sorted)."""
        return self.session_state.property_names()

    def to_checkpoint(self, include_optimizer_state: bool = False) -> _ckpt.Checkpoint:
        """The state as a :class:`jaxort.checkpoint.Checkpoint` (numpy), as it would be saved."""
        return self.cell.read(lambda st: st.to_checkpoint(bool(include_optimizer_state)))

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self.cell.closed

    def release(self) -> None:
        """Frees the state (ReleaseCheckpointState), and the device buffers of its session.

        Every later use of the handle, or of a session over it, raises
        StateError; releasing twice is a no-op. Save the state first to keep it.
        """
        old = self.cell.close("the checkpoint state was released")
        if old is not None:
            old.delete_buffers()
