"""Property tests of jaxort through its public harness: random graphs against
ONNX's reference evaluator, random differentiable graphs against finite
differences, random checkpoints through bytes and files, and a planted bug
caught and shrunk to a small saved model.

Profile ``jaxort-ci`` (derandomized, bounded); under ``make fuzz``
(``FUZZ_MINUTES`` set) the graph properties run on fresh examples for that long.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time

import numpy as np
import onnx
import pytest
from hypothesis import find, given, settings
from hypothesis.errors import NoSuchExample
from hypothesis import strategies as st

import jaxort.graph._registry as registry
from jaxort.testing import (
    DIFFERENTIABLE_OPS,
    OP_FAMILIES,
    Coverage,
    assert_checkpoint_roundtrip,
    assert_matches_reference,
    assert_trains_like,
    check_gradients,
    checkpoint_states,
    load_failure,
    model_inputs,
    onnx_models,
    record_trajectory,
    training_artifacts,
)
from jaxort.testing.profiles import CI, FUZZ, fuzz_seconds

FUZZ_SECONDS = fuzz_seconds()


def _run(test, examples: int, share: float = 1.0) -> None:
    """Runs a property on ``examples`` CI examples, or on fresh ones for its share of FUZZ_MINUTES."""
    if not FUZZ_SECONDS:
        settings(CI, max_examples=examples)(test)()
        return
    end = time.monotonic() + FUZZ_SECONDS * share
    test = settings(FUZZ, max_examples=examples)(test)
    while time.monotonic() < end:
        test()


@pytest.fixture(autouse=True)
def _failures_in_tmp(tmp_path, monkeypatch):
    if not (FUZZ_SECONDS and os.environ.get("JAXORT_FAILURE_DIR")):  # make fuzz keeps its own
        monkeypatch.setenv("JAXORT_FAILURE_DIR", str(tmp_path / "failures"))


# One round per family (so every family gets its examples), then all mixed.
ROUNDS = [(family, 35) for family in OP_FAMILIES] + [(None, 60)]


def test_random_graphs_match_the_reference_evaluator():
    cov = Coverage()

    def property_of(ops):
        @given(st.data())
        def check(data):
            model = data.draw(onnx_models(ops=ops, max_nodes=4))
            cov.add(model)
            assert_matches_reference(model, data.draw(model_inputs(model)))
        return check

    for ops, examples in ROUNDS:
        _run(property_of(ops), examples, share=0.5 / len(ROUNDS))
    assert cov.models >= 300
    assert len(cov.ops) >= 30, cov.report()
    assert len(cov.opsets) >= 3 and len(cov.dtypes) >= 4, cov.report()


def test_drawn_models_pass_onnx_s_full_check():
    # Every op's type constraints at the drawn opset (a bfloat16 exponent of Pow only from
    # Pow-15), and declared shapes equal to ONNX's inference (Flatten with a negative axis,
    # scalar bfloat16 weights).
    @given(onnx_models())
    def check(model):
        onnx.checker.check_model(model, full_check=True)

    _run(check, 400, share=0.1)


def test_pow_draws_a_bfloat16_exponent_only_from_pow_15():
    from jaxort.testing.strategies import FLOAT_DTYPES

    bf16 = next((d for d in FLOAT_DTYPES if d.name == "bfloat16"), None)
    if bf16 is None:
        pytest.skip("the installed onnx cannot write bfloat16 models")
    with pytest.raises(ValueError, match="none of the ops"):  # Pow-13's T1 has no bfloat16
        find(onnx_models(ops=["Pow"], dtypes=[bf16], opset=13), lambda m: True)
    model = find(onnx_models(ops=["Pow"], dtypes=[bf16], opset=17), lambda m: True)
    onnx.checker.check_model(model, full_check=True)


def test_flatten_declares_onnx_s_shapes_for_negative_axes():
    @settings(CI, max_examples=60)
    @given(onnx_models(ops=["Flatten"], max_nodes=3))
    def check(model):
        onnx.checker.check_model(model, full_check=True)

    check()


def _one_d_max_pools(model):
    for node in model.graph.node:
        attrs = {a.name: list(a.ints) for a in node.attribute}
        if node.op_type == "MaxPool" and len(attrs["kernel_shape"]) == 1:
            yield attrs


def test_a_one_d_max_pool_with_unit_steps_is_drawn_without_pads():
    # ONNX's reference MaxPool raises IndexError on such a pool with pads (a `make fuzz`
    # finding): the harness must not blame jaxort for the reference's crash.
    def unit_steps_padded(model):
        return any(any(a.get("pads", [0])) and a.get("strides", [1]) == a.get("dilations", [1]) == [1]
                   for a in _one_d_max_pools(model))

    with pytest.raises(NoSuchExample):
        find(onnx_models(ops=["MaxPool", "Relu"], max_nodes=3), unit_steps_padded,
             settings=settings(CI, max_examples=500))
    model = find(onnx_models(ops=["MaxPool", "Relu"], max_nodes=3, dtypes=[np.float32]),
                 lambda m: any(True for _ in _one_d_max_pools(m)), settings=settings(CI, max_examples=500))
    rng = np.random.default_rng(0)
    assert_matches_reference(model, [rng.standard_normal(_input_shape(i)).astype(np.float32)
                                     for i in model.graph.input])


@pytest.mark.parametrize("op", ["InstanceNormalization", "LayerNormalization"])
def test_a_normalization_of_a_constant_input_matches_the_reference(op):
    # A constant instance has zero variance: the mean's rounding times 1/sqrt(epsilon) put ONNX's
    # reference 3.5e-5 off the exact bias in float32 (a `make fuzz` finding). The builders add a
    # ramp before a normalization over two values or more, so every instance keeps a spread.
    model = find(onnx_models(ops=[op], max_nodes=1, dtypes=[np.float32]), lambda m: len(m.graph.node) > 1)
    assert [n.op_type for n in model.graph.node] == ["Add", op]
    feeds = [np.full(_input_shape(i), 1.6552014, np.float32) for i in model.graph.input]
    assert_matches_reference(model, feeds)


def _input_shape(value_info) -> tuple:
    return tuple(d.dim_value for d in value_info.type.tensor_type.shape.dim)


def test_random_differentiable_graphs_pass_the_gradient_check():
    @given(st.data())
    def check(data):
        model = data.draw(onnx_models(ops=DIFFERENTIABLE_OPS, max_nodes=3, dtypes=[np.float64]))
        check_gradients(model, data.draw(model_inputs(model, seeded=True)))

    _run(check, 40, share=0.3)


def _clip_tie_model():
    # Two Clips with the same upper bound: where the input is above it, the second
    # Clip's input equals its bound (a `make fuzz` finding).
    from onnx import TensorProto, helper, numpy_helper

    bounds = [numpy_helper.from_array(np.float64(0.75), n) for n in ("hi1", "hi2")]
    graph = helper.make_graph(
        [helper.make_node("Clip", ["x", "", "hi1"], ["v"]), helper.make_node("Clip", ["v", "", "hi2"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 3])], bounds)
    x = np.array([[0.5, -0.9, -1.8], [-1.9, 1.25, 1.65]])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), [x]


def test_the_gradient_check_takes_a_one_sided_derivative_at_a_kink(monkeypatch):
    model, inputs = _clip_tie_model()
    grads = check_gradients(model, inputs)
    # jaxort's Clip passes a tie's gradient to its input (as PyTorch's clamp does): the first
    # bound takes all of it, and its central difference would be half.
    cot = np.random.default_rng(0).standard_normal((2, 3))
    np.testing.assert_allclose(grads["hi1"], cot[1, 1] + cot[1, 2])
    np.testing.assert_allclose(grads["hi2"], 0.0)

    real_lookup = registry.lookup

    def lookup(domain, op_type, opset):  # a Clip that splits a tie's gradient 0.3 / 0.7: neither side
        handler = real_lookup(domain, op_type, opset)
        if op_type != "Clip" or handler is None:
            return handler
        import jax.numpy as jnp

        def clip(x, lo=None, hi=None):
            at = x == hi
            return jnp.where(at, 0.3 * x + 0.7 * hi, handler.fn(x, lo, hi))
        return dataclasses.replace(handler, fn=clip)

    monkeypatch.setattr(registry, "lookup", lookup)
    with pytest.raises(AssertionError, match="d/d hi"):
        check_gradients(model, inputs)


def test_random_checkpoint_states_round_trip():
    @given(checkpoint_states())
    def check(state):
        assert_checkpoint_roundtrip(state)

    _run(check, 100, share=0.1)


def test_model_inputs_respect_the_domains_of_their_ops():
    @settings(CI, max_examples=30)
    @given(st.data())
    def check(data):
        model = data.draw(onnx_models(ops=["Log", "Sqrt", "Div", "Reciprocal"], max_nodes=3))
        inputs = data.draw(model_inputs(model))
        feeds = dict(zip([i.name for i in model.graph.input], inputs))
        for node in model.graph.node:
            x = feeds.get(node.input[-1 if node.op_type == "Div" else 0])
            if x is None:
                continue
            x = np.asarray(x, np.float64)
            if node.op_type in ("Log", "Sqrt"):
                assert np.all(x > 0)
            else:
                assert np.all(np.abs(x) >= 0.2)

    check()



@pytest.mark.parametrize("seeded", [False, True])
def test_model_inputs_take_the_narrow_float_types_of_the_inputs(seeded):
    # onnx < 1.17's tensor_dtype_to_np_dtype gives float32 for bfloat16.
    import ml_dtypes
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", [n], [n + "_out"]) for n in ("a", "b")], "g",
        [helper.make_tensor_value_info("a", TensorProto.BFLOAT16, [2, 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT16, ["n"])],
        [helper.make_tensor_value_info(n + "_out", t, None)
         for n, t in (("a", TensorProto.BFLOAT16), ("b", TensorProto.FLOAT16))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])

    @settings(CI, max_examples=5)
    @given(st.data())
    def check(data):
        a, b = data.draw(model_inputs(model, seeded=seeded, dims={"n": 4}))
        assert (a.dtype, a.shape) == (np.dtype(ml_dtypes.bfloat16), (2, 3))
        assert (b.dtype, b.shape) == (np.dtype(np.float16), (4,))

    check()

def test_training_steps_follow_a_recorded_trajectory_and_a_drift_is_reported(tmp_path):
    case = find(training_artifacts(), lambda c: True, settings=settings(CI, max_examples=1))
    recorded = record_trajectory(case, steps=2)
    assert recorded["losses"].shape == (2,) and np.all(np.isfinite(recorded["losses"]))
    path = tmp_path / "trajectory.npz"
    np.savez(path, losses=recorded["losses"],
             **{f"param:{k}": v for k, v in recorded["parameters"].items()})
    assert_trains_like(case, path, steps=2)
    drifted = {"losses": recorded["losses"] * 1.01, "parameters": recorded["parameters"]}
    with pytest.raises(AssertionError, match=r"(?s)training comparison failed.*losses.*model saved to"):
        assert_trains_like(case, drifted, steps=2)


def test_training_steps_match_onnxruntime_training():
    pytest.importorskip("onnxruntime.training.api")

    @settings(CI, max_examples=5)
    @given(training_artifacts())
    def check(case):
        assert_trains_like(case, "onnxruntime")

    check()


# --------------------------------------------------------------------------- a planted bug


def _plant_leaky_relu_bug(monkeypatch):
    """LeakyRelu's handler, copied with its alpha default flipped from 0.01 to 0.1."""
    real_lookup = registry.lookup

    def lookup(domain, op_type, opset):
        handler = real_lookup(domain, op_type, opset)
        if op_type != "LeakyRelu" or handler is None:
            return handler
        original = handler.fn

        def leaky_relu(x, *, alpha):
            return original(x, alpha=0.1 if np.isclose(alpha, 0.01) else alpha)

        return dataclasses.replace(handler, fn=leaky_relu)

    monkeypatch.setattr(registry, "lookup", lookup)


def test_a_planted_bug_is_caught_shrunk_and_saved(monkeypatch):
    _plant_leaky_relu_bug(monkeypatch)

    @settings(CI, max_examples=200)
    @given(st.data())
    def check(data):
        model = data.draw(onnx_models(ops=["activation", "Add", "Mul"], max_nodes=6))
        assert_matches_reference(model, data.draw(model_inputs(model)))

    with pytest.raises(AssertionError) as caught:
        check()
    path = re.search(r"model saved to (\S+\.onnx)", str(caught.value)).group(1)
    model, inputs = load_failure(path)
    ops = [n.op_type for n in model.graph.node]
    assert "LeakyRelu" in ops and len(ops) <= 3, ops
    assert not any(a.name == "alpha" for n in model.graph.node for a in n.attribute
                   if n.op_type == "LeakyRelu")
    with pytest.raises(AssertionError):  # the saved file reproduces the failure
        assert_matches_reference(model, inputs)
    monkeypatch.undo()
    assert_matches_reference(model, inputs)  # and passes with the real handler
