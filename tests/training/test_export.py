"""export_model_for_inferencing against ORT's exported model and onnxruntime inference."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from jaxort import checkpoint as ckpt
from jaxort.training.artifacts import LossType, OptimType, float_initializers, generate_artifacts
from jaxort.errors import InputError, TrainingError
from jaxort.training import TrainProgram, set_learning_rate
from jaxort.training.artifacts import export_model_for_inferencing

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = FIXTURES / "golden" / "mlp_adamw"


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_matches_ort_export_on_golden():
    params = dict(np.load(GOLDEN / "params_after.npz"))
    model = export_model_for_inferencing(GOLDEN / "eval_model.onnx", params, ["output"])
    theirs = onnx.load(GOLDEN / "inference_model.onnx")
    assert [i.name for i in model.graph.input] == [i.name for i in theirs.graph.input] == ["input"]
    assert list(model.graph.output) == list(theirs.graph.output)
    assert list(model.graph.node) == list(theirs.graph.node)
    assert [(t.name, t.raw_data) for t in model.graph.initializer] == [
        (t.name, t.raw_data) for t in theirs.graph.initializer]
    assert model.ir_version == theirs.ir_version
    x = np.load(GOLDEN / "batches.npz")["eval::input"]
    (out,) = _session(model).run(None, {"input": x})
    np.testing.assert_array_equal(out, np.load(GOLDEN / "eval_outputs.npz")["output"])


def test_outputs_equal_eval_mode_forward(tmp_path):
    model = onnx.load(GOLDEN / "model.onnx")
    arts = generate_artifacts(model, float_initializers(model), loss=LossType.CrossEntropyLoss,
                              optimizer=OptimType.AdamW, artifact_directory=tmp_path,
                              additional_output_names=["output"])
    start = ckpt.load(arts.checkpoint)
    program = TrainProgram.from_artifacts(arts.training_model, arts.eval_model,
                                          arts.optimizer_model, checkpoint=start)
    state = set_learning_rate(program.init_state(start), 0.05)
    batches = np.load(GOLDEN / "batches.npz")
    for i in range(3):
        x, y = batches["train::input"][i], batches["train::labels"][i]
        state, _ = program.train_and_update(state, x, y)
    params = {k: np.asarray(v) for k, v in {**state.params, **state.frozen}.items()}
    x, y = batches["eval::input"], batches["eval::labels"]

    exported = export_model_for_inferencing(arts.eval_model, params, ["output"])
    assert [i.name for i in exported.graph.input] == ["input"]
    assert [o.name for o in exported.graph.output] == ["output"]
    assert {t.name for t in exported.graph.initializer} == set(params)
    (out,) = _session(exported).run(None, {"input": x})

    eval_sess = ort.InferenceSession(str(arts.eval_model), providers=["CPUExecutionProvider"])
    _, ort_logits = eval_sess.run(None, {"input": x, "labels": y, **params})
    np.testing.assert_allclose(out, ort_logits, rtol=1e-5, atol=1e-5)
    _, jax_logits = program.eval_step(state, x, y)
    np.testing.assert_allclose(out, np.asarray(jax_logits), rtol=1e-5, atol=1e-5)
    h = np.maximum(x @ params["fc1.weight"] + params["fc1.bias"], 0)
    np.testing.assert_allclose(out, h @ params["fc2.weight"] + params["fc2.bias"], rtol=1e-5, atol=1e-5)


def test_batchnorm_dropout_export_uses_inference_mode():
    ref = FIXTURES / "ort_generated" / "bn_dropout_bce_sgd"
    params = ckpt.load(ref / "checkpoint").parameters
    exported = export_model_for_inferencing(ref / "eval_model.onnx", params, "output")
    assert [i.name for i in exported.graph.input] == ["input"]
    x = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    (out,) = _session(exported).run(None, {"input": x})
    h = x @ params["fc.weight"] + params["fc.bias"]
    bn = (h - params["bn.running_mean"]) / np.sqrt(params["bn.running_var"] + 1e-5)
    np.testing.assert_allclose(out, bn * params["bn.scale"] + params["bn.bias"], rtol=1e-5, atol=1e-6)


def test_intermediate_output_and_constants_kept():
    ref = FIXTURES / "golden" / "mlp_frozen"
    params = dict(np.load(ref / "params_after.npz"))
    exported = export_model_for_inferencing(ref / "eval_model.onnx", params, ["relu.out", "output"])
    assert [o.name for o in exported.graph.output] == ["relu.out", "output"]
    assert not [n for n in exported.graph.node if n.op_type in ("Pow", "Sub", "ReduceMean")]
    assert "target" not in {i.name for i in exported.graph.input}
    x = np.load(ref / "batches.npz")["eval::input"]
    relu, out = _session(exported).run(None, {"input": x})
    np.testing.assert_allclose(out, np.load(ref / "eval_outputs.npz")["output"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(relu, np.maximum(x @ params["fc1.weight"] + params["fc1.bias"], 0),
                               rtol=1e-5, atol=1e-6)
    w = {t.name: numpy_helper.to_array(t) for t in exported.graph.initializer}
    np.testing.assert_array_equal(w["fc2.weight"], params["fc2.weight"])


def test_errors():
    params = dict(np.load(GOLDEN / "params_after.npz"))
    with pytest.raises(TrainingError, match="not values of the eval model"):
        export_model_for_inferencing(GOLDEN / "eval_model.onnx", params, ["logits"])
    bad = dict(params, **{"fc1.bias": params["fc1.bias"].astype(np.float64)})
    with pytest.raises(InputError, match="fc1.bias"):
        export_model_for_inferencing(GOLDEN / "eval_model.onnx", bad, ["output"])
    bad = dict(params, **{"fc1.bias": params["fc1.bias"][:3]})
    with pytest.raises(InputError, match="shape"):
        export_model_for_inferencing(GOLDEN / "eval_model.onnx", bad, ["output"])


def test_bfloat16_parameters_are_exported_as_bfloat16():
    # onnx < 1.17 (the version beside onnxruntime-training 1.19.2) cannot write
    # ml_dtypes' bfloat16 through numpy_helper.from_array.
    import ml_dtypes

    bf16 = onnx.TensorProto.BFLOAT16
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["h"]), onnx.helper.make_node("Add", ["h", "b"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info(n, bf16, s) for n, s in (("x", [2, 3]), ("w", [3, 4]), ("b", [4]))],
        [onnx.helper.make_tensor_value_info("y", bf16, [2, 4])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 4)).astype(ml_dtypes.bfloat16),
              "b": rng.normal(size=4).astype(ml_dtypes.bfloat16)}
    exported = export_model_for_inferencing(model, params, ["y"])
    assert [i.name for i in exported.graph.input] == ["x"]
    inits = {t.name: t for t in exported.graph.initializer}
    for name, value in params.items():
        assert inits[name].data_type == bf16
        assert list(inits[name].dims) == list(value.shape)
        assert inits[name].raw_data == value.tobytes()
        # onnx < 1.17 reads bfloat16 as float32, newer ones as ml_dtypes' type: the values agree either way.
        np.testing.assert_array_equal(numpy_helper.to_array(inits[name]).astype(np.float32), value.astype(np.float32))
