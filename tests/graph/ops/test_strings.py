"""String ops and TfIdfVectorizer (ops/strings.py) against ONNX's reference evaluator.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import strategies as st

from jaxort.testing import run_reference

from ._harness import OpCase, assert_table_covers, check_op_case, node, run_jax

COVERED_OPS = {
    "RegexFullMatch", "StringConcat", "StringNormalizer", "StringSplit", "TfIdfVectorizer",
}


@st.composite
def s_tf_idf_vectorizer(draw):
    strings = draw(st.booleans())
    vocab = ["a", "b", "c", "d"] if strings else [1, 2, 3, 4]
    length = draw(st.integers(3, 7))
    x = np.array([[draw(st.sampled_from(vocab)) for _ in range(length)]
                  for _ in range(draw(st.integers(1, 2)))], dtype=object if strings else
                 np.int64)
    if draw(st.booleans()):
        x = x[0]
    unigrams = draw(st.lists(st.sampled_from(vocab), min_size=1, max_size=3, unique=True))
    bigrams = draw(st.lists(st.tuples(st.sampled_from(vocab), st.sampled_from(vocab)),
                            max_size=3, unique=True))
    pool = unigrams + [v for g in bigrams for v in g]
    n = len(unigrams) + len(bigrams)
    mode = draw(st.sampled_from(["TF", "IDF", "TFIDF"]))
    attrs = {"mode": mode, "min_gram_length": draw(st.integers(1, 2)), "max_gram_length": 2,
             "max_skip_count": draw(st.integers(0, 3)), "ngram_counts": [0, len(unigrams)],
             "ngram_indexes": list(draw(st.permutations(range(n))))}
    attrs["pool_strings" if strings else "pool_int64s"] = pool
    if mode != "TF" or draw(st.booleans()):  # the reference needs weights for IDF/TFIDF
        attrs["weights"] = [float(draw(st.integers(1, 4))) for _ in range(n)]
    return node("TfIdfVectorizer", [("x", x, True)], attrs, opset=9)


WORDS = st.sampled_from(["monday", "Monday", "tuesday", "", "café", "a b", "x  y", "Straße"])


@st.composite
def s_string_normalizer(draw):
    # No empty strings: the reference drops them, ONNX Runtime (and jaxort) keep them.
    x = np.array(draw(st.lists(WORDS.filter(bool), min_size=1, max_size=4)), dtype=object)
    if draw(st.booleans()):
        x = x.reshape(1, -1)
    attrs = {"case_change_action": draw(st.sampled_from(["NONE", "LOWER", "UPPER"])),
             "is_case_sensitive": draw(st.sampled_from([0, 1]))}
    if draw(st.booleans()):
        attrs["stopwords"] = ["monday"]
    if attrs["case_change_action"] == "NONE" and not attrs["is_case_sensitive"]:
        attrs.pop("stopwords", None)  # the reference compares case-sensitively here
    return node("StringNormalizer", [("x", x, False)], attrs, opset=10)


@st.composite
def s_string_concat(draw):
    a = np.array(draw(st.lists(WORDS, min_size=1, max_size=3)), dtype=object)
    b = np.array(draw(st.lists(WORDS, min_size=1, max_size=1)), dtype=object)
    if draw(st.booleans()):
        a, b = b, a
    return node("StringConcat", [("a", a, False), ("b", b, False)], opset=20)


@st.composite
def s_string_split(draw):
    x = np.array(draw(st.lists(st.sampled_from(["a b c", "a,b,,c", "", " x  y ", "abc"]),
                               min_size=1, max_size=3)), dtype=object)
    attrs = {}
    if draw(st.booleans()):
        attrs["delimiter"] = draw(st.sampled_from([",", " ", "b"]))
    if draw(st.booleans()):
        attrs["maxsplit"] = draw(st.integers(0, 2))
    return node("StringSplit", [("x", x, False)], attrs, opset=20, n_out=2)


@st.composite
def s_regex_full_match(draw):
    x = np.array(draw(st.lists(st.sampled_from(["abc", "a1", "x@y.com", "", "ABC"]),
                               min_size=1, max_size=4)), dtype=object)
    pattern = draw(st.sampled_from([r"[a-z]+", r"\w+@\w+\.com", r"a\d?", r".*"]))
    return node("RegexFullMatch", [("x", x, False)], {"pattern": pattern}, opset=20)


def _regex_reference_runs() -> bool:
    """onnx < 1.17's reference RegexFullMatch imports re2; 1.17+ uses Python's re."""
    case = node("RegexFullMatch", [("x", np.array(["a"], object), False)], {"pattern": "a"},
                opset=20)
    try:
        run_reference(case)
    except ImportError:
        return False
    return True


CASES = [
    OpCase("RegexFullMatch", s_regex_full_match(), max_examples=8),
    OpCase("StringConcat", s_string_concat(), max_examples=8),
    OpCase("StringNormalizer", s_string_normalizer(), max_examples=8),
    OpCase("StringSplit", s_string_split(), max_examples=8),
    OpCase("TfIdfVectorizer", s_tf_idf_vectorizer(), max_examples=8),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    if case.op == "RegexFullMatch" and not _regex_reference_runs():
        pytest.skip(f"onnx {onnx.__version__}'s reference RegexFullMatch needs the re2 "
                    "package, which is not installed")
    check_op_case(case)


def test_table_covers_every_op():
    assert_table_covers(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- examples


def test_string_normalizer_keeps_empty_strings_and_drops_stopwords():
    x = np.array(["Monday", "", "monday", "Café"], dtype=object)
    (y,) = run_jax(node("StringNormalizer", [("x", x, False)],
                        {"case_change_action": "UPPER", "is_case_sensitive": 0,
                         "stopwords": ["MONDAY"]}, opset=10))
    assert y.tolist() == ["", "CAFE"]
    (y,) = run_jax(node("StringNormalizer", [("x", x[:1].reshape(1, 1), False)],
                        {"case_change_action": "NONE", "is_case_sensitive": 1,
                         "stopwords": ["Monday"]}, opset=10))
    assert y.tolist() == [[""]]
