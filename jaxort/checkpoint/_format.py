"""Constants of the ONNX Runtime Training checkpoint format shared by reader and writer.

Imports numpy, jaxort.dtypes and jaxort.errors only.
"""

from __future__ import annotations

import os

import numpy as np

from jaxort.dtypes import ONNX_TO_NUMPY, onnx_type_name
from jaxort.errors import CheckpointError

__all__ = [
    "FILE_IDENTIFIER",
    "CHECKPOINT_VERSION",
    "DEFAULT_EXTERNAL_DATA_THRESHOLD",
    "MIN_EXTERNAL_TENSOR_BYTES",
    "MAX_RANK",
    "MAX_STEP",
    "STRING",
    "SUPPORTED_DTYPES",
    "check_path",
    "external_data_path",
    "external_alignment",
    "step_problem",
    "type_label",
]

FILE_IDENTIFIER = b"ODTC"
# onnxruntime-training 1.19.2 writes and accepts exactly this version.
CHECKPOINT_VERSION = 2
DEFAULT_EXTERNAL_DATA_THRESHOLD = 1800 * 1024**2
# ORT's SaveInitializerOrtFormat keeps tensors under 64 bytes inline even in
# external-data mode (kMinimumSizeForExternalData); the state path does not.
MIN_EXTERNAL_TENSOR_BYTES = 64
# numpy cannot hold arrays of higher rank; a file claiming more is rejected
# before any per-dimension work.
MAX_RANK = 64
STRING = 8
# An optimizer group's step counts the optimizer steps taken (0 for a fresh
# optimizer). ONNX Runtime 1.19.2 stores it as int64 and feeds step + 1 (an
# int64 tensor) to its AdamWOptimizer kernel, which raises the betas to that
# power for the bias correction: a negative step makes the power 0 or negative
# (every parameter becomes NaN or moves backwards), and the largest int64
# leaves no next step.
MAX_STEP = 2**63 - 2

# Element types a checkpoint tensor may have: everything with a whole-byte
# numpy dtype. The 4-bit types pack two elements per byte and are left out.
SUPPORTED_DTYPES: dict[int, np.dtype] = {
    code: dt for code, dt in ONNX_TO_NUMPY.items() if code not in (21, 22, 23)
}


def check_path(path: object, what: str = "checkpoint path") -> str:
    """Returns ``path`` as a str, or raises CheckpointError naming what was given."""
    if isinstance(path, (str, os.PathLike)):
        path = os.fspath(path)
    if not isinstance(path, str):
        shown = repr(path)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise CheckpointError(f"{what} must be a str or os.PathLike, got {type(path).__name__} ({shown})")
    if "\0" in path:
        raise CheckpointError(f"{what} {path!r} contains a NUL character")
    if not path:
        raise CheckpointError(f"{what} is empty")
    return path


def external_data_path(path: str | os.PathLike) -> str:
    """Returns the path of a checkpoint's external data file.

    ONNX Runtime Training (ExternalCheckpointDataPath) appends ``.data`` to
    the checkpoint path.

    Args:
      path: the checkpoint file.

    Returns:
      ``path + ".data"`` as a string.

    Raises:
      CheckpointError: ``path`` is not a str or os.PathLike.

    Example:
      >>> external_data_path("ckpt/checkpoint")
      'ckpt/checkpoint.data'
    """
    return check_path(path) + ".data"


def external_alignment(dtype: np.dtype) -> int:
    """Alignment of a tensor's bytes in the external data file.

    ORT 1.19.2 aligns DOUBLE, INT64 and UINT64 data to 8 bytes and all other
    data to 4; 8-byte-aligned complex128 follows the same rule.
    """
    return 8 if dtype.alignment >= 8 else 4


def type_label(code: int) -> str:
    """Returns ``'FLOAT (1)'`` style text for an element type number."""
    return f"{'UNDEFINED' if code == 0 else onnx_type_name(code)} ({code})"


def step_problem(step: int) -> str:
    """Says why ``step`` is no optimizer group step (it is outside 0..MAX_STEP)."""
    if step < 0:
        return f"step {step} is negative; a step counts the optimizer steps taken (0 for a fresh optimizer)"
    return (
        f"step {step} is beyond {MAX_STEP}, the largest step whose next step ONNX Runtime's "
        "optimizer kernel can take (it receives step + 1 as int64)"
    )
