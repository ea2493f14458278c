"""Data-parallel overhead check: 8 fake CPU devices vs 1 device on the same global batch.

XLA_FLAGS=--xla_force_host_platform_device_count=8 makes 8 CPU devices of
this machine's cores, so the 8-device run cannot be faster: it splits the
same work into 8 parts and adds the all-reduce of the gradients. What this
measures is the cost of the sharded step (batch placement, collectives,
in/out shardings), not a speed-up. Network: the digits MLP widened to
64 -> 512 -> 10, AdamW, global batch 256, ``TrainProgram.train_and_update``
with the state donated, each step waiting for its loss; rounds of the two
runs alternate in one process.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxort import checkpoint  # noqa: E402
from jaxort.demo import build_digits_mlp  # noqa: E402
from jaxort.training import TrainProgram, make_mesh, set_learning_rate, shard  # noqa: E402
from jaxort.training.artifacts import LossType, OptimType, float_initializers, generate_artifacts  # noqa: E402

BATCH, HIDDEN = 256, 512
STEPS, ROUNDS = 100, 5


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = build_digits_mlp(HIDDEN, 0)
        arts = generate_artifacts(model, float_initializers(model), loss=LossType.CrossEntropyLoss,
                                  optimizer=OptimType.AdamW, artifact_directory=tmp)
        start = checkpoint.load(arts.checkpoint)
        prog = TrainProgram.from_artifacts(arts.training_model, arts.eval_model, arts.optimizer_model,
                                           checkpoint=start)
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, 64), np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.int64)
    mesh = make_mesh((jax.device_count(),), ("data",))
    states = {"1 device": jax.device_put(set_learning_rate(prog.init_state(start), 0.001), jax.devices()[0]),
              f"{jax.device_count()} devices, data parallel": shard(
                  set_learning_rate(prog.init_state(start), 0.001), mesh, "data")}
    best = {k: 0.0 for k in states}
    for name in states:  # compile
        states[name], (loss,) = prog.train_and_update(states[name], x, y)
        jax.block_until_ready(loss)
    for _ in range(ROUNDS):
        for name in states:
            t0 = time.perf_counter()
            for _ in range(STEPS):
                states[name], (loss,) = prog.train_and_update(states[name], x, y)
                # Each step waits for its loss, as a loop that logs it does: with many sharded
                # steps in flight, XLA's in-process collectives over fake CPU devices can
                # stall on 2 cores (a rendezvous timeout aborts the process).
                jax.block_until_ready(loss)
            best[name] = max(best[name], STEPS / (time.perf_counter() - t0))
    print(f"MLP 64-{HIDDEN}-10, AdamW, global batch {BATCH}, {os.cpu_count()} CPU cores "
          f"(fake devices: an overhead check, not a speed-up)")
    for name, rate in best.items():
        print(f"  {name:<28s} {rate:8.1f} steps/s")
    one, many = best.values()
    print(f"  8-device / 1-device       {many / one:8.2f}")
    losses = [float(prog.eval_step(s, x, y)[0]) for s in states.values()]
    print(f"  eval loss after training  {losses[0]:.6f} vs {losses[1]:.6f}")


if __name__ == "__main__":
    main()
