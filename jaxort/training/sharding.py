"""Placing a TrainState and its batches on a device mesh: data parallel and fully sharded.

A :class:`Placement` is a ``jax.sharding.Mesh`` and a strategy:

- ``"data"`` (data parallel): every leaf of the state is replicated on each
  device; batches are split along their first axis over the mesh's batch
  axes.
- ``"fsdp"`` (fully sharded): parameters, gradients and optimizer moments
  (every array leaf of ``params``, ``frozen``, ``grads`` and ``opt_state``
  with a dimension) are split along the mesh axis ``"fsdp"`` on their largest
  dimension that the axis size divides, and replicated when none does;
  scalars (step count, learning rate, flags, the PRNG key) are replicated.
  XLA gathers the parameters where the step needs them.

The mesh names its axes ``"data"`` and/or ``"fsdp"``; a 2-D
``("data", "fsdp")`` mesh combines both. Batches are always split over every
batch axis the mesh has (``"data"`` and ``"fsdp"``), so all devices compute
on their own rows and XLA sums the gradients.

``TrainProgram`` reads the shardings of the state it is given and compiles
its steps with them as ``jax.jit`` input and output shardings, so a sharded
state stays sharded the same way step after step. Host batches are placed
with ``jax.make_array_from_process_local_data``: each process gives its own
rows and every device receives only its part (no gather through one device).

Example::

    mesh = jax.make_mesh((8,), ("data",))
    state = shard(program.init_state(ckpt), mesh, "fsdp")
    state, (loss,) = program.train_step(state, x, y)   # x, y: host numpy
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxort.errors import InputError, TrainingError
from jaxort.training.packing import unpack
from jaxort.training.state import TrainState

__all__ = ["BATCH_AXES", "STRATEGIES", "Placement", "gather", "make_mesh", "placement_of", "shard"]

STRATEGIES = ("data", "fsdp")
# Mesh axes a batch is split over, in this order.
BATCH_AXES = ("data", "fsdp")


def make_mesh(shape: Sequence[int] | None = None, axis_names: Sequence[str] = ("data",),
              devices: Optional[Sequence[Any]] = None) -> Mesh:
    """A mesh over ``devices`` (default all devices of all processes).

    Args:
      shape: the mesh shape; default all devices on the first axis (and 1
        on the others).
      axis_names: e.g. ``("data",)``, ``("fsdp",)`` or ``("data", "fsdp")``.
      devices: the devices, in order; default ``jax.devices()``.

    Returns:
      The mesh.
    """
    devices = list(jax.devices() if devices is None else devices)
    if shape is None:
        shape = (len(devices),) + (1,) * (len(axis_names) - 1)
    if int(np.prod(shape)) != len(devices) or len(shape) != len(axis_names):
        raise TrainingError(f"a mesh of shape {tuple(shape)} with axes {tuple(axis_names)} does not fit "
                            f"{len(devices)} devices")
    return Mesh(np.asarray(devices, dtype=object).reshape(tuple(shape)), tuple(axis_names))


def _largest_divisible_dim(shape: tuple, size: int) -> Optional[int]:
    best = None
    for i, d in enumerate(shape):
        if d % size == 0 and d >= size and (best is None or d > shape[best]):
            best = i
    return best


@dataclasses.dataclass(frozen=True)
class Placement:
    """A mesh and a strategy: where each leaf of a state and each batch input goes.

    Attributes:
      mesh: the ``jax.sharding.Mesh`` (axes ``"data"`` and/or ``"fsdp"``).
      strategy: ``"data"`` or ``"fsdp"``.
    """

    mesh: Mesh
    strategy: str = "data"

    def __post_init__(self):
        if not isinstance(self.mesh, Mesh):
            raise TrainingError(f"mesh must be a jax.sharding.Mesh, got {type(self.mesh).__name__}")
        if self.strategy not in STRATEGIES:
            raise TrainingError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        names = tuple(self.mesh.axis_names)
        unknown = [a for a in names if a not in BATCH_AXES]
        if unknown:
            raise TrainingError(f"mesh axes must be named 'data' and/or 'fsdp', got {names}")
        if self.strategy == "fsdp" and "fsdp" not in names:
            raise TrainingError(f"strategy 'fsdp' needs a mesh axis named 'fsdp', the mesh has {names}")
        # The traced ONNX ops carry no sharding types, so the steps use automatic
        # axes: a mesh with explicit axes (jax.make_mesh's default) is rebuilt
        # over the same devices with automatic ones.
        if any("Auto" not in str(t) for t in getattr(self.mesh, "axis_types", ())):
            object.__setattr__(self, "mesh", Mesh(self.mesh.devices, names))

    @property
    def batch_axes(self) -> tuple:
        """The mesh axes a batch's first dimension is split over."""
        return tuple(a for a in BATCH_AXES if a in self.mesh.axis_names)

    @property
    def batch_shards(self) -> int:
        """How many parts a batch is split into (the product of the batch axes' sizes)."""
        return int(np.prod([self.mesh.shape[a] for a in self.batch_axes]))

    @property
    def replicated(self) -> NamedSharding:
        """The sharding of a value every device holds whole."""
        return NamedSharding(self.mesh, PartitionSpec())

    def leaf_sharding(self, shape: tuple, split: bool) -> NamedSharding:
        """The sharding of one state leaf of ``shape``; ``split``: a parameter-like leaf."""
        if not split or self.strategy != "fsdp":
            return self.replicated
        size = int(self.mesh.shape["fsdp"])
        dim = _largest_divisible_dim(tuple(shape), size) if size > 1 else None
        if dim is None:
            return self.replicated
        spec = [None] * len(shape)
        spec[dim] = "fsdp"
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def state_shardings(self, state: TrainState) -> TrainState:
        """A TrainState-shaped pytree of the shardings of ``state``'s leaves."""
        def tree(value, split):
            return jax.tree.map(lambda x: self.leaf_sharding(np.shape(x), split and np.ndim(x) > 0), value)
        return state.replace(
            params=tree(state.params, True), frozen=tree(state.frozen, True), grads=tree(state.grads, True),
            accumulate=self.replicated, opt_state=tree(state.opt_state, True),
            learning_rate=self.replicated, initial_learning_rate=self.replicated, rng=self.replicated)

    def batch_sharding(self, ndim: int) -> NamedSharding:
        """The sharding of a batch input of rank ``ndim`` (rank 0: replicated)."""
        if ndim == 0:
            return self.replicated
        axes = self.batch_axes
        first = axes[0] if len(axes) == 1 else axes
        return NamedSharding(self.mesh, PartitionSpec(first, *([None] * (ndim - 1))))

    def place_state(self, state: TrainState) -> TrainState:
        """``state`` with every leaf on the mesh (see :meth:`state_shardings`)."""
        return jax.tree.map(_put, state, self.state_shardings(state))

    def place_batch(self, inputs: Sequence[Any], names: Sequence[str]) -> tuple:
        """The inputs of one step as global arrays split over the batch axes.

        Host arrays are this process's rows of the global batch (all of it
        with one process); each device receives its part directly.

        Raises:
          InputError: a batch size the batch axes do not divide, naming the
            input, the size and the axes' size.
        """
        n = self.batch_shards
        procs = jax.process_count()
        out = []
        for name, x in zip(names, inputs):
            ndim = np.ndim(x)
            sharding = self.batch_sharding(ndim)
            if ndim == 0:
                out.append(_put(x, sharding))
                continue
            if isinstance(x, jax.Array) and not x.is_fully_addressable:
                global_rows = x.shape[0]  # already a global array
            else:
                global_rows = int(np.shape(x)[0]) * procs
            if global_rows % n:
                where = "global batch size" if procs > 1 else "batch size"
                raise InputError(
                    f"input {name!r}: {where} {global_rows} is not divisible by the mesh's batch axes "
                    f"{self.batch_axes} of size {n}; give a batch whose first dimension is a multiple of {n}")
            if isinstance(x, jax.Array) and (not x.is_fully_addressable or x.sharding == sharding):
                out.append(x if x.sharding == sharding else jax.device_put(x, sharding))
            elif isinstance(x, jax.Array) and procs == 1:
                out.append(jax.device_put(x, sharding))
            else:
                local = np.asarray(x)
                out.append(jax.make_array_from_process_local_data(
                    sharding, local, (global_rows,) + local.shape[1:]))
        return tuple(out)


def _put(value, sharding: NamedSharding):
    """``value`` as a global array with ``sharding``; every process gives the same whole value."""
    if isinstance(value, jax.Array) and value.sharding == sharding:
        return value
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return jax.jit(lambda v: v, out_shardings=sharding)(value)
    host = np.asarray(value)
    if jax.process_count() == 1:
        return jax.device_put(host, sharding)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard(state: TrainState, mesh: Mesh, strategy: str = "data") -> TrainState:
    """Places a TrainState on a mesh: data parallel or fully sharded.

    Args:
      state: the state (any placement; numpy leaves too; a
        :class:`jaxort.training.PackedState` is unpacked: steps on a mesh take
        the TrainState). With several processes every process passes the
        same values.
      mesh: a ``jax.sharding.Mesh`` with axes ``"data"`` and/or ``"fsdp"``.
      strategy: ``"data"`` (everything replicated) or ``"fsdp"``
        (parameters, gradients and optimizer moments split along ``"fsdp"``
        on their largest divisible dimension).

    Returns:
      The placed state; ``TrainProgram`` steps keep its shardings.

    Raises:
      TrainingError: not a mesh, an unknown strategy, or axes other than
        ``"data"`` / ``"fsdp"`` (``"fsdp"`` needs an ``"fsdp"`` axis).
    """
    return Placement(mesh, strategy).place_state(unpack(state))


def placement_of(state: TrainState) -> Optional[Mesh]:
    """The mesh ``state`` lives on, or None for a state on one device (or on the host).

    Placement puts all parameters on the mesh or none, so the first one
    decides (this runs before every step, and flattening ResNet-18's state of
    293 leaves costs ~50 us); other leaves may have left the mesh (a new
    learning rate) and are put back by the step.
    """
    params = state.params if isinstance(state, TrainState) else None  # a PackedState's would unpack it
    for leaf in params.values() if isinstance(params, dict) else ():
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            return sharding.mesh if isinstance(sharding, NamedSharding) else None
    for leaf in jax.tree.leaves(state):  # no parameter on a device: any leaf on a mesh decides
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def gather(tree):
    """The tree's arrays as whole numpy arrays on the host, on every process.

    Sharded arrays that span several processes are gathered with XLA
    collectives (every process must call this); the rest is copied.
    """
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:
                return np.asarray(x.addressable_data(0))
            from jax.experimental import multihost_utils
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x) if isinstance(x, jax.Array) else x
    return jax.tree.map(one, tree)
