"""Cast, CastLike and BitCast (ops/cast.py) against ONNX's reference evaluator.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st
from onnx import TensorProto

from jaxort.errors import OpError
from jaxort.graph import JaxGraph, x64_enabled_scope
from jaxort.testing import NodeCase, assert_outputs_match, run_jaxort, run_reference

from ._harness import (
    BF16, BOOL, Example, F16, F32, F64, HAS_BF16, HAS_FLOAT8, HAS_FLOAT8E8M0, HAS_INT4, elem_type,
    folded_case, require_dtypes, require_opset, run1, table_tests
)
from ._strategies import CAST_NUMERIC, FLOAT8, arrays, shapes

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

COVERED_OPS = {
    "BitCast", "Cast", "CastLike",
}


def _cast_values(draw, src, dst, shape):
    """Values of ``src`` whose conversion to ``dst`` is defined by the spec."""
    if src == BOOL:
        return draw(arrays(BOOL, shape))
    lo, hi = -100.0, 100.0
    if dst.kind == "u" or src.kind == "u":
        lo = 0.0
    if dst in FLOAT8:
        lo, hi = -1000.0, 1000.0  # past the float8 range: saturates
        if "fnuz" in dst.name or "e4m3" in dst.name:
            lo, hi = -400.0, 400.0
    x = draw(arrays(src, shape, lo, hi))
    if src.kind == "f" and dst.kind in "iu":
        x = np.trunc(x).astype(src)  # keep float -> int away from rounding-mode differences
    return x


@st.composite
def cast_strategy(draw, like=False):
    src = draw(st.sampled_from(CAST_NUMERIC))
    dst = draw(st.sampled_from(CAST_NUMERIC + FLOAT8))
    if dst in FLOAT8 and src not in (F32, F16):
        src = F32
    x = _cast_values(draw, src, dst, draw(shapes))
    attrs = {}
    if dst in FLOAT8:
        attrs["saturate"] = 1
    if like:
        return Example((x, np.zeros((0,), dst)), attrs)
    return Example((x,), dict(attrs, to=elem_type(dst)))


@st.composite
def cast_string_strategy(draw):
    if draw(st.booleans()):  # numbers -> strings
        dt = draw(st.sampled_from((F32, F64, np.dtype(np.int32), np.dtype(np.int64),
                                   np.dtype(np.uint8))))
        x = draw(arrays(dt, draw(shapes), 0, 100))
        return Example((x,), {"to": TensorProto.STRING})
    dt = draw(st.sampled_from((F32, F64, np.dtype(np.int32), np.dtype(np.int64))))
    vals = draw(hnp.arrays(np.int64, draw(shapes), elements=st.integers(-500, 500)))
    if dt.kind == "f":
        strs = np.array([str(v / 4) for v in vals.reshape(-1)], dtype=object).reshape(vals.shape)
    else:
        strs = np.array([str(v) for v in vals.reshape(-1)], dtype=object).reshape(vals.shape)
    return Example((strs,), {"to": elem_type(dt)})


@st.composite
def bitcast_strategy(draw):
    groups = [
        (np.dtype(np.int8), np.dtype(np.uint8)),
        (np.dtype(np.int16), np.dtype(np.uint16), F16) + ((BF16,) if HAS_BF16 else ()),
        (np.dtype(np.int32), np.dtype(np.uint32), F32),
        (np.dtype(np.int64), np.dtype(np.uint64), F64),
    ]
    group = draw(st.sampled_from(groups))
    src, dst = draw(st.sampled_from(group)), draw(st.sampled_from(group))
    bits = np.dtype(f"u{src.itemsize}")
    raw = draw(hnp.arrays(bits, draw(shapes)))
    x = raw.view(src)
    if src.kind == "f" or src == BF16:  # keep NaN payloads out: XLA may canonicalize them
        x = np.where(np.isnan(x.astype(np.float32)), np.zeros((), src), x).astype(src)
    return Example((x,), {"to": elem_type(dst)})

CASES = [
    folded_case("Cast", cast_strategy()),
    folded_case("Cast", cast_string_strategy(), id="Cast-string", static_only=True),
    folded_case("CastLike", cast_strategy(like=True)),
    folded_case("BitCast", bitcast_strategy(), bits=True, min_opset=26),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS, equal_nan=True)


def test_cast_float_gradient_is_identity():
    x = np.array([1.0, -2.0, 3.5], np.float32)
    g = JaxGraph(NodeCase("Cast", (x,), {"to": TensorProto.DOUBLE}).model(), check=False)
    with x64_enabled_scope():
        grad = jax.grad(lambda v: g.apply({}, v)[0].sum())(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(grad), np.ones(3, np.float32))


def test_cast_1_type_name():
    x = np.array([1.5, -2.25], np.float32)
    model = NodeCase("Cast", (x,), {"to": "FLOAT16"}, opset=1)
    out = run_jaxort(model)[0]
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, x.astype(np.float16))


@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_float8_saturation(saturate):
    require_dtypes(HAS_FLOAT8, "float8 types")
    x = np.array([1e6, -1e6, np.inf, -np.inf, np.nan, 0.3], np.float32)
    for dt in FLOAT8:
        model = NodeCase("Cast", (x,), {"to": elem_type(dt), "saturate": saturate})
        expected = run_reference(model)
        assert_outputs_match(run_jaxort(model), expected)


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
def test_cast_float8e8m0(round_mode):
    require_opset("Cast to FLOAT8E8M0 with round_mode", 24)
    require_dtypes(HAS_FLOAT8E8M0, "float8_e8m0fnu")
    x = np.array([0.0, 0.124, 0.25, 0.5, 1.1, 1.5, 2.0, 3.0, 4.0, 8.0, 1e38], np.float32)
    attrs = {"to": TensorProto.FLOAT8E8M0, "round_mode": round_mode}
    model = NodeCase("Cast", (x,), attrs)
    expected = run_reference(model)
    assert_outputs_match(run_jaxort(model), expected, bits=True)


def test_cast_subbyte_ints_out_of_range_give_zero():
    require_dtypes(HAS_INT4, "int4/uint4")
    x = np.arange(-10, 17, dtype=np.float32)
    for dt in (ml_dtypes.int4, ml_dtypes.uint4):
        model = NodeCase("Cast", (x,), {"to": elem_type(dt)})
        assert_outputs_match(run_jaxort(model), run_reference(model))


def test_cast_to_string_of_traced_value_names_the_node():
    x = np.ones(3, np.float32)
    with pytest.raises(OpError, match="Cast"):
        run1("Cast", (x,), {"to": TensorProto.STRING}, jit=True)


def test_bitcast_to_another_width_raises_op_error():
    require_opset("BitCast", 26)
    with pytest.raises(OpError, match="width"):
        run1("BitCast", (np.ones(3, np.float32),), {"to": TensorProto.INT64})
