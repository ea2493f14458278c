"""Checkpoint files on disk: crash-safe saves of a checkpoint and its external
data file, and finding the data file a checkpoint was written with.

ONNX Runtime Training 1.19.2 fixes the name of the external data file
(``<checkpoint>.data``), so the two files of a checkpoint cannot both be
replaced in one atomic step. jaxort makes the pair verifiable instead: both
files end with a 32-byte trailer after the bytes ONNX Runtime reads (its
reader ignores bytes past the flatbuffer and past the last tensor), holding
one random token per save. A save renames the data file first, keeps the
previous data file under a backup name until the new checkpoint is in
place, and a load uses the data file whose token matches the checkpoint's
(the backup, after an interrupted save), or raises CheckpointError. The
protocol is described in docs/checkpoint-format.md.

Temporary files are named ``.<target>.<pid>.<12 hex>.jaxort-tmp`` and held
under an exclusive ``flock`` while in use, so a later save can tell an
abandoned one (its writer is dead, or holds no lock on it) from one being
written, and removes only the former.

Imports numpy and the standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
import struct
import time
from collections.abc import Iterable
from typing import NamedTuple, Optional, Union

import numpy as np

from jaxort.errors import CheckpointError

from ._builder import Builder
from ._format import external_data_path

try:
    import fcntl as _fcntl
except ImportError:  # Windows: no flock; stale temporary files are left alone there.
    _fcntl = None

__all__ = [
    "TRAILER_SIZE",
    "ExternalData",
    "open_external_data",
    "remove_abandoned_temps",
    "write_files",
]

# token (16 random bytes), a size, magic. In a checkpoint the size is the
# whole size of the external data file written with it; in an external data
# file it is the number of data bytes before the trailer.
_TRAILER = struct.Struct("<16sQ8s")
TRAILER_SIZE = _TRAILER.size
_CHECKPOINT_MAGIC = b"JXOCKPT1"
_DATA_MAGIC = b"JXODATA1"

_TEMP_SUFFIX = ".jaxort-tmp"
_BACKUP_SUFFIX = ".jaxort-prev"
_TEMP_NAME = re.compile(r"\.(?P<target>.+)\.(?P<pid>[0-9]{1,10})\.[0-9a-f]{12}" + re.escape(_TEMP_SUFFIX))
_BACKUP_NAME = re.compile(r"\.(?P<target>.+)\.[0-9a-f]{32}" + re.escape(_BACKUP_SUFFIX))
# An unlocked temporary file of a live process id is removed only when it is
# this much older than the save: its writer locks it right after creating it.
_UNLOCKED_GRACE_S = 10.0


def _trailer(tail: bytes, magic: bytes) -> Optional[tuple[bytes, int]]:
    """(token, size) from the last TRAILER_SIZE bytes, or None when they are not a trailer."""
    if len(tail) < TRAILER_SIZE:
        return None
    token, size, found = _TRAILER.unpack_from(tail, len(tail) - TRAILER_SIZE)
    return (token, size) if found == magic else None


def checkpoint_trailer(data: Union[bytes, memoryview, np.ndarray]) -> Optional[tuple[bytes, int]]:
    """The (token, data file size) a checkpoint was saved with, or None (no external data, or not jaxort's)."""
    view = memoryview(data).cast("B")
    return _trailer(bytes(view[-TRAILER_SIZE:]), _CHECKPOINT_MAGIC)


def _backup_path(data_path: str, key: str) -> str:
    directory, name = os.path.split(data_path)
    return os.path.join(directory, f".{name}.{key}{_BACKUP_SUFFIX}")


def _pair_key(checkpoint: Union[bytes, memoryview, np.ndarray]) -> str:
    """Names the backup of a checkpoint's data file: its token, or a hash of a foreign checkpoint."""
    found = checkpoint_trailer(checkpoint)
    if found is not None:
        return found[0].hex()
    return hashlib.sha256(memoryview(checkpoint).cast("B")).hexdigest()[:32]


# -- reading the external data file ------------------------------------------


class _Side(NamedTuple):
    """An opened external data file: descriptor, path, file size, trailer (or None)."""

    fd: int
    path: str
    size: int
    trailer: Optional[tuple[bytes, int]]


def _open_side(path: str) -> Optional[_Side]:
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise CheckpointError(f"external data file {path!r} is a directory") from None
    except OSError as e:
        raise CheckpointError(f"cannot read external data file {path!r}: {e}") from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"external data file {path!r} is not a regular file")
        size = info.st_size
        trailer = None
        if size >= TRAILER_SIZE:
            trailer = _trailer(_pread(fd, TRAILER_SIZE, size - TRAILER_SIZE, path), _DATA_MAGIC)
            if trailer is not None and trailer[1] != size - TRAILER_SIZE:
                raise CheckpointError(
                    f"external data file {path!r} is damaged: its trailer counts {trailer[1]} data bytes, "
                    f"the file holds {size - TRAILER_SIZE}"
                )
        return _Side(fd, path, size, trailer)
    except BaseException:
        os.close(fd)
        raise


def _pread(fd: int, n: int, offset: int, path: str) -> bytes:
    out = bytearray()
    while len(out) < n:
        if hasattr(os, "pread"):
            chunk = os.pread(fd, n - len(out), offset + len(out))
        else:  # Windows
            os.lseek(fd, offset + len(out), os.SEEK_SET)
            chunk = os.read(fd, n - len(out))
        if not chunk:
            raise CheckpointError(f"external data file {path!r} shrank while being read")
        out += chunk
    return bytes(out)


class ExternalData:
    """The external data file a checkpoint was written with, opened for reading.

    ``size`` is the number of data bytes (the trailer excluded); ``array``
    returns the bytes of one range, from a memory map or read on demand, so
    a load touches only the ranges its tensors name, after all of them were
    checked against ``size``.
    """

    def __init__(self, side: _Side, use_mmap: bool, recovered: bool):
        self.path = side.path
        self.size = side.size - TRAILER_SIZE if side.trailer is not None else side.size
        self.recovered = recovered
        self._fd: Optional[int] = side.fd
        self._map: Optional[np.ndarray] = None
        if use_mmap and side.size:
            import mmap

            try:
                self._map = np.frombuffer(mmap.mmap(side.fd, 0, access=mmap.ACCESS_READ), dtype=np.uint8)
            except (OSError, ValueError) as e:
                self.close()
                raise CheckpointError(f"cannot map external data file {self.path!r}: {e}") from e
            self.close()

    def array(self, offset: int, nbytes: int, what: str) -> np.ndarray:
        """The bytes [offset, offset + nbytes) as a read-only 1-D uint8 array (0 <= offset, end <= size)."""
        if self._map is not None:
            return self._map[offset : offset + nbytes]
        try:
            out = np.empty(nbytes, dtype=np.uint8)
        except MemoryError:
            raise CheckpointError(
                f"{what}: its {nbytes} bytes of external data do not fit in memory; load with mmap=True"
            ) from None
        view = memoryview(out)
        done = 0
        while done < nbytes:
            if hasattr(os, "preadv"):
                n = os.preadv(self._fd, [view[done:]], offset + done)
            else:
                os.lseek(self._fd, offset + done, os.SEEK_SET)
                n = os.readv(self._fd, [view[done:]])
            if not n:
                raise CheckpointError(f"external data file {self.path!r} shrank while being read")
            done += n
        out.flags.writeable = False
        return out

    def close(self) -> None:
        """Closes the file (a memory map stays valid while arrays view it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _close(*sides: Optional[_Side]) -> None:
    for side in sides:
        if side is not None:
            os.close(side.fd)


def open_external_data(path: str, checkpoint: np.ndarray, use_mmap: bool) -> ExternalData:
    """Opens the external data file that the checkpoint at ``path`` was written with.

    A checkpoint saved by jaxort records the token of its data file: the
    file ``<path>.data`` is used when its token matches, else the backup an
    interrupted save left (the complete previous pair). A checkpoint without
    a record (written by ONNX Runtime) is paired with a data file without
    one, or with the backup a jaxort save made of its data.

    Raises:
      CheckpointError: the data file is missing, or belongs to another save
        and no backup holds this checkpoint's data (names both).
    """
    data_path = external_data_path(path)
    expected = checkpoint_trailer(checkpoint)
    primary = _open_side(data_path)
    backup = None
    try:
        if expected is not None:
            token, size = expected
            if primary is not None and primary.trailer is not None and primary.trailer[0] == token:
                if primary.size != size:
                    raise CheckpointError(
                        f"external data file {data_path!r} has {primary.size} bytes, but checkpoint {path!r} "
                        f"was saved with {size}"
                    )
                found, primary = primary, None
                return ExternalData(found, use_mmap, recovered=False)
            backup = _open_side(_backup_path(data_path, token.hex()))
            if backup is not None and backup.trailer is not None and backup.trailer[0] == token and backup.size == size:
                found, backup = backup, None
                return ExternalData(found, use_mmap, recovered=True)
            if primary is None:
                raise CheckpointError(f"external data file {data_path!r} does not exist")
            held = "no jaxort record" if primary.trailer is None else f"data of save {primary.trailer[0].hex()[:12]}"
            raise CheckpointError(
                f"checkpoint {path!r} and external data file {data_path!r} do not belong together: the "
                f"checkpoint was saved with data of save {token.hex()[:12]} ({size} bytes), the file holds "
                f"{held} ({primary.size} bytes), and no backup of the checkpoint's data is left (a save "
                "was interrupted, or one of the files was replaced)"
            )
        if primary is not None and primary.trailer is None:
            found, primary = primary, None
            return ExternalData(found, use_mmap, recovered=False)
        backup = _open_side(_backup_path(data_path, _pair_key(checkpoint)))
        if backup is not None and backup.trailer is None:
            found, backup = backup, None
            return ExternalData(found, use_mmap, recovered=True)
        if primary is None:
            raise CheckpointError(f"external data file {data_path!r} does not exist")
        raise CheckpointError(
            f"checkpoint {path!r} and external data file {data_path!r} do not belong together: the data "
            f"file was written by a jaxort save ({primary.trailer[0].hex()[:12]}) that did not write this "
            "checkpoint, and no backup of the checkpoint's data is left (a save was interrupted, or one "
            "of the files was replaced)"
        )
    finally:
        _close(primary, backup)


# -- writing -----------------------------------------------------------------


def _write_all(fd: int, data: Union[bytes, memoryview]) -> None:
    """Writes all of ``data`` to a file descriptor (os.write may write less)."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(directory: str) -> None:
    # Makes renames durable, in order; directories cannot be opened on Windows.
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class _Temp(NamedTuple):
    fd: int
    path: str


def _write_temp(directory: str, target: str, chunks: Iterable[Union[bytes, memoryview]], temps: list) -> _Temp:
    """Writes ``chunks`` to a new locked temporary file for ``target``, fsynced; appends it to ``temps``."""
    name = f".{os.path.basename(target)}.{os.getpid()}.{secrets.token_hex(6)}{_TEMP_SUFFIX}"
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    temp = _Temp(fd, path)
    temps.append(temp)
    if _fcntl is not None:
        _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
    for chunk in chunks:
        _write_all(fd, chunk)
    os.fsync(fd)
    return temp


def _is_locked(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True  # gone already, or not ours to judge
    try:
        _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases the lock just taken
    return False


def _abandoned(path: str, pid: int, started: float) -> bool:
    """True when no live writer can be using the temporary file ``path``."""
    if pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except (PermissionError, OverflowError):
            pass
    # The process id is alive (perhaps reused): the file is abandoned when
    # nobody holds its lock and it was not just created.
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return False
    return mtime < started - _UNLOCKED_GRACE_S and not _is_locked(path)


def remove_abandoned_temps(directory: str, base: str, started: float) -> list[str]:
    """Removes the temporary files of saves of ``base`` (and its data file) whose writer is gone.

    Only names jaxort makes for this target are considered
    (``.<base>.<pid>.<hex>.jaxort-tmp``, ``.<base>.data.<pid>.<hex>.jaxort-tmp``).

    Returns:
      The paths removed.
    """
    if os.name != "posix" or _fcntl is None:
        return []
    removed = []
    targets = (base, base + ".data")
    for name in os.listdir(directory):
        m = _TEMP_NAME.fullmatch(name)
        if m is None or m["target"] not in targets:
            continue
        path = os.path.join(directory, name)
        if _abandoned(path, int(m["pid"]), started):
            _remove(path)
            removed.append(path)
    return removed


def _remove_backups(directory: str, data_name: str) -> None:
    for name in os.listdir(directory):
        m = _BACKUP_NAME.fullmatch(name)
        if m is not None and m["target"] == data_name:
            _remove(os.path.join(directory, name))


def _map_file(path: str) -> Optional[np.ndarray]:
    """The current checkpoint's bytes (memory-mapped), or None when there is none."""
    import mmap

    try:
        with open(path, "rb") as f:
            if not os.fstat(f.fileno()).st_size:
                return np.zeros(0, np.uint8)
            return np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    except (FileNotFoundError, IsADirectoryError):
        return None


def _keep_previous_data(path: str, data_path: str) -> Optional[str]:
    """Renames the current data file to its backup name when it is the current checkpoint's.

    After this, until the new checkpoint replaces the old one, a load of the
    old checkpoint finds its data in the backup.

    Returns:
      The backup's path, or None when nothing was renamed.
    """
    from ._read import uses_external_data

    current = _map_file(path)
    if current is None:
        return None
    found = checkpoint_trailer(current)
    if found is None and not uses_external_data(current):
        return None  # the current checkpoint does not read the data file
    side = _open_side(data_path)
    if side is None:
        return None  # an earlier interrupted save already kept it
    _close(side)
    if found is not None:
        if side.trailer is None or side.trailer[0] != found[0]:
            return None  # not the current checkpoint's data (its backup exists, or it is lost)
    elif side.trailer is not None:
        return None
    backup = _backup_path(data_path, _pair_key(current))
    os.replace(data_path, backup)
    return backup


def write_files(path: str, b: Builder, external) -> None:
    """Writes a checkpoint (and its external data file) crash-safely.

    Each file is written to a locked temporary file in the target directory
    and fsynced. With external data the previous data file is renamed to a
    backup name (when it is the current checkpoint's), the new data file is
    renamed into place, then the checkpoint; the backup is removed once the
    new checkpoint is in place. After a crash at any point, loading gives
    the complete previous or the complete new checkpoint. Abandoned
    temporary files of earlier saves of this target are removed first.

    Args:
      path: the checkpoint file (a str).
      b: the finished builder.
      external: the external data layout (``_write._ExternalData``), or None.

    Raises:
      CheckpointError: an OS error while writing (the previous pair stays loadable).
    """
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    if not base:
        raise CheckpointError(f"checkpoint path {path!r} names a directory, not a file")
    data_path = external_data_path(path)
    temps: list[_Temp] = []
    backup = None  # set while the previous data file is kept under its backup name
    try:
        remove_abandoned_temps(directory, base, time.time())
        if external is not None:
            token = secrets.token_bytes(16)
            data_trailer = _TRAILER.pack(token, external.size, _DATA_MAGIC)
            data = _write_temp(directory, data_path, [*external.pieces, data_trailer], temps)
            ckpt_trailer = _TRAILER.pack(token, external.size + TRAILER_SIZE, _CHECKPOINT_MAGIC)
            ckpt = _write_temp(directory, path, [*b.chunks(), ckpt_trailer], temps)
            backup = _keep_previous_data(path, data_path)
            _fsync_dir(directory)
            os.replace(data.path, data_path)
            _fsync_dir(directory)
        else:
            ckpt = _write_temp(directory, path, b.chunks(), temps)
        os.replace(ckpt.path, path)
        backup = None
        _fsync_dir(directory)
        # The new checkpoint is in place: what the previous one needed can go.
        _remove_backups(directory, os.path.basename(data_path))
        if external is None:
            side = _open_side(data_path) if os.path.isfile(data_path) else None
            if side is not None:
                _close(side)
                if side.trailer is not None:  # a data file of an earlier jaxort save
                    _remove(data_path)
    except BaseException as e:
        if backup is not None:
            # A failed save (not a crash) puts the previous data file back, so
            # that ONNX Runtime, which knows only <path>.data, reads the pair too.
            try:
                os.replace(backup, data_path)
            except OSError:
                pass
        if isinstance(e, OSError):
            raise CheckpointError(f"cannot write checkpoint {path!r}: {e}") from e
        raise
    finally:
        for temp in temps:
            os.close(temp.fd)
            if os.path.lexists(temp.path):
                _remove(temp.path)
