"""Malformed checkpoints raise CheckpointError naming the problem (and the tensor)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import jaxort.checkpoint as ckpt
from jaxort._fbs import Checkpoint as C
from jaxort._fbs import ModuleState as M
from jaxort._fbs import Tensor as T
from jaxort.checkpoint._builder import Builder

from .conftest import GOLDEN

GOOD = (GOLDEN / "l1_gemm" / "ckpt_after_with_opt").read_bytes()


def craft(name="w", dims=(2,), data_type=1, raw=b"\0" * 8, strings=None, ext=None, version=2, nominal=False):
    """A one-tensor checkpoint with whatever header values a test needs."""
    b = Builder()
    name_off = b.CreateString(name) if name is not None else 0
    dims_off = b.CreateInt64Vector(dims) if dims is not None else 0
    raw_off = b.CreateBytesVector(memoryview(raw)) if raw is not None else 0
    str_off = b.CreateOffsetVector([b.CreateString(s) for s in strings]) if strings is not None else 0
    T.TensorStart(b)
    T.TensorAddName(b, name_off)
    T.TensorAddDims(b, dims_off)
    T.TensorAddDataType(b, data_type)
    T.TensorAddRawData(b, raw_off)
    T.TensorAddStringData(b, str_off)
    if ext is not None:
        T.TensorAddExternalDataOffset(b, ext)
    tensor = T.TensorEnd(b)
    vec = b.CreateOffsetVector([tensor])
    empty = b.CreateOffsetVector([])
    M.ModuleStateStart(b)
    M.ModuleStateAddRequiresGradParams(b, vec)
    M.ModuleStateAddFrozenParams(b, empty)
    M.ModuleStateAddIsNominalState(b, nominal)
    module = M.ModuleStateEnd(b)
    C.CheckpointStart(b)
    C.CheckpointAddVersion(b, version)
    C.CheckpointAddModuleState(b, module)
    b.Finish(C.CheckpointEnd(b), b"ODTC")
    return b.output()


def test_craft_is_valid():
    state = ckpt.load_from_buffer(craft())
    np.testing.assert_array_equal(state.trainable["w"], np.zeros(2, np.float32))


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "truncated"),
        (GOOD[:10], "truncated"),
        (GOOD[:4] + b"ORTM" + GOOD[8:], r"file identifier is b'ORTM', expected b'ODTC'"),
        (craft(version=3), "unsupported checkpoint version 3"),
        (craft(version=0), "unsupported checkpoint version 0"),
        (struct.pack("<I", 2**31) + GOOD[4:], "outside the buffer"),
        (craft(dims=(-1, 2)), r"'w': negative dimension in dims \[-1, 2\]"),
        (craft(dims=(2**62, 2**62, 4)), r"'w': dims \[.*\] describe more data than any array can hold"),
        (craft(dims=(0, 2**62, 2**62), raw=b""), r"'w': dims \[0, .*\] describe more data"),
        (craft(dims=(2**30, 2**30), raw=b""), r"'w': raw_data has 0 bytes but dims \[1073741824, 1073741824\]"),
        (craft(dims=(3,)), r"'w': raw_data has 8 bytes but dims \[3\] of FLOAT \(1\) need 12"),
        (craft(raw=None), r"'w': raw_data has 0 bytes"),
        (craft(data_type=99), r"'w': unknown or unsupported data_type UNKNOWN\(99\) \(99\)"),
        (craft(data_type=22), r"'w': unknown or unsupported data_type INT4"),
        (craft(data_type=0), r"'w': unknown or unsupported data_type UNDEFINED"),
        (craft(dims=(1,) * 65, raw=b"\0" * 4), "rank 65 exceeds"),
        (craft(dims=None), "'w' has no dims"),
        (craft(name=None), "has no name"),
        (craft(name=b"w\xff"), r"requires_grad_params\[0\]: name: b'w\\xff' is not valid UTF-8"),
        (craft(ext=-5), "negative external_data_offset"),
        (craft(ext=0), "cannot reach"),
        (craft(data_type=9, dims=(2,), raw=b"\x01\x07"), "BOOL data holds bytes other than 0 and 1"),
        (craft(data_type=8, dims=(3,), raw=None, strings=["a", "b"]), r"string_data has 2 strings but dims \[3\] need 3"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_malformed(data, message):
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.load_from_buffer(data)


def _find(buf: bytes, needle: bytes) -> int:
    pos = buf.find(needle)
    assert pos >= 0
    return pos


def test_lying_lengths_are_caught_before_allocating():
    data = bytearray(craft(raw=b"\x01" * 8))
    # The raw_data vector's length word precedes its 8 bytes of 0x01.
    pos = _find(bytes(data), b"\x08\x00\x00\x00" + b"\x01" * 8)
    data[pos : pos + 4] = struct.pack("<I", 0xFFFFFFF0)
    with pytest.raises(ckpt.CheckpointError, match=r"'w': raw_data claims 4294967280 elements"):
        ckpt.load_from_buffer(bytes(data))
    # A name string longer than the buffer.
    data = bytearray(craft(name="weights"))
    pos = _find(bytes(data), b"\x07\x00\x00\x00weights")
    data[pos : pos + 4] = struct.pack("<I", 10**9)
    with pytest.raises(ckpt.CheckpointError, match="name: string of 1000000000 bytes"):
        ckpt.load_from_buffer(bytes(data))
    # The tensor vector claims a billion tensors.
    data = bytearray(GOOD)
    root = struct.unpack_from("<I", data, 0)[0]
    state = ckpt.load_from_buffer(GOOD)
    assert len(state.trainable) == 2
    vt = root - struct.unpack_from("<i", data, root)[0]
    module = root + struct.unpack_from("<H", data, vt + 6)[0]
    module += struct.unpack_from("<I", data, module)[0]
    mvt = module - struct.unpack_from("<i", data, module)[0]
    field = module + struct.unpack_from("<H", data, mvt + 4)[0]
    vec = field + struct.unpack_from("<I", data, field)[0]
    data[vec : vec + 4] = struct.pack("<I", 10**9)
    with pytest.raises(ckpt.CheckpointError, match="requires_grad_params claims 1000000000 elements"):
        ckpt.load_from_buffer(bytes(data))


def test_duplicate_names():
    b = Builder()
    tensors = []
    for _ in range(2):
        name = b.CreateString("w")
        dims = b.CreateInt64Vector([])
        raw = b.CreateBytesVector(memoryview(b"\0\0\0\0"))
        T.TensorStart(b)
        T.TensorAddName(b, name)
        T.TensorAddDims(b, dims)
        T.TensorAddDataType(b, 1)
        T.TensorAddRawData(b, raw)
        tensors.append(T.TensorEnd(b))
    rg = b.CreateOffsetVector(tensors)
    M.ModuleStateStart(b)
    M.ModuleStateAddRequiresGradParams(b, rg)
    module = M.ModuleStateEnd(b)
    C.CheckpointStart(b)
    C.CheckpointAddVersion(b, 2)
    C.CheckpointAddModuleState(b, module)
    b.Finish(C.CheckpointEnd(b), b"ODTC")
    with pytest.raises(ckpt.CheckpointError, match=r"requires_grad_params\[1\]: tensor name 'w' already used"):
        ckpt.load_from_buffer(b.output())


def _module_of(tensors: list, b: Builder) -> bytes:
    rg = b.CreateOffsetVector(tensors)
    M.ModuleStateStart(b)
    M.ModuleStateAddRequiresGradParams(b, rg)
    module = M.ModuleStateEnd(b)
    C.CheckpointStart(b)
    C.CheckpointAddVersion(b, 2)
    C.CheckpointAddModuleState(b, module)
    b.Finish(C.CheckpointEnd(b), b"ODTC")
    return b.output()


def _tensor(b: Builder, name: int, dims: int, raw: int = 0, strings: int = 0, data_type: int = 1) -> int:
    T.TensorStart(b)
    T.TensorAddName(b, name)
    T.TensorAddDims(b, dims)
    T.TensorAddDataType(b, data_type)
    T.TensorAddRawData(b, raw)
    T.TensorAddStringData(b, strings)
    return T.TensorEnd(b)


def test_shared_offsets_cannot_amplify_work():
    """Offsets that reuse objects are rejected instead of being walked again and again."""
    # 100k entries all pointing at one tensor table.
    b = Builder()
    t = _tensor(b, b.CreateString("w"), b.CreateInt64Vector([]), b.CreateBytesVector(memoryview(b"\0" * 4)))
    with pytest.raises(ckpt.CheckpointError, match=r"\[1\]: tensor name 'w' already used"):
        ckpt.load_from_buffer(_module_of([t] * 100_000, b))
    # 20k tensors with distinct names sharing one 64 KiB data vector (and dims).
    b = Builder()
    raw = b.CreateBytesVector(memoryview(b"\0" * 65536))
    dims = b.CreateInt64Vector([16384])
    tensors = [_tensor(b, b.CreateString(f"t{i}"), dims, raw) for i in range(20_000)]
    with pytest.raises(ckpt.CheckpointError, match="objects overlap"):
        ckpt.load_from_buffer(_module_of(tensors, b))
    # A string tensor whose 100k elements all point at one 10 KiB string.
    b = Builder()
    s = b.CreateString("x" * 10_000)
    strings = b.CreateOffsetVector([s] * 100_000)
    t = _tensor(b, b.CreateString("s"), b.CreateInt64Vector([100_000]), strings=strings, data_type=8)
    with pytest.raises(ckpt.CheckpointError, match="objects overlap"):
        ckpt.load_from_buffer(_module_of([t], b))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.load(tmp_path / "nope")
    with pytest.raises(ckpt.CheckpointError, match="is a directory"):
        ckpt.load(tmp_path)
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(ckpt.CheckpointError, match="truncated"):
        ckpt.load(tmp_path / "empty", mmap=True)
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load_from_buffer("not bytes")  # type: ignore[arg-type]
    assert issubclass(ckpt.CheckpointError, ValueError)
