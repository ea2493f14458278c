"""Checkpoints written by ONNX Runtime Training 1.19.2 load with the values its run recorded."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import jaxort.checkpoint as ckpt

from .conftest import AFTER, CASES, GOLDEN, manifest


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", AFTER)
def test_after_run_matches_params_and_properties(case, kind):
    m = manifest(case)
    state = ckpt.load(GOLDEN / case / kind)
    after = np.load(GOLDEN / case / "params_after.npz")
    assert list(state.trainable) == sorted(m["requires_grad"])  # ORT sorts by name
    assert list(state.frozen) == sorted(m["frozen_params"])
    assert set(state.parameters) == set(after.files)
    for name in after.files:
        np.testing.assert_array_equal(state.parameters[name], after[name], strict=True)
        assert state.parameters[name].flags.writeable is False
    spec = {p["name"]: p for p in m["parameters"]}
    for name, value in state.parameters.items():
        assert list(value.shape) == spec[name]["shape"] and str(value.dtype) == spec[name]["dtype"]
    assert state.properties == m["properties"]["values"]
    assert list(state.properties) == ["epoch", "best_metric", "run_name"]  # ints, floats, strings
    assert [type(v).__name__ for v in state.properties.values()] == [
        m["properties"]["types"][k] for k in state.properties
    ]
    assert not state.is_nominal and not state.has_external_data


@pytest.mark.parametrize("case", CASES)
def test_optimizer_groups(case):
    m = manifest(case)
    with_opt = ckpt.load(GOLDEN / case / "ckpt_after_with_opt")
    assert ckpt.load(GOLDEN / case / "ckpt_after_no_opt").optimizer_groups == ()
    (group,) = with_opt.optimizer_groups
    assert group.name == "group0" and with_opt.optimizer_group("group0") is group
    assert group.step == m["optimizer_steps"]
    # ORT saves the initial learning rate: a fresh optimizer's 1e-3, or the
    # scheduler's initial_lr (set_learning_rate does not change it).
    initial = m["lr_schedule"].get("effective", {}).get("initial_lr", 1e-3)
    assert group.initial_learning_rate == float(np.float32(initial))
    assert list(group.states) == sorted(m["requires_grad"])
    snaps = np.load(GOLDEN / case / "step_snapshots.npz")
    for param, moments in group.states.items():
        shape = with_opt.trainable[param].shape
        if m["optimizer"]["type"] == "SGD":
            # ORT 1.19.2's SGD keeps one unused, all-zero momentum per parameter.
            assert list(moments) == ["momentum0"]
            np.testing.assert_array_equal(moments["momentum0"], np.zeros(shape, np.float32), strict=True)
            continue
        assert list(moments) == ["momentum0", "momentum1"]
        attrs = m["optimizer"]["attributes"]
        b1, b2 = np.float32(attrs["alpha"]), np.float32(attrs["beta"])
        m1 = np.zeros(shape, np.float32)
        m2 = np.zeros(shape, np.float32)
        for k in range(1, m["optimizer_steps"] + 1):
            g = snaps[f"step{k}::grad::{param}"]
            m1 = b1 * m1 + (np.float32(1) - b1) * g
            m2 = b2 * m2 + (np.float32(1) - b2) * g * g
        tol = m["tolerances"]["optimizer_state"]
        np.testing.assert_allclose(moments["momentum0"], m1, rtol=tol["rtol"], atol=tol["atol"])
        np.testing.assert_allclose(moments["momentum1"], m2, rtol=tol["rtol"], atol=tol["atol"])


@pytest.mark.parametrize("case", CASES)
def test_initial_checkpoint_holds_the_model_initializers(case):
    m = manifest(case)
    state = ckpt.load(GOLDEN / case / "checkpoint")
    model = onnx.load(str(GOLDEN / case / "model.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert list(state.trainable) == m["requires_grad"]  # the order generate_artifacts gave
    assert list(state.frozen) == m["frozen_params"]
    for name, value in state.parameters.items():
        np.testing.assert_array_equal(value, inits[name], strict=True)
    assert state.optimizer_groups == () and state.properties == {}


def test_nominal_checkpoint():
    m = manifest("mlp_adamw")
    state = ckpt.load(GOLDEN / "mlp_adamw" / "nominal_checkpoint")
    assert state.is_nominal
    assert sorted(state.parameters) == m["nominal_checkpoint"]["parameter_names"]
    for value in state.parameters.values():
        # ONNX Runtime 1.19.2 writes nominal tensors without dims.
        assert value == ckpt.NominalTensor((), np.dtype(np.float32))


def test_load_to_model_fills_initializers():
    case = GOLDEN / "mlp_adamw"
    model = onnx.load(str(case / "model.onnx"))
    before = model.SerializeToString()
    filled = ckpt.load_to_model(case / "ckpt_after_no_opt", model)
    assert model.SerializeToString() == before  # the input is not modified
    after = np.load(case / "params_after.npz")
    got = {i.name: numpy_helper.to_array(i) for i in filled.graph.initializer}
    assert set(got) == set(after.files)
    for name in after.files:
        np.testing.assert_array_equal(got[name], after[name], strict=True)
    # The exported inference model holds the same trained parameters.
    inference = onnx.load(str(case / "inference_model.onnx"))
    for init in inference.graph.initializer:
        np.testing.assert_array_equal(got[init.name], numpy_helper.to_array(init), strict=True)
    with pytest.raises(ckpt.CheckpointError, match="nominal"):
        ckpt.load_to_model(case / "nominal_checkpoint", model)


def test_ort_dtype_files():
    protos = ckpt.load(GOLDEN.parent / "checkpoint" / "dtypes_protos.ckpt")
    state = ckpt.load(GOLDEN.parent / "checkpoint" / "dtypes_state.ckpt")
    p = protos.parameters
    expect = {
        "s": np.array(3.25, np.float32),
        "empty": np.zeros((0, 3), np.float32),
        "i8": np.arange(-3, 3, dtype=np.int8),
        "u8": np.arange(6, dtype=np.uint8).reshape(2, 3),
        "i16": np.array([-2, 7], np.int16),
        "u16": np.array([1, 65535], np.uint16),
        "i32": np.array([-(2**31), 2**31 - 1], np.int32),
        "u32": np.array([0, 2**32 - 1], np.uint32),
        "i64": np.array([-(2**63), 2**63 - 1], np.int64),
        "u64": np.array([0, 2**64 - 1], np.uint64),
        "flags": np.array([True, False, True]),
        "d64": np.array([1.5, -2.0]),
        "scalar_i64": np.array(7, np.int64),
        "b.bf16": np.array([0, 1.5, 3, 4.5], dtype=ckpt_bfloat16()),
    }
    for name, value in expect.items():
        np.testing.assert_array_equal(p[name], value, strict=True)
    assert p["poids·f16"].dtype == np.float16 and p["x"].dtype == np.float64
    for name, value in state.parameters.items():
        np.testing.assert_array_equal(value, p[name], strict=True)
        assert value.flags.aligned
    assert list(state.trainable) == sorted(state.trainable, key=str.encode)
    assert state.properties == {"count": -(2**40), "epoch": 3, "alpha": float(np.float32(0.1)), "beta": -2.5, "tag": "dtypes ✓"}
    words = ckpt.load(GOLDEN.parent / "checkpoint" / "strings_protos.ckpt").trainable["words"]
    assert words.dtype == object and words.tolist() == [["a", ""], ["é", "xyz"]]


def ckpt_bfloat16():
    import ml_dtypes

    return ml_dtypes.bfloat16
