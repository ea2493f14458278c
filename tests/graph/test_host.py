"""Ops whose output shape depends on values, computed on the host before a compiled call
(jaxort/graph/_host.py, ``JaxGraph.host_values`` and ``apply(..., host=...)``)."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from jaxort.errors import InputError, StaticValueError
from jaxort.graph import JaxGraph

W = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5) / 10


def _pooling_model(extra_nodes=(), extra_inits=()) -> onnx.ModelProto:
    """y = mean over the rows of x at the positions where ids == 2, times W (as BART pools at </s>)."""
    nodes = [helper.make_node("Equal", ["ids", "two"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "idx"], ["rows"]),
             helper.make_node("MatMul", ["rows", "W"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["y"], axes=[0], keepdims=0), *extra_nodes]
    graph = helper.make_graph(
        nodes, "pool",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [helper.make_tensor("two", TensorProto.INT64, [], [2]), onnx.numpy_helper.from_array(W, "W"),
         *extra_inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _batch(seed: int, rows: int = 3):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 4, (rows, 5)), rng.standard_normal((rows, 5, 4)).astype(np.float32)


def _reference(ids, x, w=W):
    return (x[ids == 2] @ w).mean(axis=0)


def test_the_plan_names_the_host_op_its_prefix_and_what_it_reads():
    graph = JaxGraph(_pooling_model())
    assert [n.op_type for n in graph.host.nodes] == ["NonZero"]
    assert [n.op_type for n in graph.host.prefix] == ["Equal", "NonZero"]
    assert graph.host.names == ("nz",) and graph.host.feeds == ("mask",)
    assert graph.host.params == frozenset() and not graph.host.nested


def test_nonzero_of_shapes_or_constants_needs_no_host():
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("NonZero", ["shape"], ["nz"]),
             helper.make_node("NonZero", ["c"], ["nc"]), helper.make_node("Concat", ["nz", "nc"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [1, "n"])],
                              [helper.make_tensor("c", TensorProto.INT64, [3], [0, 5, 0])])
    g = JaxGraph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert g.host.nodes == ()
    (y,) = jax.jit(g.apply)(g.params, np.zeros((2, 0, 3), np.float32))
    np.testing.assert_array_equal(y, [[0, 2, 1]])


def test_a_compiled_apply_takes_the_host_values_and_compiles_once_per_count():
    graph = JaxGraph(_pooling_model())
    apply = jax.jit(graph.apply)
    counts = []
    for seed in range(6):
        ids, x = _batch(seed)
        host = graph.host_values(graph.params, ids, x)
        np.testing.assert_array_equal(host["nz"], np.array(np.nonzero(ids == 2)))
        (y,) = apply(graph.params, ids, x, host=host)
        np.testing.assert_allclose(y, _reference(ids, x), rtol=1e-6)
        counts.append(int((ids == 2).sum()))
    assert len(set(counts)) < len(counts)  # some counts repeat ...
    assert apply._cache_size() == len(set(counts))  # ... and compile once
    # jit_apply does the same by itself.
    ids, x = _batch(0)
    np.testing.assert_allclose(graph.jit_apply(graph.params, ids, x)[0], _reference(ids, x), rtol=1e-6)


def test_gradients_through_a_compiled_apply_with_host_values():
    graph = JaxGraph(_pooling_model())
    ids, x = _batch(1)
    host = graph.host_values(graph.params, ids, x)

    @jax.jit
    def grads(params, x, host):
        return jax.grad(lambda p, x: (graph.apply(p, ids, x, host=host)[0] ** 2).sum(), argnums=(0, 1))(params, x)

    g_params, g_x = grads(graph.params, x, host)
    rows = x[ids == 2]
    y = _reference(ids, x)
    np.testing.assert_allclose(g_params["W"], np.outer(rows.mean(axis=0), 2 * y), rtol=1e-5)
    want_x = np.zeros_like(x)
    want_x[ids == 2] = (W @ (2 * y)) / len(rows)
    np.testing.assert_allclose(g_x, want_x, rtol=1e-5, atol=1e-7)


def test_a_prefix_that_reads_parameters_takes_them_from_params():
    # NonZero of (x @ V > 0): the selection depends on a parameter, as a detection head's scores do.
    v = np.array([[1.0], [-1.0], [0.5], [0.0]], np.float32)
    nodes = [helper.make_node("MatMul", ["x", "V"], ["s"]), helper.make_node("Greater", ["s", "zero"], ["keep"]),
             helper.make_node("NonZero", ["keep"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["s", "idx"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["k"])],
                              [onnx.numpy_helper.from_array(v, "V"),
                               helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    g = JaxGraph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert g.host.params == frozenset({"V", "zero"})  # every float initializer is a parameter
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    other = {**g.params, "V": -v}
    for params in (g.params, other):
        host = g.host_values(params, x)
        (y,) = jax.jit(g.apply)(params, x, host=host)
        s = x @ params["V"]
        np.testing.assert_allclose(y, s[s > 0], rtol=1e-6)
    with pytest.raises(InputError, match=r"params is missing \['V', 'zero'\]"):
        g.host_values({}, x)


def test_a_host_op_reading_another_host_op_runs_its_prefix_op_by_op():
    # The count of the first selection decides the second's input: the prefix cannot compile.
    nodes = [helper.make_node("NonZero", ["ids"], ["nz"]), helper.make_node("Shape", ["nz"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["count"]),
             helper.make_node("Less", ["ids", "count"], ["small"]), helper.make_node("NonZero", ["small"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [6])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [1, "k"])],
                              [helper.make_tensor("one", TensorProto.INT64, [], [1])])
    g = JaxGraph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op_type for n in g.host.nodes] == ["NonZero", "NonZero"] and g.host.nested
    ids = np.array([0, 3, 1, 0, 5, 2])
    host = g.host_values(g.params, ids)
    count = np.count_nonzero(ids)
    np.testing.assert_array_equal(host["y"], np.array(np.nonzero(ids < count)))
    (y,) = jax.jit(g.apply)(g.params, ids, host=host)
    np.testing.assert_array_equal(y, host["y"])


def test_without_host_values_a_compiled_apply_names_the_op_and_the_way_out():
    graph = JaxGraph(_pooling_model())
    ids, x = _batch(0)
    with pytest.raises(StaticValueError, match=r"NonZero .*node.*input 'X' must be known at trace time"):
        jax.jit(graph.apply)(graph.params, ids, x)
    with pytest.raises(StaticValueError, match="call host_values outside jit"):
        jax.jit(lambda ids, x: graph.host_values(graph.params, ids, x))(ids, x)
    with pytest.raises(InputError, match=r"host must map the host ops' outputs \['nz'\]"):
        graph.apply(graph.params, ids, x, host={"mask": np.zeros((2, 1), np.int64)})


def test_eager_apply_needs_no_host_values():
    graph = JaxGraph(_pooling_model())
    ids, x = _batch(2)
    np.testing.assert_allclose(graph.apply(graph.params, ids, x)[0], _reference(ids, x), rtol=1e-6)
