"""One process of test_distributed.py's two-process run on localhost.

Usage: _distributed_worker.py PORT PROCESS_ID OUT_DIR. Joins a 2-process
run (coordinator on 127.0.0.1:PORT, CPU collectives through gloo, 2 CPU
devices per process), trains the golden MLP for 5 steps on the 4-device
global mesh under "data" and "fsdp" with its own half of each batch, saves
the fsdp checkpoint once, and writes its losses and parameters to OUT_DIR.
"""

import os
import pathlib
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxort import distributed  # noqa: E402
from jaxort.training import TrainProgram, set_learning_rate, shard  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "golden" / "mlp_adamw"


def main(port: str, process_id: str, out_dir: str) -> None:
    distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id),
                           initialization_timeout=60)
    assert jax.process_count() == 2 and jax.device_count() == 4, (jax.process_count(), jax.devices())
    start = distributed.load_checkpoint(GOLDEN / "checkpoint")
    prog = TrainProgram.from_artifacts(GOLDEN / "training_model.onnx", GOLDEN / "eval_model.onnx",
                                       GOLDEN / "optimizer_model.onnx", checkpoint=start)
    data = np.load(GOLDEN / "batches.npz")
    x, y = data["train::input"], data["train::labels"]
    result = {}
    for strategy, axes in (("data", ("data",)), ("fsdp", ("fsdp",))):
        state = shard(set_learning_rate(prog.init_state(start), 0.01), distributed.global_mesh(axis_names=axes),
                      strategy)
        losses = []
        for i in range(5):
            xi, yi = distributed.local_batch(x[i], y[i])  # this process's 4 of the 8 rows
            state, (loss,) = prog.train_step(state, xi, yi)
            state = prog.lazy_reset_grad(prog.optimizer_step(state))
            losses.append(float(loss))
        result[f"{strategy}::losses"] = np.array(losses)
        params = prog.to_checkpoint(state).trainable  # gathered on every process
        for n, v in params.items():
            result[f"{strategy}::param::{n}"] = v
        result[f"{strategy}::spec"] = np.array(str(state.params["fc1.weight"].sharding.spec))
    distributed.save_checkpoint(prog, state, pathlib.Path(out_dir) / "checkpoint")
    np.savez(pathlib.Path(out_dir) / f"process{process_id}.npz", **result)
    distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
