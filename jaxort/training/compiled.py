"""Compiled steps of a training program: one cache, one compile path, one dispatch.

Every compiled step is found by a :class:`StepKey`: the step's kind, the
form of the state it runs on (a TrainState, or a :class:`PackedState` of one
:class:`Packing`), the micro-batch count, the state's and inputs' shardings
on a mesh, and the static options of a deferred-call step (its schedule,
whether it overwrites the gradients). :class:`CompiledSteps` compiles each
key once, with ``jax.jit`` over the pure :class:`jaxort.training.steps.Steps`,
and counts traces per kind. Steps on one device whose program has a
fingerprint are read from, or saved to, the step cache
(:mod:`jaxort.training.step_cache`) on first use; those read count as
loads, not traces. Layer: training.
"""

from __future__ import annotations

import collections
import enum
import functools
import threading
from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np

from jaxort.graph.numerics import lowering_platform
from jaxort.training.optimizers import flat_moments
from jaxort.training.packing import PackedState, Packing, Slot, pack, unpack
from jaxort.training.pending import Pending
from jaxort.training.sharding import Placement, placement_of
from jaxort.training.state import TrainState
from jaxort.training.step_cache import CachedStep, step_cache_dir
from jaxort.training.steps import Steps

__all__ = ["CompiledSteps", "StepKey", "StepKind"]


class StepKind(str, enum.Enum):
    """The compiled steps of a program; the values are the names ``trace_count`` takes."""

    TRAIN = "train_step"
    EVAL = "eval_step"
    OPTIMIZER = "optimizer_step"
    TRAIN_AND_UPDATE = "train_and_update"
    TRAIN_STEPS = "train_steps"
    TRAIN_AFTER = "train_step_after"


class StepKey(NamedTuple):
    """What a compiled step is specialised on (hashable; a NamedTuple hashes fast on the hot path).

    Attributes:
      kind: the step.
      packing: the :class:`Packing` of a packed state, or None for a TrainState.
      micro_batches: micro-batches of a train step.
      shardings: on a mesh ``(state treedef, state shardings, input shardings)``, else None.
      schedule: the schedule of a ``TRAIN_AFTER`` or ``TRAIN_STEPS`` step, or None.
      reset_grad: a ``TRAIN_AFTER`` step that overwrites the gradients.
    """

    kind: StepKind
    packing: Optional[Packing] = None
    micro_batches: int = 1
    shardings: Optional[tuple] = None
    schedule: Optional[Callable] = None
    reset_grad: bool = False


class CompiledSteps:
    """The compiled steps of one :class:`Steps`, cached by :class:`StepKey`.

    Args:
      steps: the pure steps.
      fingerprint: makes the program's fingerprint for the step cache
        (called once, when the cache is first used; it returns None when the
        steps depend on Python code), or None: never cached.
    """

    def __init__(self, steps: Steps, fingerprint: Optional[Callable[[], Optional[str]]] = None):
        self.steps = steps
        self._fingerprint = fingerprint
        self._compiled: dict = {}  # StepKey -> compiled function; read without the lock
        self._flags: dict = {}  # (optimizer, set rate, schedule) -> their device arrays
        self._lock = threading.Lock()
        self.traces = collections.Counter()
        self.loads = collections.Counter()

    # ------------------------------------------------------------------ dispatch

    def run(self, kind: StepKind, state, inputs: tuple, micro_batches: int = 1, schedule=None):
        """Runs step ``kind`` (not ``TRAIN_AFTER``) on a state of any form.

        ``schedule``: the learning-rate schedule a ``TRAIN_STEPS`` step
        applies after each optimizer step, or None.

        A packed state runs the step unpacked and packed again inside the
        compiled program and comes back packed; with micro-batches it is
        unpacked and packed around the step. On a mesh the state and batch
        are placed with the mesh's shardings first.
        """
        if type(state) is PackedState:
            if micro_batches == 1:
                return self.get(StepKey(kind, state.packing, schedule=schedule), state=state)(state, *inputs)
            new, outs = self.run(kind, unpack(state), inputs, micro_batches, schedule)
            return pack(new, state.packing), outs
        mesh = placement_of(state)
        if mesh is None:
            return self.get(StepKey(kind, micro_batches=micro_batches, schedule=schedule), state=state)(state, *inputs)
        placement = Placement(mesh)
        state = _onto_mesh(state, placement)
        inputs = placement.place_batch(inputs, self.steps.eval_input_names if kind is StepKind.EVAL
                                       else self.steps.input_names)
        state_sh = jax.tree.map(lambda x: x.sharding, state)
        shardings = (jax.tree.structure(state), tuple(jax.tree.leaves(state_sh)),
                     tuple(x.sharding for x in inputs))
        return self.get(StepKey(kind, micro_batches=micro_batches, shardings=shardings),
                        placement)(state, *inputs)

    def run_after(self, state, pending: Pending, inputs: tuple, schedule=None):
        """The deferred calls ``pending`` and a train step, as one compiled call (one device)."""
        # Built as a plain tuple: StepKey's own constructor costs a microsecond on this hot path.
        key = tuple.__new__(StepKey, (StepKind.TRAIN_AFTER, state.packing if type(state) is PackedState else None,
                                      1, None, schedule, bool(pending.reset_grad)))
        fn = self.get(key, state=state)
        return fn(state, *self._flag_arrays(pending), *inputs)

    def _flag_arrays(self, pending: Pending) -> tuple:
        """The value arguments of a ``TRAIN_AFTER`` step: optimizer flag, rate flag, rate, schedule flag.

        Arrays made once and reused: a numpy scalar argument costs a host to
        device copy on every call (~1.5 us each on CPU).
        """
        key = (bool(pending.optimizer_step), bool(pending.set_learning_rate), bool(pending.schedule_step))
        values = self._flags.get(key)
        if values is None:
            optimizer, set_rate, schedule = (jax.device_put(np.bool_(f)) for f in key)
            values = (optimizer, set_rate, jax.device_put(np.float32(0.0)), schedule)
            with self._lock:
                values = self._flags.setdefault(key, values)
        if pending.set_learning_rate:
            return values[0], values[1], jax.device_put(np.float32(pending.learning_rate)), values[3]
        return values

    # ------------------------------------------------------------------ compiling

    def get(self, key: StepKey, placement: Optional[Placement] = None, state=None):
        """The compiled step for ``key`` (compiled on first use).

        ``placement`` is the mesh of a sharded key; on first use the step is
        traced for the platform of the mesh, or else of ``state``'s arrays
        (:func:`jaxort.graph.lowering_platform`).
        """
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compile(key, placement, _platform(state, placement))
            with self._lock:
                fn = self._compiled.setdefault(key, fn)
        return fn

    def _compile(self, key: StepKey, placement: Optional[Placement], platform: Optional[str] = None):
        kind, packing = key.kind, key.packing
        flat = packing is not None and self.flat_update_applies(packing)
        core = self._core(key, flat, packing)
        counted = self._counted(kind, core, platform)
        if packing is not None:
            counted = _packed(counted, packing, kind)
        kwargs: dict[str, Any] = {} if kind is StepKind.EVAL else {"donate_argnums": 0}
        if key.shardings is None and key.schedule is None and platform is not None:
            fingerprint = self.fingerprint()
            if fingerprint is not None:
                return CachedStep(
                    counted, jax.jit(counted, **kwargs), fingerprint=fingerprint, platform=platform,
                    static=(kind.value, _packing_text(packing), key.micro_batches, key.reset_grad),
                    donate_state=kind is not StepKind.EVAL,
                    state_out={StepKind.EVAL: "outputs", StepKind.OPTIMIZER: "state"}.get(kind, "both"),
                    on_load=functools.partial(self.loads.update, (kind,)))
        if key.shardings is not None:
            treedef, state_leaves, input_sh = key.shardings
            state_sh = jax.tree.unflatten(treedef, list(state_leaves))
            outputs = placement.replicated
            kwargs["in_shardings"] = (state_sh, *input_sh)
            kwargs["out_shardings"] = {StepKind.EVAL: outputs, StepKind.OPTIMIZER: state_sh}.get(
                kind, (state_sh, outputs))
        return jax.jit(counted, **kwargs)

    def clear(self) -> None:
        """Drops every compiled step (each compiles again on its next use)."""
        with self._lock:
            self._compiled.clear()

    def fingerprint(self) -> Optional[str]:
        """The program's fingerprint for the step cache (:mod:`jaxort.training.step_cache`), or None.

        Computed on first use, and only while the cache is on; None when the
        program gave none (it depends on Python code the cache cannot see).
        """
        if self._fingerprint is None or step_cache_dir() is None:
            return None
        with self._lock:
            if callable(self._fingerprint):
                self._fingerprint = self._fingerprint() or None
        return self._fingerprint

    def _core(self, key: StepKey, flat: bool, packing: Optional[Packing]) -> Callable:
        """The pure step of ``key`` as ``fn(state, *args)``."""
        steps, kind = self.steps, key.kind
        if kind is StepKind.TRAIN:
            return lambda state, *inputs: steps.train(state, inputs, key.micro_batches)
        if kind is StepKind.EVAL:
            return lambda state, *inputs: steps.eval(state, inputs)
        if kind is StepKind.OPTIMIZER:
            return lambda state: steps.optimizer_step(state, flat=flat)
        if kind is StepKind.TRAIN_AND_UPDATE:
            return lambda state, *inputs: steps.train_and_update(state, inputs, key.micro_batches, flat=flat)
        if kind is StepKind.TRAIN_STEPS:
            return lambda state, *inputs: steps.train_steps(state, inputs, flat=flat, schedule=key.schedule)
        # A select runs the deferred optimizer step as one loop over the packed
        # buffer; with large tensors outside it, XLA's cond is faster (MLP
        # 784-500-10: select 1.95 ms, cond 1.59 ms a step; ResNet-18 at
        # widths 3-24, all packed: select 1.45 ms, cond 1.53 ms).
        select = packing is not None and all(
            slot.packed for slot in jax.tree.leaves(packing.slot_tree().params, is_leaf=_is_slot))

        def train_after(state, optimizer_step, set_rate, rate, schedule_step, *inputs):
            pending = Pending(optimizer_step, set_rate, rate, schedule_step, key.reset_grad)
            return steps.train_after(state, pending, inputs, schedule=key.schedule, select=select, flat=flat)
        return train_after

    def _counted(self, kind: StepKind, fn: Callable, platform: Optional[str] = None) -> Callable:
        def counted(*args):
            self.traces[kind] += 1  # runs when jit traces, once per compilation
            with lowering_platform(platform):
                return fn(*args)
        return counted

    def flat_update_applies(self, packing: Packing) -> bool:
        """Whether the optimizer step over states packed with ``packing`` runs flat.

        It does when the optimizer's update is one elementwise formula for
        every parameter (:func:`jaxort.training.optimizers.flat_moments`)
        and the parameters, their gradients and each of their moments each
        lie contiguous, in the same order, in a packed float32 buffer
        (:meth:`Packing.lies_flat`).
        """
        slots = packing.slot_tree()
        moments = flat_moments(self.steps.optimizer, slots.opt_state)
        if moments is None or not slots.params:
            return False
        return packing.lies_flat([slots.params, slots.grads, *moments.values()])


def _platform(state, placement: Optional[Placement]) -> Optional[str]:
    """The platform a step over ``state`` compiles for: the mesh's, the state's arrays', or None (unknown)."""
    if placement is not None:
        return placement.mesh.devices.flat[0].platform
    for leaf in jax.tree.leaves(state):
        if isinstance(leaf, jax.Array):
            platforms = {d.platform for d in leaf.devices()}
            return platforms.pop() if len(platforms) == 1 else None
    return None


def _packing_text(packing: Optional[Packing]) -> str:
    """Every detail of ``packing``, as text that is the same in every process."""
    if packing is None:
        return "unpacked"
    return repr((str(packing.treedef), packing.slots, packing.groups))


def _is_slot(x) -> bool:
    return isinstance(x, Slot)


def _packed(fn: Callable, packing: Packing, kind: StepKind) -> Callable:
    """``fn`` over the packed form: unpacks its state argument and packs the state it returns."""
    @functools.wraps(fn)
    def packed(state: PackedState, *args):
        out = fn(packing.unpack(state), *args)
        if kind is StepKind.EVAL:
            return out
        if kind is StepKind.OPTIMIZER:
            return packing.pack(out)
        return packing.pack(out[0]), out[1]
    return packed


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
