"""ONNX Runtime Training's optimizers as optax gradient transformations.

ORT runs its optimizer as a one-node ``optimizer_model.onnx``:
``com.microsoft::AdamWOptimizer`` or ``com.microsoft::SGDOptimizerV2``. The
transforms here reproduce those kernels (onnxruntime 1.19.2,
``orttraining/training_ops/cpu/optimizer``) operation by operation in float32,
so a jaxort run and an ORT run agree to float32 rounding:

AdamW, with ``t`` the 1-based step (ORT feeds ``group step + 1``), ``lr`` the
learning rate, ``g`` the gradient and float32 scalars ``ac = 1 - alpha**t``,
``bc = 1 - beta**t`` (both 1 when ``correct_bias`` is 0)::

    m = alpha * m + (1 - alpha) * g
    v = beta * v + (1 - beta) * g * g
    adam_mode 0 (PyTorch):      w = w - w * lr * wd                  (decay first)
                                w = w - (lr * m) / (ac * (sqrt(v / bc) + eps))
    adam_mode 1 (HuggingFace):  w = w - (lr * sqrt(bc) / ac) * m / (sqrt(v) + eps)
                                w = w - lr * wd * w                  (decay after)

SGDOptimizerV2: ``w = w - lr * g`` (no momentum, no weight decay; ORT still
saves a zero ``momentum0`` per parameter in its checkpoints).

Each transform is a ``optax.GradientTransformationExtraArgs``: its ``update``
takes the usual ``(updates, state, params)`` plus the keyword-only extra
arguments ``learning_rate`` (overrides the configured value) and ``step``
(the 1-based step ORT's kernel receives; by default the state's count + 1).
The returned updates are ``new_params - params``, to be added with
``optax.apply_updates``.

Any other optax transform (``optax.adamw``, chains with clipping, masking,
schedules) trains through :class:`OptaxOptimizer`. Its whole state goes into
a checkpoint's optimizer group by the generic mapping of
:func:`opt_state_to_checkpoint_states` / :func:`opt_state_from_checkpoint_states`:
every leaf becomes a named tensor of a parameter's optimizer state, named by
its path in the state pytree (``"1.0.mu"``), so a resumed run continues
bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax
from onnx import helper

from jaxort.errors import CheckpointError, TrainingError
from jaxort.training.optimizer_states import opt_state_from_checkpoint_states, opt_state_to_checkpoint_states

__all__ = [
    "ScaleByOrtAdamWState",
    "ScaleByOrtSgdState",
    "scale_by_ort_adamw",
    "scale_by_ort_sgd",
    "ort_adamw",
    "ort_sgd",
    "OrtOptimizer",
    "OptaxOptimizer",
    "as_optimizer",
    "opt_state_to_checkpoint_states",
    "opt_state_from_checkpoint_states",
    "adamw_optimizer",
    "sgd_optimizer",
    "optimizer_from_model",
    "flat_moments",
    "flat_update",
    "DEFAULT_LEARNING_RATE",
]

# The learning rate of a freshly built ORT optimizer (onnxruntime 1.19.2).
DEFAULT_LEARNING_RATE = 1e-3

ScalarOrSchedule = Union[float, jax.Array, Callable[[jax.Array], jax.Array], None]


class ScaleByOrtAdamWState(NamedTuple):
    """State of :func:`scale_by_ort_adamw`.

    Attributes:
      count: optimizer steps taken (int32 scalar).
      mu: first moments, ORT's ``momentum0`` (same tree as params).
      nu: second moments, ORT's ``momentum1``.
    """

    count: jax.Array
    mu: Any
    nu: Any


class ScaleByOrtSgdState(NamedTuple):
    """State of :func:`scale_by_ort_sgd`: just the step count (SGDOptimizerV2 keeps no moments)."""

    count: jax.Array


def _f32(x) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


def _resolve_lr(configured: ScalarOrSchedule, given, count) -> jax.Array:
    if given is not None:
        return _f32(given).reshape(())
    if configured is None:
        raise TrainingError(
            "this ORT optimizer transform was built without a learning rate; pass "
            "learning_rate=... to update()")
    if callable(configured):
        return _f32(configured(count)).reshape(())
    return _f32(configured).reshape(())


def _power(base: np.float32, step: jax.Array) -> jax.Array:
    """``base ** step`` in float32 for an integer ``step``.

    ORT 1.19.2 computes ``std::pow(float, int64)`` in double and rounds to
    float; float32 ``pow`` agrees with that to about one ulp.
    """
    return jnp.power(jnp.float32(base), step.astype(jnp.float32))


def _zeros_f32(p) -> jax.Array:
    """float32 zeros of ``p``'s shape; outside a trace made on the host (``jnp.zeros`` and
    ``jnp.copy`` compile a small program for each new shape: 34 for ResNet-18's moments)."""
    if isinstance(p, jax.core.Tracer):
        return jnp.zeros(jnp.shape(p), jnp.float32)
    return jax.device_put(np.zeros(np.shape(p), np.float32))


def scale_by_ort_adamw(
    learning_rate: ScalarOrSchedule = None,
    *,
    alpha: float = 0.9,
    beta: float = 0.999,
    epsilon: float = 1e-6,
    weight_decay: float = 0.0,
    adam_mode: int = 1,
    correct_bias: bool = True,
) -> optax.GradientTransformationExtraArgs:
    """ORT's ``com.microsoft::AdamWOptimizer`` kernel as an optax transform.

    Args:
      learning_rate: a float, an optax schedule of the step count, or None
        (then every ``update`` call must pass ``learning_rate=``).
      alpha: beta1 (the ``alpha`` attribute).
      beta: beta2 (the ``beta`` attribute).
      epsilon: added to the denominator.
      weight_decay: decoupled weight decay.
      adam_mode: 0 for PyTorch's AdamW (decay before the update, bias
        correction on the moments), 1 for HuggingFace's (bias correction folded
        into the learning rate, decay after the update).
      correct_bias: apply bias correction.

    Returns:
      A ``GradientTransformationExtraArgs`` whose update returns
      ``new_params - params``; ``params`` is required.

    Raises:
      TrainingError: an unsupported ``adam_mode``.

    Example:
      >>> tx = scale_by_ort_adamw(1e-3)
      >>> p = {"w": jnp.ones(3)}
      >>> u, s = tx.update({"w": jnp.ones(3)}, tx.init(p), p)
    """
    if adam_mode not in (0, 1):
        raise TrainingError(f"AdamWOptimizer adam_mode must be 0 or 1, got {adam_mode}")
    # ORT stores the attributes as float32 and computes in float32.
    a = np.float32(alpha)
    b = np.float32(beta)
    eps = np.float32(epsilon)
    wd = np.float32(weight_decay)
    one = np.float32(1.0)

    def init_fn(params):
        return ScaleByOrtAdamWState(jnp.zeros((), jnp.int32), jax.tree_util.tree_map(_zeros_f32, params),
                                    jax.tree_util.tree_map(_zeros_f32, params))

    def update_fn(updates, state, params=None, *, learning_rate=None, step=None, **extra):
        del extra
        if params is None:
            raise TrainingError("scale_by_ort_adamw needs params (decoupled weight decay)")
        lr = _resolve_lr(learning_rate_cfg, learning_rate, state.count)
        t = state.count + 1 if step is None else jnp.asarray(step).reshape(())
        if correct_bias:
            ac = one - _power(a, t)
            bc = one - _power(b, t)
        else:
            ac = jnp.float32(1.0)
            bc = jnp.float32(1.0)
        lr_corrected = lr * (jnp.sqrt(bc) / ac)

        def one_param(g, m, v, w):
            g = g.astype(jnp.float32)
            w32 = w.astype(jnp.float32)
            m = a * m + (one - a) * g
            v = b * v + ((one - b) * g) * g
            if adam_mode == 0:
                w_new = w32 - (w32 * lr) * wd
                denom = jnp.sqrt(v / bc) + eps
                w_new = w_new - (lr * m) / (ac * denom)
            else:
                denom = jnp.sqrt(v) + eps
                w_new = w32 - (lr_corrected * m) / denom
                w_new = w_new - (lr * wd) * w_new
            return (w_new - w32).astype(w.dtype), m, v

        flat = jax.tree_util.tree_map(one_param, updates, state.mu, state.nu, params)
        treedef = jax.tree_util.tree_structure(updates)
        leaves = treedef.flatten_up_to(flat)
        new_updates = treedef.unflatten([x[0] for x in leaves])
        mu = treedef.unflatten([x[1] for x in leaves])
        nu = treedef.unflatten([x[2] for x in leaves])
        return new_updates, ScaleByOrtAdamWState(state.count + 1, mu, nu)

    learning_rate_cfg = learning_rate
    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def scale_by_ort_sgd(learning_rate: ScalarOrSchedule = None) -> optax.GradientTransformationExtraArgs:
    """ORT's ``com.microsoft::SGDOptimizerV2`` kernel (``w - lr * g``) as an optax transform.

    Args:
      learning_rate: a float, an optax schedule of the step count, or None
        (then every ``update`` call must pass ``learning_rate=``).

    Returns:
      A ``GradientTransformationExtraArgs`` whose update returns
      ``new_params - params`` (``params`` is required, so that adding the
      update gives ORT's float32 result).

    Example:
      >>> tx = scale_by_ort_sgd(0.1)
      >>> p = {"w": jnp.ones(3)}
      >>> u, s = tx.update({"w": jnp.ones(3)}, tx.init(p), p)
    """
    learning_rate_cfg = learning_rate

    def init_fn(params):
        del params
        return ScaleByOrtSgdState(jnp.zeros((), jnp.int32))

    def update_fn(updates, state, params=None, *, learning_rate=None, step=None, **extra):
        del step, extra
        if params is None:
            raise TrainingError("scale_by_ort_sgd needs params")
        lr = _resolve_lr(learning_rate_cfg, learning_rate, state.count)

        def one_param(g, w):
            w32 = w.astype(jnp.float32)
            # ORT: delta = -lr * g; w = w + delta
            w_new = w32 + (-lr) * g.astype(jnp.float32)
            return (w_new - w32).astype(w.dtype)

        new_updates = jax.tree_util.tree_map(one_param, updates, params)
        return new_updates, ScaleByOrtSgdState(state.count + 1)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def ort_adamw(learning_rate: ScalarOrSchedule = DEFAULT_LEARNING_RATE, **kwargs) -> optax.GradientTransformationExtraArgs:
    """ORT's AdamW with a learning rate, ready for ``optax.apply_updates``.

    Same as :func:`scale_by_ort_adamw` (the learning rate is part of ORT's
    update formula, so there is no separate ``scale_by_learning_rate``).

    Args:
      learning_rate: a float or an optax schedule of the step count.
      **kwargs: the attributes of :func:`scale_by_ort_adamw`.

    Returns:
      The transform.
    """
    return scale_by_ort_adamw(learning_rate, **kwargs)


def ort_sgd(learning_rate: ScalarOrSchedule = DEFAULT_LEARNING_RATE) -> optax.GradientTransformationExtraArgs:
    """ORT's SGDOptimizerV2 with a learning rate (see :func:`scale_by_ort_sgd`).

    Args:
      learning_rate: a float or an optax schedule of the step count.

    Returns:
      The transform.
    """
    return scale_by_ort_sgd(learning_rate)


@dataclasses.dataclass(frozen=True, eq=False)
class OrtOptimizer:
    """An ORT optimizer node turned into an optax transform, with what it was made from.

    Each optimizer owns the mapping between its optax state and the
    per-parameter tensors of a checkpoint's optimizer group
    (:meth:`checkpoint_states`, :meth:`restore`). The step count is the
    transform's own ``count`` (optax's convention), saved as the group's step.
    A hand-built one whose transform's state is not the ORT kernel's own (the
    kernel chained with clipping, say) is saved whole, by the generic mapping
    of :func:`opt_state_to_checkpoint_states`.

    Attributes:
      optimizer_type: ``"AdamW"`` or ``"SGD"``.
      hyperparameters: the node's attributes (AdamW: alpha, beta, epsilon,
        weight_decay, adam_mode, correct_bias; SGD: none).
      transform: the ``GradientTransformationExtraArgs``; it takes the learning
        rate as an extra argument.
      moment_names: the checkpoint names of the per-parameter states ORT saves
        (``("momentum0", "momentum1")`` for AdamW, ``("momentum0",)`` for SGD).
      described: whether ``optimizer_type`` and ``hyperparameters`` say all
        the transform does (true of :func:`adamw_optimizer`,
        :func:`sgd_optimizer` and :func:`optimizer_from_model`; a hand-built
        transform may do more). Steps over an optimizer so described may be
        saved in the step cache (:mod:`jaxort.training.step_cache`).
    """

    optimizer_type: str
    hyperparameters: dict
    transform: optax.GradientTransformationExtraArgs
    moment_names: tuple
    described: bool = False

    def init(self, params):
        """``transform.init``."""
        return self.transform.init(params)

    def update(self, updates, state, params=None, **extra_args):
        """``transform.update``."""
        return self.transform.update(updates, state, params, **extra_args)

    def checkpoint_states(self, opt_state, params: Mapping) -> dict:
        """The per-parameter states ORT saves: ``{param: {moment name: numpy array}}``, sorted by name.

        A state that is not the ORT kernel's own (a hand-built optimizer whose
        transform chains other optax transforms around it) is saved whole by
        :func:`opt_state_to_checkpoint_states` instead: ORT's names would keep
        only part of it.

        Args:
          opt_state: the transform's state.
          params: the trainable parameters (their names and shapes).
        """
        if not _is_ort_state(opt_state):
            return opt_state_to_checkpoint_states(opt_state, params)
        trees = self._moment_trees(opt_state)
        out = {}
        for pname in sorted(params):
            out[pname] = {m: np.asarray(trees[m][pname]) if m in trees
                          # ORT 1.19.2 saves a zero momentum0 for SGDOptimizerV2, which keeps none.
                          else np.zeros(np.shape(params[pname]), np.float32)
                          for m in self.moment_names}
        return out

    def restore(self, params: Mapping, states: Mapping, step: int):
        """The transform's state for ``params`` from a checkpoint group's states and step.

        Args:
          params: the trainable parameters.
          states: ``{param: {moment name: array}}`` (an ``OptimizerGroup.states``).
          step: the group's step count.

        Returns:
          The optax state.

        Raises:
          CheckpointError: missing moments or moments of the wrong shape (all listed).
        """
        opt_state = self.init(params)
        if not _is_ort_state(opt_state):
            return _restore_by_path(self, params, states)
        names = [m for m in self.moment_names if m in self._moment_trees(opt_state)]
        problems, trees = [], {m: {} for m in names}
        for mname in names:
            for pname, p in params.items():
                value = states.get(pname, {}).get(mname)
                if value is None:
                    problems.append(f"optimizer state {mname!r} of {pname!r} is missing")
                elif tuple(np.shape(value)) != tuple(np.shape(p)):
                    problems.append(f"optimizer state {mname!r} of {pname!r} has shape "
                                    f"{list(np.shape(value))}, the parameter {list(np.shape(p))}")
                else:
                    trees[mname][pname] = jnp.asarray(np.asarray(value), jnp.float32)
        if problems:
            raise CheckpointError("checkpoint optimizer state does not match: " + "; ".join(problems))
        return self._with_state(opt_state, trees, jnp.asarray(step, jnp.int32))

    def _moment_trees(self, opt_state) -> dict:
        if isinstance(opt_state, ScaleByOrtAdamWState):
            return {"momentum0": opt_state.mu, "momentum1": opt_state.nu}
        return {}

    def _with_state(self, opt_state, trees: dict, count):
        if isinstance(opt_state, ScaleByOrtAdamWState):
            return ScaleByOrtAdamWState(count, trees["momentum0"], trees["momentum1"])
        return opt_state._replace(count=count)


def _is_ort_state(opt_state) -> bool:
    """Whether ``opt_state`` is the state of an ORT kernel transform itself (saved under ORT's names)."""
    return isinstance(opt_state, (ScaleByOrtAdamWState, ScaleByOrtSgdState))


def flat_moments(optimizer, opt_state) -> Optional[dict]:
    """The per-parameter trees of ``opt_state`` that :func:`flat_update` concatenates, or None where it does not apply.

    It applies to an ORT kernel's own transform (:class:`OrtOptimizer` with
    its own state): its update is elementwise, one formula for every
    parameter, so the parameters can be updated as one vector.

    Args:
      optimizer: the optimizer.
      opt_state: its state (or any tree of the same structure, e.g. of slots).

    Returns:
      ``{moment name: {param: leaf}}`` (empty for SGD), or None.
    """
    if not isinstance(optimizer, OrtOptimizer) or not _is_ort_state(opt_state):
        return None
    return optimizer._moment_trees(opt_state)


def flat_update(optimizer: "OrtOptimizer", grads: Mapping, opt_state, params: Mapping, *, learning_rate,
                when=None) -> tuple[dict, Any]:
    """The optimizer step with every parameter, gradient and moment concatenated into one vector.

    The same numbers as ``optimizer.update`` then ``optax.apply_updates``
    (the update is elementwise). When the tensors already lie contiguous in
    one buffer (a packed state, :mod:`jaxort.training.packing`), the
    concatenations are slices of it and XLA makes the update one loop.

    Args:
      optimizer: an optimizer that :func:`flat_moments` accepts.
      grads, opt_state, params: the gradients, optimizer state and parameters.
      learning_rate: the learning rate (float32 scalar).
      when: a bool scalar array: the new values where it is true, the old
        ones elsewhere (the step count included); None: always.

    Returns:
      ``(new params, new optimizer state)``.
    """
    names = sorted(params)  # JAX's leaf order of a dict
    shapes = [jnp.shape(params[n]) for n in names]
    ends = np.cumsum([int(np.prod(s, dtype=np.int64)) for s in shapes]).tolist()

    def join(tree):
        return {"all": jnp.concatenate([jnp.ravel(tree[n]) for n in names])}

    def split(flat):
        starts = [0] + ends[:-1]
        return {n: jax.lax.slice(flat["all"], (a,), (b,)).reshape(s)
                for n, s, a, b in zip(names, shapes, starts, ends)}

    trees = flat_moments(optimizer, opt_state)
    flat_state = optimizer._with_state(opt_state, {m: join(t) for m, t in trees.items()}, opt_state.count)
    flat_params = join(params)
    updates, new_state = optimizer.update(join(grads), flat_state, flat_params, learning_rate=learning_rate)
    new_params = optax.apply_updates(flat_params, updates)
    count = new_state.count
    new_trees = optimizer._moment_trees(new_state)
    if when is not None:
        new_params = jax.tree.map(lambda new, old: jnp.where(when, new, old), new_params, flat_params)
        new_trees = {m: {"all": jnp.where(when, t["all"], join(trees[m])["all"])} for m, t in new_trees.items()}
        count = jnp.where(when, count, opt_state.count)
    return split(new_params), optimizer._with_state(opt_state, {m: split(t) for m, t in new_trees.items()}, count)


@dataclasses.dataclass(frozen=True, eq=False)
class OptaxOptimizer:
    """Any optax transform as a program's optimizer, its whole state saved in checkpoints.

    ``TrainProgram.from_artifacts(..., optimizer_model=tx)`` and
    ``jaxort.api.Optimizer(tx, module)`` wrap a transform in one. The state
    maps to the checkpoint's optimizer group by
    :func:`opt_state_to_checkpoint_states` (leaves named by their path,
    e.g. ``"1.0.mu"``; shared leaves such as counts on every parameter) and
    back by :func:`opt_state_from_checkpoint_states`, so a run resumed from
    a checkpoint continues bit for bit.

    The learning rate is the transform's (a float or a schedule of its own
    count, as optax does). ``update`` also receives the train state's
    learning rate as the extra argument ``learning_rate``; optax's own
    transforms ignore it, jaxort's ORT kernels (``scale_by_ort_adamw(None)``
    inside a chain) use it, so only they follow ``set_learning_rate`` and
    ORT's LinearLRScheduler.

    Attributes:
      transform: the optax ``GradientTransformation`` as given (plain or
        with extra args).
      optimizer_type: ``"optax"``.
      hyperparameters: empty (optax transforms keep theirs in closures).

    Example:
      >>> opt = OptaxOptimizer(optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)))
      >>> p = {"w": jnp.ones(3)}
      >>> u, s = opt.update({"w": jnp.ones(3)}, opt.init(p), p, learning_rate=jnp.float32(0.1))
    """

    transform: optax.GradientTransformation
    optimizer_type: str = "optax"
    hyperparameters: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.transform, optax.GradientTransformation):
            raise TrainingError(f"OptaxOptimizer takes an optax GradientTransformation, got "
                                f"{type(self.transform).__name__}")

    def init(self, params):
        """``transform.init``."""
        return self.transform.init(params)

    def update(self, updates, state, params=None, **extra_args):
        """``transform.update``; a plain ``GradientTransformation`` does not see the extra arguments."""
        return optax.with_extra_args_support(self.transform).update(updates, state, params, **extra_args)

    def checkpoint_states(self, opt_state, params: Mapping) -> dict:
        """The state as a checkpoint group's per-parameter tensors (:func:`opt_state_to_checkpoint_states`)."""
        return opt_state_to_checkpoint_states(opt_state, params)

    def restore(self, params: Mapping, states: Mapping, step: int):
        """The transform's state for ``params`` from a checkpoint group.

        Args:
          params: the trainable parameters.
          states: ``{param: {state name: array}}`` (an ``OptimizerGroup.states``).
          step: the group's step; the counts come from the saved tensors
            (the caller checks that they agree with it).

        Returns:
          The optax state (:func:`opt_state_from_checkpoint_states`, with the
          abstract state after one update as the alternative dtypes).

        Raises:
          CheckpointError: the entries do not match this transform's state.
        """
        del step
        return _restore_by_path(self, params, states)


def as_optimizer(value: Any) -> Optional[Union[OrtOptimizer, OptaxOptimizer]]:
    """``value`` as an optimizer object, or None when it is an optimizer model (path, bytes, ModelProto).

    An ``OrtOptimizer`` or ``OptaxOptimizer`` is returned as is; an optax
    ``GradientTransformation`` is wrapped in an :class:`OptaxOptimizer`.
    """
    if isinstance(value, (OrtOptimizer, OptaxOptimizer)):
        return value
    if isinstance(value, optax.GradientTransformation):
        return OptaxOptimizer(value)
    return None


def _restore_by_path(optimizer, params: Mapping, states: Mapping):
    """:func:`opt_state_from_checkpoint_states` for ``optimizer`` (an OptaxOptimizer or OrtOptimizer)."""
    template = optimizer.init(params)
    # What one update makes of the state's dtypes (traced, not run): a state
    # saved after some steps may hold those.
    updated = jax.eval_shape(
        lambda p, s: optimizer.update(p, s, p, learning_rate=jnp.float32(DEFAULT_LEARNING_RATE))[1],
        params, template)
    return opt_state_from_checkpoint_states(template, params, states, updated=updated)


def adamw_optimizer(**attributes) -> OrtOptimizer:
    """An :class:`OrtOptimizer` for AdamW with ORT's default attributes, overridable.

    Args:
      **attributes: alpha, beta, epsilon, weight_decay, adam_mode, correct_bias.

    Returns:
      The optimizer; its learning rate comes from the train state.
    """
    hp = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6, "weight_decay": 0.0,
          "adam_mode": 1, "correct_bias": 1}
    unknown = set(attributes) - set(hp)
    if unknown:
        raise TrainingError(f"unknown AdamWOptimizer attributes {sorted(unknown)}")
    hp.update(attributes)
    tx = scale_by_ort_adamw(
        None, alpha=hp["alpha"], beta=hp["beta"], epsilon=hp["epsilon"],
        weight_decay=hp["weight_decay"], adam_mode=int(hp["adam_mode"]),
        correct_bias=bool(hp["correct_bias"]))
    return OrtOptimizer("AdamW", hp, tx, ("momentum0", "momentum1"), described=True)


def sgd_optimizer() -> OrtOptimizer:
    """An :class:`OrtOptimizer` for SGDOptimizerV2 (plain SGD).

    Returns:
      The optimizer; its learning rate comes from the train state.
    """
    return OrtOptimizer("SGD", {}, scale_by_ort_sgd(None), ("momentum0",), described=True)


def optimizer_from_model(model) -> OrtOptimizer:
    """Reads an ORT ``optimizer_model.onnx`` into an :class:`OrtOptimizer`.

    Args:
      model: an ``onnx.ModelProto`` (see ``jaxort.graph.load_model`` for
        paths and bytes).

    Returns:
      The optimizer described by the model's single optimizer node.

    Raises:
      TrainingError: the model has no known optimizer node
        (``com.microsoft::AdamWOptimizer`` or ``com.microsoft::SGDOptimizerV2``),
        or other nodes beside it (such as onnxblock's ``InplaceClipGradNorm``).
    """
    nodes = [n for n in model.graph.node if n.op_type not in ("Constant", "Identity")]
    known = {"AdamWOptimizer": "AdamW", "SGDOptimizerV2": "SGD"}
    # Anything beside the optimizer node (onnxblock's ClipGradNorm writes an
    # InplaceClipGradNorm before it) would change the update: refused, never skipped.
    others = [n for n in nodes if n.op_type not in known]
    if others and len(others) < len(nodes):
        found = ", ".join(f"{n.name!r} ({n.domain or 'ai.onnx'}::{n.op_type})" for n in others)
        raise TrainingError(
            f"the optimizer model has nodes beside its optimizer node that jaxort does not apply: {found}; "
            "for gradient clipping, chain optax.clip_by_global_norm before the optimizer in jaxort.training")
    for node in nodes:
        if node.op_type in known and node.domain in ("com.microsoft", ""):
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type == "SGDOptimizerV2":
                if attrs:
                    raise TrainingError(
                        f"SGDOptimizerV2 node {node.name!r} has attributes {sorted(attrs)}; "
                        "ORT's has none")
                return sgd_optimizer()
            return adamw_optimizer(**{k: (float(v) if isinstance(v, float) else int(v)) for k, v in attrs.items()})
    found = [f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in nodes]
    raise TrainingError(
        f"the optimizer model has no supported optimizer node; found {found}, jaxort "
        "supports com.microsoft::AdamWOptimizer and com.microsoft::SGDOptimizerV2")

