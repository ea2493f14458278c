from __future__ import annotations

import flatbuffers
import numpy as np

import typing
from typing import cast

uoffset: typing.TypeAlias = flatbuffers.number_types.UOffsetTFlags.py_type

class TensorDataType(object):
  UNDEFINED = cast(int, ...)
  FLOAT = cast(int, ...)
  UINT8 = cast(int, ...)
  INT8 = cast(int, ...)
  UINT16 = cast(int, ...)
  INT16 = cast(int, ...)
  INT32 = cast(int, ...)
  INT64 = cast(int, ...)
  STRING = cast(int, ...)
  BOOL = cast(int, ...)
  FLOAT16 = cast(int, ...)
  DOUBLE = cast(int, ...)
  UINT32 = cast(int, ...)
  UINT64 = cast(int, ...)
  COMPLEX64 = cast(int, ...)
  COMPLEX128 = cast(int, ...)
  BFLOAT16 = cast(int, ...)
  FLOAT8E4M3FN = cast(int, ...)
  FLOAT8E4M3FNUZ = cast(int, ...)
  FLOAT8E5M2 = cast(int, ...)
  FLOAT8E5M2FNUZ = cast(int, ...)

