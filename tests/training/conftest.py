"""Shared helpers for the training tests: small ONNX models built with onnx.helper, numpy references."""

from __future__ import annotations

import pathlib
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def dropout_model(w: np.ndarray, ratio: float = 0.5) -> onnx.ModelProto:
    """x[B,n] @ W -> Dropout(ratio, training_mode=true) -> SoftmaxCrossEntropyLoss(labels)."""
    n, k = w.shape
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Dropout", ["h", "ratio", "training_mode"], ["d"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["d", "labels"], ["loss"], reduction="mean"),
    ]
    inits = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(np.array(ratio, np.float32), "ratio"),
        numpy_helper.from_array(np.array(True), "training_mode"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", n]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["B"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        inits)


def bn_model(channels: int, momentum: float, epsilon: float, params: dict) -> onnx.ModelProto:
    """BatchNormalization (inference form) -> y*y -> ReduceMean: the loss."""
    nodes = [
        helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"],
                         momentum=momentum, epsilon=epsilon),
        helper.make_node("Mul", ["y", "y"], ["y2"]),
        helper.make_node("ReduceMean", ["y2"], ["loss"], keepdims=0),
    ]
    inits = [numpy_helper.from_array(params[n], n) for n in ("scale", "bias", "mean", "var")]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", channels, 4, 4])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        inits)


def mlp_softmax_ce(params: dict, x: np.ndarray, labels: np.ndarray):
    """Loss and gradients of the golden MLP (MatMul/Add/Relu/MatMul/Add, mean CE), float64."""
    w1, b1 = params["fc1.weight"].astype(np.float64), params["fc1.bias"].astype(np.float64)
    w2, b2 = params["fc2.weight"].astype(np.float64), params["fc2.bias"].astype(np.float64)
    x = x.astype(np.float64)
    pre = x @ w1 + b1
    h = np.maximum(pre, 0.0)
    z = h @ w2 + b2
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    n = x.shape[0]
    loss = -np.mean(np.log(p[np.arange(n), labels]))
    dz = p.copy()
    dz[np.arange(n), labels] -= 1.0
    dz /= n
    dh = (dz @ w2.T) * (pre > 0)
    grads = {"fc1.weight": x.T @ dh, "fc1.bias": dh.sum(0),
             "fc2.weight": h.T @ dz, "fc2.bias": dz.sum(0)}
    return loss, grads


@pytest.fixture
def models():
    """The model builders and numpy references of this module."""
    return types.SimpleNamespace(dropout_model=dropout_model, bn_model=bn_model,
                                 mlp_softmax_ce=mlp_softmax_ce)


GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"


def _golden_case(case: str):
    """A golden case's ORT artifacts as a program: (program, start checkpoint, batches npz, folder)."""
    from jaxort import checkpoint as ckpt
    from jaxort.training import TrainProgram

    folder = GOLDEN / case
    start = ckpt.load(folder / "checkpoint")
    program = TrainProgram.from_artifacts(
        folder / "training_model.onnx", folder / "eval_model.onnx",
        folder / "optimizer_model.onnx", checkpoint=start)
    return program, start, np.load(folder / "batches.npz"), folder


@pytest.fixture
def golden():
    """Loads a case of tests/fixtures/golden (copied from ONNX Runtime Training's outputs)."""
    return _golden_case
