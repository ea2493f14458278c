"""ai.onnx.ml ops (ops/ml.py: Binarizer, ArrayFeatureExtractor, LabelEncoder) against ONNX's
reference evaluator.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.errors import OpError
from jaxort.testing import NodeCase

from ._harness import OpCase, run_jax, table_tests
from ._strategies import draw_shape, values

COVERED_OPS = {"ArrayFeatureExtractor", "Binarizer", "LabelEncoder"}

ML = "ai.onnx.ml"


def _ml(op, inputs, attrs, opset, initializers=()):
    return NodeCase(op, tuple(inputs), attrs, opset, 1, tuple(initializers), ML)


@st.composite
def s_binarizer(draw):
    x = values(draw, draw_shape(draw, 1, 3), draw(st.sampled_from([np.float32, np.float64])), -2, 2)
    return _ml("Binarizer", [x], {"threshold": draw(st.floats(-1, 1, width=32))}, 1)


@st.composite
def s_array_feature_extractor(draw):
    x = values(draw, draw_shape(draw, 1, 3), draw(st.sampled_from([np.float32, np.int64])), -5, 5)
    k = draw(st.integers(1, 4))
    idx = np.array(draw(st.lists(st.integers(0, x.shape[-1] - 1), min_size=k, max_size=k)), np.int64)
    if draw(st.booleans()):
        idx = idx.reshape(1, -1)
    return _ml("ArrayFeatureExtractor", [x, idx], {}, 1, initializers=(1,))


@st.composite
def s_label_encoder_numbers(draw):
    n = draw(st.integers(1, 5))
    keys = draw(st.lists(st.integers(-6, 6), min_size=n, max_size=n, unique=True))
    vals = draw(st.lists(st.floats(-3, 3, width=32), min_size=n, max_size=n))
    x = values(draw, draw_shape(draw, 1, 2), np.int64, -7, 7)
    attrs = {"keys_int64s": keys, "values_floats": vals}
    if draw(st.booleans()):
        attrs["default_float"] = draw(st.floats(-1, 1, width=32))
    return _ml("LabelEncoder", [x], attrs, draw(st.sampled_from([2, 4])))


CASES = [
    OpCase("ArrayFeatureExtractor", s_array_feature_extractor(), max_examples=8),
    OpCase("Binarizer", s_binarizer(), max_examples=8),
    OpCase("LabelEncoder", s_label_encoder_numbers(), max_examples=8),
]

test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- examples


def test_label_encoder_strings_to_ints_with_the_default():
    x = np.array(["a", "b", "zz", "c"], dtype=object)
    case = _ml("LabelEncoder", [x], {"keys_strings": ["a", "b", "c"], "values_int64s": [3, 4, 5],
                                     "default_int64": 42}, 2)
    (y,) = run_jax(case)
    assert y.dtype == np.int64 and y.tolist() == [3, 4, 42, 5]


def test_label_encoder_ints_to_strings():
    x = np.array([[1, 7], [2, 1]], np.int64)
    case = _ml("LabelEncoder", [x], {"keys_int64s": [1, 2], "values_strings": ["one", "two"]}, 2,
               initializers=(0,))
    (y,) = run_jax(case)
    assert y.tolist() == [["one", "_Unused"], ["two", "one"]]


def test_array_feature_extractor_refuses_out_of_range_indices():
    case = _ml("ArrayFeatureExtractor", [np.ones((2, 3), np.float32), np.array([0, 3], np.int64)], {}, 1,
               initializers=(1,))
    with pytest.raises(OpError, match=r"indices \[3\] are out of range for the last axis of size 3"):
        run_jax(case)
