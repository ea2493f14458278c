"""Fuzzing: mutated and truncated checkpoints either load or raise CheckpointError, in bounded memory."""

from __future__ import annotations

import os
import random
import tempfile
import time
import tracemalloc

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxort.checkpoint as ckpt

from .conftest import ALL_GOLDEN_FILES

N_CASES = 3000


def _mutants(seed: int):
    rng = random.Random(seed)
    files = [open(p, "rb").read() for p in ALL_GOLDEN_FILES]
    for i in range(N_CASES):
        data = bytearray(rng.choice(files))
        kind = i % 6
        if kind == 0:  # truncation
            del data[rng.randrange(len(data)) :]
        elif kind == 1:  # random byte flips
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:  # a 32-bit word set to an extreme value (offsets, lengths, counts)
            pos = rng.randrange(0, len(data) - 4, 4)
            data[pos : pos + 4] = rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, rng.getrandbits(32)]).to_bytes(4, "little")
        elif kind == 3:  # a 64-bit word set to an extreme value (dims, step, external offsets)
            pos = rng.randrange(0, len(data) - 8, 4)
            value = rng.choice([-1, -(2**63), 2**63 - 1, 2**62, rng.getrandbits(64) - 2**63])
            data[pos : pos + 8] = value.to_bytes(8, "little", signed=True)
        elif kind == 4:  # a 16-bit vtable-sized word changed
            pos = rng.randrange(0, len(data) - 2, 2)
            data[pos : pos + 2] = rng.choice([0, 2, 3, 0xFFFF, rng.getrandbits(16)]).to_bytes(2, "little")
        else:  # splice: a block copied over another place
            a, b = rng.randrange(len(data)), rng.randrange(len(data))
            n = rng.randint(1, 64)
            data[b : b + n] = data[a : a + n]
        yield bytes(data)


def test_mutated_buffers_load_or_raise_checkpoint_error():
    start = time.perf_counter()
    outcomes = {"loaded": 0, "rejected": 0}
    for data in _mutants(seed=20240611):
        try:
            state = ckpt.load_from_buffer(data)
        except ckpt.CheckpointError as e:
            assert str(e)
            outcomes["rejected"] += 1
            continue
        outcomes["loaded"] += 1
        # What loads is a usable state: it writes out and reads back equal.
        for value in state.parameters.values():
            assert isinstance(value, (np.ndarray, ckpt.NominalTensor))
        ckpt.summary(state)
        again = ckpt.load_from_buffer(ckpt.to_bytes(state, include_optimizer_state=True))
        assert set(again.parameters) == set(state.parameters)
    assert sum(outcomes.values()) == N_CASES >= 2000
    assert outcomes["rejected"] > N_CASES // 3 and outcomes["loaded"] > 0, outcomes
    assert time.perf_counter() - start < 30


# -- hypothesis ---------------------------------------------------------------
#
# Mutations drawn by hypothesis (so failures shrink to a minimal edit list) of
# ONNX Runtime's files and of jaxort pairs with external data. Each load must
# give a Checkpoint or a CheckpointError, and allocate (numpy and Python, as
# tracemalloc counts) at most a few times the bytes it was given. `make fuzz`
# runs these for FUZZ_MINUTES instead of a bounded number of examples.

FUZZ_SECONDS = float(os.environ.get("FUZZ_MINUTES") or 0) * 60 / 2  # two fuzz tests share the time
SEEDS = [open(p, "rb").read() for p in ALL_GOLDEN_FILES]
_EXTREMES = [0, 1, 2, 3, 4, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFF0]

mutation = st.one_of(
    st.tuples(st.just("bytes"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("u32"), st.integers(0, 1 << 18), st.sampled_from(_EXTREMES) | st.integers(0, 2**32 - 1)),
    st.tuples(st.just("i64"), st.integers(0, 1 << 18), st.sampled_from([-1, -(2**63), 2**63 - 1, 2**40, 2**62])),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20)),
    st.tuples(st.just("splice"), st.integers(0, 1 << 20), st.integers(0, 1 << 20), st.integers(1, 64)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=16)),
)


def mutate(data: bytes, edits) -> bytes:
    out = bytearray(data)
    for edit in edits:
        if not out:
            break
        kind, pos = edit[0], edit[1] % len(out)
        if kind == "bytes":
            out[pos : pos + len(edit[2])] = edit[2]
        elif kind == "u32":
            pos -= pos % 4
            out[pos : pos + 4] = edit[2].to_bytes(4, "little")
        elif kind == "i64":
            pos -= pos % 4
            out[pos : pos + 8] = edit[2].to_bytes(8, "little", signed=True)
        elif kind == "truncate":
            del out[pos:]
        elif kind == "splice":
            src, n = edit[2] % len(out), edit[3]
            out[pos : pos + n] = out[src : src + n]
        else:
            out[pos:pos] = edit[2]
    return bytes(out)


def only_jaxort_errors_in_bounded_memory(load, given_bytes: int):
    """Runs ``load``; returns the Checkpoint or None (CheckpointError); fails on anything else."""
    tracemalloc.start()
    try:
        state = load()
    except ckpt.CheckpointError as e:
        assert str(e)
        state = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak <= 4 * given_bytes + (1 << 20), f"{peak} bytes allocated for {given_bytes} bytes of input"
    if state is not None:
        for value in state.parameters.values():
            assert isinstance(value, (np.ndarray, ckpt.NominalTensor))
    return state


def run_fuzz(strategy, check, examples: int) -> None:
    """Runs ``check`` on ``examples`` examples, or, under `make fuzz`, until FUZZ_SECONDS have passed."""
    test = settings(max_examples=examples if not FUZZ_SECONDS else 2000, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))(given(strategy)(check))
    end = time.monotonic() + FUZZ_SECONDS
    test()
    while time.monotonic() < end:
        test()


def test_hypothesis_mutated_buffers():
    def check(args):
        seed, edits = args
        data = mutate(SEEDS[seed], edits)
        state = only_jaxort_errors_in_bounded_memory(lambda: ckpt.load_from_buffer(data), len(data))
        if state is not None:
            again = ckpt.load_from_buffer(ckpt.to_bytes(state, include_optimizer_state=True))
            assert set(again.parameters) == set(state.parameters)

    run_fuzz(st.tuples(st.integers(0, len(SEEDS) - 1), st.lists(mutation, min_size=1, max_size=6)), check, 400)


_EXTERNAL_STATE = ckpt.Checkpoint(
    trainable={"w": np.arange(24, dtype=np.float32).reshape(4, 6), "d": np.arange(5.0)},
    frozen={"b": np.array([True, False]), "i": np.arange(70, dtype=np.int8)},
    optimizer_groups=(ckpt.OptimizerGroup("group0", 3, 0.01, {"w": {"momentum0": np.ones((4, 6), np.float32)}}),),
    properties={"epoch": 2},
)


def test_hypothesis_mutated_external_pairs():
    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "good")
        ckpt.save(_EXTERNAL_STATE, good, include_optimizer_state=True, external_data_threshold=0)
        pair = (open(good, "rb").read(), open(good + ".data", "rb").read())

        def check(args):
            ckpt_edits, data_edits, use_mmap = args
            files = (mutate(pair[0], ckpt_edits), mutate(pair[1], data_edits))
            path = os.path.join(d, "c")
            for p, data in zip((path, path + ".data"), files):
                with open(p, "wb") as f:
                    f.write(data)
            state = only_jaxort_errors_in_bounded_memory(lambda: ckpt.load(path, mmap=use_mmap), sum(map(len, files)))
            if state is not None and not state.is_nominal:
                ckpt.save(state, os.path.join(d, "again"), include_optimizer_state=True, external_data_threshold=0)
                assert os.path.getsize(os.path.join(d, "again.data")) <= len(files[1]) + 64

        edits = st.lists(mutation, max_size=4)
        run_fuzz(st.tuples(edits, edits, st.booleans()), check, 150)
