"""Softmax, LogSoftmax and softmax + loss patterns: fused vs op by op, finite differences,
near misses."""

import numpy as np
import pytest

from jaxort.graph import JaxGraph

from ._models import (BF16, F16, F32, F64, Builder, check_against_unfused,
                      check_finite_differences, rand)

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator


def _softmax_model(variant, shape, axis, dtype, opset=17):
    b = Builder(dtype)
    x = b.input("x", shape)
    if variant in ("Softmax", "LogSoftmax"):
        y = b.op(variant, x, axis=axis)
    else:
        d = b.op("Sub", x, b.reduce("ReduceMax", x, (axis,), opset))
        e = b.op("Exp", d)
        s = b.reduce("ReduceSum", e, (axis,), opset)
        y = b.op("Div", e, s) if variant == "written" else b.op("Sub", d, b.op("Log", s))
    return b.model([y], opset=opset)


PATTERN = {"Softmax": "softmax_op", "LogSoftmax": "softmax_op", "written": "softmax",
           "written_log": "softmax"}


@pytest.mark.parametrize("variant", sorted(PATTERN))
@pytest.mark.parametrize("shape,axis", [((4, 10), -1), ((2, 3, 7), 1), ((2, 3, 5), -1)])
def test_softmax_matches_op_by_op(variant, shape, axis):
    rng = np.random.default_rng(0)
    check_against_unfused(_softmax_model(variant, shape, axis, F32), [rand(rng, shape, F32, 3)],
                          [PATTERN[variant]])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("variant", ["Softmax", "written_log"])
def test_narrow_floats_match_op_by_op(variant, dtype):
    rng = np.random.default_rng(1)
    check_against_unfused(_softmax_model(variant, (3, 16), -1, dtype), [rand(rng, (3, 16), dtype)],
                          [PATTERN[variant]])


def test_opset_11_softmax_coerces_to_2d():
    rng = np.random.default_rng(2)
    check_against_unfused(_softmax_model("Softmax", (2, 3, 4), 1, F32, opset=11),
                          [rand(rng, (2, 3, 4))], ["softmax_op"])


@pytest.mark.parametrize("variant", sorted(PATTERN))
def test_softmax_gradients_match_finite_differences(variant):
    rng = np.random.default_rng(3)
    check_finite_differences(_softmax_model(variant, (3, 6), -1, F64), [rand(rng, (3, 6), F64)],
                             [PATTERN[variant]])


def _loss_model(variant, shape, dtype, reduction, ignore_index=None, log_prob=False):
    b = Builder(dtype)
    x = b.input("x", shape)
    labels = b.input("labels", (shape[0],) + tuple(shape[2:]), np.int64)
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    if variant == "sce":
        outs = b.op("SoftmaxCrossEntropyLoss", x, labels, n_out=2 if log_prob else 1, **attrs)
        outs = list(outs) if log_prob else [outs]
    else:
        outs = [b.op("NegativeLogLikelihoodLoss", b.op("LogSoftmax", x, axis=1), labels,
                     **attrs)]
    return b.model(outs)


LOSS_PATTERN = {"sce": "softmax_cross_entropy_op", "nll": "log_softmax_nll"}


def _labels(rng, shape, ignore_index):
    labels = rng.integers(0, shape[1], (shape[0],) + tuple(shape[2:])).astype(np.int64)
    if ignore_index is not None:
        labels.reshape(-1)[::3] = ignore_index
    return labels


@pytest.mark.parametrize("variant", sorted(LOSS_PATTERN))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape,ignore_index", [((6, 5), None), ((3, 4, 2), 1)])
def test_loss_matches_op_by_op(variant, reduction, shape, ignore_index):
    rng = np.random.default_rng(4)
    model = _loss_model(variant, shape, F32, reduction, ignore_index)
    check_against_unfused(model, [rand(rng, shape, F32, 2), _labels(rng, shape, ignore_index)],
                          [LOSS_PATTERN[variant]])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_loss_narrow_floats_match_op_by_op(dtype):
    rng = np.random.default_rng(5)
    model = _loss_model("sce", (8, 6), dtype, "mean")
    check_against_unfused(model, [rand(rng, (8, 6), dtype), _labels(rng, (8, 6), None)],
                          ["softmax_cross_entropy_op"])


def test_loss_with_log_prob_output_matches_op_by_op():
    rng = np.random.default_rng(6)
    model = _loss_model("sce", (5, 4), F32, "mean", log_prob=True)
    check_against_unfused(model, [rand(rng, (5, 4)), _labels(rng, (5, 4), None)],
                          ["softmax_cross_entropy_op"])


@pytest.mark.parametrize("variant", sorted(LOSS_PATTERN))
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_loss_gradients_match_finite_differences(variant, reduction):
    rng = np.random.default_rng(7)
    model = _loss_model(variant, (3, 4, 2), F64, reduction, ignore_index=2)
    check_finite_differences(model, [rand(rng, (3, 4, 2), F64), _labels(rng, (3, 4, 2), 2)],
                             [LOSS_PATTERN[variant]])


def test_weighted_loss_runs_op_by_op():
    rng = np.random.default_rng(8)
    b = Builder(F32)
    x = b.input("x", (6, 3))
    b.input("labels", (6,), np.int64)
    w = b.init("w", [0.5, 1.0, 2.0])
    loss = b.op("SoftmaxCrossEntropyLoss", x, "labels", w, reduction="mean")
    graph = JaxGraph(b.model([loss]), check=False)
    assert graph.fusions == ()
    xv, labels = rand(rng, (6, 3)), _labels(rng, (6, 3), None)
    x64 = xv.astype(np.float64)
    lp = x64 - x64.max(1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(1, keepdims=True))
    wv = np.array([0.5, 1.0, 2.0])[labels]
    ref = -(lp[np.arange(6), labels] * wv).sum() / wv.sum()
    np.testing.assert_allclose(float(graph.apply(graph.params, xv, labels)[0]), ref, rtol=1e-5)


def test_log_softmax_used_elsewhere_is_not_fused_with_the_loss():
    rng = np.random.default_rng(9)
    b = Builder(F32)
    x = b.input("x", (6, 3))
    b.input("labels", (6,), np.int64)
    lp = b.op("LogSoftmax", x, axis=1)
    loss = b.op("NegativeLogLikelihoodLoss", lp, "labels", reduction="mean")
    model = b.model([loss, lp])
    graph = JaxGraph(model, check=False)
    assert [p for p, _ in graph.fusions] == ["softmax_op"]
    xv, labels = rand(rng, (6, 3)), _labels(rng, (6, 3), None)
    out, lpv = graph.apply(graph.params, xv, labels)
    x64 = xv.astype(np.float64)
    ref_lp = x64 - np.log(np.exp(x64).sum(1, keepdims=True))
    np.testing.assert_allclose(np.asarray(lpv), ref_lp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(out), -ref_lp[np.arange(6), labels].mean(), rtol=1e-5)
    check_against_unfused(model, [xv, labels], ["softmax_op"])


def test_softmax_written_with_different_axes_is_not_fused():
    rng = np.random.default_rng(10)
    b = Builder(F32)
    x = b.input("x", (3, 4))
    e = b.op("Exp", b.op("Sub", x, b.op("ReduceMax", x, axes=[1])))
    y = b.op("Div", e, b.op("ReduceSum", e, b.const([0], np.int64)))
    graph = JaxGraph(b.model([y]), check=False)
    assert graph.fusions == ()
    xv = rand(rng, (3, 4)).astype(np.float64)
    ev = np.exp(xv - xv.max(1, keepdims=True))
    np.testing.assert_allclose(np.asarray(graph.apply(graph.params, xv.astype(F32))[0]),
                               ev / ev.sum(0, keepdims=True), rtol=1e-5)
