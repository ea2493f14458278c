"""save() replaces the file atomically: a failure at any point keeps the old file."""

from __future__ import annotations

import os

import numpy as np
import pytest

import jaxort.checkpoint as ckpt
from jaxort.checkpoint import _files

from .conftest import GOLDEN


@pytest.fixture
def old_and_new(tmp_path):
    path = tmp_path / "ckpt"
    old = ckpt.load(GOLDEN / "mlp_adamw" / "ckpt_after_with_opt")
    ckpt.save(old, path, include_optimizer_state=True)
    # A large tensor makes the write several chunks, so the failure hits midway.
    trainable = {k: np.zeros_like(v) for k, v in old.trainable.items()}
    trainable["big"] = np.arange(65536, dtype=np.float32)
    new = old.replace(trainable=trainable, properties={"epoch": 7})
    return path, path.read_bytes(), new


def _fail_midway(exc):
    real = _files._write_all
    calls = []

    def write_some(fd, data):
        calls.append(len(memoryview(data)))
        if len(calls) == 2:
            real(fd, memoryview(data).cast("B")[: len(memoryview(data).cast("B")) // 2])
            raise exc
        real(fd, data)

    return write_some, calls


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt(), RuntimeError("boom")])
@pytest.mark.parametrize("external", [False, True])
def test_failure_during_write_keeps_old_file(monkeypatch, old_and_new, exc, external):
    path, before, new = old_and_new
    write_some, calls = _fail_midway(exc)
    monkeypatch.setattr(_files, "_write_all", write_some)
    expected = ckpt.CheckpointError if isinstance(exc, OSError) else type(exc)
    with pytest.raises(expected):
        ckpt.save(new, path, include_optimizer_state=True, external_data_threshold=0 if external else None)
    assert len(calls) == 2  # it did fail midway
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == ["ckpt"]  # no temporary or side file left
    monkeypatch.undo()
    ckpt.save(new, path)
    assert ckpt.load(path).properties == {"epoch": 7}


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_failure_at_fsync_or_rename_keeps_old_file(monkeypatch, old_and_new, step):
    path, before, new = old_and_new

    def boom(*args, **kwargs):
        raise OSError(5, f"injected {step} failure")

    monkeypatch.setattr(_files.os, step, boom)
    with pytest.raises(ckpt.CheckpointError, match=f"injected {step} failure"):
        ckpt.save(new, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == ["ckpt"]


def test_bad_state_leaves_no_trace(tmp_path):
    path = tmp_path / "ckpt"
    with pytest.raises(ckpt.CheckpointError):
        ckpt.save(ckpt.Checkpoint(trainable={"a": np.zeros(1, "datetime64[s]")}), path)
    assert os.listdir(tmp_path) == []


def test_unwritable_directory(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="cannot write checkpoint"):
        ckpt.save(ckpt.Checkpoint(), tmp_path / "missing_dir" / "ckpt")


def test_new_file_permissions_follow_umask(tmp_path):
    path = tmp_path / "ckpt"
    ckpt.save(ckpt.Checkpoint(), path)
    umask = os.umask(0)
    os.umask(umask)
    if os.name == "posix":
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask
