"""Writes tests/fixtures/ort_kinks/: ONNX Runtime's gradients of Relu, LeakyRelu, Clip and Abs at their kinks.

Where a piecewise-linear op has no derivative (Relu and Abs at 0, Clip at a
bound) ONNX Runtime's gradient kernels pick PyTorch's subgradients. These
files record what ORT Training computes there, so jaxort's tests check its
choice against ORT rather than against itself.

Run it with a Python that has onnxruntime-training 1.19.2 and onnx 1.16
(never a jaxort dependency)::

    python tools/make_kink_fixtures.py [output_dir]

The model (opset 17, IR 8): ``y = Concat(Relu(s[0]), LeakyRelu(s[1], alpha
0.1), Clip(s[2], 0, 1), Abs(s[3]))`` with ``s = x + b``, ``x`` an input of
shape [4, 6] and ``b`` a trainable [4, 6] parameter of zeros; MSELoss
against ``target``; SGD. The batch puts values exactly on every kink
(0 for Relu, LeakyRelu and Abs; 0 and 1 for Clip) and beside them.

Files: ``model.onnx`` (given to ``generate_artifacts``), the four artifacts,
and ``expected.npz``: the batch (``x``, ``target``), the loss of one train
step (``loss``) and ``b`` after one optimizer step at learning rate 1
(``b_after``, which is minus the gradient).

This script imports onnxruntime.training and must not import jaxort.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.training import artifacts
from onnxruntime.training.api import CheckpointState, Module, Optimizer

X = np.array([[0.0, 1.0, -1.0, 0.0, 2.0, -0.5],     # Relu: kinks at columns 0 and 3
              [0.0, 1.0, -1.0, 0.0, 2.0, -0.5],     # LeakyRelu
              [0.0, 1.0, -1.0, 0.5, 2.0, 1.0],      # Clip to [0, 1]: bounds at columns 0, 1, 5
              [0.0, 1.0, -1.0, 0.0, 2.0, -0.5]],    # Abs
             np.float32)
TARGET = np.array([[-3.0] * 6, [-3.0] * 6, [3.0] * 6, [-3.0] * 6], np.float32)


def _model() -> onnx.ModelProto:
    rows = [f"s{i}" for i in range(4)]
    nodes = [
        helper.make_node("Add", ["x", "b"], ["s"]),
        helper.make_node("Split", ["s", "split"], rows, axis=0),
        helper.make_node("Relu", ["s0"], ["y0"]),
        helper.make_node("LeakyRelu", ["s1"], ["y1"], alpha=0.1),
        helper.make_node("Clip", ["s2", "lo", "hi"], ["y2"]),
        helper.make_node("Abs", ["s3"], ["y3"]),
        helper.make_node("Concat", ["y0", "y1", "y2", "y3"], ["y"], axis=0),
    ]
    inits = {"b": np.zeros((4, 6), np.float32), "split": np.ones(4, np.int64),
             "lo": np.array(0.0, np.float32), "hi": np.array(1.0, np.float32)}
    graph = helper.make_graph(nodes, "kinks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_kink_fixtures")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main(argv: list[str]) -> None:
    onnxruntime.set_default_logger_severity(3)
    root = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "ort_kinks")
    os.makedirs(root, exist_ok=True)
    model = _model()
    onnx.save(model, os.path.join(root, "model.onnx"))
    artifacts.generate_artifacts(model, requires_grad=["b"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=root)
    path = {n: os.path.join(root, n) for n in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx",
                                               "checkpoint")}
    state = CheckpointState.load_checkpoint(path["checkpoint"])
    module = Module(path["training_model.onnx"], state, path["eval_model.onnx"])
    optimizer = Optimizer(path["optimizer_model.onnx"], module)
    optimizer.set_learning_rate(1.0)
    module.train()
    loss = np.asarray(module(X, TARGET))
    optimizer.step()
    b_after = module.get_contiguous_parameters().numpy().reshape(4, 6)
    np.savez(os.path.join(root, "expected.npz"), x=X, target=TARGET, loss=loss, b_after=b_after)
    print(f"wrote {root}: loss {float(loss):.6f}, gradient\n{-b_after}")


if __name__ == "__main__":
    main(sys.argv)
