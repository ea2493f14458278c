"""Mixed precision: bfloat16 compute where safe, float32 master weights, moments, reductions, softmax and loss.

The loss curves of 200 AdamW steps under ``bfloat16_policy()`` follow the
float32 run within 1e-2 relative on the digits demo MLP and on a small
pre-LN transformer.
"""

from __future__ import annotations

import importlib.util
import pathlib
import tempfile

import jax
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto

from jaxort import checkpoint
from jaxort.demo import build_digits_mlp, load_digits
from jaxort.training import TrainProgram, bfloat16_policy, cast_model, set_learning_rate
from jaxort.training.artifacts import LossType, OptimType, float_initializers, generate_artifacts, read

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator

HERE = pathlib.Path(__file__).resolve().parent
GOLDEN = HERE.parent / "fixtures" / "golden"
BF16 = TensorProto.BFLOAT16


def _patterns_models():
    spec = importlib.util.spec_from_file_location("_pattern_models", HERE.parent / "graph" / "patterns" / "_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _transformer():
    pm = _patterns_models()
    model = pm.transformer(np.random.default_rng(0), blocks=2, batch=8, seq=8, d=32, heads=4, vocab=11)
    for o in model.graph.output:
        o.type.tensor_type.shape.SetInParent()  # the scalar loss
    model.ir_version = 8

    def batch(i):  # fresh inputs each step; the label is learnable: argmax of the first 11 features
        x, mask, _ = pm.transformer_inputs(np.random.default_rng(100 + i), batch=8, seq=8, d=32, vocab=11)
        return x, mask, np.argmax(x[..., :11], -1).astype(np.int64)
    return model, batch


def _digits():
    images, target = load_digits()
    x = (images.reshape(len(images), 64) / 16.0).astype(np.float32)
    y = target.astype(np.int64)

    def batch(i):
        j = (32 * i) % (len(x) - 32)
        return x[j:j + 32], y[j:j + 32]
    return build_digits_mlp(64, 0), batch


def _curve(model, loss, batch, policy, steps=200, lr=0.001):
    with tempfile.TemporaryDirectory() as tmp:
        arts = generate_artifacts(model, float_initializers(model), loss=loss, optimizer=OptimType.AdamW,
                                  artifact_directory=tmp,
                                  gradient_graph=False)  # trained by jaxort only
        start = checkpoint.load(arts.checkpoint)
        prog = TrainProgram.from_artifacts(arts.training_model, arts.eval_model, arts.optimizer_model,
                                           checkpoint=start, policy=policy)
    state = set_learning_rate(prog.init_state(start), lr)
    losses = []
    for i in range(steps):
        state, outs = prog.train_and_update(state, *batch(i))
        losses.append(float(outs[0]))
        assert outs[0].dtype == np.float32
    return np.array(losses), state


@pytest.mark.parametrize("name", ["digits_mlp", "transformer"])
def test_bfloat16_loss_curve_follows_float32(name):
    model, batch = _digits() if name == "digits_mlp" else _transformer()
    loss, lr = (LossType.CrossEntropyLoss, 0.001) if name == "digits_mlp" else (None, 0.003)
    f32, _ = _curve(model, loss, batch, None, lr=lr)
    bf16, state = _curve(model, loss, batch, bfloat16_policy(), lr=lr)
    assert f32[-1] < 0.25 * f32[0]  # the runs learn: 2.47 -> 0.43 (MLP), 2.40 -> 0.52 (transformer)
    rel = np.abs(bf16 - f32) / np.abs(f32)
    assert rel.max() <= 1e-2, (rel.max(), int(rel.argmax()))
    # float32 master weights, gradients and optimizer moments
    for tree in (state.params, state.grads, state.opt_state):
        for leaf in jax.tree.leaves(tree):
            if np.issubdtype(leaf.dtype, np.floating):
                assert leaf.dtype == np.float32


def _node_types(model):
    return [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]


def _sliced(case):
    train = onnx.load(GOLDEN / case / "training_model.onnx")
    info = read.describe_training_model(train)
    return read.slice_model(train, info.output_names, keep_inputs=info.input_names), info


def test_the_loss_stays_float32():
    sliced, info = _sliced("mlp_adamw")
    cast = cast_model(sliced, ml_dtypes.bfloat16, parameters=info.param_inputs + info.param_initializers)
    nodes = list(cast.graph.node)
    loss = next(n for n in nodes if n.op_type == "SoftmaxCrossEntropyLoss")
    producer = {o: n for n in nodes for o in n.output}
    before = producer[loss.input[0]]
    assert before.op_type == "Cast" and before.attribute[0].i == TensorProto.FLOAT  # logits cast up
    assert loss.input[1] == "labels"  # the int64 labels are not cast
    assert {n.op_type for n in nodes if n.op_type != "Cast"} >= {"MatMul", "Add", "Relu"}
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in cast.graph.input}
    assert declared["fc1.weight"] == BF16 and declared["input"] == BF16
    assert cast.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT


def test_a_float_target_read_only_by_the_loss_stays_float32():
    sliced, info = _sliced("cnn_bce")
    cast = cast_model(sliced, ml_dtypes.bfloat16, parameters=info.param_inputs + info.param_initializers)
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in cast.graph.input}
    assert declared["target"] == TensorProto.FLOAT and declared["input"] == BF16
    # Sigmoid, Log, ..., ReduceMean after the last Gemm read float32 values
    ops = [n.op_type for n in cast.graph.node]
    assert ops[ops.index("Gemm") + 1] == "Cast"


def test_softmax_and_reductions_inside_the_model_run_in_float32():
    model, _ = _transformer()
    params = [t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims)]
    cast = cast_model(model, ml_dtypes.bfloat16, parameters=params)
    producer = {o: n for n in cast.graph.node for o in n.output}
    checked = 0
    for n in cast.graph.node:
        if n.op_type in ("Softmax", "ReduceMean"):
            p = producer[n.input[0]]
            assert p.op_type == "Cast" and p.attribute[0].i == TensorProto.FLOAT, (n.name, p.op_type)
            checked += 1
    assert checked == 2 * 1 + 5 * 2  # 2 attention softmaxes, 2 ReduceMean in each of 5 layer norms
    weights = {t.name: t.data_type for t in cast.graph.initializer}
    matmuls = [n for n in cast.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert len(matmuls) == 2 * 6 + 1 and all(weights[n.input[1]] == BF16 for n in matmuls)  # compute in bf16
