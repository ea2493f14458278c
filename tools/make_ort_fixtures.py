"""Writes tests/fixtures/ort_generated/: artifacts from ONNX Runtime's generate_artifacts.

jaxort's ``generate_artifacts`` is tested against these files: the eval and
optimizer models must equal ORT's (names compared up to ORT's process-wide
name counter, recorded per case as ``name_offset``), the checkpoints must be
byte-identical, and the training models must have ORT's inputs and outputs.

Run it with a Python that has onnxruntime-training 1.19.2 and onnx 1.16
(never a jaxort dependency)::

    python tools/make_ort_fixtures.py [output_dir]

Cases (float32, fixed seeds, so regenerating gives the same files):

- ``mlp_frozen_ce_adamw``: Reshape([-1, 64], an int64 constant) then an MLP
  64 -> 16 -> 12 -> 10 with Relu; ``fc1.*`` frozen, ``fc2.*`` and ``fc3.*``
  trainable; CrossEntropyLoss, AdamW, nominal checkpoint. Opset 17, IR 8.
- ``bn_dropout_bce_sgd``: Gemm -> BatchNormalization(training_mode=1) ->
  Dropout(ratio, training_mode constants; the mask output, which ORT's
  gradient builder needs); running mean and var frozen;
  BCEWithLogitsLoss, SGD. Opset 15, IR 8.
- ``two_outputs_mse_sgd``: a model with outputs ``out_a`` and ``out_b``;
  ``loss_input_names=["out_a"]``, ``additional_output_names=["out_b"]``;
  MSELoss, SGD. Opset 17, IR 8.
- ``gemm_l1_adamw``: Gemm(transB=1) + Sigmoid at opset 13, IR 7; L1Loss, AdamW.
- ``mlp_no_requires_grad_ce``: the MLP of ``mlp_frozen_ce_adamw`` with
  ``requires_grad=None`` and ``fc1.*`` frozen: ORT trains nothing; no
  optimizer (ORT's optimizer generation fails with nothing to train).

Each folder holds ``model.onnx`` (the input), ORT's ``training_model.onnx``,
``eval_model.onnx``, ``optimizer_model.onnx`` (where an optimizer is asked for), ``checkpoint`` (and
``nominal_checkpoint``), and ``args.json`` (the arguments and the name
counter before the call).

This script imports onnxruntime.training and must not import jaxort.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from onnxruntime.training import artifacts
from onnxruntime.training.onnxblock import _graph_utils


def _model(nodes, inits, inputs, outputs, opset, ir, name):
    graph = helper.make_graph(nodes, name, inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="make_ort_fixtures")
    model.ir_version = ir
    onnx.checker.check_model(model, full_check=True)
    return model


def _mlp_frozen() -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    inits = {"shape": np.array([-1, 64], np.int64)}
    dims = [(64, 16), (16, 12), (12, 10)]
    for i, (a, b) in enumerate(dims, 1):
        inits[f"fc{i}.weight"] = rng.normal(0, 0.2, (a, b)).astype(np.float32)
        inits[f"fc{i}.bias"] = rng.normal(0, 0.05, (b,)).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["input", "shape"], ["x0"], name="flatten")]
    x = "x0"
    for i in range(1, 4):
        out = "output" if i == 3 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [x, f"fc{i}.weight"], [f"mm{i}"], name=f"fc{i}/MatMul"))
        nodes.append(helper.make_node("Add", [f"mm{i}", f"fc{i}.bias"], [out if i == 3 else f"a{i}"],
                                      name=f"fc{i}/Add"))
        if i < 3:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [out], name=f"relu{i}"))
        x = out
    return _model(nodes, inits,
                  [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 8, 8])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
                  17, 8, "mlp_frozen")


def _bn_dropout() -> onnx.ModelProto:
    rng = np.random.default_rng(12)
    inits = {
        "fc.weight": rng.normal(0, 0.3, (6, 4)).astype(np.float32),
        "fc.bias": rng.normal(0, 0.1, (4,)).astype(np.float32),
        "bn.scale": (1 + rng.normal(0, 0.1, (4,))).astype(np.float32),
        "bn.bias": rng.normal(0, 0.1, (4,)).astype(np.float32),
        "bn.running_mean": rng.normal(0, 0.1, (4,)).astype(np.float32),
        "bn.running_var": (1 + np.abs(rng.normal(0, 0.1, (4,)))).astype(np.float32),
        "dropout.ratio": np.array(0.25, np.float32),
        "dropout.training_mode": np.array(True),
    }
    nodes = [
        helper.make_node("Gemm", ["input", "fc.weight", "fc.bias"], ["fc.out"], name="fc"),
        helper.make_node("BatchNormalization",
                         ["fc.out", "bn.scale", "bn.bias", "bn.running_mean", "bn.running_var"],
                         ["bn.out", "bn.mean_out", "bn.var_out"], name="bn", training_mode=1, momentum=0.9),
        helper.make_node("Dropout", ["bn.out", "dropout.ratio", "dropout.training_mode"],
                         ["output", "dropout.mask"], name="dropout"),
    ]
    return _model(nodes, inits,
                  [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 6])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])],
                  15, 8, "bn_dropout")


def _two_outputs() -> onnx.ModelProto:
    rng = np.random.default_rng(13)
    inits = {"w": rng.normal(0, 0.3, (5, 3)).astype(np.float32),
             "b": rng.normal(0, 0.1, (3,)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["input", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["out_a"], name="add"),
             helper.make_node("Tanh", ["out_a"], ["out_b"], name="tanh")]
    return _model(nodes, inits,
                  [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 5])],
                  [helper.make_tensor_value_info("out_a", TensorProto.FLOAT, ["batch", 3]),
                   helper.make_tensor_value_info("out_b", TensorProto.FLOAT, ["batch", 3])],
                  17, 8, "two_outputs")


def _gemm_l1() -> onnx.ModelProto:
    rng = np.random.default_rng(14)
    inits = {"fc.weight": rng.normal(0, 0.3, (4, 10)).astype(np.float32),
             "fc.bias": rng.normal(0, 0.1, (4,)).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["input", "fc.weight", "fc.bias"], ["fc.out"], name="fc", transB=1),
             helper.make_node("Sigmoid", ["fc.out"], ["output"], name="sigmoid")]
    return _model(nodes, inits,
                  [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 10])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])],
                  13, 7, "gemm_l1")


CASES = {
    "mlp_frozen_ce_adamw": (_mlp_frozen, dict(
        requires_grad=["fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"],
        frozen_params=["fc1.weight", "fc1.bias"], loss="CrossEntropyLoss", optimizer="AdamW",
        nominal_checkpoint=True)),
    "bn_dropout_bce_sgd": (_bn_dropout, dict(
        requires_grad=["fc.weight", "fc.bias", "bn.scale", "bn.bias"],
        frozen_params=["bn.running_mean", "bn.running_var"], loss="BCEWithLogitsLoss", optimizer="SGD")),
    "two_outputs_mse_sgd": (_two_outputs, dict(
        requires_grad=["w", "b"], frozen_params=[], loss="MSELoss", optimizer="SGD",
        loss_input_names=["out_a"], additional_output_names=["out_b"])),
    "gemm_l1_adamw": (_gemm_l1, dict(
        requires_grad=["fc.weight", "fc.bias"], frozen_params=[], loss="L1Loss", optimizer="AdamW")),
    # requires_grad=None: ORT trains nothing (and fails to build an optimizer).
    "mlp_no_requires_grad_ce": (_mlp_frozen, dict(
        requires_grad=None, frozen_params=["fc1.weight", "fc1.bias"], loss="CrossEntropyLoss",
        optimizer=None)),
}


def main(argv: list[str]) -> None:
    onnxruntime.set_default_logger_severity(3)
    root = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "ort_generated")
    for name, (make, args) in CASES.items():
        case_dir = os.path.join(root, name)
        os.makedirs(case_dir, exist_ok=True)
        model = make()
        onnx.save(model, os.path.join(case_dir, "model.onnx"))
        kwargs = dict(args)
        kwargs["loss"] = artifacts.LossType[args["loss"]]
        kwargs["optimizer"] = args["optimizer"] and artifacts.OptimType[args["optimizer"]]
        offset = _graph_utils._GRAPH_TOKEN
        artifacts.generate_artifacts(model, artifact_directory=case_dir, **kwargs)
        with open(os.path.join(case_dir, "args.json"), "w") as f:
            json.dump({**args, "name_offset": offset}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {case_dir}")


if __name__ == "__main__":
    main(sys.argv)
