"""ONNX tensor element types and their numpy dtypes.

One table maps ONNX ``TensorProto.DataType`` numbers to numpy dtypes
(float16/bfloat16/float8/int4 from ml_dtypes). The checkpoint layer and the
graph layer both use it, so it imports numpy and ml_dtypes only (no JAX, no
onnx): a user inspecting a checkpoint needs nothing else.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "ONNX_TO_NUMPY",
    "NUMPY_TO_ONNX",
    "ONNX_TYPE_NAMES",
    "to_numpy_dtype",
    "to_onnx_type",
    "onnx_type_name",
]

# TensorProto.DataType numbering (onnx.proto3). Types numpy cannot hold
# (complex with bfloat parts, 2-bit and 6-bit types) are left out.
ONNX_TYPE_NAMES: dict[int, str] = {
    1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32",
    7: "INT64", 8: "STRING", 9: "BOOL", 10: "FLOAT16", 11: "DOUBLE",
    12: "UINT32", 13: "UINT64", 14: "COMPLEX64", 15: "COMPLEX128",
    16: "BFLOAT16", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2",
    20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1",
    24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2",
}

ONNX_TO_NUMPY: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    8: np.dtype(object),
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
    14: np.dtype(np.complex64),
    15: np.dtype(np.complex128),
    16: np.dtype(ml_dtypes.bfloat16),
    17: np.dtype(ml_dtypes.float8_e4m3fn),
    18: np.dtype(ml_dtypes.float8_e4m3fnuz),
    19: np.dtype(ml_dtypes.float8_e5m2),
    20: np.dtype(ml_dtypes.float8_e5m2fnuz),
    21: np.dtype(ml_dtypes.uint4),
    22: np.dtype(ml_dtypes.int4),
    23: np.dtype(ml_dtypes.float4_e2m1fn),
}
# Newer ONNX types, where the installed ml_dtypes has them.
for _code, _name in ((24, "float8_e8m0fnu"), (25, "uint2"), (26, "int2")):
    if hasattr(ml_dtypes, _name):
        ONNX_TO_NUMPY[_code] = np.dtype(getattr(ml_dtypes, _name))

NUMPY_TO_ONNX: dict[np.dtype, int] = {
    dt: code for code, dt in ONNX_TO_NUMPY.items() if code != 8
}
NUMPY_TO_ONNX[np.dtype(object)] = 8


def to_numpy_dtype(onnx_type: int) -> np.dtype:
    """Returns the numpy dtype of an ONNX element type number.

    Raises:
      KeyError: naming the type when numpy (with ml_dtypes) cannot hold it.
    """
    try:
        return ONNX_TO_NUMPY[int(onnx_type)]
    except KeyError:
        raise KeyError(
            f"ONNX element type {onnx_type} ({ONNX_TYPE_NAMES.get(onnx_type, 'unknown')}) "
            "has no numpy dtype"
        ) from None


def to_onnx_type(dtype) -> int:
    """Returns the ONNX element type number of a numpy dtype (str dtypes map to STRING)."""
    dt = np.dtype(dtype)
    if dt.kind in ("U", "S", "O"):
        return 8
    try:
        return NUMPY_TO_ONNX[dt]
    except KeyError:
        raise KeyError(f"numpy dtype {dt} has no ONNX element type") from None


def onnx_type_name(onnx_type: int) -> str:
    """Returns the TensorProto name of an element type (``1 -> 'FLOAT'``)."""
    return ONNX_TYPE_NAMES.get(int(onnx_type), f"UNKNOWN({onnx_type})")
