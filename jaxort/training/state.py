"""TrainState: everything a training run holds, as one immutable JAX pytree.

A ``TrainState`` is what the pure steps of :class:`jaxort.training.TrainProgram`
take and return. Its leaves are arrays (parameters, gradient accumulators,
optimizer moments, counters, the learning rate, a PRNG key); the property bag
is static metadata. Change a state with :meth:`TrainState.replace` or the
helpers here; nothing is mutated in place.

Conversions to and from :class:`jaxort.checkpoint.CheckpointState` map the
optimizer moments to ORT's per-parameter ``momentum0`` / ``momentum1``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxort import checkpoint as ckpt_lib
from jaxort.errors import CheckpointError, TrainingError

__all__ = [
    "TrainState",
    "set_learning_rate",
    "set_initial_learning_rate",
    "set_seed",
    "apply_schedule",
    "state_from_checkpoint",
    "state_to_checkpoint",
]


class _Properties(Mapping):
    """A read-only, hashable property bag (name -> int, float or str)."""

    __slots__ = ("_items",)

    def __init__(self, items=()):
        if isinstance(items, Mapping):
            items = items.items()
        checked = []
        for name, value in items:
            if not isinstance(name, str):
                raise TrainingError(f"property names must be str, got {name!r}")
            if isinstance(value, (bool, np.bool_)) or not isinstance(
                    value, (int, float, str, np.integer, np.floating)):
                raise TrainingError(
                    f"property {name!r} must be an int, float or str, got {type(value).__name__}")
            if isinstance(value, np.integer):
                value = int(value)
            elif isinstance(value, np.floating):
                value = float(value)
            checked.append((name, value))
        self._items = tuple(checked)

    def __getitem__(self, key):
        for name, value in self._items:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self):
        return (name for name, _ in self._items)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(tuple((n, type(v).__name__, v) for n, v in self._items))

    def __eq__(self, other):
        if isinstance(other, _Properties):
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self):
        return repr(dict(self._items))


_LEAF_FIELDS = ("params", "frozen", "grads", "accumulate", "opt_state", "step",
                "learning_rate", "initial_learning_rate", "rng")


@dataclasses.dataclass(frozen=True)
class TrainState:
    """The state of a training run (an immutable, registered pytree).

    Attributes:
      params: trainable parameters, name -> array (ONNX initializer names).
      frozen: frozen parameters; training-mode BatchNormalization writes its
        running mean and variance here.
      grads: gradient accumulators, same names as ``params`` (ORT's
        ``<param>_grad.accumulation.buffer``).
      accumulate: bool scalar; False after ``lazy_reset_grad``, so the next
        train step overwrites ``grads`` instead of adding to them.
      opt_state: the optimizer transform's state (e.g. ``ScaleByOrtAdamWState``).
      step: int32 scalar, optimizer steps done (ORT's optimizer group step).
      learning_rate: float32 scalar used by the next optimizer step. Being a
        value, changing it never recompiles.
      initial_learning_rate: float32 scalar saved as the optimizer group's
        ``initial_learning_rate`` (ORT saves the learning rate the optimizer or
        its scheduler started from, not the current one).
      rng: PRNG key (uint32[2]) for random training-mode ops (Dropout); split
        on every train step.
      properties: the checkpoint's property bag (static metadata, not a leaf):
        name -> int, float or str.
    """

    params: dict
    frozen: dict
    grads: dict
    accumulate: Any
    opt_state: Any
    step: Any
    learning_rate: Any
    initial_learning_rate: Any
    rng: Any
    properties: Mapping = dataclasses.field(default_factory=_Properties)

    def __post_init__(self):
        if not isinstance(self.properties, _Properties):
            object.__setattr__(self, "properties", _Properties(self.properties))

    def replace(self, **changes) -> "TrainState":
        """Returns a copy with the given fields replaced.

        Example:
          >>> s2 = state.replace(properties={"epoch": 3})   # doctest: +SKIP
        """
        return dataclasses.replace(self, **changes)

    @property
    def parameters(self) -> dict:
        """All parameters: trainable then frozen."""
        out = dict(self.params)
        out.update(self.frozen)
        return out


def _flatten_with_keys(s: TrainState):
    children = tuple((jax.tree_util.GetAttrKey(f), getattr(s, f)) for f in _LEAF_FIELDS)
    return children, s.properties


def _flatten(s: TrainState):
    return tuple(getattr(s, f) for f in _LEAF_FIELDS), s.properties


def _unflatten(properties, children) -> TrainState:
    obj = object.__new__(TrainState)
    for f, v in zip(_LEAF_FIELDS, children):
        object.__setattr__(obj, f, v)
    object.__setattr__(obj, "properties", properties)
    return obj


jax.tree_util.register_pytree_with_keys(TrainState, _flatten_with_keys, _unflatten, _flatten)


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
    return state.replace(learning_rate=jnp.asarray(learning_rate, jnp.float32).reshape(()))


def set_initial_learning_rate(state: TrainState, learning_rate) -> TrainState:
    """Returns ``state`` with both the initial and the current learning rate set.

    This is what registering ORT's LinearLRScheduler does to the optimizer.

    Args:
      state: the state.
      learning_rate: a float.

    Returns:
      The new state.
    """
    lr = jnp.asarray(learning_rate, jnp.float32).reshape(())
    return state.replace(learning_rate=lr, initial_learning_rate=lr)


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


def _to_f32_scalar(x) -> jax.Array:
    return jnp.asarray(np.float32(x))


def state_from_checkpoint(ckpt, optimizer, *, trainable_names: Sequence[str],
                          frozen_names: Sequence[str], seed: int = 0,
                          default_learning_rate: float = 1e-3) -> TrainState:
    """Builds a TrainState from a ``jaxort.checkpoint.CheckpointState``.

    Args:
      ckpt: the checkpoint state.
      optimizer: an ``OrtOptimizer`` (or None: no optimizer state).
      trainable_names: the program's trainable parameter names.
      frozen_names: the program's frozen parameter names.
      seed: the PRNG seed.
      default_learning_rate: the learning rate when the checkpoint has no
        optimizer group (ORT's fresh optimizer uses 0.001).

    Returns:
      The state. When the checkpoint has an optimizer group, its step and
      moments are restored, and (unlike ORT 1.19.2, which starts at 0.001)
      the learning rate is set from its ``initial_learning_rate``.

    Raises:
      CheckpointError: a nominal checkpoint, or missing / extra / misplaced
        parameters or moments (all listed at once).
    """
    if getattr(ckpt, "is_nominal", False):
        raise CheckpointError("a nominal checkpoint has no parameter values to train from")
    problems = []
    params = {}
    frozen = {}
    all_params = dict(ckpt.trainable)
    all_params.update(ckpt.frozen)
    for name in trainable_names:
        if name not in all_params:
            problems.append(f"trainable parameter {name!r} is missing")
        else:
            params[name] = jnp.asarray(np.asarray(all_params[name]))
    for name in frozen_names:
        if name not in all_params:
            problems.append(f"frozen parameter {name!r} is missing")
        else:
            frozen[name] = jnp.asarray(np.asarray(all_params[name]))
    extra = [n for n in all_params if n not in params and n not in frozen]
    if extra:
        problems.append(f"the checkpoint has parameters the model does not use: {extra}")
    if problems:
        raise CheckpointError("checkpoint does not match the training model: " + "; ".join(problems))

    grads = {n: jnp.zeros(p.shape, p.dtype) for n, p in params.items()}
    lr = default_learning_rate
    initial_lr = default_learning_rate
    step = 0
    opt_state = optimizer.init(params) if optimizer is not None else ()
    groups = tuple(getattr(ckpt, "optimizer_groups", ()) or ())
    if optimizer is not None and groups:
        group = groups[0]
        step = int(group.step)
        initial_lr = float(group.initial_learning_rate)
        lr = initial_lr
        moments = {}
        states = group.states
        for mname in optimizer.moment_names:
            if optimizer.optimizer_type == "SGD":
                break  # SGDOptimizerV2 keeps no moments; ORT saves zeros
            tree = {}
            for pname, p in params.items():
                value = states.get(pname, {}).get(mname)
                if value is None:
                    problems.append(f"optimizer state {mname!r} of {pname!r} is missing")
                    continue
                value = np.asarray(value)
                if value.shape != p.shape:
                    problems.append(f"optimizer state {mname!r} of {pname!r} has shape "
                                    f"{list(value.shape)}, the parameter {list(p.shape)}")
                    continue
                tree[pname] = jnp.asarray(value, jnp.float32)
            moments[mname] = tree
        if problems:
            raise CheckpointError("checkpoint optimizer state does not match: " + "; ".join(problems))
        opt_state = optimizer.with_moments(opt_state, moments, step)
    return TrainState(
        params=params,
        frozen=frozen,
        grads=grads,
        accumulate=jnp.asarray(False),
        opt_state=opt_state,
        step=jnp.asarray(step, jnp.int32),
        learning_rate=_to_f32_scalar(lr),
        initial_learning_rate=_to_f32_scalar(initial_lr),
        rng=jax.random.PRNGKey(int(seed)),
        properties=dict(getattr(ckpt, "properties", {}) or {}),
    )


def state_to_checkpoint(state: TrainState, optimizer, *, include_optimizer_state: bool = True,
                        group_name: str = "group0"):
    """Converts a TrainState to a ``jaxort.checkpoint.CheckpointState``.

    Parameters and optimizer states are ordered by name, as ONNX Runtime
    1.19.2 writes them in the checkpoints it saves.

    Args:
      state: the state.
      optimizer: the program's ``OrtOptimizer`` (or None).
      include_optimizer_state: add the optimizer group ("group0", ORT's name):
        step, initial learning rate, and per parameter ``momentum0``
        (and ``momentum1`` for AdamW); SGD's ``momentum0`` is zeros, as ORT saves.
      group_name: the optimizer group name.

    Returns:
      The checkpoint state (numpy arrays).
    """
    trainable = {n: np.asarray(state.params[n]) for n in sorted(state.params)}
    frozen = {n: np.asarray(state.frozen[n]) for n in sorted(state.frozen)}
    groups = ()
    if include_optimizer_state and optimizer is not None:
        moments = optimizer.moments(state.opt_state)
        states = {}
        for pname in sorted(state.params):
            entry = {}
            for mname in optimizer.moment_names:
                tree = moments.get(mname)
                if tree is None:
                    entry[mname] = np.zeros(np.shape(state.params[pname]), np.float32)
                else:
                    entry[mname] = np.asarray(tree[pname])
            states[pname] = entry
        groups = (ckpt_lib.OptimizerGroup(
            name=group_name, step=int(state.step),
            initial_learning_rate=float(np.float32(state.initial_learning_rate)),
            states=states),)
    return ckpt_lib.CheckpointState(trainable=trainable, frozen=frozen, optimizer_groups=groups,
                                    properties=dict(state.properties))
