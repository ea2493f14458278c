"""jaxort.session, the facade shaped like ONNX Runtime's training C API: every function, and its errors.

Numbers are checked against the golden ONNX Runtime 1.19.2 runs
(tests/fixtures/golden) and ORT's recorded API results (tests/fixtures/ort_api).
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import onnx
import onnxruntime
import pytest

from jaxort import checkpoint as ckpt
from jaxort import errors
from jaxort import session as js

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
GOLDEN = FIXTURES / "golden"
FROZEN = GOLDEN / "mlp_frozen"  # fc1 frozen, fc2 trainable, MSE, AdamW(weight_decay=0.01)
ORT_API = FIXTURES / "ort_api" / "frozen_sgd"


def _calls(case: str) -> list:
    return json.loads((GOLDEN / case / "trajectory.json").read_text())["calls"]


def _batches(root: pathlib.Path) -> dict:
    with np.load(root / "batches.npz") as f:
        return {k: f[k] for k in f.files}


def _session(root=FROZEN, eval_model=True, optimizer=True, state=None, **kw):
    state = state or js.load_checkpoint(root / "checkpoint")
    session = js.TrainingSession(state, root / "training_model.onnx",
                                 root / "eval_model.onnx" if eval_model else None,
                                 root / "optimizer_model.onnx" if optimizer else None, **kw)
    return state, session


def _frozen_batch(i=0):
    b = _batches(FROZEN)
    return b["train::input"][i], b["train::target"][i]


def test_load_checkpoint_and_from_buffer_agree():
    a = js.load_checkpoint(FROZEN / "checkpoint")
    b = js.load_checkpoint_from_buffer((FROZEN / "checkpoint").read_bytes())
    assert a.parameter_names() == b.parameter_names() == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    for name in a.parameter_names():
        np.testing.assert_array_equal(js.get_parameter(a, name), js.get_parameter(b, name))
    with pytest.raises(errors.CheckpointError):
        js.load_checkpoint(FROZEN / "no_such_checkpoint")
    with pytest.raises(errors.CheckpointError):
        js.load_checkpoint_from_buffer(b"not a checkpoint")


def test_first_train_step_matches_golden():
    state, session = _session()
    session.set_learning_rate(0.01)
    calls = [c for c in _calls("mlp_frozen") if c["call"] == "module.__call__"]
    x, y = _frozen_batch(0)
    outputs = session.train_step(x, y)
    assert isinstance(outputs, tuple) and len(outputs) == 1
    np.testing.assert_allclose(outputs[0], calls[0]["result"]["loss"], rtol=1e-5, atol=1e-6)
    with np.load(FROZEN / "step_snapshots.npz") as snaps:
        for p in ("fc2.weight", "fc2.bias"):
            np.testing.assert_allclose(state.get_gradient(p), snaps[f"step1::grad::{p}"], rtol=1e-5, atol=1e-6)
        assert state.get_gradient("fc1.weight") is None
        session.optimizer_step()
        for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
            np.testing.assert_allclose(js.get_parameter(state, p), snaps[f"step1::param::{p}"],
                                       rtol=1e-4, atol=1e-5)


def test_eval_step_and_lazy_reset_grad():
    state, session = _session()
    x, y = _frozen_batch(0)
    (loss,) = session.eval_step(x, y)
    np.testing.assert_allclose(loss, _calls("mlp_frozen")[[c["call"] for c in _calls("mlp_frozen")].index(
        "module.__call__")]["result"]["loss"], rtol=1e-5, atol=1e-6)
    session.train_step(x, y)
    g1 = state.get_gradient("fc2.bias")
    session.train_step(x, y)
    np.testing.assert_allclose(state.get_gradient("fc2.bias"), 2 * g1, rtol=1e-6, atol=1e-7)
    session.lazy_reset_grad()
    np.testing.assert_allclose(state.get_gradient("fc2.bias"), 2 * g1, rtol=1e-6, atol=1e-7)
    session.train_step(x, y)
    np.testing.assert_allclose(state.get_gradient("fc2.bias"), g1, rtol=1e-6, atol=1e-7)


def test_learning_rate_and_linear_scheduler():
    _, session = _session(GOLDEN / "cnn_bce")
    assert session.get_learning_rate() == float(np.float32(1e-3))
    session.set_learning_rate(0.5)
    assert session.get_learning_rate() == 0.5
    with pytest.raises(errors.StateError, match="No learning rate scheduler"):
        session.scheduler_step()
    # The C API takes the counts as documented: warmup 2, total 6 is cnn_bce's effective schedule.
    session.register_linear_lr_scheduler(2, 6, 0.05)
    lrs = [session.get_learning_rate()]
    b = _batches(GOLDEN / "cnn_bce")
    for i in range(6):
        session.train_step(b["train::input"][i], b["train::target"][i])
        session.optimizer_step()
        session.scheduler_step()
        session.lazy_reset_grad()
        lrs.append(session.get_learning_rate())
    manifest = json.loads((GOLDEN / "cnn_bce" / "manifest.json").read_text())
    assert lrs[:6] == manifest["lr_schedule"]["lr_used_per_optimizer_step"]
    assert lrs[6] == 0.0


def test_parameter_buffers_match_ort_layout():
    info = json.loads((ORT_API / "expected.json").read_text())
    with np.load(ORT_API / "expected.npz") as f:
        expected = {k: f[k] for k in f.files}
    _, session = _session(ORT_API)
    # The C++ API's default is all parameters.
    assert session.get_parameters_size() == info["parameters_size_all"]
    assert session.get_parameters_size(trainable_only=True) == info["parameters_size_trainable"]
    np.testing.assert_array_equal(session.copy_parameters_to_buffer(), expected["contiguous_all_0"])
    np.testing.assert_array_equal(session.copy_parameters_to_buffer(True), expected["contiguous_trainable_0"])
    ramp = np.arange(info["parameters_size_all"], dtype=np.float32) / 100.0
    session.copy_buffer_to_parameters(ramp)
    np.testing.assert_array_equal(session.copy_parameters_to_buffer(), ramp)
    session.copy_buffer_to_parameters(expected["contiguous_trainable_0"], trainable_only=True)
    buf = session.copy_parameters_to_buffer()
    np.testing.assert_array_equal(buf[: info["parameters_size_all"] - info["parameters_size_trainable"]],
                                  ramp[: info["parameters_size_all"] - info["parameters_size_trainable"]])
    np.testing.assert_array_equal(session.copy_parameters_to_buffer(True), expected["contiguous_trainable_0"])
    with pytest.raises(errors.InputError, match="size incorrect"):
        session.copy_buffer_to_parameters(ramp[:5])


def test_parameter_functions():
    state, session = _session()
    dtype, shape = js.get_parameter_type_and_shape(state, "fc1.weight")
    assert (dtype, shape) == (np.dtype(np.float32), (20, 16))
    value = js.get_parameter(state, "fc1.weight")
    js.update_parameter(state, "fc1.weight", np.zeros_like(value))
    np.testing.assert_array_equal(js.get_parameter(state, "fc1.weight"), 0.0)
    np.testing.assert_array_equal(session.copy_parameters_to_buffer()[: value.size], 0.0)
    with pytest.raises(js.UnknownNameError, match="Parameter nope not found"):
        js.get_parameter(state, "nope")
    with pytest.raises(KeyError):
        js.get_parameter_type_and_shape(state, "nope")
    with pytest.raises(errors.InputError, match="expected shape"):
        js.update_parameter(state, "fc1.weight", np.zeros((16, 20), np.float32))
    with pytest.raises(errors.InputError, match="float64"):
        js.update_parameter(state, "fc1.weight", np.zeros((20, 16), np.float64))


def test_update_parameter_before_a_session_exists():
    state = js.load_checkpoint(FROZEN / "checkpoint")
    js.update_parameter(state, "fc2.bias", np.ones(5, np.float32))
    _, session = _session(state=state)
    np.testing.assert_array_equal(js.get_parameter(state, "fc2.bias"), 1.0)
    np.testing.assert_array_equal(session.copy_parameters_to_buffer(True)[-5:], 1.0)


def test_properties_and_save_checkpoint(tmp_path):
    state, session = _session()
    js.add_property(state, "epoch", 6)
    js.add_property(state, "best_metric", 0.125)
    js.add_property(state, "run_name", "golden-run")
    js.add_property(state, "lr", 0.1)
    assert js.get_property(state, "lr") == float(np.float32(0.1))
    with pytest.raises(js.UnknownNameError, match="Property nope not found"):
        js.get_property(state, "nope")
    with pytest.raises(errors.InputError):
        js.add_property(state, "bad", None)
    x, y = _frozen_batch(0)
    session.train_step(x, y)
    session.optimizer_step()
    js.save_checkpoint(state, tmp_path / "with_opt", include_optimizer_state=True)
    js.save_checkpoint(state, tmp_path / "no_opt")
    with_opt, no_opt = ckpt.load(tmp_path / "with_opt"), ckpt.load(tmp_path / "no_opt")
    assert dict(with_opt.properties) == {"best_metric": 0.125, "epoch": 6, "lr": float(np.float32(0.1)),
                                         "run_name": "golden-run"}
    assert no_opt.optimizer_groups == ()
    (group,) = with_opt.optimizer_groups
    assert (group.name, group.step, group.initial_learning_rate) == ("group0", 1, float(np.float32(1e-3)))
    assert list(group.states) == ["fc2.bias", "fc2.weight"]
    assert list(no_opt.trainable) == ["fc2.bias", "fc2.weight"]
    assert list(no_opt.frozen) == ["fc1.bias", "fc1.weight"]
    reloaded = js.load_checkpoint(tmp_path / "with_opt")
    assert js.get_property(reloaded, "run_name") == "golden-run"
    np.testing.assert_array_equal(js.get_parameter(reloaded, "fc2.bias"), js.get_parameter(state, "fc2.bias"))


def test_session_from_buffers_equals_from_paths():
    b = [(FROZEN / n).read_bytes() for n in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")]
    state = js.load_checkpoint_from_buffer((FROZEN / "checkpoint").read_bytes())
    session = js.TrainingSession.from_buffers(state, *b)
    _, by_path = _session()
    x, y = _frozen_batch(1)
    np.testing.assert_array_equal(session.train_step(x, y)[0], by_path.train_step(x, y)[0])
    with pytest.raises(errors.InputError, match="must be bytes"):
        js.TrainingSession.from_buffers(state, str(FROZEN / "training_model.onnx"))


def test_model_input_and_output_names_and_counts():
    _, session = _session()
    assert session.training_model_input_count() == 2
    assert session.training_model_input_names() == ["input", "target"]
    assert [session.training_model_input_name(i) for i in range(2)] == ["input", "target"]
    train = onnx.load(FROZEN / "training_model.onnx")
    evalm = onnx.load(FROZEN / "eval_model.onnx")
    assert session.training_model_output_count() == 1
    assert session.training_model_output_name(0) == train.graph.output[0].name
    assert session.eval_model_input_count() == 2 and session.eval_model_input_name(1) == "target"
    assert session.eval_model_output_count() == 1
    assert session.eval_model_output_names() == [o.name for o in evalm.graph.output]
    with pytest.raises(errors.InputError, match="out of range"):
        session.training_model_input_name(2)
    _, no_eval = _session(eval_model=False)
    assert no_eval.eval_model_input_count() == 0 and no_eval.eval_model_output_names() == []


def test_export_model_for_inferencing(tmp_path):
    state, session = _session(GOLDEN / "mlp_adamw")
    path = tmp_path / "inference.onnx"
    session.export_model_for_inferencing(path, ["output"])
    x = _batches(GOLDEN / "mlp_adamw")["eval::input"]
    (got,) = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    p = {n: js.get_parameter(state, n).astype(np.float64) for n in state.parameter_names()}
    ref = np.maximum(x @ p["fc1.weight"] + p["fc1.bias"], 0) @ p["fc2.weight"] + p["fc2.bias"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_out_of_order_calls():
    _, session = _session()
    x, y = _frozen_batch(0)
    with pytest.raises(errors.StateError, match="before any train step"):
        session.optimizer_step()
    _, no_opt = _session(optimizer=False, eval_model=False)
    no_opt.train_step(x, y)
    with pytest.raises(errors.StateError, match="No optimizer model"):
        no_opt.optimizer_step()
    with pytest.raises(errors.StateError, match="no optimizer model"):
        no_opt.set_learning_rate(0.1)
    with pytest.raises(errors.StateError, match="no optimizer model"):
        no_opt.register_linear_lr_scheduler(1, 2, 0.1)
    with pytest.raises(errors.StateError, match="Eval model was not provided"):
        no_opt.eval_step(x, y)
    with pytest.raises(errors.StateError, match="Cannot export"):
        no_opt.export_model_for_inferencing("unused.onnx", ["output"])
    with pytest.raises(errors.InputError, match="2 inputs"):
        session.train_step(x)


def test_nominal_checkpoint():
    root = GOLDEN / "mlp_adamw"
    nominal = js.load_checkpoint(root / "nominal_checkpoint")
    assert nominal.is_nominal
    # ORT 1.19.2 writes nominal tensors without dims.
    assert js.get_parameter_type_and_shape(nominal, "fc1.weight") == (np.dtype(np.float32), ())
    with pytest.raises(errors.StateError, match="Please load the parameter states first"):
        js.get_parameter(nominal, "fc1.weight")
    _, session = _session(root, state=nominal)
    assert js.get_parameter_type_and_shape(nominal, "fc1.weight") == (np.dtype(np.float32), (20, 16))
    assert session.get_parameters_size() == 20 * 16 + 16 + 16 * 5 + 5
    with pytest.raises(errors.StateError, match="Please load the model parameters first"):
        session.copy_parameters_to_buffer()
    b = _batches(root)
    with pytest.raises(errors.StateError, match="Please load the model parameters first"):
        session.train_step(b["train::input"][0], b["train::labels"][0])
    complete, _ = _session(root)
    session.copy_buffer_to_parameters(js.TrainingSession(complete, root / "training_model.onnx")
                                      .copy_parameters_to_buffer())
    assert not nominal.is_nominal
    (loss,) = session.train_step(b["train::input"][0], b["train::labels"][0])
    first = next(c for c in _calls("mlp_adamw") if c["call"] == "module.__call__")
    np.testing.assert_allclose(loss, first["result"]["loss"], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def dropout_artifacts(tmp_path_factory):
    """Gemm + Dropout(ratio 0.5, training_mode) with MSE loss, written by jaxort's generate_artifacts."""
    from onnx import TensorProto, helper, numpy_helper

    from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(6, 4)).astype(np.float32), "fc.weight")
    ratio = numpy_helper.from_array(np.array(0.5, np.float32), "dropout.ratio")
    mode = numpy_helper.from_array(np.array(True), "dropout.training_mode")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "fc.weight"], ["h"]),
         helper.make_node("Dropout", ["h", "dropout.ratio", "dropout.training_mode"], ["output"])],
        "dropout", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])], [w, ratio, mode])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out = tmp_path_factory.mktemp("dropout")
    generate_artifacts(model, requires_grad=["fc.weight"], loss=LossType.MSELoss, optimizer=OptimType.SGD,
                       artifact_directory=str(out))
    x = rng.normal(size=(8, 6)).astype(np.float32)
    return out, (x, rng.normal(size=(8, 4)).astype(np.float32))


def test_set_seed_makes_dropout_reproducible(dropout_artifacts):
    root, batch = dropout_artifacts

    def loss_after(seed, module_level):
        if module_level:
            js.set_seed(seed)
            _, session = _session(root)
        else:
            _, session = _session(root)
            session.set_seed(seed)
        return session.train_step(*batch)[0]

    try:
        a, a2 = loss_after(3, True), loss_after(3, False)
        assert a == a2
        assert a != loss_after(4, True)
        # Live sessions are reseeded by the module-level call too.
        _, live = _session(root)
        js.set_seed(3)
        assert live.train_step(*batch)[0] == a
        # Dropout is off in the eval model: the eval loss does not depend on the seed.
        js.set_seed(5)
        _, s1 = _session(root)
        js.set_seed(6)
        _, s2 = _session(root)
        assert s1.eval_step(*batch)[0] == s2.eval_step(*batch)[0]
    finally:
        js.set_seed(0)  # the seed is process-wide, as in ORT: put the default back


def test_get_training_api():
    api = js.get_training_api(19)
    assert api.version == 19 and api.load_checkpoint is js.load_checkpoint
    assert api.create_training_session is js.TrainingSession
    assert js.get_training_api(13).version == 13
    for bad in (12, 20, "19", 19.0, True):
        with pytest.raises(errors.InputError, match="not supported"):
            js.get_training_api(bad)


def test_release_frees_device_buffers(tmp_path):
    state, session = _session()
    x, y = _frozen_batch(0)
    session.train_step(x, y)
    session.optimizer_step()
    after = js.get_parameter(state, "fc2.bias")
    leaves = jax.tree_util.tree_leaves(session.train_state)
    session.release()
    assert all(leaf.is_deleted() for leaf in leaves)
    assert session.train_state is None
    with pytest.raises(errors.StateError, match="released"):
        session.train_step(x, y)
    with pytest.raises(errors.StateError, match="released"):
        session.get_parameters_size()
    session.release()
    # The state keeps the values and can be saved or drive a new session.
    np.testing.assert_array_equal(js.get_parameter(state, "fc2.bias"), after)
    js.save_checkpoint(state, tmp_path / "ckpt", include_optimizer_state=True)
    assert ckpt.load(tmp_path / "ckpt").optimizer_groups[0].step == 1
    with js.TrainingSession(state, FROZEN / "training_model.onnx", None, FROZEN / "optimizer_model.onnx") as s2:
        np.testing.assert_array_equal(s2.copy_parameters_to_buffer(True)[-5:], after)
    with pytest.raises(errors.StateError, match="released"):
        s2.lazy_reset_grad()


def test_released_checkpoint_state_refuses_every_use(tmp_path):
    # ReleaseCheckpointState: the handle, and a session over it, raise StateError naming
    # the release from then on; the session's device buffers are freed.
    state, session = _session()
    x, y = _frozen_batch(0)
    session.train_step(x, y)
    leaves = jax.tree_util.tree_leaves(session.train_state)
    assert not state.released
    js.release_checkpoint_state(state)
    assert state.released and all(leaf.is_deleted() for leaf in leaves)
    uses = [lambda: js.get_parameter(state, "fc2.bias"),
            lambda: js.get_property(state, "x"),
            lambda: js.add_property(state, "x", 1),
            lambda: js.update_parameter(state, "fc2.bias", np.zeros(5, np.float32)),
            lambda: js.get_parameter_type_and_shape(state, "fc2.bias"),
            lambda: js.save_checkpoint(state, tmp_path / "ckpt"),
            lambda: js.TrainingSession(state, FROZEN / "training_model.onnx"),
            lambda: session.train_step(x, y),
            lambda: session.optimizer_step(),
            lambda: session.copy_parameters_to_buffer()]
    for use in uses:
        with pytest.raises(errors.StateError, match="checkpoint state was released"):
            use()
    assert not (tmp_path / "ckpt").exists()
    js.release_checkpoint_state(state)  # twice: a no-op
    js.release_training_session(session)  # after its state: a no-op too
    with pytest.raises(errors.InputError, match="CheckpointHandle"):
        js.release_checkpoint_state(session)
    with pytest.raises(errors.InputError, match="TrainingSession"):
        js.release_training_session(state)


# Every function of OrtTrainingApi (onnxruntime_training_c_api.h, ORT 1.19.2) and its
# counterpart in jaxort.session: a module function, or a TrainingSession member.
C_API = {
    "LoadCheckpoint": "load_checkpoint", "LoadCheckpointFromBuffer": "load_checkpoint_from_buffer",
    "SaveCheckpoint": "save_checkpoint", "ReleaseCheckpointState": "release_checkpoint_state",
    "CreateTrainingSession": "TrainingSession",
    "CreateTrainingSessionFromBuffer": "TrainingSession.from_buffers",
    "ReleaseTrainingSession": "release_training_session",
    "TrainingSessionGetTrainingModelOutputCount": "TrainingSession.training_model_output_count",
    "TrainingSessionGetEvalModelOutputCount": "TrainingSession.eval_model_output_count",
    "TrainingSessionGetTrainingModelOutputName": "TrainingSession.training_model_output_name",
    "TrainingSessionGetEvalModelOutputName": "TrainingSession.eval_model_output_name",
    "TrainingSessionGetTrainingModelInputCount": "TrainingSession.training_model_input_count",
    "TrainingSessionGetEvalModelInputCount": "TrainingSession.eval_model_input_count",
    "TrainingSessionGetTrainingModelInputName": "TrainingSession.training_model_input_name",
    "TrainingSessionGetEvalModelInputName": "TrainingSession.eval_model_input_name",
    "LazyResetGrad": "TrainingSession.lazy_reset_grad", "TrainStep": "TrainingSession.train_step",
    "EvalStep": "TrainingSession.eval_step", "OptimizerStep": "TrainingSession.optimizer_step",
    "SetLearningRate": "TrainingSession.set_learning_rate",
    "GetLearningRate": "TrainingSession.get_learning_rate",
    "RegisterLinearLRScheduler": "TrainingSession.register_linear_lr_scheduler",
    "SchedulerStep": "TrainingSession.scheduler_step",
    "GetParametersSize": "TrainingSession.get_parameters_size",
    "CopyParametersToBuffer": "TrainingSession.copy_parameters_to_buffer",
    "CopyBufferToParameters": "TrainingSession.copy_buffer_to_parameters",
    "ExportModelForInferencing": "TrainingSession.export_model_for_inferencing",
    "SetSeed": "set_seed", "AddProperty": "add_property", "GetProperty": "get_property",
    "GetParameterTypeAndShape": "get_parameter_type_and_shape",
    "UpdateParameter": "update_parameter", "GetParameter": "get_parameter",
}


def test_every_c_api_function_has_a_counterpart():
    assert len(C_API) == 33
    api = js.get_training_api(19)
    for entry, target in C_API.items():
        obj = js
        for part in target.split("."):
            obj = getattr(obj, part, None)
        assert callable(obj) or isinstance(obj, property), f"{entry}: jaxort.session.{target} is missing"
        if "." not in target:
            assert target in js.__all__, entry
            assert target == "TrainingSession" or getattr(api, target) is obj, entry


def test_second_session_detaches_the_first():
    state, first = _session()
    _, second = _session(state=state)
    x, y = _frozen_batch(0)
    second.train_step(x, y)
    with pytest.raises(errors.StateError, match="another TrainingSession"):
        first.train_step(x, y)


def test_devices():
    _, session = _session(device="cpu")
    assert session.device.platform == "cpu"
    assert session.train_state.params["fc2.bias"].devices() == {session.device}
    with pytest.raises(errors.InputError, match="unknown device"):
        _session(device="npu")
    with pytest.raises(errors.InputError, match="integer"):
        _session(device="cpu:x")
    platforms = {d.platform for d in jax.devices()}
    for device, platform in (("cuda", "gpu"), ("gpu", "gpu"), ("tpu", "tpu")):
        if platform not in platforms:
            with pytest.raises(errors.InputError, match="not available"):
                _session(device=device)


def test_cli_export_and_summary(tmp_path, capsys):
    from jaxort import cli

    root = GOLDEN / "mlp_adamw"
    out = tmp_path / "inference.onnx"
    assert cli.main(["export", "--checkpoint", str(root / "ckpt_after_no_opt"), "--training-model",
                     str(root / "training_model.onnx"), "--eval-model", str(root / "eval_model.onnx"),
                     str(out)]) == 0
    x = _batches(root)["eval::input"]
    (got,) = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    with np.load(root / "eval_outputs.npz") as f:
        np.testing.assert_allclose(got, f["output"], rtol=1e-5, atol=1e-5)
    assert cli.main(["summary", str(root / "ckpt_after_with_opt")]) == 0
    assert "golden-run" in capsys.readouterr().out
    assert cli.main(["summary", str(tmp_path / "missing")]) == 2  # a bad argument: usage error


def test_facade_calls_never_recompile_the_train_step(compiles):
    # The lazy-reset flag, the learning rate and new parameter values stay
    # committed to the session's device, so the train step compiled for the
    # first batch serves every later batch of the same shape (an uncommitted
    # flag once made the second step compile again, with no retrace).
    state, session = _session()
    session.train_step(*_frozen_batch(0))
    for i in range(1, 3):
        session.optimizer_step()
        session.lazy_reset_grad()
        session.set_learning_rate(0.01 * i)
        js.update_parameter(state, "fc2.bias", js.get_parameter(state, "fc2.bias") * 0.5)
        assert compiles.during(session.train_step, *_frozen_batch(i)) == 0
