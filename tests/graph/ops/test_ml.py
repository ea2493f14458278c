"""ai.onnx.ml ops (ops/ml.py: Binarizer, ArrayFeatureExtractor, LabelEncoder, TreeEnsemble)
against ONNX's reference evaluator, and against ONNX Runtime where the reference departs
from the spec (NaN keys, TreeEnsemble's post_transform, which the reference ignores).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st
from onnx import numpy_helper

from jaxort.errors import OpError
from jaxort.testing import NodeCase, assert_outputs_match, run_reference

from ._harness import F16, F32, F64, OpCase, run_jax, run_onnxruntime, table_tests
from ._strategies import draw_shape, values

COVERED_OPS = {"ArrayFeatureExtractor", "Binarizer", "LabelEncoder", "TreeEnsemble"}

ML = "ai.onnx.ml"


def _ml(op, inputs, attrs, opset, initializers=()):
    return NodeCase(op, tuple(inputs), attrs, opset, 1, tuple(initializers), ML)


@st.composite
def s_binarizer(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32, np.int64]))
    x = values(draw, draw_shape(draw, 1, 3), dtype, -2, 2)
    # Thresholds on and between the integers, negative ones included.
    threshold = draw(st.one_of(st.floats(-2.5, 2.5, width=32), st.sampled_from([-0.5, 0.0, 1.0])))
    return _ml("Binarizer", [x], {"threshold": threshold}, 1)


@st.composite
def s_array_feature_extractor(draw):
    x = values(draw, draw_shape(draw, 1, 3), draw(st.sampled_from([np.float32, np.int64])), -5, 5)
    k = draw(st.integers(1, 4))
    idx = np.array(draw(st.lists(st.integers(0, x.shape[-1] - 1), min_size=k, max_size=k)), np.int64)
    if draw(st.booleans()):
        idx = idx.reshape(1, -1)
    return _ml("ArrayFeatureExtractor", [x, idx], {}, 1,
               initializers=(1,) if draw(st.booleans()) else ())


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


WORDS = ["a", "b", "c", "dd", "", "é"]


@st.composite
def s_label_encoder(draw):
    """Every key and value form: lists (opset 2 and 4) and tensors (4), strings, ints,
    floats, repeated keys (the last one wins) and the defaults."""
    opset = draw(st.sampled_from([2, 4]))
    kinds = ["strings", "int64s", "floats"] + (["tensor"] if opset == 4 else [])
    key_kind, value_kind = draw(st.sampled_from(kinds)), draw(st.sampled_from(kinds))
    n = draw(st.integers(1, 5))
    key_dtype = (draw(st.sampled_from([np.int64, np.int32, np.int16, np.float64, np.float32]))
                 if key_kind == "tensor" else None)
    pool = {"strings": st.sampled_from(WORDS), "int64s": st.integers(-4, 4),
            "floats": st.sampled_from([-1.5, -0.0, 0.5, 2.0, 3.25])}

    def draw_list(kind, dtype):
        if kind == "tensor":
            kind = "int64s" if np.dtype(dtype).kind in "iu" else "floats"
        return draw(st.lists(pool[kind], min_size=n, max_size=n))

    keys = draw_list(key_kind, key_dtype)
    value_dtype = (draw(st.sampled_from([np.int64, np.int16, np.float32, np.float64, object]))
                   if value_kind == "tensor" else None)
    vals = (draw(st.lists(pool["strings"], min_size=n, max_size=n)) if value_dtype is object
            else draw_list(value_kind, value_dtype))
    attrs = {}
    for prefix, kind, items, dtype in (("keys", key_kind, keys, key_dtype),
                                        ("values", value_kind, vals, value_dtype)):
        if kind == "tensor":
            arr = np.array(items, dtype=dtype)
            attrs[f"{prefix}_tensor"] = numpy_helper.from_array(arr, f"{prefix}_tensor")
        else:
            attrs[f"{prefix}_{kind}"] = items
    if value_kind == "tensor":
        # The reference reads default_tensor whenever values_tensor is set.
        d = np.array(["zz"] if value_dtype is object else [7], dtype=value_dtype)
        attrs["default_tensor"] = numpy_helper.from_array(d, "default_tensor")
    elif draw(st.booleans()):
        name = {"strings": "default_string", "int64s": "default_int64",
                "floats": "default_float"}[value_kind]
        attrs[name] = {"strings": "zz", "int64s": 9, "floats": 0.25}[value_kind]
    elif value_kind == "strings":
        return None  # the reference's missing default_string is "", the spec's "_Unused"
    shape = draw_shape(draw, 1, 2)
    if key_kind == "strings":
        x = np.array([draw(st.sampled_from(WORDS + ["zzz"])) for _ in range(int(np.prod(shape)))],
                     dtype=object).reshape(shape)
    else:
        x_dtype = key_dtype or (np.int64 if key_kind == "int64s" else np.float32)
        x = np.array([draw(pool["floats" if np.dtype(x_dtype).kind == "f" else "int64s"])
                      for _ in range(int(np.prod(shape)))], dtype=x_dtype).reshape(shape)
    return _ml("LabelEncoder", [x], attrs, opset,
               initializers=(0,) if draw(st.booleans()) else ())


_LEAF = object()


@st.composite
def s_tree_ensemble(draw):
    """Random trees of every branch mode, nodes numbered in preorder (the reference reads
    the membership sets in that order), NaN inputs for missing_value_tracks_true."""
    dtype = draw(st.sampled_from([F32, F64]))
    features = draw(st.integers(1, 3))
    grid = [-1.0, 0.5, 1.0, 2.0]  # no 0: the reference ends a membership set at a 0 member
    n_targets = draw(st.integers(1, 3))
    nodes, leaves, members = [], [], []

    def leaf():
        leaves.append((draw(st.sampled_from([-2.0, 0.5, 1.0, 3.0])),
                       draw(st.integers(0, n_targets - 1))))
        return len(leaves) - 1

    def tree(depth):
        i = len(nodes)
        mode = draw(st.integers(0, 6))
        nodes.append(dict(mode=mode, feature=draw(st.integers(0, features - 1)),
                          split=draw(st.sampled_from(grid)), track=draw(st.integers(0, 1))))
        if mode == 6:
            members.extend(draw(st.lists(st.sampled_from(grid), min_size=1, max_size=3,
                                         unique=True)) + [np.nan])
        for side in ("true", "false"):
            if depth > 1 and draw(st.booleans()):
                nodes[i][side], nodes[i][side + "_leaf"] = tree(depth - 1), 0
            else:
                nodes[i][side], nodes[i][side + "_leaf"] = leaf(), 1
        return i

    roots = [tree(draw(st.integers(1, 4))) for _ in range(draw(st.integers(1, 3)))]
    attrs = {
        "tree_roots": roots,
        "nodes_modes": numpy_helper.from_array(np.array([d["mode"] for d in nodes], np.uint8)),
        "nodes_featureids": [d["feature"] for d in nodes],
        "nodes_splits": numpy_helper.from_array(np.array([d["split"] for d in nodes], dtype)),
        "nodes_truenodeids": [d["true"] for d in nodes],
        "nodes_trueleafs": [d["true_leaf"] for d in nodes],
        "nodes_falsenodeids": [d["false"] for d in nodes],
        "nodes_falseleafs": [d["false_leaf"] for d in nodes],
        "nodes_missing_value_tracks_true": [d["track"] for d in nodes],
        "leaf_weights": numpy_helper.from_array(np.array([w for w, _ in leaves], dtype)),
        "leaf_targetids": [t for _, t in leaves],
        "n_targets": n_targets,
        "aggregate_function": draw(st.integers(0, 3)),
        "post_transform": 0,
    }
    if members:
        attrs["membership_values"] = numpy_helper.from_array(np.array(members, dtype))
    x = np.array([[draw(st.sampled_from(grid + [0.0, 1.5, np.nan])) for _ in range(features)]
                  for _ in range(draw(st.integers(1, 5)))], dtype)
    return _ml("TreeEnsemble", [x], attrs, 5)


def _tree_reference(case: NodeCase) -> list:
    """ONNX's reference, except that a target no tree reaches under MIN or MAX scores 0 as
    in ONNX Runtime (the reference leaves the float extreme it starts from)."""
    (out,) = run_reference(case)
    if case.attributes["aggregate_function"] in (2, 3):
        out = np.where(np.abs(out) == np.finfo(out.dtype).max, np.zeros((), out.dtype), out)
    return [out]


CASES = [
    OpCase("ArrayFeatureExtractor", s_array_feature_extractor(), max_examples=8),
    OpCase("Binarizer", s_binarizer(), scale=0, max_examples=12),
    OpCase("LabelEncoder", s_label_encoder_numbers(), max_examples=8),
    OpCase("LabelEncoder", s_label_encoder().filter(lambda c: c is not None), id="LabelEncoder-forms",
           scale=0, max_examples=40),
    OpCase("TreeEnsemble", s_tree_ensemble(), reference=_tree_reference, max_examples=40),
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


def test_label_encoder_repeated_string_keys_take_the_last_value():
    x = np.array(["a", "b", "q"], dtype=object)
    case = _ml("LabelEncoder", [x], {"keys_strings": ["a", "b", "a"], "values_int64s": [1, 2, 3]},
               4)
    assert run_jax(case)[0].tolist() == [3, 2, -1]


def test_label_encoder_nan_keys_match_any_nan_as_onnxruntime_does():
    # The spec: a NaN key matches every NaN input, whatever its bits (the reference's dict
    # lookup misses them).
    quiet, other = np.float32(np.nan), np.array([0x7FC00001], np.uint32).view(np.float32)[0]
    x = np.array([quiet, other, 1.0, 2.5], np.float32)
    case = _ml("LabelEncoder", [x], {"keys_floats": [1.0, float("nan")],
                                     "values_int64s": [10, 20]}, 4)
    expected = run_onnxruntime(case.model(), case.feeds)
    assert expected[0].tolist() == [20, 20, 10, -1]
    assert_outputs_match(run_jax(case), expected, scale=0)


@pytest.mark.parametrize("values, expected", [
    (np.array([5, 6], np.int32), [5, -1]),                   # integral: -1
    (np.array([0.5, 1.5], np.float64), [0.5, -0.0]),         # float: -0.0
    (np.array(["x", "y"], dtype=object), ["x", "_Unused"]),  # string: "_Unused"
])
def test_label_encoder_values_tensor_without_default_tensor_uses_the_spec_default(values,
                                                                                 expected):
    case = _ml("LabelEncoder", [np.array([1, 9], np.int64)],
               {"keys_int64s": [1, 2], "values_tensor": numpy_helper.from_array(values, "v")}, 4,
               initializers=(0,))
    (y,) = run_jax(case, jit=values.dtype != object)  # strings never cross a jit boundary
    assert y.dtype == values.dtype and y.tolist() == expected
    if values.dtype.kind == "f":
        assert np.signbit(y[1])


def _stump(post_transform, aggregate_function=1, n_targets=3, single_leaf=False):
    """Two trees over two features; ``single_leaf`` makes the second a lone leaf."""
    attrs = {
        "tree_roots": [0, 1],
        "nodes_modes": numpy_helper.from_array(np.array([0, 3], np.uint8)),
        "nodes_featureids": [0, 1],
        "nodes_splits": numpy_helper.from_array(np.array([0.5, -1.0], np.float32)),
        "nodes_truenodeids": [0, 2], "nodes_trueleafs": [1, 1],
        "nodes_falsenodeids": [1, 2 if single_leaf else 3], "nodes_falseleafs": [1, 1],
        "nodes_hitrates": numpy_helper.from_array(np.array([1.0, 1.0], np.float32)),
        "leaf_weights": numpy_helper.from_array(np.array([1.5, -0.75, 0.25, 2.0], np.float32)),
        "leaf_targetids": [0, 1, 2, 0],
        "n_targets": n_targets, "aggregate_function": aggregate_function,
        "post_transform": post_transform,
    }
    x = np.array([[0.0, 0.0], [1.0, -2.0], [0.5, np.nan], [-3.0, 4.0]], np.float32)
    return _ml("TreeEnsemble", [x], attrs, 5)


@pytest.mark.parametrize("post_transform", [3, 4])
def test_tree_ensemble_post_transforms_match_onnxruntime(post_transform):
    # ONNX's reference ignores post_transform; ONNX Runtime applies it.
    case = _stump(post_transform, n_targets=4)
    if post_transform == 4:  # PROBIT maps scores in (0, 1): keep them there
        case.attributes["leaf_weights"] = numpy_helper.from_array(
            np.array([0.5, 0.25, 0.125, 0.25], np.float32))
    got = run_jax(case)
    # ONNX Runtime's PROBIT uses an approximate ErfInv (relative error up to ~2e-4).
    assert_outputs_match(got, run_onnxruntime(case.model(), case.feeds),
                         tolerances={F32: (1e-3, 1e-5)} if post_transform == 4 else None)
    if post_transform == 4:  # and jaxort's is the normal quantile itself
        from statistics import NormalDist
        assert np.isclose(got[0][1, 0], NormalDist().inv_cdf(0.25), rtol=1e-6)


def test_tree_ensemble_softmax_and_logistic_follow_the_spec_numbering():
    # The spec numbers SOFTMAX 1 and LOGISTIC 2. ONNX Runtime (1.32) reads the number as
    # its own enum (LOGISTIC 1, SOFTMAX 2) and swaps them, so the expected values here are
    # numpy's, from the untransformed scores.
    (raw,) = run_jax(_stump(0, n_targets=4))
    softmax = np.exp(raw - raw.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    assert_outputs_match(run_jax(_stump(1, n_targets=4)), [softmax.astype(np.float32)])
    logistic = (1 / (1 + np.exp(-raw.astype(np.float64)))).astype(np.float32)
    assert_outputs_match(run_jax(_stump(2, n_targets=4)), [logistic])


@pytest.mark.parametrize("aggregate_function", [0, 1, 2, 3])
def test_tree_ensemble_single_leaf_tree_matches_onnxruntime(aggregate_function):
    # A lone leaf is a node whose branches both name the same leaf.
    case = _stump(0, aggregate_function, single_leaf=True)
    expected = run_onnxruntime(case.model(), case.feeds)
    assert_outputs_match(run_jax(case), expected)
    assert_outputs_match(run_jax(case, jit=False), expected)


def test_tree_ensemble_refuses_branches_outside_the_tables():
    case = _stump(0)
    case.attributes["nodes_falsenodeids"] = [1, 9]
    with pytest.raises(OpError, match=r"TreeEnsemble.*nodes_falsenodeids points outside"):
        run_jax(case)
