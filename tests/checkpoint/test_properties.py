"""Property-based round trips of random states (hypothesis)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jaxort.checkpoint as ckpt

from .conftest import assert_state_equal
from .test_roundtrip import _structure

NUMERIC = [
    np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128,
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
]
names = st.text(min_size=0, max_size=12)  # unicode, empty included
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)


@st.composite
def tensors(draw):
    if draw(st.integers(0, 9)) == 0:
        shape = draw(shapes)
        items = draw(st.lists(st.one_of(st.text(max_size=5), st.binary(max_size=5)), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(shape)
    dtype = np.dtype(draw(st.sampled_from(NUMERIC)))
    shape = draw(shapes)
    # Arbitrary bit patterns (NaNs, -0.0, subnormals) must survive bit-exactly.
    raw = draw(st.binary(min_size=int(np.prod(shape)) * dtype.itemsize, max_size=int(np.prod(shape)) * dtype.itemsize))
    array = np.frombuffer(raw, np.uint8).view(dtype) if raw else np.zeros(0, dtype)
    if dtype == np.bool_:
        array = array.view(np.uint8) & 1 != 0
    return array.reshape(shape)


property_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(width=32, allow_nan=False),
    st.text(max_size=10),
)


@st.composite
def states(draw):
    params = draw(st.dictionaries(names, tensors(), max_size=5))
    split = draw(st.integers(0, len(params)))
    items = list(params.items())
    trainable, frozen = dict(items[:split]), dict(items[split:])
    groups = []
    for gname in draw(st.lists(names, unique=True, max_size=2)):
        states_ = {
            p: draw(st.dictionaries(names, tensors(), max_size=2))
            for p in draw(st.lists(names, unique=True, max_size=3))
        }
        groups.append(
            ckpt.OptimizerGroup(
                gname,
                draw(st.integers(0, 2**63 - 2)),
                draw(st.floats(width=32, allow_nan=False)),
                states_,
            )
        )
    props = draw(st.dictionaries(names, property_values, max_size=6))
    return ckpt.Checkpoint(trainable=trainable, frozen=frozen, optimizer_groups=tuple(groups), properties=props)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(states())
def test_random_states_round_trip(state):
    data = ckpt.to_bytes(state, include_optimizer_state=True)
    back = ckpt.load_from_buffer(data)
    assert_state_equal(back, state)
    # Writing what was read gives the same bytes (the layout is canonical).
    assert ckpt.to_bytes(back, include_optimizer_state=True) == data
    # The generated flatbuffers reader agrees with jaxort's walker.
    s = _structure(data)
    if state.trainable or state.frozen:
        assert [t[0].decode() for t in s["module"][0]] == list(back.trainable)
        assert [t[0].decode() for t in s["module"][1]] == list(back.frozen)
    assert [g[0].decode() for g in s["groups"]] == [g.name for g in back.optimizer_groups]


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(names, tensors().filter(lambda a: a.dtype != object), max_size=4), st.integers(0, 200))
def test_random_states_round_trip_through_external_files(tmp_path_factory, params, threshold):
    path = tmp_path_factory.mktemp("ext") / "ckpt"
    state = ckpt.Checkpoint(trainable=params)
    ckpt.save(state, path, external_data_threshold=threshold)
    back = ckpt.load(path)
    assert_state_equal(back, state)
    assert back.has_external_data == (bool(params) and sum(a.nbytes for a in params.values()) >= threshold)


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(names, st.tuples(shapes, st.sampled_from(NUMERIC)), max_size=4))
def test_nominal_states_round_trip(spec):
    state = ckpt.Checkpoint(
        trainable={n: ckpt.NominalTensor(shape, np.dtype(dt)) for n, (shape, dt) in spec.items()}, is_nominal=True
    )
    back = ckpt.load_from_buffer(ckpt.to_bytes(state))
    assert back.is_nominal and back.trainable == state.trainable
