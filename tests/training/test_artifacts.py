"""jaxort.training.artifacts.generate_artifacts against ONNX Runtime Training's files.

References: tests/fixtures/golden/ (ORT 1.19.2's artifacts for five models)
and tests/fixtures/ort_generated/ (ORT's artifacts for four more, written by
tools/make_ort_fixtures.py). Numbers are checked with onnxruntime inference.
"""

from __future__ import annotations

import json
import pathlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from jaxort import checkpoint as ckpt
from jaxort.training.artifacts import LossType, OptimType, float_initializers, generate_artifacts
from jaxort.errors import TrainingError
from jaxort.graph import JaxGraph
from jaxort.training import TrainProgram, set_learning_rate
from jaxort.training.artifacts import (
    CUSTOM_LOSS_KEY,
    build_optimizer_model,
    build_training_model,
)
from jaxort.training.artifacts import trim_inference_batchnorm_outputs

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = FIXTURES / "golden"
ORT_GENERATED = FIXTURES / "ort_generated"

# ORT numbers names with one process-wide counter; these are the counts it had
# reached before each golden case was generated.
GOLDEN_CASES = {
    "mlp_adamw": (LossType.CrossEntropyLoss, 6),
    "mlp_sgd": (LossType.CrossEntropyLoss, 12),
    "mlp_frozen": (LossType.MSELoss, 18),
    "cnn_bce": (LossType.BCEWithLogitsLoss, 27),
    "l1_gemm": (LossType.L1Loss, 53),
}
BUFFER = "_grad.accumulation.buffer"


def _golden_params(case):
    """(trainable, frozen) names of a golden case, from ORT's training model."""
    train = onnx.load(GOLDEN / case / "training_model.onnx")
    trainable = [i.name[: -len(BUFFER)] for i in train.graph.input if i.name.endswith(BUFFER)]
    inits = [t.name for t in onnx.load(GOLDEN / case / "model.onnx").graph.initializer]
    return trainable, [n for n in inits if n not in trainable]


def _renumber(text: str, delta: int) -> str:
    return re.sub(r"onnx::([^:\s\"']+)::(\d+)",
                  lambda m: f"onnx::{m.group(1)}::{int(m.group(2)) + delta}", text)


def _ort_run(model, feeds):
    data = model if isinstance(model, (str, bytes)) else (
        str(model) if isinstance(model, pathlib.Path) else model.SerializeToString())
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


# ---------------------------------------------------------------- same files as ORT


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_eval_model_is_byte_identical_to_ort_golden(case):
    loss, offset = GOLDEN_CASES[case]
    trainable, frozen = _golden_params(case)
    _, eval_model, _, _ = build_training_model(
        GOLDEN / case / "model.onnx", trainable, frozen, loss, name_offset=offset)
    assert eval_model.SerializeToString() == (GOLDEN / case / "eval_model.onnx").read_bytes()


@pytest.mark.parametrize("case, optim, offset", [
    ("mlp_adamw", OptimType.AdamW, 10), ("mlp_sgd", OptimType.SGD, 16),
    ("cnn_bce", OptimType.AdamW, 51)])
def test_optimizer_model_is_byte_identical_to_ort_golden(case, optim, offset):
    model = build_optimizer_model(optim, TensorProto.FLOAT, 17, name_offset=offset)
    assert model.SerializeToString() == (GOLDEN / case / "optimizer_model.onnx").read_bytes()


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_training_model_io_matches_ort_golden(case, tmp_path):
    loss, offset = GOLDEN_CASES[case]
    trainable, frozen = _golden_params(case)
    arts = generate_artifacts(GOLDEN / case / "model.onnx", trainable, frozen, loss,
                              OptimType.AdamW, tmp_path)
    ours = onnx.load(arts.training_model)
    theirs = onnx.load(GOLDEN / case / "training_model.onnx")
    io = lambda vis: [(v.name, v.type.SerializeToString()) for v in vis]  # noqa: E731
    assert io(ours.graph.input) == io(theirs.graph.input)
    # ORT's outputs: loss, then one bool accumulation flag per gradient, which the
    # gradient graph's InPlaceAccumulatorV2 nodes compute.
    assert [_renumber(o.name, offset) for o in ours.graph.output] == [o.name for o in theirs.graph.output]
    assert [o.type for o in ours.graph.output] == [o.type for o in theirs.graph.output]
    assert [o.name for o in theirs.graph.output[1:]] == [
        f"{n}_grad.accumulation.out" for n in trainable]
    # ORT's own gradient kernels where its gradient builder writes them (ReluGrad, Scale, ...).
    contrib = lambda m: {(n.domain, n.op_type) for n in m.graph.node if n.domain not in ("", "ai.onnx")}  # noqa: E731
    assert contrib(ours) == contrib(theirs)
    assert (tmp_path / "checkpoint").read_bytes() == (GOLDEN / case / "checkpoint").read_bytes()


@pytest.mark.parametrize("case", sorted(p.name for p in ORT_GENERATED.iterdir() if p.is_dir()))
def test_artifacts_match_ort_generated(case, tmp_path):
    args = json.loads((ORT_GENERATED / case / "args.json").read_text())
    offset = args.pop("name_offset")
    args["loss"] = LossType[args["loss"]]
    args["optimizer"] = args["optimizer"] and OptimType[args["optimizer"]]
    ref = ORT_GENERATED / case
    arts = generate_artifacts(ref / "model.onnx", artifact_directory=tmp_path, **args)

    kwargs = {k: args.get(k) for k in ("additional_output_names", "loss_input_names", "gradient_graph")}
    _, eval_model, _, _ = build_training_model(
        ref / "model.onnx", args["requires_grad"], args["frozen_params"], args["loss"],
        name_offset=offset, **kwargs)
    theirs = onnx.load(ref / "eval_model.onnx")
    # jaxort's one change: BatchNormalization switched to inference mode keeps
    # one output, so onnxruntime can load the model (ORT's own eval model fails).
    trim_inference_batchnorm_outputs(theirs.graph)
    assert eval_model.SerializeToString() == theirs.SerializeToString()
    ort.InferenceSession(eval_model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert _renumber(str(onnx.load(arts.eval_model)), offset) == str(eval_model)

    assert arts.checkpoint.read_bytes() == (ref / "checkpoint").read_bytes()
    if args.get("nominal_checkpoint"):
        # jaxort's nominal checkpoint keeps dims (ORT 1.19.2 writes none).
        ours, theirs = ckpt.load(arts.nominal_checkpoint), ckpt.load(ref / "nominal_checkpoint")
        assert ours.is_nominal and theirs.is_nominal
        for mine, other in ((ours.trainable, theirs.trainable), (ours.frozen, theirs.frozen)):
            assert list(mine) == list(other)
            assert [v.dtype for v in mine.values()] == [v.dtype for v in other.values()]

    if args["optimizer"] is None:
        assert arts.optimizer_model is None and not (ref / "optimizer_model.onnx").exists()
    else:
        opt_ours = str(onnx.load(arts.optimizer_model))
        opt_theirs = str(onnx.load(ref / "optimizer_model.onnx"))
        delta = _first_index(opt_theirs) - _first_index(opt_ours)
        assert _renumber(opt_ours, delta) == opt_theirs

    ours_t = onnx.load(arts.training_model)
    theirs_t = onnx.load(ref / "training_model.onnx")
    assert [(i.name, i.type) for i in ours_t.graph.input] == [
        (i.name, i.type) for i in theirs_t.graph.input]
    # The user outputs, then one accumulation flag per trainable parameter.
    assert [_renumber(o.name, offset) for o in ours_t.graph.output] == [o.name for o in theirs_t.graph.output]
    # Initializers that are neither trainable nor frozen stay constants.
    assert {t.name for t in ours_t.graph.initializer} >= {
        t.name for t in onnx.load(ref / "model.onnx").graph.initializer} - set(
        args["requires_grad"] or []) - set(args["frozen_params"])


def _first_index(text: str) -> int:
    return int(re.search(r"onnx::[^:\s\"']+::(\d+)", text).group(1))


@pytest.mark.skipif(onnx.IR_VERSION < 11, reason="the installed onnx cannot check IR 11 models")
def test_models_are_readable_by_ort_1_19(tmp_path):
    """ORT 1.19.2 reads IR <= 10: an IR 11 input is lowered to 10, the opset is kept."""
    model = onnx.load(GOLDEN / "l1_gemm" / "model.onnx")
    model.ir_version = 11
    arts = generate_artifacts(model, requires_grad=["fc.weight", "fc.bias"], loss=LossType.L1Loss,
                              optimizer=OptimType.SGD, artifact_directory=tmp_path, prefix="p_")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "p_checkpoint", "p_eval_model.onnx", "p_optimizer_model.onnx", "p_training_model.onnx"]
    for path in (arts.training_model, arts.eval_model, arts.optimizer_model):
        m = onnx.load(path)
        assert m.ir_version == 10
        assert {o.domain: o.version for o in m.opset_import}[""] == 17


# ---------------------------------------------------------------- numbers


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_loss_equals_ort_eval_model_on_golden(case, tmp_path):
    loss, _ = GOLDEN_CASES[case]
    trainable, frozen = _golden_params(case)
    arts = generate_artifacts(GOLDEN / case / "model.onnx", trainable, frozen, loss,
                              OptimType.AdamW, tmp_path)
    params = dict(np.load(GOLDEN / case / "params_after.npz"))
    batches = np.load(GOLDEN / case / "batches.npz")
    feeds = {k.split("::", 1)[1]: batches[k] for k in batches.files if k.startswith("eval::")}
    feeds.update(params)
    (ort_loss,) = _ort_run(GOLDEN / case / "eval_model.onnx", feeds)
    (our_loss,) = _ort_run(arts.eval_model, feeds)
    assert our_loss == ort_loss
    recorded = json.loads((GOLDEN / case / "trajectory.json").read_text())["eval_loss_after"]
    np.testing.assert_allclose(ort_loss, recorded, rtol=1e-6)

    program = TrainProgram.from_artifacts(arts.training_model, arts.eval_model,
                                          arts.optimizer_model, checkpoint=ckpt.load(arts.checkpoint))
    state = program.init_state(ckpt.Checkpoint(
        trainable={n: params[n] for n in trainable}, frozen={n: params[n] for n in frozen}))
    names = program.eval_input_names
    (jax_loss,) = program.eval_step(state, *[feeds[n] for n in names])
    np.testing.assert_allclose(np.asarray(jax_loss), ort_loss, rtol=1e-5, atol=1e-6)


def _labels(loss, rng, n, c):
    if loss is LossType.CrossEntropyLoss:
        return rng.integers(0, c, n).astype(np.int64)
    if loss is LossType.BCEWithLogitsLoss:
        return (rng.random((n, c)) > 0.5).astype(np.float32)
    return rng.random((n, c)).astype(np.float32)


MLP_PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def _mlp(seed=0, n_in=12, hidden=16, n_out=5):
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.4, (n_in, hidden)).astype(np.float32), "fc1.weight"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "fc1.bias"),
        numpy_helper.from_array(rng.normal(0, 0.4, (hidden, n_out)).astype(np.float32), "fc2.weight"),
        numpy_helper.from_array(np.zeros(n_out, np.float32), "fc2.bias"),
    ]
    nodes = [
        helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["h"], name="fc1"),
        helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
        helper.make_node("Gemm", ["t", "fc2.weight", "fc2.bias"], ["output"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", n_out])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("optim", list(OptimType), ids=lambda o: o.name)
@pytest.mark.parametrize("loss", list(LossType), ids=lambda l: l.name)
def test_generated_artifacts_train(loss, optim, tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 12)).astype(np.float32)
    y = _labels(loss, rng, 16, 5)
    arts = generate_artifacts(_mlp(), MLP_PARAMS, loss=loss, optimizer=optim, artifact_directory=tmp_path)
    assert arts.label_names == (("labels",) if loss is LossType.CrossEntropyLoss else ("target",))
    start = ckpt.load(arts.checkpoint)
    program = TrainProgram.from_artifacts(arts.training_model, arts.eval_model,
                                          arts.optimizer_model, checkpoint=start)
    assert program.trainable_names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert program.optimizer.optimizer_type == optim.name
    state = set_learning_rate(program.init_state(start), 0.02 if optim is OptimType.AdamW else 0.3)
    feeds = {"input": x, arts.label_names[0]: y}

    (ort_start,) = _ort_run(arts.eval_model, {**feeds, **start.parameters})
    losses = []
    for _ in range(12):
        state, (step_loss,) = program.train_step(state, x, y)
        state = program.lazy_reset_grad(program.optimizer_step(state))
        losses.append(float(step_loss))
    # The first train step sees the initial parameters: ORT's number.
    np.testing.assert_allclose(losses[0], ort_start, rtol=1e-5)
    assert losses[-1] < 0.8 * losses[0]
    assert all(b < a for a, b in zip(losses, losses[1:]))

    trained = {k: np.asarray(v) for k, v in {**state.params, **state.frozen}.items()}
    (ort_loss,) = _ort_run(arts.eval_model, {**feeds, **trained})
    (jax_loss,) = program.eval_step(state, x, y)
    np.testing.assert_allclose(np.asarray(jax_loss), ort_loss, rtol=1e-5, atol=1e-7)


def test_requires_grad_none_trains_nothing_and_refuses_an_optimizer(tmp_path):
    """As ORT 1.19.2: requires_grad=None makes nothing trainable (the files are
    compared with ORT's in test_artifacts_match_ort_generated[mlp_no_requires_grad_ce]);
    where ORT's optimizer generation then fails with an IndexError, jaxort
    names the fix and writes nothing."""
    model = onnx.load(ORT_GENERATED / "mlp_frozen_ce_adamw" / "model.onnx")
    with pytest.raises(TrainingError, match=r"requires_grad=None trains nothing.*float_initializers"):
        generate_artifacts(model, frozen_params=["fc1.weight", "fc1.bias"], loss=LossType.CrossEntropyLoss,
                           optimizer=OptimType.SGD, artifact_directory=tmp_path / "none")
    assert not (tmp_path / "none").exists()
    arts = generate_artifacts(model, frozen_params=["fc1.weight", "fc1.bias"], loss=LossType.CrossEntropyLoss,
                              artifact_directory=tmp_path / "frozen")
    state = ckpt.load(arts.checkpoint)
    assert list(state.trainable) == [] and list(state.frozen) == ["fc1.weight", "fc1.bias"]
    assert arts.optimizer_model is None


def test_float_initializers_trains_every_weight(tmp_path):
    """float_initializers(model, exclude) lists the float initializers (not the int64 shape)."""
    model = onnx.load(ORT_GENERATED / "mlp_frozen_ce_adamw" / "model.onnx")
    frozen = ["fc1.weight", "fc1.bias"]
    names = float_initializers(model, exclude=frozen)
    assert names == ["fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    assert float_initializers(model) == frozen + names
    arts = generate_artifacts(model, requires_grad=names, frozen_params=frozen,
                              loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                              artifact_directory=tmp_path)
    state = ckpt.load(arts.checkpoint)
    assert list(state.trainable) == names
    assert list(state.frozen) == frozen
    train = onnx.load(arts.training_model)
    assert [t.name for t in train.graph.initializer] == ["shape"]
    assert [i.name for i in train.graph.input if i.name.endswith(BUFFER)] == [f"{n}{BUFFER}" for n in names]
    # The same files as ORT's, which named the same parameters.
    assert arts.checkpoint.read_bytes() == (ORT_GENERATED / "mlp_frozen_ce_adamw" / "checkpoint").read_bytes()


def test_additional_outputs_and_loss_input_names(tmp_path):
    ref = ORT_GENERATED / "two_outputs_mse_sgd"
    arts = generate_artifacts(ref / "model.onnx", ["w", "b"], loss=LossType.MSELoss, optimizer=OptimType.SGD,
                              artifact_directory=tmp_path, loss_input_names=["out_a"],
                              additional_output_names=["out_b"])
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 5)).astype(np.float32)
    t = rng.normal(size=(4, 3)).astype(np.float32)
    params = ckpt.load(arts.checkpoint).parameters
    loss, out_b = _ort_run(arts.eval_model, {"input": x, "target": t, **params})
    out_a = x @ params["w"] + params["b"]
    np.testing.assert_allclose(loss, np.mean((out_a - t) ** 2), rtol=1e-5)
    np.testing.assert_allclose(out_b, np.tanh(out_a), rtol=1e-5)


def test_custom_jax_loss(tmp_path):
    """A JAX callable loss: the models end at its inputs, and it comes back in the result."""

    def smooth_l1(output, target):
        d = jnp.abs(output - target)
        return jnp.mean(jnp.where(d < 1.0, 0.5 * d * d, d - 0.5))

    arts = generate_artifacts(_mlp(), MLP_PARAMS, loss=smooth_l1, optimizer=OptimType.SGD,
                              artifact_directory=tmp_path)
    assert arts.loss_fn is smooth_l1
    assert arts.label_names == ("target",)
    train = onnx.load(arts.training_model)
    # No gradient graph (the loss is not ONNX): one ai.jaxort node stands for it, so ONNX
    # Runtime refuses the file rather than train it with zero gradients.
    assert [o.name for o in train.graph.output] == ["output"] + [
        f"{n}_grad.accumulation.out" for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")]
    assert [(n.domain, n.op_type) for n in train.graph.node if n.domain] == [("ai.jaxort", "NoGradientGraph")]
    props = {p.key: p.value for p in train.metadata_props}
    assert props[CUSTOM_LOSS_KEY] == smooth_l1.__qualname__
    params = ckpt.load(arts.checkpoint).parameters
    names = list(params)
    graph = JaxGraph(train, param_inputs=names, inputs=["input"], outputs=["output"], check=False)

    rng = np.random.default_rng(2)
    x = rng.normal(size=(8, 12)).astype(np.float32)
    t = rng.normal(size=(8, 5)).astype(np.float32) * 2

    def objective(p):
        return arts.loss_fn(graph.apply(p, x)[0], t)

    (ort_out,) = _ort_run(arts.eval_model, {"input": x, **params})
    d = np.abs(ort_out - t)
    expected = np.mean(np.where(d < 1.0, 0.5 * d * d, d - 0.5))
    p = {k: jnp.asarray(v) for k, v in params.items()}
    np.testing.assert_allclose(float(objective(p)), expected, rtol=1e-5)
    grad = jax.jit(jax.grad(objective))
    for _ in range(10):
        p = jax.tree.map(lambda a, g: a - 0.1 * g, p, grad(p))
    assert float(objective(p)) < 0.9 * expected


def test_a_model_made_with_a_jax_loss_needs_that_loss_to_train(tmp_path):
    """The training model records its JAX loss; a program refuses it without the callable."""

    def weighted(output, target, scale=2.0):
        return scale * jnp.mean((output - target) ** 2)

    arts = generate_artifacts(_mlp(), MLP_PARAMS, loss=weighted, optimizer=OptimType.SGD,
                              artifact_directory=tmp_path)
    assert arts.label_names == ("target",)  # `scale` has a default: an option, not a label
    start = ckpt.load(arts.checkpoint)
    with pytest.raises(TrainingError, match=r"generated with the JAX loss '.*weighted'.*\['target'\]"):
        TrainProgram.from_artifacts(arts.training_model, arts.eval_model, arts.optimizer_model,
                                    checkpoint=start)
    program = TrainProgram.from_artifacts(arts.training_model, arts.eval_model, arts.optimizer_model,
                                          checkpoint=start, loss_fn=weighted)
    assert program.input_names == ["input", "target"]
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 12)).astype(np.float32)
    t = rng.normal(size=(8, 5)).astype(np.float32)
    (ort_out,) = _ort_run(arts.eval_model, {"input": x, **start.parameters})
    _, (loss, out) = program.train_step(program.init_state(start), x, t)
    np.testing.assert_allclose(np.asarray(out), ort_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(loss), 2.0 * np.mean((ort_out - t) ** 2), rtol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(requires_grad=["fc1.weight"], frozen_params=["fc1.weight"]), "frozen and require"),
    (dict(requires_grad=["nope"]), "not initializers"),
    (dict(loss="MSELoss"), "unknown loss"),
    (dict(loss=LossType.MSELoss, optimizer="SGD"), "unknown optimizer"),
    (dict(loss=LossType.MSELoss, ort_format=True), "ort_format"),
    (dict(loss=LossType.MSELoss, custom_op_library="libcustom.so"), "custom_op_library"),
    (dict(loss=LossType.MSELoss, loss_input_names=["missing"]), "missing"),
])
def test_errors(kwargs, message, tmp_path):
    with pytest.raises(TrainingError, match=message):
        generate_artifacts(_mlp(), artifact_directory=tmp_path, **kwargs)


def test_onnxblock_blocks_are_refused_not_taken_for_jax_losses(tmp_path):
    # ORT's onnxblock.loss.MSELoss() and optim.AdamW() are callables; a Block must not
    # pass for a JAX loss. (Classes here stand in for them: onnxblock needs onnxruntime-training.)
    def block(name):
        return type(name, (), {"__module__": "onnxruntime.training.onnxblock.loss", "__call__": lambda self, *a: a})()

    with pytest.raises(TrainingError, match=r"the loss MSELoss is an onnxruntime.training.onnxblock block"):
        generate_artifacts(_mlp(), loss=block("MSELoss"), artifact_directory=tmp_path)
    with pytest.raises(TrainingError, match=r"the optimizer AdamW is an onnxruntime.training.onnxblock block"):
        generate_artifacts(_mlp(), loss=LossType.MSELoss, optimizer=block("AdamW"), artifact_directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def _det_model(path):
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(size=(4, 9)).astype(np.float32), "w")
    square = numpy_helper.from_array(np.array([5, 3, 3], np.int64), "square")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Reshape", ["h", "square"], ["m"], name="to_matrices"),
         helper.make_node("Det", ["m"], ["y"], name="act")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])], [w, square])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return numpy_helper.to_array(w)


def test_an_op_without_a_rule_gives_jaxort_only_artifacts_and_a_warning_naming_it(tmp_path, monkeypatch):
    from jaxort.api import CheckpointState, Module
    from jaxort.errors import NoGradientGraphWarning
    from jaxort.training.artifacts.gradient import RULES

    monkeypatch.delitem(RULES, "Det")  # as if Det had no rule (it has one)
    w = _det_model(tmp_path / "m.onnx")
    with pytest.warns(NoGradientGraphWarning, match=r"node 'act' \(ai.onnx::Det\) has no gradient rule") \
            as caught:
        arts = generate_artifacts(tmp_path / "m.onnx", ["w"], loss=LossType.MSELoss, optimizer=OptimType.AdamW,
                                  artifact_directory=tmp_path / "a")
    assert "'act'" in caught[0].message.reason and caught[0].filename == __file__
    assert arts.gradient_graph is False
    train = onnx.load(arts.training_model)
    assert [(n.domain, n.op_type) for n in train.graph.node if n.domain] == [("ai.jaxort", "NoGradientGraph")]
    with pytest.raises(Exception, match="NoGradientGraph"):  # ONNX Runtime refuses rather than train on zeros
        ort.InferenceSession(str(arts.training_model), providers=["CPUExecutionProvider"])

    # jaxort trains them: the gradient of mean((det(x @ w as 3x3 matrices) - t)^2), written out
    # in numpy (d det(M) / dM = det(M) inv(M)^T).
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5, 4)).astype(np.float32)
    t = rng.normal(size=(5,)).astype(np.float32)
    state = CheckpointState.load_checkpoint(arts.checkpoint)
    module = Module(str(arts.training_model), state, str(arts.eval_model))
    loss = module(x, t)
    m = (x.astype(np.float64) @ w).reshape(5, 3, 3)
    y = np.linalg.det(m)
    dy = 2 * (y - t) / y.size
    dm = (dy * y)[:, None, None] * np.linalg.inv(m).transpose(0, 2, 1)
    np.testing.assert_allclose(loss, np.mean((y - t) ** 2), rtol=1e-5)
    np.testing.assert_allclose(state.parameters["w"].grad, x.T @ dm.reshape(5, 9), rtol=1e-4, atol=1e-6)

    with pytest.raises(TrainingError, match=r"node 'act' \(ai.onnx::Det\) has no gradient rule"):
        generate_artifacts(tmp_path / "m.onnx", ["w"], loss=LossType.MSELoss, artifact_directory=tmp_path / "b",
                           gradient_graph=True)
    assert not (tmp_path / "b").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arts = generate_artifacts(tmp_path / "m.onnx", ["w"], loss=LossType.MSELoss,
                                  artifact_directory=tmp_path / "c", gradient_graph=False)
    assert arts.gradient_graph is False


def test_a_model_with_every_rule_gets_the_gradient_graph_without_a_warning(tmp_path):
    model = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arts = generate_artifacts(model, float_initializers(model), loss=LossType.MSELoss,
                                  artifact_directory=tmp_path)
    assert arts.gradient_graph is True
    ops = {n.op_type for n in onnx.load(arts.training_model).graph.node}
    assert "InPlaceAccumulatorV2" in ops and "NoGradientGraph" not in ops
