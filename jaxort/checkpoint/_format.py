"""Constants of the ONNX Runtime Training checkpoint format shared by reader and writer.

Imports numpy and jaxort.dtypes only.
"""

from __future__ import annotations

import os

import numpy as np

from jaxort.dtypes import ONNX_TO_NUMPY, onnx_type_name

__all__ = [
    "FILE_IDENTIFIER",
    "CHECKPOINT_VERSION",
    "DEFAULT_EXTERNAL_DATA_THRESHOLD",
    "MIN_EXTERNAL_TENSOR_BYTES",
    "MAX_RANK",
    "STRING",
    "SUPPORTED_DTYPES",
    "external_data_path",
    "external_alignment",
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

# Element types a checkpoint tensor may have: everything with a whole-byte
# numpy dtype. The 4-bit types pack two elements per byte and are left out.
SUPPORTED_DTYPES: dict[int, np.dtype] = {
    code: dt for code, dt in ONNX_TO_NUMPY.items() if code not in (21, 22, 23)
}


def external_data_path(path: str | os.PathLike) -> str:
    """Returns the path of a checkpoint's external data file.

    ONNX Runtime Training (ExternalCheckpointDataPath) appends ``.data`` to
    the checkpoint path.

    Args:
      path: the checkpoint file.

    Returns:
      ``path + ".data"`` as a string.

    Example:
      >>> external_data_path("ckpt/checkpoint")
      'ckpt/checkpoint.data'
    """
    return os.fspath(path) + ".data"


def external_alignment(dtype: np.dtype) -> int:
    """Alignment of a tensor's bytes in the external data file.

    ORT 1.19.2 aligns DOUBLE, INT64 and UINT64 data to 8 bytes and all other
    data to 4; 8-byte-aligned complex128 follows the same rule.
    """
    return 8 if dtype.alignment >= 8 else 4


def type_label(code: int) -> str:
    """Returns ``'FLOAT (1)'`` style text for an element type number."""
    return f"{'UNDEFINED' if code == 0 else onnx_type_name(code)} ({code})"
