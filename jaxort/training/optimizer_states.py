"""An optimizer state pytree as the per-parameter tensors of a checkpoint's optimizer group, and back.

ORT's checkpoint keeps an optimizer group's state as named tensors per
parameter (``momentum0``, ``momentum1``). Any optax state maps to that shape
here: every leaf becomes a named tensor of one parameter's optimizer state,
named by its path in the state pytree (``"1.0.mu"``), shared leaves (counts)
on every parameter, so a resumed run continues bit for bit. Used by
:mod:`jaxort.training.optimizers`; numpy and JAX only. Layer: training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import CheckpointError

__all__ = ["opt_state_from_checkpoint_states", "opt_state_to_checkpoint_states"]


# The name of a leaf whose key path is empty (the whole state is one array) or
# holds only its parameter's name (the state is a params-like dict).
_ROOT_NAME = "state"


def _key_text(key) -> str:
    """One key of a pytree path as it appears in a state name (stable across JAX versions)."""
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return str(key.name)
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.FlattenedIndexKey):
        return str(key.key)
    return str(key)


def _state_entries(opt_state, params: Mapping) -> tuple[list, Any]:
    """``([(parameter name or None, state name, leaf)], treedef)`` for every leaf of ``opt_state``.

    A leaf belongs to the first parameter whose name is a dict key on its path;
    the state name is the path without that key. Names are checked unique.

    Raises:
      CheckpointError: two leaves get the same name, or there are shared
        leaves but no parameter to hold them.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(opt_state)
    entries, per_param, shared = [], {}, {}
    for path, leaf in flat:
        owner, words = None, []
        for key in path:
            if owner is None and isinstance(key, jax.tree_util.DictKey) and \
                    isinstance(key.key, str) and key.key in params:
                owner = key.key
            else:
                words.append(_key_text(key))
        name = ".".join(words) or _ROOT_NAME
        where = f"{owner!r}" if owner is not None else "every parameter (a shared leaf)"
        seen = per_param.setdefault(owner, {}) if owner is not None else shared
        if name in seen:
            raise CheckpointError(
                f"the optimizer state has two leaves named {name!r} for {where}: "
                f"{jax.tree_util.keystr(seen[name])} and {jax.tree_util.keystr(path)}")
        seen[name] = path
        entries.append((owner, name, leaf))
    for owner, names in per_param.items():
        clash = sorted(names.keys() & shared.keys())
        if clash:
            name = clash[0]
            raise CheckpointError(
                f"the optimizer state's shared leaf {jax.tree_util.keystr(shared[name])} and the leaf "
                f"{jax.tree_util.keystr(names[name])} of {owner!r} are both named {name!r}")
    if shared and not params:
        raise CheckpointError(
            f"the optimizer state has shared leaves {sorted(shared)} but there is no trainable "
            "parameter whose optimizer state could hold them")
    return entries, treedef


def opt_state_to_checkpoint_states(opt_state, params: Mapping) -> dict:
    """Any optax state as the per-parameter tensors of a checkpoint optimizer group.

    The state is flattened with ``jax.tree_util.tree_flatten_with_path``;
    every leaf becomes a named tensor (dtype and shape kept):

    - A leaf under a dict key that is a parameter's name (``mu[name]``,
      ``nu[name]``, ``trace[name]``, the factored ``v_row[name]``) is that
      parameter's state. Its name is its key path without the parameter key,
      each key written as the tuple index, attribute (NamedTuple field) or
      dict key it is, joined by ``"."``: in the state of
      ``optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr))``,
      ``state[1][0].mu["fc1.weight"]`` is ``"1.0.mu"`` of ``"fc1.weight"``.
      The path decides, not the shape, so states shaped unlike their
      parameter (adafactor's factored rows) stay with it. A parameter that
      ``optax.masked`` leaves out simply has no such entry.
    - Any other leaf (step counts, injected hyperparameters, a PRNG key) is
      shared: it is saved, named by its path (``"1.0.count"``), as a state
      of every parameter, and restoring checks that all copies agree.

    Why shared leaves are per-parameter tensors: ORT's optimizer group holds
    only per-parameter tensors plus an int64 step and a float32 learning
    rate, so this is the one place in the group where a tensor keeps its
    dtype (an int32 count stays int32) and shape. The property bag could
    hold an int or a float, but it is user metadata that is saved with
    ``include_optimizer_state=False`` too and stays outside the TrainState;
    optimizer state there would survive a save that was asked to drop it.
    The group's ``step`` is still written (the first ``count`` in the state,
    :attr:`jaxort.training.TrainState.step`), for ORT and for readers of
    the file. ONNX Runtime 1.19.2 loads such a checkpoint, reads its
    parameters and properties and saves it back byte for byte, but its own
    optimizers cannot continue it (they look up ``momentum0`` /
    ``momentum1``); to hand a run to ORT's optimizer, save without the
    optimizer state.

    Args:
      opt_state: the transform's state.
      params: the trainable parameters, name -> array.

    Returns:
      ``{param: {state name: numpy array}}``, parameters sorted by name, each
      trainable parameter present (with ``{}`` when it holds nothing).

    Raises:
      CheckpointError: two leaves would get the same name, or shared
        leaves without any trainable parameter.

    Example:
      >>> params = {"w": jnp.ones(3)}
      >>> tx = optax.adam(1e-3)
      >>> sorted(opt_state_to_checkpoint_states(tx.init(params), params)["w"])
      ['0.count', '0.mu', '0.nu']
    """
    entries, _ = _state_entries(opt_state, params)
    shared = {name: np.asarray(leaf) for owner, name, leaf in entries if owner is None}
    out = {}
    for pname in sorted(params):
        states = dict(shared)
        states.update({name: np.asarray(leaf) for owner, name, leaf in entries if owner == pname})
        out[pname] = {name: states[name] for name in sorted(states)}
    return out


def _like(template, value: np.ndarray):
    """``value`` as a leaf like ``template``: a JAX array (a weak scalar stays weak), numpy, or a Python scalar."""
    if isinstance(template, jax.Array):
        if template.ndim == 0:
            # full_like keeps the template's dtype and weak type: a weak scalar
            # restored strong would promote differently in the next update.
            return jax.lax.full_like(template, value)
        return jnp.asarray(value, template.dtype)
    if isinstance(template, np.ndarray):
        return np.array(value, template.dtype)
    if isinstance(template, (bool, int, float, complex)):
        return type(template)(value.item())
    return jnp.asarray(value)


def _kind(leaf) -> tuple:
    """``(shape, dtype)`` of a leaf, concrete or abstract."""
    return tuple(np.shape(leaf)), np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype


def opt_state_from_checkpoint_states(template, params: Mapping, states: Mapping, *, updated=None):
    """Rebuilds an optax state from a checkpoint group's per-parameter tensors.

    The inverse of :func:`opt_state_to_checkpoint_states`: ``template`` (a
    fresh ``tx.init(params)``) gives the tree, each leaf's name, shape and
    dtype; the values come from ``states``. Every parameter's entries must be
    exactly the ones the template names, and copies of a shared leaf must be
    equal, bit for bit.

    Args:
      template: ``tx.init(params)`` of the transform that will continue.
      params: the trainable parameters.
      states: ``{param: {state name: array}}`` (an ``OptimizerGroup.states``).
      updated: optionally the state's abstract value after one update
        (``jax.eval_shape``), the same tree; a saved leaf may have its dtype
        instead of the template's, because an optax state can change dtype
        at its first update (a bfloat16 moment scaled by an injected float32
        hyperparameter becomes float32). Such a leaf is restored in the
        saved dtype; weak types come from the template.

    Returns:
      The state, with ``template``'s tree and shapes and the dtypes saved.

    Raises:
      CheckpointError: the checkpoint was written by another transform or
        for other parameters: every missing, extra, misshapen, mistyped or
        disagreeing entry is named.

    Example:
      >>> params = {"w": jnp.ones(3)}
      >>> tx = optax.adam(1e-3)
      >>> saved = opt_state_to_checkpoint_states(tx.init(params), params)
      >>> opt_state_from_checkpoint_states(tx.init(params), params, saved)[0].count
      Array(0, dtype=int32)
    """
    entries, treedef = _state_entries(template, params)
    alternatives = [None] * len(entries)
    if updated is not None and jax.tree_util.tree_structure(updated) == treedef:
        alternatives = jax.tree_util.tree_leaves(updated)
    problems = []
    unknown = [p for p in states if p not in params]
    if unknown:
        problems.append(f"optimizer states for parameters the model does not train: {sorted(unknown)}")
    expected = {p: set() for p in params}
    for owner, name, _ in entries:
        for pname in ([owner] if owner is not None else params):
            expected[pname].add(name)
    for pname in sorted(params):
        extra = sorted(set(states.get(pname, {})) - expected[pname])
        if extra:
            problems.append(f"parameter {pname!r} has optimizer states this optimizer does not keep: {extra}")
    leaves = []
    for (owner, name, leaf), alternative in zip(entries, alternatives):
        kinds = [_kind(leaf)] + ([_kind(alternative)] if alternative is not None else [])
        holders = [owner] if owner is not None else sorted(params)
        value = None
        for pname in holders:
            got = states.get(pname, {}).get(name)
            what = f"optimizer state {name!r} of {pname!r}"
            if got is None:
                problems.append(f"{what} is missing")
                continue
            got = np.asarray(got)
            if (tuple(got.shape), got.dtype) not in kinds:
                keeps = " or ".join(dict.fromkeys(f"{d}{list(shape)}" for shape, d in kinds))
                problems.append(f"{what} is {got.dtype}{list(got.shape)}, this optimizer keeps {keeps}")
                continue
            if value is None:
                value = got
            elif value.tobytes() != got.tobytes():
                problems.append(f"{what} differs from the copy of {holders[0]!r} (a shared leaf is the "
                                "same for every parameter)")
        if value is None:
            leaves.append(None)
        elif value.dtype == kinds[0][1]:
            leaves.append(_like(leaf, value))
        else:
            leaves.append(jnp.asarray(value, value.dtype))
    if problems:
        raise CheckpointError("checkpoint optimizer state does not match this optimizer: " + "; ".join(problems))
    return jax.tree_util.tree_unflatten(treedef, leaves)
