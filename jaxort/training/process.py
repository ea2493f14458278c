"""The two process-wide objects of ORT's training API, each one explicit value.

ORT keeps the random seed of ``SetSeed`` for the whole process
(:data:`PROCESS_SEED`, a :class:`ProcessSeed`), and sessions over artifacts
it has seen reuse their compiled form (:data:`PROGRAMS`, a
:class:`ProgramCache` of :class:`TrainProgram` s), so that re-creating a
session over the same files does not recompile. Layer: training.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from typing import Optional

from jaxort import checkpoint as ckpt
from jaxort.graph import load_model
from jaxort.training.optimizers import as_optimizer
from jaxort.training.program import TrainProgram

__all__ = ["PROCESS_SEED", "PROGRAMS", "ProcessSeed", "ProgramCache"]


class ProgramCache:
    """Compiled :class:`TrainProgram` s keyed by the content of their artifacts (an LRU).

    Programs hold no training state, so sessions over the same files may
    share one and compile once.

    Args:
      size: how many programs to keep.
    """

    def __init__(self, size: int = 16):
        self._size = int(size)
        self._programs: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, training_model, eval_model, optimizer_model, checkpoint: ckpt.Checkpoint, *,
            remat=None) -> TrainProgram:
        """The program for these artifacts and the checkpoint's parameter names.

        Args:
          training_model, eval_model, optimizer_model: paths, bytes or
            ModelProtos (eval and optimizer may be None). The optimizer may
            also be an optimizer object (an optax ``GradientTransformation``,
            an ``OptaxOptimizer`` or ``OrtOptimizer``), cached by identity.
          checkpoint: tells parameters from user inputs, as in ORT.
          remat: ``TrainProgram.from_artifacts``' rematerialisation option
            (a name, or a ``jax.checkpoint`` policy, cached by identity).

        Returns:
          A cached or new program.
        """
        optimizer = optimizer_model if as_optimizer(optimizer_model) is not None else None
        protos = [None if m is None else load_model(m, check=False)
                  for m in (training_model, eval_model, None if optimizer is not None else optimizer_model)]
        digest = hashlib.sha256()
        for proto in protos:
            digest.update(b"-" if proto is None else hashlib.sha256(proto.SerializeToString()).digest())
        if optimizer is not None:
            # The cached program holds the object (program.optimizer, or its
            # .transform), so its id is not reused while the entry lives.
            digest.update(b"optimizer object %d" % id(optimizer))
        digest.update(repr((list(checkpoint.trainable), list(checkpoint.frozen))).encode())
        # A policy function is held by the cached program, so its id is not reused while the entry lives.
        digest.update(repr(remat if remat is None or isinstance(remat, str) else id(remat)).encode())
        key = digest.digest()
        with self._lock:
            program = self._programs.get(key)
            if program is not None:
                self._programs.move_to_end(key)
                return program
        if optimizer is not None:
            protos[2] = optimizer
        program = TrainProgram.from_artifacts(*protos, checkpoint=checkpoint, remat=remat)
        with self._lock:
            self._programs[key] = program
            while len(self._programs) > self._size:
                self._programs.popitem(last=False)
        return program

    def clear(self) -> None:
        """Forgets every program."""
        with self._lock:
            self._programs.clear()

    def __len__(self) -> int:
        return len(self._programs)


class ProcessSeed:
    """The process-wide seed of ORT's ``SetSeed``: sessions created later start from it, live ones follow it.

    ``generation`` counts the calls to :meth:`set`, so a session can tell it
    has not yet followed the latest one (:meth:`SessionState.follow_seed`).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._seed: Optional[int] = None
        self._generation = 0

    def set(self, seed: int) -> None:
        """Sets the seed."""
        with self._lock:
            self._seed = int(seed)
            self._generation += 1

    @property
    def generation(self) -> int:
        """How many times :meth:`set` was called (read without the lock: an int read is atomic)."""
        return self._generation

    def get(self) -> tuple[Optional[int], int]:
        """``(seed or None if never set, generation)``."""
        with self._lock:
            return self._seed, self._generation


PROGRAMS = ProgramCache()
PROCESS_SEED = ProcessSeed()
