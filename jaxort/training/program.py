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

import collections
import functools
import threading
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import InputError, JaxortError, TrainingError
from jaxort.graph import JaxGraph, load_model
from jaxort.graph._values import NodeKey
from jaxort.training.artifacts import read as ort_artifacts
from jaxort.training.layout import ParameterLayout
from jaxort.training.packing import PackedState, Packing, cleared, pack, unpack
from jaxort.training.optimizers import (DEFAULT_LEARNING_RATE, OptaxOptimizer, OrtOptimizer, _is_ort_state,
                                        as_optimizer, optimizer_from_model)
from jaxort.training.precision import Policy, cast_model, compute_names
from jaxort.training.sharding import Placement, gather, placement_of
from jaxort.training.state import (
    TrainState,
    apply_schedule,
    restore_optimizer_state,
    set_learning_rate,
    state_from_checkpoint,
    state_to_checkpoint,
)

__all__ = ["TrainProgram"]

_STEPS = ("train_step", "eval_step", "optimizer_step", "train_and_update", "train_step_after")


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
    """

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
        """
        self.training_model = training_model
        self.fuse = bool(fuse)
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
        self._low_precision: dict = {}  # id(model) -> names the cast graph takes in the compute dtype
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
        self._train_inputs = _InputChecker(training_model, info, self.input_names, self.layout)
        self._eval_inputs = self._train_inputs
        if eval_model is not None:
            self._eval_inputs = _InputChecker(eval_model, eval_info, self.eval_input_names, self.layout)
        self._traces = collections.Counter()
        self._jit_train = jax.jit(self._train_core, donate_argnums=0)
        self._jit_eval = jax.jit(self._eval_core)
        self._jit_opt = jax.jit(self._opt_core, donate_argnums=0)
        self._jit_fused = jax.jit(self._fused_core, donate_argnums=0)
        self._jits: dict = {}
        self._jits_lock = threading.Lock()
        # (packing, schedule, flags) -> (compiled "after" step, its flag arguments); read without the lock.
        self._after_calls: dict = {}

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
        opt = None if optimizer_model is None else as_optimizer(optimizer_model)
        if optimizer_model is not None and opt is None:
            opt = optimizer_from_model(load_model(optimizer_model, check=False))
        return cls(train, info=info, eval_model=eval_proto, eval_info=eval_info,
                   optimizer=opt, policy=policy, loss_fn=loss_fn, label_names=label_names, fuse=fuse)

    def _make_graph(self, model, info, policy) -> JaxGraph:
        sliced = ort_artifacts.slice_model(model, info.output_names, keep_inputs=info.input_names)
        if policy is not None:
            sliced = cast_model(sliced, policy.compute_dtype,
                                parameters=list(info.param_inputs) + list(info.param_initializers))
            self._low_precision[id(model)] = compute_names(sliced)
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

    # ------------------------------------------------------------------ pure cores

    def _low(self, eval: bool) -> frozenset:
        model = self.eval_model if eval and self.eval_model is not None else self.training_model
        return self._low_precision.get(id(model), frozenset())

    def _prepare_inputs(self, inputs, names, eval: bool = False):
        # Under a policy only the values the cast graph declares in the compute
        # dtype are cast; those it keeps in float32 (a float target read only by
        # the loss) stay float32.
        if self.policy is None:
            return inputs
        low = self._low(eval)
        return tuple(self.policy.cast_to_compute(x) if n in low else x for x, n in zip(inputs, names))

    def _all_params(self, params, frozen, eval: bool = False):
        merged = dict(params)
        merged.update(frozen)
        if self.policy is not None:
            low = self._low(eval)
            merged = {k: self.policy.cast_to_compute(v) if k in low else v for k, v in merged.items()}
        return merged

    def _forward_grad(self, state: TrainState, inputs):
        rng, key = jax.random.split(state.rng)
        # Folded per node on demand; when no node draws a key the state's key
        # stays as it was and XLA drops the split (a threefry loop per step).
        key = NodeKey(key)
        graph = self._train_graph
        labels = inputs[self._n_graph_inputs:]
        inputs = self._prepare_inputs(inputs[:self._n_graph_inputs], self.input_names)

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
        return (rng if key.uses else state.rng), grads, outs, frozen, params_upd

    def _train_core(self, state: TrainState, *inputs, micro_batches: int = 1):
        self._traces["train_step"] += 1
        return self._train_apply(state, inputs, micro_batches)

    def _eval_core(self, state: TrainState, *inputs):
        self._traces["eval_step"] += 1
        graph = self._eval_graph
        labels = inputs[self._n_eval_graph_inputs:]
        inputs = self._prepare_inputs(inputs[:self._n_eval_graph_inputs], self.eval_input_names, eval=True)
        params = self._all_params(state.params, state.frozen, eval=True)
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

    def _opt_apply(self, state: TrainState, flat: bool = False, when=None) -> TrainState:
        """The optimizer step; ``when`` (a bool array): the step where it is true, else ``state``.

        ``flat``: update every parameter as one concatenated vector (see
        :meth:`_flat_update_applies`); on a packed state whose parameters,
        gradients and moments each lie contiguous in the packed buffer, the
        concatenations are slices of it and the update is one loop.
        """
        if self.optimizer is None:
            raise TrainingError("this program has no optimizer model")
        if flat:
            return self._opt_apply_flat(state, when)
        updates, opt_state = self.optimizer.update(
            state.grads, state.opt_state, state.params, learning_rate=state.learning_rate)
        params = optax.apply_updates(state.params, updates)
        updated = state.replace(params=params, opt_state=opt_state)
        if when is None:
            return updated
        return jax.tree.map(lambda new, old: jnp.where(when, new, old), updated, state)

    def _opt_apply_flat(self, state: TrainState, when) -> TrainState:
        names = sorted(state.params)  # JAX's leaf order of a dict: the packed buffer's order
        shapes = [jnp.shape(state.params[n]) for n in names]
        ends = np.cumsum([int(np.prod(s, dtype=np.int64)) for s in shapes]).tolist()

        def join(tree):
            return {"all": jnp.concatenate([jnp.ravel(tree[n]) for n in names])}

        def split(flat):
            starts = [0] + ends[:-1]
            return {n: jax.lax.slice(flat["all"], (a,), (b,)).reshape(s)
                    for n, s, a, b in zip(names, shapes, starts, ends)}

        opt = self.optimizer
        trees = opt._moment_trees(state.opt_state)
        flat_opt = opt._with_state(state.opt_state, {m: join(t) for m, t in trees.items()},
                                   state.opt_state.count)
        params = join(state.params)
        updates, new_opt = opt.update(join(state.grads), flat_opt, params,
                                      learning_rate=state.learning_rate)
        new_params = optax.apply_updates(params, updates)
        count = new_opt.count
        new_trees = opt._moment_trees(new_opt)
        if when is not None:
            new_params = jax.tree.map(lambda new, old: jnp.where(when, new, old), new_params, params)
            new_trees = {m: {"all": jnp.where(when, t["all"], join(trees[m])["all"])}
                         for m, t in new_trees.items()}
            count = jnp.where(when, count, state.opt_state.count)
        opt_state = opt._with_state(state.opt_state, {m: split(t) for m, t in new_trees.items()}, count)
        return state.replace(params=split(new_params), opt_state=opt_state)

    def _flat_update_applies(self, packing: Packing) -> bool:
        """Whether the optimizer step over states packed with ``packing`` runs flat.

        It does when the optimizer is an ORT kernel's own transform (its
        update is elementwise, one formula for every parameter), every
        trainable parameter is float32, and the parameters, their
        gradients and each of their moments each lie contiguous, in the
        same order, in a packed buffer (``Packing.of`` packs a state's
        leaves in tree order, so they do when every trainable tensor is
        packed, whether they share one buffer or have one each).
        """
        opt = self.optimizer
        if not isinstance(opt, OrtOptimizer):
            return False
        slots = jax.tree.unflatten(packing.treedef, list(packing.slots))
        if not _is_ort_state(slots.opt_state) or not slots.params:
            return False
        trees = [slots.params, slots.grads, *opt._moment_trees(slots.opt_state).values()]
        runs = []
        for tree in trees:
            leaves = [tree[n] for n in slots.params]
            if any(group < 0 or np.dtype(dtype) != np.float32 for group, _, _, dtype in leaves):
                return False
            if len({group for group, _, _, _ in leaves}) != 1:
                return False
            sizes = [int(np.prod(shape, dtype=np.int64)) for _, _, shape, _ in leaves]
            offsets = [offset for _, offset, _, _ in leaves]
            if offsets != (offsets[0] + np.cumsum([0] + sizes[:-1], dtype=np.int64)).tolist():
                return False
            runs.append(sizes)
        return all(run == runs[0] for run in runs)

    def _opt_core(self, state: TrainState, flat: bool = False) -> TrainState:
        self._traces["optimizer_step"] += 1
        return self._opt_apply(state, flat=flat)

    def _fused_core(self, state: TrainState, *inputs, micro_batches: int = 1, flat: bool = False):
        self._traces["train_and_update"] += 1
        state, outs = self._train_apply(state, inputs, micro_batches)
        state = self._opt_apply(state, flat=flat)
        return state.replace(accumulate=jnp.zeros_like(state.accumulate)), outs

    def _after_core(self, state: TrainState, optimizer_step, set_rate, rate, schedule_step,
                    *inputs, schedule=None, select=False, flat=False, overwrite=False):
        self._traces["train_step_after"] += 1
        if self.optimizer is not None:
            if select:
                # A packed state whose trainable tensors are all packed: the
                # update is one fused loop over the packed buffer, and a
                # select keeps it so; a cond would split it into one buffer
                # per tensor again.
                state = self._opt_apply(state, flat=flat, when=optimizer_step)
            else:
                # A cond, not a select: a step without a pending optimizer step
                # (the first, or one of several accumulating) skips the update.
                state = jax.lax.cond(optimizer_step, self._opt_apply, lambda s: s, state)
            state = state.replace(learning_rate=jnp.where(set_rate, rate, state.learning_rate))
            if schedule is not None:
                scheduled = apply_schedule(state, schedule).learning_rate
                state = state.replace(learning_rate=jnp.where(schedule_step, scheduled, state.learning_rate))
        return self._train_apply(state, inputs, overwrite=overwrite)

    def _forward_grad_micro(self, state: TrainState, inputs, micro_batches: int):
        """``_forward_grad`` over ``micro_batches`` parts of the batch, in one ``lax.scan``.

        Micro-batch ``j`` holds rows ``j, j + k, j + 2k, ...`` (``k`` micro-batches):
        a reshape of the batch axis that leaves each device's rows on that
        device. The gradient is the mean of the micro-batch gradients, which
        for a mean loss is the gradient of the whole batch (what one train
        step over it gives); the loss is the mean of the micro-batch losses;
        outputs with the micro-batch rows come back in the batch's row order,
        other outputs are averaged. Random ops draw a new key per micro-batch
        and training-mode BatchNormalization updates its statistics once per
        micro-batch, in order.
        """
        k = int(micro_batches)
        batched = [jnp.ndim(x) > 0 for x in inputs]
        rows = next(int(jnp.shape(x)[0]) for x, b in zip(inputs, batched) if b) // k
        split = tuple(jnp.swapaxes(jnp.reshape(x, (rows, k) + tuple(jnp.shape(x)[1:])), 0, 1)
                      for x, b in zip(inputs, batched) if b)

        def body(carry, xs):
            rng, frozen, params, total = carry
            it = iter(xs)
            micro = tuple(next(it) if b else x for x, b in zip(inputs, batched))
            rng, g, outs, frozen, upd = self._forward_grad(
                state.replace(rng=rng, frozen=frozen, params=params), micro)
            total = {n: total[n] + g[n].astype(total[n].dtype) for n in total}
            return (rng, frozen, {**params, **upd}, total), outs

        zeros = {n: jnp.zeros(jnp.shape(p), jnp.result_type(p)) for n, p in state.params.items()}
        (rng, frozen, params, total), outs = jax.lax.scan(
            body, (state.rng, state.frozen, state.params, zeros), split)
        grads = {n: g / k for n, g in total.items()}
        merged = []
        for o in outs:
            if jnp.ndim(o) >= 2 and jnp.shape(o)[1] == rows:
                merged.append(jnp.reshape(jnp.swapaxes(o, 0, 1), (rows * k,) + tuple(jnp.shape(o)[2:])))
            else:
                merged.append(jnp.mean(o.astype(jnp.float32), axis=0).astype(o.dtype)
                              if jnp.issubdtype(o.dtype, jnp.floating) else o[-1])
        upd = {n: v for n, v in params.items() if v is not state.params[n]}
        return rng, grads, tuple(merged), frozen, upd

    def _train_apply(self, state: TrainState, inputs, micro_batches: int = 1, overwrite: bool = False):
        """The train step; ``overwrite``: the gradients replace the accumulated ones whatever the flag."""
        if micro_batches == 1:
            rng, g, outs, frozen, params_upd = self._forward_grad(state, inputs)
        else:
            rng, g, outs, frozen, params_upd = self._forward_grad_micro(state, inputs, micro_batches)
        if overwrite:
            # Known when the program is compiled: the old gradients are not read.
            grads = {n: g[n].astype(state.grads[n].dtype) for n in state.grads}
        else:
            grads = {n: jnp.where(state.accumulate, state.grads[n] + g[n].astype(state.grads[n].dtype),
                                  g[n].astype(state.grads[n].dtype)) for n in state.grads}
        params = dict(state.params)
        params.update(params_upd)
        return state.replace(params=params, frozen=frozen, grads=grads,
                             accumulate=jnp.ones_like(state.accumulate), rng=rng), outs

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
            ``_forward_grad_micro`` for outputs and random ops.

        Returns:
          ``(new_state, outputs)``; outputs are the user outputs, loss first.

        Raises:
          InputError: wrong number, shape or dtype of inputs, labels out of
            range (see :meth:`check_inputs`), a batch that ``micro_batches``
            or the mesh's batch axes do not divide.
        """
        return self._run("train", state, self.check_inputs(inputs), micro_batches)

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
        return self._run("eval", state, self.check_inputs(inputs, eval=True))

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
        return self._run("opt", state, ())

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
        return self._run("fused", state, self.check_inputs(inputs), micro_batches)

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
        if (optimizer_step or schedule_step or learning_rate is not None) and self.optimizer is None:
            raise TrainingError("this program has no optimizer model")
        if schedule_step and schedule is None:
            raise TrainingError("schedule_step needs a schedule")
        inputs = self._train_inputs.check(inputs)
        if type(state) is PackedState:
            # The facades' loop runs this on every step: one cache lookup for
            # the compiled program and its flag arguments.
            key = (state.packing, schedule, bool(reset_grad), bool(optimizer_step), learning_rate is None,
                   bool(schedule_step))
            hit = self._after_calls.get(key)
            if hit is None:
                fn = self._packed_jit("after", state.packing, schedule, overwrite=bool(reset_grad))
                hit = self._after_calls.setdefault(key, (fn, self._after_flags(optimizer_step, None,
                                                                               schedule_step)))
            fn, flags = hit
            if learning_rate is not None:  # the rate is an argument of its own (the cached flags hold none)
                flags = self._after_flags(optimizer_step, learning_rate, schedule_step)
            return fn(state, *flags, *inputs)
        if placement_of(state) is not None:
            # On a mesh the calls run one by one, each with the state's shardings.
            if optimizer_step:
                state = self.optimizer_step(state)
            if learning_rate is not None:
                state = set_learning_rate(state, learning_rate)
            if schedule_step:
                state = apply_schedule(state, schedule)
            if reset_grad:
                state = self.lazy_reset_grad(state)
            return self._run("train", state, inputs)
        key = ("after", schedule, bool(reset_grad))
        with self._jits_lock:
            fn = self._jits.get(key)
        if fn is None:
            fn = jax.jit(functools.partial(self._after_core, schedule=schedule, overwrite=bool(reset_grad)),
                         donate_argnums=0)
            with self._jits_lock:
                fn = self._jits.setdefault(key, fn)
        return fn(state, *self._after_flags(optimizer_step, learning_rate, schedule_step), *inputs)

    def _after_flags(self, optimizer_step, learning_rate, schedule_step) -> tuple:
        """The value arguments of ``_after_core``: three flags and a rate.

        Arrays made once and reused: a numpy scalar argument costs a host to
        device copy on every call (~1.5 us each on CPU).
        """
        flags = (bool(optimizer_step), learning_rate is not None, bool(schedule_step))
        key = ("flags",) + flags
        with self._jits_lock:
            values = self._jits.get(key)
        if values is None:
            values = tuple(jax.device_put(np.bool_(f)) for f in flags) + (jax.device_put(np.float32(0.0)),)
            with self._jits_lock:
                values = self._jits.setdefault(key, values)
        optimizer, set_rate, schedule, rate = values
        if learning_rate is not None:
            rate = jax.device_put(np.float32(learning_rate))
        return optimizer, set_rate, rate, schedule

    # ------------------------------------------------------------------ dispatch

    def _run(self, kind: str, state, inputs: tuple, micro_batches: int = 1):
        """Runs one compiled step: the plain jit on one device, a sharded one on a mesh.

        A :class:`PackedState` runs the same step unpacked and packed again
        inside the compiled program (micro-batches: outside it) and comes
        back packed.
        """
        micro = _micro_batches(micro_batches, inputs, self.input_names)
        if isinstance(state, PackedState):
            if micro == 1:
                return self._packed_jit(kind, state.packing)(state, *inputs)
            new, outs = self._run(kind, unpack(state), inputs, micro)
            return pack(new, state.packing), outs
        mesh = placement_of(state)
        if mesh is None and micro == 1:
            plain = {"train": self._jit_train, "eval": self._jit_eval, "opt": self._jit_opt,
                     "fused": self._jit_fused}[kind]
            return plain(state, *inputs)
        if mesh is not None:
            placement = Placement(mesh)
            state = _onto_mesh(state, placement)
            names = self.eval_input_names if kind == "eval" else self.input_names
            inputs = placement.place_batch(inputs, names)
            state_sh = jax.tree.map(lambda x: x.sharding, state)
            input_sh = tuple(x.sharding for x in inputs)
            key = (kind, micro, jax.tree.structure(state), tuple(jax.tree.leaves(state_sh)), input_sh)
        else:
            placement = state_sh = input_sh = None
            key = (kind, micro)
        with self._jits_lock:
            fn = self._jits.get(key)
        if fn is None:
            fn = self._compile(kind, micro, placement, state_sh, input_sh)
            with self._jits_lock:
                fn = self._jits.setdefault(key, fn)
        return fn(state, *inputs)

    def _packed_jit(self, kind: str, packing: Packing, schedule=None, overwrite: bool = False):
        """The compiled step ``kind`` over states packed with ``packing`` (cached); ``overwrite``: see ``_after_core``."""
        key = ("packed", kind, packing, schedule, overwrite)
        with self._jits_lock:
            fn = self._jits.get(key)
        if fn is not None:
            return fn
        # A select runs the deferred optimizer step as one loop over the packed
        # buffer; with large tensors outside it, XLA's cond is faster (MLP
        # 784-500-10: select 1.95 ms, cond 1.59 ms a step; ResNet-18 at
        # widths 3-24, all packed: select 1.45 ms, cond 1.53 ms).
        slots = jax.tree.unflatten(packing.treedef, list(packing.slots))
        select = all(slot[0] >= 0 for slot in jax.tree.leaves(slots.params, is_leaf=lambda x: isinstance(x, tuple)))
        flat = self._flat_update_applies(packing)
        core = {"train": self._train_core, "fused": functools.partial(self._fused_core, flat=flat),
                "eval": self._eval_core, "opt": functools.partial(self._opt_core, flat=flat),
                "after": functools.partial(self._after_core, schedule=schedule, select=select,
                                           flat=flat, overwrite=overwrite)}[kind]

        def packed_core(packed, *args):
            out = core(packing.unpack(packed), *args)
            if kind == "eval":
                return out
            if kind == "opt":
                return packing.pack(out)
            return packing.pack(out[0]), out[1]

        fn = jax.jit(packed_core, **({} if kind == "eval" else {"donate_argnums": 0}))
        with self._jits_lock:
            return self._jits.setdefault(key, fn)

    def _compile(self, kind, micro, placement, state_sh, input_sh):
        core = {"train": functools.partial(self._train_core, micro_batches=micro),
                "fused": functools.partial(self._fused_core, micro_batches=micro),
                "eval": self._eval_core, "opt": self._opt_core}[kind]
        kwargs = {} if kind == "eval" else {"donate_argnums": 0}
        if placement is not None:
            outputs = placement.replicated
            kwargs["in_shardings"] = (state_sh, *input_sh)
            kwargs["out_shardings"] = {"train": (state_sh, outputs), "fused": (state_sh, outputs),
                                       "eval": outputs, "opt": state_sh}[kind]
        return jax.jit(core, **kwargs)

    def __repr__(self) -> str:
        opt = self.optimizer.optimizer_type if self.optimizer else None
        return (f"TrainProgram(inputs={self.input_names}, outputs={self.output_names}, "
                f"trainable={len(self.trainable_names)}, frozen={len(self.frozen_names)}, "
                f"optimizer={opt})")


def _micro_batches(micro_batches, inputs, names) -> int:
    """``micro_batches`` checked against the batch: a positive int dividing every batched input."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) or micro_batches < 1:
        raise InputError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    k = int(micro_batches)
    if k > 1:
        for name, x in zip(names, inputs):
            if np.ndim(x) > 0 and np.shape(x)[0] % k:
                raise InputError(f"input {name!r}: batch size {np.shape(x)[0]} is not divisible by "
                                 f"micro_batches={k}")
    return k


def _onto_mesh(state: TrainState, placement: Placement) -> TrainState:
    """``state`` with any leaf that left the mesh (e.g. a new learning rate) put back on it, replicated."""
    mesh = placement.mesh

    def fix(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh == mesh:
            return x
        return jax.device_put(np.asarray(x), placement.replicated) if jax.process_count() == 1 else \
            jax.make_array_from_callback(np.shape(x), placement.replicated, lambda i, v=np.asarray(x): v[i])
    return jax.tree.map(fix, state)


def _to_output(value, policy):
    if policy is not None:
        return policy.cast_to_output(value)
    return value


def _has_name(model: onnx.ModelProto, name: str) -> bool:
    g = model.graph
    return any(i.name == name for i in g.input) or any(t.name == name for t in g.initializer)


# Input validation ---------------------------------------------------------------------

# Loss ops that gather class labels, (domain, op type) -> index of the
# ignore_index input (the com.microsoft forms take it as an input), or None.
_LABEL_LOSSES = {
    ("", "SoftmaxCrossEntropyLoss"): None,
    ("", "NegativeLogLikelihoodLoss"): None,
    ("com.microsoft", "SoftmaxCrossEntropyLossInternal"): 3,
    ("com.microsoft", "NegativeLogLikelihoodLossInternal"): 3,
}
# Ops between a label input and the loss that keep the label values.
_SAME_VALUES = ("Identity", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _domain(node) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


def _label_checks(model: onnx.ModelProto, user_inputs) -> list:
    """``(input name, scores value, ignore_index or None)`` for each label loss fed by a user input."""
    producers = {o: n for n in model.graph.node for o in n.output if o}
    constants = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.attribute:
            if n.attribute[0].type == onnx.AttributeProto.TENSOR:
                constants[n.output[0]] = n.attribute[0].t
    checks = []
    for node in model.graph.node:
        key = (_domain(node), node.op_type)
        if key not in _LABEL_LOSSES or len(node.input) < 2:
            continue
        source = node.input[1]
        while source not in user_inputs and source in producers and \
                producers[source].op_type in _SAME_VALUES and _domain(producers[source]) == "":
            source = producers[source].input[0]
        if source not in user_inputs:
            continue
        ignore = None
        slot = _LABEL_LOSSES[key]
        if slot is None:
            for attr in node.attribute:
                if attr.name == "ignore_index":
                    ignore = int(attr.i)
        elif len(node.input) > slot and node.input[slot] in constants:
            ignore = int(onnx.numpy_helper.to_array(constants[node.input[slot]]).reshape(()))
        checks.append((source, node.input[0], ignore))
    return checks


def _static_class_counts(model: onnx.ModelProto, scores: set) -> dict:
    """scores value -> number of classes (dim 1), where shape inference makes it static."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001  inference is an optimisation here; the fallback traces
        return {}
    counts = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        dims = vi.type.tensor_type.shape.dim
        if vi.name in scores and len(dims) >= 2 and dims[1].HasField("dim_value"):
            counts[vi.name] = int(dims[1].dim_value)
    return counts


class _InputChecker:
    """Checks the user inputs and labels of one model before its compiled step runs."""

    def __init__(self, model: onnx.ModelProto, info, names: Sequence[str], layout: ParameterLayout):
        self.names = tuple(names)
        declared = {vi.name: vi.type.tensor_type for vi in model.graph.input
                    if vi.type.HasField("tensor_type")}
        self.specs = []
        for name in self.names:
            tt = declared.get(name)
            if tt is None:  # a label of a JAX loss_fn: the model does not declare it
                self.specs.append((name, None, None))
                continue
            dtype = np.dtype(to_numpy_dtype(tt.elem_type)) if tt.elem_type else None
            shape = None
            if tt.HasField("shape"):
                shape = tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
                              for d in tt.shape.dim)
            self.specs.append((name, shape, dtype))
        # (position among the inputs, name, scores, ignore_index) of each label checked.
        self.labels = tuple((self.names.index(name), name, scores, ignore)
                            for name, scores, ignore in _label_checks(model, set(self.names)))
        self._counts = _static_class_counts(model, {s for _, _, s, _ in self.labels}) if self.labels else {}
        self._model, self._info, self._layout = model, info, layout
        self._traced_counts: dict = {}
        self._lock = threading.Lock()
        # Signatures (type, dtype, shape of each input) that passed the checks
        # of _check_input unchanged: a batch like the previous ones skips them.
        self._passed: set = set()

    def check(self, inputs: tuple) -> tuple:
        if len(inputs) != len(self.names):
            raise InputError(f"the model takes {len(self.names)} inputs {list(self.names)}, "
                             f"given {len(inputs)}")
        try:
            signature = ()
            for x in inputs:  # a loop, not a comprehension: Python 3.11 gives that a frame of its own
                signature += ((type(x), x.dtype, x.shape),)
        except AttributeError:  # a list or a scalar: checked (and converted) below
            signature = None
        if signature is None or signature not in self._passed:
            out = tuple(_check_input(spec, x) for spec, x in zip(self.specs, inputs))
            if signature is not None and len(self._passed) < _PASSED_SIGNATURES and \
                    all(o is x for o, x in zip(out, inputs)):
                self._passed.add(signature)
            inputs = out
        if self.labels:
            self._check_labels(inputs)
        return inputs

    def _check_labels(self, inputs: tuple) -> None:
        for index, name, scores, ignore in self.labels:
            labels = inputs[index]
            if type(labels) is not np.ndarray:
                if isinstance(labels, jax.core.Tracer):
                    continue
                labels = np.asarray(labels)
            count = self._counts.get(scores) or self._traced_count(scores, inputs)
            if count is None:
                continue
            # One reduction settles the common case (every label valid) at a
            # fraction of the cost of the masks below, which name the culprits.
            if labels.size == 0 or _all_below(labels, count):
                continue
            bad = (labels < 0) | (labels >= count)
            if ignore is not None:
                bad &= labels != ignore
            if bad.any():
                where = np.argwhere(bad)
                first = tuple(int(i) for i in where[0])
                valid = f"0 to {count - 1}" + (f", or the ignore_index {ignore}" if ignore is not None else "")
                raise InputError(
                    f"input {name!r} has {len(where)} class label(s) out of range, e.g. {labels[first]} "
                    f"at index {list(first)}: the scores {scores!r} have {count} classes, so labels "
                    f"must be {valid}")

    def _traced_count(self, scores: str, inputs: tuple):
        """The class count from an abstract trace of the forward graph (symbolic dims), cached by shapes."""
        key = (scores,) + tuple((tuple(np.shape(x)), str(np.asarray(x).dtype) if not hasattr(x, "dtype")
                                 else str(x.dtype)) for x in inputs)
        with self._lock:
            if key in self._traced_counts:
                return self._traced_counts[key]
        graph_inputs = list(self._info.input_names)
        try:
            sliced = ort_artifacts.slice_model(self._model, [scores], keep_inputs=graph_inputs)
            names = {i.name for i in sliced.graph.input}
            graph = JaxGraph(sliced, params=list(self._info.param_initializers),
                             param_inputs=[p for p in self._info.param_inputs if p in names],
                             inputs=graph_inputs, outputs=[scores], check=False)
            params = {n: jax.ShapeDtypeStruct(self._layout.shapes[n], self._layout.dtypes[n])
                      for n in list(graph.params) + list(graph.param_inputs)}
            args = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in inputs[:len(graph_inputs)]]
            (shape,) = jax.eval_shape(graph.apply, params, *args)
            count = int(shape.shape[1])
        except (JaxortError, IndexError, KeyError):
            count = None
        with self._lock:
            self._traced_counts[key] = count
        return count


_UNSIGNED = {np.dtype(f"int{8 * n}"): np.dtype(f"uint{8 * n}") for n in (1, 2, 4, 8)}


# How many input signatures an _InputChecker remembers as checked.
_PASSED_SIGNATURES = 64

# Up to this many labels, _all_below compares them in Python.
_LIST_LABELS = 64


def _all_below(labels: np.ndarray, count: int) -> bool:
    """Whether every value of ``labels`` is in ``[0, count)``."""
    if labels.size <= _LIST_LABELS:
        # Run between two compiled steps, numpy's reductions and views cost
        # several times what they cost alone: the step has evicted numpy's
        # code and data from the caches (~30 us against ~11 us for 64 labels
        # as a list, one core; docs/benchmarks.md). The list's values are
        # exact Python numbers, so unsigned and 64-bit labels compare exactly.
        values = (labels if labels.ndim == 1 else labels.ravel()).tolist()
        return not values or (min(values) >= 0 and max(values) < count)
    unsigned = _UNSIGNED.get(labels.dtype)
    if unsigned is not None:  # seen as unsigned, a negative label is larger than any class count
        return int(np.maximum.reduce(labels.view(unsigned), axis=None)) < count
    return bool(labels.min() >= 0 and labels.max() < count)


def _check_input(spec, x):
    """``x`` checked against ``(name, shape, dtype)``; nested lists become numpy arrays of the declared dtype."""
    name, shape, dtype = spec
    if (type(x) is np.ndarray and dtype is not None and shape is not None and x.dtype == dtype
            and len(x.shape) == len(shape) and all(e == g for e, g in zip(shape, x.shape) if type(e) is int)):
        return x  # the common case; every other one is checked in full below
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        array = np.asarray(x) if isinstance(x, (list, tuple, int, float, bool)) else None
        if array is None or array.dtype == object:
            raise InputError(f"input {name!r}: expected an array"
                             + (f" of dtype {dtype} shape {_shape_text(shape)}" if dtype is not None else "")
                             + f", given {type(x).__name__}")
        if dtype is not None and array.dtype != dtype:
            if not (array.dtype.kind in "biu" and dtype.kind in "biuf" and (array.dtype.kind == "b") ==
                    (dtype.kind == "b")) and not (array.dtype.kind == "f" and dtype.kind == "f"):
                raise InputError(f"input {name!r}: expected dtype {dtype}, given a list of "
                                 f"{array.dtype} values")
            array = array.astype(dtype)
        x = array
    given = np.dtype(x.dtype)
    if dtype is not None and given != dtype:
        # JAX arrays cannot hold 64-bit values with JAX's 64-bit mode off:
        # an int32 jax.Array stands for an int64 input then, as inside jit.
        jax_narrowed = isinstance(x, jax.Array) and given == jax.dtypes.canonicalize_dtype(dtype)
        if not jax_narrowed:
            raise InputError(
                f"input {name!r}: expected dtype {dtype}, given {given}; ONNX Runtime refuses it too, and "
                f"jaxort does not convert silently: pass it as {dtype} (e.g. x.astype(np.{dtype.name}))")
    if shape is not None and (len(x.shape) != len(shape) or any(
            isinstance(e, int) and e != g for e, g in zip(shape, x.shape))):
        raise InputError(f"input {name!r}: expected shape {_shape_text(shape)} dtype {dtype}, given shape "
                         f"{list(x.shape)} dtype {given}")
    return x


def _shape_text(shape) -> str:
    return "any" if shape is None else str(list(shape))
