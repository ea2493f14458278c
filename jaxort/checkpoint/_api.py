"""load / save / to_bytes: Checkpoint <-> ONNX Runtime Training checkpoint files.

Imports numpy and the standard library (and, through _write, the generated
flatbuffers code); never JAX or onnx.
"""

from __future__ import annotations

import mmap as _mmap
import os
import stat
from typing import Optional, Union

import numpy as np

from jaxort.errors import CheckpointError

from ._files import open_external_data, write_files
from ._format import DEFAULT_EXTERNAL_DATA_THRESHOLD, check_path
from ._read import parse
from ._state import Checkpoint
from ._write import build_state, check_state

__all__ = ["load", "load_from_buffer", "save", "to_bytes", "check_threshold", "check_flag"]

PathLike = Union[str, os.PathLike]


def check_flag(value: object, name: str) -> bool:
    """Returns a bool argument, or raises CheckpointError naming what was given."""
    if not isinstance(value, (bool, np.bool_)):
        raise CheckpointError(f"{name} must be a bool, got {value!r:.60}")
    return bool(value)


def check_threshold(value: object) -> Optional[int]:
    """Returns an external_data_threshold argument (an int >= 0, or None)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise CheckpointError(f"external_data_threshold must be an int or None, got {value!r:.60}")
    if value < 0:
        raise CheckpointError(f"external_data_threshold must be >= 0, got {value}")
    return int(value)


def _read_file(path: str, use_mmap: bool, what: str) -> np.ndarray:
    """Returns a file's bytes as a 1-D uint8 array (read once, or memory-mapped)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode) and not os.path.isdir(path):
            # A FIFO would block, a device might never end.
            raise CheckpointError(f"{what} {path!r} is not a regular file")
    except OSError:
        pass  # reported by open() below
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if use_mmap and size:
                return np.frombuffer(_mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ), dtype=np.uint8)
            # np.empty does not touch the pages, so the file's bytes are
            # written to memory once, by readinto.
            data = np.empty(size, dtype=np.uint8)
            view = memoryview(data)
            done = 0
            while done < size:
                n = f.readinto(view[done:])
                if not n:
                    raise CheckpointError(f"{what} {path!r} shrank while being read")
                done += n
            data.flags.writeable = False
            return data
    except FileNotFoundError:
        raise CheckpointError(f"{what} {path!r} does not exist") from None
    except IsADirectoryError:
        raise CheckpointError(f"{what} {path!r} is a directory") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {what} {path!r}: {e}") from e


def load(path: PathLike, *, mmap: bool = False) -> Checkpoint:
    """Loads an ONNX Runtime Training checkpoint file.

    The file is read into memory once; tensors are read-only views of those
    bytes (data misaligned for its dtype, e.g. float64 behind a 4-byte
    aligned vector, is copied). Tensors in an external data file
    (``external_data_path(path)``) are read range by range, after every
    range was checked against the file's size and the others; the file a
    jaxort save wrote with this checkpoint is used (after an interrupted
    save, the backup of the previous one: see docs/checkpoint-format.md).

    Args:
      path: the checkpoint file.
      mmap: map the file(s) instead of reading them; arrays then view the
        mapping, which stays valid while they live. Rewriting the file in
        place (not through ``save``, which replaces it) while mapped can
        crash the process on POSIX systems.

    Returns:
      The Checkpoint, with parameters and properties in file order.

    Raises:
      CheckpointError: ``path`` is not a str or PathLike; the file is
        missing, malformed, of another version; or its external data file is
        missing, too short, or belongs to another save.

    Example:
      >>> state = load("artifacts/checkpoint")  # doctest: +SKIP
      >>> state.trainable["fc1.weight"].shape  # doctest: +SKIP
      (20, 16)
    """
    path = check_path(path)
    use_mmap = check_flag(mmap, "mmap")
    data = _read_file(path, use_mmap, "checkpoint")
    return parse(data, path, lambda: open_external_data(path, data, use_mmap))


def load_from_buffer(buffer: Union[bytes, bytearray, memoryview]) -> Checkpoint:
    """Loads a checkpoint from bytes in memory.

    Arrays view ``buffer`` (read-only); pass ``bytes`` so nothing can change
    them underneath, or copy the arrays.

    Args:
      buffer: the checkpoint file's bytes.

    Returns:
      The Checkpoint.

    Raises:
      CheckpointError: ``buffer`` is not bytes-like, the bytes are
        malformed, of another version, or the checkpoint keeps data in an
        external file (that needs ``load``).
    """
    if isinstance(buffer, (str, int, float)) or buffer is None:
        raise CheckpointError(
            f"a checkpoint buffer must be bytes-like (bytes, bytearray, memoryview, uint8 array), "
            f"got {type(buffer).__name__}"
        )
    try:
        data = np.frombuffer(buffer, dtype=np.uint8)
    except (TypeError, ValueError, BufferError) as e:
        raise CheckpointError(f"cannot read a checkpoint from {type(buffer).__name__}: {e}") from None
    if not data.flags.c_contiguous:
        raise CheckpointError("the checkpoint buffer must be contiguous")
    return parse(data, "checkpoint buffer")


def to_bytes(state: Checkpoint, include_optimizer_state: bool = False) -> bytes:
    """Serializes a state to checkpoint bytes, all data inline.

    Tensors, optimizer groups and properties are written sorted by name, as
    ONNX Runtime Training 1.19.2 does: for the same state the bytes are
    identical to ONNX Runtime's.

    Args:
      state: the state.
      include_optimizer_state: also write the optimizer groups.

    Returns:
      The checkpoint file's bytes.

    Raises:
      CheckpointError: ``state`` is not a Checkpoint, or it holds something
        a checkpoint cannot (unsupported dtype, non-str name, duplicate
        name, bad property, a step outside 0..2**63-2).
    """
    check_state(state, include_optimizer_state)
    b, _ = build_state(state, bool(include_optimizer_state), None)
    return b.output()


def save(
    state: Checkpoint,
    path: PathLike,
    include_optimizer_state: bool = False,
    external_data_threshold: Optional[int] = DEFAULT_EXTERNAL_DATA_THRESHOLD,
) -> None:
    """Saves a state as an ONNX Runtime Training checkpoint, crash-safely.

    Tensor bytes are streamed from the arrays to the file, never gathered
    into one buffer. The file is written to a temporary file next to
    ``path``, fsynced, and renamed over ``path``: on any failure (including
    KeyboardInterrupt) the previous file is intact and no temporary file is
    left, and temporary files that killed saves of ``path`` left are
    removed. When the tensors hold at least ``external_data_threshold``
    bytes, their data goes to ``external_data_path(path)`` (ONNX Runtime's
    layout) and the checkpoint's ``has_external_data`` flag is set; both
    files then end with a record pairing them, so that after a crash at any
    point ``load`` gives the complete previous or the complete new state
    (docs/checkpoint-format.md).

    Args:
      state: the state.
      path: the checkpoint file to write.
      include_optimizer_state: also write the optimizer groups.
      external_data_threshold: bytes of tensor data from which the external
        data file is used (ONNX Runtime's default, 1800 MiB); None never.

    Raises:
      CheckpointError: an argument of the wrong type, a state that cannot
        be written, or an OS error.
    """
    path = check_path(path)
    check_state(state, include_optimizer_state)
    threshold = check_threshold(external_data_threshold)
    b, external = build_state(state, bool(include_optimizer_state), threshold)
    write_files(path, b, external)
