"""TrainProgram: the compiled steps of one training setup, as pure functions.

A program holds what does not change during training (the traced training
and eval graphs, the optimizer transform, names) and the jitted steps. Every
step is a pure function of a :class:`TrainState`; the state argument is
donated, so callers must use the returned state (facades replace theirs).
Compiled code is cached per input shapes and dtypes: new batch contents or a
new learning rate never recompile, a new batch shape compiles once.

A state placed on a device mesh (:func:`jaxort.training.shard`) runs the
same steps under ``jax.jit`` with the state's own shardings as input and
output shardings, and host batches split over the mesh's batch axes
(:mod:`jaxort.training.sharding`). ``train_step(..., micro_batches=k)``
accumulates the gradient of ``k`` micro-batches inside one compiled step.
Every step also takes a :class:`jaxort.training.PackedState` (the state's
small tensors in one buffer per dtype, :mod:`jaxort.training.packing`) and
then returns one: the same numbers to float32 rounding, in fewer buffers.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np
import onnx

from jaxort.errors import TrainingError
from jaxort.graph import JaxGraph, load_model
from jaxort.training.artifacts import read as ort_artifacts
from jaxort.training.compiled import CompiledSteps, StepKind
from jaxort.training.inputs import InputChecker, check_micro_batches
from jaxort.training.layout import ParameterLayout
from jaxort.training.optimizers import DEFAULT_LEARNING_RATE, OptaxOptimizer, OrtOptimizer, as_optimizer, \
    optimizer_from_model
from jaxort.training.packing import PackedState, cleared, unpack
from jaxort.training.pending import Pending, run_pending
from jaxort.training.precision import Policy, cast_model, compute_names
from jaxort.training.sharding import gather, placement_of
from jaxort.training.state import TrainState, restore_optimizer_state, state_from_checkpoint, state_to_checkpoint
from jaxort.training.step_cache import program_fingerprint
from jaxort.training.steps import Steps, remat_policy

__all__ = ["TrainProgram"]


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
        ``.hyperparameters``, ``.transform``), an ``OptaxOptimizer``
        (``.optimizer_type`` "optax"), or None.
      policy: the mixed-precision ``Policy`` or None.
      loss_fn: the JAX loss for models that end before the loss, or None.
      label_names: the labels ``loss_fn`` takes (empty without one).
      training_model: the training ``ModelProto`` as given.
      eval_model: the eval ``ModelProto`` or None.
      max_host_shapes: how many shapes of host ops' outputs (NonZero counts;
        ``JaxGraph.host``) the compiled steps are kept for; one more drops
        every compiled step, with a warning, and starts counting again.
    """

    max_host_shapes = 64

    def __init__(
        self,
        training_model: onnx.ModelProto,
        *,
        info: ort_artifacts.TrainingModelInfo,
        eval_model: onnx.ModelProto | None = None,
        eval_info: ort_artifacts.TrainingModelInfo | None = None,
        optimizer: OrtOptimizer | OptaxOptimizer | None = None,
        policy: Policy | None = None,
        loss_fn: Callable | None = None,
        label_names: Sequence[str] | None = None,
        fuse: bool = True,
        remat=None,
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
          fuse: run recognised subgraphs (layer norm, softmax and its loss,
            Gelu, attention) through the fused rules of ``jaxort.graph.patterns``;
            False runs every node op by op (``JaxGraph(fuse=...)``).
          remat: rematerialise the forward pass in train steps: None (keep
            every value the backward pass reads), ``"dots"`` (keep matrix
            products and convolutions, compute the rest again),
            ``"dots_no_batch"``, ``"nothing_saveable"``, or any
            ``jax.checkpoint`` policy. Less memory for more compute; the
            same gradients.

        Raises:
          TrainingError: an unknown ``remat`` name.
        """
        self.training_model = training_model
        self.fuse = bool(fuse)
        self.remat = remat
        remat_fn = remat_policy(remat)
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
        low_precision: dict = {}  # id(model) -> names the cast graph takes in the compute dtype
        train_graph = self._make_graph(training_model, info, policy, low_precision)
        if eval_model is not None:
            if eval_info is None:
                raise TrainingError("eval_info is required with an eval model")
            eval_graph = self._make_graph(eval_model, eval_info, policy, low_precision)
            eval_params = frozenset(eval_info.param_inputs + eval_info.param_initializers)
            n_eval_graph_inputs = len(eval_info.input_names)
            self.eval_input_names = list(eval_info.input_names) + self.label_names
            self.eval_output_names = (["loss"] if loss_fn is not None else []) + list(
                eval_info.output_names)
        else:
            eval_graph = train_graph
            eval_params = frozenset(info.param_inputs + info.param_initializers)
            n_eval_graph_inputs = len(info.input_names)
            self.eval_input_names = list(self.input_names)
            self.eval_output_names = list(self.output_names)
        self._train_inputs = InputChecker(training_model, info, self.input_names, self.layout)
        self._eval_inputs = self._train_inputs
        if eval_model is not None:
            self._eval_inputs = InputChecker(eval_model, eval_info, self.eval_input_names, self.layout)
        eval_low = low_precision.get(id(eval_model if eval_model is not None else training_model), frozenset())
        self._host_shapes: set = set()
        self._steps = CompiledSteps(Steps(
            train_graph=train_graph, eval_graph=eval_graph, eval_params=eval_params,
            n_graph_inputs=len(info.input_names), n_eval_graph_inputs=n_eval_graph_inputs,
            output_name=self.output_names[0] if self.output_names else "loss", optimizer=optimizer,
            policy=policy, low_precision=(low_precision.get(id(training_model), frozenset()), eval_low),
            input_names=self.input_names, eval_input_names=self.eval_input_names, loss_fn=loss_fn,
            remat=remat_fn),
            fingerprint=self._step_fingerprint)

    def _step_fingerprint(self) -> str | None:
        """What the traced steps depend on, for the step cache; None where Python code decides (a loss, optax)."""
        opt = self.optimizer
        if self.loss_fn is not None or (opt is not None and not getattr(opt, "described", False)):
            return None
        if self.remat is not None and not isinstance(self.remat, str):
            return None  # a policy function: Python code decides what the step keeps
        steps = self._steps.steps
        return program_fingerprint([self.training_model, self.eval_model], [
            None if opt is None else (opt.optimizer_type, sorted(opt.hyperparameters.items())),
            self.policy, self.fuse, self.remat, self.input_names, self.output_names, self.eval_input_names,
            self.eval_output_names, self.trainable_names, self.frozen_names, sorted(steps.eval_params),
            [sorted(names) for names in steps.low_precision]])

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
        fuse: bool = True,
        remat=None,
    ) -> "TrainProgram":
        """Builds a program from ORT Training artifacts (or jaxort's).

        Args:
          training_model: ``training_model.onnx`` as a path, bytes or ModelProto.
          eval_model: ``eval_model.onnx`` or None.
          optimizer_model: ``optimizer_model.onnx``, an ``OrtOptimizer`` (e.g.
            ``adamw_optimizer()``), any optax ``GradientTransformation`` (e.g.
            ``optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))``,
            wrapped in an :class:`OptaxOptimizer`: its learning rate is its own,
            its whole state is saved in checkpoints), an ``OptaxOptimizer``, or None.
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
          fuse: fused rules for recognised subgraphs (see ``__init__``).
          remat: rematerialisation of the forward pass in train steps (see ``__init__``).

        Returns:
          The program.

        Raises:
          TrainingError: unknown optimizer op or remat name, bad names, or a training model
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
        opt = None if optimizer_model is None else as_optimizer(optimizer_model)
        if optimizer_model is not None and opt is None:
            opt = optimizer_from_model(load_model(optimizer_model, check=False))
        return cls(train, info=info, eval_model=eval_proto, eval_info=eval_info,
                   optimizer=opt, policy=policy, loss_fn=loss_fn, label_names=label_names, fuse=fuse,
                   remat=remat)

    def _make_graph(self, model, info, policy, low_precision: dict) -> JaxGraph:
        sliced = ort_artifacts.slice_model(model, info.output_names, keep_inputs=info.input_names)
        if policy is not None:
            sliced = cast_model(sliced, policy.compute_dtype,
                                parameters=list(info.param_inputs) + list(info.param_initializers))
            low_precision[id(model)] = compute_names(sliced)
        params = list(info.param_initializers)
        names = {i.name for i in sliced.graph.input}
        param_inputs = [p for p in info.param_inputs if p in names]
        return JaxGraph(sliced, params=params, param_inputs=param_inputs,
                        inputs=list(info.input_names), outputs=list(info.output_names),
                        check=False, fuse=self.fuse)

    # ------------------------------------------------------------------ facts

    @functools.cached_property
    def layout(self) -> ParameterLayout:
        """The parameters' order, shapes and dtypes (ORT's buffer order)."""
        return ParameterLayout.from_model(self.training_model, self.trainable_names, self.frozen_names)

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

        A step read from the step cache (:mod:`jaxort.training.step_cache`)
        is not traced: :meth:`load_count` counts those.

        Args:
          step: one of "train_step", "eval_step", "optimizer_step",
            "train_and_update", "train_steps", "train_step_after"; None counts all.

        Returns:
          The count.
        """
        return _count(self._steps.traces, step)

    def load_count(self, step: str | None = None) -> int:
        """How many compiled steps were read from the step cache instead of traced.

        Args:
          step: as for :meth:`trace_count`.

        Returns:
          The count.
        """
        return _count(self._steps.loads, step)

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
            frozen_names=self.frozen_names, seed=seed, layout=self.layout,
            default_learning_rate=DEFAULT_LEARNING_RATE)

    def to_checkpoint(self, state: TrainState, include_optimizer_state: bool = True, *,
                      properties=None):
        """Converts a state to a ``jaxort.checkpoint.Checkpoint`` as ORT 1.19.2 saves it.

        Args:
          state: the state.
          include_optimizer_state: add the optimizer group ("group0") with
            the step, initial learning rate and ``momentum0``/``momentum1``
            (an optax transform's whole state, named by its paths).
          properties: the property bag to save (name -> int, float or str),
            e.g. the ``properties`` of the checkpoint the state came from.

        Returns:
          The checkpoint.
        """
        # A sharded state is gathered first (a collective: with several
        # processes, every one of them calls this), so its file is the same.
        return state_to_checkpoint(gather(state), self.optimizer,
                                   include_optimizer_state=include_optimizer_state, properties=properties)

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

    # ------------------------------------------------------------------ public steps

    def check_inputs(self, inputs: Sequence, *, eval: bool = False) -> tuple:
        """Validates a batch before a step; returns it ready for the compiled step.

        Done here, on the values the caller passed, rather than inside the
        jitted step: there JAX has already converted float64 to float32 and
        int64 to int32 (its 64-bit mode off), so neither the user's dtype nor
        a label like 2**40 can be seen, and a failure after the step would
        come after the donated state was consumed. A bad batch leaves the
        state untouched.

        Args:
          inputs: user inputs and labels, in ``input_names`` (or
            ``eval_input_names``) order: numpy or JAX arrays, or nested lists
            (converted to the declared dtype).
          eval: check against the eval model.

        Returns:
          The inputs, lists converted to numpy.

        Raises:
          InputError: a wrong count; a value that is not an array; a dtype
            other than the declared one (ORT refuses them too; the message
            says how to cast); a wrong rank or static dim; a class label out
            of range for a SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss
            (or their com.microsoft ``*Internal`` forms) that is not its
            ``ignore_index``.
        """
        return (self._eval_inputs if eval else self._train_inputs).check(tuple(inputs))

    def train_step(self, state: TrainState, *inputs, micro_batches: int = 1) -> tuple[TrainState, tuple]:
        """One forward/backward pass; gradients are added to (or overwrite) ``state.grads``.

        Args:
          state: the state (donated: use the returned one); on one device or
            placed on a mesh (:func:`jaxort.training.shard`).
          *inputs: the user inputs and labels, in ``input_names`` order. On
            a mesh, host arrays are this process's rows of the global batch.
          micro_batches: split the batch into this many micro-batches and
            accumulate their gradients in one compiled step (``lax.scan``);
            the result is one train step over the whole batch (the gradient
            of the mean loss is the mean of the micro-batch gradients). See
            ``Steps.forward_grad_micro`` for outputs and random ops.

        Returns:
          ``(new_state, outputs)``; outputs are the user outputs, loss first.

        Raises:
          InputError: wrong number, shape or dtype of inputs, labels out of
            range (see :meth:`check_inputs`), a batch that ``micro_batches``
            or the mesh's batch axes do not divide.
        """
        inputs = self.check_inputs(inputs)
        with_host = self._with_host(state, inputs, micro_batches=micro_batches)
        return self._steps.run(StepKind.TRAIN, state, with_host, self._micro(micro_batches, inputs))

    def eval_step(self, state: TrainState, *inputs) -> tuple:
        """Evaluates the eval model (inference mode) on a batch.

        Args:
          state: the state (not donated).
          *inputs: the eval model's inputs, in ``eval_input_names`` order.

        Returns:
          The eval model's outputs.

        Raises:
          InputError: see :meth:`check_inputs`.
        """
        return self._steps.run(StepKind.EVAL, state, self._with_host(state, self.check_inputs(inputs, eval=True),
                                                                    eval=True))

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
        return self._steps.run(StepKind.OPTIMIZER, state, ())

    def lazy_reset_grad(self, state: TrainState) -> TrainState:
        """Makes the next train step overwrite the gradients instead of adding to them.

        Args:
          state: the state.

        Returns:
          The new state (gradients unchanged until the next train step, as in ORT).
        """
        if isinstance(state, PackedState):
            # Writes the flag into a copy of its (small) buffer; the rest is shared.
            return cleared(state, "accumulate")
        # zeros_like keeps the flag on the state's device (committed like the
        # rest of the state), so the next train step does not recompile; on a
        # mesh the next step puts it back on the mesh if it left it.
        return state.replace(accumulate=jnp.zeros_like(state.accumulate))

    def train_and_update(self, state: TrainState, *inputs, micro_batches: int = 1) -> tuple[TrainState, tuple]:
        """``train_step``, ``optimizer_step`` and ``lazy_reset_grad`` in one compiled call.

        Args:
          state: the state (donated: use the returned one).
          *inputs: the user inputs and labels.
          micro_batches: as in :meth:`train_step`.

        Returns:
          ``(new_state, outputs)``.
        """
        if self.optimizer is None:
            raise TrainingError("this program has no optimizer model")
        inputs = self.check_inputs(inputs)
        with_host = self._with_host(state, inputs, micro_batches=micro_batches)
        return self._steps.run(StepKind.TRAIN_AND_UPDATE, state, with_host, self._micro(micro_batches, inputs))

    def train_steps(self, state: TrainState, *inputs,
                    schedule: Callable | None = None) -> tuple[TrainState, tuple]:
        """:meth:`train_and_update` over several batches in one compiled call.

        Each input holds ``k`` batches stacked along a new leading axis; the
        steps run in order inside one program (a ``lax.scan``), so a small
        model pays the per-call cost of a compiled call once for ``k``
        steps instead of once a step. The numbers are those of ``k`` calls
        of :meth:`train_and_update`. One device only (a sharded state:
        :meth:`train_and_update`).

        Args:
          state: the state (donated: use the returned one).
          *inputs: the user inputs and labels, each of shape ``(k, *batch_shape)``.
          schedule: a learning-rate schedule of the step count (see
            :func:`jaxort.training.apply_schedule`) applied after each
            optimizer step, as ORT's loop does with a scheduler step; None
            keeps the learning rate.

        Returns:
          ``(new_state, outputs)``, each output stacked: ``(k, *output_shape)``.

        Raises:
          InputError: inputs without one common leading length, or a batch
            :meth:`check_inputs` refuses.
          TrainingError: no optimizer model, or a sharded state.

        Example:
          >>> xs, ys = np.stack(x_batches), np.stack(label_batches)   # doctest: +SKIP
          >>> state, (losses,) = program.train_steps(state, xs, ys)    # doctest: +SKIP
        """
        if self.optimizer is None:
            raise TrainingError("this program has no optimizer model")
        if type(state) is not PackedState and placement_of(state) is not None:
            raise TrainingError("train_steps runs on one device: step a sharded state with train_and_update")
        if self._steps.steps.train_graph.host.nodes:
            raise TrainingError(
                "train_steps cannot stack batches of this model: the shapes of its host ops' outputs "
                f"({list(self._steps.steps.train_graph.host.names)}) depend on each batch's values; "
                "step it with train_and_update")
        inputs = self._train_inputs.check_stacked(tuple(inputs))
        return self._steps.run(StepKind.TRAIN_STEPS, state, inputs, schedule=schedule)

    def train_step_after(self, state: TrainState, *inputs, optimizer_step: bool = False,
                         learning_rate: float | None = None, schedule: Callable | None = None,
                         schedule_step: bool = False, reset_grad: bool = False) -> tuple[TrainState, tuple]:
        """Calls that precede a train step, then the train step, in one compiled call.

        Runs, in this order and each only when it is asked for,
        :meth:`optimizer_step`, ``set_learning_rate(state, learning_rate)``,
        ``apply_schedule(state, schedule)`` and
        :meth:`lazy_reset_grad`, then :meth:`train_step`, with the numbers
        those calls give one by one. This is what the session facades run
        for ORT's loop (train step, optimizer step, scheduler step or set
        learning rate, lazy reset): they defer the calls that follow a train
        step to the next one. The flags and the rate are values, not part of
        the compiled program: one compilation per ``schedule`` serves every
        combination of them, except ``reset_grad``: with it the program
        writes the new gradients without reading the accumulated ones (the
        read and the select cost the MLP 784-500-10 7% of a step), so a
        loop that resets before every step compiles one program and a loop
        that also accumulates two.

        Args:
          state: the state (donated: use the returned one).
          *inputs: the user inputs and labels.
          optimizer_step: apply the optimizer to the accumulated gradients first.
          learning_rate: a learning rate to set (after the optimizer step), or None.
          schedule: a learning-rate schedule of the step count (see
            :func:`jaxort.training.apply_schedule`), or None.
          schedule_step: set the learning rate from ``schedule`` (after the optimizer step).
          reset_grad: overwrite the gradients instead of adding to them (a
            separate compiled program; pass it also when the gradients are
            known not to be accumulating, e.g. a fresh state, to share it).

        Returns:
          ``(new_state, outputs)``, as :meth:`train_step`.

        Raises:
          InputError: see :meth:`check_inputs`.
          TrainingError: ``optimizer_step``, ``learning_rate`` or ``schedule_step`` without an optimizer.
        """
        return self.train_after(state, Pending(bool(optimizer_step), learning_rate is not None,
                                               0.0 if learning_rate is None else learning_rate,
                                               bool(schedule_step), bool(reset_grad)), *inputs, schedule=schedule)

    def train_after(self, state: TrainState, pending: Pending, *inputs,
                    schedule: Callable | None = None) -> tuple[TrainState, tuple]:
        """:meth:`train_step_after` with the calls given as one :class:`jaxort.training.pending.Pending`.

        Raises:
          InputError: see :meth:`check_inputs`.
          TrainingError: an optimizer step, learning rate or schedule step
            without an optimizer; a schedule step without a schedule.
        """
        if (pending.optimizer_step or pending.set_learning_rate or pending.schedule_step) and \
                self.optimizer is None:
            raise TrainingError("this program has no optimizer model")
        if pending.schedule_step and schedule is None:
            raise TrainingError("schedule_step needs a schedule")
        inputs = self._with_host(state, self._train_inputs.check(inputs))
        if type(state) is not PackedState and placement_of(state) is not None:
            # On a mesh the calls run one by one, each with the state's shardings.
            state = run_pending(state, pending, optimizer_step=self.optimizer_step,
                                lazy_reset_grad=self.lazy_reset_grad, schedule=schedule)
            return self._steps.run(StepKind.TRAIN, state, inputs)
        return self._steps.run_after(state, pending, inputs, schedule)

    def _with_host(self, state, inputs: tuple, *, eval: bool = False, micro_batches: int = 1) -> tuple:
        """``inputs``, followed for a graph with host ops by their outputs on this batch.

        The ops whose output shape depends on run-time values (NonZero,
        NonMaxSuppression; ``JaxGraph.host``) and the nodes they need run
        here, on the batch and, when they read any, the state's parameters;
        the compiled step takes their outputs as inputs and compiles once
        per their shapes.

        Raises:
          TrainingError: micro-batches or a state on a mesh with host ops.
        """
        steps = self._steps.steps
        graph = steps.eval_graph if eval else steps.train_graph
        if not graph.host.nodes:
            return inputs
        names = list(graph.host.names)
        if micro_batches != 1:
            raise TrainingError(f"micro_batches cannot split a batch of this model: the shapes of its host "
                                f"ops' outputs {names} depend on the whole batch's values")
        if type(state) is not PackedState and placement_of(state) is not None:
            raise TrainingError(f"a state on a mesh cannot run this model: its host ops' outputs {names} "
                                "depend on the values of the whole batch, which no process holds")
        params = {}
        if graph.host.params:
            whole = unpack(state) if type(state) is PackedState else state
            params = {**whole.params, **whole.frozen}
        n = steps.n_eval_graph_inputs if eval else steps.n_graph_inputs
        host = tuple(graph.host_values(params, *inputs[:n], training=not eval)[name] for name in names)
        shapes = (eval,) + tuple(np.shape(v) for v in host)
        if shapes not in self._host_shapes:
            if len(self._host_shapes) >= self.max_host_shapes:
                warnings.warn(f"the steps of this program were compiled for {len(self._host_shapes)} shapes of "
                              f"its host ops' outputs {names} (max_host_shapes); every compiled step is dropped "
                              "and compiles again as new shapes come", RuntimeWarning, stacklevel=3)
                self._steps.clear()
                self._host_shapes.clear()
            self._host_shapes.add(shapes)
        return tuple(inputs) + host

    def _micro(self, micro_batches, inputs) -> int:
        return check_micro_batches(micro_batches, inputs, self.input_names)

    def flat_update_applies(self, packing) -> bool:
        """Whether the optimizer step over states packed with ``packing`` updates every parameter as one vector."""
        return self._steps.flat_update_applies(packing)

    def __repr__(self) -> str:
        opt = self.optimizer.optimizer_type if self.optimizer else None
        return (f"TrainProgram(inputs={self.input_names}, outputs={self.output_names}, "
                f"trainable={len(self.trainable_names)}, frozen={len(self.frozen_names)}, "
                f"optimizer={opt})")


def _has_name(model: onnx.ModelProto, name: str) -> bool:
    g = model.graph
    return any(i.name == name for i in g.input) or any(t.name == name for t in g.initializer)


def _count(counter, step: str | None) -> int:
    """``counter``'s count for ``step`` (a StepKind value), or its total for None."""
    if step is None:
        return sum(counter.values())
    try:
        return counter[StepKind(step)]
    except ValueError:
        raise ValueError(f"step must be one of {tuple(k.value for k in StepKind)}, got {step!r}") from None
