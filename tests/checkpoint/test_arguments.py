"""Every checkpoint entry point checks its arguments: CheckpointError naming what was given."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import jaxort.checkpoint as ckpt

STATE = ckpt.Checkpoint(trainable={"w": np.zeros(2, np.float32)})


def calls(tmp):
    p = str(tmp / "c")
    return [
        (lambda: ckpt.load(123), r"checkpoint path must be a str or os\.PathLike, got int \(123\)"),
        (lambda: ckpt.load(None), r"checkpoint path must be a str or os\.PathLike, got NoneType \(None\)"),
        (lambda: ckpt.load(b"c"), r"checkpoint path must be a str or os\.PathLike, got bytes \(b'c'\)"),
        (lambda: ckpt.load("a\0b"), r"checkpoint path 'a\\x00b' contains a NUL character"),
        (lambda: ckpt.load(""), r"checkpoint path is empty"),
        (lambda: ckpt.load(p, mmap="yes"), r"mmap must be a bool, got 'yes'"),
        (lambda: ckpt.load_from_buffer("ODTC"), r"a checkpoint buffer must be bytes-like .*, got str"),
        (lambda: ckpt.load_from_buffer(123), r"a checkpoint buffer must be bytes-like .*, got int"),
        (lambda: ckpt.load_from_buffer(None), r"a checkpoint buffer must be bytes-like .*, got NoneType"),
        (lambda: ckpt.load_from_buffer(object()), r"cannot read a checkpoint from object"),
        (lambda: ckpt.save(123, p), r"expected a jaxort\.checkpoint\.Checkpoint to save, got int"),
        (lambda: ckpt.save({"w": 1}, p), r"expected a jaxort\.checkpoint\.Checkpoint to save, got dict"),
        (lambda: ckpt.save(STATE, 123), r"checkpoint path must be a str or os\.PathLike, got int \(123\)"),
        (lambda: ckpt.save(STATE, p, include_optimizer_state="yes"), r"include_optimizer_state must be a bool, got 'yes'"),
        (lambda: ckpt.save(STATE, p, external_data_threshold="1"), r"external_data_threshold must be an int or None, got '1'"),
        (lambda: ckpt.save(STATE, p, external_data_threshold=True), r"external_data_threshold must be an int or None, got True"),
        (lambda: ckpt.save(STATE, p, external_data_threshold=-1), r"external_data_threshold must be >= 0, got -1"),
        (lambda: ckpt.save(STATE, str(tmp) + "/"), r"checkpoint path '.*/' names a directory, not a file"),
        (lambda: ckpt.to_bytes("state"), r"expected a jaxort\.checkpoint\.Checkpoint to save, got str"),
        (lambda: ckpt.to_bytes(STATE, 1), r"include_optimizer_state must be a bool, got 1"),
        (lambda: ckpt.to_bytes(STATE.replace(trainable=[1])), r"Checkpoint\.trainable must be a mapping, got list"),
        (lambda: ckpt.to_bytes(STATE.replace(optimizer_groups=("g",)), True),
         r"Checkpoint\.optimizer_groups must be a tuple of OptimizerGroup, got \('g',\)"),
        (lambda: ckpt.to_bytes(STATE.replace(optimizer_groups=(ckpt.OptimizerGroup("g", 0, 0.1, [1]),)), True),
         r"optimizer group 'g': states must map parameter names to mappings"),
        (lambda: ckpt.save_tensors("abc", [], p), r"trainable tensors: expected a sequence of onnx\.TensorProto, got str"),
        (lambda: ckpt.save_tensors([], 5, p), r"frozen tensors: expected a sequence of onnx\.TensorProto, got int"),
        (lambda: ckpt.save_tensors([1], [], p), r"trainable tensor: expected an onnx\.TensorProto, got int"),
        (lambda: ckpt.save_tensors([], [], 1.5), r"checkpoint path must be a str or os\.PathLike, got float \(1\.5\)"),
        (lambda: ckpt.save_tensors([], [], p, nominal=None), r"nominal must be a bool, got None"),
        (lambda: ckpt.save_tensors([], [], p, external_data_threshold=1.0), r"external_data_threshold must be an int or None, got 1\.0"),
        (lambda: ckpt.load_to_model(p, "model"), r"load_to_model needs an onnx\.ModelProto, got str"),
        (lambda: ckpt.load_to_model(7, __import__("onnx").ModelProto()), r"checkpoint path must be a str or os\.PathLike, got int"),
        (lambda: ckpt.summary(3), r"summary\(\) needs a Checkpoint or a checkpoint path \(str or os\.PathLike\), got int"),
        (lambda: ckpt.external_data_path(3), r"checkpoint path must be a str or os\.PathLike, got int \(3\)"),
    ]


def test_every_entry_point_names_a_bad_argument(tmp_path):
    failures = []
    for i, (call, message) in enumerate(calls(tmp_path)):
        try:
            call()
        except ckpt.CheckpointError as e:
            if not __import__("re").search(message, str(e)):
                failures.append((i, message, str(e)))
        except Exception as e:
            failures.append((i, message, f"{type(e).__name__}: {e}"))
        else:
            failures.append((i, message, "no error"))
    assert failures == []
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_bytes_like_buffers_are_accepted():
    data = ckpt.to_bytes(STATE)
    for buffer in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        np.testing.assert_array_equal(ckpt.load_from_buffer(buffer).trainable["w"], np.zeros(2, np.float32))
    # A non-contiguous view is refused, not misread.
    with pytest.raises(ckpt.CheckpointError, match="cannot read a checkpoint from memoryview: .*not C-contiguous"):
        ckpt.load_from_buffer(memoryview(data + data)[::2])
    assert struct.unpack_from("<4s", data, 4)[0] == b"ODTC"


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="FIFOs")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    os.mkfifo(tmp_path / "c")
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint '.*/c' is not a regular file"):
        ckpt.load(tmp_path / "c")
    ckpt.save(STATE, tmp_path / "d", external_data_threshold=0)
    os.remove(tmp_path / "d.data")
    os.mkfifo(tmp_path / "d.data")
    with pytest.raises(ckpt.CheckpointError, match=r"external data file '.*/d\.data' is not a regular file"):
        ckpt.load(tmp_path / "d")
