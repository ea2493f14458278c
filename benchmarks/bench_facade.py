"""Facade overhead: jaxort.api vs calling the functional core's jitted steps directly.

One training iteration = ``Module.__call__`` + ``Optimizer.step`` +
``Module.lazy_reset_grad`` on a tiny MLP (20 -> 16 -> 5, batch 8,
CrossEntropyLoss, AdamW), against ``TrainProgram.train_step`` +
``optimizer_step`` + ``lazy_reset_grad`` on a TrainState, in the same process.
Both convert the loss to numpy once per iteration (the facade returns numpy),
so both wait for the device the same way. The target is a ratio <= 2.

Run: ``python benchmarks/bench_facade.py`` (or ``make bench``).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from jaxort import checkpoint as ckpt
from jaxort.api import CheckpointState, Module, Optimizer
from jaxort.training.artifacts import LossType, OptimType, generate_artifacts
from jaxort.training import TrainProgram

ITERS = 100
ROUNDS = 21


def _mlp():
    rng = np.random.default_rng(0)
    inits = {
        "fc1.weight": rng.normal(0, 0.2, (20, 16)).astype(np.float32),
        "fc1.bias": np.zeros(16, np.float32),
        "fc2.weight": rng.normal(0, 0.2, (16, 5)).astype(np.float32),
        "fc2.bias": np.zeros(5, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["input", "fc1.weight"], ["h0"]),
        helper.make_node("Add", ["h0", "fc1.bias"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "fc2.weight"], ["h3"]),
        helper.make_node("Add", ["h3", "fc2.bias"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 20])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _per_iter(step, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t0) / iters


def main() -> int:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 20)).astype(np.float32)
    y = rng.integers(0, 5, size=8).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        generate_artifacts(_mlp(), requires_grad=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
                           loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW, artifact_directory=tmp)
        paths = [f"{tmp}/{n}" for n in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")]

        state = CheckpointState.load_checkpoint(f"{tmp}/checkpoint")
        module = Module(paths[0], state, paths[1])
        optimizer = Optimizer(paths[2], module)

        def facade_step():
            module(x, y)
            optimizer.step()
            module.lazy_reset_grad()

        data = ckpt.load(f"{tmp}/checkpoint")
        program = TrainProgram.from_artifacts(*paths, checkpoint=data)
        core = {"state": program.init_state(data)}

        def core_step():
            s, (loss,) = program.train_step(core["state"], x, y)
            s = program.lazy_reset_grad(program.optimizer_step(s))
            core["state"] = s
            np.asarray(loss)

        for _ in range(20):
            core_step()
            facade_step()
        # Alternate short rounds so that load on a shared machine hits both
        # alike; the fastest round of each is the least disturbed.
        t_core, t_facade = [], []
        for _ in range(ROUNDS):
            t_core.append(_per_iter(core_step, ITERS))
            t_facade.append(_per_iter(facade_step, ITERS))
        core_s, facade_s = min(t_core), min(t_facade)
        paired = statistics.median(f / c for f, c in zip(t_facade, t_core))
    ratio = facade_s / core_s
    print("facade overhead, MLP 20->16->5, batch 8, AdamW: train step + optimizer step + lazy_reset_grad")
    print(f"  functional core (TrainProgram, jitted steps): {core_s * 1e6:8.1f} us/iter")
    print(f"  jaxort.api (Module + Optimizer):              {facade_s * 1e6:8.1f} us/iter")
    print(f"  ratio facade/core: {ratio:.2f}x (target <= 2x); median of paired rounds {paired:.2f}x")
    return 0 if ratio <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
