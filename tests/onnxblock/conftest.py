"""Models and runners shared by the jaxort.onnxblock tests.

References are numpy formulas and ``jax.grad`` of the same functions written in
jax.numpy here; onnxruntime inference runs the graphs the blocks build, and
their gradient graphs run in jaxort's executor and, where it has their ops, in
onnxruntime.
"""

from __future__ import annotations

import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

IN, HIDDEN, REG, CLASSES, BATCH = 6, 8, 3, 5, 4


def two_head_params(seed: int = 0) -> dict:
    """Parameters of :func:`two_head_model`: a shared hidden layer, a regression and a class head."""
    rng = np.random.default_rng(seed)
    shapes = {"w1": (IN, HIDDEN), "b1": (HIDDEN,), "w_reg": (HIDDEN, REG), "b_reg": (REG,),
              "w_cls": (HIDDEN, CLASSES), "b_cls": (CLASSES,)}
    return {k: (rng.normal(size=s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def two_head_model(params: dict, opset: int = 17) -> onnx.ModelProto:
    """x [BATCH, IN] -> relu(x w1 + b1) -> ``reg`` [BATCH, REG] and ``cls`` [BATCH, CLASSES]."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "w_reg"], ["r0"]),
        helper.make_node("Add", ["r0", "b_reg"], ["reg"]),
        helper.make_node("MatMul", ["h", "w_cls"], ["c0"]),
        helper.make_node("Add", ["c0", "b_cls"], ["cls"]),
    ]
    graph = helper.make_graph(
        nodes, "two_heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, IN])],
        [helper.make_tensor_value_info("reg", TensorProto.FLOAT, [BATCH, REG]),
         helper.make_tensor_value_info("cls", TensorProto.FLOAT, [BATCH, CLASSES])],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def scores_model(shape, opset: int = 17) -> onnx.ModelProto:
    """``scores = x * w`` (w a [shape[-1]] initializer of ones), for the losses' tests."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["scores"])], "scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, list(shape))],
        [numpy_helper.from_array(np.ones(shape[-1], np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def weighted_losses(ob):
    """ORT's documented custom loss, 0.4 * MSE(reg) + 0.6 * cross-entropy(cls), written against ``ob``.

    ``ob`` is ``jaxort.onnxblock`` or ``onnxruntime.training.onnxblock``: only the import differs.
    """

    class WeightedLosses(ob.Block):
        def __init__(self):
            super().__init__()
            self._loss1 = ob.loss.MSELoss()
            self._loss2 = ob.loss.CrossEntropyLoss()
            self._w1 = ob.blocks.Constant(0.4)
            self._w2 = ob.blocks.Constant(0.6)
            self._add = ob.blocks.Add()
            self._mul = ob.blocks.Mul()

        def build(self, reg, cls):
            return self._add(self._mul(self._w1(), self._loss1(reg, target_name="target")),
                             self._mul(self._w2(), self._loss2(cls, labels_name="labels")))

    return WeightedLosses()


def ort_run(model: onnx.ModelProto, feeds: dict, outputs=None) -> list:
    """Runs ``model`` with onnxruntime inference on the feeds it takes."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(outputs, {n: feeds[n] for n in names})


def gradient_runs(training_model: onnx.ModelProto, trainable, feeds: dict) -> dict:
    """Runner -> {param: ``<param>_grad``} of a training model, its accumulators cut off.

    jaxort's graph executor always; onnxruntime where it has every op of the graph
    (inference for standard ops only; onnxruntime-training's sessions also have the
    gradient kernels, ReluGrad, SoftmaxCrossEntropyLossGrad, ..., that the rules write
    where ORT's gradient builder does).
    """
    from jaxort.graph import JaxGraph

    model = onnx.ModelProto()
    model.CopyFrom(training_model)
    g = model.graph
    kept = [n for n in g.node if n.op_type != "InPlaceAccumulatorV2"]
    del g.node[:]
    g.node.extend(kept)
    del g.output[:]
    g.output.extend(helper.make_tensor_value_info(f"{p}_grad", TensorProto.FLOAT, None) for p in trainable)
    inputs = [i for i in g.input if not i.name.endswith("_grad.accumulation.buffer") and i.name != "lazy_reset_grad"]
    del g.input[:]
    g.input.extend(inputs)
    graph = JaxGraph(model, params=[], check=False)
    runs = {"jaxort": [np.asarray(v) for v in graph.apply(graph.params, *(feeds[i.name] for i in graph.inputs))]}
    try:
        import onnxruntime.training  # noqa: F401
        ort_has_gradient_kernels = True
    except ImportError:
        ort_has_gradient_kernels = False
    if ort_has_gradient_kernels or all(n.domain in ("", "ai.onnx") for n in g.node):
        runs["onnxruntime"] = ort_run(model, feeds)
    return {runner: dict(zip(trainable, got)) for runner, got in runs.items()}


def cross_entropy(scores, labels, weight=None, reduction="mean", ignore_index=None, xp=np):
    """Softmax cross-entropy as ONNX's SoftmaxCrossEntropyLoss defines it (classes on axis 1)."""
    z = scores - xp.max(scores, axis=1, keepdims=True)
    log_prob = z - xp.log(xp.sum(xp.exp(z), axis=1, keepdims=True))
    safe = labels if ignore_index is None else xp.where(labels == ignore_index, 0, labels)
    picked = xp.take_along_axis(log_prob, safe[:, None], axis=1)[:, 0]
    w = xp.ones(labels.shape, scores.dtype) if weight is None else xp.asarray(weight)[safe]
    if ignore_index is not None:
        w = w * (labels != ignore_index)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return xp.sum(loss)
    return xp.sum(loss) / xp.sum(w)


# torch.nn.utils.clip_grad_norm_(params, max_norm) on these gradients (torch 2.13.0, CPU), recorded:
# case -> ((gradients a, b), max_norm, total norm, (clipped a, b)). test_ort.py recomputes them
# where torch is installed.
TORCH_CLIP = {
    "clipped": (([[3.0, -4.0], [1.0, 2.0]], [0.5, -1.5, 2.5]), 2.0, 6.224950313568115,
                ([[0.9638630151748657, -1.2851506471633911], [0.3212876617908478, 0.6425753235816956]],
                 [0.1606438308954239, -0.48193150758743286, 0.8032191395759583])),
    "kept": (([[0.3, -0.4], [0.1, 0.2]], [0.05, -0.15, 0.25]), 2.0, 0.6224949359893799,
             ([[0.30000001192092896, -0.4000000059604645], [0.10000000149011612, 0.20000000298023224]],
              [0.05000000074505806, -0.15000000596046448, 0.25])),
    "at_max": (([[3.0, 4.0]], [0.0]), 5.0, 5.0, ([[2.9999992847442627, 3.9999990463256836]], [0.0])),
}


def clip_grad_norm(grads: dict, max_norm: float) -> dict:
    """torch.nn.utils.clip_grad_norm_: total = sqrt(sum of squares), scale by max_norm / (total + 1e-6) if < 1."""
    total = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64))) for g in grads.values()))
    coef = max_norm / (total + 1e-6)
    return {k: (g * coef).astype(np.float32) if coef < 1 else g for k, g in grads.items()}


@pytest.fixture
def rng():
    """A seeded numpy Generator."""
    return np.random.default_rng(1234)


@pytest.fixture
def helpers():
    """The model builders, runners and references of this module."""
    return types.SimpleNamespace(
        two_head_params=two_head_params, two_head_model=two_head_model, scores_model=scores_model,
        ort_run=ort_run, gradient_runs=gradient_runs, cross_entropy=cross_entropy,
        TORCH_CLIP=TORCH_CLIP, clip_grad_norm=clip_grad_norm, weighted_losses=weighted_losses,
        IN=IN, HIDDEN=HIDDEN, REG=REG, CLASSES=CLASSES, BATCH=BATCH)
