"""A streaming flatbuffer builder that lays bytes out like the C++ FlatBufferBuilder.

The generated code in ``jaxort._fbs`` calls this builder through the same
methods as ``flatbuffers.Builder`` (StartObject, Prepend*Slot, StartVector,
EndVector, CreateString, ...). Two things differ from the Python builder:

- Large byte vectors (tensor data) are not copied into the builder: the
  builder keeps a reference and ``chunks()`` yields them in file order, so a
  save streams array memory straight to the file.
- Alignment follows the C++ builder of flatbuffers 23.5 (used by ONNX Runtime
  1.19.2): an empty vector does not align to its element size. With this,
  jaxort writes the same bytes as ONNX Runtime for the same checkpoint.

Only the standard library is imported here.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

__all__ = ["Builder"]

_FILE_IDENTIFIER_LENGTH = 4
# Byte runs at least this long are kept by reference instead of being copied.
_REFERENCE_MIN_BYTES = 4096


class Builder:
    """Builds one flatbuffer back to front, keeping large vectors by reference."""

    def __init__(self) -> None:
        self._chunks: list[bytes | memoryview] = []  # last chunk = start of the buffer
        self._size = 0
        self._minalign = 1
        self._nested = False
        self._table_start = 0
        self._fields: list[tuple[int, int]] = []  # (slot, offset of the field)
        self._vtables: dict[bytes, int] = {}
        self._vector_count = 0
        self._finished = False

    # -- low level -------------------------------------------------------

    def Offset(self) -> int:
        """Bytes written so far (offsets count from the end of the buffer)."""
        return self._size

    def _push(self, data: bytes | memoryview) -> None:
        if len(data):
            self._chunks.append(data)
            self._size += len(data)

    def _pad(self, n: int) -> None:
        if n:
            self._push(bytes(n))

    def _track_min_align(self, alignment: int) -> None:
        if alignment > self._minalign:
            self._minalign = alignment

    def _align(self, elem_size: int) -> None:
        self._track_min_align(elem_size)
        self._pad(-self._size % elem_size)

    def _pre_align(self, length: int, alignment: int) -> None:
        # flatbuffers 23.5's C++ PreAlign returns early for empty data.
        if length == 0:
            return
        self._track_min_align(alignment)
        self._pad(-(self._size + length) % alignment)

    def _push_scalar(self, fmt: str, value) -> int:
        size = struct.calcsize(fmt)
        self._align(size)
        self._push(struct.pack("<" + fmt, value))
        return self._size

    def _refer_to(self, off: int) -> int:
        self._align(4)
        if not 0 < off <= self._size:
            raise ValueError(f"flatbuffer offset {off} does not refer to a written object")
        return self._size - off + 4

    def _not_nested(self) -> None:
        if self._nested:
            raise ValueError("flatbuffer object started while another is being built")

    # -- tables ----------------------------------------------------------

    def StartObject(self, numfields: int) -> None:
        """Starts a table; fields are added with the Prepend*Slot methods."""
        self._not_nested()
        del numfields
        self._nested = True
        self._fields = []
        self._table_start = self._size

    def _add_scalar(self, slot: int, fmt: str, value, default) -> None:
        # A field equal to its default is not stored. The comparison is on
        # the encoded bytes, so -0.0 is stored while the C++ builder drops it
        # (it compares with ==); ONNX Runtime then reads back +0.0.
        packed = struct.pack("<" + fmt, value)
        if packed == struct.pack("<" + fmt, default):
            return
        size = len(packed)
        self._align(size)
        self._push(packed)
        self._fields.append((slot, self._size))

    def PrependBoolSlot(self, slot: int, value: bool, default: bool) -> None:
        self._add_scalar(slot, "?", bool(value), bool(default))

    def PrependInt32Slot(self, slot: int, value: int, default: int) -> None:
        self._add_scalar(slot, "i", value, default)

    def PrependInt64Slot(self, slot: int, value: int, default: int) -> None:
        self._add_scalar(slot, "q", value, default)

    def PrependFloat32Slot(self, slot: int, value: float, default: float) -> None:
        self._add_scalar(slot, "f", value, default)

    def PrependUOffsetTRelativeSlot(self, slot: int, off: int, default: int) -> None:
        if off == default:
            return
        rel = self._refer_to(off)
        self._push(struct.pack("<I", rel))
        self._fields.append((slot, self._size))

    def EndObject(self) -> int:
        """Ends the table, writing (or reusing) its vtable; returns its offset."""
        if not self._nested:
            raise ValueError("EndObject without StartObject")
        self._align(4)
        table_off = self._size + 4
        max_voffset = max([4 + 2 * slot for slot, _ in self._fields] + [2]) + 2
        object_size = table_off - self._table_start
        if object_size >= 0x10000:
            raise ValueError("flatbuffer table too large")
        vtable = [0] * (max_voffset // 2)
        vtable[0] = max_voffset
        vtable[1] = object_size
        for slot, off in self._fields:
            vtable[2 + slot] = table_off - off
        vt_bytes = struct.pack(f"<{len(vtable)}H", *vtable)
        existing = self._vtables.get(vt_bytes)
        if existing is not None:
            self._push(struct.pack("<i", existing - table_off))
        else:
            # The new vtable goes right before the table.
            self._push(struct.pack("<i", len(vt_bytes)))
            self._push(vt_bytes)
            self._vtables[vt_bytes] = self._size
        self._fields = []
        self._nested = False
        return table_off

    # -- vectors and strings ---------------------------------------------

    def StartVector(self, elem_size: int, num_elems: int, alignment: int) -> int:
        """Starts a vector; elements are prepended last to first."""
        self._not_nested()
        self._nested = True
        self._pre_align(num_elems * elem_size, 4)
        self._pre_align(num_elems * elem_size, alignment)
        self._vector_count = num_elems
        return self._size

    def EndVector(self, vector_num_elems: int | None = None) -> int:
        """Ends the vector started by StartVector; returns its offset."""
        if not self._nested:
            raise ValueError("EndVector without StartVector")
        self._nested = False
        count = self._vector_count if vector_num_elems is None else vector_num_elems
        return self._push_scalar("I", count)

    def PrependUOffsetTRelative(self, off: int) -> None:
        """Prepends an offset to an object already written (vector elements)."""
        self._push(struct.pack("<I", self._refer_to(off)))

    def CreateString(self, s: str | bytes) -> int:
        """Writes a string (UTF-8 for str) and returns its offset."""
        data = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        self._not_nested()
        self._pre_align(len(data) + 1, 4)
        self._pad(1)
        self._push(data)
        return self._push_scalar("I", len(data))

    def CreateOffsetVector(self, offsets: list[int]) -> int:
        """Writes a vector of offsets to tables or strings written before."""
        self.StartVector(4, len(offsets), 4)
        for off in reversed(offsets):
            self.PrependUOffsetTRelative(off)
        return self.EndVector(len(offsets))

    def CreateInt64Vector(self, values) -> int:
        """Writes a vector of int64 values."""
        values = [int(v) for v in values]
        self.StartVector(8, len(values), 8)
        self._push(struct.pack(f"<{len(values)}q", *values))
        return self.EndVector(len(values))

    def CreateBytesVector(self, data: memoryview) -> int:
        """Writes a [uint8] vector; large data is kept by reference, not copied.

        Args:
          data: a 1-D byte memoryview; it must stay unchanged until the
            buffer has been written out.
        """
        n = data.nbytes
        self.StartVector(1, n, 1)
        self._push(data if n >= _REFERENCE_MIN_BYTES else bytes(data))
        return self.EndVector(n)

    def Finish(self, root: int, file_identifier: bytes) -> None:
        """Writes the root offset and the file identifier."""
        self._not_nested()
        self._pre_align(4 + _FILE_IDENTIFIER_LENGTH, self._minalign)
        if len(file_identifier) != _FILE_IDENTIFIER_LENGTH:
            raise ValueError("file identifier must be 4 bytes")
        self._push(bytes(file_identifier))
        self._push_scalar("I", self._refer_to(root))
        self._finished = True

    # -- output ----------------------------------------------------------

    def chunks(self) -> Iterator[bytes | memoryview]:
        """Yields the finished buffer in file order, small pieces joined."""
        if not self._finished:
            raise ValueError("flatbuffer not finished")
        small: list[bytes | memoryview] = []
        for chunk in reversed(self._chunks):
            if isinstance(chunk, memoryview) and chunk.nbytes >= _REFERENCE_MIN_BYTES:
                if small:
                    yield b"".join(small)
                    small = []
                yield chunk
            else:
                small.append(chunk)
        if small:
            yield b"".join(small)

    def output(self) -> bytes:
        """Returns the finished buffer as one bytes object."""
        if not self._finished:
            raise ValueError("flatbuffer not finished")
        return b"".join(reversed(self._chunks))
