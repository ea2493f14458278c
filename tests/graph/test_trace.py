"""JaxGraph: jit/grad/vmap composition, static shape folding, trace caching, errors.

References are numpy and central finite differences, never jaxort itself.
"""

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from jaxort.errors import InputError, ModelError, OpError, UnsupportedOpError
from jaxort.graph import JaxGraph


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _mlp(rng, batch="N", d_in=6, d_hidden=5, d_out=3):
    w1 = rng.standard_normal((d_in, d_hidden)).astype(np.float32)
    b1 = rng.standard_normal(d_hidden).astype(np.float32)
    w2 = rng.standard_normal((d_hidden, d_out)).astype(np.float32)
    b2 = rng.standard_normal(d_out).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["y0"]),
        helper.make_node("Add", ["y0", "b2"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", T.FLOAT, [batch, d_in])],
        [helper.make_tensor_value_info("y", T.FLOAT, [batch, d_out])],
        [numpy_helper.from_array(a, n) for a, n in
         ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )
    return model, dict(w1=w1, b1=b1, w2=w2, b2=b2)


def _mlp_numpy(p, x):
    h = np.maximum(x @ p["w1"] + p["b1"], 0)
    return h @ p["w2"] + p["b2"]


def _cnn(rng):
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    fw = rng.standard_normal((12, 2)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Tanh", ["c"], ["a"]),
        helper.make_node("AveragePool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "fw"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", T.FLOAT, ["N", 1, 4, 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 2])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(fw, "fw")],
    )
    return model


def _flatten_model():
    """A PyTorch-style flatten: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", T.INT64, [], [0])),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    w = np.arange(24, dtype=np.float32).reshape(12, 2) / 24
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 2])],
        [helper.make_tensor("ax", T.INT64, [1], [0]),
         helper.make_tensor("minus1", T.INT64, [1], [-1]),
         numpy_helper.from_array(w, "w")],
    ), w


def _central_difference_grad(f, params, eps=1e-3):
    """d f / d params by central differences in float64."""
    grads = {}
    for name, value in params.items():
        g = np.zeros(value.shape, np.float64)
        for idx in np.ndindex(value.shape):
            plus = {k: v.copy() for k, v in params.items()}
            minus = {k: v.copy() for k, v in params.items()}
            plus[name][idx] += eps
            minus[name][idx] -= eps
            g[idx] = (f(plus) - f(minus)) / (2 * eps)
        grads[name] = g
    return grads


def test_apply_matches_numpy_and_jit_matches_eager():
    rng = np.random.default_rng(0)
    model, p = _mlp(rng)
    g = JaxGraph(model)
    assert sorted(g.params) == ["b1", "b2", "w1", "w2"]
    x = rng.standard_normal((7, 6)).astype(np.float32)
    (eager,) = g.apply(g.params, x)
    (jitted,) = jax.jit(g.apply)(g.params, x)
    np.testing.assert_allclose(np.asarray(eager), _mlp_numpy(p, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-6, atol=1e-6)
    assert jitted.dtype == jnp.float32


def test_grad_through_mlp_matches_finite_differences():
    rng = np.random.default_rng(1)
    model, _ = _mlp(rng)
    x = rng.standard_normal((4, 6))
    with jax.enable_x64(True):
        g = JaxGraph(model)
        params64 = {k: v.astype(np.float64) for k, v in g.params.items()}
        graph64 = _retype(model)

        def loss(p):
            (y,) = graph64.apply(p, x)
            return jnp.sum(jnp.tanh(y))

        got = jax.jit(jax.grad(loss))(params64)
        want = _central_difference_grad(lambda p: float(loss(p)), params64, eps=1e-6)
    for name in params64:
        np.testing.assert_allclose(np.asarray(got[name]), want[name], rtol=1e-5, atol=1e-7)


def test_grad_through_cnn_matches_finite_differences():
    rng = np.random.default_rng(2)
    model = _cnn(rng)
    x = rng.standard_normal((2, 1, 4, 4))
    with jax.enable_x64(True):
        g = _retype(model)
        params = dict(g.params)

        def loss(p):
            (y,) = g.apply(p, x)
            return jnp.sum(y * y)

        got = jax.jit(jax.grad(loss))(params)
        want = _central_difference_grad(lambda p: float(loss(p)), params, eps=1e-6)
    for name in params:
        np.testing.assert_allclose(np.asarray(got[name]), want[name], rtol=1e-5, atol=1e-6)


def _retype(model):
    """The same model with float32 initializers and value infos turned into float64."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.data_type == T.FLOAT:
            arr = numpy_helper.to_array(t).astype(np.float64)
            t.CopyFrom(numpy_helper.from_array(arr, t.name))
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.type.tensor_type.elem_type == T.FLOAT:
            vi.type.tensor_type.elem_type = T.DOUBLE
    return JaxGraph(m)


def test_vmap_equals_python_loop():
    rng = np.random.default_rng(3)
    model, p = _mlp(rng)
    g = JaxGraph(model)
    xs = rng.standard_normal((5, 3, 6)).astype(np.float32)
    batched = jax.vmap(lambda x: g.apply(g.params, x)[0])(xs)
    looped = np.stack([np.asarray(g.apply(g.params, x)[0]) for x in xs])
    np.testing.assert_allclose(np.asarray(batched), looped, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(looped, np.stack([_mlp_numpy(p, x) for x in xs]), rtol=1e-5, atol=1e-5)


def test_vmap_over_params():
    rng = np.random.default_rng(4)
    model, p = _mlp(rng)
    g = JaxGraph(model)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    stacked = {k: np.stack([v, 2 * v]) for k, v in g.params.items()}
    out = jax.vmap(lambda q: g.apply(q, x)[0])(stacked)
    for i, scale in enumerate((1, 2)):
        ref = _mlp_numpy({k: scale * v for k, v in p.items()}, x)
        np.testing.assert_allclose(np.asarray(out[i]), ref, rtol=1e-5, atol=1e-5)


def test_dynamic_batch_flatten_jits_and_compiles_once_per_shape():
    model, w = _flatten_model()
    g = JaxGraph(model)
    traces = []

    def f(params, x):
        traces.append(x.shape)
        return g.apply(params, x)

    jf = jax.jit(f)
    for batch in (2, 5, 2, 5, 2):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 4)).astype(np.float32)
        (y,) = jf(g.params, x)
        np.testing.assert_allclose(np.asarray(y), x.reshape(batch, 12) @ w, rtol=1e-5, atol=1e-5)
    assert traces == [(2, 3, 4), (5, 3, 4)]


def test_jit_apply_caches_by_shape_and_dtype():
    model, _ = _flatten_model()
    g = JaxGraph(model)
    x2 = np.ones((2, 3, 4), np.float32)
    x3 = np.ones((3, 3, 4), np.float32)
    g.jit_apply(g.params, x2)
    g.jit_apply(g.params, x3)
    g.jit_apply(g.params, x2 * 2)
    assert g._jit._cache_size() == 2


def test_extra_outputs_and_intermediate_slices():
    rng = np.random.default_rng(5)
    model, p = _mlp(rng)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    g = JaxGraph(model, extra_outputs=["h"])
    y, h = g.apply(g.params, x)
    np.testing.assert_allclose(np.asarray(h), np.maximum(x @ p["w1"] + p["b1"], 0), rtol=1e-5, atol=1e-6)
    sliced = JaxGraph(model, outputs=["h1"])
    assert sliced.node_count == 2
    (h1,) = sliced.apply({"w1": p["w1"], "b1": p["b1"]}, x)
    np.testing.assert_allclose(np.asarray(h1), x @ p["w1"] + p["b1"], rtol=1e-5, atol=1e-6)


def test_constants_choice():
    rng = np.random.default_rng(6)
    model, p = _mlp(rng)
    g = JaxGraph(model, params=["w2"])
    assert list(g.params) == ["w2"]
    assert sorted(g.constants) == ["b1", "b2", "w1"]
    x = rng.standard_normal((2, 6)).astype(np.float32)
    (y,) = g.apply({"w2": 2 * p["w2"]}, x)
    np.testing.assert_allclose(np.asarray(y), _mlp_numpy(dict(p, w2=2 * p["w2"]), x), rtol=1e-5, atol=1e-5)


def test_model_from_bytes_and_path(tmp_path):
    rng = np.random.default_rng(7)
    model, p = _mlp(rng)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    for source in (str(path), model.SerializeToString()):
        g = JaxGraph(source)
        np.testing.assert_allclose(np.asarray(g.apply(g.params, x)[0]), _mlp_numpy(p, x), rtol=1e-5, atol=1e-5)


def test_model_with_external_data(tmp_path):
    rng = np.random.default_rng(8)
    model, p = _mlp(rng, d_in=64, d_hidden=64)
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    assert (tmp_path / "ext.data").exists()
    g = JaxGraph(str(path))
    x = rng.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(g.apply(g.params, x)[0]), _mlp_numpy(p, x), rtol=1e-4, atol=1e-4)


# Errors -------------------------------------------------------------------------------


def test_narrow_float_initializers_keep_their_dtype_whatever_the_installed_onnx():
    # onnx < 1.17 reads bfloat16 and float8 tensors back as float32 and sized
    # their raw data as 4 bytes an element: jaxort's own map decides both.
    import ml_dtypes

    for dtype, code in ((ml_dtypes.bfloat16, T.BFLOAT16), (ml_dtypes.float8_e4m3fn, T.FLOAT8E4M3FN)):
        values = np.array([0.5, -1.5, 3.0, 0.0], np.float32).astype(dtype)
        w = helper.make_tensor("w", code, [4], values.tobytes(), raw=True)
        c = helper.make_tensor("c", code, [4], values.tobytes(), raw=True)
        graph = helper.make_graph([helper.make_node("Constant", [], ["k"], value=c),
                                   helper.make_node("Identity", ["w"], ["y"]),
                                   helper.make_node("Identity", ["k"], ["z"])], "g", [],
                                  [helper.make_tensor_value_info(n, code, [4]) for n in "yz"], [w])
        g = JaxGraph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), check=False)
        assert g.params["w"].dtype == dtype
        for out in g.apply(g.params):
            assert out.dtype == dtype
            np.testing.assert_array_equal(np.asarray(out, np.float32), values.astype(np.float32))


def test_unsupported_op_names_op_domain_opset_and_node():
    node = helper.make_node("FooBar", ["x"], ["y"], domain="com.example", name="blocks/0/foo")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 3)])
    with pytest.raises(UnsupportedOpError) as info:
        JaxGraph(model)
    assert str(info.value) == (
        "jaxort does not implement com.example::FooBar (opset 3), used by node 'blocks/0/foo'")
    assert (info.value.op_type, info.value.domain, info.value.opset) == ("FooBar", "com.example", 3)


def test_wrong_input_shape_and_dtype_are_named():
    rng = np.random.default_rng(9)
    g = JaxGraph(_mlp(rng)[0])
    with pytest.raises(InputError, match=r"input 'x' has the wrong shape: expected shape "
                       r"\['N', 6\] dtype float32, given shape \[2, 5\] dtype float32"):
        g.apply(g.params, np.zeros((2, 5), np.float32))
    with pytest.raises(InputError, match=r"input 'x' has the wrong dtype: expected shape "
                       r"\['N', 6\] dtype float32, given shape \[2, 6\] dtype int32"):
        g.apply(g.params, np.zeros((2, 6), np.int32))


def test_missing_and_extra_inputs_and_params():
    rng = np.random.default_rng(10)
    g = JaxGraph(_mlp(rng)[0])
    with pytest.raises(InputError, match=r"missing inputs \['x'\]"):
        g.apply(g.params)
    with pytest.raises(InputError, match="too many inputs"):
        g.apply(g.params, np.zeros((1, 6), np.float32), np.zeros((1, 6), np.float32))
    params = dict(g.params)
    del params["w2"]
    with pytest.raises(InputError, match=r"params is missing \['w2'\]"):
        g.apply(params, np.zeros((1, 6), np.float32))


def test_unknown_output_name():
    rng = np.random.default_rng(11)
    with pytest.raises(InputError, match=r"unknown output names \['nope'\]"):
        JaxGraph(_mlp(rng)[0], outputs=["y", "nope"])


def test_invalid_model_surfaces_checker_message():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 0
    with pytest.raises(ModelError, match="invalid ONNX model"):
        JaxGraph(model)
    with pytest.raises(ModelError, match="not found"):
        JaxGraph("/nonexistent/model.onnx")


def test_traced_shape_input_error_names_node():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="the_reshape")]
    model = _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [6]),
                           helper.make_tensor_value_info("shape", T.INT64, [2])],
                   [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    g = JaxGraph(model)
    with pytest.raises(OpError, match=r"ai.onnx::Reshape \(opset 17\), node 'the_reshape': "
                                      r"input 'shape' must be known at trace time"):
        jax.jit(g.apply)(g.params, np.zeros(6, np.float32), np.array([2, 3]))


def test_error_inside_a_subgraph_names_the_inner_node_once():
    inner = helper.make_node("Range", ["a", "b", "zero"], ["r"], name="inner_range")
    branch = helper.make_graph([inner], "then", [],
                               [helper.make_tensor_value_info("r", T.INT64, None)])
    node = helper.make_node("If", ["c"], ["y"], name="outer_if", then_branch=branch,
                            else_branch=branch)
    model = _model([node], [], [helper.make_tensor_value_info("y", T.INT64, None)],
                   [numpy_helper.from_array(np.array(True), "c"),
                    numpy_helper.from_array(np.array(0, np.int64), "a"),
                    numpy_helper.from_array(np.array(3, np.int64), "b"),
                    numpy_helper.from_array(np.array(0, np.int64), "zero")])
    g = JaxGraph(model, check=False)
    with pytest.raises(OpError) as err:
        g.apply(g.params)
    assert str(err.value) == "ai.onnx::Range (opset 17), node 'inner_range': delta is 0"


# --------------------------------------------------------------------------- float64


def _double_add():
    a = np.array([1.0, 2.0 ** -40, -3.5])
    inputs = [helper.make_tensor_value_info(n, T.DOUBLE, [3]) for n in "ab"]
    model = _model([helper.make_node("Add", ["a", "b"], ["y"])], inputs,
                   [helper.make_tensor_value_info("y", T.DOUBLE, [3])])
    return model, a


def test_double_model_computes_in_float64_with_x64():
    model, a = _double_add()
    b = np.array([1.0, 1.0, 2.0 ** -30])
    g = JaxGraph(model)
    with jax.enable_x64(True):
        (y,) = jax.jit(g.apply)({}, a, b)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(y), a + b)  # 1 + 2**-40 is not 1 in float64


def test_double_input_without_x64_is_an_error_not_a_downcast():
    model, a = _double_add()
    g = JaxGraph(model)
    with jax.enable_x64(False), pytest.raises(InputError) as err:
        jax.jit(g.apply)({}, a, a)
    assert str(err.value) == (
        "input 'a' is float64, but JAX's 64-bit mode is off, so it would be computed in "
        "float32; enable 64-bit types around the call with `with jax.enable_x64(True):`, or "
        "for the whole program with `jax.config.update(\"jax_enable_x64\", True)`")


def test_double_param_without_x64_names_the_initializer():
    model = _model([helper.make_node("Neg", ["w"], ["y"])], [],
                   [helper.make_tensor_value_info("y", T.DOUBLE, [2])],
                   [numpy_helper.from_array(np.array([0.5, 0.25]), "w")])
    g = JaxGraph(model)
    assert list(g.params) == ["w"]
    with jax.enable_x64(False), pytest.raises(InputError,
                                              match=r"param \(initializer\) 'w' is float64"):
        g.apply(g.params)


def test_double_constant_meeting_a_traced_value_without_x64_names_the_node():
    # Where picks between two float64 constants with a traced condition.
    nodes = [helper.make_node("Where", ["x", "c", "d"], ["y"], name="pick")]
    model = _model(nodes, [helper.make_tensor_value_info("x", T.BOOL, [2])],
                   [helper.make_tensor_value_info("y", T.DOUBLE, [2])],
                   [numpy_helper.from_array(np.array([1.0, 2.0]), "c"),
                    numpy_helper.from_array(np.array([3.0, 4.0]), "d")])
    g = JaxGraph(model, params=[])
    with jax.enable_x64(False), pytest.raises(
            ModelError, match=r"ai.onnx::Where \(opset 17\), node 'pick': value 'c' is float64"):
        jax.jit(g.apply)({}, np.array([True, False]))


def test_cast_of_a_traced_value_to_double_without_x64_names_the_node():
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=T.DOUBLE, name="to_double")]
    model = _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                   [helper.make_tensor_value_info("y", T.DOUBLE, [2])])
    g = JaxGraph(model, params=[])
    x = np.array([1.0, 1.0 + 2.0 ** -20], np.float32)
    with jax.enable_x64(False), pytest.raises(
            ModelError, match=r"node 'to_double': attribute to asks for float64, but JAX's 64-bit mode "
                              r"is off, so it would be computed in float32"):
        jax.jit(g.apply)({}, x)
    with jax.enable_x64(True):
        (y,) = jax.jit(g.apply)({}, x)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(y), x.astype(np.float64))


def test_double_output_folded_at_trace_time_without_x64_is_an_error():
    # The whole graph folds into a float64 numpy value; returning it would
    # convert it to float32.
    nodes = [helper.make_node("Mul", ["c", "c"], ["y"])]
    model = _model(nodes, [], [helper.make_tensor_value_info("y", T.DOUBLE, [2])],
                   [numpy_helper.from_array(np.array([1.0 + 2.0 ** -40, 3.0]), "c")])
    g = JaxGraph(model, params=[])
    with jax.enable_x64(False), pytest.raises(ModelError, match=r"output 'y' is float64"):
        g.apply({})
    with jax.enable_x64(True):
        (y,) = g.apply({})
    assert y.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(y), np.array([1.0 + 2.0 ** -40, 3.0]) ** 2)


def test_folded_double_constants_and_int64_inputs_run_without_x64():
    # float64 shape-free arithmetic on constants is folded at trace time and cast to
    # float32 before it meets traced values; int64 indices run as int32 under default JAX.
    nodes = [helper.make_node("Mul", ["c", "c"], ["c2"]),
             helper.make_node("Cast", ["c2"], ["c32"], to=T.FLOAT),
             helper.make_node("Gather", ["x", "i"], ["xg"]),
             helper.make_node("Add", ["xg", "c32"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [4]),
                           helper.make_tensor_value_info("i", T.INT64, [2])],
                   [helper.make_tensor_value_info("y", T.FLOAT, [2])],
                   [numpy_helper.from_array(np.array([1.5, -2.0]), "c")])
    g = JaxGraph(model, params=[])
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    i = np.array([3, 0], np.int64)
    with jax.enable_x64(False):
        (y,) = jax.jit(g.apply)({}, x, i)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(y), x[i] + np.float32([2.25, 4.0]))


def test_int64_constants_fold_eagerly_after_a_compiled_call_captured_them():
    # Eager apply folds Equal(ids, two) in 64-bit mode; jit_apply then captures `two` in a
    # 32-bit trace; a gradient outside jit folds the same Equal again, where JAX 0.10 handed
    # `two` to the 64-bit program as a 32-bit buffer (RuntimeProgramInputMismatch).
    nodes = [helper.make_node("Equal", ["ids", "two"], ["m"]), helper.make_node("Cast", ["m"], ["mf"], to=T.FLOAT),
             helper.make_node("Mul", ["mf", "x"], ["p"]), helper.make_node("MatMul", ["p", "W"], ["h"]),
             helper.make_node("ReduceSum", ["h"], ["y"], keepdims=0)]
    w = np.arange(15, dtype=np.float32).reshape(5, 3)
    model = _model(nodes, [helper.make_tensor_value_info("ids", T.INT64, ["b"]),
                           helper.make_tensor_value_info("x", T.FLOAT, ["b"])],
                   [helper.make_tensor_value_info("y", T.FLOAT, [])],
                   [helper.make_tensor("two", T.INT64, [], [2]), numpy_helper.from_array(w, "W")])
    g = JaxGraph(model)
    ids, x = np.array([2, 1, 2, 0, 2]), np.ones(5, np.float32)
    want = float(((ids == 2) @ w).sum())
    assert float(g.apply(g.params, ids, x)[0]) == want
    assert float(g.jit_apply(g.params, ids, x)[0]) == want
    grad = jax.grad(lambda p: g.apply(p, ids, x)[0])(g.params)["W"]
    np.testing.assert_array_equal(grad, np.repeat((ids == 2).astype(np.float32)[:, None], 3, axis=1))


# --------------------------------------------------------------------------- random keys


def test_random_nodes_in_function_bodies_never_share_a_key():
    # Node 0 calls a model-local function whose body holds a RandomUniform; 999
    # Identity nodes follow, then a top-level RandomUniform at index 1000. Keys
    # numbered (index + 1) * 1000 gave both the same key, hence the same draws.
    body = [helper.make_node("RandomUniform", [], ["r"], shape=[16])]
    fn = helper.make_function("local", "Draw", [], ["r"], body,
                              [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("Draw", [], ["r_fn"], domain="local")]
    prev = "x"
    for k in range(999):
        nodes.append(helper.make_node("Identity", [prev], [f"i{k}"]))
        prev = f"i{k}"
    nodes.append(helper.make_node("RandomUniform", [], ["r_top"], shape=[16]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1])],
        [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in
         (("r_fn", [16]), (prev, [1]), ("r_top", [16]))])
    model = helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    g = JaxGraph(model, check=False)
    assert g.node_count == 1001
    r_fn, x, r_top = g.apply({}, np.ones(1, np.float32), rng=jax.random.key(0))
    r_fn, r_top = np.asarray(r_fn), np.asarray(r_top)
    np.testing.assert_array_equal(np.asarray(x), [1.0])
    assert ((0 <= r_fn) & (r_fn < 1)).all() and ((0 <= r_top) & (r_top < 1)).all()
    assert not np.isin(r_fn, r_top).any()
    # The same key gives the same draws: keys are a function of the node, not of the call.
    again = g.apply({}, np.ones(1, np.float32), rng=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(again[0]), r_fn)


@pytest.mark.parametrize("name, opset", [("bfloat16", 19), ("float8_e5m2", 19), ("int4", 21), ("uint4", 21),
                                         ("float4_e2m1fn", 23)])
def test_narrow_tensors_are_written_and_read_alike_whatever_the_installed_onnx(name, opset):
    # onnx < 1.17 cannot write ml_dtypes' narrow types, reads them back as
    # float32 or 8-bit integers, and knows no 4-bit float.
    import ml_dtypes

    from jaxort.dtypes import to_onnx_type
    from jaxort.graph._model import tensor_from_numpy, tensor_to_numpy

    dtype = np.dtype(getattr(ml_dtypes, name))
    raw = {"int4": [-8, -1, 7], "uint4": [8, 15, 7]}.get(name, [0.5, -1.5, 6.0])
    values = np.array(raw, np.float32).astype(dtype).reshape(3, 1)  # odd: half a byte of padding in 4 bits
    t = tensor_from_numpy(values, "w")
    assert (t.data_type, list(t.dims)) == (to_onnx_type(dtype), [3, 1])
    if name in ("int4", "uint4"):
        # Two to a byte, the first in the low half (onnx.proto): nibbles 8, 15 | 7, padding.
        assert t.raw_data == bytes([0xF8, 0x07])
    elif name == "float4_e2m1fn":
        assert len(t.raw_data) == 2
    try:
        reference = numpy_helper.from_array(values, "w")
    except (RuntimeError, KeyError, TypeError, ValueError):  # an onnx that cannot write the type
        reference = None
    if reference is not None:
        assert t.SerializeToString() == reference.SerializeToString()
    back = tensor_to_numpy(t)
    assert back.dtype == dtype
    np.testing.assert_array_equal(back.astype(np.float32), values.astype(np.float32))
    # A scalar stays a scalar (dims [], not [1]), and a transposed view is written in C order.
    scalar = tensor_from_numpy(values[0, 0], "s")
    assert list(scalar.dims) == [] and tensor_to_numpy(scalar).shape == ()
    assert tensor_to_numpy(scalar).astype(np.float32) == values[0, 0].astype(np.float32)
    np.testing.assert_array_equal(tensor_to_numpy(tensor_from_numpy(values.T, "t")).astype(np.float32),
                                  values.T.astype(np.float32))

    if opset > onnx.defs.onnx_opset_version():
        return  # jaxort refuses models of opsets newer than the installed onnx (float4 needs 23)
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", t.data_type, [3, 1])], [t])
    g = JaxGraph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), check=False)
    if "int" not in name:  # float initializers are parameters, integer ones constants
        assert g.params["w"].dtype == dtype
    (out,) = g.apply(g.params)
    assert out.dtype == dtype
    np.testing.assert_array_equal(np.asarray(out).astype(np.float32), values.astype(np.float32))
