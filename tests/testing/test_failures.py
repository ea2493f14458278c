"""A failing assert_matches_reference saves its model and inputs, hypothesis shrinking or not.

The message names the saved ``.onnx`` file (its inputs beside it, in
``.npz``); a check that raises rather than asserts names it in a note. The
references here are planted wrong, so each failure is known in advance.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxort.errors import ModelError
from jaxort.testing import assert_matches_reference, load_failure, node_model

SAVED = re.compile(r"model saved to (\S+\.onnx) \(inputs in (\S+\.npz);")


@pytest.fixture(autouse=True)
def _failures_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXORT_FAILURE_DIR", str(tmp_path / "failures"))


def _off_by_one(model, feeds):
    return [np.maximum(feeds["in0"], 0) + 1]


def _saved_case(message: str) -> tuple:
    match = SAVED.search(message)
    assert match, message
    return load_failure(match.group(1))


def test_a_failure_outside_hypothesis_names_its_saved_model(tmp_path):
    x = np.float32([-1.0, 2.0])
    model = node_model("Relu", [x])
    with pytest.raises(AssertionError) as caught:
        assert_matches_reference(model, [x], _run_reference=_off_by_one)
    assert f"model saved to {tmp_path / 'failures'}" in str(caught.value)
    saved, inputs = _saved_case(str(caught.value))
    assert saved == model
    np.testing.assert_array_equal(inputs[0], x)


def test_every_failing_example_is_saved_while_hypothesis_shrinks():
    messages = []

    @settings(max_examples=50, derandomize=True, database=None, deadline=None)
    @given(st.integers(0, 1000))
    def check(n):
        x = np.full(2, n, np.float32)
        try:
            assert_matches_reference(node_model("Relu", [x]), [x],
                                     _run_reference=_off_by_one if n >= 10 else None)
        except AssertionError as err:
            messages.append((n, str(err)))
            raise

    with pytest.raises(AssertionError) as caught:
        check()
    # Hypothesis shrinks to the least failing n, after failing on larger ones.
    assert messages[-1][0] == 10 and len({n for n, _ in messages}) > 1
    for n, message in messages:
        _, inputs = _saved_case(message)
        np.testing.assert_array_equal(inputs[0], np.full(2, n, np.float32))
    _, inputs = _saved_case(str(caught.value))
    np.testing.assert_array_equal(inputs[0], [10, 10])


def test_a_check_that_raises_is_saved_and_named_in_a_note():
    x = np.float32([1.0, 2.0])
    model = node_model("Relu", [x])
    model.graph.node[0].input[0] = "nowhere"
    with pytest.raises(ModelError) as caught:
        assert_matches_reference(model, [x], _run_reference=_off_by_one)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    saved, _ = _saved_case(notes)
    assert saved == model
