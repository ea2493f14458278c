"""Reductions and ArgMax/ArgMin (ops/reduce.py) against ONNX's reference evaluator.
Differentiable ops get finite-difference gradient checks in float64; ReduceMean is
also compared with ONNX Runtime.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.errors import OpError
from jaxort.graph import JaxGraph
from jaxort.testing import assert_outputs_match, run_jaxort, run_reference

from ._harness import (
    F16, F32, F64, GRAD_X, I32, I64, OLD_REFERENCE, ONNX_OPSET, OpCase, example, named_gradient_test,
    run_onnxruntime, table_tests
)

REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
COVERED_OPS = {*REDUCE_OPS, "ArgMax", "ArgMin"}


def _values(rng, shape, dtype, *, positive=False):
    if np.dtype(dtype).kind in "iu":
        lo = 1 if positive else -4
        return rng.integers(lo, 5, size=shape).astype(dtype)
    x = rng.standard_normal(shape)
    if positive:
        x = np.abs(x) + 0.1
    return x.astype(dtype)


# op -> (dtypes, positive values, allows empty reductions)
_REDUCE = {
    "ReduceSum": ((F32, F64, F16, I32, I64), False, True),
    "ReduceMean": ((F32, F64, F16, I32), False, False),
    "ReduceMax": ((F32, F64, F16, I32, I64), False, True),
    "ReduceMin": ((F32, F64, F16, I32, I64), False, True),
    "ReduceProd": ((F32, F64, I32), False, True),
    "ReduceL1": ((F32, F64, F16, I32), False, True),
    "ReduceL2": ((F32, F64, F16), False, True),
    "ReduceLogSum": ((F32, F64), True, True),
    "ReduceLogSumExp": ((F32, F64, F16), False, True),
    "ReduceSumSquare": ((F32, F64, F16, I64), False, True),
}


@st.composite
def reduce_example(draw, op):
    dtypes, positive, empty_ok = _REDUCE[op]
    dtype = draw(st.sampled_from(dtypes))
    # ONNX's reference ReduceLogSumExp-1 fails on 0-d inputs.
    rank = draw(st.integers(1 if op == "ReduceLogSumExp" else 0, 4))
    shape = tuple(draw(st.lists(st.integers(0 if empty_ok else 1, 4), min_size=rank,
                                max_size=rank)))
    seed = draw(st.integers(0, 2**16))
    x = _values(np.random.default_rng(seed), shape, dtype, positive=positive)
    axes = draw(st.lists(st.integers(0, max(rank - 1, 0)), unique=True, max_size=rank))
    axes = [a - rank if draw(st.booleans()) else a for a in axes] if rank else []
    keepdims = draw(st.integers(0, 1))
    input_since = 13 if op == "ReduceSum" else 18
    new_form = draw(st.booleans())
    if not new_form:
        attrs = {"keepdims": keepdims}
        if axes:
            attrs["axes"] = axes
        return example(op, [x], attrs, opset=draw(st.sampled_from([11, input_since - 1])))
    attrs = {"keepdims": keepdims, "noop_with_empty_axes": draw(st.integers(0, 1))}
    if OLD_REFERENCE and not axes:  # onnx < 1.17's reference gets the no-op wrong (test below)
        attrs["noop_with_empty_axes"] = 0
    opset = ONNX_OPSET if dtype.kind == "f" else 20
    if not axes and draw(st.booleans()):
        return example(op, [x], attrs, opset=opset)
    return example(op, [x, np.asarray(axes, np.int64)], attrs, opset=opset, constants=(1,))


@st.composite
def arg_example(draw, op):
    dtype = draw(st.sampled_from([F32, F64, F16, I32]))
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.integers(-2, 3, size=shape).astype(dtype)  # small range: ties exercise select_last
    attrs = {"axis": draw(st.integers(-rank, rank - 1)), "keepdims": draw(st.integers(0, 1)),
             "select_last_index": draw(st.integers(0, 1))}
    return example(op, [x], attrs, opset=13)


CASES = (
    [OpCase(op, reduce_example(op)) for op in REDUCE_OPS]
    + [OpCase("ArgMax", arg_example("ArgMax")), OpCase("ArgMin", arg_example("ArgMin"))]
)


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS, equal_nan=True)


# --------------------------------------------------------------------------- gradients


GRAD_CASES = {
    "ReduceSum": example("ReduceSum", [GRAD_X, np.asarray([1], np.int64)], {"keepdims": 0},
                         constants=(1,)),
    "ReduceMean": example("ReduceMean", [GRAD_X, np.asarray([0, 2], np.int64)],
                          constants=(1,)),
    "ReduceMax": example("ReduceMax", [GRAD_X, np.asarray([-1], np.int64)], constants=(1,)),
    "ReduceMin": example("ReduceMin", [GRAD_X], {"keepdims": 0}),
    "ReduceProd": example("ReduceProd", [GRAD_X, np.asarray([2], np.int64)], constants=(1,)),
    "ReduceL1": example("ReduceL1", [GRAD_X, np.asarray([1], np.int64)], constants=(1,)),
    "ReduceL2": example("ReduceL2", [GRAD_X, np.asarray([1], np.int64)], constants=(1,)),
    "ReduceLogSum": example("ReduceLogSum", [np.abs(GRAD_X) + 0.5, np.asarray([1], np.int64)],
                            constants=(1,)),
    "ReduceLogSumExp": example("ReduceLogSumExp", [GRAD_X * 10, np.asarray([0, 1], np.int64)],
                               constants=(1,)),
    "ReduceSumSquare": example("ReduceSumSquare", [GRAD_X], {"keepdims": 1}),
}

test_gradient_matches_finite_differences = named_gradient_test(GRAD_CASES)


# --------------------------------------------------------------------------- specific behaviour


def test_reduce_mean_loss_matches_onnxruntime():
    x = np.random.default_rng(3).standard_normal((32, 5)).astype(np.float32) ** 2
    ex = example("ReduceMean", [x], {"keepdims": 0}, opset=17)
    (expected,) = run_onnxruntime(ex.model(), ex.feeds)
    (got,) = run_jaxort(ex)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_empty_set_reductions_give_identities():
    x = np.zeros((2, 0, 3), np.float32)
    axes = np.asarray([1], np.int64)
    expected = {"ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceSum": 0.0, "ReduceProd": 1.0,
                "ReduceLogSumExp": -np.inf, "ReduceLogSum": -np.inf}
    for op, value in expected.items():
        (got,) = run_jaxort(example(op, [x, axes], {"keepdims": 1}, constants=(1,)))
        assert got.shape == (2, 1, 3) and got.dtype == np.float32
        np.testing.assert_array_equal(got, np.full((2, 1, 3), value, np.float32))
    (got,) = run_jaxort(example("ReduceMax", [np.zeros((0, 2), np.int32)], {"keepdims": 0}))
    np.testing.assert_array_equal(got, np.zeros((), np.int32) + np.iinfo(np.int32).min)


def test_noop_with_empty_axes_returns_input():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,) = run_jaxort(example("ReduceSum", [x, np.zeros((0,), np.int64)],
                                {"noop_with_empty_axes": 1}, constants=(1,)))
    np.testing.assert_array_equal(got, x)


def test_float32_reductions_stay_float32_without_x64():
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    for op in REDUCE_OPS:
        ex = example(op, [np.abs(x) + 0.1, np.asarray([1], np.int64)], constants=(1,))
        g = JaxGraph(ex.model(), check=False, params=[])
        with jax.numpy_dtype_promotion("strict"):
            (out,) = jax.jit(g.apply)(g.params, *ex.args)
        assert out.dtype == np.float32, op


def test_traced_axes_input_names_the_node():
    x = np.ones((2, 3), np.float32)
    ex = example("ReduceSum", [x, np.asarray([1], np.int64)])
    g = JaxGraph(ex.model(), check=False, params=[])
    with pytest.raises(OpError, match=r"ReduceSum .*input 'axes' must be known at trace time"):
        jax.jit(g.apply)(g.params, *ex.args)


def test_argmax_returns_int64_with_x64():
    x = np.asarray([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], np.float32)
    (got,) = run_jaxort(example("ArgMax", [x], {"axis": 1, "select_last_index": 1}))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [[2], [2]])


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("shape", [(), (2, 3)])
def test_noop_with_empty_axes_still_takes_the_non_reduction_steps(op, shape):
    """Reducing over no axis: ReduceLogSum gives log(x), ReduceSumSquare x * x, ReduceL1 |x|."""
    if op == "ReduceLogSumExp" and not shape:
        pytest.skip("ONNX's reference ReduceLogSumExp-18 fails on 0-d inputs")
    if OLD_REFERENCE:
        pytest.skip("onnx < 1.17's reference returns the input as it is instead")
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    for axes in (None, np.zeros((0,), np.int64)):
        ex = example(op, [x, axes], {"keepdims": 1, "noop_with_empty_axes": 1}, opset=18,
                     constants=(1,))
        assert_outputs_match(run_jaxort(ex), run_reference(ex))
