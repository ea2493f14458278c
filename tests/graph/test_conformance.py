"""ONNX backend node cases of the core ops (``CORE_OPS``) through ``jaxort.backend``.

One test per op runs all of that op's cases in this process (one JAX start-up
for the whole file, cases collected once) and asserts that they all passed.
``make conformance`` runs every case that ships with onnx, each in a worker
process under a time limit.
"""

import collections

import numpy as np

import onnx
import pytest

from jaxort.testing import conformance

# Cases of core ops that cannot pass, with the reason. Keep this empty unless the
# reason is outside jaxort's reach. (Dropout's training cases, whose files hold
# numpy's draw, pass by their properties: see conformance.check_random_outputs.)
EXPECTED_FAILURES: dict[str, str] = {}

# onnx < 1.17 ships cases whose expected data later onnx releases corrected.
if tuple(int(v) for v in onnx.__version__.split(".")[:2]) < (1, 17):
    _TRUNCATED_BF16 = ("onnx 1.16's expected data truncates float32 to bfloat16; the spec "
                       "(and later onnx data) rounds to nearest even, as jaxort does")
    _INT4_RANGE = ("onnx 1.16's data saturates out-of-range int4 values (-9 -> -8); later onnx "
                   "data gives 0 there, as jaxort does")
    EXPECTED_FAILURES.update({
        "test_gemm_default_no_bias": "onnx 1.16's case declares a float64 output for float32 inputs",
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True":
            "onnx 1.16's expected data predates the fix of dilated ceil-mode average pooling",
        "test_cast_FLOAT_to_BFLOAT16": _TRUNCATED_BF16,
        "test_castlike_FLOAT_to_BFLOAT16": _TRUNCATED_BF16,
        "test_castlike_FLOAT_to_BFLOAT16_expanded": _TRUNCATED_BF16,
        "test_cast_FLOAT_to_INT4": _INT4_RANGE,
        "test_cast_FLOAT16_to_INT4": _INT4_RANGE,
    })


@pytest.fixture(scope="module")
def cases_by_op():
    by_op = collections.defaultdict(list)
    for case in conformance.collect_cases(conformance.CORE_OPS):
        by_op[conformance.case_op_type(case)].append(case)
    return by_op


# A hang is a bug: it fails the op's test instead of stalling the suite.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("op_type", conformance.CORE_OPS)
def test_all_cases_pass(cases_by_op, op_type):
    cases = cases_by_op[op_type]
    assert cases, f"onnx ships no node case for {op_type}"
    results = conformance.run_in_process(cases)
    failed = {name: msg for name, (ok, msg) in results.items()
              if not ok and name not in EXPECTED_FAILURES}
    assert not failed, f"{len(failed)}/{len(cases)} {op_type} cases failed: {failed}"


# The training-mode Dropout cases' files hold numpy's RandomState(0) mask.
_NUMPY_DRAWS = {"test_training_dropout", "test_training_dropout_default",
                "test_training_dropout_default_mask", "test_training_dropout_mask"}


def test_random_cases_pass_by_property_only_where_the_file_holds_numpys_draw():
    cases = conformance.collect_cases(["Bernoulli", "Dropout"])
    results = conformance.run_in_process(cases)
    assert all(ok for ok, _ in results.values()), {n: m for n, (ok, m) in results.items() if not ok}
    by_property = {n for n, (_, msg) in results.items() if msg == conformance.BY_PROPERTY}
    assert _NUMPY_DRAWS <= by_property
    # Deterministic cases (inference mode, ratio 0) still pass by equality.
    assert "test_dropout_default" in results and "test_dropout_default" not in by_property


def test_worker_processes_check_an_expanded_bernoulli_by_property_too():
    # A worker process never collects the cases, so it learns from its caller that
    # test_bernoulli_expanded (RandomUniformLike, Less, Cast) tests Bernoulli.
    cases = [c for c in conformance.collect_cases(["Bernoulli"]) if c.name == "test_bernoulli_expanded"]
    results = conformance.run_all(cases, timeout=300, jobs=1, progress=False)
    assert results == {"test_bernoulli_expanded": (True, conformance.BY_PROPERTY)}


def _case(name):
    (case,) = [c for c in conformance.collect_cases(["Dropout", "Bernoulli"]) if c.name == name]
    inputs, expected = next(conformance._data_sets(case))
    return case, inputs, expected


def test_property_check_catches_a_dropout_without_its_scale():
    case, inputs, expected = _case("test_training_dropout_mask")
    x, ratio = np.asarray(inputs[0]), float(inputs[1])
    rng = np.random.default_rng(0)
    mask = rng.random(x.shape) >= ratio
    right = [np.where(mask, x / (1 - ratio), 0).astype(x.dtype), mask]
    conformance.check_random_outputs(case.model, inputs, expected, right, case.rtol, case.atol)
    unscaled = [np.where(mask, x, 0).astype(x.dtype), mask]
    with pytest.raises(AssertionError, match="x \\* mask / \\(1 - ratio\\)"):
        conformance.check_random_outputs(case.model, inputs, expected, unscaled, case.rtol, case.atol)
    nothing_dropped = [(x / (1 - ratio)).astype(x.dtype), np.ones(x.shape, bool)]
    with pytest.raises(AssertionError, match="six standard deviations"):
        conformance.check_random_outputs(
            case.model, inputs, expected, nothing_dropped, case.rtol, case.atol)
    wrong_dtype = [right[0].astype(np.float64), mask]
    with pytest.raises(AssertionError, match="dtype"):
        conformance.check_random_outputs(case.model, inputs, expected, wrong_dtype, case.rtol, case.atol)


def test_property_check_catches_an_invalid_bernoulli_draw():
    case, inputs, expected = _case("test_bernoulli")
    p = np.asarray(inputs[0], np.float64)
    dtype = np.asarray(expected[0]).dtype
    draw = (np.random.default_rng(1).random(p.shape) < p).astype(dtype)
    conformance.check_random_outputs(case.model, inputs, expected, [draw], case.rtol, case.atol)
    with pytest.raises(AssertionError, match="other than 0 and 1"):
        conformance.check_random_outputs(
            case.model, inputs, expected, [(draw * 2).astype(dtype)], case.rtol, case.atol)
    halves = [np.full(400, 0.5, p.dtype)]
    with pytest.raises(AssertionError, match="six standard deviations"):
        conformance.check_random_outputs(
            case.model, halves, [np.zeros(400, dtype)], [np.ones(400, dtype)], 0, 0)
    certain = [np.array([0.0, 1.0, 0.5], p.dtype)]
    certain_expected = [np.zeros(3, dtype)]
    with pytest.raises(AssertionError, match="probability is 1"):
        conformance.check_random_outputs(
            case.model, certain, certain_expected, [np.array([0, 0, 1], dtype)], 0, 0)
