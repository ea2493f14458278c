"""jaxort.api against ONNX Runtime's own on-device training API tests.

Ports the intent of onnxruntime's orttraining_test_ort_apis_py_bindings.py
(train step vs a reference loss, eval step, optimizer step, learning rate,
scheduler, checkpoint round trip, copy_buffer_to_parameters with a frozen
layer, export for inference, properties, input/output names, nominal
checkpoints). Every test runs on ORT-generated artifacts and on artifacts
jaxort's generate_artifacts writes from the same forward model, and compares
with a numpy reference or with what ORT 1.19.2 returned on the same calls
(tests/fixtures/ort_api, written by tools/make_api_fixtures.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from .conftest import cross_entropy, cross_entropy_grads, mlp_forward

from jaxort import errors
from jaxort.api import CheckpointState, LinearLRScheduler, Module, Optimizer

LOSS_TOL = dict(rtol=1e-5, atol=1e-6)
PARAM_TOL = dict(rtol=1e-4, atol=1e-5)


def _loss(outputs):
    return outputs[0] if isinstance(outputs, tuple) else outputs


def _params(state) -> dict:
    return {name: p.data for name, p in state.parameters}


def _setup(a, eval_model=True, optimizer=True):
    state = CheckpointState.load_checkpoint(a.checkpoint)
    module = Module(a.train, state, a.eval if eval_model else None)
    opt = Optimizer(a.optimizer, module) if optimizer else None
    return state, module, opt


def test_train_step_loss_equals_numpy_reference(artifacts):
    state, module, _ = _setup(artifacts, optimizer=False)
    x, y = artifacts.batch(0)
    module.train()
    outputs = module(x, y)
    expected = cross_entropy(mlp_forward(_params(state), x), y)
    np.testing.assert_allclose(_loss(outputs), expected, **LOSS_TOL)
    np.testing.assert_allclose(_loss(outputs), artifacts.expected["train_0::output0"], **LOSS_TOL)
    assert isinstance(_loss(outputs), np.ndarray) and _loss(outputs).dtype == np.float32


def test_train_step_gradients_equal_numpy_reference(artifacts):
    state, module, _ = _setup(artifacts, optimizer=False)
    x, y = artifacts.batch(0)
    before = _params(state)
    module(x, y)
    ref = cross_entropy_grads(before, x, y)
    for name, p in state.parameters:
        if p.requires_grad:
            np.testing.assert_allclose(p.grad, ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(p.grad, artifacts.expected[f"grad_0::{name}"], rtol=1e-5, atol=1e-6)
        else:
            assert p.grad is None


def test_gradients_accumulate_until_lazy_reset(artifacts):
    state, module, _ = _setup(artifacts, optimizer=False)
    params = _params(state)
    (x0, y0), (x1, y1) = artifacts.batch(0), artifacts.batch(1)
    module(x0, y0)
    module(x1, y1)
    g0, g1 = cross_entropy_grads(params, x0, y0), cross_entropy_grads(params, x1, y1)
    trainable = [n for n, p in state.parameters if p.requires_grad]
    for name in trainable:
        np.testing.assert_allclose(state.parameters[name].grad, g0[name] + g1[name], rtol=1e-5, atol=1e-6)
    module.lazy_reset_grad()
    # ORT: the reset is lazy, the buffer still shows the old sum until the next train step.
    for name in trainable:
        np.testing.assert_allclose(state.parameters[name].grad, g0[name] + g1[name], rtol=1e-5, atol=1e-6)
    module(x1, y1)
    for name in trainable:
        np.testing.assert_allclose(state.parameters[name].grad, g1[name], rtol=1e-5, atol=1e-6)


def test_ort_recorded_lazy_reset_sequence(artifacts):
    state, module, _ = _setup(artifacts, optimizer=False)
    module(*artifacts.batch(0))
    module.lazy_reset_grad()
    loss1 = _loss(module(*artifacts.batch(1)))
    np.testing.assert_allclose(loss1, artifacts.expected["train_1::output0"], **LOSS_TOL)
    for name, p in state.parameters:
        if p.requires_grad:
            np.testing.assert_allclose(p.grad, artifacts.expected[f"grad_1::{name}"], rtol=1e-5, atol=1e-6)


def test_eval_step(artifacts):
    state, module, _ = _setup(artifacts, optimizer=False)
    x, y = artifacts.eval_batch()
    module.train()
    module(*artifacts.batch(0))
    module.eval()
    outputs = module(x, y)
    expected = cross_entropy(mlp_forward(_params(state), x), y)
    np.testing.assert_allclose(_loss(outputs), expected, **LOSS_TOL)


def test_two_outputs_return_a_tuple(make):
    for source in ("ort", "jaxort"):
        a = make("two_outputs_adamw", source)
        state, module, _ = _setup(a, optimizer=False)
        x, y = a.batch(0)
        loss, output = module(x, y)
        np.testing.assert_allclose(output, mlp_forward(_params(state), x), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(output, a.expected["train_0::output1"], rtol=1e-5, atol=1e-6)
        assert len(module.output_names()) == 2


@pytest.mark.parametrize("case", ["frozen_sgd", "two_outputs_adamw"])
def test_optimizer_step_changes_parameters(make, case):
    for source in ("ort", "jaxort"):
        a = make(case, source)
        state, module, opt = _setup(a)
        old = module.get_contiguous_parameters()
        module(*a.batch(0))
        opt.step()
        new = module.get_contiguous_parameters()
        assert not np.array_equal(old, new)


def test_optimizer_step_matches_ort(artifacts):
    """The recorded ORT sequence: 2 train steps with a lazy reset between, lr 0.1, one step, eval."""
    state, module, opt = _setup(artifacts)
    module(*artifacts.batch(0))
    module.lazy_reset_grad()
    module(*artifacts.batch(1))
    opt.set_learning_rate(0.1)
    if artifacts.info["optimizer"] == "SGD":
        before = {n: p.data for n, p in state.parameters}
        grads = {n: p.grad for n, p in state.parameters if p.requires_grad}
    opt.step()
    np.testing.assert_allclose(module.get_contiguous_parameters(), artifacts.expected["contiguous_all_1"],
                               **PARAM_TOL)
    if artifacts.info["optimizer"] == "SGD":
        for name, p in state.parameters:
            expected = before[name] - np.float32(0.1) * grads[name] if name in grads else before[name]
            np.testing.assert_allclose(p.data, expected, rtol=1e-6, atol=1e-7)
    module.eval()
    outputs = module(*artifacts.eval_batch())
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for i, value in enumerate(outputs):
        np.testing.assert_allclose(value, artifacts.expected[f"eval_1::output{i}"], rtol=1e-5, atol=1e-5)


def test_get_and_set_lr(artifacts):
    _, _, opt = _setup(artifacts)
    lr = opt.get_learning_rate()
    assert lr == artifacts.info["lr_default"] == float(np.float32(0.001))
    opt.set_learning_rate(0.5)
    assert opt.get_learning_rate() == 0.5
    opt.set_learning_rate(0.1)
    assert opt.get_learning_rate() == artifacts.info["lr_after_set"]


def test_scheduler_step_documented_meaning(artifacts):
    state, module, opt = _setup(artifacts)
    scheduler = LinearLRScheduler(opt, 1, 2, 0.2)
    lrs = [opt.get_learning_rate()]
    for k in range(3):
        module(*artifacts.batch(k))
        opt.step()
        scheduler.step()
        module.lazy_reset_grad()
        lrs.append(opt.get_learning_rate())
    # warmup 1, total 2: lr(0) = 0, lr(1) = 0.2 * (2 - 1) / 1, then 0.
    np.testing.assert_array_equal(np.float32(lrs), np.float32([0.0, 0.2, 0.0, 0.0]))


def test_scheduler_with_swapped_counts_reproduces_ort(artifacts):
    """ORT 1.19.2's Python LinearLRScheduler swaps the counts; swapping them back gives its numbers."""
    state, module, opt = _setup(artifacts)
    warmup, total, lr0 = artifacts.info["scheduler"]["args"]
    scheduler = LinearLRScheduler(opt, total, warmup, lr0)
    lrs = [opt.get_learning_rate()]
    for k in range(3):
        module(*artifacts.batch(k))
        opt.step()
        scheduler.step()
        module.lazy_reset_grad()
        lrs.append(opt.get_learning_rate())
    assert lrs == artifacts.info["scheduler"]["lrs"]


def test_scheduler_step_without_optimizer_step_keeps_lr(artifacts):
    _, _, opt = _setup(artifacts)
    scheduler = LinearLRScheduler(opt, 2, 4, 1.0)
    scheduler.step()
    scheduler.step()
    assert opt.get_learning_rate() == 0.0


def test_training_module_checkpoint_round_trip(artifacts, tmp_path):
    state, module, _ = _setup(artifacts, optimizer=False)
    module(*artifacts.batch(0))
    path = tmp_path / "checkpoint_export.ckpt"
    CheckpointState.save_checkpoint(state, path)
    old = module.get_contiguous_parameters()
    new_state = CheckpointState.load_checkpoint(path)
    new_module = Module(artifacts.train, new_state)
    np.testing.assert_array_equal(new_module.get_contiguous_parameters(), old)
    assert list(new_state.parameters.keys()) == list(state.parameters.keys())


def test_checkpoint_with_optimizer_state_matches_ort_bytes(make, tmp_path):
    """Same calls as ORT's recording, then save: the file is byte-identical to ORT's."""
    a = make("two_outputs_adamw", "ort")
    state, module, opt = _setup(a)
    module(*a.batch(0))
    module.lazy_reset_grad()
    module(*a.batch(1))
    opt.set_learning_rate(0.1)
    opt.step()
    module.copy_buffer_to_parameters(a.expected["contiguous_trainable_0"], True)
    ramp = np.arange(module.get_parameters_size(False), dtype=np.float32) / 100.0
    module.copy_buffer_to_parameters(ramp, False)
    state.properties["epoch"] = 3
    state.properties["best_metric"] = 0.1
    state.properties["run_name"] = "api-fixture"
    path = tmp_path / "ckpt"
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    ours = np.frombuffer(path.read_bytes(), np.uint8)
    theirs = a.expected["ckpt_with_opt_bytes"]
    # Moments after one AdamW step agree to float32 rounding, not bit for bit:
    # compare the decoded files with tolerances and everything else exactly.
    from jaxort import checkpoint as ckpt

    mine, ref = ckpt.load_from_buffer(ours.tobytes()), ckpt.load_from_buffer(theirs.tobytes())
    assert list(mine.trainable) == list(ref.trainable) and list(mine.frozen) == list(ref.frozen)
    for name in ref.trainable:
        np.testing.assert_array_equal(mine.trainable[name], ref.trainable[name])
    assert mine.properties == ref.properties
    (g_mine,), (g_ref,) = mine.optimizer_groups, ref.optimizer_groups
    assert (g_mine.name, g_mine.step, g_mine.initial_learning_rate) == (
        g_ref.name, g_ref.step, g_ref.initial_learning_rate)
    assert list(g_mine.states) == list(g_ref.states)
    for pname, moments in g_ref.states.items():
        assert list(g_mine.states[pname]) == list(moments)
        for mname, value in moments.items():
            np.testing.assert_allclose(g_mine.states[pname][mname], value, rtol=1e-4, atol=1e-6)
    assert len(ours) == len(theirs)


@pytest.mark.parametrize("trainable_only", [True, False])
@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_copy_buffer_to_parameters(make, tmp_path, trainable_only, optimizer):
    """ORT's test with a frozen fc1: the buffer round trip restores the parameters."""
    from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

    frozen = make("frozen_sgd", "ort")
    out = tmp_path / optimizer
    generate_artifacts(onnx.load(frozen.path("model.onnx")), requires_grad=["fc2.weight", "fc2.bias"],
                       frozen_params=["fc1.weight", "fc1.bias"], loss=LossType.CrossEntropyLoss,
                       optimizer=OptimType[optimizer], artifact_directory=str(out))
    state = CheckpointState.load_checkpoint(out / "checkpoint")
    module = Module(str(out / "training_model.onnx"), state)
    opt = Optimizer(str(out / "optimizer_model.onnx"), module)
    old = module.get_contiguous_parameters(trainable_only=trainable_only)
    module.train()
    module(*frozen.batch(0))
    opt.step()
    new = module.get_contiguous_parameters(trainable_only=trainable_only)
    assert not np.array_equal(old, new)
    module.copy_buffer_to_parameters(old, trainable_only=trainable_only)
    np.testing.assert_array_equal(module.get_contiguous_parameters(trainable_only=trainable_only), old)


def test_contiguous_parameters_are_an_ortvalue_as_in_ort(frozen_artifacts):
    # An ORT script's buffer handling, unchanged but for the import: ORT 1.19.2 returns
    # its C OrtValue, whose shape() is [n], data_type() 'tensor(float)', element_type()
    # 1 (TensorProto.FLOAT) and device_name() 'Cpu'.
    from jaxort.api import OrtValue

    a = frozen_artifacts
    state, module, opt = _setup(a)
    params = module.get_contiguous_parameters(trainable_only=True)
    assert isinstance(params, OrtValue)
    assert params.shape() == [a.info["parameters_size_trainable"]]
    assert (params.data_type(), params.element_type(), params.device_name()) == ("tensor(float)", 1, "Cpu")
    assert params.is_tensor() and params.has_value() and not params.is_sparse_tensor()
    host = params.numpy()
    np.testing.assert_array_equal(host, a.expected["contiguous_trainable_0"])
    host[:] = 0  # numpy() is a copy, as ORT's
    np.testing.assert_array_equal(np.asarray(params), a.expected["contiguous_trainable_0"])

    halved = OrtValue.ortvalue_from_numpy(params.numpy() * 0.5)
    module.copy_buffer_to_parameters(halved, trainable_only=True)
    np.testing.assert_array_equal(module.get_contiguous_parameters(True).numpy(),
                                  a.expected["contiguous_trainable_0"] * np.float32(0.5))
    # onnxruntime's own OrtValue goes in as well.
    module.copy_buffer_to_parameters(onnxruntime.OrtValue.ortvalue_from_numpy(params.numpy()), True)
    np.testing.assert_array_equal(module.get_contiguous_parameters(True).numpy(),
                                  a.expected["contiguous_trainable_0"])

    buffer = OrtValue.ortvalue_from_shape_and_type([params.shape()[0]], np.float32)
    np.testing.assert_array_equal(buffer.numpy(), np.zeros(params.shape(), np.float32))
    buffer.update_inplace(params.numpy() + 1)
    np.testing.assert_array_equal(buffer.numpy(), a.expected["contiguous_trainable_0"] + 1)
    with pytest.raises(errors.InputError, match=r"expected float32\[\d+\], got float64"):
        buffer.update_inplace(params.numpy().astype(np.float64))
    with pytest.raises(errors.InputError, match="device 'cuda'"):
        OrtValue.ortvalue_from_numpy(host, "cuda")


def test_ortvalue_inputs_give_ortvalue_outputs_as_in_ort(frozen_artifacts):
    # ORT's Module.__call__ takes OrtValues, and returns OrtValues when no input is numpy.
    from jaxort.api import OrtValue

    a = frozen_artifacts
    _, module, _ = _setup(a)
    x, y = a.batch(0)
    module.eval()
    want = module(x, y)
    assert isinstance(want, np.ndarray)
    for make in (OrtValue.ortvalue_from_numpy, onnxruntime.OrtValue.ortvalue_from_numpy):
        got = module(make(x), make(y))
        assert isinstance(got, OrtValue)
        np.testing.assert_array_equal(got.numpy(), want)
    mixed = module(OrtValue.ortvalue_from_numpy(x), y)  # a numpy input: numpy out
    assert isinstance(mixed, np.ndarray)
    np.testing.assert_array_equal(mixed, want)


def test_copy_buffer_layout_matches_ort(frozen_artifacts):
    a = frozen_artifacts
    state, module, opt = _setup(a)
    assert module.get_parameters_size() == a.info["parameters_size_trainable"]
    assert module.get_parameters_size(False) == a.info["parameters_size_all"]
    np.testing.assert_array_equal(module.get_contiguous_parameters(), a.expected["contiguous_all_0"])
    np.testing.assert_array_equal(module.get_contiguous_parameters(trainable_only=True),
                                  a.expected["contiguous_trainable_0"])
    module(*a.batch(0))
    module.lazy_reset_grad()
    module(*a.batch(1))
    opt.set_learning_rate(0.1)
    opt.step()
    # trainable_only=True restores fc2 and leaves the frozen fc1 alone.
    module.copy_buffer_to_parameters(a.expected["contiguous_trainable_0"], trainable_only=True)
    np.testing.assert_array_equal(module.get_contiguous_parameters(),
                                  a.expected["contiguous_all_after_copy_trainable"])
    ramp = np.arange(a.info["parameters_size_all"], dtype=np.float32) / 100.0
    module.copy_buffer_to_parameters(ramp, trainable_only=False)
    for name, p in state.parameters:
        np.testing.assert_array_equal(p.data, a.expected[f"param_after_ramp::{name}"])


def test_copy_buffer_wrong_size_or_dtype(frozen_artifacts):
    _, module, _ = _setup(frozen_artifacts, optimizer=False)
    with pytest.raises(errors.InputError, match="size incorrect"):
        module.copy_buffer_to_parameters(np.zeros(3, np.float32), trainable_only=False)
    size = module.get_parameters_size(False)
    with pytest.raises(errors.InputError, match="float64"):
        module.copy_buffer_to_parameters(np.zeros(size, np.float64), trainable_only=False)


def test_export_model_for_inferencing(artifacts, tmp_path):
    state, module, opt = _setup(artifacts)
    module(*artifacts.batch(0))
    opt.set_learning_rate(0.1)
    opt.step()
    path = tmp_path / "inference_model.onnx"
    module.export_model_for_inferencing(path, ["output"])
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == artifacts.info["inference_input_names"]
    x, _ = artifacts.eval_batch()
    (got,) = session.run(None, {"input": x})
    np.testing.assert_allclose(got, mlp_forward(_params(state), x), rtol=1e-5, atol=1e-5)


def test_export_matches_ort_recorded_inference(artifacts, tmp_path):
    _, module, opt = _setup(artifacts)
    module(*artifacts.batch(0))
    module.lazy_reset_grad()
    module(*artifacts.batch(1))
    opt.set_learning_rate(0.1)
    opt.step()
    path = tmp_path / "inference_model.onnx"
    module.export_model_for_inferencing(path, ["output"])
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input": artifacts.eval_batch()[0]})
    np.testing.assert_allclose(got, artifacts.expected["inference_1::output"], rtol=1e-5, atol=1e-5)


def test_export_unknown_output_name(frozen_artifacts, tmp_path):
    _, module, _ = _setup(frozen_artifacts, optimizer=False)
    with pytest.raises(errors.TrainingError, match="nope"):
        module.export_model_for_inferencing(tmp_path / "m.onnx", ["nope"])


@pytest.mark.parametrize(
    "value", [-1, 0, 1, 1234567890, 2**40, -1.0, -0.1, 0.1, 1.0, 1234.0, "hello", "world", "onnxruntime", ""])
def test_add_get_property(make, tmp_path, value):
    a = make("frozen_sgd", "ort")
    state = CheckpointState.load_checkpoint(a.checkpoint)
    Module(a.train, state)
    # Floats are saved as float32: reading one back gives the float32 value.
    expected = float(np.float32(value)) if isinstance(value, float) else value
    assert len(state.properties) == 0
    state.properties["property"] = value
    assert "property" in state.properties
    assert state.properties["property"] == expected
    assert type(state.properties["property"]) is type(expected)
    assert len(state.properties) == 1
    path = tmp_path / "ckpt"
    CheckpointState.save_checkpoint(state, path)
    new_state = CheckpointState.load_checkpoint(path)
    assert "property" in new_state.properties
    assert new_state.properties["property"] == expected
    assert type(new_state.properties["property"]) is type(expected)
    assert len(new_state.properties) == 1


def test_properties_of_every_kind_match_ort(frozen_artifacts, tmp_path):
    a = frozen_artifacts
    state = CheckpointState.load_checkpoint(a.checkpoint)
    state.properties["epoch"] = 3
    state.properties["best_metric"] = 0.1
    state.properties["run_name"] = "api-fixture"
    assert dict(state.properties) == a.info["properties"]
    assert [n for n, _ in state.properties] == a.info["property_iteration_order"]
    path = tmp_path / "ckpt"
    CheckpointState.save_checkpoint(state, path)
    assert dict(CheckpointState.load_checkpoint(path).properties) == a.info["properties_reloaded"]
    # ORT's own file with these properties reads the same.
    from jaxort import checkpoint as ckpt

    ort_file = ckpt.load_from_buffer(a.expected["ckpt_with_opt_bytes"].tobytes())
    assert dict(CheckpointState(ort_file).properties) == a.info["properties"]


def test_property_errors(frozen_artifacts):
    state = CheckpointState.load_checkpoint(frozen_artifacts.checkpoint)
    with pytest.raises(KeyError, match="Property nope not found"):
        state.properties["nope"]
    with pytest.raises(errors.InputError, match="int, float or str"):
        state.properties["bad"] = [1]
    with pytest.raises(errors.InputError, match="int64"):
        state.properties["big"] = 2**64
    state.properties["flag"] = True  # ORT 1.19.2 stores a bool as an int
    assert state.properties["flag"] == 1 and type(state.properties["flag"]) is int


def test_get_input_output_names(artifacts):
    _, module, _ = _setup(artifacts, optimizer=False)
    training_model = onnx.load(artifacts.train)
    n_out = 2 if artifacts.case == "two_outputs_adamw" else 1
    assert module.input_names() == [i.name for i in training_model.graph.input][:2] == ["input", "labels"]
    assert module.output_names() == [o.name for o in training_model.graph.output][:n_out]
    module.eval()
    eval_model = onnx.load(artifacts.eval)
    assert module.input_names() == ["input", "labels"]
    assert module.output_names() == [o.name for o in eval_model.graph.output]
    if artifacts.source == "ort":
        module.train()
        assert module.output_names() == artifacts.info["output_names"]
        module.eval()
        assert module.output_names() == artifacts.info["eval_output_names"]


def test_get_and_set_parameter_values(frozen_artifacts):
    a = frozen_artifacts
    state = CheckpointState.load_checkpoint(a.checkpoint)
    assert [n for n, _ in state.parameters] == a.info["parameter_iteration_order"]
    assert {n: p.grad is None for n, p in state.parameters} == a.info["grad_before_module_is_none"]
    module = Module(a.train, state, a.eval)
    assert len(state.parameters) == 4
    assert {n: p.requires_grad for n, p in state.parameters} == a.info["requires_grad"]
    for name, p in state.parameters:
        assert p.name == name
        np.testing.assert_array_equal(p.data, a.expected[f"param_0::{name}"])
        if p.requires_grad:
            np.testing.assert_array_equal(p.grad, np.zeros_like(p.data))
        else:
            assert p.grad is None
    original = state.parameters["fc1.weight"].data
    state.parameters["fc1.weight"].data = np.ones_like(original)
    np.testing.assert_array_equal(state.parameters["fc1.weight"].data, np.ones_like(original))
    module.train()
    x, y = a.batch(0)
    loss = module(x, y)
    np.testing.assert_allclose(loss, cross_entropy(mlp_forward(_params(state), x), y), **LOSS_TOL)
    for name, p in state.parameters:
        assert (p.grad is None) == (not p.requires_grad)
        if p.requires_grad:
            assert p.grad.any()
    state.parameters["fc1.weight"] = original
    np.testing.assert_array_equal(state.parameters["fc1.weight"].data, original)


def test_parameter_errors(frozen_artifacts):
    state = CheckpointState.load_checkpoint(frozen_artifacts.checkpoint)
    Module(frozen_artifacts.train, state)
    assert "fc1.weight" in state.parameters and "nope" not in state.parameters
    with pytest.raises(KeyError, match="Parameter nope not found"):
        state.parameters["nope"]
    with pytest.raises(KeyError, match="Parameter nope not found"):
        state.parameters["nope"] = np.zeros(3, np.float32)
    with pytest.raises(errors.InputError, match=r"expected shape \(3,\).*given shape \(4,\)"):
        state.parameters["fc2.bias"] = np.zeros(4, np.float32)
    with pytest.raises(errors.InputError, match="float64"):
        state.parameters["fc2.bias"] = np.zeros(3, np.float64)
    with pytest.raises(errors.InputError, match="shape"):
        state.parameters["fc2.bias"].data = np.zeros((3, 1), np.float32)


def test_data_is_a_copy(frozen_artifacts):
    state = CheckpointState.load_checkpoint(frozen_artifacts.checkpoint)
    Module(frozen_artifacts.train, state)
    data = state.parameters["fc2.bias"].data
    data[:] = 7.0
    assert not np.any(state.parameters["fc2.bias"].data == 7.0)


def test_model_construction_with_nominal_checkpoint(make):
    for source in ("ort", "jaxort"):
        a = make("frozen_sgd", source)
        nominal = CheckpointState.load_checkpoint(a.path("nominal_checkpoint"))
        module = Module(a.train, nominal, a.eval)
        opt = Optimizer(a.optimizer, module)
        x, y = a.batch(0)
        assert len(nominal.parameters) == a.info["nominal"]["len"]
        assert "fc1.weight" in nominal.parameters
        with pytest.raises(errors.StateError, match="Please load the parameter states first"):
            nominal.parameters["fc1.weight"]
        with pytest.raises(errors.StateError, match="Please load all the parameter states first"):
            nominal.parameters["fc1.weight"] = np.ones((12, 8), np.float32)
        with pytest.raises(errors.StateError, match="Please load the model parameters first"):
            module.get_contiguous_parameters()
        with pytest.raises(errors.StateError, match="Please load the model parameters first"):
            module.train()(x, y)
        with pytest.raises(errors.StateError, match="Please load the model parameters first"):
            opt.step()
        with pytest.raises(errors.StateError, match="Please load the model parameters first"):
            module.eval()(x, y)
        with pytest.raises(errors.StateError, match="trainable_only = false"):
            module.copy_buffer_to_parameters(a.expected["contiguous_trainable_0"], trainable_only=True)
        assert module.get_parameters_size() == a.info["nominal"]["parameters_size_trainable"]
        assert module.get_parameters_size(False) == a.info["nominal"]["parameters_size_all"]


def test_train_with_nominal_checkpoint(make, tmp_path):
    for source in ("ort", "jaxort"):
        a = make("frozen_sgd", source)
        complete = CheckpointState.load_checkpoint(a.checkpoint)
        nominal = CheckpointState.load_checkpoint(a.path("nominal_checkpoint"))
        m1, m2 = Module(a.train, complete), Module(a.train, nominal)
        o1, o2 = Optimizer(a.optimizer, m1), Optimizer(a.optimizer, m2)
        m2.copy_buffer_to_parameters(m1.get_contiguous_parameters(), trainable_only=False)
        x, y = a.batch(0)
        l1, l2 = m1(x, y), m2(x, y)
        np.testing.assert_array_equal(l1, l2)
        np.testing.assert_allclose(l2, a.expected["nominal_completed::train_0::output0"], **LOSS_TOL)
        np.testing.assert_allclose(l1, cross_entropy(mlp_forward(_params(complete), x), y), **LOSS_TOL)
        o1.step()
        o2.step()
        np.testing.assert_array_equal(m1.get_contiguous_parameters(), m2.get_contiguous_parameters())
        # The completed state saves as a complete checkpoint.
        CheckpointState.save_checkpoint(nominal, tmp_path / f"completed_{source}")
        reloaded = CheckpointState.load_checkpoint(tmp_path / f"completed_{source}")
        np.testing.assert_array_equal(reloaded.parameters["fc2.bias"].data, complete.parameters["fc2.bias"].data)


def test_out_of_order_calls_raise_state_error(frozen_artifacts, tmp_path):
    a = frozen_artifacts
    state, module, opt = _setup(a)
    with pytest.raises(errors.StateError, match="before any train step"):
        opt.step()
    bare = Module(a.train, CheckpointState.load_checkpoint(a.checkpoint))
    with pytest.raises(errors.StateError, match="Eval model was not provided"):
        bare.eval()(*a.eval_batch())
    with pytest.raises(errors.StateError, match="Cannot export a model for inferencing"):
        bare.train().export_model_for_inferencing(tmp_path / "m.onnx", ["output"])
    assert bare.eval().input_names() == [] and bare.output_names() == []


def test_wrong_inputs(frozen_artifacts):
    _, module, _ = _setup(frozen_artifacts, optimizer=False)
    x, y = frozen_artifacts.batch(0)
    with pytest.raises(errors.InputError, match="2 inputs"):
        module(x)
    with pytest.raises(errors.InputError):
        module(x[:, :3], y)


def test_lists_are_accepted_as_inputs(frozen_artifacts):
    state, module, _ = _setup(frozen_artifacts, optimizer=False)
    x, y = frozen_artifacts.batch(0)
    np.testing.assert_allclose(module(x.tolist(), y), frozen_artifacts.expected["train_0::output0"], **LOSS_TOL)


def test_device_selection(frozen_artifacts):
    import jax

    a = frozen_artifacts
    state = CheckpointState.load_checkpoint(a.checkpoint)
    Module(a.train, state, device="cpu")
    with pytest.raises(errors.InputError, match="unknown device 'npu'"):
        Module(a.train, CheckpointState.load_checkpoint(a.checkpoint), device="npu")
    platforms = {d.platform for d in jax.devices()}
    for device, platform in (("cuda", "gpu"), ("tpu", "tpu")):
        if platform not in platforms:
            with pytest.raises(errors.InputError, match="not available"):
                Module(a.train, CheckpointState.load_checkpoint(a.checkpoint), device=device)
    with pytest.raises(errors.InputError, match="not available"):
        Module(a.train, CheckpointState.load_checkpoint(a.checkpoint), device="cpu:99")
