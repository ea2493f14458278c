"""A facade shaped like ONNX Runtime's on-device training C API (OrtTrainingApi, ORT 1.19.2).

One function or method per C API entry, in snake_case: :func:`load_checkpoint`,
:func:`save_checkpoint`, :class:`TrainingSession` (CreateTrainingSession) with
its steps, learning-rate, scheduler, parameter-buffer, export and name calls,
:func:`get_parameter`, :func:`update_parameter`, :func:`add_property`,
:func:`get_property`, :func:`set_seed`, :func:`release_checkpoint_state`,
:func:`release_training_session` and :func:`get_training_api`.

A :class:`CheckpointHandle` (``OrtCheckpointState``) holds one immutable
:class:`jaxort.training.SessionState`; every method calls it and replaces the
handle's value, so no logic lives here. Results are numpy arrays.

Differences from ONNX Runtime 1.19.2: out-of-order calls raise
:class:`jaxort.errors.StateError` (an optimizer step before any train step,
which ORT runs on zero gradients; eval without an eval model, where ORT's
binding crashes); a session on a checkpoint with an optimizer group starts
from its learning rate (ORT: 0.001); parameter buffers are numpy arrays.

A facade: it imports the layers below and nothing below imports it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional, Union

import jax
import numpy as np
import onnx

from jaxort import checkpoint as _ckpt
from jaxort import training as _training
from jaxort.errors import InputError, StateError, UnknownNameError
from jaxort.graph import resolve_device, save_model
from jaxort._checkpoint_handle import CheckpointHandle
from jaxort.training.session_state import SessionCell

__all__ = [
    "SUPPORTED_API_VERSIONS",
    "CheckpointHandle",
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
    "release_checkpoint_state",
    "release_training_session",
    "save_checkpoint",
    "set_seed",
    "update_parameter",
]

PathLike = Union[str, os.PathLike]
ModelLike = Union[str, os.PathLike, bytes, onnx.ModelProto]

# GetTrainingApi in ORT accepts API versions from 13 (the first with the
# training API) up to its own ORT_API_VERSION (19 for ORT 1.19).
SUPPORTED_API_VERSIONS = range(13, 20)


def load_checkpoint(path: PathLike) -> CheckpointHandle:
    """Loads a checkpoint file, complete or nominal (LoadCheckpoint); CheckpointError if malformed."""
    return CheckpointHandle(_ckpt.load(path))


def load_checkpoint_from_buffer(buffer: Union[bytes, bytearray, memoryview]) -> CheckpointHandle:
    """Loads a checkpoint from the bytes of its file (LoadCheckpointFromBuffer)."""
    return CheckpointHandle(_ckpt.load_from_buffer(bytes(buffer)))


def save_checkpoint(state: CheckpointHandle, path: PathLike, include_optimizer_state: bool = False) -> None:
    """Saves a checkpoint state (SaveCheckpoint), atomically.

    The file is what ORT 1.19.2 writes for the same state: parameters sorted by
    name, the optimizer group ("group0") when asked for and an optimizer
    exists, and the property bag.

    Args:
      state: the handle.
      path: the file to write.
      include_optimizer_state: also save the optimizer's step, initial
        learning rate and moments.
    """
    _ckpt.save(state.to_checkpoint(include_optimizer_state), path,
               include_optimizer_state=include_optimizer_state)


def get_parameter_type_and_shape(state: CheckpointHandle, name: str) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of a parameter (GetParameterTypeAndShape)."""
    return state.get_parameter_type_and_shape(name)


def get_parameter(state: CheckpointHandle, name: str) -> np.ndarray:
    """A parameter's value as a numpy array (GetParameter)."""
    return state.get_parameter(name)


def update_parameter(state: CheckpointHandle, name: str, value: Any) -> None:
    """Replaces a parameter's value; shape and dtype must match (UpdateParameter)."""
    state.update_parameter(name, value)


def add_property(state: CheckpointHandle, name: str, value: Union[int, float, str]) -> None:
    """Adds or replaces a property: int, float (float32) or str (AddProperty)."""
    state.add_property(name, value)


def get_property(state: CheckpointHandle, name: str) -> Union[int, float, str]:
    """A property's value (GetProperty)."""
    return state.get_property(name)


def release_checkpoint_state(state: CheckpointHandle) -> None:
    """Releases a checkpoint state (ReleaseCheckpointState): see :meth:`CheckpointHandle.release`."""
    if not isinstance(state, CheckpointHandle):
        raise InputError(f"state must be a jaxort.session.CheckpointHandle, got {type(state).__name__}")
    state.release()


def release_training_session(session: "TrainingSession") -> None:
    """Releases a training session (ReleaseTrainingSession): see :meth:`TrainingSession.release`."""
    if not isinstance(session, TrainingSession):
        raise InputError(f"session must be a jaxort.session.TrainingSession, got {type(session).__name__}")
    session.release()


def set_seed(seed: int) -> None:
    """Seeds random training-mode ops (Dropout) of every session, live or created later (SetSeed).

    ORT's seed is process-wide; so is this one (:data:`jaxort.training.PROCESS_SEED`).
    """
    _training.PROCESS_SEED.set(seed)


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

    def __init__(self, state: CheckpointHandle, train_model: ModelLike,
                 eval_model: Optional[ModelLike] = None, optimizer_model: Optional[ModelLike] = None, *,
                 device: str = "cpu", mesh: Any = None, strategy: str = "data", remat: Any = None):
        """Creates a session (CreateTrainingSession).

        Args:
          state: the checkpoint state; the session shares it.
          train_model: the training model (path, bytes or ModelProto).
          eval_model: the eval model, optional (eval steps and export need it).
          optimizer_model: the optimizer model, optional (optimizer steps need it).
          device: ``"cpu"``, ``"cuda"``, ``"gpu"`` or ``"tpu"`` (``":<index>"``).
          mesh, strategy: shard the state over a ``jax.sharding.Mesh`` (see ``jaxort.training.shard``).
          remat: rematerialise the forward pass in train steps (``TrainProgram.from_artifacts``'
            option): None, ``"dots"``, ``"dots_no_batch"``, ``"nothing_saveable"`` or a
            ``jax.checkpoint`` policy.

        Raises:
          InputError: the device is unknown or not available.
          TrainingError, ModelError: invalid artifacts, mesh, strategy or remat.
          CheckpointError: the checkpoint does not match the training model.
        """
        if not isinstance(state, CheckpointHandle):
            raise InputError(f"state must be a jaxort.session.CheckpointHandle, got {type(state).__name__}")
        device = resolve_device(device)
        program = _training.PROGRAMS.get(train_model, eval_model, optimizer_model,
                                         state.session_state.checkpoint, remat=remat)
        self._handle = state
        self._program = program
        self._released = False
        state.cell.update(lambda st: st.attach(program, device=device, owner=self, mesh=mesh, strategy=strategy))

    @classmethod
    def from_buffers(cls, state: CheckpointHandle, train_model: bytes, eval_model: Optional[bytes] = None,
                     optimizer_model: Optional[bytes] = None, *, device: str = "cpu",
                     **placement) -> "TrainingSession":
        """Creates a session from in-memory model bytes (CreateTrainingSessionFromBuffer)."""
        for what, value in (("train_model", train_model), ("eval_model", eval_model),
                            ("optimizer_model", optimizer_model)):
            if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
                raise InputError(f"{what} must be bytes, got {type(value).__name__}")
        train_model, eval_model, optimizer_model = (
            None if b is None else bytes(b) for b in (train_model, eval_model, optimizer_model))
        return cls(state, train_model, eval_model, optimizer_model, device=device, **placement)

    def _cell(self) -> SessionCell:
        if self._released:
            raise StateError("the TrainingSession was released")
        return self._handle.cell

    def _read(self, fn):
        """``fn(state)`` as one transaction on the handle's cell, once this session still owns it."""
        return self._cell().read(fn, owner=self)

    def _update(self, fn, deferring: bool = False) -> None:
        """Replaces the state by ``fn(state)``, once this session owns it (``deferring``: see ``SessionCell``)."""
        self._cell().update(fn, owner=self, deferring=deferring)

    def train_step(self, *inputs) -> tuple[np.ndarray, ...]:
        """Runs one training step (TrainStep): forward, loss, gradient accumulation.

        Gradients add to the accumulated ones, unless ``lazy_reset_grad`` was
        called since the last train step: then they replace them. Inputs are
        the user inputs then labels (numpy or JAX arrays); the outputs come
        back as numpy arrays, loss first. InputError for wrong inputs,
        StateError once released or while nominal.
        """
        return self._cell().step(lambda st: st.train_step(inputs), owner=self, deferring=True)

    def train_steps(self, *inputs) -> tuple[np.ndarray, ...]:
        """Runs ``k`` iterations of the training loop in one call (a jaxort extension; the C API has none).

        Each input holds ``k`` batches stacked along a new leading axis;
        each batch runs TrainStep, OptimizerStep, SchedulerStep (when a
        scheduler is registered) and LazyResetGrad, with the numbers of
        those calls one by one, and the outputs come back stacked (loss
        first, shape ``(k, ...)``). One compiled call for the ``k`` steps:
        a small model's step costs a fraction of a :meth:`train_step`'s.
        Compiles once per ``k``. InputError for wrong inputs, StateError
        without an optimizer model, on a sharded session, once released or
        while nominal.
        """
        return self._cell().step(lambda st: st.train_steps(inputs), owner=self, deferring=True)

    def eval_step(self, *inputs) -> tuple[np.ndarray, ...]:
        """Runs the eval model on the current parameters (EvalStep); StateError without an eval model."""
        return self._read(lambda st: st.eval_step(inputs))

    def lazy_reset_grad(self) -> None:
        """Makes the next train step overwrite the gradients instead of adding to them (LazyResetGrad)."""
        self._update(lambda st: st.lazy_reset_grad(), deferring=True)

    def optimizer_step(self) -> None:
        """Updates the trainable parameters from the accumulated gradients, which stay (OptimizerStep).

        StateError without an optimizer model, or before any train step of
        this session (ORT 1.19.2 would step on zero gradients).
        """
        self._update(lambda st: st.optimizer_step(), deferring=True)

    def attach_optimizer(self, optimizer_model: ModelLike) -> None:
        """Gives a session created without an optimizer model one (``onnxruntime.training.api.Optimizer``).

        Parameters, gradients and the PRNG key carry over; the optimizer state
        starts from the checkpoint's optimizer group if it has one.
        """
        base, checkpoint = self._read(lambda st: (st.program, st.checkpoint))
        program = _training.PROGRAMS.get(base.training_model, base.eval_model, optimizer_model, checkpoint,
                                         remat=base.remat)
        self._update(lambda st: st.with_optimizer(program))
        self._program = program

    def set_learning_rate(self, learning_rate: float) -> None:
        """Sets the learning rate of the next optimizer steps (SetLearningRate)."""
        self._update(lambda st: st.set_learning_rate(learning_rate), deferring=True)

    def get_learning_rate(self) -> float:
        """The current learning rate (GetLearningRate), a float32 value as a Python float."""
        return self._read(lambda st: st.learning_rate())

    def register_linear_lr_scheduler(self, warmup_step_count: int, total_step_count: int,
                                     initial_lr: float) -> None:
        """Registers ORT's linear warmup/decay schedule (RegisterLinearLRScheduler).

        The learning rate is set at once for the current optimizer step
        count, then by each ``scheduler_step``; ``initial_lr`` is also what a
        checkpoint saves as the group's initial learning rate. The counts have
        their documented meaning, as in ORT's C API (ORT 1.19.2's *Python*
        LinearLRScheduler swaps them; see ``jaxort.api.LinearLRScheduler``).
        """
        self._update(lambda st: st.register_linear_lr_scheduler(warmup_step_count, total_step_count, initial_lr))

    def scheduler_step(self) -> None:
        """Recomputes the learning rate from the optimizer step count (SchedulerStep)."""
        self._update(lambda st: st.scheduler_step(), deferring=True)

    def get_parameters_size(self, trainable_only: bool = False) -> int:
        """Number of parameter elements (GetParametersSize); works on nominal states.

        Args:
          trainable_only: count trainable parameters only. The default is
            ORT's C++ API default (False); ``jaxort.api`` keeps the Python
            default (True).
        """
        return self._read(lambda st: st.parameters_size(trainable_only))

    def copy_parameters_to_buffer(self, trainable_only: bool = False) -> np.ndarray:
        """The parameters flattened into one new float32 vector (CopyParametersToBuffer).

        The order is the training model's parameter inputs, as in ORT (which
        fills an OrtValue); StateError on a nominal state.
        """
        return self._read(lambda st: st.parameters_to_buffer(trainable_only))

    def copy_buffer_to_parameters(self, buffer: Any, trainable_only: bool = False) -> None:
        """Sets parameters from one flat float32 vector (CopyBufferToParameters).

        With ``trainable_only=True`` frozen parameters are left as they are.
        On a nominal state this loads all parameters (``trainable_only`` must
        be False, as in ORT) and makes the session ready to train. InputError
        for a wrong size or dtype.
        """
        self._update(lambda st: st.buffer_to_parameters(buffer, trainable_only))

    def export_model_for_inferencing(self, inference_model_path: PathLike,
                                     graph_output_names: Sequence[str]) -> None:
        """Writes the inference model: the eval graph up to the named outputs (ExportModelForInferencing).

        Labels and the loss are removed and the current parameters become
        initializers; the file loads in ``onnxruntime.InferenceSession``. A
        model over 2 GiB keeps its tensors in ``<file name>.data`` beside it.
        StateError without an eval model; TrainingError for an unknown output.
        """
        save_model(self._read(lambda st: st.export_model(graph_output_names)), inference_model_path)

    def set_seed(self, seed: int) -> None:
        """Reseeds this session's random training-mode ops (Dropout)."""
        self._update(lambda st: st.set_seed(seed))

    def training_model_input_names(self) -> list[str]:
        """The training model's user inputs then labels (parameters and buffers excluded)."""
        return list(self._read(lambda st: st.program).input_names)

    def training_model_output_names(self) -> list[str]:
        """The training model's user outputs, loss first (gradient outputs excluded)."""
        return list(self._read(lambda st: st.program).output_names)

    def eval_model_input_names(self) -> list[str]:
        """The eval model's user inputs then labels; empty without an eval model."""
        program = self._read(lambda st: st.program)
        return list(program.eval_input_names) if program.has_eval_model else []

    def eval_model_output_names(self) -> list[str]:
        """The eval model's outputs; empty without an eval model."""
        program = self._read(lambda st: st.program)
        return list(program.eval_output_names) if program.has_eval_model else []

    # TrainingSessionGet{Training,Eval}Model{Input,Output}{Count,Name}
    def training_model_input_count(self) -> int:
        """The number of training model inputs (TrainingSessionGetTrainingModelInputCount)."""
        return len(self.training_model_input_names())

    def training_model_output_count(self) -> int:
        """The number of training model outputs (TrainingSessionGetTrainingModelOutputCount)."""
        return len(self.training_model_output_names())

    def eval_model_input_count(self) -> int:
        """The number of eval model inputs (TrainingSessionGetEvalModelInputCount)."""
        return len(self.eval_model_input_names())

    def eval_model_output_count(self) -> int:
        """The number of eval model outputs (TrainingSessionGetEvalModelOutputCount)."""
        return len(self.eval_model_output_names())

    def training_model_input_name(self, index: int) -> str:
        """The training model's input at ``index`` (TrainingSessionGetTrainingModelInputName); InputError when out of range."""
        return _indexed(self.training_model_input_names(), index, "training model input")

    def training_model_output_name(self, index: int) -> str:
        """The training model's output at ``index`` (TrainingSessionGetTrainingModelOutputName); InputError when out of range."""
        return _indexed(self.training_model_output_names(), index, "training model output")

    def eval_model_input_name(self, index: int) -> str:
        """The eval model's input at ``index`` (TrainingSessionGetEvalModelInputName); InputError when out of range."""
        return _indexed(self.eval_model_input_names(), index, "eval model input")

    def eval_model_output_name(self, index: int) -> str:
        """The eval model's output at ``index`` (TrainingSessionGetEvalModelOutputName); InputError when out of range."""
        return _indexed(self.eval_model_output_names(), index, "eval model output")

    @property
    def device(self) -> jax.Device:
        """The JAX device holding the state."""
        return self._read(lambda st: st.device)

    @property
    def train_state(self):
        """The current :class:`jaxort.training.TrainState` (None while nominal or once released)."""
        st = self._handle.session_state
        return None if self._released or st.owner is not self else st.values()

    @property
    def program(self):
        """The :class:`jaxort.training.TrainProgram` the session runs."""
        return self._program

    def release(self) -> None:
        """Frees the session's device buffers (ReleaseTrainingSession).

        The checkpoint state keeps the parameter values (copied to the host
        first), so it can be saved or used by a new session. Releasing twice
        is a no-op; any other call afterwards raises StateError.
        """
        if self._released:
            return
        self._released = True
        if self._handle.released:  # the state went first, and freed the buffers
            return
        old = self._handle.cell.step(lambda st: (st.detach(), st) if st.owner is self else (st, None))
        if old is not None:
            old.delete_buffers()

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
        self.release_checkpoint_state = release_checkpoint_state
        self.release_training_session = release_training_session
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

    Raises:
      InputError: an unsupported version (ORT returns NULL and prints a message).
    """
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or int(version) not in \
            SUPPORTED_API_VERSIONS:
        raise InputError(f"training API version {version!r} is not supported; jaxort provides versions "
                         f"{SUPPORTED_API_VERSIONS.start} to {SUPPORTED_API_VERSIONS.stop - 1}")
    return TrainingApi(int(version))
