"""Hostile external data: ranges are checked against the file's size before
anything is read, only the named ranges are read (or mapped), and tensors may
not share data bytes, in the data file or inline."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

import jaxort.checkpoint as ckpt
from jaxort._fbs import Checkpoint as C
from jaxort._fbs import ModuleState as M
from jaxort._fbs import Tensor as T
from jaxort.checkpoint._builder import Builder


def craft(tensors) -> bytes:
    """A checkpoint of (name, dims, external_offset or raw-data index) float32 tensors.

    An int offset puts the tensor in the external data file; ("raw", i)
    makes it use the i-th shared raw_data vector of 16 bytes.
    """
    b = Builder()
    raws = [b.CreateBytesVector(memoryview(bytes(range(16 * i, 16 * i + 16)))) for i in range(2)]
    offsets = []
    for name, dims, where in tensors:
        n, d = b.CreateString(name), b.CreateInt64Vector(dims)
        T.TensorStart(b)
        T.TensorAddName(b, n)
        T.TensorAddDims(b, d)
        T.TensorAddDataType(b, 1)
        if isinstance(where, tuple):
            T.TensorAddRawData(b, raws[where[1]])
        else:
            T.TensorAddExternalDataOffset(b, where)
        offsets.append(T.TensorEnd(b))
    vec = b.CreateOffsetVector(offsets)
    M.ModuleStateStart(b)
    M.ModuleStateAddRequiresGradParams(b, vec)
    M.ModuleStateAddHasExternalData(b, True)
    module = M.ModuleStateEnd(b)
    C.CheckpointStart(b)
    C.CheckpointAddVersion(b, 2)
    C.CheckpointAddModuleState(b, module)
    b.Finish(C.CheckpointEnd(b), b"ODTC")
    return b.output()


def sparse(path, size: int, pieces=()) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in pieces:
            f.seek(offset)
            f.write(data)


def measured(fn):
    """(result or exception, seconds, peak bytes numpy and Python allocated)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as e:
        out = e
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, elapsed, peak


TIB = 1 << 40


@pytest.mark.parametrize("use_mmap", [False, True])
def test_a_1_tib_sparse_data_file_is_neither_read_nor_allocated(tmp_path, use_mmap):
    path = tmp_path / "c"
    path.write_bytes(craft([("head", [4], 0), ("tail", [4], TIB - 16)]))
    head, tail = np.arange(4, dtype=np.float32), -np.arange(4, dtype=np.float32)
    sparse(str(path) + ".data", TIB, [(0, head.tobytes()), (TIB - 16, tail.tobytes())])
    state, elapsed, peak = measured(lambda: ckpt.load(path, mmap=use_mmap))
    assert isinstance(state, ckpt.Checkpoint), state
    np.testing.assert_array_equal(state.trainable["head"], head)
    np.testing.assert_array_equal(state.trainable["tail"], tail)
    assert elapsed < 1.0 and peak < 1 << 20


@pytest.mark.parametrize("size", [2 << 30, TIB])
def test_ranges_past_the_end_fail_before_any_read(tmp_path, size):
    path = tmp_path / "c"
    # The first tensor is valid and large: the old reader read the file whole first.
    path.write_bytes(craft([("big", [size // 8], 0), ("bad", [4], size - 8)]))
    sparse(str(path) + ".data", size)
    err, elapsed, peak = measured(lambda: ckpt.load(path))
    assert isinstance(err, ckpt.CheckpointError), err
    assert f"'bad': external data [{size - 8}, {size + 8}) lies past the end of the external data file ({size} bytes)" in str(err)
    assert elapsed < 1.0 and peak < 1 << 20


def test_offset_plus_size_overflowing_int64_is_rejected(tmp_path):
    path = tmp_path / "c"
    path.write_bytes(craft([("w", [2**60], 2**62)]))
    sparse(str(path) + ".data", 64)
    with pytest.raises(ckpt.CheckpointError, match=r"'w': external data \[4611686018427387904, .*\) lies past the end"):
        ckpt.load(path)


def test_a_tensor_too_large_for_memory_names_mmap(tmp_path):
    path = tmp_path / "c"
    path.write_bytes(craft([("huge", [TIB // 4], 0)]))
    sparse(str(path) + ".data", TIB)
    with pytest.raises(ckpt.CheckpointError, match=r"'huge': its 1099511627776 bytes of external data do not fit in memory; load with mmap=True"):
        ckpt.load(path)
    state = ckpt.load(path, mmap=True)
    assert state.trainable["huge"].shape == (TIB // 4,) and state.trainable["huge"][-1] == 0


@pytest.mark.parametrize(
    "tensors, message",
    [
        ([("a", [16], 0), ("b", [16], 0)], r"'b': its external data \[0, 64\) overlaps that of .*'a' \(up to 64\)"),
        ([("a", [16], 0), ("b", [4], 60)], r"'b': its external data \[60, 76\) overlaps that of .*'a' \(up to 64\)"),
        ([("a", [4], 100), ("b", [100], 0)], r"'a': its external data \[100, 116\) overlaps that of .*'b' \(up to 400\)"),
        ([("a", [4], ("raw", 0)), ("b", [4], ("raw", 0))], r"'b': its raw_data \[\d+, \d+\) overlaps that of .*'a' \(up to \d+\)"),
    ],
)
def test_tensors_sharing_data_bytes_are_rejected(tmp_path, tensors, message):
    path = tmp_path / "c"
    path.write_bytes(craft(tensors))
    sparse(str(path) + ".data", 4096)
    with pytest.raises(ckpt.CheckpointError, match=message + "; tensors may not share data bytes"):
        ckpt.load(path)


def test_adjacent_and_empty_ranges_are_fine(tmp_path):
    path = tmp_path / "c"
    path.write_bytes(craft([("a", [4], 0), ("b", [4], 16), ("e1", [0], 16), ("e2", [0], 16),
                            ("r0", [4], ("raw", 0)), ("r1", [4], ("raw", 1))]))
    sparse(str(path) + ".data", 32, [(0, np.arange(8, dtype=np.float32).tobytes())])
    state = ckpt.load(path)
    np.testing.assert_array_equal(state.trainable["b"], np.arange(4, 8, dtype=np.float32))
    assert state.trainable["e1"].shape == (0,)
    # What loads re-saves to a side file no larger than the data.
    ckpt.save(state, tmp_path / "again", external_data_threshold=0)
    assert (tmp_path / "again.data").stat().st_size == 64 + ckpt._files.TRAILER_SIZE
