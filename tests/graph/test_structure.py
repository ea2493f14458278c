"""check_graph_structure, and the defects it names through every entry point.

A cycle once made the fusion planner loop forever: each defect (a cycle, a
node reading its own output, a value made twice, an output listed twice, a
dangling read, nodes out of order) must be a ModelError naming the nodes and
values, raised within a few seconds (the check takes milliseconds; the limit
leaves room for a loaded machine) by JaxGraph, the ONNX backend,
jaxort.api.Module, jaxort.session.TrainingSession, generate_artifacts, the
artifact passes (slicing, the gradient-graph writer, export) and the planner.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import jaxort.backend
import jaxort.graph.ops  # noqa: F401  (fills the registry before any timed call)
import jaxort.graph.patterns
from jaxort import session as js
from jaxort.api import CheckpointState, Module
from jaxort.errors import ModelError
from jaxort.graph import JaxGraph, check_graph_structure, outer_reads
from jaxort.training.artifacts import LossType, export_model_for_inferencing, generate_artifacts, slice_model
from jaxort.training.artifacts.gradient import add_gradient_graph

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "mlp_adamw"
LIMIT_S = 5.0
F = TensorProto.FLOAT
# fc2_matmul reads the model's output instead of relu.out.
CYCLE = ("the graph has a cycle through nodes 'fc2_matmul' (MatMul) -> 'fc2_add' (Add) -> 'fc2_matmul' "
         "(along values 'fc2.mm' -> 'output')")


def _error_within(call, limit: float = LIMIT_S) -> BaseException:
    """The exception ``call()`` raises; fails when it returns, or runs past ``limit`` seconds.

    The call runs in a daemon thread, so a call that never ends fails the test
    instead of hanging the run.
    """
    box = {}

    def run():
        start = time.perf_counter()
        try:
            call()
        except BaseException as e:  # noqa: BLE001  handed to the test
            box["error"] = e
        box["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"no answer within {limit} s"
    assert "error" in box, f"no error (returned after {box['seconds']:.2f} s)"
    return box["error"]


def _model_error(call, message: str) -> None:
    error = _error_within(call)
    assert isinstance(error, ModelError), repr(error)
    assert str(error) == message


def _graph(nodes, inputs=("x",), outputs=("y",), initializers=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, F, [2]) for i in inputs],
                             [helper.make_tensor_value_info(o, F, [2]) for o in outputs],
                             initializer=[numpy_helper.from_array(np.ones(2, np.float32), t)
                                          for t in initializers])


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _raises(graph, message: str) -> None:
    with pytest.raises(ModelError) as info:
        check_graph_structure(graph)
    assert str(info.value) == message


def _cyclic(name: str) -> onnx.ModelProto:
    model = onnx.load(str(GOLDEN / name))
    node = next(n for n in model.graph.node if n.name == "fc2_matmul")
    node.input[0] = "output"
    return model


# The defects, one graph each ----------------------------------------------------


def test_a_cycle_names_its_nodes_and_values_in_dataflow_order():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="r"),
             helper.make_node("Add", ["r", "b_out"], ["a_out"], name="a"),
             helper.make_node("Neg", ["a_out"], ["b_out"], name="b"),
             helper.make_node("Identity", ["b_out"], ["y"], name="y")]
    _raises(_graph(nodes), "the graph has a cycle through nodes 'a' (Add) -> 'b' (Neg) -> 'a' "
                           "(along values 'a_out' -> 'b_out')")


def test_a_node_reading_its_own_output_is_a_cycle_of_one():
    _raises(_graph([helper.make_node("MatMul", ["x", "y"], ["y"], name="mm")]),
            "node 'mm' (MatMul) reads its own output 'y' (a cycle of one node)")


def test_a_value_made_by_two_nodes_names_both():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="first"),
             helper.make_node("Neg", ["x"], ["y"], name="second")]
    _raises(_graph(nodes), "value 'y' is made by two nodes, 'first' (Relu) and 'second' (Neg)")


@pytest.mark.parametrize("kind, graph_kw", [("a graph input", dict(inputs=("x", "w"))),
                                            ("an initializer", dict(initializers=("w",)))])
def test_a_value_made_by_a_node_and_given_to_the_graph_names_both(kind, graph_kw):
    nodes = [helper.make_node("Relu", ["x"], ["w"], name="r"), helper.make_node("Add", ["x", "w"], ["y"], name="a")]
    _raises(_graph(nodes, **graph_kw), f"value 'w' is made by node 'r' (Relu) and is also {kind}")


def test_an_initializer_listed_as_a_graph_input_is_fine():
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="a")]
    check_graph_structure(_graph(nodes, inputs=("x", "w"), initializers=("w",)))


def test_an_output_listed_twice_by_one_node():
    _raises(_graph([helper.make_node("Split", ["x"], ["y", "y"], name="s", axis=0)]),
            "node 's' (Split) lists output 'y' twice")
    # Absent optional outputs ("") may repeat.
    check_graph_structure(_graph([helper.make_node("Dropout", ["x"], ["y", ""], name="d")]))


def test_a_dangling_read_keeps_the_tracer_words():
    nodes = [helper.make_node("Add", ["x", "nowhere"], ["y"], name="a")]
    _raises(_graph(nodes), "node 'a' (Add) reads 'nowhere', which is not a graph input, an initializer or the "
                           "output of an earlier node")


def test_nodes_out_of_order_name_the_reader_and_the_maker():
    nodes = [helper.make_node("Neg", ["r"], ["y"], name="late_reader"),
             helper.make_node("Relu", ["x"], ["r"], name="maker")]
    _raises(_graph(nodes), "node 'late_reader' (Neg) reads 'r' before node 'maker' (Relu) makes it: ONNX needs "
                           "the nodes in topological order")


def test_unnamed_nodes_are_named_by_index_and_other_domains_shown():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("FusedMatMul", ["r", "m"], ["m"], domain="com.microsoft")]
    _raises(_graph(nodes), "node #1 (com.microsoft::FusedMatMul) reads its own output 'm' (a cycle of one node)")


def test_a_model_is_checked_through_its_graph():
    with pytest.raises(ModelError, match="reads its own output"):
        check_graph_structure(_model(_graph([helper.make_node("Relu", ["y"], ["y"], name="r")])))


# Subgraphs ------------------------------------------------------------------------


def _if(name: str, outputs, then_nodes, then_out: str) -> onnx.NodeProto:
    branch = helper.make_graph(then_nodes, f"{name}_then", [], [helper.make_tensor_value_info(then_out, F, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], [f"{name}_e"])], f"{name}_else", [],
                              [helper.make_tensor_value_info(f"{name}_e", F, [2])])
    return helper.make_node("If", ["c"], list(outputs), name=name, then_branch=branch, else_branch=other)


def test_subgraphs_may_read_the_enclosing_scope():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="r"),
             _if("if", ["y"], [helper.make_node("Add", ["r", "x"], ["t"], name="inner")], "t")]
    check_graph_structure(_graph(nodes, inputs=("x", "c")))


def test_a_subgraph_reading_what_nothing_makes_is_dangling_in_the_main_graph():
    nodes = [_if("if", ["y"], [helper.make_node("Add", ["q", "x"], ["t"], name="inner")], "t")]
    _raises(_graph(nodes, inputs=("x", "c")), "node 'if' (If) reads 'q' in a subgraph, which is not a graph "
                                              "input, an initializer or the output of an earlier node")


def test_a_subgraph_reading_its_nodes_output_is_a_cycle():
    nodes = [_if("if", ["y"], [helper.make_node("Neg", ["y"], ["t"], name="inner")], "t")]
    _raises(_graph(nodes, inputs=("x", "c")),
            "node 'if' (If) reads its own output 'y' in a subgraph (a cycle of one node)")
    nodes = [_if("if", ["i"], [helper.make_node("Neg", ["z"], ["t"], name="inner")], "t"),
             helper.make_node("Relu", ["i"], ["z"], name="after"), helper.make_node("Neg", ["z"], ["y"], name="n")]
    _raises(_graph(nodes, inputs=("x", "c")),
            "the graph has a cycle through nodes 'if' (If) -> 'after' (Relu) -> 'if' (along values 'i' -> 'z')")


def test_a_defect_inside_a_subgraph_says_where():
    inner = [helper.make_node("Relu", ["x"], ["t"], name="one"), helper.make_node("Neg", ["x"], ["t"], name="two")]
    _raises(_graph([_if("if", ["y"], inner, "t")], inputs=("x", "c")),
            "value 't' is made by two nodes, 'one' (Relu) and 'two' (Neg) in subgraph 'then_branch' of node "
            "'if' (If)")


# Big graphs -------------------------------------------------------------------------


def _chain(n: int) -> onnx.GraphProto:
    graph = _graph([], outputs=(f"v{n}",))
    for k in range(n):
        graph.node.add(op_type="Relu", name=f"n{k}", input=[f"v{k}"], output=[f"v{k + 1}"])
    graph.node[0].input[0] = "x"
    return graph


def test_a_chain_of_100k_nodes_is_checked_without_recursion():
    n = 100_000
    graph = _chain(n)
    check_graph_structure(graph)
    graph.node[0].input[0] = f"v{n}"  # the first node reads the last one's output
    message = (f"the graph has a cycle through nodes 'n0' (Relu) -> 'n1' (Relu) -> 'n2' (Relu) -> 'n3' (Relu) -> "
               f"'n4' (Relu) -> ({n - 7} more) -> 'n99998' (Relu) -> 'n99999' (Relu) -> 'n0' (along values "
               f"'v1' -> 'v2' -> 'v3' -> 'v4' -> 'v5' -> ({n - 7} more) -> 'v99999' -> 'v100000')")
    _model_error(lambda: check_graph_structure(graph), message)


# Entry points -------------------------------------------------------------------------


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("fuse", [True, False])
def test_jaxgraph_names_the_cycle_of_a_forward_model(check, fuse):
    # Before onnx.checker, whose message names one node.
    _model_error(lambda: JaxGraph(_cyclic("model.onnx"), check=check, fuse=fuse), CYCLE)


def test_jaxgraph_names_the_cycle_of_a_training_model():
    model = _cyclic("training_model.onnx")
    _model_error(lambda: JaxGraph(model, check=False, outputs=["onnx::loss::8"],
                                  param_inputs=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
                                  inputs=["input", "labels"]), CYCLE)


def test_the_backend_names_the_cycle_of_an_inference_model():
    model = _cyclic("inference_model.onnx")
    _model_error(lambda: jaxort.backend.prepare(model), CYCLE)
    _model_error(lambda: jaxort.backend.run_model(model, [np.zeros((2, 20), np.float32)]), CYCLE)


@pytest.mark.parametrize("check", [True, False])
def test_jaxgraph_keeps_the_tracer_words_for_a_read_from_nowhere(check):
    model = onnx.load(str(GOLDEN / "model.onnx"))
    model.graph.node[1].input[1] = "gone"
    _model_error(lambda: JaxGraph(model, check=check),
                 "node 'fc1_add' (Add) reads 'gone', which is not a graph input, an initializer or the output "
                 "of an earlier node")


def _artifacts(tmp_path, **cyclic) -> dict:
    paths = {}
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"):
        path = tmp_path / name
        if name in cyclic.values():
            onnx.save(_cyclic(name), str(path))
        else:
            shutil.copy(GOLDEN / name, path)
        paths[name] = path
    return paths


@pytest.mark.parametrize("cyclic", ["training_model.onnx", "eval_model.onnx"])
def test_module_names_the_cycle(tmp_path, cyclic):
    paths = _artifacts(tmp_path, model=cyclic)
    state = CheckpointState.load_checkpoint(str(paths["checkpoint"]))
    _model_error(lambda: Module(str(paths["training_model.onnx"]), state, str(paths["eval_model.onnx"])), CYCLE)


@pytest.mark.parametrize("cyclic", ["training_model.onnx", "eval_model.onnx"])
def test_training_session_names_the_cycle(tmp_path, cyclic):
    paths = _artifacts(tmp_path, model=cyclic)
    state = js.load_checkpoint(paths["checkpoint"])
    _model_error(lambda: js.TrainingSession(state, paths["training_model.onnx"], paths["eval_model.onnx"],
                                            paths["optimizer_model.onnx"]), CYCLE)


def test_generate_artifacts_names_the_cycle_and_writes_nothing(tmp_path):
    model = _cyclic("model.onnx")
    _model_error(lambda: generate_artifacts(model, requires_grad=["fc1.weight"], loss=LossType.CrossEntropyLoss,
                                            artifact_directory=tmp_path / "out"), CYCLE)
    assert not (tmp_path / "out").exists()


def test_the_artifact_passes_name_the_cycle():
    training = _cyclic("training_model.onnx")
    _model_error(lambda: slice_model(training, ["onnx::loss::8"]), CYCLE)
    forward = _cyclic("model.onnx")
    _model_error(lambda: add_gradient_graph(forward, "output", ["fc1.weight"]), CYCLE)
    params = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(GOLDEN / "model.onnx")).graph.initializer}
    _model_error(lambda: export_model_for_inferencing(_cyclic("eval_model.onnx"), params, ["output"]), CYCLE)


def test_the_fusion_planner_refuses_a_cycle_it_is_given():
    # Gelu (x * 0.5 * (1 + erf(x / sqrt 2))) whose input reads its output.
    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.float32)))

    nodes = [helper.make_node("Relu", ["g"], ["x"], name="relu"),
             const("s", np.sqrt(2.0)), const("h", 0.5), const("one", 1.0),
             helper.make_node("Div", ["x", "s"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Mul", ["x", "h"], ["m"], name="half"),
             helper.make_node("Add", ["e", "one"], ["u"], name="add"),
             helper.make_node("Mul", ["m", "u"], ["g"], name="gelu")]
    error = _error_within(lambda: jaxort.graph.patterns.plan(nodes, {"": 17}, {}, {"g"}, outer_reads))
    assert isinstance(error, ModelError), repr(error)
    assert re.fullmatch(r"the fusion plan cannot order nodes \[.*'relu'.*\]: the graph has a cycle", str(error))
