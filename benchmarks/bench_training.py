"""Training step throughput: jaxort's fused train step vs the same network in hand-written JAX.

Network: MLP 784 -> 500 -> 10 (MatMul/Add/Relu/MatMul/Add), mean softmax
cross-entropy (ONNX SoftmaxCrossEntropyLoss), AdamW, batch 64, float32.
jaxort runs ``TrainProgram.train_and_update`` on the ONNX model; the
reference is jax.numpy + ``optax.adamw`` under one ``jax.jit``, both with the
state donated, measured alternately in the same process. Prints steps/s and
the ratio jaxort / hand-written (target >= 0.9).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
from onnx import TensorProto, helper, numpy_helper

from jaxort import checkpoint as ckpt
from jaxort.training import TrainProgram, adamw_optimizer, set_learning_rate

BATCH, D_IN, D_HID, D_OUT = 64, 784, 500, 10
STEPS = 200
ROUNDS = 5


def _params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "fc1.weight": (rng.standard_normal((D_IN, D_HID)) / np.sqrt(D_IN)).astype(np.float32),
        "fc1.bias": np.zeros(D_HID, np.float32),
        "fc2.weight": (rng.standard_normal((D_HID, D_OUT)) / np.sqrt(D_HID)).astype(np.float32),
        "fc2.bias": np.zeros(D_OUT, np.float32),
    }


def _onnx_model(params: dict) -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["input", "fc1.weight"], ["h0"]),
        helper.make_node("Add", ["h0", "fc1.bias"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "fc2.weight"], ["h3"]),
        helper.make_node("Add", ["h3", "fc2.bias"], ["output"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["output", "labels"], ["loss"],
                         reduction="mean"),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", D_IN]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _time(step, state, batches) -> tuple[float, object]:
    start = time.perf_counter()
    for i in range(STEPS):
        x, y = batches[i % len(batches)]
        state, out = step(state, x, y)
    jax.block_until_ready(out)
    return STEPS / (time.perf_counter() - start), state


def main() -> None:
    params = _params()
    rng = np.random.default_rng(1)
    batches = [(jnp.asarray(rng.standard_normal((BATCH, D_IN)).astype(np.float32)),
                jnp.asarray(rng.integers(0, D_OUT, BATCH).astype(np.int32)))
               for _ in range(8)]

    start = ckpt.Checkpoint(trainable=dict(params))
    program = TrainProgram.from_artifacts(_onnx_model(params), optimizer_model=adamw_optimizer(),
                                          checkpoint=start)
    jstate = set_learning_rate(program.init_state(start), 1e-3)

    tx = optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0)

    def loss_fn(p, x, y):
        h = jax.nn.relu(x @ p["fc1.weight"] + p["fc1.bias"])
        logits = h @ p["fc2.weight"] + p["fc2.bias"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def _hand_step(s, x, y):
        p, o = s
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        u, o = tx.update(g, o, p)
        return (optax.apply_updates(p, u), o), loss

    hand_step = jax.jit(_hand_step, donate_argnums=0)
    hp = {k: jnp.asarray(v) for k, v in params.items()}
    hstate = (hp, tx.init(hp))

    # Compile and warm up both.
    for _ in range(20):
        jstate, _ = program.train_and_update(jstate, *batches[0])
        hstate, _ = hand_step(hstate, *batches[0])
    jax.block_until_ready((jstate, hstate))

    best_j = best_h = 0.0
    for _ in range(ROUNDS):
        rate, jstate = _time(program.train_and_update, jstate, batches)
        best_j = max(best_j, rate)
        rate, hstate = _time(hand_step, hstate, batches)
        best_h = max(best_h, rate)
    print(f"MLP {D_IN}->{D_HID}->{D_OUT}, batch {BATCH}, AdamW, {jax.devices()[0].platform}")
    print(f"  jaxort train_and_update : {best_j:8.1f} steps/s")
    print(f"  hand-written JAX + optax: {best_h:8.1f} steps/s")
    print(f"  ratio jaxort / hand     : {best_j / best_h:8.3f}  (target >= 0.9)")
    print(f"  compilations (jaxort)   : {program.trace_count()}")


if __name__ == "__main__":
    main()
