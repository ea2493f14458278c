"""The pure steps of a training program: ``state, inputs -> state, outputs``, uncompiled.

:class:`Steps` holds what the math needs (the traced training and eval
graphs, the optimizer transform, the mixed-precision policy, a JAX loss)
and nothing else: no caches, no jit, no counters. :mod:`jaxort.training.compiled`
compiles these functions for each state form and placement;
:class:`jaxort.training.TrainProgram` builds the graphs and is the public
face. Layer: training (imports the graph layer, nothing above training).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

from jaxort.errors import TrainingError
from jaxort.graph import JaxGraph, NodeKey
from jaxort.training.optimizers import OrtOptimizer, OptaxOptimizer, flat_update
from jaxort.training.pending import Pending, run_pending
from jaxort.training.precision import Policy
from jaxort.training.state import TrainState, apply_schedule

__all__ = ["REMAT_POLICIES", "Steps", "remat_policy"]

#: Names of ``jax.checkpoint`` policies for the ``remat`` option: what the backward pass keeps
#: of the forward's values (everything else is computed again).
REMAT_POLICIES = {
    "dots": jax.checkpoint_policies.checkpoint_dots,  # matrix products and convolutions
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # those without batch dims
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,  # nothing: all again
}


def remat_policy(remat) -> Optional[Callable]:
    """The ``jax.checkpoint`` policy a ``remat`` option names (None: no rematerialisation).

    Args:
      remat: None, a name of :data:`REMAT_POLICIES`, or a ``jax.checkpoint`` policy (a callable).

    Raises:
      TrainingError: an unknown name.
    """
    if remat is None or callable(remat):
        return remat
    if isinstance(remat, str) and remat in REMAT_POLICIES:
        return REMAT_POLICIES[remat]
    raise TrainingError(f"remat must be None, one of {sorted(REMAT_POLICIES)} or a jax.checkpoint policy, "
                        f"got {remat!r}")


class Steps:
    """The pure step functions of one training setup.

    Args:
      train_graph: the training graph up to the user outputs.
      eval_graph: the eval graph (the training graph without an eval model).
      eval_params: the parameter names the eval graph takes.
      n_graph_inputs / n_eval_graph_inputs: how many inputs the graphs take
        (the labels of ``loss_fn`` follow them).
      output_name: the loss output's name, for errors.
      optimizer: the optimizer, or None.
      policy: the mixed-precision policy, or None.
      low_precision: ``(train names, eval names)`` the cast graphs take in
        the compute dtype (under a policy).
      input_names / eval_input_names: the steps' inputs.
      loss_fn: a JAX loss over the model outputs and labels, or None.
      remat: a ``jax.checkpoint`` policy the forward pass is rematerialised
        with in train steps, segment by segment (``JaxGraph.apply_with_updates``),
        or None.
    """

    def __init__(self, *, train_graph: JaxGraph, eval_graph: JaxGraph, eval_params: frozenset,
                 n_graph_inputs: int, n_eval_graph_inputs: int, output_name: str,
                 optimizer: OrtOptimizer | OptaxOptimizer | None, policy: Optional[Policy],
                 low_precision: tuple, input_names: Sequence[str], eval_input_names: Sequence[str],
                 loss_fn: Optional[Callable], remat: Optional[Callable] = None):
        self.train_graph = train_graph
        self.eval_graph = eval_graph
        self.eval_params = eval_params
        self.n_graph_inputs = n_graph_inputs
        self.n_eval_graph_inputs = n_eval_graph_inputs
        self.output_name = output_name
        self.optimizer = optimizer
        self.policy = policy
        self.low_precision = low_precision
        self.input_names = tuple(input_names)
        self.eval_input_names = tuple(eval_input_names)
        self.loss_fn = loss_fn
        self.remat = remat

    # ------------------------------------------------------------------ forward and backward

    def _prepare_inputs(self, inputs, names, eval: bool = False):
        # Under a policy only the values the cast graph declares in the compute
        # dtype are cast; those it keeps in float32 (a float target read only by
        # the loss) stay float32.
        if self.policy is None:
            return inputs
        low = self.low_precision[eval]
        return tuple(self.policy.cast_to_compute(x) if n in low else x for x, n in zip(inputs, names))

    def _all_params(self, params, frozen, eval: bool = False):
        merged = dict(params)
        merged.update(frozen)
        if self.policy is not None:
            low = self.low_precision[eval]
            merged = {k: self.policy.cast_to_compute(v) if k in low else v for k, v in merged.items()}
        return merged

    def _output(self, value):
        return value if self.policy is None else self.policy.cast_to_output(value)

    def _add_loss(self, outs, labels):
        """Prepends ``loss_fn(*outs, *labels)`` (in the output dtype) when there is one."""
        if self.loss_fn is None:
            return outs
        if self.policy is not None:
            outs = tuple(self.policy.cast_to_output(o) for o in outs)
        return (self.loss_fn(*outs, *labels),) + tuple(outs)

    @staticmethod
    def split_host(graph: JaxGraph, inputs):
        """``(inputs, host)``: a step's arguments without the host ops' outputs that
        follow them (:meth:`JaxGraph.host_values`), and those as ``apply``'s ``host``."""
        n = len(graph.host.names)
        if not n:
            return inputs, None
        return inputs[:-n], dict(zip(graph.host.names, inputs[-n:]))

    def forward_grad(self, state: TrainState, inputs):
        """``(rng, grads, outputs, frozen, parameter updates)`` of one batch.

        ``inputs``: the user inputs and labels, then the outputs of the
        training graph's host ops when it has some.
        """
        rng, key = jax.random.split(state.rng)
        # Folded per node on demand; when no node draws a key the state's key
        # stays as it was and XLA drops the split (a threefry loop per step).
        key = NodeKey(key)
        graph = self.train_graph
        inputs, host = self.split_host(graph, inputs)
        labels = inputs[self.n_graph_inputs:]
        inputs = self._prepare_inputs(inputs[:self.n_graph_inputs], self.input_names)

        def loss_fn(params):
            outs, updates = graph.apply_with_updates(
                self._all_params(params, state.frozen), *inputs, rng=key, training=True, remat=self.remat,
                host=host)
            outs = self._add_loss(outs, labels)
            loss = outs[0]
            if jnp.ndim(loss) != 0 and jnp.size(loss) != 1:
                raise TrainingError(
                    f"the loss output {self.output_name!r} must be a scalar, got shape "
                    f"{list(jnp.shape(loss))}")
            loss = jnp.reshape(loss, ()).astype(jnp.float32)
            return loss, (outs, updates)

        (_, (outs, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        outs = tuple(self._output(o) for o in outs)
        frozen = dict(state.frozen)
        params_upd = {}
        for name, value in updates.items():
            value = jax.lax.stop_gradient(value)
            if name in frozen:
                frozen[name] = value.astype(frozen[name].dtype)
            elif name in state.params:
                params_upd[name] = value.astype(state.params[name].dtype)
        return (rng if key.uses else state.rng), grads, outs, frozen, params_upd

    def forward_grad_micro(self, state: TrainState, inputs, micro_batches: int):
        """:meth:`forward_grad` over ``micro_batches`` parts of the batch, in one ``lax.scan``.

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
            rng, g, outs, frozen, upd = self.forward_grad(
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

    # ------------------------------------------------------------------ steps

    def train(self, state: TrainState, inputs, micro_batches: int = 1, overwrite: bool = False):
        """The train step; ``overwrite``: the gradients replace the accumulated ones whatever the flag."""
        if micro_batches == 1:
            rng, g, outs, frozen, params_upd = self.forward_grad(state, inputs)
        else:
            rng, g, outs, frozen, params_upd = self.forward_grad_micro(state, inputs, micro_batches)
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

    def eval(self, state: TrainState, inputs):
        """The eval model's outputs in inference mode (``inputs`` as in :meth:`forward_grad`)."""
        inputs, host = self.split_host(self.eval_graph, inputs)
        labels = inputs[self.n_eval_graph_inputs:]
        inputs = self._prepare_inputs(inputs[:self.n_eval_graph_inputs], self.eval_input_names, eval=True)
        params = self._all_params(state.params, state.frozen, eval=True)
        params = {k: v for k, v in params.items() if k in self.eval_params}
        outs = self._add_loss(self.eval_graph.apply(params, *inputs, training=False, host=host), labels)
        return tuple(self._output(o) for o in outs)

    def optimizer_step(self, state: TrainState, flat: bool = False, when=None) -> TrainState:
        """The optimizer step; ``when`` (a bool array): the step where it is true, else ``state``.

        ``flat``: update every parameter as one concatenated vector
        (:func:`jaxort.training.optimizers.flat_update`); on a packed state
        whose parameters, gradients and moments each lie contiguous in the
        packed buffer, the concatenations are slices of it and the update
        is one loop.
        """
        if self.optimizer is None:
            raise TrainingError("this program has no optimizer model")
        if flat:
            params, opt_state = flat_update(self.optimizer, state.grads, state.opt_state, state.params,
                                            learning_rate=state.learning_rate, when=when)
            return state.replace(params=params, opt_state=opt_state)
        updates, opt_state = self.optimizer.update(
            state.grads, state.opt_state, state.params, learning_rate=state.learning_rate)
        params = optax.apply_updates(state.params, updates)
        updated = state.replace(params=params, opt_state=opt_state)
        if when is None:
            return updated
        return jax.tree.map(lambda new, old: jnp.where(when, new, old), updated, state)

    def train_and_update(self, state: TrainState, inputs, micro_batches: int = 1, flat: bool = False):
        """Train step, optimizer step and lazy reset."""
        state, outs = self.train(state, inputs, micro_batches)
        state = self.optimizer_step(state, flat=flat)
        return state.replace(accumulate=jnp.zeros_like(state.accumulate)), outs

    def train_steps(self, state: TrainState, inputs, flat: bool = False, schedule=None):
        """:meth:`train_and_update` once per batch of ``inputs`` stacked along a leading axis
        (a ``lax.scan``), each followed by ``apply_schedule(state, schedule)`` when a schedule
        is given; the outputs come back stacked the same way."""
        def step(s, batch):
            s, outs = self.train_and_update(s, batch, 1, flat=flat)
            return (s if schedule is None else apply_schedule(s, schedule)), outs
        return jax.lax.scan(step, state, tuple(inputs))

    def train_after(self, state: TrainState, pending: Pending, inputs, *, schedule=None,
                    select: bool = False, flat: bool = False):
        """The calls ``pending`` (array flags, ``reset_grad`` static), then a train step.

        ``select``: a pending optimizer step is selected elementwise rather
        than run under a ``cond``. On a packed state whose trainable tensors
        are all packed the update is then one fused loop over the packed
        buffer, which a cond would split into one buffer per tensor again;
        with large tensors outside it, a cond skips the update when no
        optimizer step is pending (the first step, or one of several
        accumulating), which is faster.
        """
        if self.optimizer is None:
            pending = Pending(reset_grad=pending.reset_grad)

        def optimizer_step(s, when):
            if select:
                return self.optimizer_step(s, flat=flat, when=when)
            return jax.lax.cond(when, self.optimizer_step, lambda x: x, s)

        state = run_pending(state, pending, optimizer_step=optimizer_step, schedule=schedule,
                            lazy_reset_grad=lambda s: s.replace(accumulate=jnp.zeros_like(s.accumulate)))
        return self.train(state, inputs, overwrite=pending.reset_grad)
