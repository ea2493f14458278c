"""A facade shaped like ONNX Runtime's on-device training C API (OrtTrainingApi).

One Python function or method per entry of the C API (ORT 1.19.2), in
snake_case: :func:`load_checkpoint`, :func:`load_checkpoint_from_buffer`,
:func:`save_checkpoint`, :class:`TrainingSession` (CreateTrainingSession and
CreateTrainingSessionFromBuffer) with ``train_step``, ``eval_step``,
``lazy_reset_grad``, ``optimizer_step``, the learning-rate and scheduler
calls, the parameter-buffer calls, ``export_model_for_inferencing`` and the
model input/output queries; :func:`get_parameter_type_and_shape`,
:func:`get_parameter`, :func:`update_parameter`, :func:`add_property`,
:func:`get_property`, :func:`set_seed` and :func:`get_training_api`.

A :class:`TrainingSession` holds one :class:`jaxort.training.TrainState` and
the compiled steps of a :class:`jaxort.training.TrainProgram`. Every method
normalizes its arguments, calls a pure function of the training layer,
replaces the state and returns; no math lives here. Results come back as
numpy arrays; nothing else syncs with the device.

Differences from ONNX Runtime 1.19.2 (each is also noted where it applies):

- Calls made out of order raise :class:`jaxort.errors.StateError`: an
  optimizer step before any train step (ORT runs it on zero gradients), an
  eval step without an eval model (ORT's Python binding crashes), a
  scheduler step without a scheduler.
- A session created from a checkpoint that holds an optimizer group starts
  from that group's learning rate; ORT starts at 0.001.
- Parameter buffers are numpy arrays, not OrtValues.

This module is a facade: it imports the training, checkpoint and graph
layers and must not be imported by them.
"""

from __future__ import annotations

import collections
import hashlib
import os
import weakref
from collections.abc import Sequence
from typing import Any, Optional, Union

import jax
import numpy as np
import onnx

from jaxort import checkpoint as _ckpt
from jaxort import training as _training
from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import InputError, StateError
from jaxort.backend import resolve_device
from jaxort.graph import load_model

__all__ = [
    "SUPPORTED_API_VERSIONS",
    "CheckpointState",
    "TrainingApi",
    "TrainingSession",
    "UnknownNameError",
    "add_property",
    "get_parameter",
    "get_parameter_type_and_shape",
    "get_property",
    "get_training_api",
    "load_checkpoint",
    "load_checkpoint_from_buffer",
    "save_checkpoint",
    "set_seed",
    "update_parameter",
]

PathLike = Union[str, os.PathLike]
ModelLike = Union[str, os.PathLike, bytes, onnx.ModelProto]

# GetTrainingApi in ORT accepts API versions from 13 (the first with the
# training API) up to its own ORT_API_VERSION (19 for ORT 1.19).
SUPPORTED_API_VERSIONS = range(13, 20)

# The learning rate of a fresh optimizer in ORT 1.19.2.
DEFAULT_LEARNING_RATE = 1e-3


class UnknownNameError(InputError, KeyError):
    """A parameter or property name the checkpoint state does not have.

    It is a ``KeyError`` too, as in ``onnxruntime.training.api``.
    """

    def __str__(self) -> str:
        # KeyError quotes its message; this is a sentence.
        return str(self.args[0]) if self.args else ""


# A TrainProgram's jitted steps compile on first use, once per program.
# Sessions over the same artifacts (a notebook re-creating its Module, a test
# suite) share one program and so compile once. Programs hold no training
# state, so sharing them is safe; the cache is small and keyed by content.
_PROGRAM_CACHE: "collections.OrderedDict[bytes, _training.TrainProgram]" = collections.OrderedDict()
_PROGRAM_CACHE_SIZE = 16


def _program_for(train_model, eval_model, optimizer_model, data: _ckpt.CheckpointState):
    """The TrainProgram for these artifacts and parameter names, shared by content."""
    protos = [None if m is None else load_model(m, check=False)
              for m in (train_model, eval_model, optimizer_model)]
    digest = hashlib.sha256()
    for proto in protos:
        digest.update(b"-" if proto is None else hashlib.sha256(proto.SerializeToString()).digest())
    digest.update(repr((list(data.trainable), list(data.frozen))).encode())
    key = digest.digest()
    program = _PROGRAM_CACHE.get(key)
    if program is None:
        program = _training.TrainProgram.from_artifacts(*protos, checkpoint=data)
        _PROGRAM_CACHE[key] = program
        while len(_PROGRAM_CACHE) > _PROGRAM_CACHE_SIZE:
            _PROGRAM_CACHE.popitem(last=False)
    else:
        _PROGRAM_CACHE.move_to_end(key)
    return program


def _param_infos(model: onnx.ModelProto, names: set) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Parameter name -> (dtype, shape), in the training model's graph input order.

    That order is the order of ORT's contiguous parameter buffers (1.19.2).
    Parameters kept as initializers (possible in jaxort's artifacts) follow.
    """
    infos = {}
    for vi in model.graph.input:
        if vi.name in names:
            tt = vi.type.tensor_type
            dtype = to_numpy_dtype(tt.elem_type)
            infos[vi.name] = (np.dtype(dtype), tuple(int(d.dim_value) for d in tt.shape.dim))
    for tensor in model.graph.initializer:
        if tensor.name in names and tensor.name not in infos:
            dtype = to_numpy_dtype(tensor.data_type)
            infos[tensor.name] = (np.dtype(dtype), tuple(int(d) for d in tensor.dims))
    return infos


class CheckpointState:
    """A checkpoint state handle (ORT's ``OrtCheckpointState``), mutable.

    Until a :class:`TrainingSession` is created from it, it holds the
    parameters read from the checkpoint; afterwards the session's
    ``TrainState`` holds them (on the session's device) and this handle reads
    and writes through it, as ORT's state is shared with its session. The
    property bag always lives here: properties are not part of the
    ``TrainState`` that the compiled steps see, so adding one never
    recompiles.

    A state drives one session at a time: creating a second session from it
    detaches the first one.
    """

    def __init__(self, data: _ckpt.CheckpointState):
        """Wraps a loaded :class:`jaxort.checkpoint.CheckpointState`.

        Args:
          data: the checkpoint contents.
        """
        if not isinstance(data, _ckpt.CheckpointState):
            raise InputError(f"expected a jaxort.checkpoint.CheckpointState, got {type(data).__name__}")
        self._data = data
        self._properties: dict[str, Union[int, float, str]] = {}
        for name, value in data.properties.items():
            self._set_property(name, value)
        self._session: Optional[TrainingSession] = None

    # Parameters -------------------------------------------------------------

    def _names(self) -> list[str]:
        return list(self._data.trainable) + list(self._data.frozen)

    def has_parameter(self, name: str) -> bool:
        """Whether ``name`` is a parameter of the state."""
        return name in self._data.trainable or name in self._data.frozen

    def parameter_names(self) -> list[str]:
        """Parameter names, sorted (ORT 1.19.2 lists them sorted)."""
        return sorted(self._names())

    def requires_grad(self, name: str) -> bool:
        """Whether the parameter ``name`` is trainable."""
        self._check_name(name)
        return name in self._data.trainable

    @property
    def is_nominal(self) -> bool:
        """True while the parameters have no values (a nominal checkpoint not yet filled)."""
        if self._session is not None and self._session._train_state is not None:
            return False
        return self._data.is_nominal

    def _check_name(self, name: str) -> None:
        if not self.has_parameter(name):
            raise UnknownNameError(f"Parameter {name} not found.")

    def _check_values(self, action: str) -> None:
        if self.is_nominal:
            raise StateError(f"Cannot {action} a nominal checkpoint state: its parameters have no values. "
                             "Please load the parameter states first (copy_buffer_to_parameters with "
                             "trainable_only=False).")

    def get_parameter(self, name: str) -> np.ndarray:
        """The parameter's current value (a numpy copy).

        Raises:
          UnknownNameError: no such parameter.
          StateError: the state is nominal.
        """
        self._check_name(name)
        self._check_values("get a parameter from")
        if self._session is not None:
            return self._session._parameter(name)
        return np.array(self._data.parameters[name])

    def get_gradient(self, name: str) -> Optional[np.ndarray]:
        """The accumulated gradient of a trainable parameter, or None.

        None for frozen parameters and before a session exists (ORT allocates
        the gradient buffers, zeros, when the session is created).
        """
        self._check_name(name)
        self._check_values("get a gradient from")
        if self._session is None or name not in self._data.trainable:
            return None
        return self._session._gradient(name)

    def get_parameter_type_and_shape(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        """The parameter's dtype and shape (works on nominal states)."""
        self._check_name(name)
        if self._session is not None:
            return self._session._param_info(name)
        value = self._data.parameters[name]
        return np.dtype(value.dtype), tuple(value.shape)

    def update_parameter(self, name: str, value: Any) -> None:
        """Replaces a parameter's value; the shape and dtype must match.

        Raises:
          UnknownNameError: no such parameter.
          InputError: wrong shape or dtype.
          StateError: the state is nominal.
        """
        self._check_name(name)
        if self.is_nominal:
            raise StateError("Cannot update a parameter of a nominal checkpoint state. Please load all the "
                             "parameter states first (copy_buffer_to_parameters with trainable_only=False).")
        dtype, shape = self.get_parameter_type_and_shape(name)
        array = np.asarray(value)
        if array.dtype != dtype or tuple(array.shape) != shape:
            raise InputError(f"parameter {name!r}: expected shape {shape} and dtype {dtype}, "
                             f"given shape {tuple(array.shape)} and dtype {array.dtype}")
        if self._session is not None:
            self._session._set_parameters({name: array})
        elif name in self._data.trainable:
            self._data = self._data.replace(trainable={**self._data.trainable, name: array.copy()})
        else:
            self._data = self._data.replace(frozen={**self._data.frozen, name: array.copy()})

    # Properties -------------------------------------------------------------

    def _set_property(self, name: str, value: Any) -> None:
        if not isinstance(name, str):
            raise InputError(f"property names must be str, got {name!r}")
        # ORT 1.19.2 stores floats as float32, ints as int64 and bools as ints.
        if isinstance(value, (bool, np.bool_, int, np.integer)):
            value = int(value)
            if not -(2**63) <= value < 2**63:
                raise InputError(f"property {name!r}: {value} does not fit in int64")
        elif isinstance(value, (float, np.floating)):
            value = float(np.float32(value))
        elif not isinstance(value, str):
            raise InputError(f"property {name!r} must be an int, float or str, got {type(value).__name__}")
        self._properties[name] = value

    def add_property(self, name: str, value: Union[int, float, str]) -> None:
        """Adds or replaces a property: int (int64), float (stored as float32) or str."""
        self._set_property(name, value)

    def get_property(self, name: str) -> Union[int, float, str]:
        """A property's value.

        Raises:
          UnknownNameError: no such property.
        """
        if name not in self._properties:
            raise UnknownNameError(f"Property {name} not found.")
        return self._properties[name]

    def has_property(self, name: str) -> bool:
        """Whether the property exists."""
        return name in self._properties

    def property_names(self) -> list[str]:
        """Property names, sorted (ORT 1.19.2 lists them sorted)."""
        return sorted(self._properties)

    # Conversion -------------------------------------------------------------

    def to_checkpoint(self, include_optimizer_state: bool = False) -> _ckpt.CheckpointState:
        """The state as a :class:`jaxort.checkpoint.CheckpointState` (numpy), as it would be saved."""
        if self._session is not None and self._session._train_state is not None:
            data = self._session._to_checkpoint(include_optimizer_state)
        elif include_optimizer_state:
            data = self._data
        else:
            data = self._data.replace(optimizer_groups=())
        return data.replace(properties=dict(self._properties))


def load_checkpoint(path: PathLike) -> CheckpointState:
    """Loads a checkpoint file (LoadCheckpoint).

    Args:
      path: an ORT Training checkpoint (complete or nominal).

    Returns:
      The checkpoint state handle.

    Raises:
      CheckpointError: the file is missing or malformed.
    """
    return CheckpointState(_ckpt.load(os.fspath(path)))


def load_checkpoint_from_buffer(buffer: Union[bytes, bytearray, memoryview]) -> CheckpointState:
    """Loads a checkpoint from bytes in memory (LoadCheckpointFromBuffer).

    Args:
      buffer: the checkpoint file's bytes.

    Returns:
      The checkpoint state handle.
    """
    return CheckpointState(_ckpt.load_from_buffer(bytes(buffer)))


def save_checkpoint(state: CheckpointState, path: PathLike, include_optimizer_state: bool = False) -> None:
    """Saves a checkpoint state (SaveCheckpoint).

    The file is what ORT 1.19.2 writes for the same state: parameters sorted by
    name, the optimizer group ("group0") when asked for and an optimizer
    exists, and the property bag.

    Args:
      state: the handle.
      path: the file to write (replaced atomically).
      include_optimizer_state: also save the optimizer's step, initial
        learning rate and moments.
    """
    _ckpt.save(state.to_checkpoint(include_optimizer_state), os.fspath(path),
               include_optimizer_state=include_optimizer_state)


def get_parameter_type_and_shape(state: CheckpointState, name: str) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of a parameter (GetParameterTypeAndShape)."""
    return state.get_parameter_type_and_shape(name)


def get_parameter(state: CheckpointState, name: str) -> np.ndarray:
    """A parameter's value as a numpy array (GetParameter)."""
    return state.get_parameter(name)


def update_parameter(state: CheckpointState, name: str, value: Any) -> None:
    """Replaces a parameter's value; shape and dtype must match (UpdateParameter)."""
    state.update_parameter(name, value)


def add_property(state: CheckpointState, name: str, value: Union[int, float, str]) -> None:
    """Adds or replaces a property: int, float (float32) or str (AddProperty)."""
    state.add_property(name, value)


def get_property(state: CheckpointState, name: str) -> Union[int, float, str]:
    """A property's value (GetProperty)."""
    return state.get_property(name)


# ORT's SetSeed is process-wide: it seeds the sessions created afterwards.
# The live sessions are reseeded too, so the call means the same whatever the
# order of creation. Sessions are held weakly; nothing else is global.
_seed_registry: dict[str, Any] = {"seed": None, "sessions": weakref.WeakSet()}


def set_seed(seed: int) -> None:
    """Seeds random training-mode ops (Dropout) of every session (SetSeed).

    Args:
      seed: an integer seed, used by the sessions that exist and those
        created later.
    """
    seed = int(seed)
    _seed_registry["seed"] = seed
    for session in list(_seed_registry["sessions"]):
        session.set_seed(seed)


class TrainingSession:
    """A training session (ORT's ``OrtTrainingSession``) over a checkpoint state.

    Example:
      >>> state = load_checkpoint("checkpoint")                                 # doctest: +SKIP
      >>> with TrainingSession(state, "training_model.onnx", "eval_model.onnx",
      ...                      "optimizer_model.onnx") as session:              # doctest: +SKIP
      ...     loss, = session.train_step(x, labels)
      ...     session.optimizer_step()
      ...     session.lazy_reset_grad()
    """

    def __init__(
        self,
        state: CheckpointState,
        train_model: ModelLike,
        eval_model: Optional[ModelLike] = None,
        optimizer_model: Optional[ModelLike] = None,
        *,
        device: str = "cpu",
    ):
        """Creates a session (CreateTrainingSession / CreateTrainingSessionFromBuffer).

        Args:
          state: the checkpoint state; the session shares it.
          train_model: the training model: a path, its bytes, or a ModelProto
            (ORT's or jaxort's ``generate_artifacts``).
          eval_model: the eval model, optional (eval steps and export need it).
          optimizer_model: the optimizer model, optional (optimizer steps need it).
          device: ``"cpu"``, ``"cuda"``, ``"gpu"`` or ``"tpu"``, optionally
            with ``":<index>"``; the state lives on that JAX device.

        Raises:
          InputError: the device is unknown or not available.
          TrainingError, ModelError: invalid artifacts.
          CheckpointError: the checkpoint does not match the training model.
        """
        if not isinstance(state, CheckpointState):
            raise InputError(f"state must be a jaxort CheckpointState, got {type(state).__name__}")
        self._device = resolve_device(device)
        self._program = _program_for(train_model, eval_model, optimizer_model, state._data)
        model = self._program.training_model
        self._trainable = list(self._program.trainable_names)
        self._frozen = list(self._program.frozen_names)
        infos = _param_infos(model, set(self._trainable) | set(self._frozen))
        self._param_infos = infos
        self._order = list(infos)
        self._order_trainable = [n for n in self._order if n in set(self._trainable)]
        self._schedule = None
        self._has_grads = False
        self._released = False
        self._handle = state
        seed = _seed_registry["seed"]
        self._seed = 0 if seed is None else seed
        self._train_state = None
        if not state.is_nominal:
            self._train_state = self._init_state(state.to_checkpoint(include_optimizer_state=True))
        state._session = self
        _seed_registry["sessions"].add(self)

    @classmethod
    def from_buffers(
        cls,
        state: CheckpointState,
        train_model: bytes,
        eval_model: Optional[bytes] = None,
        optimizer_model: Optional[bytes] = None,
        *,
        device: str = "cpu",
    ) -> "TrainingSession":
        """Creates a session from in-memory model bytes (CreateTrainingSessionFromBuffer).

        Args:
          state: the checkpoint state.
          train_model: the training model's bytes.
          eval_model: the eval model's bytes, optional.
          optimizer_model: the optimizer model's bytes, optional.
          device: as for the constructor.

        Returns:
          The session.
        """
        for what, value in (("train_model", train_model), ("eval_model", eval_model),
                            ("optimizer_model", optimizer_model)):
            if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
                raise InputError(f"{what} must be bytes, got {type(value).__name__}")
        train_model, eval_model, optimizer_model = (
            None if b is None else bytes(b) for b in (train_model, eval_model, optimizer_model))
        return cls(state, train_model, eval_model, optimizer_model, device=device)

    # Internals shared with jaxort.api ---------------------------------------

    def _init_state(self, data: _ckpt.CheckpointState):
        train_state = self._program.init_state(data, seed=self._seed)
        return jax.device_put(train_state, self._device)

    def _live(self):
        if self._released:
            raise StateError("the TrainingSession was released")
        if self._handle._session is not self:
            raise StateError("the checkpoint state is now used by another TrainingSession")
        if self._train_state is None:
            raise StateError("Cannot run a step with a nominal checkpoint state: its parameters have "
                             "no values. Please load the model parameters first "
                             "(copy_buffer_to_parameters with trainable_only=False).")
        return self._train_state

    def _parameter(self, name: str) -> np.ndarray:
        st = self._live()
        value = st.params[name] if name in st.params else st.frozen[name]
        return np.array(value)

    def _gradient(self, name: str) -> np.ndarray:
        return np.array(self._live().grads[name])

    def _param_info(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        return self._param_infos[name]

    def _set_parameters(self, values: dict[str, np.ndarray]) -> None:
        st = self._live()
        placed = jax.device_put(values, self._device)
        params = {**st.params, **{k: v for k, v in placed.items() if k in st.params}}
        frozen = {**st.frozen, **{k: v for k, v in placed.items() if k in st.frozen}}
        self._train_state = st.replace(params=params, frozen=frozen)

    def _to_checkpoint(self, include_optimizer_state: bool) -> _ckpt.CheckpointState:
        return self._program.to_checkpoint(self._live(), include_optimizer_state=include_optimizer_state)

    def _attach_optimizer(self, optimizer_model: ModelLike) -> None:
        """Adds an optimizer to a session made without one (``onnxruntime.training.api.Optimizer``).

        Parameters, gradients and the PRNG key carry over; the optimizer
        state starts from the checkpoint's optimizer group if it has one.
        """
        self._check_open()
        program = _program_for(self._program.training_model, self._program.eval_model, optimizer_model,
                               self._handle._data)
        self._program = program
        if self._train_state is None:
            return
        old = self._train_state
        data = program.to_checkpoint(old, include_optimizer_state=False).replace(
            optimizer_groups=self._handle._data.optimizer_groups)
        new = self._init_state(data)
        self._train_state = new.replace(grads=old.grads, accumulate=old.accumulate, rng=old.rng)

    def _check_open(self) -> None:
        if self._released:
            raise StateError("the TrainingSession was released")

    def _normalize(self, inputs: Sequence[Any], names: Sequence[str], what: str) -> list:
        if len(inputs) != len(names):
            raise InputError(f"{what} takes {len(names)} inputs {list(names)}, given {len(inputs)}")
        return [x if isinstance(x, jax.Array) else np.asarray(x) for x in inputs]

    # Steps -------------------------------------------------------------------

    def train_step(self, *inputs) -> tuple[np.ndarray, ...]:
        """Runs one training step (TrainStep): forward, loss, gradient accumulation.

        Gradients add to the accumulated ones, unless ``lazy_reset_grad`` was
        called since the last train step: then they replace them.

        Args:
          *inputs: the training model's user inputs then labels, in
            ``training_model_input_names()`` order (numpy or JAX arrays).

        Returns:
          The training model's outputs (loss first) as numpy arrays.

        Raises:
          InputError: wrong number, shape or dtype of inputs.
          StateError: the session was released or its state is nominal.
        """
        st = self._live()
        args = self._normalize(inputs, self._program.input_names, "the training model")
        self._train_state, outputs = self._program.train_step(st, *args)
        self._has_grads = True
        return tuple(np.asarray(o) for o in outputs)

    def eval_step(self, *inputs) -> tuple[np.ndarray, ...]:
        """Runs the eval model on the current parameters (EvalStep).

        Args:
          *inputs: the eval model's user inputs then labels.

        Returns:
          The eval model's outputs as numpy arrays.

        Raises:
          StateError: the session has no eval model (ORT 1.19.2's Python
            binding crashes instead), was released, or its state is nominal.
        """
        st = self._live()
        if not self._program.has_eval_model:
            raise StateError("Eval model was not provided: an eval step needs the session to be created "
                             "with an eval model")
        args = self._normalize(inputs, self._program.eval_input_names, "the eval model")
        outputs = self._program.eval_step(st, *args)
        return tuple(np.asarray(o) for o in outputs)

    def lazy_reset_grad(self) -> None:
        """Makes the next train step overwrite the gradients instead of adding to them (LazyResetGrad)."""
        self._train_state = self._program.lazy_reset_grad(self._live())

    def optimizer_step(self) -> None:
        """Updates the trainable parameters from the accumulated gradients (OptimizerStep).

        Gradients are left as they are; call ``lazy_reset_grad`` to start a
        new accumulation.

        Raises:
          StateError: no optimizer model, or no train step has run in this
            session yet (ORT 1.19.2 would step on zero gradients).
        """
        st = self._live()
        if not self._program.has_optimizer:
            raise StateError("No optimizer model was provided: an optimizer step needs the session to be "
                             "created with an optimizer model")
        if not self._has_grads:
            raise StateError("optimizer step before any train step: there are no gradients to apply yet; "
                             "call train_step first")
        self._train_state = self._program.optimizer_step(st)

    # Learning rate -----------------------------------------------------------

    def _check_optimizer(self, action: str) -> None:
        if not self._program.has_optimizer:
            raise StateError(f"Cannot {action}: the session has no optimizer model")

    def set_learning_rate(self, learning_rate: float) -> None:
        """Sets the learning rate of the next optimizer steps (SetLearningRate)."""
        self._check_optimizer("set the learning rate")
        self._train_state = _training.set_learning_rate(self._live(), float(learning_rate))

    def get_learning_rate(self) -> float:
        """The current learning rate (GetLearningRate), a float32 value as a Python float."""
        self._check_optimizer("get the learning rate")
        return float(self._live().learning_rate)

    def register_linear_lr_scheduler(self, warmup_step_count: int, total_step_count: int,
                                     initial_lr: float) -> None:
        """Registers ORT's linear warmup/decay schedule (RegisterLinearLRScheduler).

        The learning rate is set at once for the current optimizer step
        count, then by each ``scheduler_step``. The counts have their
        documented meaning, as in ORT's C API (ORT 1.19.2's *Python*
        LinearLRScheduler swaps them; see ``jaxort.api.LinearLRScheduler``).

        Args:
          warmup_step_count: steps of linear warmup from 0.
          total_step_count: the step at which the learning rate reaches 0.
          initial_lr: the peak learning rate; also what a checkpoint saves as
            the optimizer group's initial learning rate.
        """
        self._check_optimizer("register a learning rate scheduler")
        schedule = _training.linear_lr_schedule(float(initial_lr), int(warmup_step_count),
                                                int(total_step_count))
        st = _training.set_initial_learning_rate(self._live(), float(initial_lr))
        self._train_state = _training.apply_schedule(st, schedule)
        self._schedule = schedule

    def scheduler_step(self) -> None:
        """Recomputes the learning rate from the optimizer step count (SchedulerStep).

        Raises:
          StateError: no scheduler was registered.
        """
        if self._schedule is None:
            raise StateError("No learning rate scheduler was registered; call register_linear_lr_scheduler "
                             "first")
        self._train_state = _training.apply_schedule(self._live(), self._schedule)

    # Parameter buffers -------------------------------------------------------

    def _buffer_names(self, trainable_only: bool) -> list[str]:
        return self._order_trainable if trainable_only else self._order

    def get_parameters_size(self, trainable_only: bool = False) -> int:
        """Number of parameter elements (GetParametersSize); works on nominal states.

        Args:
          trainable_only: count trainable parameters only. The default is
            ORT's C++ API default (False); ``jaxort.api`` keeps the Python
            default (True).
        """
        self._check_open()
        return int(sum(int(np.prod(self._param_infos[n][1], dtype=np.int64))
                       for n in self._buffer_names(trainable_only)))

    def copy_parameters_to_buffer(self, trainable_only: bool = False) -> np.ndarray:
        """The parameters flattened into one float32 vector (CopyParametersToBuffer).

        The order is the training model's parameter inputs, as in ORT.

        Args:
          trainable_only: only trainable parameters.

        Returns:
          A new numpy array (ORT fills an OrtValue).

        Raises:
          StateError: the state is nominal.
        """
        if self._train_state is None and not self._released:
            raise StateError("Cannot copy parameters from a nominal checkpoint state. Please load the model "
                             "parameters first.")
        st = self._live()
        names = self._buffer_names(trainable_only)
        self._check_float32(names)
        values = [st.params[n] if n in st.params else st.frozen[n] for n in names]
        host = jax.device_get(values)
        if not host:
            return np.zeros(0, np.float32)
        return np.concatenate([np.ravel(v) for v in host]).astype(np.float32, copy=False)

    def _check_float32(self, names: Sequence[str]) -> None:
        other = [n for n in names if self._param_infos[n][0] != np.float32]
        if other:
            raise InputError(f"parameter buffers hold float32 only, as in ORT; parameters {other} "
                             "are not float32")

    def copy_buffer_to_parameters(self, buffer: Any, trainable_only: bool = False) -> None:
        """Sets parameters from one flat float32 vector (CopyBufferToParameters).

        With ``trainable_only=True`` frozen parameters are left as they are.
        On a nominal state this loads all parameters (``trainable_only`` must
        be False, as in ORT) and makes the session ready to train.

        Args:
          buffer: a 1-D float32 array (numpy or JAX) of
            ``get_parameters_size(trainable_only)`` elements.
          trainable_only: the buffer holds only the trainable parameters.

        Raises:
          InputError: wrong size or dtype.
          StateError: trainable_only on a nominal state.
        """
        self._check_open()
        names = self._buffer_names(trainable_only)
        self._check_float32(names)
        array = np.asarray(buffer)
        size = self.get_parameters_size(trainable_only)
        if array.dtype != np.float32 or array.size != size:
            raise InputError(f"Parameters buffer size incorrect: expected {size} float32 elements, given "
                             f"{array.size} of {array.dtype}")
        array = array.reshape(-1)
        values, offset = {}, 0
        for name in names:
            _, shape = self._param_infos[name]
            count = int(np.prod(shape, dtype=np.int64))
            values[name] = array[offset:offset + count].reshape(shape).copy()
            offset += count
        if self._train_state is None:
            if trainable_only:
                raise StateError("For a nominal checkpoint state, all parameters need to be loaded into the "
                                 "model (trainable_only = false).")
            data = self._handle._data.replace(
                trainable={n: values[n] for n in self._trainable},
                frozen={n: values[n] for n in self._frozen},
                is_nominal=False)
            self._train_state = self._init_state(data)
            return
        self._set_parameters(values)

    # Export, seed, names -----------------------------------------------------

    def export_model_for_inferencing(self, inference_model_path: PathLike,
                                     graph_output_names: Sequence[str]) -> None:
        """Writes the inference model: the eval graph up to the named outputs (ExportModelForInferencing).

        Labels and the loss are removed and the current parameters become
        initializers; the file loads in ``onnxruntime.InferenceSession``.

        Args:
          inference_model_path: where to write the model.
          graph_output_names: the outputs to keep, e.g. ``["output"]``.

        Raises:
          StateError: the session has no eval model, or its state is nominal.
          TrainingError: an unknown output name.
        """
        st = self._live()
        if not self._program.has_eval_model:
            raise StateError("Eval model was not provided. Cannot export a model for inferencing.")
        from jaxort.training.export import export_model_for_inferencing

        params = jax.device_get(st.parameters)
        model = export_model_for_inferencing(self._program.eval_model, params, list(graph_output_names))
        onnx.save(model, os.fspath(inference_model_path))

    def set_seed(self, seed: int) -> None:
        """Reseeds this session's random training-mode ops (Dropout)."""
        self._check_open()
        self._seed = int(seed)
        if self._train_state is not None:
            reseeded = _training.set_seed(self._train_state, self._seed)
            self._train_state = jax.device_put(reseeded, self._device)

    def training_model_input_names(self) -> list[str]:
        """The training model's user inputs then labels (parameters and buffers excluded)."""
        return list(self._program.input_names)

    def training_model_output_names(self) -> list[str]:
        """The training model's user outputs, loss first (gradient outputs excluded)."""
        return list(self._program.output_names)

    def eval_model_input_names(self) -> list[str]:
        """The eval model's user inputs then labels; empty without an eval model."""
        return list(self._program.eval_input_names) if self._program.has_eval_model else []

    def eval_model_output_names(self) -> list[str]:
        """The eval model's outputs; empty without an eval model."""
        return list(self._program.eval_output_names) if self._program.has_eval_model else []

    def training_model_input_count(self) -> int:
        """TrainingSessionGetTrainingModelInputCount."""
        return len(self.training_model_input_names())

    def training_model_output_count(self) -> int:
        """TrainingSessionGetTrainingModelOutputCount."""
        return len(self.training_model_output_names())

    def eval_model_input_count(self) -> int:
        """TrainingSessionGetEvalModelInputCount."""
        return len(self.eval_model_input_names())

    def eval_model_output_count(self) -> int:
        """TrainingSessionGetEvalModelOutputCount."""
        return len(self.eval_model_output_names())

    def training_model_input_name(self, index: int) -> str:
        """TrainingSessionGetTrainingModelInputName."""
        return _indexed(self.training_model_input_names(), index, "training model input")

    def training_model_output_name(self, index: int) -> str:
        """TrainingSessionGetTrainingModelOutputName."""
        return _indexed(self.training_model_output_names(), index, "training model output")

    def eval_model_input_name(self, index: int) -> str:
        """TrainingSessionGetEvalModelInputName."""
        return _indexed(self.eval_model_input_names(), index, "eval model input")

    def eval_model_output_name(self, index: int) -> str:
        """TrainingSessionGetEvalModelOutputName."""
        return _indexed(self.eval_model_output_names(), index, "eval model output")

    @property
    def device(self) -> jax.Device:
        """The JAX device holding the state."""
        return self._device

    @property
    def train_state(self):
        """The current :class:`jaxort.training.TrainState` (None while nominal)."""
        return self._train_state

    @property
    def program(self):
        """The :class:`jaxort.training.TrainProgram` the session runs."""
        return self._program

    # Release -----------------------------------------------------------------

    def release(self) -> None:
        """Frees the session's device buffers (ReleaseTrainingSession).

        The checkpoint state keeps the parameter values (copied to the host
        first), so it can be saved or used by a new session. Releasing twice
        is a no-op; any other call afterwards raises StateError.
        """
        if self._released:
            return
        if self._handle._session is self:
            if self._train_state is not None:
                data = self._to_checkpoint(include_optimizer_state=True)
                self._handle._data = data.replace(properties=self._handle._data.properties)
            self._handle._session = None
        leaves = jax.tree_util.tree_leaves(self._train_state)
        self._train_state = None
        self._released = True
        for leaf in leaves:
            if isinstance(leaf, jax.Array) and not leaf.is_deleted():
                leaf.delete()

    def __enter__(self) -> "TrainingSession":
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def _indexed(names: list[str], index: int, what: str) -> str:
    if not 0 <= index < len(names):
        raise InputError(f"{what} index {index} out of range: there are {len(names)}")
    return names[index]


class TrainingApi:
    """The functions of one training API version (what GetTrainingApi returns)."""

    def __init__(self, version: int):
        self.version = version
        self.load_checkpoint = load_checkpoint
        self.load_checkpoint_from_buffer = load_checkpoint_from_buffer
        self.save_checkpoint = save_checkpoint
        self.TrainingSession = TrainingSession
        self.create_training_session = TrainingSession
        self.create_training_session_from_buffer = TrainingSession.from_buffers
        self.get_parameter_type_and_shape = get_parameter_type_and_shape
        self.get_parameter = get_parameter
        self.update_parameter = update_parameter
        self.add_property = add_property
        self.get_property = get_property
        self.set_seed = set_seed

    def __repr__(self) -> str:
        return f"TrainingApi(version={self.version})"


def get_training_api(version: int) -> TrainingApi:
    """The training API for an ORT API version (GetTrainingApi).

    Args:
      version: an ORT API version; 13 to 19 are supported (ORT 1.13 to 1.19).

    Returns:
      The API's functions.

    Raises:
      InputError: an unsupported version (ORT returns NULL and prints a message).
    """
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or int(version) not in \
            SUPPORTED_API_VERSIONS:
        raise InputError(f"training API version {version!r} is not supported; jaxort provides versions "
                         f"{SUPPORTED_API_VERSIONS.start} to {SUPPORTED_API_VERSIONS.stop - 1}")
    return TrainingApi(int(version))
