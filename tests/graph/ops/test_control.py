"""If, Loop, Scan, sequence and optional ops against ONNX's reference evaluator.

One table, ``CASES``: an entry per op (or op form) with a hypothesis strategy
that draws a small model (with subgraphs where the op has them) and its
inputs. Models run jitted under strict dtype promotion with 64-bit types
enabled. Each lowering of Loop is exercised (Python unrolling, lax.scan,
gated lax.scan, lax.while_loop), and gradients through If, Loop and Scan
bodies are checked against finite differences in float64.
"""


import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from jaxort.errors import OpError, StaticValueError
from jaxort.graph import JaxGraph, x64_enabled_scope

COVERED_OPS = {
    "If", "Loop", "Scan",
    "SequenceConstruct", "SequenceEmpty", "SequenceAt", "SequenceInsert", "SequenceErase",
    "SequenceLength", "SplitToSequence", "ConcatFromSequence", "SequenceMap",
    "Optional", "OptionalHasElement", "OptionalGetElement",
}

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
TOL = {F32: (1e-5, 1e-6), F64: (1e-10, 1e-12)}
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
BOOL = TensorProto.BOOL


# --------------------------------------------------------------------------- helpers


def tensor(name, elem, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def seq_info(name, elem=FLOAT):
    return helper.make_value_info(
        name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None)))


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name))


@dataclasses.dataclass
class Example:
    model: onnx.ModelProto
    feeds: dict  # graph input name -> value, in graph input order
    expected: list | None = None  # for forms ONNX's reference evaluator lacks (Scan-8)


def build(nodes, feeds, outputs, *, opset=17, initializers=None):
    """A model whose graph inputs are ``feeds`` (name -> array) and outputs ``outputs``."""
    inputs = [tensor(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                     list(np.shape(v))) for n, v in feeds.items()]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return Example(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]),
                   dict(feeds))


def run_reference(ex):
    if ex.expected is not None:
        return ex.expected
    return ReferenceEvaluator(ex.model).run(None, ex.feeds)


def run_jaxort(ex, *, jit=True):
    g = JaxGraph(ex.model, check=False, params=[])
    with x64_enabled_scope(), jax.numpy_dtype_promotion("strict"):
        fn = jax.jit(g.apply) if jit else g.apply
        return fn(g.params, *ex.feeds.values())


def assert_matches(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if isinstance(e, list):
            assert isinstance(g, list), f"expected a sequence, got {type(g).__name__}"
            assert_matches(g, e)
            continue
        if e is None:
            assert g is None
            continue
        g, e = np.asarray(g), np.asarray(e)
        assert g.dtype == e.dtype, f"dtype {g.dtype} != expected {e.dtype}"
        assert g.shape == e.shape, f"shape {g.shape} != expected {e.shape}"
        if e.dtype in TOL:
            rtol, atol = TOL[e.dtype]
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, e)


def _floats(draw, shape, dtype=F32):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return (rng.standard_normal(shape) * 0.5).astype(dtype)


# --------------------------------------------------------------------------- If


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
    return if_model(cond, _floats(draw, (n,)), _floats(draw, (n,)), static_cond=static_cond,
                    same_shapes=not static_cond or draw(st.booleans()))


# --------------------------------------------------------------------------- Loop


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
    outs = [tensor("c_out", BOOL), tensor("y_out", FLOAT)]
    if scan:
        body_nodes.append(helper.make_node("Identity", ["y_out"], ["scan_out"]))
        outs.append(tensor("scan_out", FLOAT))
    body = helper.make_graph(body_nodes, "body",
                             [tensor("i", INT64, []), tensor("c_in", BOOL, []),
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
    y0, a = _floats(draw, (k,)), _floats(draw, (k,))
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


# --------------------------------------------------------------------------- Scan


@st.composite
def scan_example(draw):
    k, t = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    in_axis = draw(st.integers(0, 1))
    x = _floats(draw, (t, k) if in_axis == 0 else (k, t))
    s0 = _floats(draw, (k,))
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
    xb = _floats(draw, (b, t, k))
    sb = _floats(draw, (b, k))
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


# --------------------------------------------------------------------------- sequences


@st.composite
def sequence_example(draw):
    n, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    a, b, c = _floats(draw, (n,)), _floats(draw, (n,)), _floats(draw, (m,))
    # ONNX's reference inserts at the front for position == length; the spec says back.
    ins_pos = draw(st.integers(-2, 1))
    erase_pos = draw(st.integers(-3, 2))
    at_pos = draw(st.integers(-2, 1))
    split = draw(st.sampled_from([None, 1, 2, "sizes"]))
    nodes = [
        helper.make_node("SequenceEmpty", [], ["s0"], dtype=FLOAT),
        helper.make_node("SequenceInsert", ["s0", "a"], ["s1"]),
        helper.make_node("SequenceInsert", ["s1", "b"], ["s2"]),
        const("ipos", np.asarray(ins_pos, np.int64)),
        helper.make_node("SequenceInsert", ["s2", "c", "ipos"], ["s3"]),
        const("epos", np.asarray(erase_pos, np.int64)),
        helper.make_node("SequenceErase", ["s3", "epos"], ["s4"]),
        helper.make_node("SequenceLength", ["s4"], ["len"]),
        const("apos", np.asarray(at_pos, np.int64)),
        helper.make_node("SequenceAt", ["s4", "apos"], ["at"]),
        helper.make_node("ConcatFromSequence", ["s4"], ["cat"], axis=0),
        helper.make_node("SequenceConstruct", ["a", "b"], ["pair"]),
        helper.make_node("ConcatFromSequence", ["pair"], ["stacked"], axis=-1, new_axis=1),
    ]
    split_inputs = ["stacked"]
    if split == "sizes":
        nodes.append(const("split", np.asarray([1, n - 1] if n > 1 else [1], np.int64)))
        split_inputs.append("split")
    elif split is not None:
        nodes.append(const("split", np.asarray(split, np.int64)))
        split_inputs.append("split")
    nodes.append(helper.make_node("SplitToSequence", split_inputs, ["parts"], axis=0,
                                  keepdims=draw(st.integers(0, 1))))
    outputs = [tensor("len", INT64), tensor("at", FLOAT), tensor("cat", FLOAT),
               tensor("stacked", FLOAT), seq_info("parts"), seq_info("s4")]
    return build(nodes, {"a": a, "b": b, "c": c}, outputs)


@st.composite
def sequence_map_example(draw):
    n = draw(st.integers(1, 4))
    a, b, t = _floats(draw, (n,)), _floats(draw, (n + 1,)), _floats(draw, (1,))
    body = helper.make_graph(
        [helper.make_node("Add", ["x", "t_in"], ["y"]), helper.make_node("Shape", ["x"], ["sh"])],
        "body", [tensor("x", FLOAT), tensor("t_in", FLOAT)],
        [tensor("y", FLOAT), tensor("sh", INT64)])
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceMap", ["s", "t"], ["ys", "shapes"], body=body)]
    return build(nodes, {"a": a, "b": b, "t": t},
                 [seq_info("ys"), seq_info("shapes", INT64)])


@st.composite
def optional_example(draw):
    # ONNX's reference Optional wraps its value in a list (OptionalGetElement then
    # returns that list): the expected values are written out here.
    x = _floats(draw, (draw(st.integers(1, 3)),))
    present = draw(st.booleans())
    if present:
        nodes = [helper.make_node("Optional", ["x"], ["o"])]
    else:
        nodes = [helper.make_node("Optional", [], ["o"],
                                  type=helper.make_tensor_type_proto(FLOAT, None))]
    nodes += [helper.make_node("OptionalHasElement", ["o"], ["has"]),
              helper.make_node("OptionalHasElement", [], ["none"])]
    outputs = [tensor("has", BOOL), tensor("none", BOOL)]
    expected = [np.asarray(present), np.asarray(False)]
    if present:
        nodes += [helper.make_node("OptionalGetElement", ["o"], ["got"]),
                  helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
                  helper.make_node("Optional", ["s"], ["os"]),
                  helper.make_node("OptionalGetElement", ["os"], ["s_got"])]
        outputs += [tensor("got", FLOAT), seq_info("s_got")]
        expected += [x, [x, x]]
    ex = build(nodes, {"x": x}, outputs, opset=18)
    ex.expected = expected
    return ex


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    strategy: Callable[[], st.SearchStrategy]


CASES = [
    Case("If", if_example),
    Case("Loop", loop_example),
    Case("Scan", scan_example),
    Case("sequences", sequence_example),
    Case("SequenceMap", sequence_map_example),
    Case("optionals", optional_example),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    @SETTINGS
    @given(case.strategy())
    def check(ex):
        assert_matches(run_jaxort(ex), run_reference(ex))

    check()


# --------------------------------------------------------------------------- specific behaviour


def test_if_with_traced_condition_and_different_shapes_names_the_node():
    x = np.ones(3, np.float32)
    ex = if_model(np.asarray(True), x, x, same_shapes=False)
    with pytest.raises(StaticValueError, match=r"If .*'the_if'.*different outputs"):
        run_jaxort(ex)
    # Eagerly (the condition is static there), only the chosen branch runs.
    (y,) = run_jaxort(ex, jit=False)
    np.testing.assert_array_equal(y, 2 * x)


def test_loop_with_scan_outputs_and_runtime_exit_needs_static_values():
    y0 = np.ones(2, np.float32)
    ex = loop_model(y0, y0, trip=4, scan=True, data_exit=5.0)
    with pytest.raises(StaticValueError, match=r"Loop .*'the_loop'.*scan outputs"):
        run_jaxort(ex)
    ex = loop_model(y0, y0, trip=3, m_input=True, scan=True)
    with pytest.raises(StaticValueError, match=r"'the_loop'.*trip count"):
        run_jaxort(ex)


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
        "body", [tensor("i", INT64, []), tensor("c_in", BOOL, []), tensor("y_in", FLOAT, [1])],
        [tensor("c_out", BOOL), tensor("y_out", FLOAT), tensor("scan_out", FLOAT)])
    node = helper.make_node("Loop", ["M", "cond", "y0"], ["y", "ys"], body=body)
    ex = build([const("ax", np.asarray([0], np.int64)), node], {"y0": np.zeros(1, np.float32),
                                                                "x": x},
               [tensor("y", FLOAT), tensor("ys", FLOAT)],
               initializers={"M": np.asarray(5, np.int64), "cond": np.asarray(True)})
    assert_matches(run_jaxort(ex), run_reference(ex))


def test_loop_zero_iterations_gives_empty_scan_outputs():
    y0 = np.ones(3, np.float32)
    y, ys = run_jaxort(loop_model(y0, y0, trip=0))
    np.testing.assert_array_equal(y, y0)
    assert ys.shape == (0, 3) and ys.dtype == np.float32


def test_loop_carried_shape_change_under_lax_is_an_error():
    body = helper.make_graph(
        [helper.make_node("Concat", ["y_in", "y_in"], ["y_out"], axis=0),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [tensor("i", INT64, []), tensor("c_in", BOOL, []), tensor("y_in", FLOAT)],
        [tensor("c_out", BOOL), tensor("y_out", FLOAT)])
    node = helper.make_node("Loop", ["M", "", "y0"], ["y"], name="grow", body=body)
    ex = build([node], {"M": np.asarray(2, np.int64), "y0": np.ones(1, np.float32)},
               [tensor("y", FLOAT)])
    with pytest.raises(OpError, match=r"'grow'.*changes shape"):
        run_jaxort(ex)
    (y,) = run_jaxort(ex, jit=False)  # static trip count: unrolled, shapes may change
    assert y.shape == (4,)


def test_sequence_position_out_of_range_names_the_node():
    nodes = [helper.make_node("SequenceConstruct", ["a"], ["s"]),
             const("p", np.asarray(3, np.int64)),
             helper.make_node("SequenceAt", ["s", "p"], ["y"], name="at3")]
    ex = build(nodes, {"a": np.ones(2, np.float32)}, [tensor("y", FLOAT)])
    with pytest.raises(OpError, match=r"SequenceAt .*'at3'.*out of range"):
        run_jaxort(ex)


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
    return Example(m, feeds)


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
