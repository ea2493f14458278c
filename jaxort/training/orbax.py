"""Saving and restoring a (possibly sharded) TrainState with Orbax: the ``orbax`` extra.

Import it yourself (``from jaxort.training import orbax as jo``); nothing in
jaxort imports it, and it needs ``orbax-checkpoint``. A step's checkpoint is
a folder of two Orbax items: ``"state"``, the TrainState pytree written with
``StandardSave`` (every host writes the shards it holds: nothing is gathered
to one process), and ``"properties"``, the property bag as JSON. Saves are
asynchronous: training goes on while the files are written, and
``manager.wait_until_finished()`` waits for them.

:func:`restore` reads a step into the placement of a template state (on one
device, or sharded on a mesh by :func:`jaxort.training.shard`), so the same
files restore on one device or on eight. ONNX Runtime's checkpoint format is
reached through the TrainState: ``program.to_checkpoint(state)`` and
``program.init_state(checkpoint)`` (or :func:`to_ort_checkpoint`).

Example::

    from jaxort.training import orbax as jo

    mngr = jo.manager("runs/run1", max_to_keep=3)
    jo.save(mngr, int(state.step), state, {"epoch": 2})
    mngr.wait_until_finished()
    state, properties = jo.restore(mngr, None, like=state)   # the latest step

This module belongs to the training layer and imports only from it and the
format layer (``jaxort.checkpoint``).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxort import checkpoint as ckpt_lib
from jaxort.errors import CheckpointError
from jaxort.training.packing import unpack
from jaxort.training.state import TrainState

__all__ = ["PROPERTIES_ITEM", "STATE_ITEM", "manager", "restore", "save", "to_ort_checkpoint"]

# The names of a step's two Orbax items.
STATE_ITEM = "state"
PROPERTIES_ITEM = "properties"


def manager(directory, *, max_to_keep: Optional[int] = None, enable_async_checkpointing: bool = True,
            **options) -> ocp.CheckpointManager:
    """An Orbax ``CheckpointManager`` for TrainStates in ``directory``.

    Args:
      directory: the folder of the run's checkpoints (one subfolder per
        step); created if missing. Every process of a multi-host run passes
        the same (shared) folder.
      max_to_keep: keep only the newest this many steps (None: all).
      enable_async_checkpointing: save in a background thread (the default).
      **options: any other ``orbax.checkpoint.CheckpointManagerOptions``
        field (``save_interval_steps``, ``keep_period``, ...).

    Returns:
      The manager; close it (``manager.close()``, or use it as a context
      manager) when done, which also waits for a save in progress.

    Example::

        with manager("runs/run1", max_to_keep=2) as mngr:
            save(mngr, 3, state)
    """
    opts = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                        enable_async_checkpointing=enable_async_checkpointing, **options)
    return ocp.CheckpointManager(os.path.abspath(os.fspath(directory)), options=opts,
                                 item_names=(STATE_ITEM, PROPERTIES_ITEM))


def save(manager: ocp.CheckpointManager, step: int, state: TrainState,
         properties: Optional[Mapping[str, Any]] = None, *, force: bool = False) -> bool:
    """Saves ``state`` and its property bag as step ``step`` (asynchronously, if the manager is).

    Every process of a multi-host run calls this with its part of the
    state; each writes the shards it holds. The arrays are copied to host
    memory before this returns, so the next train step may donate ``state``
    while the files are written (``tests/training/test_orbax.py`` does).

    Args:
      manager: from :func:`manager` (or any ``CheckpointManager`` whose
        items may be named ``"state"`` and ``"properties"``).
      step: the step number (e.g. ``int(state.step)``).
      state: a TrainState (a :class:`jaxort.training.PackedState` is
        unpacked), on one device or on a mesh. A typed PRNG key
        (``jax.random.key``) is saved as its key data.
      properties: the property bag: name -> int, float or str (ORT's
        checkpoint properties).
      force: save even if the manager's options (``save_interval_steps``,
        ...) would skip this step.

    Returns:
      Whether a save started (the manager's options may skip a step).
      ``manager.wait_until_finished()`` waits until the files are complete.

    Raises:
      CheckpointError: ``state`` is not a TrainState, or a property is not
        an int, float or str.
    """
    state = unpack(state)
    if not isinstance(state, TrainState):
        raise CheckpointError(f"save needs a TrainState, got {type(state).__name__}")
    props = _check_properties(properties)
    tree = jax.tree.map(_key_data, state)
    return manager.save(int(step), args=ocp.args.Composite(**{
        STATE_ITEM: ocp.args.StandardSave(tree), PROPERTIES_ITEM: ocp.args.JsonSave(props)}), force=force)


def restore(manager: ocp.CheckpointManager, step: Optional[int], like: TrainState) -> tuple[TrainState, dict]:
    """Restores step ``step`` into the structure and placement of ``like``.

    Each leaf is read straight into the sharding of ``like``'s leaf (each
    process reads only the shards its devices hold), so a state saved on
    eight devices restores on one, and the reverse.

    Args:
      manager: the manager the step was saved with (or one on the same folder).
      step: the step to restore; None: the latest.
      like: a TrainState with the same parameters and optimizer state as the
        saved one (e.g. ``program.init_state(ckpt)``, optionally through
        :func:`jaxort.training.shard`); only its structure, shapes, dtypes
        and shardings are used. Numpy leaves go to the default device.

    Returns:
      ``(state, properties)``: the TrainState and the property bag.

    Raises:
      CheckpointError: no such step in the manager's folder (naming it and
        the steps there), or the saved state does not match ``like``
        (every missing, extra or differing leaf listed at once).
    """
    manager.wait_until_finished()  # a save of this step may still be in flight
    like = unpack(like)
    if not isinstance(like, TrainState):
        raise CheckpointError(f"restore needs a TrainState to restore into, got {type(like).__name__}")
    steps = sorted(manager.all_steps())
    where = os.fspath(manager.directory)
    if step is None:
        if not steps:
            raise CheckpointError(f"no checkpoint to restore in {where}")
        step = steps[-1]
    elif int(step) not in steps:
        raise CheckpointError(f"no checkpoint for step {step} in {where}; the steps there are {steps}")
    step = int(step)
    abstract = jax.tree.map(_abstract, jax.tree.map(_key_data, like))
    _check_structure(manager, step, abstract, where)
    restored = manager.restore(step, args=ocp.args.Composite(**{
        STATE_ITEM: ocp.args.StandardRestore(abstract), PROPERTIES_ITEM: ocp.args.JsonRestore()}))
    state = jax.tree.map(_wrap_key, like, restored[STATE_ITEM])
    return state, dict(restored[PROPERTIES_ITEM] or {})


def to_ort_checkpoint(manager: ocp.CheckpointManager, step: Optional[int], program, like: TrainState,
                      path, *, include_optimizer_state: bool = True) -> None:
    """Writes an Orbax step as an ONNX Runtime Training checkpoint file (properties included).

    Args:
      manager: the manager.
      step: the step; None: the latest.
      program: the :class:`jaxort.training.TrainProgram` the state trains with.
      like: the template state for :func:`restore`.
      path: the checkpoint file to write.
      include_optimizer_state: also write the optimizer group.

    Raises:
      CheckpointError: as :func:`restore` and :func:`jaxort.checkpoint.save`.
    """
    state, properties = restore(manager, step, like)
    ckpt = program.to_checkpoint(state, include_optimizer_state, properties=properties)
    ckpt_lib.save(ckpt, path, include_optimizer_state=include_optimizer_state)


def _check_properties(properties) -> dict:
    out = {}
    for name, value in dict(properties or {}).items():
        if not isinstance(name, str):
            raise CheckpointError(f"property names must be str, got {name!r}")
        if isinstance(value, (bool, np.bool_)):
            raise CheckpointError(f"property {name!r}: a bool is not a checkpoint property (int, float or str)")
        if isinstance(value, (int, np.integer)):
            out[name] = int(value)
        elif isinstance(value, (float, np.floating)):
            out[name] = float(value)
        elif isinstance(value, str):
            out[name] = value
        else:
            raise CheckpointError(f"property {name!r}: {type(value).__name__} is not an int, float or str")
    return out


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _key_data(x):
    """A typed PRNG key as its uint32 key data (what Orbax can write); anything else as is."""
    return jax.random.key_data(x) if _is_key(x) else x


def _wrap_key(like, value):
    """``value`` as a typed key of ``like``'s implementation when ``like`` is one."""
    return jax.random.wrap_key_data(value, impl=jax.random.key_impl(like)) if _is_key(like) else value


def _abstract(x) -> jax.ShapeDtypeStruct:
    """The shape, dtype and sharding to restore a leaf into (numpy leaves: the default device)."""
    if isinstance(x, jax.Array):
        sharding = x.sharding
    else:
        x = np.asarray(x)
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(x.shape, jax.dtypes.canonicalize_dtype(x.dtype), sharding=sharding)


def _path_name(path) -> str:
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _check_structure(manager, step: int, abstract, where: str) -> None:
    """Raises CheckpointError listing every leaf where the saved state and the template differ."""
    try:
        metadata = manager.item_metadata(step)[STATE_ITEM]
    except Exception as e:  # noqa: BLE001 - an unreadable folder is reported as such
        raise CheckpointError(f"cannot read the state saved for step {step} in {where}: {e}") from e
    if metadata is None:
        raise CheckpointError(f"step {step} in {where} has no {STATE_ITEM!r} item (not saved by jaxort?)")
    tree = getattr(metadata, "tree", metadata)
    saved = {_path_name(p): m for p, m in jax.tree_util.tree_flatten_with_path(tree)[0]}
    wanted = {_path_name(p): a for p, a in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    problems = [f"{n}: missing from the checkpoint" for n in wanted if n not in saved]
    problems += [f"{n}: in the checkpoint, not in the state to restore into" for n in saved if n not in wanted]
    for n, a in wanted.items():
        m = saved.get(n)
        if m is None:
            continue
        shape, dtype = tuple(getattr(m, "shape", ()) or ()), getattr(m, "dtype", None)
        if shape != tuple(a.shape) or (dtype is not None and np.dtype(dtype) != np.dtype(a.dtype)):
            problems.append(f"{n}: saved {np.dtype(dtype) if dtype is not None else '?'}{list(shape)}, "
                            f"expected {np.dtype(a.dtype)}{list(a.shape)}")
    if problems:
        raise CheckpointError(f"the state saved for step {step} in {where} does not match the state to restore "
                              f"into ({len(problems)} problems): " + "; ".join(problems))
