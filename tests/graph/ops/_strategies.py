"""Drawing helpers the op test modules share: elementwise arrays and shapes,
nn-style arrays and convolution geometry, tensor-style values and sizes."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from ._harness import BF16, BOOL, Example, F16, F32, F64, HAS_BF16, HAS_FLOAT8, U8

FLOATS = (F32, F64, F16) + ((BF16,) if HAS_BF16 else ())


SINTS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))


UINTS = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))


INTS = SINTS + UINTS


@st.composite
def arrays(draw, dtype, shape, lo=-5.0, hi=5.0, avoid=None, gap=0.1):
    """An array of ``dtype``; floats in [lo, hi] drawn in float64 then cast.

    ``avoid``: keep values at least ``gap`` away from this point (poles, kinks).
    """
    dt = np.dtype(dtype)
    if dt == BOOL:
        return draw(hnp.arrays(BOOL, shape))
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo_i, hi_i = max(int(lo), int(info.min)), min(int(hi), int(info.max))
        x = draw(hnp.arrays(dt, shape, elements=st.integers(lo_i, hi_i)))
        if avoid is not None:
            x = np.where(x == int(avoid), np.array(hi_i if int(avoid) != hi_i else lo_i, dt), x)
        return x
    x = draw(hnp.arrays(F64, shape, elements=st.floats(lo, hi, allow_nan=False)))
    if avoid is not None:
        near = np.abs(x - avoid) < gap
        x = np.where(near, avoid + np.where(x >= avoid, 1, -1) * 2 * gap, x)
    x = x.astype(dt)
    # XLA on CPU flushes subnormals to zero and numpy does not (numpy's Ceil of
    # 6e-41 is 1): they are drawn as zero, as jaxort.testing.strategies does.
    tiny = float(ml_dtypes.finfo(dt).tiny)
    return np.where(np.abs(x.astype(np.float64)) < tiny, np.zeros((), dt), x)


shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


def unary(dtypes=FLOATS, lo=-5.0, hi=5.0, attrs=st.just({}), avoid=None, opset=None,
          shape_strategy=shapes):
    @st.composite
    def strat(draw):
        dt = draw(st.sampled_from(dtypes))
        x = draw(arrays(dt, draw(shape_strategy), lo, hi, avoid))
        return Example((x,), draw(attrs), opset)

    return strat()


def binary(dtypes=FLOATS, lo=-5.0, hi=5.0, lo2=None, hi2=None, avoid2=None, attrs=st.just({}),
           opset=None):
    @st.composite
    def strat(draw):
        dt = draw(st.sampled_from(dtypes))
        (sa, sb), _ = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3,
                                                              max_side=4))
        a = draw(arrays(dt, sa, lo, hi))
        b = draw(arrays(dt, sb, lo if lo2 is None else lo2, hi if hi2 is None else hi2, avoid2))
        return Example((a, b), draw(attrs), opset)

    return strat()


def variadic(dtypes=FLOATS, lo=-5.0, hi=5.0, first_is_full=False):
    """``first_is_full``: the first input has the broadcast shape (the reference's
    Mean accumulates in place into it)."""

    @st.composite
    def strat(draw):
        dt = draw(st.sampled_from(dtypes))
        n = draw(st.integers(1, 4))
        shp, full = draw(hnp.mutually_broadcastable_shapes(num_shapes=n, max_dims=3,
                                                            max_side=4))
        if first_is_full:
            shp = (full,) + tuple(shp[1:])
        return Example(tuple(draw(arrays(dt, s, lo, hi)) for s in shp), {})

    return strat()


def float_attr(lo, hi):
    return st.floats(lo, hi).map(lambda v: float(np.float32(v)))


CAST_NUMERIC = FLOATS + INTS + (BOOL,)


FLOAT8_ALL = tuple(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
                                         ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz))


FLOAT8 = FLOAT8_ALL if HAS_FLOAT8 else ()


def away(x, points, gap=0.05):
    for p in points:
        x = np.where(np.abs(x - p) < gap, p + np.sign(x - p + 1e-12) * 2 * gap, x)
    return x


def uniform(shape, lo=-2.0, hi=2.0, kinks=(), seed=0):
    rng = np.random.default_rng(seed)
    return away(rng.uniform(lo, hi, shape), kinks)


NUMERIC = FLOATS + INTS
REF_F32 = (1e-6, 1e-7)  # the reference computes in float32 even for float64 inputs


# --------------------------------------------------------------------------- nn-style


def arr(draw, dtype, shape, lo=-2.0, hi=2.0):
    """An array of ``dtype``; floats drawn on a coarse grid (robust to ties and rounding)."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo_i, hi_i = max(int(lo), int(info.min)), min(int(hi), int(info.max))
        return draw(hnp.arrays(dt, shape, elements=st.integers(lo_i, hi_i)))
    seed = draw(st.integers(0, 2**32 - 1))
    x = np.random.default_rng(seed).uniform(lo, hi, size=shape)
    return x.astype(dt)


def floats(draw, dtypes=(F32, F64)):
    return draw(st.sampled_from(dtypes))


def conv_geometry(draw, nd, max_stride=2, max_dil=2, auto=True, pool=False):
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, max_stride)) for _ in range(nd)]
    dil = [draw(st.integers(1, max_dil)) for _ in range(nd)]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    size = [e + draw(st.integers(0, 3)) for e in eff]
    attrs = dict(kernel_shape=kernel, strides=strides, dilations=dil)
    mode = draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"] if auto
                                else ["NOTSET"]))
    if mode == "NOTSET":
        limit = [k - 1 for k in kernel] if pool else [e - 1 for e in eff]
        attrs["pads"] = ([draw(st.integers(0, lim)) for lim in limit]
                         + [draw(st.integers(0, lim)) for lim in limit])
    elif mode != "VALID" and any((-(-n // s) - 1) * s + e < n
                                 for n, s, e in zip(size, strides, eff)):
        attrs["auto_pad"] = "VALID"  # the reference fails on a negative SAME padding
    else:
        attrs["auto_pad"] = mode
    return size, attrs


def qparams(draw, dt):
    return (np.array(draw(st.sampled_from([0.01, 0.02, 0.05])), np.float32),
            np.array(draw(st.integers(0, 20)) if dt == U8 else draw(st.integers(-10, 10)), dt))


def rand(*shape, seed=0, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed + sum(shape)).uniform(lo, hi, shape)


# --------------------------------------------------------------------------- tensor-style


DATA_NUMERIC = [np.float32, np.float64, np.int64, np.int32, np.int8, np.uint8]


DATA_ANY = DATA_NUMERIC + [np.bool_, np.float16]


def values(draw, shape, dtype, lo=-9, hi=9):
    """Random values of ``dtype`` (seeded by hypothesis)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 3).astype(dtype)
    if dtype.kind == "u":
        lo = max(lo, 0)
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


def draw_shape(draw, min_rank=1, max_rank=4, min_side=1, max_side=4):
    rank = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.integers(min_side, max_side)) for _ in range(rank))


def i64(v):
    return np.asarray(v, np.int64)
