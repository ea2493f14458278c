"""Training a model whose NonZero reads the batch: the step compiles once per NonZero count.

The model pools the rows of ``x`` where ``ids == 2`` (as BART pools at its ``</s>``
tokens), so NonZero's output shape changes with the batch's values. Checked against
numpy's SGD on the same batches, through the core and ``jaxort.api``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from jaxort import checkpoint as ckpt
from jaxort.api import CheckpointState, Module, Optimizer
from jaxort.errors import TrainingError
from jaxort.training import TrainProgram
from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

W0 = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5) / 10
LR = 1e-3  # ORT's default learning rate
# (rows, seed) of each batch: NonZero counts 5, 4, 5, then a smaller batch.
BATCHES = [(3, 0), (3, 5), (3, 4), (2, 3)]


def _model() -> onnx.ModelProto:
    nodes = [helper.make_node("Equal", ["ids", "two"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "idx"], ["rows"]),
             helper.make_node("MatMul", ["rows", "W"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["y"], axes=[0], keepdims=1)]
    graph = helper.make_graph(
        nodes, "pool",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor("two", TensorProto.INT64, [], [2]), onnx.numpy_helper.from_array(W0, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("pool")
    generate_artifacts(_model(), requires_grad=["W"], loss=LossType.MSELoss, optimizer=OptimType.SGD,
                       artifact_directory=out)
    return out


def _batch(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 4, (rows, 5)), rng.standard_normal((rows, 5, 4)).astype(np.float32),
            np.zeros((1, 3), np.float32))


def _numpy_sgd():
    """Losses and W of SGD on MSE(mean of the selected rows @ W, 0), numpy."""
    w, losses = W0.astype(np.float64), []
    for rows, seed in BATCHES:
        ids, x, target = _batch(rows, seed)
        mean_row = x[ids == 2].astype(np.float64).mean(axis=0)
        y = mean_row @ w
        losses.append(np.mean((y - target[0]) ** 2))
        w = w - LR * np.outer(mean_row, 2 * (y - target[0]) / 3)
    return np.array(losses), w


def test_the_core_trains_to_numpy_s_sgd_compiling_once_per_count(artifacts):
    start = ckpt.load(artifacts / "checkpoint")
    program = TrainProgram.from_artifacts(artifacts / "training_model.onnx", artifacts / "eval_model.onnx",
                                          artifacts / "optimizer_model.onnx", checkpoint=start)
    state = program.init_state(start)
    losses, traces = [], []
    for rows, seed in BATCHES:
        state, outs = program.train_and_update(state, *_batch(rows, seed))
        losses.append(float(outs[0]))
        traces.append(program.trace_count("train_and_update"))
    want_losses, want_w = _numpy_sgd()
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    np.testing.assert_allclose(state.params["W"], want_w, rtol=1e-5)
    # Counts 5, 4, 5 on 3-row batches, then a 2-row batch: three programs, none for the repeat.
    assert [int((_batch(r, s)[0] == 2).sum()) for r, s in BATCHES[:3]] == [5, 4, 5]
    assert traces == [1, 2, 2, 3]
    (eval_loss,) = program.eval_step(state, *_batch(*BATCHES[0]))
    ids, x, _ = _batch(*BATCHES[0])
    want_eval = np.mean((x[ids == 2].mean(axis=0) @ np.asarray(state.params["W"])) ** 2)
    np.testing.assert_allclose(float(eval_loss), want_eval, rtol=1e-5)


def test_the_api_facade_trains_it_too(artifacts):
    state = CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    module = Module(str(artifacts / "training_model.onnx"), state, str(artifacts / "eval_model.onnx"))
    optimizer = Optimizer(str(artifacts / "optimizer_model.onnx"), module)
    losses = []
    for rows, seed in BATCHES:
        losses.append(float(module(*_batch(rows, seed))))
        optimizer.step()
        module.lazy_reset_grad()
    want_losses, want_w = _numpy_sgd()
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    np.testing.assert_allclose(state.parameters["W"].data, want_w, rtol=1e-5)


def test_steps_that_would_split_or_stack_batches_are_refused_by_name(artifacts):
    start = ckpt.load(artifacts / "checkpoint")
    program = TrainProgram.from_artifacts(artifacts / "training_model.onnx", None,
                                          artifacts / "optimizer_model.onnx", checkpoint=start)
    state = program.init_state(start)
    ids, x, target = _batch(4, 0)
    with pytest.raises(TrainingError, match=r"micro_batches cannot split .* \['nz'\]"):
        program.train_step(state, ids, x, target, micro_batches=2)
    with pytest.raises(TrainingError, match="train_steps cannot stack batches of this model"):
        program.train_steps(state, ids[None], x[None], target[None])


def test_past_max_host_shapes_the_compiled_steps_are_dropped_with_a_warning(artifacts):
    start = ckpt.load(artifacts / "checkpoint")
    program = TrainProgram.from_artifacts(artifacts / "training_model.onnx", None,
                                          artifacts / "optimizer_model.onnx", checkpoint=start)
    program.max_host_shapes = 2
    state = program.init_state(start)
    for rows, seed in BATCHES[:2]:  # counts 5 and 4
        state, _ = program.train_and_update(state, *_batch(rows, seed))
    assert program.trace_count("train_and_update") == 2
    with pytest.warns(RuntimeWarning, match=r"compiled for 2 shapes of its host ops' outputs \['nz'\]"):
        state, _ = program.train_and_update(state, *_batch(*BATCHES[3]))  # a third shape
    state, _ = program.train_and_update(state, *_batch(*BATCHES[0]))  # count 5 again: dropped, compiles again
    assert program.trace_count("train_and_update") == 4
