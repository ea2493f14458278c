"""TrainProgram: the compiled steps of one training setup, as pure functions.

A program holds what does not change during training (the traced training
and eval graphs, the optimizer transform, names) and the jitted steps. Every
step is a pure function of a :class:`TrainState`; the state argument is
donated, so callers must use the returned state (facades replace theirs).
Compiled code is cached per input shapes and dtypes: new batch contents or a
new learning rate never recompile, a new batch shape compiles once.
"""

from __future__ import annotations

import collections
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import onnx
import optax

from jaxort.errors import InputError, TrainingError
from jaxort.graph import JaxGraph, load_model
from jaxort.training.artifacts import read as ort_artifacts
from jaxort.training.optimizers import DEFAULT_LEARNING_RATE, OrtOptimizer, optimizer_from_model
from jaxort.training.precision import Policy, cast_model
from jaxort.training.state import (
    TrainState,
    restore_optimizer_state,
    state_from_checkpoint,
    state_to_checkpoint,
)

__all__ = ["TrainProgram"]

_STEPS = ("train_step", "eval_step", "optimizer_step", "train_and_update")


class TrainProgram:
    """Traced training/eval graphs plus an optimizer, with jitted pure steps.

    Build one with :meth:`from_artifacts`. A program is hashable by identity
    and holds no training state.

    Attributes:
      input_names: the training model's user inputs then labels.
      output_names: the training model's user outputs, the loss first.
      eval_input_names: the eval model's inputs (same as ``input_names``
        without an eval model).
      eval_output_names: the eval model's outputs.
      trainable_names: trainable parameters, graph order.
      frozen_names: frozen parameters, graph order.
      optimizer: the ``OrtOptimizer`` (``.optimizer_type`` "AdamW" or "SGD",
        ``.hyperparameters``, ``.transform``), or None.
      policy: the mixed-precision ``Policy`` or None.
      loss_fn: the JAX loss for models that end before the loss, or None.
      label_names: the labels ``loss_fn`` takes (empty without one).
      training_model: the training ``ModelProto`` as given.
      eval_model: the eval ``ModelProto`` or None.
    """

    def __init__(
        self,
        training_model: onnx.ModelProto,
        *,
        info: ort_artifacts.TrainingModelInfo,
        eval_model: onnx.ModelProto | None = None,
        eval_info: ort_artifacts.TrainingModelInfo | None = None,
        optimizer: OrtOptimizer | None = None,
        policy: Policy | None = None,
        loss_fn: Callable | None = None,
        label_names: Sequence[str] | None = None,
    ):
        """Builds a program; most users call :meth:`from_artifacts` instead.

        Args:
          training_model: the training model.
          info: what its inputs and outputs are.
          eval_model: the eval model, or None (eval then runs the training
            model's outputs in inference mode).
          eval_info: the eval model's ``TrainingModelInfo``.
          optimizer: the optimizer, or None.
          policy: a mixed-precision policy, or None for float32 everywhere.
          loss_fn: a JAX loss ``loss_fn(*model_outputs, *labels) -> scalar``
            for models that end before the loss (jaxort artifacts generated
            with a callable loss); None when the model's first output is the loss.
          label_names: the labels ``loss_fn`` takes after the model outputs;
            default its trailing parameter names.
        """
        self.training_model = training_model
        self.loss_fn = loss_fn
        self._n_graph_inputs = len(info.input_names)
        if loss_fn is not None and label_names is None:
            label_names = ort_artifacts.loss_label_names(loss_fn, len(info.output_names))
        self.label_names = list(label_names or ()) if loss_fn is not None else []
        self.eval_model = eval_model
        self.optimizer = optimizer
        self.policy = policy
        self.input_names = list(info.input_names) + self.label_names
        self.output_names = (["loss"] if loss_fn is not None else []) + list(info.output_names)
        self.trainable_names = list(info.trainable_names)
        self.frozen_names = list(info.frozen_names)
        self._train_graph = self._make_graph(training_model, info, policy)
        if eval_model is not None:
            if eval_info is None:
                raise TrainingError("eval_info is required with an eval model")
            self._eval_graph = self._make_graph(eval_model, eval_info, policy)
            self._eval_params = frozenset(eval_info.param_inputs + eval_info.param_initializers)
            self._n_eval_graph_inputs = len(eval_info.input_names)
            self.eval_input_names = list(eval_info.input_names) + self.label_names
            self.eval_output_names = (["loss"] if loss_fn is not None else []) + list(
                eval_info.output_names)
        else:
            self._eval_graph = self._train_graph
            self._eval_params = frozenset(info.param_inputs + info.param_initializers)
            self._n_eval_graph_inputs = self._n_graph_inputs
            self.eval_input_names = list(self.input_names)
            self.eval_output_names = list(self.output_names)
        self._traces = collections.Counter()
        self._jit_train = jax.jit(self._train_core, donate_argnums=0)
        self._jit_eval = jax.jit(self._eval_core)
        self._jit_opt = jax.jit(self._opt_core, donate_argnums=0)
        self._jit_fused = jax.jit(self._fused_core, donate_argnums=0)

    # ------------------------------------------------------------------ building

    @classmethod
    def from_artifacts(
        cls,
        training_model,
        eval_model=None,
        optimizer_model=None,
        *,
        checkpoint=None,
        parameter_names: Sequence[str] | None = None,
        policy: Policy | None = None,
        loss_fn: Callable | None = None,
        label_names: Sequence[str] | None = None,
    ) -> "TrainProgram":
        """Builds a program from ORT Training artifacts (or jaxort's).

        Args:
          training_model: ``training_model.onnx`` as a path, bytes or ModelProto.
          eval_model: ``eval_model.onnx`` or None.
          optimizer_model: ``optimizer_model.onnx``, an ``OrtOptimizer`` (e.g.
            ``adamw_optimizer()``), or None.
          checkpoint: a ``jaxort.checkpoint.Checkpoint`` whose parameter names tell
            parameters from user inputs, as ORT does. Needed when frozen
            parameters come before the first trainable one in the model's
            inputs (e.g. a frozen first layer); see
            ``ort_artifacts.describe_training_model``.
          parameter_names: the same information as a list of names.
          policy: a mixed-precision policy (e.g. ``bfloat16_policy()``).
          loss_fn: a JAX loss ``loss_fn(*model_outputs, *labels) -> scalar``
            when the training model ends before the loss (``generate_artifacts``
            with a callable loss). Steps then take the labels after the user
            inputs and return the loss first, then the model outputs.
          label_names: names of the labels ``loss_fn`` takes; default the ones
            the training model records, else its parameters without defaults
            after the model outputs.

        Returns:
          The program.

        Raises:
          TrainingError: unknown optimizer op, bad names, or a training model
            generated with a JAX loss given without ``loss_fn``.
          ModelError / UnsupportedOpError: the graphs cannot be traced.
        """
        train = load_model(training_model, check=False)
        custom = ort_artifacts.custom_loss(train)
        if custom is not None and loss_fn is None:
            raise TrainingError(
                f"this training model was generated with the JAX loss {custom[0]!r} and ends before "
                f"the loss; pass loss_fn= (the same callable, taking the labels {list(custom[1])})")
        if custom is not None and label_names is None and custom[1]:
            label_names = list(custom[1])
        if parameter_names is None and checkpoint is not None:
            parameter_names = list(checkpoint.trainable) + list(checkpoint.frozen)
        trainable = None
        if checkpoint is not None and not any(
                i.name.endswith(ort_artifacts.GRAD_BUFFER_SUFFIX) for i in train.graph.input):
            trainable = list(checkpoint.trainable)
        info = ort_artifacts.describe_training_model(
            train, parameter_names=parameter_names, trainable_names=trainable)
        eval_proto = eval_info = None
        if eval_model is not None:
            eval_proto = load_model(eval_model, check=False)
            names = list(info.trainable_names) + list(info.frozen_names)
            eval_info = ort_artifacts.describe_training_model(
                eval_proto, parameter_names=[n for n in names if _has_name(eval_proto, n)],
                trainable_names=[])
        if optimizer_model is None or isinstance(optimizer_model, OrtOptimizer):
            opt = optimizer_model
        else:
            opt = optimizer_from_model(load_model(optimizer_model, check=False))
        return cls(train, info=info, eval_model=eval_proto, eval_info=eval_info,
                   optimizer=opt, policy=policy, loss_fn=loss_fn, label_names=label_names)

    def _make_graph(self, model, info, policy) -> JaxGraph:
        sliced = ort_artifacts.slice_model(model, info.output_names, keep_inputs=info.input_names)
        if policy is not None:
            sliced = cast_model(sliced, policy.compute_dtype)
        params = list(info.param_initializers)
        names = {i.name for i in sliced.graph.input}
        param_inputs = [p for p in info.param_inputs if p in names]
        return JaxGraph(sliced, params=params, param_inputs=param_inputs,
                        inputs=list(info.input_names), outputs=list(info.output_names),
                        check=False)

    # ------------------------------------------------------------------ facts

    @property
    def has_eval_model(self) -> bool:
        """Whether an eval model was given."""
        return self.eval_model is not None

    @property
    def has_optimizer(self) -> bool:
        """Whether an optimizer was given."""
        return self.optimizer is not None

    def trace_count(self, step: str | None = None) -> int:
        """How many times the steps were traced (each trace is a compilation).

        Args:
          step: one of "train_step", "eval_step", "optimizer_step",
            "train_and_update"; None counts all.

        Returns:
          The count.
        """
        if step is None:
            return sum(self._traces.values())
        if step not in _STEPS:
            raise ValueError(f"step must be one of {_STEPS}, got {step!r}")
        return self._traces[step]

    # ------------------------------------------------------------------ state

    def init_state(self, checkpoint, *, seed: int = 0) -> TrainState:
        """Builds the initial TrainState from a checkpoint.

        The learning rate is ORT's default for a fresh optimizer (0.001). If
        the checkpoint has an optimizer group, its step and moments are
        restored and, unlike ONNX Runtime 1.19.2 (which resets it to 0.001),
        the learning rate is set from the group's ``initial_learning_rate``.

        Args:
          checkpoint: a ``jaxort.checkpoint.Checkpoint``.
          seed: the PRNG seed for random training-mode ops.

        Returns:
          The state.

        Raises:
          CheckpointError: parameter names, shapes or moments do not match.
        """
        return state_from_checkpoint(
            checkpoint, self.optimizer, trainable_names=self.trainable_names,
            frozen_names=self.frozen_names, seed=seed,
            default_learning_rate=DEFAULT_LEARNING_RATE)

    def to_checkpoint(self, state: TrainState, include_optimizer_state: bool = True, *,
                      properties=None):
        """Converts a state to a ``jaxort.checkpoint.Checkpoint`` as ORT 1.19.2 saves it.

        Args:
          state: the state.
          include_optimizer_state: add the optimizer group ("group0") with
            the step, initial learning rate and ``momentum0``/``momentum1``.
          properties: the property bag to save (name -> int, float or str),
            e.g. the ``properties`` of the checkpoint the state came from.

        Returns:
          The checkpoint.
        """
        return state_to_checkpoint(state, self.optimizer, include_optimizer_state=include_optimizer_state,
                                   properties=properties)

    def add_optimizer_state(self, state: TrainState, optimizer_groups=()) -> TrainState:
        """Returns ``state`` with this program's optimizer state, fresh or from a checkpoint group.

        Parameters, gradients and the PRNG key are kept: this is how an
        optimizer joins a state made by a program without one (ORT's
        ``Optimizer(optimizer_model, module)``).

        Args:
          state: a state of a program over the same training model.
          optimizer_groups: a checkpoint's ``optimizer_groups``; the first one's
            step, moments and learning rate are restored.

        Returns:
          The new state.

        Raises:
          CheckpointError: the group's moments do not match the parameters.
        """
        return restore_optimizer_state(state, self.optimizer, tuple(optimizer_groups),
                                       default_learning_rate=DEFAULT_LEARNING_RATE)

    # ------------------------------------------------------------------ pure cores

    def _prepare_inputs(self, inputs):
        if self.policy is None:
            return inputs
        return tuple(self.policy.cast_to_compute(x) for x in inputs)

    def _all_params(self, params, frozen):
        merged = dict(params)
        merged.update(frozen)
        if self.policy is not None:
            merged = {k: self.policy.cast_to_compute(v) for k, v in merged.items()}
        return merged

    def _forward_grad(self, state: TrainState, inputs):
        rng, key = jax.random.split(state.rng)
        graph = self._train_graph
        labels = inputs[self._n_graph_inputs:]
        inputs = self._prepare_inputs(inputs[:self._n_graph_inputs])

        def loss_fn(params):
            outs, updates = graph.apply_with_updates(
                self._all_params(params, state.frozen), *inputs, rng=key, training=True)
            outs = self._add_loss(outs, labels)
            loss = outs[0]
            if jnp.ndim(loss) != 0 and jnp.size(loss) != 1:
                raise TrainingError(
                    f"the loss output {self.output_names[0]!r} must be a scalar, got shape "
                    f"{list(jnp.shape(loss))}")
            loss = jnp.reshape(loss, ()).astype(jnp.float32)
            return loss, (outs, updates)

        (_, (outs, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        outs = tuple(_to_output(o, self.policy) for o in outs)
        frozen = dict(state.frozen)
        params_upd = {}
        for name, value in updates.items():
            value = jax.lax.stop_gradient(value)
            if name in frozen:
                frozen[name] = value.astype(frozen[name].dtype)
            elif name in state.params:
                params_upd[name] = value.astype(state.params[name].dtype)
        return rng, grads, outs, frozen, params_upd

    def _train_core(self, state: TrainState, *inputs):
        self._traces["train_step"] += 1
        return self._train_apply(state, inputs)

    def _eval_core(self, state: TrainState, *inputs):
        self._traces["eval_step"] += 1
        graph = self._eval_graph
        labels = inputs[self._n_eval_graph_inputs:]
        inputs = self._prepare_inputs(inputs[:self._n_eval_graph_inputs])
        params = self._all_params(state.params, state.frozen)
        params = {k: v for k, v in params.items() if k in self._eval_params}
        outs = self._add_loss(graph.apply(params, *inputs, training=False), labels)
        return tuple(_to_output(o, self.policy) for o in outs)

    def _add_loss(self, outs, labels):
        """Prepends ``loss_fn(*outs, *labels)`` (in the output dtype) when there is one."""
        if self.loss_fn is None:
            return outs
        if self.policy is not None:
            outs = tuple(self.policy.cast_to_output(o) for o in outs)
        return (self.loss_fn(*outs, *labels),) + tuple(outs)

    def _opt_apply(self, state: TrainState) -> TrainState:
        if self.optimizer is None:
            raise TrainingError("this program has no optimizer model")
        updates, opt_state = self.optimizer.update(
            state.grads, state.opt_state, state.params, learning_rate=state.learning_rate)
        params = optax.apply_updates(state.params, updates)
        return state.replace(params=params, opt_state=opt_state)

    def _opt_core(self, state: TrainState) -> TrainState:
        self._traces["optimizer_step"] += 1
        return self._opt_apply(state)

    def _fused_core(self, state: TrainState, *inputs):
        self._traces["train_and_update"] += 1
        state, outs = self._train_apply(state, inputs)
        state = self._opt_apply(state)
        return state.replace(accumulate=jnp.zeros_like(state.accumulate)), outs

    def _train_apply(self, state: TrainState, inputs):
        rng, g, outs, frozen, params_upd = self._forward_grad(state, inputs)
        grads = {n: jnp.where(state.accumulate, state.grads[n] + g[n].astype(state.grads[n].dtype),
                              g[n].astype(state.grads[n].dtype)) for n in state.grads}
        params = dict(state.params)
        params.update(params_upd)
        return state.replace(params=params, frozen=frozen, grads=grads,
                             accumulate=jnp.ones_like(state.accumulate), rng=rng), outs

    # ------------------------------------------------------------------ public steps

    def _check_arity(self, inputs, names, what):
        if len(inputs) != len(names):
            raise InputError(
                f"{what} expects {len(names)} inputs {list(names)}, given {len(inputs)}")

    def train_step(self, state: TrainState, *inputs) -> tuple[TrainState, tuple]:
        """One forward/backward pass; gradients are added to (or overwrite) ``state.grads``.

        Args:
          state: the state (donated: use the returned one).
          *inputs: the user inputs and labels, in ``input_names`` order.

        Returns:
          ``(new_state, outputs)``; outputs are the user outputs, loss first.

        Raises:
          InputError: wrong number, shape or dtype of inputs.
        """
        self._check_arity(inputs, self.input_names, "train_step")
        return self._jit_train(state, *inputs)

    def eval_step(self, state: TrainState, *inputs) -> tuple:
        """Evaluates the eval model (inference mode) on a batch.

        Args:
          state: the state (not donated).
          *inputs: the eval model's inputs, in ``eval_input_names`` order.

        Returns:
          The eval model's outputs.
        """
        self._check_arity(inputs, self.eval_input_names, "eval_step")
        return self._jit_eval(state, *inputs)

    def optimizer_step(self, state: TrainState) -> TrainState:
        """Applies the optimizer to the accumulated gradients (they are kept).

        Args:
          state: the state (donated: use the returned one).

        Returns:
          The new state, ``step`` incremented.

        Raises:
          TrainingError: the program has no optimizer.
        """
        if self.optimizer is None:
            raise TrainingError("this program has no optimizer model")
        return self._jit_opt(state)

    def lazy_reset_grad(self, state: TrainState) -> TrainState:
        """Makes the next train step overwrite the gradients instead of adding to them.

        Args:
          state: the state.

        Returns:
          The new state (gradients unchanged until the next train step, as in ORT).
        """
        # zeros_like keeps the flag on the state's device (committed like the
        # rest of the state), so the next train step does not recompile.
        return state.replace(accumulate=jnp.zeros_like(state.accumulate))

    def train_and_update(self, state: TrainState, *inputs) -> tuple[TrainState, tuple]:
        """``train_step``, ``optimizer_step`` and ``lazy_reset_grad`` in one compiled call.

        Args:
          state: the state (donated: use the returned one).
          *inputs: the user inputs and labels.

        Returns:
          ``(new_state, outputs)``.
        """
        if self.optimizer is None:
            raise TrainingError("this program has no optimizer model")
        self._check_arity(inputs, self.input_names, "train_and_update")
        return self._jit_fused(state, *inputs)

    def __repr__(self) -> str:
        opt = self.optimizer.optimizer_type if self.optimizer else None
        return (f"TrainProgram(inputs={self.input_names}, outputs={self.output_names}, "
                f"trainable={len(self.trainable_names)}, frozen={len(self.frozen_names)}, "
                f"optimizer={opt})")


def _to_output(value, policy):
    if policy is not None:
        return policy.cast_to_output(value)
    return value


def _has_name(model: onnx.ModelProto, name: str) -> bool:
    g = model.graph
    return any(i.name == name for i in g.input) or any(t.name == name for t in g.initializer)
