"""Property tests of jaxort.testing.strategies, and of jaxort through them.

The strategies must draw what they promise (dtypes, shapes, finite values in
range, valid models), and the models they draw must run through jaxort with
the values ONNX's reference evaluator computes, jitted or not.
"""

from __future__ import annotations

import importlib
import sys

import jax
import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from jaxort.graph import JaxGraph, x64_enabled_scope
from jaxort.testing import strategies as js

# derandomize keeps the suite's runtime and outcome stable from run to run.
FAST = settings(max_examples=8, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CHEAP = settings(max_examples=60, deadline=None, derandomize=True)
BF16 = np.dtype(ml_dtypes.bfloat16)


# --------------------------------------------------------------------------- dtypes, shapes, arrays


@CHEAP
@given(st.data())
def test_dtypes_draws_only_the_requested_kinds(data):
    kinds = data.draw(st.sampled_from(["f", "i", "u", "b", "fi", "iub"]))
    dt = data.draw(js.dtypes(kinds, exclude=[np.float16]))
    assert dt.kind in kinds or (dt == BF16 and "f" in kinds)
    assert dt != np.float16


def test_dtypes_rejects_unknown_kinds_and_empty_choices():
    with pytest.raises(ValueError, match="unknown dtype kinds"):
        js.dtypes("fx")
    with pytest.raises(ValueError, match="no dtypes"):
        js.dtypes("b", exclude=[np.bool_])


@CHEAP
@given(st.data())
def test_arrays_have_the_dtype_shape_and_range(data):
    dt = data.draw(js.dtypes("fiub"))
    shape = data.draw(js.shapes(max_dims=3))
    x = data.draw(js.arrays(dt, shape))
    assert x.dtype == dt and x.shape == shape
    if dt.kind == "b":
        return
    as64 = x.astype(np.float64)
    assert np.all(np.isfinite(as64))
    if dt.kind in "iu":
        lo, hi = max(-100, np.iinfo(dt).min), min(100, np.iinfo(dt).max)
        assert np.all((as64 >= lo) & (as64 <= hi))
    else:
        assert np.all(np.abs(as64) <= 4.0)
        # No subnormals: XLA flushes them, numpy does not.
        assert np.all((as64 == 0) | (np.abs(as64) >= js._TINY[dt]))


@CHEAP
@given(js.arrays(js.dtypes("f"), js.shapes(min_dims=1), min_value=-2, max_value=3,
                 min_magnitude=0.5))
def test_arrays_respect_value_bounds_and_min_magnitude(x):
    as64 = x.astype(np.float64)
    assert np.all((as64 >= -2) & (as64 <= 3))
    assert np.all(np.abs(as64) >= 0.5 * (1 - 2 ** -7))


@CHEAP
@given(js.arrays(js.dtypes("iu"), min_magnitude=3))
def test_integer_arrays_respect_min_magnitude(x):
    assert np.all(np.abs(x.astype(np.int64)) >= 3) and np.all(np.abs(x.astype(np.int64)) <= 100)


@CHEAP
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(st.just(n), js.broadcastable_shapes(n))))
def test_broadcastable_shapes_broadcast(n_and_shapes):
    n, shps = n_and_shapes
    assert len(shps) == n
    out = np.broadcast_shapes(*shps)
    assert all(len(s) <= 3 and all(1 <= d <= 4 for d in s) for s in shps)
    assert len(out) == max(len(s) for s in shps)


# --------------------------------------------------------------------------- one-node models


def _gemm_shapes(mkn):
    m, k, n = mkn
    return ((m, k), (k, n), (n,))


SAME_FLOAT = js.dtypes("f", exclude=[BF16])
NODE_CASES = {
    "Add": js.node_models("Add", n_inputs=2, broadcast=True, input_dtypes=js.dtypes("fi")),
    "Relu": js.node_models("Relu", input_dtypes=js.dtypes("f")),
    "Softmax": js.node_models(
        "Softmax", input_shapes=js.shapes(min_dims=1),
        attributes=lambda xs: {"axis": st.integers(-xs[0].ndim, xs[0].ndim - 1)}),
    "Gemm": js.node_models(
        "Gemm", n_inputs=3,
        input_shapes=st.tuples(*[st.integers(1, 4)] * 3).map(_gemm_shapes),
        attributes={"alpha": st.sampled_from([1.0, 0.5, 2.0]), "beta": st.sampled_from([1.0, 0.25])}),
    "Where": js.node_models(
        "Where", n_inputs=3, broadcast=True, input_dtypes=[np.bool_, SAME_FLOAT, SAME_FLOAT]),
    "Cast": js.node_models(
        "Cast", input_dtypes=js.dtypes("f", exclude=[BF16]),
        attributes={"to": st.sampled_from([TensorProto.FLOAT, TensorProto.DOUBLE,
                                           TensorProto.INT32, TensorProto.INT64])}),
    "Clip": js.node_models(
        "Clip",
        inputs=st.tuples(js.arrays(np.float32), st.none(), js.arrays(np.float32, ())),
        opset=13),
    "Div": js.node_models("Div", n_inputs=2, broadcast=True, min_magnitude=0.25),
}


@pytest.mark.parametrize("op", sorted(NODE_CASES))
def test_node_models_are_valid_and_match_the_reference(op):
    @FAST
    @given(NODE_CASES[op])
    def check(case):
        onnx.checker.check_model(case.model, full_check=True)
        (node,) = case.model.graph.node
        assert node.op_type == op
        assert [i.name for i in case.model.graph.input] == case.input_names
        for out in case.model.graph.output:  # shape inference typed every output
            assert out.type.tensor_type.elem_type != 0
        js.assert_matches_reference(case)

    check()


@FAST
@given(NODE_CASES["Clip"])
def test_absent_optional_inputs_are_left_out(case):
    (node,) = case.model.graph.node
    assert list(node.input) == ["x0", "", "x2"]
    assert case.input_names == ["x0", "x2"] and set(case.feeds) == {"x0", "x2"}
    np.testing.assert_array_equal(
        js.assert_matches_reference(case)[0], np.minimum(case.inputs[0], case.inputs[1]))


@FAST
@given(NODE_CASES["Where"])
def test_one_strategy_listed_twice_draws_one_dtype(case):
    cond, x, y = case.inputs
    assert cond.dtype == np.bool_ and x.dtype == y.dtype


# --------------------------------------------------------------------------- multi-node graphs


@FAST
@given(js.mlp_models(dtype=js.dtypes("f", exclude=[np.float16, BF16])))
def test_mlp_models_match_the_reference(case):
    onnx.checker.check_model(case.model, full_check=True)
    ops = {n.op_type for n in case.model.graph.node}
    assert ops <= {"MatMul", "Add", "Gemm", "Relu", "Tanh", "Sigmoid"}
    assert case.output_names == ["y"] and case.input_names == ["x"]
    (y,) = js.assert_matches_reference(case)
    assert y.shape[0] == case.inputs[0].shape[0] and y.dtype == case.inputs[0].dtype


@FAST
@given(js.mlp_models(n_layers=(1, 1), linear_ops=["MatMul"], activations=["Relu"],
                     final_activation=True))
def test_one_layer_mlp_is_relu_of_affine(case):
    w = {t.name: onnx.numpy_helper.to_array(t) for t in case.model.graph.initializer}
    (x,) = case.inputs
    (y,) = js.assert_matches_reference(case)
    expected = np.maximum(x @ w["fc0.weight"] + w["fc0.bias"], 0)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


@FAST
@given(js.elementwise_graphs(dtype=js.dtypes("f"), dynamic_shapes=True))
def test_elementwise_graphs_match_the_reference(case):
    onnx.checker.check_model(case.model, full_check=True)
    graph = case.model.graph
    assert 1 <= len(graph.node) <= 6 and 1 <= len(graph.output) <= 2
    js.assert_matches_reference(case)


def _assert_jit_equals_apply(case):
    g = JaxGraph(case.model)
    with x64_enabled_scope():
        eager = g.apply(g.params, *case.inputs)
        jitted = jax.jit(g.apply)(g.params, *case.inputs)
    assert len(eager) == len(jitted) == len(case.output_names)
    for e, j in zip(eager, jitted):
        e, j = np.asarray(e), np.asarray(j)
        assert e.dtype == j.dtype and e.shape == j.shape
        # Fusion may keep low-precision intermediates wider under jit.
        rtol, atol = js.default_tolerance(e.dtype)
        np.testing.assert_allclose(j.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


@FAST
@given(st.one_of(js.elementwise_graphs(dtype=js.dtypes("f")),
                 js.mlp_models(dtype=js.dtypes("f", exclude=[BF16]))))
def test_jit_apply_equals_apply(case):
    _assert_jit_equals_apply(case)


# --------------------------------------------------------------------------- the reference check


def test_assert_matches_reference_reports_value_and_dtype_mismatches():
    from jaxort.testing import run_reference

    case = find(js.elementwise_graphs(n_nodes=(2, 2)), lambda c: True)
    shifted = lambda m, f: [o + 1 for o in run_reference(m, f)]  # noqa: E731
    with pytest.raises(AssertionError, match=r"output 'v1': \d+ of \d+ values differ.*"
                                             r"max abs error 1\b.*worst at index"):
        js.assert_matches_reference(case, _run_reference=shifted)
    widened = lambda m, f: [o.astype(np.float64) for o in run_reference(m, f)]  # noqa: E731
    with pytest.raises(AssertionError, match="dtype float32 != expected float64"):
        js.assert_matches_reference(case, _run_reference=widened)


def test_assert_matches_reference_takes_a_feed_dict_and_returns_outputs():
    case = find(js.node_models("Neg", input_shapes=(2, 3), min_value=1, max_value=2),
                lambda c: True)
    (y,) = js.assert_matches_reference(case.model, case.feeds, jit=False)
    np.testing.assert_array_equal(y, -case.inputs[0])
    assert np.all(y <= -1)
    assert "Neg" in repr(case) and "x0: float32[2, 3]" in repr(case)


def test_default_tolerances():
    assert js.default_tolerance(np.float32) == (1e-5, 1e-6)
    assert js.default_tolerance(np.int64) == (0.0, 0.0)
    assert js.default_tolerance(BF16)[0] > js.default_tolerance(np.float16)[0]


def test_missing_hypothesis_gives_an_actionable_import_error(monkeypatch):
    for name in ("hypothesis", "hypothesis.extra", "hypothesis.extra.numpy", "hypothesis.strategies"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "jaxort.testing.strategies")
    with pytest.raises(ImportError, match=r"needs hypothesis.*pip install"):
        importlib.import_module("jaxort.testing.strategies")


def test_the_reference_computes_float64_erf_in_float64():
    # onnx's reference Erf runs math.erf through np.vectorize(otypes=["f"]), so in float32;
    # jaxort.testing's reference keeps float64 inputs in float64 (a long fuzz run flagged a
    # float64 Erf chain 1.5e-7 apart, all of it onnx's float32 rounding).
    import math

    from jaxort.testing import node_model, run_jaxort, run_reference

    x = np.linspace(-3, 3, 61)
    model = node_model("Erf", [x])
    feeds = {model.graph.input[0].name: x}
    exact = np.array([math.erf(v) for v in x])
    (ref,) = run_reference(model, feeds)
    assert ref.dtype == np.float64
    np.testing.assert_allclose(ref, exact, rtol=0, atol=1e-15)
    (got,) = run_jaxort(model, feeds, enable_x64=True)
    np.testing.assert_allclose(np.asarray(got), exact, rtol=0, atol=1e-15)
    x32 = x.astype(np.float32)  # other dtypes: onnx's own Erf, unchanged
    (ref32,) = run_reference(node_model("Erf", [x32]), {model.graph.input[0].name: x32})
    np.testing.assert_allclose(ref32, exact.astype(np.float32), rtol=0, atol=1e-6)
