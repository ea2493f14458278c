"""Training over several processes (hosts) with JAX's own multi-controller runtime.

Every process runs the same program: it calls :func:`initialize` once, before
any other JAX call, builds the same :class:`jaxort.training.TrainProgram`
and a mesh over all devices of all processes (:func:`global_mesh`), loads
the same checkpoint (:func:`load_checkpoint`), shards the state over the mesh
(:func:`jaxort.training.shard`), and feeds each step its own rows of the
global batch (:func:`local_batch`): ``TrainProgram`` assembles them into one
global array with ``jax.make_array_from_process_local_data``. The gradients
are summed by XLA collectives (NCCL on GPU, ICI on TPU, gloo on CPU); there
is no communication layer of jaxort's own. A checkpoint is gathered by all
processes and written once, by process 0 (:func:`save_checkpoint`).

Example (run on every host, with its own ``process_id``)::

    from jaxort import distributed, training
    distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=0)
    program = training.TrainProgram.from_artifacts(train, eval, opt, checkpoint=ckpt)
    state = training.shard(program.init_state(distributed.load_checkpoint("checkpoint")),
                           distributed.global_mesh(), "fsdp")
    x, y = distributed.local_batch(global_x, global_y)   # or read only this host's rows
    state, (loss,) = program.train_and_update(state, x, y)
    distributed.save_checkpoint(program, state, "checkpoint_out")
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import jax
import numpy as np

from jaxort import checkpoint as ckpt
from jaxort.errors import InputError, TrainingError
from jaxort.training.sharding import make_mesh

__all__ = ["global_mesh", "initialize", "is_coordinator", "load_checkpoint", "local_batch", "process_count",
           "process_index", "save_checkpoint", "shutdown", "sync"]


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, *, local_device_ids: Optional[Sequence[int]] = None,
               cpu_collectives: Optional[str] = "gloo", **kwargs: Any) -> None:
    """Joins this process to a multi-process run (``jax.distributed.initialize``).

    Call it once per process, before any other JAX call. On a TPU pod or a
    SLURM / Open MPI cluster the arguments can be left out: JAX reads them
    from the environment.

    Args:
      coordinator_address: ``"host:port"`` of process 0's coordinator.
      num_processes: how many processes take part.
      process_id: this process's index, 0 to ``num_processes - 1``.
      local_device_ids: the local devices this process drives (default all).
      cpu_collectives: the CPU collectives implementation ("gloo", "mpi"),
        set where the installed JAX has the option, so CPU devices of
        several processes can run collectives; None leaves JAX's default.
      **kwargs: passed on to ``jax.distributed.initialize`` (e.g.
        ``initialization_timeout``).

    Raises:
      TrainingError: the CPU collectives cannot be chosen.
    """
    if cpu_collectives is not None:
        try:
            jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
        except (AttributeError, KeyError, ValueError) as e:  # an older JAX without the option
            raise TrainingError(f"this JAX cannot use {cpu_collectives!r} CPU collectives: {e}") from e
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids, **kwargs)


def shutdown() -> None:
    """Leaves the multi-process run (``jax.distributed.shutdown``)."""
    jax.distributed.shutdown()


def process_index() -> int:
    """This process's index."""
    return jax.process_index()


def process_count() -> int:
    """How many processes take part."""
    return jax.process_count()


def is_coordinator() -> bool:
    """Whether this is process 0, the one that writes files."""
    return jax.process_index() == 0


def global_mesh(shape: Optional[Sequence[int]] = None, axis_names: Sequence[str] = ("data",)):
    """A mesh over every device of every process, process by process (see ``make_mesh``)."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return make_mesh(shape, axis_names, devices)


def local_batch(*arrays: Any) -> tuple:
    """This process's rows of each global-batch array (the ``process_index``-th of ``process_count`` parts).

    Raises:
      InputError: a batch size the process count does not divide.
    """
    n, i = jax.process_count(), jax.process_index()
    out = []
    for k, a in enumerate(arrays):
        a = np.asarray(a)
        if a.ndim == 0:
            out.append(a)
            continue
        if a.shape[0] % n:
            raise InputError(f"batch {k}: global batch size {a.shape[0]} is not divisible by the "
                             f"{n} processes")
        rows = a.shape[0] // n
        out.append(a[i * rows:(i + 1) * rows])
    return tuple(out)


def sync(name: str = "jaxort") -> None:
    """Waits until every process reaches this point."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def save_checkpoint(program, state, path: os.PathLike, *, include_optimizer_state: bool = True,
                    properties=None) -> None:
    """Gathers a (sharded) state and saves it once, from process 0; every process must call it.

    The file equals the one saved from the same state on one device.

    Args:
      program: the :class:`jaxort.training.TrainProgram`.
      state: the state, sharded or not.
      path: the checkpoint path (process 0's file system).
      include_optimizer_state: save the optimizer group too.
      properties: the property bag to save.
    """
    data = program.to_checkpoint(state, include_optimizer_state, properties=properties)
    if is_coordinator():
        ckpt.save(data, path, include_optimizer_state=include_optimizer_state)
    sync("jaxort.save_checkpoint")


def load_checkpoint(path: os.PathLike) -> ckpt.Checkpoint:
    """Loads a checkpoint; every process reads the same file (shared storage or a copy per host)."""
    return ckpt.load(path)
