"""Fuzzing of model protos: mutated, truncated and oddly attributed models give jaxort errors only.

Serialized models (a forward MLP and ONNX Runtime's training model) with
flipped bytes or cut short, models whose nodes are rewired (an input reading
another value, a downstream one or the node's own output included; an output
renamed to a value that exists), and nodes with random attribute values, are
fed to JaxGraph and TrainProgram.from_artifacts. Whatever happens, the only
exceptions allowed are :class:`jaxort.errors.JaxortError` subclasses, and a
rewired model gets its answer within seconds (a cycle once hung the fusion
planner).
Examples are bounded for ``make test`` (25 each); JAXORT_FUZZ_EXAMPLES raises the count.
"""

from __future__ import annotations

import os
import pathlib
import threading

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from jaxort import checkpoint as ckpt
from jaxort.errors import JaxortError
from jaxort.graph import JaxGraph
from jaxort.training import TrainProgram

CASE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "ort_api" / "frozen_sgd"
FORWARD = (CASE / "model.onnx").read_bytes()
TRAINING = (CASE / "training_model.onnx").read_bytes()
CHECKPOINT = ckpt.load(str(CASE / "checkpoint"))
FUZZ = settings(max_examples=int(os.environ.get("JAXORT_FUZZ_EXAMPLES", "25")), deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _mutate(data: bytes, draw) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(out) - 1))
        out[pos] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        out = out[:draw(st.integers(0, len(out)))]
    return bytes(out)


def _run_forward(graph: JaxGraph) -> None:
    args = []
    for info in graph.inputs:
        shape = [d if isinstance(d, int) else 2 for d in (info.shape or ())]
        args.append(np.zeros(shape, info.dtype or np.float32))
    graph.apply(graph.params, *args)


@FUZZ
@given(st.data())
def test_mutated_forward_model_gives_only_jaxort_errors(data):
    blob = _mutate(FORWARD, data.draw)
    try:
        graph = JaxGraph(blob, check=data.draw(st.booleans()))
        _run_forward(graph)
    except JaxortError:
        pass


def _rewire(data: bytes, draw) -> onnx.ModelProto:
    model = onnx.load_model_from_string(data)
    nodes = model.graph.node
    values = [o for n in nodes for o in n.output if o] + ["nowhere"]
    for _ in range(draw(st.integers(1, 3))):
        node = nodes[draw(st.integers(0, len(nodes) - 1))]
        names = node.input if draw(st.booleans()) and len(node.input) else node.output
        names[draw(st.integers(0, len(names) - 1))] = draw(st.sampled_from(values))
    return model


def _answers_within(call, limit: float = 30.0) -> None:
    """Runs ``call``, allowing JaxortErrors only, and fails if it runs past ``limit`` seconds."""
    box = {}

    def run():
        try:
            call()
        except JaxortError:
            pass
        except BaseException as e:  # noqa: BLE001  handed to the test
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"no answer within {limit} s"
    if "error" in box:
        raise box["error"]


@FUZZ
@given(st.data())
def test_rewired_models_give_only_jaxort_errors_and_never_hang(data):
    forward = _rewire(FORWARD, data.draw)
    check = data.draw(st.booleans())
    _answers_within(lambda: _run_forward(JaxGraph(forward, check=check)))
    training = _rewire(TRAINING, data.draw)
    _answers_within(lambda: TrainProgram.from_artifacts(training, checkpoint=CHECKPOINT))


@FUZZ
@given(st.data())
def test_mutated_training_model_gives_only_jaxort_errors(data):
    blob = _mutate(TRAINING, data.draw)
    try:
        TrainProgram.from_artifacts(blob, checkpoint=CHECKPOINT)
    except JaxortError:
        pass


_ATTRS = st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True),
                   st.lists(st.integers(-6, 6), min_size=1, max_size=5), st.text(max_size=4))


@FUZZ
@given(op=st.sampled_from([("Transpose", "perm"), ("Softmax", "axis"), ("Gemm", "alpha"), ("Gemm", "transB"),
                           ("Flatten", "axis"), ("Concat", "axis"), ("ReduceSum", "keepdims"), ("LeakyRelu", "alpha"),
                           ("Gather", "axis"), ("Split", "axis")]),
       value=_ATTRS)
def test_random_attribute_values_give_only_jaxort_errors(op, value):
    op_type, attr = op
    inputs = {"Gemm": ["a", "b"], "Concat": ["a", "a"], "Gather": ["a", "i"]}.get(op_type, ["a"])
    node = helper.make_node(op_type, inputs, ["y"], **{attr: value})
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 3]),
                      helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 3]),
                      helper.make_tensor_value_info("i", TensorProto.INT64, [2])][:len(set(inputs)) + (op_type == "Gather")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    try:
        g = JaxGraph(model, check=False, inputs=[i.name for i in graph.input if i.name in inputs])
        _run_forward(g)
    except JaxortError:
        pass


def test_a_string_attribute_that_is_not_utf8_is_a_model_error_naming_it():
    # Found by the long fuzz profile: a mutated byte in SoftmaxCrossEntropyLoss's
    # reduction ("\x80ean") raised a bare UnicodeDecodeError.
    import numpy as np
    from onnx import TensorProto, helper

    from jaxort.errors import ModelError
    from jaxort.graph import JaxGraph

    node = helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"], name="sce")
    node.attribute.append(helper.make_attribute("reduction", b"\x80ean"))
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("labels", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match=r"'sce'.*attribute 'reduction' holds bytes that are not UTF-8"):
        JaxGraph(model, check=False).apply({}, np.zeros((2, 3), np.float32), np.zeros(2, np.int64))
