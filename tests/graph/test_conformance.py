"""ONNX backend node cases of the core ops (``CORE_OPS``) through ``jaxort.backend``.

One test per op runs all of that op's cases in this process (one JAX start-up
for the whole file, cases collected once) and asserts that they all passed.
``make conformance`` runs every case that ships with onnx, each in a worker
process under a time limit.
"""

import collections

import onnx
import pytest

from jaxort.testing import conformance

# Cases of core ops that cannot pass, with the reason. Keep this empty unless the
# reason is outside jaxort's reach.
_NUMPY_RNG = (
    "the expected output comes from numpy's RandomState(0) dropout mask; JAX's PRNG "
    "draws a different, equally valid mask (the ops' own tests check the statistics)")
EXPECTED_FAILURES: dict[str, str] = {
    "test_training_dropout": _NUMPY_RNG,
    "test_training_dropout_default": _NUMPY_RNG,
    "test_training_dropout_default_mask": _NUMPY_RNG,
    "test_training_dropout_mask": _NUMPY_RNG,
}

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
