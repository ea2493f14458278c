"""QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear (ops/quantize.py) against
ONNX's reference evaluator.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

from ._harness import Example, F16, F32, HAS_INT4, elem_type, folded_case, table_tests
from ._strategies import FLOAT8, arrays

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

COVERED_OPS = {
    "DequantizeLinear", "DynamicQuantizeLinear", "QuantizeLinear",
}


QTYPES = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16)
               + ((ml_dtypes.uint4, ml_dtypes.int4) if HAS_INT4 else ()))


@st.composite
def _quant_layout(draw):
    """(x shape, scale shape, axis, block_size) for per-tensor, per-axis or blocked."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    kind = draw(st.sampled_from(("tensor", "axis", "block")))
    a = axis % len(shape)
    if kind == "tensor":
        return shape, (), axis, 0
    if kind == "axis":
        return shape, (shape[a],), axis, 0
    block = draw(st.integers(1, max(1, shape[a])))
    sshape = list(shape)
    sshape[a] = -(-shape[a] // block)
    return shape, tuple(sshape), axis, block


@st.composite
def quantize_strategy(draw):
    shape, sshape, axis, block = draw(_quant_layout())
    qt = draw(st.sampled_from(QTYPES + FLOAT8[:1] + FLOAT8[2:3]))
    x = draw(arrays(F32, shape, -300, 300))
    scale = draw(arrays(F32, sshape, 0.5, 4))
    attrs = {"axis": axis, "block_size": block}
    if qt in FLOAT8:
        return Example((x, scale, np.zeros(sshape, qt)), dict(attrs, saturate=1))
    if draw(st.booleans()):
        info = ml_dtypes.iinfo(qt)
        zp = draw(arrays(np.dtype(np.int64), sshape, int(info.min), int(info.max))).astype(qt)
        return Example((x, scale, zp), attrs)
    return Example((x, scale), dict(attrs, output_dtype=elem_type(qt)))


@st.composite
def dequantize_strategy(draw):
    shape, sshape, axis, block = draw(_quant_layout())
    qt = draw(st.sampled_from(QTYPES + (np.dtype(np.int32),)))
    info = ml_dtypes.iinfo(qt)
    lo, hi = max(int(info.min), -1000), min(int(info.max), 1000)
    x = draw(arrays(np.dtype(np.int64), shape, lo, hi)).astype(qt)
    sdt = draw(st.sampled_from((F32, F16)))
    scale = draw(arrays(sdt, sshape, 0.01, 2))
    attrs = {"axis": axis, "block_size": block}
    if qt != np.int32 and draw(st.booleans()):
        zp = draw(arrays(np.dtype(np.int64), sshape, lo, hi)).astype(qt)
        return Example((x, scale, zp), attrs)
    return Example((x, scale), attrs)


@st.composite
def dynamic_quantize_strategy(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=5))
    lo = draw(st.sampled_from((-10.0, 0.5)))
    hi = draw(st.sampled_from((-0.5, 10.0)))
    return Example((draw(arrays(F32, shape, min(lo, hi), max(lo, hi))),), {}, n_out=3)

CASES = [
    folded_case("QuantizeLinear", quantize_strategy()),
    folded_case("DequantizeLinear", dequantize_strategy(), scale=2),
    folded_case("DynamicQuantizeLinear", dynamic_quantize_strategy()),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS, equal_nan=True)
