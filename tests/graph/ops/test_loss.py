"""SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (ops/loss.py) against ONNX's
reference evaluator, finite differences and ONNX Runtime.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.testing import run_jaxort

from ._harness import (
    F32, F64, GRAD_X, I32, I64, OpCase, example, named_gradient_test, run_onnxruntime, table_tests,
    weighted_gradient
)

COVERED_OPS = {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"}


@st.composite
def loss_parts(draw):
    dtype = draw(st.sampled_from([F32, F64]))
    n, c = draw(st.integers(1, 3)), draw(st.integers(2, 5))
    extra = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((n, c) + extra).astype(dtype)
    labels = rng.integers(0, c, size=(n,) + extra).astype(draw(st.sampled_from([I32, I64])))
    weight = rng.uniform(0.2, 2.0, size=(c,)).astype(dtype) if draw(st.booleans()) else None
    attrs = {"reduction": draw(st.sampled_from(["none", "sum", "mean"]))}
    if draw(st.booleans()):
        ii = draw(st.sampled_from([0, 1, -1, -100]))
        attrs["ignore_index"] = ii
        if ii < 0 and labels.size > 1:
            labels.reshape(-1)[0] = ii
    return x, labels, weight, attrs


@st.composite
def sce_example(draw):
    x, labels, weight, attrs = draw(loss_parts())
    n_out = draw(st.integers(1, 2))
    return example("SoftmaxCrossEntropyLoss", [x, labels, weight], attrs, opset=13, n_out=n_out)


@st.composite
def nll_example(draw):
    x, labels, weight, attrs = draw(loss_parts())
    return example("NegativeLogLikelihoodLoss", [x, labels, weight], attrs, opset=13)


CASES = [OpCase("SoftmaxCrossEntropyLoss", sce_example(), 2.0),
         OpCase("NegativeLogLikelihoodLoss", nll_example())]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS, equal_nan=True)


# --------------------------------------------------------------------------- gradients


GRAD_CASES = {
    "SoftmaxCrossEntropyLoss": example(
        "SoftmaxCrossEntropyLoss",
        [GRAD_X, np.asarray([[0, 3, 1, 2, 0], [1, 1, 2, 3, 0], [3, 2, 1, 0, 0]], np.int64),
         np.asarray([0.5, 1.0, 2.0, 1.5])], {"reduction": "mean", "ignore_index": 2},
        opset=13),
    "NegativeLogLikelihoodLoss": example(
        "NegativeLogLikelihoodLoss",
        [GRAD_X, np.asarray([[0, 3, 1, 2, 0], [1, 1, 2, 3, 0], [3, 2, 1, 0, 0]], np.int64),
         np.asarray([0.5, 1.0, 2.0, 1.5])], {"reduction": "mean"}, opset=13),
    "SoftmaxCrossEntropyLoss-sum": example(
        "SoftmaxCrossEntropyLoss",
        [GRAD_X[:, :, 0], np.asarray([0, 3, 1], np.int64)], {"reduction": "sum"}, opset=13),
}

test_gradient_matches_finite_differences = named_gradient_test(GRAD_CASES)


def test_loss_gradient_flows_to_weights():
    ex = GRAD_CASES["NegativeLogLikelihoodLoss"]
    weighted_gradient(ex, (2,))


# --------------------------------------------------------------------------- ONNX Runtime


@pytest.mark.parametrize("form", ["plain", "weights_ignore", "nd"])
def test_softmax_cross_entropy_matches_onnxruntime(form):
    rng = np.random.default_rng(7)
    if form == "nd":
        x = rng.standard_normal((4, 6, 3, 2)).astype(np.float32)
        y = rng.integers(0, 6, size=(4, 3, 2)).astype(np.int64)
    else:
        x = (rng.standard_normal((16, 10)) * 3).astype(np.float32)
        y = rng.integers(0, 10, size=(16,)).astype(np.int64)
    inputs = [x, y]
    attrs = {"reduction": "mean"}
    if form == "weights_ignore":
        inputs.append(rng.uniform(0.5, 2, size=(10,)).astype(np.float32))
        attrs["ignore_index"] = 3
    ex = example("SoftmaxCrossEntropyLoss", inputs, attrs, opset=17, n_out=2)
    expected = run_onnxruntime(ex.model(), ex.feeds)
    got = run_jaxort(ex)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
