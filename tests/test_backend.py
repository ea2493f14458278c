"""jaxort.backend: the ONNX backend interface, and how a prepared model runs.

Values are checked against numpy; the mode a model runs in is checked because
it decides how often a model compiles.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from jaxort import backend, errors


def _model(node, inputs, outputs, opset=17):
    graph = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def test_traced_inputs_compile_once_per_shape():
    model = _model(helper.make_node("Gather", ["x", "i"], ["y"], axis=0),
                   [_info("x", TensorProto.FLOAT, [4, 3]), _info("i", TensorProto.INT64, [2])],
                   [_info("y", TensorProto.FLOAT, [2, 3])])
    rep = backend.prepare(model)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for idx in ([3, 0], [1, 1], [2, 3]):
        i = np.array(idx, np.int64)
        (y,) = rep.run([x, i])
        np.testing.assert_array_equal(y, x[i])
    # Gather's indices are data: they stay traced, so new values reuse the compilation.
    assert rep.mode == "jit"
    assert rep._jitted._cache_size() == 1


def test_static_integer_inputs_are_baked():
    model = _model(helper.make_node("Reshape", ["x", "shape"], ["y"]),
                   [_info("x", TensorProto.FLOAT, [2, 6]), _info("shape", TensorProto.INT64, [2])],
                   [_info("y", TensorProto.FLOAT, ["a", "b"])])
    rep = backend.prepare(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape in ([3, 4], [6, -1], [3, 4]):
        (y,) = rep.run([x, np.array(shape, np.int64)])
        np.testing.assert_array_equal(y, x.reshape(shape))
    # A Reshape target must be a constant: one compilation per distinct target.
    assert rep.mode == "baked"
    assert len(rep._baked) == 2


def test_nonzero_runs_on_the_host_and_compiles_once_per_count():
    # NonZero's output shape depends on x's values: it runs first (JaxGraph.host_values), and the
    # graph compiles once per its output shape, not per call.
    model = _model(helper.make_node("NonZero", ["x"], ["y"]),
                   [_info("x", TensorProto.FLOAT, [2, 3])], [_info("y", TensorProto.INT64, [2, "n"])])
    rep = backend.prepare(model)
    calls = []
    host_values = rep.graph.host_values
    rep.graph.host_values = lambda *a, **k: calls.append(1) or host_values(*a, **k)
    xs = [np.array([[0, 1, 0], [2, 0, 3]], np.float32), np.eye(2, 3, dtype=np.float32),
          np.array([[4, 0, 5], [0, 6, 0]], np.float32), np.zeros((2, 3), np.float32)]
    for x in xs:
        (y,) = rep.run([x])
        np.testing.assert_array_equal(y, np.array(np.nonzero(x), np.int64))
    assert rep.mode == "hosted"
    assert rep._jitted._cache_size() == 3  # counts 3, 2, 3 again, 0
    assert len(calls) == len(xs)  # the first run's choice of mode computed them once, for the run too


def test_unique_of_floats_runs_uncompiled():
    model = _model(helper.make_node("Unique", ["x"], ["y"]),
                   [_info("x", TensorProto.FLOAT, [4])], [_info("y", TensorProto.FLOAT, ["n"])])
    rep = backend.prepare(model)
    for x in (np.array([1, 2, 1, 3], np.float32), np.array([5, 5, 5, 5], np.float32)):
        (y,) = rep.run([x])
        np.testing.assert_array_equal(y, np.unique(x))
    assert rep.mode == "eager"


def test_run_node_and_float64():
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a = np.linspace(0, 1, 6).reshape(2, 3)
    b = np.full((2, 3), 1e-12)
    (c,) = backend.run_node(node, [a, b])
    assert c.dtype == np.float64
    np.testing.assert_array_equal(c, a + b)


def test_supports_device():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("npu")
    model = _model(helper.make_node("Neg", ["a"], ["b"]), [_info("a", TensorProto.FLOAT, [1])],
                   [_info("b", TensorProto.FLOAT, [1])])
    with pytest.raises(errors.InputError, match="unknown device 'npu'"):
        backend.prepare(model, "npu")


def _dropout_model(ratio):
    from onnx import TensorProto, helper

    node = helper.make_node("Dropout", ["x", "ratio", "training_mode"], ["y", "mask"])
    graph = helper.make_graph(
        [node], "dropout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [400])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [400]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, [400])],
        initializer=[helper.make_tensor("ratio", TensorProto.FLOAT, [], [ratio]),
                     helper.make_tensor("training_mode", TensorProto.BOOL, [], [True])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_backend_dropout_in_training_mode_draws_anew_on_every_run_like_onnxruntime():
    import jax

    rep = backend.prepare(_dropout_model(0.25))
    x = np.arange(1, 401, dtype=np.float32)
    (y1, m1), (y2, m2) = rep.run([x]), rep.run([x])
    for y, m in ((y1, m1), (y2, m2)):
        np.testing.assert_allclose(y, np.where(m, x / 0.75, 0), rtol=1e-6)
        assert 0.6 < m.mean() < 0.9  # 0.75 kept, six standard deviations ~0.13
    assert (m1 != m2).any()
    ya, _ = rep.run([x], rng=jax.random.key(3))
    yb, _ = rep.run([x], rng=jax.random.key(3))
    np.testing.assert_array_equal(ya, yb)


def test_backend_seeded_bernoulli_repeats_its_draw():
    from onnx import TensorProto, helper

    node = helper.make_node("Bernoulli", ["p"], ["y"], seed=5.0)
    graph = helper.make_graph([node], "b", [helper.make_tensor_value_info("p", TensorProto.FLOAT, [300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [300])])
    rep = backend.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]))
    p = np.full(300, 0.5, np.float32)
    (a,), (b,) = rep.run([p]), rep.run([p])
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a)) <= {0.0, 1.0} and 100 < a.sum() < 200
