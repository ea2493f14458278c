"""TrainState: everything a training run holds, as one immutable JAX pytree.

A ``TrainState`` is what the pure steps of :class:`jaxort.training.TrainProgram`
take and return. Its leaves are arrays (parameters, gradient accumulators,
optimizer moments with the step count, the learning rate, a PRNG key). The
checkpoint's property bag stays outside it. Change a state with :meth:`TrainState.replace` or the
helpers here; nothing is mutated in place.

Conversions to and from :class:`jaxort.checkpoint.Checkpoint` map the
optimizer state to the group's per-parameter tensors through the optimizer
itself (``checkpoint_states`` / ``restore``): ORT's ``momentum0`` /
``momentum1`` for an ``OrtOptimizer``, every leaf of the state named by its
path for an ``OptaxOptimizer``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxort import checkpoint as ckpt_lib
from jaxort.errors import CheckpointError

__all__ = [
    "STATE_FIELDS",
    "TrainState",
    "set_learning_rate",
    "set_initial_learning_rate",
    "set_seed",
    "apply_schedule",
    "restore_optimizer_state",
    "state_from_checkpoint",
    "state_to_checkpoint",
]


@dataclasses.dataclass(frozen=True)
class TrainState:
    """The state of a training run (an immutable, registered pytree: every field is a leaf tree).

    Attributes:
      params: trainable parameters, name -> array (ONNX initializer names).
      frozen: frozen parameters; training-mode BatchNormalization writes its
        running mean and variance here.
      grads: gradient accumulators, same names as ``params`` (ORT's
        ``<param>_grad.accumulation.buffer``).
      accumulate: bool scalar; False after ``lazy_reset_grad``, so the next
        train step overwrites ``grads`` instead of adding to them.
      opt_state: the optimizer transform's state (e.g. ``ScaleByOrtAdamWState``);
        its ``count`` is the one step counter (see :attr:`step`).
      learning_rate: float32 scalar used by the next optimizer step. Being a
        value, changing it never recompiles.
      initial_learning_rate: float32 scalar saved as the optimizer group's
        ``initial_learning_rate`` (ORT saves the learning rate the optimizer or
        its scheduler started from, not the current one).
      rng: PRNG key (uint32[2]) for random training-mode ops (Dropout); split
        on every train step.

    The checkpoint's property bag is not part of the state: it is metadata
    that no step reads, kept beside the state by whoever saves it (see
    :meth:`jaxort.training.TrainProgram.to_checkpoint`).
    """

    params: dict
    frozen: dict
    grads: dict
    accumulate: Any
    opt_state: Any
    learning_rate: Any
    initial_learning_rate: Any
    rng: Any

    def replace(self, **changes) -> "TrainState":
        """Returns a copy with the given fields replaced.

        Example:
          >>> s2 = state.replace(learning_rate=jnp.float32(0.01))   # doctest: +SKIP
        """
        return dataclasses.replace(self, **changes)

    @property
    def parameters(self) -> dict:
        """All parameters: trainable then frozen."""
        out = dict(self.params)
        out.update(self.frozen)
        return out

    @property
    def step(self) -> jax.Array:
        """Optimizer steps done (ORT's optimizer group step): the optimizer state's ``count``.

        Zero when the state has no optimizer state.
        """
        count = _find_count(self.opt_state)
        return jnp.zeros((), jnp.int32) if count is None else count


def _find_count(tree):
    """The first ``count`` field of an optax state (NamedTuples, possibly nested), or None."""
    if hasattr(tree, "_fields"):
        if "count" in tree._fields:
            return tree.count
        tree = tuple(tree)
    if isinstance(tree, (tuple, list)):
        for item in tree:
            found = _find_count(item)
            if found is not None:
                return found
    return None


# TrainState's fields, in order: every one is a leaf tree.
STATE_FIELDS = tuple(field.name for field in dataclasses.fields(TrainState))

jax.tree_util.register_dataclass(TrainState, data_fields=list(STATE_FIELDS), meta_fields=[])


def set_learning_rate(state: TrainState, learning_rate) -> TrainState:
    """Returns ``state`` with a new learning rate (no recompilation).

    Like ORT's ``SetLearningRate``, this leaves ``initial_learning_rate``
    (what a checkpoint saves) unchanged.

    Args:
      state: the state.
      learning_rate: a float or float32 scalar.

    Returns:
      The new state.
    """
    # full_like keeps the value where the old one lives (a committed device
    # array stays committed), so the next step does not recompile.
    return state.replace(learning_rate=jnp.full_like(state.learning_rate, learning_rate, jnp.float32))


def set_initial_learning_rate(state: TrainState, learning_rate) -> TrainState:
    """Returns ``state`` with both the initial and the current learning rate set.

    This is what registering ORT's LinearLRScheduler does to the optimizer.

    Args:
      state: the state.
      learning_rate: a float.

    Returns:
      The new state.
    """
    return state.replace(
        learning_rate=jnp.full_like(state.learning_rate, learning_rate, jnp.float32),
        initial_learning_rate=jnp.full_like(state.initial_learning_rate, learning_rate, jnp.float32))


def set_seed(state: TrainState, seed: int) -> TrainState:
    """Returns ``state`` with its PRNG key reset from ``seed`` (ORT's SetSeed).

    Two runs from the same state and seed draw the same Dropout masks.

    Args:
      state: the state.
      seed: an integer seed.

    Returns:
      The new state.
    """
    return state.replace(rng=jax.random.PRNGKey(int(seed)))


def apply_schedule(state: TrainState, schedule) -> TrainState:
    """Returns ``state`` with ``learning_rate = schedule(state.step)``.

    Args:
      state: the state.
      schedule: any optax schedule of the optimizer step count, e.g.
        :func:`jaxort.training.linear_lr_schedule` or ``optax.cosine_decay_schedule``.

    Returns:
      The new state (a pure function: jit it or call it inside a jitted step).
    """
    return state.replace(learning_rate=jnp.asarray(schedule(state.step), jnp.float32).reshape(()))


# The largest group step a state can resume from: one more step must fit in int32.
_MAX_STEP = 2**31 - 2


def _to_f32_scalar(x) -> jax.Array:
    return _on_device(np.float32(x))


def _on_device(value) -> jax.Array:
    """A host array on the default device, its dtype as JAX takes it, without a compile.

    (``jnp.asarray`` and ``jnp.zeros`` compile a small program for each new
    shape: 35 of them, about 0.7 s, in a ResNet-18 session's first step.)
    """
    value = np.asarray(value)
    return jax.device_put(value.astype(jax.dtypes.canonicalize_dtype(value.dtype), copy=False))


def state_from_checkpoint(ckpt, optimizer, *, trainable_names: Sequence[str],
                          frozen_names: Sequence[str], seed: int = 0,
                          default_learning_rate: float = 1e-3, layout=None) -> TrainState:
    """Builds a TrainState from a ``jaxort.checkpoint.Checkpoint``.

    Args:
      ckpt: the checkpoint.
      optimizer: an ``OrtOptimizer`` or ``OptaxOptimizer`` (or None: no
        optimizer state).
      trainable_names: the program's trainable parameter names.
      frozen_names: the program's frozen parameter names.
      seed: the PRNG seed.
      default_learning_rate: the learning rate when the checkpoint has no
        optimizer group (ORT's fresh optimizer uses 0.001).
      layout: a :class:`jaxort.training.ParameterLayout`; when given, every
        parameter's shape and dtype must match it.

    Returns:
      The state. When the checkpoint has an optimizer group, its step and
      moments are restored, and (unlike ORT 1.19.2, which starts at 0.001)
      the learning rate is set from its ``initial_learning_rate``.

    Raises:
      CheckpointError: a nominal checkpoint, or missing / extra / misplaced
        parameters or moments, or parameters whose shape or dtype differ
        from ``layout`` (all listed at once).
    """
    if getattr(ckpt, "is_nominal", False):
        raise CheckpointError("a nominal checkpoint has no parameter values to train from")
    problems = []
    params = {}
    frozen = {}
    all_params = dict(ckpt.trainable)
    all_params.update(ckpt.frozen)
    for names, into, kind in ((trainable_names, params, "trainable"), (frozen_names, frozen, "frozen")):
        for name in names:
            if name not in all_params:
                problems.append(f"{kind} parameter {name!r} is missing")
            else:
                into[name] = _on_device(all_params[name])
    extra = [n for n in all_params if n not in params and n not in frozen]
    if extra:
        problems.append(f"the checkpoint has parameters the model does not use: {extra}")
    if problems:
        raise CheckpointError("checkpoint does not match the training model: " + "; ".join(problems))
    if layout is not None:
        layout.check_checkpoint(all_params)
    state = TrainState(
        params=params,
        frozen=frozen,
        grads={n: _on_device(np.zeros(p.shape, p.dtype)) for n, p in params.items()},
        accumulate=_on_device(np.bool_(False)),
        opt_state=(),
        learning_rate=_to_f32_scalar(default_learning_rate),
        initial_learning_rate=_to_f32_scalar(default_learning_rate),
        rng=jax.random.PRNGKey(int(seed)),
    )
    return restore_optimizer_state(state, optimizer, tuple(getattr(ckpt, "optimizer_groups", ()) or ()),
                                   default_learning_rate=default_learning_rate)


def restore_optimizer_state(state: TrainState, optimizer, groups: Sequence = (), *,
                            default_learning_rate: float = 1e-3) -> TrainState:
    """Returns ``state`` with the optimizer's state from a checkpoint's first optimizer group.

    Without a group the optimizer starts fresh at ``default_learning_rate``;
    with one, its step and moments are restored and the learning rate is the
    group's ``initial_learning_rate``. Parameters, gradients and the PRNG key
    are kept, so this also adds an optimizer to a state made without one.

    Args:
      state: the state.
      optimizer: an ``OrtOptimizer`` or ``OptaxOptimizer``, or None (the
        state then has none).
      groups: the checkpoint's ``optimizer_groups``.
      default_learning_rate: the learning rate of a fresh optimizer.

    Returns:
      The new state.

    Raises:
      CheckpointError: the group's moments do not match the parameters, or
        the step count they hold is not the group's step.
    """
    if optimizer is None:
        return state.replace(opt_state=())
    lr = default_learning_rate
    if groups:
        group = groups[0]
        # The step counts in int32 on the device (JAX's default integer), and
        # the next optimizer step must not wrap: refuse what cannot be counted.
        if not 0 <= int(group.step) <= _MAX_STEP:
            raise CheckpointError(
                f"optimizer group {group.name!r}: step {group.step} is outside the range jaxort trains "
                f"from, 0 to {_MAX_STEP}")
        opt_state = optimizer.restore(state.params, group.states, int(group.step))
        # An optax state restores its counts from its own tensors; the group's
        # step was written from the same count, so a difference is a damaged
        # or hand-edited file, and schedules would disagree about the step.
        count = _find_count(opt_state)
        if count is not None and int(count) != int(group.step):
            raise CheckpointError(
                f"optimizer group {group.name!r}: step {group.step}, but the optimizer state saved "
                f"with it counts {int(count)} steps")
        lr = float(group.initial_learning_rate)
    else:
        opt_state = optimizer.init(state.params)
    return state.replace(opt_state=opt_state, learning_rate=_to_f32_scalar(lr),
                         initial_learning_rate=_to_f32_scalar(lr))


def state_to_checkpoint(state: TrainState, optimizer, *, include_optimizer_state: bool = True,
                        group_name: str = "group0", properties=None):
    """Converts a TrainState to a ``jaxort.checkpoint.Checkpoint``.

    Parameters and optimizer states are ordered by name, as ONNX Runtime
    1.19.2 writes them in the checkpoints it saves.

    Args:
      state: the state.
      optimizer: the program's ``OrtOptimizer`` or ``OptaxOptimizer`` (or None).
      include_optimizer_state: add the optimizer group ("group0", ORT's name):
        step, initial learning rate, and the optimizer's per-parameter states
        (``momentum0``, and ``momentum1`` for AdamW; for an optax transform
        its whole state, see ``opt_state_to_checkpoint_states``).
      group_name: the optimizer group name.
      properties: the property bag to save with it (name -> int, float or str).

    Returns:
      The checkpoint (numpy arrays).
    """
    trainable = {n: np.asarray(state.params[n]) for n in sorted(state.params)}
    frozen = {n: np.asarray(state.frozen[n]) for n in sorted(state.frozen)}
    groups = ()
    if include_optimizer_state and optimizer is not None:
        groups = (ckpt_lib.OptimizerGroup(
            name=group_name, step=int(state.step),
            initial_learning_rate=float(np.float32(state.initial_learning_rate)),
            states=optimizer.checkpoint_states(state.opt_state, state.params)),)
    return ckpt_lib.Checkpoint(trainable=trainable, frozen=frozen, optimizer_groups=groups,
                               properties=dict(properties or {}))
