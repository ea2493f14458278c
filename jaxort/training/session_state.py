"""SessionState: a checkpoint state and the training session over it, as one immutable value.

ONNX Runtime's training API shares one checkpoint state between the state
handle and the session made from it: parameters read through the handle are
the session's current ones, a second session takes the state over, and a
released session leaves its values in the state. :class:`SessionState` is all
of that as one value. Every operation is a method that returns a new value
(or a result); the two facades, :mod:`jaxort.session` (ORT's C API) and
:mod:`jaxort.api` (``onnxruntime.training.api``), each hold one in their
state handle and replace it after every call, so they hold no logic of
their own.

The process-wide seed of ``SetSeed`` and the cache of compiled programs
live in :mod:`jaxort.training.process`.

Part of the training layer: imports the checkpoint and graph layers and the
rest of training, never the facades.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Optional

import jax
import numpy as np
import onnx

from jaxort import checkpoint as ckpt
from jaxort.errors import InputError, StateError, UnknownNameError
from jaxort.training.artifacts.export import export_model_for_inferencing
from jaxort.training.layout import ParameterLayout
from jaxort.training.packing import PackedState, pack, unpack
from jaxort.training.pending import Pending, run_pending
from jaxort.training.process import PROCESS_SEED, PROGRAMS, ProcessSeed, ProgramCache
from jaxort.training.program import TrainProgram
from jaxort.training.schedules import linear_lr_schedule
from jaxort.training.sharding import Placement, gather
from jaxort.training.state import TrainState, apply_schedule, set_initial_learning_rate
from jaxort.training.state import set_seed as _reseed

__all__ = ["PROCESS_SEED", "PROGRAMS", "ProcessSeed", "ProgramCache", "SessionCell", "SessionHandle", "SessionState"]

# No call deferred.
_NO_CALLS = Pending()


def _nominal_error(action: str, load: str = "the model parameters") -> StateError:
    """The error of a call that needs parameter values on a nominal state (ORT's wording of what to load)."""
    return StateError(f"Cannot {action} a nominal checkpoint state: its parameters have no values. Please "
                      f"load {load} first (copy_buffer_to_parameters with trainable_only=False).")


def _host_inputs(inputs: Sequence[Any], names: Sequence[str], what: str) -> tuple:
    # Values pass on as the caller gave them: TrainProgram checks their dtypes
    # (np.asarray here would turn a list of floats into float64).
    if len(inputs) != len(names):
        raise InputError(f"{what} takes {len(names)} inputs {list(names)}, given {len(inputs)}")
    return tuple(inputs)


class SessionCell:
    """The one mutable box of a facade's state handle: a :class:`SessionState` behind a lock.

    Every facade call is one transaction on it, under the cell's lock:
    :meth:`read` computes a result from the value, :meth:`update` replaces
    the value, :meth:`step` does both. Calls from several threads on one
    state (and on the Modules, Optimizers and sessions sharing it) are
    therefore serialized: each sees the previous one's result, no optimizer
    step is lost, and no call reads an array a concurrent step has donated.
    They do not run in parallel; use one state per thread for that.

    Each transaction takes the same checks: ``owner`` (the session must be
    that facade object's, :meth:`SessionState.require_owner`, which then
    follows the process seed), ``owner_message`` (the StateError message
    when it is not), ``optimizer`` (the optimizer must be this one,
    :meth:`SessionState.require_optimizer_owner`), and for :meth:`update`
    and :meth:`step` ``deferring``: the call is a train step or one the
    state defers (:meth:`SessionState.defer`), so the pending calls are
    not run first, as they are for every other call. Whatever the function
    raises leaves the value as it was.

    Args:
      value: the initial state.
    """

    def __init__(self, value: "SessionState"):
        self._value = value
        self._lock = threading.RLock()
        self._closed: Optional[str] = None

    @property
    def value(self) -> "SessionState":
        """The current state, its deferred calls run (:meth:`SessionState.flushed`); StateError once closed."""
        with self._lock:
            self._require_open()
            self._value = self._value.flushed()
            return self._value

    @value.setter
    def value(self, value: "SessionState") -> None:
        with self._lock:
            self._require_open()
            self._value = value

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed is not None

    def close(self, message: str) -> Optional["SessionState"]:
        """Drops the value; every later use raises ``StateError(message)``.

        Returns the value it held (None when already closed), for the caller to
        free its device buffers. Closing is final.
        """
        with self._lock:
            if self._closed is not None:
                return None
            value, self._value, self._closed = self._value, None, message
            return value

    def _require_open(self) -> None:
        if self._closed is not None:
            raise StateError(self._closed)

    def read(self, fn: Callable, *, owner: Any = None, owner_message: Optional[str] = None,
             optimizer: Any = None):
        """``fn(state)``; the value stays (but for running the pending calls)."""
        with self._lock:
            return fn(self._current(owner, owner_message, optimizer, False))

    def update(self, fn: Callable, *, owner: Any = None, owner_message: Optional[str] = None,
               optimizer: Any = None, deferring: bool = False) -> None:
        """Replaces the value by ``fn(state)``, a :class:`SessionState`."""
        with self._lock:
            new = fn(self._current(owner, owner_message, optimizer, deferring))
            if type(new) is not SessionState:
                _not_a_state(new)
            self._value = new

    def step(self, fn: Callable, *, owner: Any = None, owner_message: Optional[str] = None,
             optimizer: Any = None, deferring: bool = False):
        """Calls ``fn(state)``, which returns ``(new state, result)``; replaces the value, returns ``result``."""
        with self._lock:
            new, result = fn(self._current(owner, owner_message, optimizer, deferring))
            if type(new) is not SessionState:
                _not_a_state(new)
            self._value = new
            return result

    def _current(self, owner, owner_message, optimizer, deferring: bool) -> "SessionState":
        """The value a transaction runs on, its checks passed (the caller holds the lock)."""
        # Every facade step is three transactions: the checks that pass are
        # inlined (each method call between two compiled steps costs a few
        # microseconds; docs/benchmarks.md, "The facades' Python between steps").
        if self._closed is not None:
            raise StateError(self._closed)
        st = self._value
        if not deferring and st.pending != _NO_CALLS:
            st = self._value = st.flushed()
        if owner is not None:
            if st.owner is not owner:
                if owner_message is None:
                    st.require_owner(owner)
                else:
                    st.require_owner(owner, owner_message)
            if PROCESS_SEED._generation != st.seed_generation:
                st = self._value = st.follow_seed()
        if optimizer is not None and st.optimizer_owner is not optimizer:
            st.require_optimizer_owner(optimizer)
        return st


class SessionHandle:
    """Base of the facades' state handles: one :class:`SessionCell` in ``cell``.

    Attributes:
      cell: the cell holding the handle's :class:`SessionState`.
    """

    cell: SessionCell

    @property
    def session_state(self) -> "SessionState":
        """The current :class:`SessionState` (read from :attr:`cell`, its deferred calls run)."""
        return self.cell.value

    @session_state.setter
    def session_state(self, value: "SessionState") -> None:
        self.cell.value = value


def _not_a_state(value) -> None:
    raise TypeError(f"a session update must return a SessionState, got {type(value).__name__}")


def _shapes_only(checkpoint: ckpt.Checkpoint) -> ckpt.Checkpoint:
    """``checkpoint`` with each parameter's data replaced by its shape and dtype (not made nominal)."""
    def shapes(params):
        return {k: ckpt.NominalTensor(tuple(v.shape), np.dtype(v.dtype)) for k, v in params.items()}
    return checkpoint.replace(trainable=shapes(checkpoint.trainable), frozen=shapes(checkpoint.frozen))


class SessionState(NamedTuple):
    """A checkpoint state, and the session over it when there is one (an immutable value).

    Attributes:
      checkpoint: the parameters while no session holds them (and while
        nominal), and the optimizer groups a later optimizer restores from.
      properties: the property bag, name -> int, float or str (normalized
        by :func:`jaxort.checkpoint.normalize_property`).
      program: the session's compiled program, or None without a session.
      train: the session's :class:`TrainState`, or after a train step on one
        device the same values packed (:class:`jaxort.training.packing.PackedState`;
        :meth:`values` unpacks); None without a session or while the state
        is nominal.
      device: the JAX device holding ``train`` (on a mesh: its first device).
      owner: an opaque token of the facade object that owns the session;
        another owner's calls are refused (:meth:`require_owner`).
      seed: the seed of the session's random ops.
      seed_generation: the :class:`ProcessSeed` generation last followed.
      has_grads: a train step ran in this session.
      accumulating: the next train step adds to the gradients (``train``'s
        accumulation flag, mirrored on the host): True after a train step,
        False in a new session and once a lazy reset ran. A train step that
        is known to overwrite them runs a program that does not read them
        (:meth:`TrainProgram.train_step_after`'s ``reset_grad``).
      schedule: the registered learning-rate schedule, or None.
      optimizer_owner: an opaque token of the facade optimizer that drives
        the session's optimizer; a replaced optimizer's calls are refused
        (:meth:`require_optimizer_owner`).
      placement: the mesh and strategy ``train`` is sharded with, or None
        for one device (see :mod:`jaxort.training.sharding`).
      pending: calls made since the last train step and not yet run on
        ``train`` (a :class:`jaxort.training.pending.Pending`; see :meth:`defer`).
    """

    checkpoint: ckpt.Checkpoint
    properties: Mapping = types.MappingProxyType({})
    program: Optional[TrainProgram] = None
    train: Optional[TrainState | PackedState] = None
    device: Any = None
    owner: Any = None
    seed: int = 0
    seed_generation: int = 0
    has_grads: bool = False
    accumulating: bool = False
    schedule: Optional[Callable] = None
    optimizer_owner: Any = None
    placement: Optional[Placement] = None
    pending: Pending = _NO_CALLS

    @classmethod
    def from_checkpoint(cls, checkpoint: ckpt.Checkpoint) -> "SessionState":
        """A state without a session, from a loaded checkpoint.

        Raises:
          InputError: not a ``jaxort.checkpoint.Checkpoint``, or an invalid property.
        """
        if not isinstance(checkpoint, ckpt.Checkpoint):
            raise InputError(f"expected a jaxort.checkpoint.Checkpoint, got {type(checkpoint).__name__}")
        props = {name: ckpt.normalize_property(name, value) for name, value in checkpoint.properties.items()}
        return cls(checkpoint=checkpoint.replace(properties={}), properties=props)

    def replace(self, **changes) -> "SessionState":
        """Returns a copy with the given fields replaced.

        Raises:
          TypeError: a name that is not a field.
        """
        # Three replacements run per facade step: a NamedTuple's _replace
        # visits every field, this only the changed ones.
        values = list(self)
        try:
            for name, value in changes.items():
                values[_FIELD_INDEX[name]] = value
        except KeyError:
            raise TypeError(f"SessionState has no field(s) {sorted(changes.keys() - _FIELD_INDEX.keys())}") from None
        return tuple.__new__(SessionState, values)

    @property
    def layout(self) -> Optional[ParameterLayout]:
        """The session's parameter layout (ORT's buffer order), or None without a session."""
        return None if self.program is None else self.program.layout

    # Parameters ---------------------------------------------------------------

    @property
    def is_nominal(self) -> bool:
        """True while the parameters have no values (a nominal checkpoint not yet filled)."""
        return self.train is None and self.checkpoint.is_nominal

    def parameter_names(self) -> list[str]:
        """Parameter names, sorted (ORT 1.19.2 lists them sorted)."""
        return sorted(list(self.checkpoint.trainable) + list(self.checkpoint.frozen))

    def has_parameter(self, name: str) -> bool:
        """Whether ``name`` is a parameter."""
        return name in self.checkpoint.trainable or name in self.checkpoint.frozen

    def check_parameter(self, name: str) -> None:
        """Raises UnknownNameError (a KeyError) unless ``name`` is a parameter."""
        if not self.has_parameter(name):
            raise UnknownNameError(f"Parameter {name} not found.")

    def check_values(self, action: str) -> None:
        """Raises StateError while nominal; ``action`` says what could not be done."""
        if self.is_nominal:
            raise _nominal_error(action, "the parameter states")

    def requires_grad(self, name: str) -> bool:
        """Whether the parameter is trainable."""
        self.check_parameter(name)
        return name in self.checkpoint.trainable

    def parameter(self, name: str) -> np.ndarray:
        """The parameter's current value (a numpy copy).

        Raises:
          UnknownNameError: no such parameter.
          StateError: the state is nominal.
        """
        self.check_parameter(name)
        self.check_values("get a parameter from")
        if self.train is not None:
            return np.array(gather(self.values().parameters[name]))
        return np.array(self.checkpoint.parameters[name])

    def gradient(self, name: str) -> Optional[np.ndarray]:
        """The accumulated gradient of a trainable parameter; None for frozen ones or without a session."""
        self.check_parameter(name)
        self.check_values("get a gradient from")
        grads = None if self.train is None else self.values().grads
        if grads is None or name not in grads:
            return None
        return np.array(gather(grads[name]))

    def parameter_type_and_shape(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        """The parameter's dtype and shape (works on nominal states)."""
        self.check_parameter(name)
        if self.layout is not None:
            return self.layout.dtypes[name], self.layout.shapes[name]
        value = self.checkpoint.parameters[name]
        return np.dtype(value.dtype), tuple(value.shape)

    def update_parameter(self, name: str, value: Any) -> "SessionState":
        """Replaces a parameter's value; its shape and dtype must match.

        Raises:
          UnknownNameError: no such parameter.
          InputError: wrong shape or dtype.
          StateError: the state is nominal.
        """
        self.check_parameter(name)
        if self.is_nominal:
            raise _nominal_error("update a parameter of", "all the parameter states")
        dtype, shape = self.parameter_type_and_shape(name)
        array = np.asarray(value)
        if array.dtype != dtype or tuple(array.shape) != shape:
            raise InputError(f"parameter {name!r}: expected shape {shape} and dtype {dtype}, "
                             f"given shape {tuple(array.shape)} and dtype {array.dtype}")
        return self._with_values({name: array.copy()})

    def _with_values(self, values: Mapping[str, np.ndarray]) -> "SessionState":
        if self.train is not None:
            placed = dict(values) if self.placement is not None else jax.device_put(dict(values), self.device)
            st = self.values()
            return self.replace(train=self._place(st.replace(
                params={**st.params, **{k: v for k, v in placed.items() if k in st.params}},
                frozen={**st.frozen, **{k: v for k, v in placed.items() if k in st.frozen}})))
        cp = self.checkpoint
        return self.replace(checkpoint=cp.replace(
            trainable={**cp.trainable, **{k: v for k, v in values.items() if k in cp.trainable}},
            frozen={**cp.frozen, **{k: v for k, v in values.items() if k in cp.frozen}}))

    # Properties ---------------------------------------------------------------

    def add_property(self, name: str, value: Any) -> "SessionState":
        """Adds or replaces a property: int (int64), float (stored as float32) or str."""
        return self.replace(properties={**self.properties, name: ckpt.normalize_property(name, value)})

    def get_property(self, name: str):
        """A property's value.

        Raises:
          UnknownNameError: no such property.
        """
        if name not in self.properties:
            raise UnknownNameError(f"Property {name} not found.")
        return self.properties[name]

    def property_names(self) -> list[str]:
        """Property names, sorted (ORT 1.19.2 lists them sorted)."""
        return sorted(self.properties)

    def to_checkpoint(self, include_optimizer_state: bool = False) -> ckpt.Checkpoint:
        """The state as it would be saved: parameters, optimizer group when asked for, properties."""
        if self.train is not None:
            data = self.program.to_checkpoint(self.values(), include_optimizer_state)
        else:
            data = self.checkpoint if include_optimizer_state else self.checkpoint.replace(optimizer_groups=())
        return data.replace(properties=dict(self.properties))

    # Sessions -----------------------------------------------------------------

    def attach(self, program: TrainProgram, *, device, owner: Any, mesh: Any = None,
               strategy: str = "data") -> "SessionState":
        """Starts a session: ``owner``'s, over ``program``, on ``device`` or sharded over ``mesh``.

        A session that held the state is detached first, so the new one
        starts from the current values. The seed is the process seed if one
        was set (ORT's SetSeed), else 0.

        Args:
          program: the compiled program.
          device: the JAX device holding the state (without a mesh).
          owner: the facade object that owns the session.
          mesh: a ``jax.sharding.Mesh`` with axes "data" and/or "fsdp", or
            None for one device; with a mesh every step runs on all its
            devices and batches are split over it.
          strategy: "data" (parameters replicated) or "fsdp" (parameters,
            gradients and optimizer moments split); see
            :func:`jaxort.training.shard`.

        Raises:
          CheckpointError: the checkpoint does not match the training model.
          TrainingError: a bad mesh or strategy.
        """
        placement = None if mesh is None else Placement(mesh, strategy)
        if placement is not None:
            device = mesh.devices.flat[0]
        base = self.detach()
        seed, generation = PROCESS_SEED.get()
        seed = 0 if seed is None else seed
        layout = program.layout
        layout.check_checkpoint(base.checkpoint.parameters)
        base = base.replace(device=device, placement=placement)
        train = None
        if not base.checkpoint.is_nominal:
            train = base._place(program.init_state(base.checkpoint, seed=seed))
            # The session holds the values now; the checkpoint keeps their names, shapes and
            # types, so that a model's weights are not held twice (detach reads them back).
            base = base.replace(checkpoint=_shapes_only(base.checkpoint))
        return base.replace(program=program, train=train, owner=owner,
                            seed=seed, seed_generation=generation, has_grads=False, accumulating=False,
                            schedule=None, optimizer_owner=None)

    def _place(self, train: TrainState) -> TrainState:
        """``train`` on this session's device, or sharded by its placement."""
        if self.placement is not None:
            return self.placement.place_state(train)
        return jax.device_put(train, self.device)

    def detach(self) -> "SessionState":
        """Ends the session: its current values (and optimizer state) go back into ``checkpoint``."""
        if self.program is None:
            return self
        checkpoint = self.checkpoint
        if self.train is not None:
            checkpoint = self.program.to_checkpoint(self.values(), include_optimizer_state=True)
            if not self.program.has_optimizer:
                checkpoint = checkpoint.replace(optimizer_groups=self.checkpoint.optimizer_groups)
        return self.replace(checkpoint=checkpoint, program=None, train=None, device=None,
                            placement=None, owner=None, has_grads=False, accumulating=False, schedule=None,
                            optimizer_owner=None)

    def require_owner(self, owner: Any, message: str = "the checkpoint state is now used by another "
                                                       "TrainingSession") -> None:
        """Raises StateError (with ``message``) unless ``owner``'s session holds the state."""
        if self.owner is not owner:
            raise StateError(message)

    def require_optimizer_owner(self, owner: Any) -> None:
        """Raises StateError unless ``owner`` is the optimizer the session was last given."""
        if self.optimizer_owner is not owner:
            raise StateError("this Optimizer was replaced: a newer Optimizer was created on the same Module "
                             "and drives its optimizer state now; use that one")

    def with_optimizer(self, program: TrainProgram, owner: Any = None) -> "SessionState":
        """Gives the session an optimizer (``program``, the same models plus one), driven by ``owner``.

        Parameters, gradients and the PRNG key carry over; the optimizer
        state starts from the checkpoint's optimizer group if it has one.
        Called again, the new optimizer takes over: it starts the same way
        (the previous one's steps and learning rate are not carried over),
        its scheduler is dropped, and the previous owner's calls fail
        :meth:`require_optimizer_owner`.
        """
        train = self.values()
        if train is not None:
            train = self._place(program.add_optimizer_state(train, self.checkpoint.optimizer_groups))
        return self.replace(program=program, train=train, schedule=None, optimizer_owner=owner)

    def follow_seed(self) -> "SessionState":
        """Reseeds the session if ORT's process-wide SetSeed was called since it last looked."""
        if PROCESS_SEED.generation == self.seed_generation:
            return self  # the common case, without the lock
        seed, generation = PROCESS_SEED.get()
        if generation == self.seed_generation or seed is None:
            return self
        return self.set_seed(seed).replace(seed_generation=generation)

    def set_seed(self, seed: int) -> "SessionState":
        """Reseeds the session's random training-mode ops (Dropout)."""
        seed = int(seed)
        train = self.values()
        if train is not None:
            train = self._place(_reseed(train, seed))
        return self.replace(seed=seed, train=train)

    def delete_buffers(self) -> None:
        """Deletes the device buffers of ``train`` (packed and unpacked): for a state that is dropped."""
        held = [] if self.train is None else [self.train, self.values()]
        for leaf in jax.tree_util.tree_leaves(held):
            if isinstance(leaf, jax.Array) and not leaf.is_deleted():
                leaf.delete()

    def values(self) -> Optional[TrainState]:
        """``train`` as a :class:`TrainState` (unpacked with one compiled call when packed), or None."""
        return None if self.train is None else unpack(self.train)

    def _live(self, form: str = "state"):
        """The session's training state; StateError while there is none (a nominal state).

        Args:
          form: "state" for a :class:`TrainState`, "as is" for ``train`` as
            it is, "packed" for the form train steps run fastest on: packed
            on one device (a state on a mesh stays as it is; see
            :mod:`jaxort.training.packing`).
        """
        if self.train is None:
            raise _nominal_error("run a step with")
        if form == "state":
            return unpack(self.train)
        if form == "packed" and self.placement is None and not isinstance(self.train, PackedState):
            return pack(self.train)
        return self.train

    # Steps --------------------------------------------------------------------

    def train_step(self, inputs: Sequence[Any]) -> tuple["SessionState", tuple]:
        """One training step, after the pending calls; returns the new state and the outputs (numpy, loss first).

        The pending calls and the step run as one compiled call
        (:meth:`TrainProgram.train_step_after`), compiled once for every
        combination of pending calls; once more if the session also
        accumulates gradients over several steps (a step that overwrites
        them, after a lazy reset or as the first, does not read them).
        """
        st = self.train
        if type(st) is not PackedState:
            st = self._live("packed")
        program, pending = self.program, self.pending
        if len(inputs) != len(program.input_names):
            _host_inputs(inputs, program.input_names, "the training model")  # raises
        if not self.accumulating and not pending.reset_grad:
            pending = pending.then("reset_grad")
        st, outputs = program.train_after(st, pending, *inputs, schedule=self.schedule)
        return (self.replace(train=st, has_grads=True, accumulating=True, pending=_NO_CALLS),
                tuple([np.asarray(o) for o in outputs]))

    def train_steps(self, inputs: Sequence[Any]) -> tuple["SessionState", tuple]:
        """ORT's loop over ``k`` stacked batches in one compiled call; returns the new state and the stacked outputs.

        Each batch runs a train step, an optimizer step, a scheduler step
        when a schedule is registered, and a lazy reset
        (:meth:`TrainProgram.train_steps`), after the pending calls. The
        gradients of the last batch stay, as after ORT's loop.

        Raises:
          StateError: no optimizer model; a sharded or nominal state.
        """
        self._check_optimizer("run train steps", "as is")
        if self.placement is not None:
            raise StateError("train_steps runs on one device: run train_step and optimizer_step "
                             "on a sharded session")
        if len(inputs) != len(self.program.input_names):
            _host_inputs(inputs, self.program.input_names, "the training model")  # raises
        here = self.flushed()
        st, outputs = self.program.train_steps(here._live("packed"), *inputs, schedule=self.schedule)
        return (here.replace(train=st, has_grads=True, accumulating=False),
                tuple([np.asarray(o) for o in outputs]))

    def defer(self, call: str, learning_rate: Optional[float] = None) -> "SessionState":
        """Records ``call`` (a name of :data:`jaxort.training.pending.ORDER`) to run before the next train step.

        ORT's loop is a train step, an optimizer step, a scheduler step (or
        a set learning rate) and a lazy reset; deferring the calls after the
        train step to the next one runs the loop as one compiled call per
        step instead of four. Deferred calls keep their order (optimizer
        step, learning rate, schedule; a reset commutes with all three); one
        that would run out of order, or twice, first runs the pending ones
        (:meth:`Pending.then`). Every other use of the state runs them first
        (:meth:`flushed`; :class:`SessionCell` does it), so no call can tell
        a deferred call from one run at once.

        Args:
          call: the call.
          learning_rate: the rate a ``"learning_rate"`` call sets.
        """
        pending = self.pending.then(call, learning_rate)
        if pending is None:
            return self.flushed().defer(call, learning_rate)
        return self.replace(pending=pending)

    def flushed(self) -> "SessionState":
        """This state with its pending calls run on ``train``, one by one."""
        if self.pending == _NO_CALLS:
            return self
        st = run_pending(self.values(), self.pending, optimizer_step=self.program.optimizer_step,
                         lazy_reset_grad=self.program.lazy_reset_grad, schedule=self.schedule)
        return self.replace(train=st, accumulating=self.accumulating and not self.pending.reset_grad,
                            pending=_NO_CALLS)

    def eval_step(self, inputs: Sequence[Any]) -> tuple:
        """The eval model's outputs (numpy) on the current parameters."""
        st = self._live("as is")
        if not self.program.has_eval_model:
            raise StateError("Eval model was not provided: an eval step needs the session to be created "
                             "with an eval model")
        args = _host_inputs(inputs, self.program.eval_input_names, "the eval model")
        return tuple(np.asarray(o) for o in self.program.eval_step(st, *args))

    def lazy_reset_grad(self) -> "SessionState":
        """The next train step overwrites the gradients instead of adding to them (deferred to it)."""
        if self.train is None:
            self._live("as is")
        return self.defer("reset_grad")

    def optimizer_step(self) -> "SessionState":
        """Applies the optimizer to the accumulated gradients (kept as they are), deferred to the next use.

        Raises:
          StateError: no optimizer, or no train step yet in this session
            (ORT 1.19.2 would step on zero gradients).
        """
        if self.train is None:
            self._live("as is")
        if not self.program.has_optimizer:
            raise StateError("No optimizer model was provided: an optimizer step needs the session to be "
                             "created with an optimizer model")
        if not self.has_grads:
            raise StateError("optimizer step before any train step: there are no gradients to apply yet; "
                             "call train_step first")
        return self.defer("optimizer_step")

    # Learning rate ------------------------------------------------------------

    def _check_optimizer(self, action: str, form: str = "state"):
        if not self.program.has_optimizer:
            raise StateError(f"Cannot {action}: the session has no optimizer model")
        return self._live(form)

    def set_learning_rate(self, learning_rate: Any) -> "SessionState":
        """Sets the learning rate of the next optimizer steps (deferred as :meth:`defer` says).

        Raises:
          InputError: not a finite number.
        """
        self._check_optimizer("set the learning rate", "as is")
        return self.defer("learning_rate", _finite_float(learning_rate, "learning rate"))

    def learning_rate(self) -> float:
        """The current learning rate (a float32 value)."""
        return float(self._check_optimizer("get the learning rate").learning_rate)

    def register_linear_lr_scheduler(self, warmup_step_count: Any, total_step_count: Any,
                                     initial_lr: Any) -> "SessionState":
        """Registers ORT's linear warmup/decay schedule and sets the learning rate for the current step."""
        st = self._check_optimizer("register a learning rate scheduler")
        counts = [_count(v, what) for v, what in ((warmup_step_count, "warmup_step_count"),
                                                    (total_step_count, "total_step_count"))]
        lr = _finite_float(initial_lr, "initial_lr")
        schedule = linear_lr_schedule(lr, *counts)
        st = apply_schedule(set_initial_learning_rate(st, lr), schedule)
        return self.replace(train=st, schedule=schedule)

    def scheduler_step(self) -> "SessionState":
        """Recomputes the learning rate from the optimizer step count (deferred as :meth:`defer` says).

        Raises:
          StateError: no scheduler was registered.
        """
        if self.schedule is None:
            raise StateError("No learning rate scheduler was registered; call register_linear_lr_scheduler "
                             "first")
        self._live("as is")
        return self.defer("schedule_step")

    # Buffers and export -------------------------------------------------------

    def parameters_size(self, trainable_only: bool) -> int:
        """Elements of a parameter buffer (works on nominal states)."""
        return self.layout.size(bool(trainable_only))

    def parameters_to_buffer(self, trainable_only: bool) -> np.ndarray:
        """The parameters as one float32 vector in the training model's input order.

        Raises:
          StateError: the state is nominal.
        """
        if self.train is None:
            raise _nominal_error("copy parameters from")
        names = self.layout.buffer_names(bool(trainable_only))
        st = self.values()
        values = gather({n: st.parameters[n] for n in names})
        return self.layout.flatten(values, bool(trainable_only))

    def buffer_to_parameters(self, buffer: Any, trainable_only: bool) -> "SessionState":
        """Sets parameters from one float32 vector; on a nominal state this loads them all.

        Raises:
          InputError: wrong size or dtype.
          StateError: ``trainable_only`` on a nominal state.
        """
        values = self.layout.unflatten(buffer, bool(trainable_only))
        if self.train is not None:
            return self._with_values(values)
        if trainable_only:
            raise StateError("For a nominal checkpoint state, all parameters need to be loaded into the "
                             "model (trainable_only = false).")
        cp = self.checkpoint
        data = cp.replace(trainable={n: values[n] for n in cp.trainable},
                          frozen={n: values[n] for n in cp.frozen}, is_nominal=False)
        train = self._place(self.program.init_state(data, seed=self.seed))
        return self.replace(checkpoint=data, train=train, accumulating=False)

    def export_model(self, output_names: Sequence[str]) -> onnx.ModelProto:
        """The inference model: the eval graph up to ``output_names`` with the current parameters.

        Raises:
          StateError: no eval model, or a nominal state.
          TrainingError: an unknown output name.
        """
        st = self._live()
        if not self.program.has_eval_model:
            raise StateError("Eval model was not provided. Cannot export a model for inferencing.")
        params = gather(st.parameters)
        return export_model_for_inferencing(self.program.eval_model, params, list(output_names))




def _finite_float(value: Any, what: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        if not (isinstance(value, (np.ndarray, jax.Array)) and np.ndim(value) == 0):
            raise InputError(f"{what} must be a number, got {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise InputError(f"{what} must be finite, got {value}")
    return value


def _count(value: Any, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{what} must be an integer, got {value!r}")
    return int(value)


_FIELD_INDEX = {name: index for index, name in enumerate(SessionState._fields)}
