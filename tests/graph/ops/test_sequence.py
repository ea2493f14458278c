"""Sequence and optional ops (ops/sequence.py) against ONNX's reference evaluator
(or written-out values where it wraps optionals in lists).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st
from onnx import TensorProto, helper

from jaxort.errors import OpError

from ._harness import GraphCase, build, const, graph_table_tests, normal, seq_info, tensor

COVERED_OPS = {
    "SequenceConstruct", "SequenceEmpty", "SequenceAt", "SequenceInsert", "SequenceErase",
    "SequenceLength", "SplitToSequence", "ConcatFromSequence", "SequenceMap",
    "Optional", "OptionalHasElement", "OptionalGetElement",
}
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
BOOL_T = TensorProto.BOOL


@st.composite
def sequence_example(draw):
    n, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    a, b, c = normal(draw, (n,)), normal(draw, (n,)), normal(draw, (m,))
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
    a, b, t = normal(draw, (n,)), normal(draw, (n + 1,)), normal(draw, (1,))
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
    x = normal(draw, (draw(st.integers(1, 3)),))
    present = draw(st.booleans())
    if present:
        nodes = [helper.make_node("Optional", ["x"], ["o"])]
    else:
        nodes = [helper.make_node("Optional", [], ["o"],
                                  type=helper.make_tensor_type_proto(FLOAT, None))]
    nodes += [helper.make_node("OptionalHasElement", ["o"], ["has"]),
              helper.make_node("OptionalHasElement", [], ["none"])]
    outputs = [tensor("has", BOOL_T), tensor("none", BOOL_T)]
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


CASES = [GraphCase("sequences", sequence_example), GraphCase("SequenceMap", sequence_map_example),
         GraphCase("optionals", optional_example)]


test_matches_reference = graph_table_tests(CASES)


def test_sequence_position_out_of_range_names_the_node():
    nodes = [helper.make_node("SequenceConstruct", ["a"], ["s"]),
             const("p", np.asarray(3, np.int64)),
             helper.make_node("SequenceAt", ["s", "p"], ["y"], name="at3")]
    ex = build(nodes, {"a": np.ones(2, np.float32)}, [tensor("y", FLOAT)])
    with pytest.raises(OpError, match=r"SequenceAt .*'at3'.*out of range"):
        ex.run()
