"""Module, Optimizer and LinearLRScheduler of ``jaxort.api``.

Same names, signatures and behaviour as ``onnxruntime.training.api``
(ORT 1.19.2). A Module starts a session without an optimizer on its
:class:`CheckpointState`'s :class:`jaxort.training.SessionState`; an
:class:`Optimizer` adds one to it. Every method calls the training layer and
replaces the state's value. Facade code: it imports the training and graph
layers and must not be imported by the layers below.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import numpy as np
import onnx

from jaxort import training as _training
from jaxort.api._checkpoint_state import CheckpointState
from jaxort.api._ortvalue import OrtValue
from jaxort.errors import ArgumentTypeError, InputError, StateError
from jaxort.graph import resolve_device, save_model

__all__ = ["LinearLRScheduler", "Module", "Optimizer"]

PathLike = Union[str, os.PathLike]

_OWNER_MESSAGE = "the CheckpointState is now used by another Module"


class Module:
    """Runs the training and eval steps of ORT Training artifacts with JAX.

    Attributes:
      training: True in training mode (``__call__`` runs a train step),
        False in eval mode.

    Example:
      >>> state = CheckpointState.load_checkpoint("checkpoint")                      # doctest: +SKIP
      >>> module = Module("training_model.onnx", state, "eval_model.onnx")           # doctest: +SKIP
      >>> optimizer = Optimizer("optimizer_model.onnx", module)                      # doctest: +SKIP
      >>> loss = module(x, labels); optimizer.step(); module.lazy_reset_grad()       # doctest: +SKIP
    """

    training: bool

    def __init__(self, train_model_uri: Any, state: CheckpointState, eval_model_uri: Any = None,
                 device: str = "cpu", session_options: Any = None, *, mesh: Any = None,
                 strategy: str = "data", remat: Any = None) -> None:
        """Creates the module.

        Args:
          train_model_uri: the training model (a path; bytes or a ModelProto
            also work), from ORT's or jaxort's ``generate_artifacts``.
          state: the checkpoint state; the module shares it.
          eval_model_uri: the eval model, optional.
          device: ``"cpu"``, ``"cuda"``, ``"gpu"`` or ``"tpu"`` (optionally
            ``":<index>"``): the JAX device that holds the training state.
          session_options: accepted for compatibility and ignored (ORT
            SessionOptions configure ORT's executor).
          mesh: a ``jax.sharding.Mesh`` (axes "data" and/or "fsdp") to shard
            the training state over; batches are then split over its
            devices (see ``jaxort.training.shard``). None: one ``device``.
          strategy: "data" (parameters replicated) or "fsdp" (parameters,
            gradients and optimizer moments split along "fsdp").
          remat: rematerialise the forward pass in train steps (a jaxort
            extension; ``TrainProgram.from_artifacts``' option): None,
            ``"dots"``, ``"dots_no_batch"``, ``"nothing_saveable"`` or a
            ``jax.checkpoint`` policy. The same numbers, less memory on
            GPU/TPU for more compute.

        Raises:
          InputError: the device is unknown or not available.
          TrainingError: an unknown ``remat`` name.
        """
        if not isinstance(state, CheckpointState):
            raise ArgumentTypeError(f"state must be a jaxort.api.CheckpointState, got {type(state).__name__}")
        device = resolve_device(device)
        program = _training.PROGRAMS.get(_uri(train_model_uri), _uri(eval_model_uri), None,
                                         state.session_state.checkpoint, remat=remat)
        self.training = True
        self._state = state
        state.cell.update(lambda st: st.attach(program, device=device, owner=self, mesh=mesh, strategy=strategy))

    def _read(self, fn, optimizer: Any = None):
        """``fn(state)`` as one transaction on the CheckpointState's cell, once this Module owns it."""
        return self._state.cell.read(fn, owner=self, optimizer=optimizer, owner_message=_OWNER_MESSAGE)

    def _update(self, fn, optimizer: Any = None, deferring: bool = False) -> None:
        """Replaces the state by ``fn(state)``, once this Module owns it (``deferring``: see ``SessionCell``)."""
        self._state.cell.update(fn, owner=self, optimizer=optimizer, deferring=deferring,
                                owner_message=_OWNER_MESSAGE)

    def __call__(self, *user_inputs) -> Union[np.ndarray, tuple[np.ndarray, ...]]:
        """Runs a train step (training mode) or an eval step (eval mode).

        Args:
          *user_inputs: user inputs then labels: numpy or JAX arrays, or
            OrtValues (:class:`OrtValue` or onnxruntime's).

        Returns:
          One output when the model has one, else a tuple: numpy arrays, or
          :class:`OrtValue` when every input was an OrtValue (as ORT does).

        Raises:
          InputError: wrong inputs.
          StateError: eval mode without an eval model; nominal state.
        """
        ort_values, inputs = (), user_inputs
        for x in user_inputs:
            if type(x) is not np.ndarray:
                ort_values = [_is_ort_value(x) for x in user_inputs]
                inputs = tuple(x.numpy() if is_value else x for x, is_value in zip(user_inputs, ort_values))
                break
        if self.training:
            outputs = self._state.cell.step(lambda st: st.train_step(inputs), owner=self, deferring=True,
                                           owner_message=_OWNER_MESSAGE)
        else:
            outputs = self._read(lambda st: st.eval_step(inputs))
        if ort_values and all(ort_values):
            outputs = tuple(OrtValue(np.asarray(o)) for o in outputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def train_steps(self, *user_inputs) -> Union[np.ndarray, tuple[np.ndarray, ...]]:
        """Runs ``k`` iterations of ORT's training loop in one call (a jaxort extension).

        Each input holds ``k`` batches stacked along a new leading axis.
        Each batch runs the loop ``module(*batch); optimizer.step();
        scheduler.step(); module.lazy_reset_grad()`` (the scheduler step
        only when a :class:`LinearLRScheduler` is registered), with the
        numbers of those calls one by one; the gradients of the last batch
        stay. One compiled call runs the ``k`` steps, so a small model
        pays the cost of a call once, not once a step; it compiles once
        per ``k``.

        Args:
          *user_inputs: user inputs then labels, each ``(k, *batch_shape)``:
            numpy or JAX arrays, or OrtValues.

        Returns:
          The outputs stacked along the leading axis (shape ``(k, ...)``):
          one array when the model has one output, else a tuple.

        Raises:
          InputError: wrong inputs (their leading lengths differ, or a batch
            the train step refuses).
          StateError: eval mode, no :class:`Optimizer` for this module, a
            sharded module, or a nominal state.

        Example:
          >>> losses = module.train_steps(np.stack(xs), np.stack(labels))  # doctest: +SKIP
        """
        if not self.training:
            raise StateError("train_steps runs train steps: the module is in eval mode, call module.train()")
        inputs = tuple(x.numpy() if _is_ort_value(x) else x for x in user_inputs)
        outputs = self._state.cell.step(lambda st: st.train_steps(inputs), owner=self, deferring=True,
                                        owner_message=_OWNER_MESSAGE)
        return outputs[0] if len(outputs) == 1 else outputs

    def train(self, mode: bool = True) -> "Module":
        """Sets training mode (``mode=True``) or eval mode; returns self."""
        self.training = _flag(mode, "mode")
        return self

    def eval(self) -> "Module":
        """Sets eval mode; returns self."""
        return self.train(False)

    def lazy_reset_grad(self) -> None:
        """Makes the next train step overwrite the gradients instead of adding to them."""
        self._state.cell.update(_lazy_reset_grad, owner=self, deferring=True, owner_message=_OWNER_MESSAGE)

    def get_contiguous_parameters(self, trainable_only: bool = False) -> OrtValue:
        """The parameters as one float32 vector, in the training model's input order.

        An :class:`OrtValue`, as in ORT 1.19.2: ``.numpy()``, ``.shape()``,
        ``.data_type()`` and the other OrtValue methods work, and so does
        ``numpy.asarray``.

        Args:
          trainable_only: only trainable parameters.

        Raises:
          StateError: nominal state.
        """
        trainable_only = _flag(trainable_only, "trainable_only")
        # parameters_to_buffer returns a fresh array: the OrtValue takes it without a copy.
        return OrtValue._owning(self._read(lambda st: st.parameters_to_buffer(trainable_only)))

    def get_parameters_size(self, trainable_only: bool = True) -> int:
        """Number of parameter elements (works on nominal states)."""
        trainable_only = _flag(trainable_only, "trainable_only")
        return self._read(lambda st: st.parameters_size(trainable_only))

    def copy_buffer_to_parameters(self, buffer: Any, trainable_only: bool = True) -> None:
        """Sets the parameters from one float32 vector: an OrtValue (jaxort's or ORT's), numpy or JAX.

        With ``trainable_only=True`` frozen parameters are left as they are.
        On a nominal state this completes it (``trainable_only`` must be False).

        Raises:
          InputError: wrong size or dtype.
          StateError: ``trainable_only`` on a nominal state.
        """
        if _is_ort_value(buffer):
            buffer = buffer.numpy()
        trainable_only = _flag(trainable_only, "trainable_only")
        self._update(lambda st: st.buffer_to_parameters(buffer, trainable_only))

    def export_model_for_inferencing(self, inference_model_uri: PathLike,
                                     graph_output_names: Sequence[str]) -> None:
        """Writes an inference model: the eval graph up to ``graph_output_names``, parameters baked in.

        A model over 2 GiB is written with its tensors in ``<file name>.data``
        beside it (``jaxort.graph.save_model``), which onnxruntime loads.

        Raises:
          StateError: no eval model.
          TrainingError: an unknown output name.
        """
        path, names = _output_path(inference_model_uri), _names(graph_output_names)
        save_model(self._read(lambda st: st.export_model(names)), path)

    def input_names(self) -> list[str]:
        """User inputs then labels of the training model (eval model in eval mode)."""
        program = self._read(lambda st: st.program)
        if self.training:
            return list(program.input_names)
        return list(program.eval_input_names) if program.has_eval_model else []

    def output_names(self) -> list[str]:
        """User outputs of the training model (eval model in eval mode), loss first."""
        program = self._read(lambda st: st.program)
        if self.training:
            return list(program.output_names)
        return list(program.eval_output_names) if program.has_eval_model else []


class Optimizer:
    """Updates a Module's parameters from its accumulated gradients.

    The learning rate starts at 0.001 (ORT's default). When the state was
    loaded from a checkpoint saved with its optimizer state, the step and
    moments are restored and the learning rate is the group's saved initial
    learning rate (ORT 1.19.2 restores step and moments but starts at 0.001).

    A Module has one optimizer. A second ``Optimizer`` on the same Module
    takes over, as a second Module takes over a CheckpointState: it starts
    as the first one did (from the loaded checkpoint's optimizer group, else
    fresh), any scheduler is dropped, and the previous Optimizer and its
    LinearLRScheduler raise :class:`jaxort.errors.StateError` from then on,
    so two step counts never drive one state. Re-running a notebook cell
    that builds the optimizer thus restarts it, visibly.

    Beyond ORT: ``optimizer_uri`` may be any optax ``GradientTransformation``
    (``optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))``,
    ``optax.masked(...)``). Its learning rate is its own (a float or an optax
    schedule of its count); ``set_learning_rate`` and a LinearLRScheduler only
    reach transforms that read the ``learning_rate`` extra argument, such as
    ``jaxort.training.scale_by_ort_adamw(None)``. ``save_checkpoint(...,
    include_optimizer_state=True)`` saves its whole state in the optimizer
    group, every leaf named by its path in the state (``"1.0.mu"``; see
    ``jaxort.training.opt_state_to_checkpoint_states``), and an Optimizer
    built from the same transform on a Module over that checkpoint continues
    bit for bit; one built from another transform raises CheckpointError.
    ORT loads such a checkpoint's parameters and properties but its own
    optimizers cannot continue it.

    Example:
      >>> optimizer = Optimizer(optax.adamw(optax.linear_schedule(1e-3, 0.0, 100)), module)  # doctest: +SKIP
    """

    def __init__(self, optimizer_uri: Any, module: Module):
        """Creates the optimizer.

        Args:
          optimizer_uri: the optimizer model (AdamWOptimizer or SGDOptimizerV2),
            or an optax ``GradientTransformation``.
          module: the module to train.

        Raises:
          CheckpointError: the state's checkpoint holds optimizer state this
            optimizer cannot continue (another transform's, all entries named).
        """
        if not isinstance(module, Module):
            raise ArgumentTypeError(f"module must be a jaxort.api.Module, got {type(module).__name__}")
        self._module = module
        base, checkpoint = module._read(lambda st: (st.program, st.checkpoint))
        program = _training.PROGRAMS.get(base.training_model, base.eval_model, _uri(optimizer_uri), checkpoint,
                                         remat=base.remat)
        module._update(lambda st: st.with_optimizer(program, owner=self))

    def step(self) -> None:
        """Applies one optimizer step; gradients are kept.

        Raises:
          StateError: no train step has run yet (ORT 1.19.2 would step on
            zero gradients).
        """
        module = self._module
        module._state.cell.update(_optimizer_step, owner=module, optimizer=self, deferring=True,
                                  owner_message=_OWNER_MESSAGE)

    def set_learning_rate(self, learning_rate: float) -> None:
        """Sets the learning rate of the next steps."""
        self._module._update(lambda st: st.set_learning_rate(learning_rate), optimizer=self, deferring=True)

    def get_learning_rate(self) -> float:
        """The current learning rate (a float32 value)."""
        return self._module._read(lambda st: st.learning_rate(), optimizer=self)


class LinearLRScheduler:
    """Linear warmup from 0 to ``initial_lr``, then linear decay to 0.

    With ``n`` optimizer steps done::

        lr(n) = initial_lr * n / warmup_step_count                      if n < warmup_step_count
        lr(n) = initial_lr * max(0, (total_step_count - n)
                                    / max(1, total_step_count - warmup_step_count))  otherwise

    Creating the scheduler sets ``lr(n)`` at once; :meth:`step` recomputes it.

    Difference from ORT: onnxruntime-training 1.19.2's Python
    ``LinearLRScheduler`` swaps the two counts internally (its effective
    warmup is the ``total_step_count`` passed). jaxort follows the
    documented meaning, so to reproduce a script run on ORT 1.19.2 pass the
    counts swapped: ``LinearLRScheduler(opt, total, warmup, lr)``.
    """

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int,
                 initial_lr: float):
        """Registers the schedule on the optimizer and sets the learning rate.

        Args:
          optimizer: the optimizer.
          warmup_step_count: steps of linear warmup.
          total_step_count: the step at which the learning rate reaches 0.
          initial_lr: the peak learning rate (also what a saved checkpoint
            records as the initial learning rate).
        """
        if not isinstance(optimizer, Optimizer):
            raise ArgumentTypeError(f"optimizer must be a jaxort.api.Optimizer, got {type(optimizer).__name__}")
        self._optimizer = optimizer
        optimizer._module._update(lambda st: st.register_linear_lr_scheduler(
            warmup_step_count, total_step_count, initial_lr), optimizer=optimizer)

    def step(self) -> None:
        """Recomputes the learning rate from the optimizer's step count."""
        self._optimizer._module._update(lambda st: st.scheduler_step(), optimizer=self._optimizer,
                                        deferring=True)


# The steps of a training loop, as plain functions: ``Module._update`` would
# add a call and a closure to each (see SessionCell).
def _lazy_reset_grad(st):
    return st.lazy_reset_grad()


def _optimizer_step(st):
    return st.optimizer_step()


def _uri(uri: Any) -> Optional[Any]:
    if uri is None or isinstance(uri, (bytes, bytearray)):
        return uri
    if isinstance(uri, (str, os.PathLike)):
        return os.fspath(uri)
    return uri


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{what} must be a bool, got {value!r}")
    return bool(value)


def _output_path(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(f"inference_model_uri must be a path, got {type(value).__name__}")
    return os.fspath(value)


def _names(value: Any) -> list:
    # A bare string would be split into characters.
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or \
            not all(isinstance(n, str) for n in value):
        raise InputError(f"graph_output_names must be a list of str, got {value!r}")
    return list(value)


def _is_ort_value(x: Any) -> bool:
    """An OrtValue: jaxort's, or onnxruntime's (Python wrapper or C value)."""
    return isinstance(x, OrtValue) or (not isinstance(x, np.ndarray) and callable(getattr(x, "numpy", None))
                                       and callable(getattr(x, "data_type", None)))
