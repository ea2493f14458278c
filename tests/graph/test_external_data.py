"""Models whose weights live in external data files, at a small size.

Every entry point that takes a model takes one saved with onnx's
``save_as_external_data``; ``save_model`` writes one (the threshold
lowered). References: numpy's math on the same weights, onnxruntime on the
files, and the same model with its data inline. ``make test-large`` runs the
2.6 GB version (tests/large).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import jaxort.api as api
from jaxort import checkpoint as ckpt
from jaxort.cli import main
from jaxort.errors import ModelError
from jaxort.graph import JaxGraph, check_model, load_model, save_model, tensor_to_numpy
from jaxort.session import TrainingSession, load_checkpoint
from jaxort.training import TrainProgram
from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

D = 32


def _weights():
    rng = np.random.default_rng(0)
    return {f"W{i}": (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for i in range(3)}


def _model(weights) -> onnx.ModelProto:
    """y = x @ W0 + x @ W1 + x @ W2 + c, with a constant c (an initializer no one trains)."""
    c = np.linspace(-1, 1, D, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", n], [f"m{n}"]) for n in weights]
    nodes.append(helper.make_node("Sum", [f"m{n}" for n in weights] + ["c"], ["y"]))
    inits = [numpy_helper.from_array(w, n) for n, w in weights.items()] + [numpy_helper.from_array(c, "c")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["N", D])],
                              [helper.make_tensor_value_info("y", 1, ["N", D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _reference(x, weights):
    return sum(x @ w for w in weights.values()) + np.linspace(-1, 1, D, dtype=np.float32)


@pytest.fixture()
def external(tmp_path):
    """The model saved by onnx with every tensor in ``model.onnx.data``."""
    path = tmp_path / "model" / "model.onnx"
    path.parent.mkdir()
    onnx.save(_model(_weights()), path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path


def _x():
    return np.random.default_rng(1).standard_normal((5, D)).astype(np.float32)


def test_load_model_maps_external_data_instead_of_reading_it(external, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # locations resolve against the model's directory, not the cwd
    model = load_model(external)
    w0 = model.graph.initializer[0]
    assert w0.data_location == onnx.TensorProto.EXTERNAL and not w0.raw_data
    arr = tensor_to_numpy(w0)
    assert isinstance(arr.base, np.memmap) or isinstance(arr, np.memmap)
    np.testing.assert_array_equal(arr, _weights()["W0"])
    graph = JaxGraph(str(external))
    (y,) = graph.apply(graph.params, _x())
    np.testing.assert_allclose(np.asarray(y), _reference(_x(), _weights()), rtol=1e-5, atol=1e-5)


def test_missing_short_or_escaping_external_data_is_named(external, tmp_path):
    data = external.parent / "model.onnx.data"
    full = data.read_bytes()
    data.write_bytes(full[:100])
    with pytest.raises(ModelError, match=r"initializer 'W0'.*model\.onnx\.data.*holds 100 bytes"):
        load_model(external)
    data.unlink()
    with pytest.raises(ModelError, match=r"'W0'.*model\.onnx\.data"):
        load_model(external)
    model = onnx.load(external, load_external_data=False)
    model.graph.initializer[0].external_data[0].value = "../elsewhere.data"
    onnx.save(model, external)
    with pytest.raises(ModelError, match=r"'W0'.*'\.\./elsewhere\.data' is not a file inside the model's directory"):
        load_model(external)


def test_the_checker_runs_on_the_graph_without_its_weights(external):
    model = load_model(external)  # checked by path
    check_model(model)  # a proto with external data: its weights become inputs for the checker
    model.graph.node[0].input[0] = "nowhere"
    with pytest.raises(ModelError, match="nowhere"):
        check_model(model)


def test_save_model_moves_tensors_out_above_the_threshold(tmp_path):
    model = _model(_weights())
    path = tmp_path / "out.onnx"
    data = save_model(model, path, external_data_threshold=1000)
    assert data == str(path) + ".data" and os.path.getsize(data) >= 3 * D * D * 4
    assert os.path.getsize(path) < 2000
    # The proto now refers to the file it was written with, and still traces.
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer[:3])
    x = _x()
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, _reference(x, _weights()), rtol=1e-5, atol=1e-5)
    graph = JaxGraph(model)
    np.testing.assert_allclose(np.asarray(graph.apply(graph.params, x)[0]), y, rtol=1e-6, atol=1e-6)
    # Below the threshold, external data is read back in: the file stands alone.
    alone = tmp_path / "alone.onnx"
    assert save_model(model, alone) is None
    os.remove(data)
    (y2,) = ort.InferenceSession(str(alone), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y2, y)


def test_a_failed_save_model_leaves_nothing_behind(tmp_path, monkeypatch):
    path = tmp_path / "out.onnx"
    save_model(_model(_weights()), path)
    before = path.read_bytes()
    real = os.replace

    def fail(src, dst):
        if str(dst).endswith("out.onnx"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(ModelError, match=r"cannot write .*out\.onnx.*No space left"):
        save_model(_model(_weights()), path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


def _artifacts(source, out):
    return generate_artifacts(source, requires_grad=["W0", "W1", "W2"], loss=LossType.MSELoss,
                              optimizer=OptimType.AdamW, artifact_directory=out)


def test_generate_artifacts_from_external_data_equals_inline(external, tmp_path):
    a = _artifacts(str(external), tmp_path / "ext")
    b = _artifacts(_model(_weights()), tmp_path / "inline")
    for name in ("checkpoint", "training_model", "eval_model", "optimizer_model"):
        assert getattr(a, name).read_bytes() == getattr(b, name).read_bytes(), name


@pytest.fixture()
def artifacts_with_external_constants(tmp_path):
    """Artifacts whose training and eval models keep the constant ``c`` in external data files."""
    arts = _artifacts(_model(_weights()), tmp_path / "arts")
    for f in (arts.training_model, arts.eval_model):
        save_model(load_model(f, check=False), f, external_data_threshold=0)
        assert os.path.exists(f"{f}.data")
    return arts


def _numpy_steps(x, target, steps):
    """MSE + ORT's default AdamW (Hugging Face mode, eps 1e-6, no decay, lr 1e-3), float64."""
    w = {k: v.astype(np.float64) for k, v in _weights().items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.zeros_like(a) for k, a in w.items()}
    losses = []
    for t in range(1, steps + 1):
        y = _reference(x.astype(np.float64), w)
        losses.append(np.mean((y - target) ** 2))
        g = x.T.astype(np.float64) @ (2 * (y - target) / y.size)
        for k in w:
            m[k] = 0.9 * m[k] + 0.1 * g
            v[k] = 0.999 * v[k] + 0.001 * g * g
            w[k] = w[k] - 1e-3 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m[k] / (np.sqrt(v[k]) + 1e-6)
    return losses, w


def test_every_entry_point_trains_artifacts_with_external_data(artifacts_with_external_constants, tmp_path):
    arts = artifacts_with_external_constants
    x = _x()
    target = np.random.default_rng(2).standard_normal((5, D)).astype(np.float32)
    ref_losses, ref_w = _numpy_steps(x, target, 2)

    state = api.CheckpointState.load_checkpoint(str(arts.checkpoint))
    module = api.Module(str(arts.training_model), state, str(arts.eval_model))
    optimizer = api.Optimizer(str(arts.optimizer_model), module)
    losses = []
    for _ in range(2):
        losses.append(float(module(x, target)))
        optimizer.step()
        module.lazy_reset_grad()
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for k, w in ref_w.items():
        np.testing.assert_allclose(state.parameters[k].data, w, rtol=1e-4, atol=1e-6)
    module.export_model_for_inferencing(str(tmp_path / "inf.onnx"), ["y"])
    (y,) = ort.InferenceSession(str(tmp_path / "inf.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, _reference(x, {k: w.astype(np.float32) for k, w in ref_w.items()}),
                               rtol=1e-4, atol=1e-5)

    with TrainingSession(load_checkpoint(str(arts.checkpoint)), str(arts.training_model),
                         str(arts.eval_model), str(arts.optimizer_model)) as session:
        first = float(np.asarray(session.train_step(x, target)[0]))
    np.testing.assert_allclose(first, ref_losses[0], rtol=1e-5)

    program = TrainProgram.from_artifacts(arts.training_model, arts.eval_model, arts.optimizer_model)
    _, outputs = program.train_step(program.init_state(ckpt.load(arts.checkpoint)), x, target)
    np.testing.assert_allclose(float(outputs[0]), ref_losses[0], rtol=1e-5)

    np.savez(tmp_path / "data.npz", x=np.concatenate([x, x]), target=np.concatenate([target, target]))
    out_ckpt = tmp_path / "cli_checkpoint"
    assert main(["train", "--artifacts", str(arts.checkpoint.parent), "--data", str(tmp_path / "data.npz"),
                 "--batch-size", "5", "--no-shuffle", "--no-progress", "--lr", "0.001",
                 "--checkpoint-out", str(out_ckpt)]) == 0
    saved = ckpt.load(out_ckpt)
    for k, w in ref_w.items():
        np.testing.assert_allclose(saved.trainable[k], w, rtol=1e-4, atol=1e-6)


def test_a_failed_external_save_keeps_the_model_whole(tmp_path, monkeypatch):
    model = _model(_weights())
    path = tmp_path / "out.onnx"
    real = os.replace

    def fail(src, dst):
        if str(dst).endswith("out.onnx"):
            raise OSError(5, "Input/output error")
        return real(src, dst)

    save_model(_model({k: 2 * w for k, w in _weights().items()}), path, external_data_threshold=1000)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(ModelError, match=r"cannot write .*out\.onnx.*Input/output error"):
        save_model(model, path, external_data_threshold=1000)
    monkeypatch.undo()
    # The previous pair is untouched, and no temporary file is left.
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    # Its tensors hold their bytes again, and the model saves whole afterwards.
    assert all(t.data_location != onnx.TensorProto.EXTERNAL and t.raw_data for t in model.graph.initializer)
    for name, w in _weights().items():
        np.testing.assert_array_equal(tensor_to_numpy(next(t for t in model.graph.initializer if t.name == name)), w)
    save_model(model, path, external_data_threshold=1000)
    x = _x()
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, _reference(x, _weights()), rtol=1e-5, atol=1e-5)


def test_nominal_checkpoint_and_load_to_model_with_external_data(external, tmp_path):
    arts = generate_artifacts(str(external), requires_grad=["W0", "W1", "W2"], loss=LossType.MSELoss,
                              optimizer=OptimType.AdamW, artifact_directory=tmp_path / "arts",
                              nominal_checkpoint=True)
    nominal = ckpt.load(arts.nominal_checkpoint)
    assert nominal.is_nominal and {k: v.shape for k, v in nominal.trainable.items()} == {
        k: (D, D) for k in ("W0", "W1", "W2")}
    # Trained values go into the model whose weights are external; the constant stays external.
    trained = {k: w + 1 for k, w in _weights().items()}
    ckpt.save(ckpt.load(arts.checkpoint).replace(trainable=trained), tmp_path / "trained")
    model = ckpt.load_to_model(tmp_path / "trained", load_model(external))
    c = next(t for t in model.graph.initializer if t.name == "c")
    assert c.data_location == onnx.TensorProto.EXTERNAL
    save_model(model, tmp_path / "merged.onnx", external_data_threshold=1000)
    x = _x()
    (y,) = ort.InferenceSession(str(tmp_path / "merged.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, _reference(x, trained), rtol=1e-5, atol=1e-5)


def test_generate_artifacts_writes_models_over_the_limit_with_external_data(tmp_path, monkeypatch):
    # The limit lowered to 1 KiB: the constant c (128 bytes) stays inline, and the models that hold it
    # still pass; a 4 KiB constant moves to <model>.data.
    import jaxort.graph._model as model_module

    monkeypatch.setattr(model_module, "MAX_MODEL_BYTES", 1024)
    weights = _weights()
    model = _model(weights)
    big = np.linspace(0, 1, 1024, dtype=np.float32).reshape(32, 32)
    model.graph.initializer.append(numpy_helper.from_array(big, "B"))
    model.graph.node.insert(0, helper.make_node("MatMul", ["x", "B"], ["xb"]))
    model.graph.node[-1].input.append("xb")
    arts = _artifacts(model, tmp_path / "arts")
    for f in (arts.training_model, arts.eval_model):
        assert os.path.getsize(f"{f}.data") >= big.nbytes and os.path.getsize(f) < 64 * 1024
    x = _x()
    target = np.random.default_rng(2).standard_normal((5, D)).astype(np.float32)
    params = {k: w for k, w in weights.items()}
    (loss,) = ort.InferenceSession(str(arts.eval_model), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "target": target, **params})
    y = _reference(x, weights) + x @ big
    np.testing.assert_allclose(loss, np.mean((y - target) ** 2), rtol=1e-5)
    module = api.Module(str(arts.training_model), api.CheckpointState.load_checkpoint(str(arts.checkpoint)),
                        str(arts.eval_model))
    np.testing.assert_allclose(float(module(x, target)), np.mean((y - target) ** 2), rtol=1e-5)
