"""Deferred calls: what runs between two train steps of ORT's loop, and in which order.

ORT's training loop is a train step, an optimizer step, a learning-rate change
(``SetLearningRate`` or a scheduler step) and a lazy gradient reset. The
session facades defer the calls after a train step to the next one, so the
loop runs as one compiled call a step (:meth:`TrainProgram.train_step_after`).
:class:`Pending` is such a set of deferred calls and :func:`run_pending` the
one function that runs them, in :data:`ORDER`, whether they run one by one
on a state (a flush before a read, a state on a mesh) or inside a compiled
step with flags given as arrays. Layer: training (imports nothing above it).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax.numpy as jnp

from jaxort.training.state import TrainState, apply_schedule, set_learning_rate

__all__ = ["ORDER", "Pending", "run_pending"]

# The deferred calls in the order they run. A lazy reset commutes with the
# other three (it only marks the next train step as overwriting).
ORDER = ("optimizer_step", "learning_rate", "schedule_step", "reset_grad")


class Pending(NamedTuple):
    """Calls deferred to the next train step; each runs only when asked for.

    Each flag is a Python bool (the call runs or not) or, inside a compiled
    step, a bool scalar array (the call's result is selected by it) — except
    ``reset_grad``, which is always a Python bool: a train step that
    overwrites the gradients is a program of its own (it does not read them).

    Attributes:
      optimizer_step: apply the optimizer to the accumulated gradients.
      set_learning_rate: set the learning rate to ``learning_rate``.
      learning_rate: the rate ``set_learning_rate`` sets.
      schedule_step: set the learning rate from the registered schedule.
      reset_grad: the next train step overwrites the gradients.
    """

    optimizer_step: Any = False
    set_learning_rate: Any = False
    learning_rate: Any = 0.0
    schedule_step: Any = False
    reset_grad: bool = False

    @property
    def any(self) -> bool:
        """Whether any call is pending (Python bools only)."""
        return bool(self.optimizer_step or self.set_learning_rate or self.schedule_step or self.reset_grad)

    def then(self, call: str, learning_rate: Optional[float] = None) -> Optional["Pending"]:
        """These calls followed by ``call`` (a name of :data:`ORDER`), or None if that would run it out of order.

        A call that is already pending, or that would run before one that
        is, cannot join: the caller runs the pending ones first, then defers
        ``call`` alone. Two learning-rate sets in a row are one, the later
        rate winning.

        Raises:
          ValueError: ``call`` is not one of :data:`ORDER`.
        """
        # Run between two compiled steps: tuples are built directly (a
        # NamedTuple's _replace costs several times as much).
        optimizer, set_rate, rate, schedule, reset = self
        if call == "reset_grad":
            return _pending((optimizer, set_rate, rate, schedule, True))
        if call == "optimizer_step":
            return None if optimizer or set_rate or schedule else _pending((True, False, rate, False, reset))
        if call == "learning_rate":  # after a pending schedule step it would run out of order
            return None if schedule else _pending((optimizer, True, float(learning_rate), False, reset))
        if call == "schedule_step":
            return None if schedule else _pending((optimizer, set_rate, rate, True, reset))
        raise ValueError(f"cannot defer {call!r}: one of {ORDER}")


def _pending(values: tuple) -> Pending:
    return tuple.__new__(Pending, values)


def run_pending(state: TrainState, pending: Pending, *, optimizer_step: Callable,
                lazy_reset_grad: Callable, schedule: Optional[Callable] = None) -> TrainState:
    """Runs the calls of ``pending`` on ``state``, in :data:`ORDER`.

    With Python bool flags each call runs or not; with array flags (inside
    a compiled step) every call is traced and its result kept where its flag
    is true. The optimizer step decides itself how to honour an array flag.

    Args:
      state: the state (a TrainState, or any value the callables take).
      pending: the calls.
      optimizer_step: ``optimizer_step(state)`` runs the optimizer step;
        with an array flag it is called ``optimizer_step(state, when=flag)``.
      lazy_reset_grad: ``lazy_reset_grad(state)``, called when ``reset_grad``.
      schedule: the learning-rate schedule of ``schedule_step``.

    Returns:
      The new state.
    """
    if isinstance(pending.optimizer_step, bool):
        if pending.optimizer_step:
            state = optimizer_step(state)
    else:
        state = optimizer_step(state, when=pending.optimizer_step)
    if isinstance(pending.set_learning_rate, bool):
        if pending.set_learning_rate:
            state = set_learning_rate(state, pending.learning_rate)
    else:
        state = state.replace(learning_rate=jnp.where(pending.set_learning_rate, pending.learning_rate,
                                                      state.learning_rate))
    if isinstance(pending.schedule_step, bool):
        if pending.schedule_step:
            state = apply_schedule(state, schedule)
    elif schedule is not None:
        scheduled = apply_schedule(state, schedule).learning_rate
        state = state.replace(learning_rate=jnp.where(pending.schedule_step, scheduled, state.learning_rate))
    if pending.reset_grad:
        state = lazy_reset_grad(state)
    return state
