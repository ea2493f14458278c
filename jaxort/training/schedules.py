"""Learning-rate schedules: functions of the optimizer step count.

A schedule is an ``optax.Schedule``: ``count -> learning rate``, where
``count`` is the number of optimizer steps done (ORT's group step). Any optax
schedule works with :func:`jaxort.training.apply_schedule`; ORT's
LinearLRScheduler is :func:`linear_lr_schedule`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxort.errors import TrainingError

__all__ = ["linear_lr_schedule"]


def linear_lr_schedule(initial_lr: float, warmup_step_count: int,
                       total_step_count: int) -> optax.Schedule:
    """ORT's LinearLRScheduler: linear warmup from 0, then linear decay to 0.

    With ``n`` the optimizer steps done::

        lr(n) = initial_lr * n / max(1, warmup)                         if n < warmup
        lr(n) = initial_lr * max(0, (total - n) / max(1, total - warmup))  otherwise

    computed in float32 as ORT's C++ scheduler does. The arguments have their
    documented meaning. Note that the Python binding of onnxruntime-training
    1.19.2 (``LinearLRScheduler(optimizer, warmup_step_count,
    total_step_count, initial_lr)``) swaps the two counts internally, so a
    script that relied on that binding gets ORT's numbers from
    ``linear_lr_schedule(initial_lr, total_step_count, warmup_step_count)``.

    Args:
      initial_lr: the peak learning rate.
      warmup_step_count: steps of linear warmup.
      total_step_count: the step at which the learning rate reaches 0.

    Returns:
      A schedule ``count -> float32 learning rate`` (jit-compatible).

    Raises:
      TrainingError: a negative step count.

    Example:
      >>> s = linear_lr_schedule(0.05, 2, 6)
      >>> [round(float(s(n)), 4) for n in range(7)]
      [0.0, 0.025, 0.05, 0.0375, 0.025, 0.0125, 0.0]
    """
    if warmup_step_count < 0 or total_step_count < 0:
        raise TrainingError(
            f"step counts must be >= 0, got warmup {warmup_step_count}, total {total_step_count}")
    lr0 = np.float32(initial_lr)
    warmup = int(warmup_step_count)
    total = int(total_step_count)
    warm_div = np.float32(max(1.0, float(warmup)))
    decay_div = np.float32(max(1.0, float(np.float32(total - warmup))))

    def schedule(count):
        n = jnp.asarray(count)
        nf = n.astype(jnp.float32)
        # XLA rewrites a division by a constant as a multiplication by its
        # reciprocal, which can differ from ORT's float division by one ulp; the
        # barrier keeps the divisors opaque so the division stays a division.
        wdiv, ddiv = jax.lax.optimization_barrier((jnp.float32(warm_div), jnp.float32(decay_div)))
        warm = nf / wdiv
        remain = (jnp.int32(total) - n.astype(jnp.int32)).astype(jnp.float32)
        decay = jnp.maximum(jnp.float32(0.0), remain / ddiv)
        factor = jnp.where(n < warmup, warm, decay)
        return lr0 * factor

    return schedule
