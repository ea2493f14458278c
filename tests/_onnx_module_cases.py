"""What tests/test_nnx.py and tests/test_equinox.py share: their models, batches and the
functional core's training run they compare the framework modules with."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import onnx
import optax
from onnx import TensorProto, helper, numpy_helper

RESNET = pathlib.Path(__file__).resolve().parent / "fixtures" / "models" / "resnet18"
W1, B1, W2, B2 = "encoder/fc1.weight", "encoder/fc1.bias", "encoder/fc2.weight", "encoder/fc2.bias"


def mlp_model() -> onnx.ModelProto:
    """4 -> 8 (Gemm, weight [out, in], transB=1) -> Relu -> 3 (MatMul, weight [in, out]) -> Reshape."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.normal(size=s) * 0.5).astype(np.float32), n)
             for n, s in ((W1, (8, 4)), (B1, (8,)), (W2, (8, 3)), (B2, (3,)))]
    inits.append(numpy_helper.from_array(np.array([-1, 3], np.int64), "shape"))
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", W1, B1], ["h"], transB=1),
         helper.make_node("Relu", ["h"], ["a"]),
         helper.make_node("MatMul", ["a", W2], ["z"]),
         helper.make_node("Add", ["z", B2], ["y"]),
         helper.make_node("Reshape", ["y", "shape"], ["logits"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mlp_batches(steps: int = 6):
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(steps, 16, 4)).astype(np.float32)
    ys = np.argmax(xs @ rng.normal(size=(4, 3)), axis=-1).astype(np.int32)  # learnable labels
    return xs, ys


def resnet_batches():
    with np.load(RESNET / "batches.npz") as f:
        return f["train::input"], f["train::labels"].astype(np.int32)


def cross_entropy(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def core_losses(apply, params: dict, frozen: dict, batches, tx, *, training: bool):
    """The functional core's run: jax.value_and_grad of the loss over ``params``, then optax.

    ``apply(params, frozen, x, training) -> (logits, updates)``.
    """

    @jax.jit
    def step(params, frozen, opt_state, x, y):
        def loss_fn(params):
            logits, updates = apply(params, frozen, x, training)
            return cross_entropy(logits, y), updates

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        moves, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, moves), {**frozen, **updates}, opt_state, loss

    opt_state, losses = tx.init(params), []
    for x, y in zip(*batches):
        params, frozen, opt_state, loss = step(params, frozen, opt_state, x, y)
        losses.append(float(loss))
    return losses, params, frozen


def mlp_head_core_losses(kernel, bias, batches, tx):
    """The functional core's run of the user models of test_nnx and test_equinox: the ONNX MLP,
    ReLU, then a dense head with initial ``kernel`` ``[in, out]`` and ``bias``.

    Returns ``(losses, trained)``; ``trained`` holds ``body`` (the MLP's initializers),
    ``kernel`` and ``bias``.
    """
    from jaxort.graph import JaxGraph

    graph = JaxGraph(mlp_model())
    params = {"body": {n: jax.numpy.asarray(v) for n, v in graph.params.items()}, "kernel": kernel, "bias": bias}

    def apply(p, frozen, x, training):
        (logits,), updates = graph.apply_with_updates(p["body"], x, training=training)
        return jax.nn.relu(logits) @ p["kernel"] + p["bias"], updates

    losses, trained, _ = core_losses(apply, params, {}, batches, tx, training=False)
    return losses, trained
