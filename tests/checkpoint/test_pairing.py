"""A checkpoint and its external data file as a pair: the record that pairs them,
the load rule after an interrupted save, and removing what killed saves left."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import jaxort.checkpoint as ckpt
from jaxort.checkpoint import _files
from jaxort.checkpoint._files import TRAILER_SIZE
from jaxort.checkpoint._write import build_state


def version(k: int) -> ckpt.Checkpoint:
    return ckpt.Checkpoint(trainable={"w": np.full(64, k, np.float32)}, properties={"v": k})


def save(path, k: int, external: bool = True) -> None:
    ckpt.save(version(k), path, external_data_threshold=0 if external else None)


def loaded_version(path) -> int:
    state = ckpt.load(path)
    k = state.properties["v"]
    np.testing.assert_array_equal(state.trainable["w"], np.full(64, k, np.float32))
    return k


def backups(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".jaxort-prev"))


def test_records_follow_ort_bytes(tmp_path):
    path = tmp_path / "c"
    save(path, 1)
    b, external = build_state(version(1), False, 0)
    data, side = path.read_bytes(), (tmp_path / "c.data").read_bytes()
    # The flatbuffer ORT reads, then the record; the tensor data, then the record.
    assert data[:-TRAILER_SIZE] == b.output()
    assert side[:-TRAILER_SIZE] == b"".join(bytes(p) for p in external.pieces)
    token, size, magic = struct.unpack("<16sQ8s", data[-TRAILER_SIZE:])
    assert (size, magic) == (len(side), b"JXOCKPT1")
    assert struct.unpack("<16sQ8s", side[-TRAILER_SIZE:]) == (token, len(side) - TRAILER_SIZE, b"JXODATA1")
    # Two saves of the same state get different tokens.
    save(path, 1)
    assert path.read_bytes()[-TRAILER_SIZE:-16] != token
    # A single-file checkpoint has no record: ORT's bytes exactly.
    save(tmp_path / "inline", 1, external=False)
    assert (tmp_path / "inline").read_bytes() == ckpt.to_bytes(version(1))


def _snapshot(path):
    return {n: (path.parent / n).read_bytes() for n in os.listdir(path.parent)}


def _restore(path, files):
    for n in os.listdir(path.parent):
        os.remove(path.parent / n)
    for n, data in files.items():
        (path.parent / n).write_bytes(data)


def test_every_intermediate_state_of_a_save_loads_one_version(tmp_path, monkeypatch):
    """Each state the files pass through (stopped after each rename) loads the old or the new version."""
    path = tmp_path / "c"
    save(path, 1)
    before = _snapshot(path)
    seen = []
    real = os.replace

    def replace_and_record(src, dst):
        real(src, dst)
        # The process could be killed here: what would the next load give?
        seen.append((os.path.basename(dst), loaded_version(path)))

    monkeypatch.setattr(_files.os, "replace", replace_and_record)
    save(path, 2)
    monkeypatch.undo()
    # Backup of the old data, new data in place, new checkpoint in place.
    assert [(name.split(".")[-1], v) for name, v in seen] == [("jaxort-prev", 1), ("data", 1), ("c", 2)]
    assert backups(tmp_path) == [] and loaded_version(path) == 2
    _restore(path, before)
    assert loaded_version(path) == 1


def test_mixed_pair_without_backup_is_an_error_naming_the_mismatch(tmp_path):
    path = tmp_path / "c"
    save(path, 1)
    old = path.read_bytes()
    save(path, 2)
    path.write_bytes(old)  # checkpoint 1 beside data 2, and no backup
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint '.*/c' and external data file '.*/c\.data' do not belong "
                       r"together: the checkpoint was saved with data of save [0-9a-f]{12} \(288 bytes\), the file "
                       r"holds data of save [0-9a-f]{12} \(288 bytes\), and no backup"):
        ckpt.load(path)
    os.remove(tmp_path / "c.data")
    with pytest.raises(ckpt.CheckpointError, match=r"external data file .*c\.data' does not exist"):
        ckpt.load(path)


def test_interrupted_save_over_an_ort_pair_recovers_it(tmp_path, monkeypatch):
    """A pair without records (as ORT writes it) is kept under a name derived from its checkpoint's bytes."""
    path = tmp_path / "c"
    save(path, 1)
    for p in (path, tmp_path / "c.data"):
        p.write_bytes(p.read_bytes()[:-TRAILER_SIZE])
    assert loaded_version(path) == 1  # ORT's pairs load unchecked, as before
    real = os.replace
    calls = []

    def stop_before_checkpoint(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise SystemExit("killed")  # the checkpoint is never renamed
        real(src, dst)

    monkeypatch.setattr(_files.os, "replace", stop_before_checkpoint)
    with pytest.raises(SystemExit):
        save(path, 2)
    monkeypatch.undo()
    # A failed save (not a kill) puts the previous data file back for ORT.
    assert backups(tmp_path) == [] and loaded_version(path) == 1
    # As a kill leaves it: the ORT checkpoint, the new data file, the backup.
    ckpt_bytes = path.read_bytes()
    save(tmp_path / "new", 2)
    key = __import__("hashlib").sha256(ckpt_bytes).hexdigest()[:32]
    os.replace(tmp_path / "c.data", tmp_path / f".c.data.{key}.jaxort-prev")
    shutil.copy(tmp_path / "new.data", tmp_path / "c.data")
    assert loaded_version(path) == 1
    os.remove(tmp_path / f".c.data.{key}.jaxort-prev")
    with pytest.raises(ckpt.CheckpointError, match=r"the data file was written by a jaxort save \([0-9a-f]{12}\) "
                       "that did not write this checkpoint, and no backup"):
        ckpt.load(path)


def test_inline_save_removes_jaxort_data_file_only(tmp_path):
    path = tmp_path / "c"
    save(path, 1)
    save(path, 2, external=False)
    assert sorted(os.listdir(tmp_path)) == ["c"]
    (tmp_path / "c.data").write_bytes(b"someone else's bytes")
    save(path, 3, external=False)
    assert sorted(os.listdir(tmp_path)) == ["c", "c.data"] and loaded_version(path) == 3


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.skipif(os.name != "posix", reason="flock and process ids")
def test_next_save_removes_abandoned_temporary_files_only(tmp_path):
    import fcntl

    path = tmp_path / "c"
    save(path, 1)
    dead, me = _dead_pid(), os.getpid()
    old = time.time() - 3600
    names = {
        f".c.{dead}.0123456789ab.jaxort-tmp": "removed",  # writer dead
        f".c.data.{dead}.0123456789ab.jaxort-tmp": "removed",
        f".c.{me}.aaaaaaaaaaaa.jaxort-tmp": "removed",  # live pid, unlocked, an hour old
        f".c.{me}.bbbbbbbbbbbb.jaxort-tmp": "kept",  # live pid, unlocked, just written
        f".c.{me}.cccccccccccc.jaxort-tmp": "kept",  # locked: a save in progress
        f".c2.{dead}.0123456789ab.jaxort-tmp": "kept",  # another checkpoint's
        f".c.data.x.{dead}.0123456789ab.jaxort-tmp": "kept",
        f".c.{dead}.0123456789ab.tmp": "kept",  # not jaxort's name
        "notes.txt": "kept",
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x" * 10)
    os.utime(tmp_path / f".c.{me}.aaaaaaaaaaaa.jaxort-tmp", (old, old))
    os.utime(tmp_path / f".c.{me}.cccccccccccc.jaxort-tmp", (old, old))
    holder = os.open(tmp_path / f".c.{me}.cccccccccccc.jaxort-tmp", os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        save(path, 2)
    finally:
        os.close(holder)
    kept = sorted(n for n, fate in names.items() if fate == "kept")
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["c", "c.data"])
    assert loaded_version(path) == 2
