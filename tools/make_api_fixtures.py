"""Writes tests/fixtures/ort_api/: small ONNX Runtime Training artifacts and the
results ONNX Runtime's own ``onnxruntime.training.api`` gives on them.

The jaxort.api tests replay the same calls and compare with what is recorded
here, so they check jaxort against ONNX Runtime rather than against itself.

Run it with a Python that has onnxruntime-training 1.19.2 and onnx 1.16
(never a jaxort dependency)::

    python tools/make_api_fixtures.py [output_dir]

Cases (MLP 12 -> 8 -> 3 with Relu, batch 4, float32, opset 17):

- ``frozen_sgd``: ``fc1.*`` frozen, ``fc2.*`` trainable, CrossEntropyLoss, SGD;
  also writes ``nominal_checkpoint``.
- ``two_outputs_adamw``: all trainable, CrossEntropyLoss, AdamW, and the model
  output kept as a second graph output (``additional_output_names``), so a
  step returns ``(loss, output)``.

Each case folder holds the forward ``model.onnx`` given to
``generate_artifacts``, the four artifacts, ``batches.npz``, ``expected.npz``
(arrays) and ``expected.json`` (scalars, names, learning rates, properties,
error messages). Regenerating gives the same numbers: every random value
comes from a fixed seed.

This script imports onnxruntime.training and must not import jaxort.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxruntime
from onnxruntime.capi.onnxruntime_inference_collection import OrtValue
from onnxruntime.training import artifacts
from onnxruntime.training.api import CheckpointState, LinearLRScheduler, Module, Optimizer

IN, HIDDEN, OUT, BATCH = 12, 8, 3, 4


def _mlp(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = {
        "fc1.weight": rng.normal(0, 0.3, (IN, HIDDEN)).astype(np.float32),
        "fc1.bias": rng.normal(0, 0.1, (HIDDEN,)).astype(np.float32),
        "fc2.weight": rng.normal(0, 0.3, (HIDDEN, OUT)).astype(np.float32),
        "fc2.bias": rng.normal(0, 0.1, (OUT,)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["input", "fc1.weight"], ["h0"], name="fc1/MatMul"),
        helper.make_node("Add", ["h0", "fc1.bias"], ["h1"], name="fc1/Add"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "fc2.weight"], ["h3"], name="fc2/MatMul"),
        helper.make_node("Add", ["h3", "fc2.bias"], ["output"], name="fc2/Add"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", OUT])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _batches(seed: int, count: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "train::input": rng.normal(0, 1, (count, BATCH, IN)).astype(np.float32),
        "train::labels": rng.integers(0, OUT, (count, BATCH)).astype(np.int64),
        "eval::input": rng.normal(0, 1, (BATCH, IN)).astype(np.float32),
        "eval::labels": rng.integers(0, OUT, (BATCH,)).astype(np.int64),
    }


def _as_numpy(value):
    # OrtValue.numpy() and Parameter.data/.grad can alias ORT's buffers, which
    # later steps overwrite: keep copies.
    return np.array(value.numpy() if hasattr(value, "numpy") else value, copy=True)


def _error(fn) -> str | None:
    try:
        fn()
    except Exception as exc:  # the message is what gets recorded
        return f"{type(exc).__name__}: {str(exc).splitlines()[-1][-200:]}"
    return None


def _record(case_dir: str, batches: dict[str, np.ndarray], nominal: bool) -> tuple[dict, dict]:
    arrays: dict[str, np.ndarray] = {}
    info: dict = {}
    path = lambda name: os.path.join(case_dir, name)  # noqa: E731
    x0, y0 = batches["train::input"][0], batches["train::labels"][0]
    x1, y1 = batches["train::input"][1], batches["train::labels"][1]

    state = CheckpointState.load_checkpoint(path("checkpoint"))
    info["parameter_iteration_order"] = [name for name, _ in state.parameters]
    info["requires_grad"] = {name: p.requires_grad for name, p in state.parameters}
    info["grad_before_module_is_none"] = {name: p.grad is None for name, p in state.parameters}
    module = Module(path("training_model.onnx"), state, path("eval_model.onnx"))
    optimizer = Optimizer(path("optimizer_model.onnx"), module)
    info["grad_after_module_is_none"] = {name: p.grad is None for name, p in state.parameters}
    info["lr_default"] = optimizer.get_learning_rate()
    info["input_names"] = module.input_names()
    info["output_names"] = module.output_names()
    module.eval()
    info["eval_input_names"] = module.input_names()
    info["eval_output_names"] = module.output_names()
    module.train()
    info["parameters_size_trainable"] = module.get_parameters_size()
    info["parameters_size_all"] = module.get_parameters_size(False)
    arrays["contiguous_all_0"] = _as_numpy(module.get_contiguous_parameters())
    arrays["contiguous_trainable_0"] = _as_numpy(module.get_contiguous_parameters(trainable_only=True))
    for name, p in state.parameters:
        arrays[f"param_0::{name}"] = _as_numpy(p.data)

    outputs = module(x0, y0)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for i, value in enumerate(outputs):
        arrays[f"train_0::output{i}"] = _as_numpy(value)
    for name, p in state.parameters:
        if p.grad is not None:
            arrays[f"grad_0::{name}"] = _as_numpy(p.grad)
    module.lazy_reset_grad()
    for name, p in state.parameters:
        if p.grad is not None:
            arrays[f"grad_after_reset::{name}"] = _as_numpy(p.grad)
    outputs = module(x1, y1)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    arrays["train_1::output0"] = _as_numpy(outputs[0])
    for name, p in state.parameters:
        if p.grad is not None:
            arrays[f"grad_1::{name}"] = _as_numpy(p.grad)

    optimizer.set_learning_rate(0.1)
    info["lr_after_set"] = optimizer.get_learning_rate()
    optimizer.step()
    arrays["contiguous_all_1"] = _as_numpy(module.get_contiguous_parameters())
    module.eval()
    outputs = module(batches["eval::input"], batches["eval::labels"])
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for i, value in enumerate(outputs):
        arrays[f"eval_1::output{i}"] = _as_numpy(value)
    module.train()

    module.export_model_for_inferencing(path("inference_model.onnx"), ["output"])
    inference = onnxruntime.InferenceSession(path("inference_model.onnx"), providers=["CPUExecutionProvider"])
    arrays["inference_1::output"] = inference.run(None, {"input": batches["eval::input"]})[0]
    info["inference_input_names"] = [i.name for i in inference.get_inputs()]
    os.remove(path("inference_model.onnx"))

    # copy_buffer_to_parameters: trainable_only=True leaves frozen parameters alone.
    trainable_0 = OrtValue.ortvalue_from_numpy(arrays["contiguous_trainable_0"])._ortvalue
    module.copy_buffer_to_parameters(trainable_0, True)
    arrays["contiguous_all_after_copy_trainable"] = _as_numpy(module.get_contiguous_parameters())
    ramp = np.arange(info["parameters_size_all"], dtype=np.float32) / 100.0
    module.copy_buffer_to_parameters(OrtValue.ortvalue_from_numpy(ramp)._ortvalue, False)
    for name, p in state.parameters:
        arrays[f"param_after_ramp::{name}"] = _as_numpy(p.data)
    info["copy_wrong_size_error"] = _error(
        lambda: module.copy_buffer_to_parameters(OrtValue.ortvalue_from_numpy(ramp[:3])._ortvalue, False)
    )

    state.properties["epoch"] = 3
    state.properties["best_metric"] = 0.1
    state.properties["run_name"] = "api-fixture"
    info["properties"] = dict(iter(state.properties))
    info["property_iteration_order"] = [name for name, _ in state.properties]
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "ckpt")
        CheckpointState.save_checkpoint(state, saved, include_optimizer_state=True)
        with open(saved, "rb") as f:
            arrays["ckpt_with_opt_bytes"] = np.frombuffer(f.read(), np.uint8)
        reloaded = CheckpointState.load_checkpoint(saved)
        info["properties_reloaded"] = dict(iter(reloaded.properties))

    info["errors"] = {
        "unknown_parameter": _error(lambda: state.parameters["nope"]),
        "set_wrong_shape": _error(lambda: state.parameters.__setitem__("fc2.bias", np.zeros(OUT + 1, np.float32))),
        "set_wrong_dtype": _error(lambda: state.parameters.__setitem__("fc2.bias", np.zeros(OUT, np.float64))),
        "unknown_property": _error(lambda: state.properties["nope"]),
        "export_unknown_output": _error(
            lambda: module.export_model_for_inferencing(path("unused.onnx"), ["nope"])
        ),
    }
    if os.path.exists(path("unused.onnx")):
        os.remove(path("unused.onnx"))

    # LinearLRScheduler as the ORT tests call it, on a fresh module.
    sched_state = CheckpointState.load_checkpoint(path("checkpoint"))
    sched_module = Module(path("training_model.onnx"), sched_state)
    sched_optimizer = Optimizer(path("optimizer_model.onnx"), sched_module)
    scheduler = LinearLRScheduler(sched_optimizer, 1, 2, 0.2)
    lrs = [sched_optimizer.get_learning_rate()]
    for k in range(3):
        sched_module(batches["train::input"][k], batches["train::labels"][k])
        sched_optimizer.step()
        scheduler.step()
        sched_module.lazy_reset_grad()
        lrs.append(sched_optimizer.get_learning_rate())
    info["scheduler"] = {"args": [1, 2, 0.2], "lrs": lrs}

    if nominal:
        nominal_state = CheckpointState.load_checkpoint(path("nominal_checkpoint"))
        nominal_module = Module(path("training_model.onnx"), nominal_state, path("eval_model.onnx"))
        info["nominal"] = {
            "len": len(nominal_state.parameters),
            "contains_fc1.weight": "fc1.weight" in nominal_state.parameters,
            "getitem_error": _error(lambda: nominal_state.parameters["fc1.weight"]),
            "contiguous_error": _error(nominal_module.get_contiguous_parameters),
            "train_error": _error(lambda: nominal_module(x0, y0)),
            "copy_trainable_only_error": _error(
                lambda: nominal_module.copy_buffer_to_parameters(
                    OrtValue.ortvalue_from_numpy(arrays["contiguous_trainable_0"])._ortvalue, True
                )
            ),
            "parameters_size_trainable": nominal_module.get_parameters_size(),
            "parameters_size_all": nominal_module.get_parameters_size(False),
        }
        complete = OrtValue.ortvalue_from_numpy(arrays["contiguous_all_0"])._ortvalue
        nominal_module.copy_buffer_to_parameters(complete, False)
        arrays["nominal_completed::train_0::output0"] = _as_numpy(nominal_module(x0, y0))
    return info, arrays


def _write_case(root: str, name: str, seed: int, frozen: list[str], optimizer, nominal: bool,
                extra_outputs) -> None:
    case_dir = os.path.join(root, name)
    os.makedirs(case_dir, exist_ok=True)
    model = _mlp(seed)
    onnx.save(model, os.path.join(case_dir, "model.onnx"))
    params = [i.name for i in model.graph.initializer]
    artifacts.generate_artifacts(
        model,
        requires_grad=[p for p in params if p not in frozen],
        frozen_params=frozen,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optimizer,
        artifact_directory=case_dir,
        nominal_checkpoint=nominal,
        additional_output_names=extra_outputs,
    )
    batches = _batches(seed + 1, 3)
    np.savez(os.path.join(case_dir, "batches.npz"), **batches)
    info, arrays = _record(case_dir, batches, nominal)
    info["case"] = name
    info["versions"] = {"onnxruntime_training": onnxruntime.__version__, "onnx": onnx.__version__}
    info["frozen_params"] = frozen
    info["optimizer"] = optimizer.name
    info["additional_output_names"] = extra_outputs
    np.savez(os.path.join(case_dir, "expected.npz"), **arrays)
    with open(os.path.join(case_dir, "expected.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)


def main(argv: list[str]) -> None:
    default = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "ort_api")
    root = argv[1] if len(argv) > 1 else default
    _write_case(root, "frozen_sgd", 11, ["fc1.weight", "fc1.bias"], artifacts.OptimType.SGD, True, None)
    _write_case(root, "two_outputs_adamw", 23, [], artifacts.OptimType.AdamW, False, ["output"])


if __name__ == "__main__":
    main(sys.argv)
