"""NonMaxSuppression (ops/detection.py) against ONNX's reference evaluator.

Its output shape depends on the values, so every input is an initializer
(static at trace time) in the property; a traced input is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

import jaxort.backend as backend
from jaxort.errors import StaticValueError
from jaxort.testing import NodeCase, assert_outputs_match, run_reference

from ._harness import OLD_REFERENCE, OpCase, node, run_jax, table_tests
from ._strategies import F32, F64, i64

COVERED_OPS = {"NonMaxSuppression"}


@st.composite
def s_non_max_suppression(draw):
    batches, classes, n = (draw(st.integers(1, 2)), draw(st.integers(1, 3)),
                           draw(st.integers(1, 7)))
    dtype = draw(st.sampled_from([F32, F64]))
    center = draw(st.sampled_from([0, 1]))
    # Coordinates on a coarse grid: overlapping, identical, flipped and empty
    # boxes are common, and many IoUs land exactly on the drawn threshold.
    # Boxes come from a small pool, so identical boxes (IoU exactly 1) recur.
    grid = st.integers(0, 6).map(lambda v: v / 2)
    pool = [[draw(grid) for _ in range(4)] for _ in range(draw(st.integers(1, 4)))]
    pool.append([0.0, 0.0, 1.0, 1.0] if center == 0 else [0.5, 0.5, 1.0, 1.0])
    pool.append([0.0, 0.5, 1.0, 1.5] if center == 0 else [1.0, 0.5, 1.0, 1.0])  # IoU 1/3
    boxes = np.array([[draw(st.sampled_from(pool)) for _ in range(n)]
                      for _ in range(batches)], dtype)
    scores = np.array([[[draw(st.integers(0, 4)) / 4 for _ in range(n)] for _ in range(classes)]
                       for _ in range(batches)], dtype)
    inputs = [("boxes", boxes, True), ("scores", scores, True),
              ("max_output_boxes_per_class", i64([draw(st.integers(0, n + 1))]), True),
              ("iou_threshold", np.array([draw(st.sampled_from([0.0, 0.25, 0.5, 1 / 3, 1.0]))],
                                         dtype), True)]
    # onnx < 1.17's reference fails without score_threshold.
    if OLD_REFERENCE or draw(st.booleans()):
        inputs.append(("score_threshold", np.array([draw(st.sampled_from([0.0, 0.3, 0.5]))],
                                                   dtype), True))
    return node("NonMaxSuppression", inputs, {"center_point_box": center},
                opset=draw(st.sampled_from([10, 11])))


CASES = [
    OpCase("NonMaxSuppression", s_non_max_suppression(), scale=0, max_examples=40),
]

test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


BOXES = np.array([[[0.0, 0.0, 1.0, 1.0], [0.0, 0.1, 1.0, 1.1], [0.0, -0.1, 1.0, 0.9],
                   [0.0, 10.0, 1.0, 11.0], [0.0, 10.1, 1.0, 11.1], [0.0, 100.0, 1.0, 101.0]]],
                 np.float32)
SCORES = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]], np.float32)


def test_absent_optional_inputs_take_the_spec_defaults():
    # No max_output_boxes_per_class: 0 boxes per class, an empty [0, 3] result.
    out = run_jax(NodeCase("NonMaxSuppression", (BOXES, SCORES), opset=11, initializers=(0, 1)))
    assert out[0].dtype == np.int64 and out[0].shape == (0, 3)
    # iou_threshold absent is 0: any overlap suppresses; no score_threshold keeps every score.
    case = NodeCase("NonMaxSuppression", (BOXES, SCORES, i64([10])), opset=11,
                    initializers=(0, 1, 2))
    expected = np.array([[0, 0, 3], [0, 0, 0], [0, 0, 5]], np.int64)
    np.testing.assert_array_equal(run_jax(case)[0], expected)
    full = NodeCase("NonMaxSuppression", (BOXES, SCORES, i64([10]), np.array([0.0], np.float32)),
                    opset=11, initializers=(0, 1, 2, 3))
    if OLD_REFERENCE:  # its reference fails without score_threshold
        full = NodeCase("NonMaxSuppression", full.inputs + (np.array([0.0], np.float32),), opset=11,
                        initializers=(0, 1, 2, 3, 4))
    assert_outputs_match(run_jax(full), run_reference(full), scale=0)


def test_traced_boxes_are_refused_with_the_reason():
    case = NodeCase("NonMaxSuppression", (BOXES, SCORES, i64([3]), np.array([0.5], np.float32)),
                    opset=11, initializers=(1, 2, 3))
    with pytest.raises(StaticValueError, match=r"NonMaxSuppression.*'boxes'.*depends on the values"):
        run_jax(case, jit=True)


def test_backend_runs_nms_of_graph_inputs_on_the_host_then_compiled():
    # The selection runs first (JaxGraph.host_values); the graph compiles per its count.
    case = NodeCase("NonMaxSuppression", (BOXES, SCORES, i64([3]), np.array([0.5], np.float32),
                                          np.array([0.0], np.float32)), opset=11)
    rep = backend.prepare(case.model(), check=False)
    got = rep.run(case.args)
    assert rep.mode == "hosted"
    assert_outputs_match(list(got), run_reference(case), scale=0)
