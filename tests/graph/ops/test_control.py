"""If, Loop and Scan (ops/control.py) against ONNX's reference evaluator (or a numpy
loop for the Scan forms it lacks).

Each lowering of Loop is exercised (Python unrolling, lax.scan, gated lax.scan,
lax.while_loop), and gradients through If, Loop and Scan bodies are checked against
finite differences in float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from onnx import TensorProto, helper, numpy_helper

from jaxort.errors import OpError, StaticValueError
from jaxort.graph import JaxGraph, x64_enabled_scope

from ._harness import (
    F32, GraphCase, GraphExample, SETTINGS, build, check_graph_example, const, graph_table_tests,
    node, normal, tensor
)

COVERED_OPS = {"If", "Loop", "Scan"}
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
BOOL_T = TensorProto.BOOL


def if_model(cond, x, a, *, static_cond=False, same_shapes=True):
    then_g = helper.make_graph([helper.make_node("Add", ["x", "a"], ["t"])], "then", [],
                               [tensor("t", FLOAT)])
    else_nodes = [helper.make_node("Mul", ["x", "a"], ["e"])]
    if not same_shapes:
        else_nodes.append(helper.make_node("Concat", ["e", "e"], ["e2"], axis=0))
    else_g = helper.make_graph(else_nodes, "else", [],
                               [tensor("e" if same_shapes else "e2", FLOAT)])
    node = helper.make_node("If", ["cond"], ["y"], name="the_if", then_branch=then_g,
                            else_branch=else_g)
    feeds = {"x": x, "a": a}
    inits = {}
    if static_cond:
        inits["cond"] = cond
    else:
        feeds = {"cond": cond, **feeds}
    return build([node], feeds, [tensor("y", FLOAT)], initializers=inits)


@st.composite
def if_example(draw):
    n = draw(st.integers(1, 4))
    cond = np.asarray(draw(st.booleans()))
    static_cond = draw(st.booleans())
    return if_model(cond, normal(draw, (n,)), normal(draw, (n,)), static_cond=static_cond,
                    same_shapes=not static_cond or draw(st.booleans()))


def loop_model(y0, a, *, trip, cond=True, m_input=False, cond_input=False, scan=True,
               data_exit=None, opset=17):
    """y <- y * a + i, scan output y; with ``data_exit`` the body continues while sum(y) < it."""
    body_nodes = [
        helper.make_node("Cast", ["i"], ["i_f"], to=FLOAT),
        helper.make_node("Mul", ["y_in", "a"], ["ya"]),
        helper.make_node("Add", ["ya", "i_f"], ["y_out"]),
    ]
    if data_exit is None:
        body_nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        body_nodes += [const("lim", np.asarray(data_exit, np.float32)),
                       helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
                       helper.make_node("Less", ["s", "lim"], ["c_out"])]
    outs = [tensor("c_out", BOOL_T), tensor("y_out", FLOAT)]
    if scan:
        body_nodes.append(helper.make_node("Identity", ["y_out"], ["scan_out"]))
        outs.append(tensor("scan_out", FLOAT))
    body = helper.make_graph(body_nodes, "body",
                             [tensor("i", INT64, []), tensor("c_in", BOOL_T, []),
                              tensor("y_in", FLOAT)], outs)
    loop_outs = ["y_final"] + (["y_scan"] if scan else [])
    m_name = "" if trip is None else "M"
    c_name = "" if cond is None else "cond"
    node = helper.make_node("Loop", [m_name, c_name, "y0"], loop_outs, name="the_loop",
                            body=body)
    feeds, inits = {}, {}
    if trip is not None:
        (feeds if m_input else inits)["M"] = np.asarray(trip, np.int64)
    if cond is not None:
        (feeds if cond_input else inits)["cond"] = np.asarray(cond)
    feeds.update({"y0": y0, "a": a})
    return build([node], feeds, [tensor(o, FLOAT) for o in loop_outs], opset=opset,
                 initializers=inits)


@st.composite
def loop_example(draw):
    k = draw(st.integers(1, 3))
    y0, a = normal(draw, (k,)), normal(draw, (k,))
    form = draw(st.sampled_from(["unrolled", "unrolled_data_exit", "scan", "gated",
                                 "while_m", "while_cond"]))
    if form == "unrolled":
        return loop_model(y0, a, trip=draw(st.integers(1, 6)))
    if form == "unrolled_data_exit":  # static trip count, no scan outputs: gated scan
        return loop_model(y0, a, trip=draw(st.integers(1, 6)), scan=False,
                          data_exit=draw(st.sampled_from([2.0, 8.0])))
    if form == "scan":  # over the unroll limit: lax.scan
        return loop_model(y0 * 0.1, a * 0.1, trip=300)
    if form == "gated":  # over the unroll limit, run-time exit
        return loop_model(y0, a, trip=300, scan=False, data_exit=50.0)
    if form == "while_m":  # run-time trip count
        return loop_model(y0, a, trip=draw(st.integers(0, 5)), m_input=True, scan=False)
    return loop_model(y0, a, trip=None, cond=True, cond_input=True, scan=False,
                      data_exit=20.0)


@st.composite
def scan_example(draw):
    k, t = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    in_axis = draw(st.integers(0, 1))
    x = normal(draw, (t, k) if in_axis == 0 else (k, t))
    s0 = normal(draw, (k,))
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
        "body", [tensor("s_in", FLOAT, [k]), tensor("x_t", FLOAT, [k])],
        [tensor("s_out", FLOAT, [k]), tensor("y_t", FLOAT, [k])])
    if draw(st.booleans()):
        # ONNX's reference Scan supports only axis 0 and forward directions: the
        # expected values come from a numpy loop.
        in_dir, out_dir = draw(st.integers(0, 1)), draw(st.integers(0, 1))
        out_axis = draw(st.sampled_from([0, 1, -1, -2]))
        attrs = {"scan_input_axes": [in_axis], "scan_input_directions": [in_dir],
                 "scan_output_axes": [out_axis], "scan_output_directions": [out_dir]}
        node = helper.make_node("Scan", ["s0", "x"], ["s", "y"], num_scan_inputs=1, body=body,
                                **attrs)
        ex = build([node], {"s0": s0, "x": x}, [tensor("s", FLOAT), tensor("y", FLOAT)])
        xs = np.moveaxis(x, in_axis, 0)
        state, ys = s0.copy(), []
        for step in range(t):
            x_t = xs[t - 1 - step if in_dir else step]
            state = state + x_t
            ys.append(state * x_t)
        y = np.stack(ys[::-1] if out_dir else ys)
        ex.expected = [state, np.moveaxis(y, 0, out_axis)]
        return ex
    # Scan-8: batch axis 0 on every input, optional sequence_lens absent. ONNX's
    # reference evaluator has no Scan-8; the expected values come from a numpy loop.
    b = draw(st.integers(1, 3))
    xb = normal(draw, (b, t, k))
    sb = normal(draw, (b, k))
    reverse = draw(st.integers(0, 1))
    node = helper.make_node("Scan", ["", "s0", "x"], ["s", "y"], num_scan_inputs=1, body=body,
                            directions=[reverse])
    ex = build([node], {"s0": sb, "x": xb}, [tensor("s", FLOAT), tensor("y", FLOAT)], opset=8)
    state, ys = sb.copy(), []
    for step in range(t):
        x_t = xb[:, t - 1 - step if reverse else step]
        state = state + x_t
        ys.append(state * x_t)
    ex.expected = [state, np.stack(ys, axis=1)]
    return ex


CASES = [GraphCase("If", if_example), GraphCase("Loop", loop_example),
         GraphCase("Scan", scan_example)]


test_matches_reference = graph_table_tests(CASES)


# --------------------------------------------------------------------------- specific behaviour


def test_if_with_traced_condition_and_different_shapes_names_the_node():
    x = np.ones(3, np.float32)
    ex = if_model(np.asarray(True), x, x, same_shapes=False)
    with pytest.raises(StaticValueError, match=r"If .*'the_if'.*different outputs"):
        ex.run()
    # Eagerly (the condition is static there), only the chosen branch runs.
    (y,) = ex.run(jit=False)
    np.testing.assert_array_equal(y, 2 * x)


def test_loop_with_scan_outputs_and_runtime_exit_needs_static_values():
    y0 = np.ones(2, np.float32)
    ex = loop_model(y0, y0, trip=4, scan=True, data_exit=5.0)
    with pytest.raises(StaticValueError, match=r"Loop .*'the_loop'.*scan outputs"):
        ex.run()
    ex = loop_model(y0, y0, trip=3, m_input=True, scan=True)
    with pytest.raises(StaticValueError, match=r"'the_loop'.*trip count"):
        ex.run()


def test_loop_unrolled_keeps_shape_arithmetic_static():
    # The body slices by the iteration number (a Slice bound must be static).
    x = np.arange(1, 6, dtype=np.float32)
    body = helper.make_graph(
        [const("one", np.asarray(1, np.int64)),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "ax"], ["st"]),
         helper.make_node("Unsqueeze", ["end", "ax"], ["en"]),
         helper.make_node("Slice", ["x", "st", "en"], ["piece"]),
         helper.make_node("Add", ["y_in", "piece"], ["y_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Identity", ["y_out"], ["scan_out"])],
        "body", [tensor("i", INT64, []), tensor("c_in", BOOL_T, []), tensor("y_in", FLOAT, [1])],
        [tensor("c_out", BOOL_T), tensor("y_out", FLOAT), tensor("scan_out", FLOAT)])
    node = helper.make_node("Loop", ["M", "cond", "y0"], ["y", "ys"], body=body)
    ex = build([const("ax", np.asarray([0], np.int64)), node], {"y0": np.zeros(1, np.float32),
                                                                "x": x},
               [tensor("y", FLOAT), tensor("ys", FLOAT)],
               initializers={"M": np.asarray(5, np.int64), "cond": np.asarray(True)})
    check_graph_example(ex)


def test_loop_zero_iterations_gives_empty_scan_outputs():
    y0 = np.ones(3, np.float32)
    y, ys = loop_model(y0, y0, trip=0).run()
    np.testing.assert_array_equal(y, y0)
    assert ys.shape == (0, 3) and ys.dtype == np.float32


def test_loop_carried_shape_change_under_lax_is_an_error():
    body = helper.make_graph(
        [helper.make_node("Concat", ["y_in", "y_in"], ["y_out"], axis=0),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [tensor("i", INT64, []), tensor("c_in", BOOL_T, []), tensor("y_in", FLOAT)],
        [tensor("c_out", BOOL_T), tensor("y_out", FLOAT)])
    node = helper.make_node("Loop", ["M", "", "y0"], ["y"], name="grow", body=body)
    ex = build([node], {"M": np.asarray(2, np.int64), "y0": np.ones(1, np.float32)},
               [tensor("y", FLOAT)])
    with pytest.raises(OpError, match=r"'grow'.*changes shape"):
        ex.run()
    (y,) = ex.run(jit=False)  # static trip count: unrolled, shapes may change
    assert y.shape == (4,)


# --------------------------------------------------------------------------- gradients


def _check(f, x):
    with x64_enabled_scope():
        check_grads(jax.jit(f), (jnp.asarray(x, jnp.float64),), order=1, modes=["rev"], eps=1e-6,
                    atol=1e-5, rtol=1e-5)


def _f64(ex):
    """The same model in float64 (FLOAT value infos, casts and constants become DOUBLE)."""
    m = onnx.ModelProto()
    m.CopyFrom(ex.model)

    def fix(g):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.tensor_type.elem_type == FLOAT:
                vi.type.tensor_type.elem_type = TensorProto.DOUBLE
        for t in g.initializer:
            if t.data_type == FLOAT:
                t.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(t).astype(np.float64), t.name))
        for n in g.node:
            for at in n.attribute:
                if at.name == "to" and at.i == FLOAT:
                    at.i = TensorProto.DOUBLE
                if at.type == onnx.AttributeProto.TENSOR and at.t.data_type == FLOAT:
                    at.t.CopyFrom(numpy_helper.from_array(
                        numpy_helper.to_array(at.t).astype(np.float64), at.t.name))
                if at.type == onnx.AttributeProto.GRAPH:
                    fix(at.g)

    fix(m.graph)
    feeds = {k: (v.astype(np.float64) if np.asarray(v).dtype == F32 else v)
             for k, v in ex.feeds.items()}
    return GraphExample(m, feeds)


def _grad_through(ex, wrt, out=0):
    ex = _f64(ex)
    g = JaxGraph(ex.model, check=False, params=[])
    names = list(ex.feeds)

    def f(x):
        args = [x if n == wrt else jnp.asarray(v) for n, v in ex.feeds.items()]
        y = g.apply(g.params, *args)[out]
        return jnp.sum(y * jnp.cos(jnp.arange(y.size, dtype=y.dtype)).reshape(y.shape))

    assert wrt in names
    _check(f, ex.feeds[wrt])


@pytest.mark.parametrize("form", ["unrolled", "scan", "gated"])
@pytest.mark.parametrize("wrt", ["y0", "a"])
def test_loop_gradient_matches_finite_differences(form, wrt):
    rng = np.random.default_rng(0)
    y0, a = rng.uniform(0.5, 1.0, 3).astype(np.float32), rng.uniform(0.5, 1.0, 3).astype(
        np.float32)
    if form == "unrolled":
        ex = loop_model(y0, a, trip=4)
    elif form == "scan":
        ex = loop_model(y0, a * 0.99, trip=260)
    else:
        ex = loop_model(y0, a, trip=6, scan=False, data_exit=12.0)
    _grad_through(ex, wrt)


@pytest.mark.parametrize("wrt", ["s0", "x"])
def test_scan_gradient_matches_finite_differences(wrt):
    @settings(SETTINGS, max_examples=3)
    @given(scan_example())
    def check(ex):
        _grad_through(ex, wrt, out=1)

    check()


def test_if_gradient_flows_through_the_taken_branch():
    rng = np.random.default_rng(1)
    x, a = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    for cond in (True, False):
        _grad_through(if_model(np.asarray(cond), x, a), "a")
