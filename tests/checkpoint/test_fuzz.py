"""Fuzzing: mutated and truncated ONNX Runtime files either load or raise CheckpointError."""

from __future__ import annotations

import random
import time

import numpy as np

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
