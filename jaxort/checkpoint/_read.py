"""Reading ONNX Runtime Training checkpoints: a validating flatbuffer walker.

The bytes may come from anyone, so nothing here trusts an offset, a length or
a count: every read is bounds-checked before it happens, every problem raises
CheckpointError naming it (and the tensor), and the work done is bounded by
the buffer size (offsets may be shared or point backwards, so the walker
counts the objects it visits). Tensor data is returned as read-only numpy
views of the buffer; only data misaligned for its dtype is copied.

Field slots follow fbs/checkpoint.fbs and fbs/ort.fbs (a test checks this
walker against the generated jaxort._fbs reader). Imports numpy only.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import numpy as np

from jaxort.errors import CheckpointError

from ._format import (
    CHECKPOINT_VERSION,
    FILE_IDENTIFIER,
    MAX_RANK,
    MAX_STEP,
    STRING,
    SUPPORTED_DTYPES,
    step_problem,
    type_label,
)
from ._state import Checkpoint, NominalTensor, OptimizerGroup

__all__ = ["parse", "uses_external_data"]

# Field slots (index in the table's field list).
_T_NAME, _T_DOC, _T_DIMS, _T_TYPE, _T_RAW, _T_STRINGS, _T_EXT = range(7)
_M_TRAINABLE, _M_FROZEN, _M_NOMINAL, _M_EXTERNAL = range(4)
_P_NAME, _P_MOMENTUMS = range(2)
_G_NAME, _G_STEP, _G_LR, _G_STATES = range(4)
_B_INTS, _B_FLOATS, _B_STRINGS = range(3)
_C_VERSION, _C_MODULE, _C_GROUPS, _C_PROPERTIES = range(4)

_MAX_BYTES = np.iinfo(np.intp).max
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_HH = struct.Struct("<HH")
_H = struct.Struct("<H")


class _Pending(NamedTuple):
    """A tensor whose bytes lie in the external data file, read after every range is checked."""

    what: str
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple[int, ...]


class _Table:
    __slots__ = ("pos", "vt", "vt_size", "size", "what")

    def __init__(self, pos: int, vt: int, vt_size: int, size: int, what: str):
        self.pos, self.vt, self.vt_size, self.size, self.what = pos, vt, vt_size, size, what


class _Walker:
    """Bounds-checked reads from one flatbuffer."""

    def __init__(self, data: np.ndarray, source: str, external: Optional[Callable[[], Any]]):
        self.data = data
        self.mv = memoryview(data)
        self.n = data.nbytes
        self.source = source
        self.base_address = data.ctypes.data
        # Each table, string and vector visited is charged the bytes it
        # occupies at least. Objects of a well-formed buffer do not overlap
        # (only vtables are shared, and they are not charged), so the charges
        # never exceed its size; offsets that share or reuse objects to make
        # the walk (or the copies of misaligned data) grow without bound do.
        self.budget = self.n + 64
        self._external_loader = external
        # (mapping, key, _Pending) of every tensor whose data is external.
        self._pending: list[tuple[dict, str, _Pending]] = []
        # (start, end, what) of every non-empty raw_data vector.
        self._inline_ranges: list[tuple[int, int, str]] = []

    def fail(self, message: str) -> CheckpointError:
        return CheckpointError(f"{self.source}: {message}")

    def spend(self, nbytes: int, what: str) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise self.fail(
                f"{what}: the checkpoint's objects overlap, referencing more bytes than the "
                f"{self.n} it holds (shared offsets)"
            )

    def u32(self, pos: int, what: str) -> int:
        if pos < 0 or pos + 4 > self.n:
            raise self.fail(f"{what}: offset {pos} is outside the buffer ({self.n} bytes)")
        return _U32.unpack_from(self.mv, pos)[0]

    # -- tables ----------------------------------------------------------

    def table(self, pos: int, what: str) -> _Table:
        self.spend(4, what)
        if pos < 0 or pos + 4 > self.n:
            raise self.fail(f"{what}: table offset {pos} is outside the buffer ({self.n} bytes)")
        vt = pos - _I32.unpack_from(self.mv, pos)[0]
        if vt < 0 or vt + 4 > self.n:
            raise self.fail(f"{what}: vtable offset {vt} is outside the buffer ({self.n} bytes)")
        vt_size, size = _HH.unpack_from(self.mv, vt)
        if vt_size < 4 or vt_size % 2 or vt + vt_size > self.n:
            raise self.fail(f"{what}: invalid vtable (size {vt_size} at offset {vt})")
        if size < 4 or pos + size > self.n:
            raise self.fail(f"{what}: table of {size} bytes at offset {pos} runs past the end of the buffer")
        return _Table(pos, vt, vt_size, size, what)

    def field(self, t: _Table, slot: int, size: int, name: str) -> Optional[int]:
        voffset = 4 + 2 * slot
        if voffset + 2 > t.vt_size:
            return None
        off = _H.unpack_from(self.mv, t.vt + voffset)[0]
        if off == 0:
            return None
        if off + size > t.size:
            raise self.fail(f"{t.what}: field {name} lies outside its table")
        return t.pos + off

    def scalar(self, t: _Table, slot: int, fmt: str, default: Any, name: str) -> Any:
        s = struct.Struct("<" + fmt)
        pos = self.field(t, slot, s.size, name)
        return default if pos is None else s.unpack_from(self.mv, pos)[0]

    def ref(self, t: _Table, slot: int, name: str) -> Optional[int]:
        pos = self.field(t, slot, 4, name)
        if pos is None:
            return None
        return pos + _U32.unpack_from(self.mv, pos)[0]

    def vector(self, t: _Table, slot: int, elem_size: int, name: str) -> Optional[tuple[int, int]]:
        """Returns (position of the first element, count), or None when absent."""
        pos = self.ref(t, slot, name)
        if pos is None:
            return None
        count = self.u32(pos, f"{t.what}: {name}")
        start = pos + 4
        if start + count * elem_size > self.n:
            raise self.fail(
                f"{t.what}: {name} claims {count} elements of {elem_size} bytes at offset {start}, "
                f"past the end of the buffer ({self.n} bytes)"
            )
        self.spend(4 + count * elem_size, f"{t.what}: {name}")
        return start, count

    def tables(self, t: _Table, slot: int, name: str) -> list[int]:
        """Returns the positions of the tables a vector of offsets points to."""
        vec = self.vector(t, slot, 4, name)
        if vec is None:
            return []
        start, count = vec
        return [start + 4 * i + _U32.unpack_from(self.mv, start + 4 * i)[0] for i in range(count)]

    def raw_string(self, pos: int, what: str) -> bytes:
        length = self.u32(pos, what)
        end = pos + 4 + length
        if end + 1 > self.n:
            raise self.fail(f"{what}: string of {length} bytes at offset {pos} runs past the end of the buffer")
        self.spend(length + 5, what)
        if self.mv[end] != 0:
            raise self.fail(f"{what}: string at offset {pos} is not null-terminated")
        return bytes(self.mv[pos + 4 : end])

    def string(self, pos: int, what: str) -> str:
        raw = self.raw_string(pos, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what}: {raw[:40]!r} is not valid UTF-8") from None

    def required_string(self, t: _Table, slot: int, name: str) -> str:
        pos = self.ref(t, slot, name)
        if pos is None:
            raise self.fail(f"{t.what} has no {name}")
        return self.string(pos, f"{t.what}: {name}")

    # -- tensors ---------------------------------------------------------

    def view(self, source: np.ndarray, start: int, dtype: np.dtype, shape: tuple[int, ...], what: str) -> np.ndarray:
        count = math.prod(shape)
        if count == 0:
            out = np.empty(shape, dtype)
        else:
            out = np.frombuffer(source, dtype=dtype, count=count, offset=start)
            if (source.ctypes.data + start) % dtype.alignment:
                # Misaligned data (the C++ builder aligns byte vectors to 4
                # only, e.g. float64) is copied so arrays are always aligned.
                # Ranges do not overlap, so the copies are bounded by the
                # files' sizes.
                try:
                    out = out.copy()
                except MemoryError:
                    raise self.fail(f"{what}: {out.nbytes} bytes of misaligned data do not fit in memory") from None
            out = out.reshape(shape)
        if dtype == np.bool_ and out.size and out.view(np.uint8).max() > 1:
            raise self.fail(f"{what}: BOOL data holds bytes other than 0 and 1")
        out.flags.writeable = False
        return out

    def tensor(self, pos: int, what: str, nominal: bool) -> tuple[str, Any]:
        t = self.table(pos, what)
        name = self.required_string(t, _T_NAME, "name")
        t.what = what = f"{what} {name!r}"

        dims_vec = self.vector(t, _T_DIMS, 8, "dims")
        if dims_vec is None:
            raise self.fail(f"{what} has no dims")
        start, rank = dims_vec
        if rank > MAX_RANK:
            raise self.fail(f"{what}: rank {rank} exceeds numpy's limit of {MAX_RANK} dimensions")
        shape = struct.unpack_from(f"<{rank}q", self.mv, start)
        if any(d < 0 for d in shape):
            raise self.fail(f"{what}: negative dimension in dims {list(shape)}")

        code = self.scalar(t, _T_TYPE, "i", 0, "data_type")
        dtype = SUPPORTED_DTYPES.get(code)
        if dtype is None:
            raise self.fail(f"{what}: unknown or unsupported data_type {type_label(code)}")
        # numpy refuses shapes whose nonzero dims multiply past its index
        # range, even for empty arrays.
        if math.prod(d for d in shape if d) * dtype.itemsize > _MAX_BYTES:
            raise self.fail(f"{what}: dims {list(shape)} describe more data than any array can hold")
        if nominal:
            return name, NominalTensor(tuple(shape), dtype)

        count = math.prod(shape)
        if code == STRING:
            return name, self._string_tensor(t, shape, count)

        nbytes = count * dtype.itemsize
        offset = self.scalar(t, _T_EXT, "q", -1, "external_data_offset")
        if offset != -1:
            if offset < 0:
                raise self.fail(f"{what}: negative external_data_offset {offset}")
            if self._external_loader is None:
                raise self.fail(
                    f"{what} keeps its data in the external data file, which a checkpoint read "
                    "from a buffer cannot reach; load it from its path"
                )
            # Read once every range is known to lie inside the file and to
            # overlap no other (see _read_external).
            return name, _Pending(what, offset, nbytes, dtype, tuple(shape))
        raw = self.vector(t, _T_RAW, 1, "raw_data")
        start, size = raw if raw is not None else (0, 0)
        if size != nbytes:
            raise self.fail(
                f"{what}: raw_data has {size} bytes but dims {list(shape)} of "
                f"{type_label(code)} need {nbytes}"
            )
        if size:
            self._inline_ranges.append((start, start + size, what))
        return name, self.view(self.data, start, dtype, shape, what)

    def _string_tensor(self, t: _Table, shape: tuple[int, ...], count: int) -> np.ndarray:
        vec = self.vector(t, _T_STRINGS, 4, "string_data")
        start, size = vec if vec is not None else (0, 0)
        if size != count:
            raise self.fail(f"{t.what}: string_data has {size} strings but dims {list(shape)} need {count}")
        out = np.empty(count, dtype=object)
        for i in range(count):
            elem = start + 4 * i
            raw = self.raw_string(elem + _U32.unpack_from(self.mv, elem)[0], f"{t.what}: string_data[{i}]")
            try:
                out[i] = raw.decode("utf-8")
            except UnicodeDecodeError:
                # ONNX strings are bytes; keep undecodable ones as bytes so
                # they round-trip exactly.
                out[i] = raw
        out = out.reshape(shape)
        out.flags.writeable = False
        return out

    def tensors(self, t: _Table, slot: int, name: str, nominal: bool, seen: dict[str, str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, pos in enumerate(self.tables(t, slot, name)):
            key, value = self.tensor(pos, f"{name}[{i}]", nominal)
            if key in seen:
                raise self.fail(f"{name}[{i}]: tensor name {key!r} already used in {seen[key]}")
            seen[key] = name
            out[key] = value
            if isinstance(value, _Pending):
                self._pending.append((out, key, value))
        return out

    def _check_disjoint(self, ranges: list[tuple[int, int, str]], where: str) -> None:
        # No checkpoint writer shares tensor bytes; sharing would make a
        # re-save write the bytes once per tensor.
        ranges.sort()
        for (_, end, first), (start, next_end, second) in zip(ranges, ranges[1:]):
            if start < end:
                raise self.fail(
                    f"{second}: its {where} [{start}, {next_end}) overlaps that of {first} (up to {end}); "
                    "tensors may not share data bytes"
                )

    def _read_external(self) -> None:
        """Checks every external range against the data file's size and each other, then reads them."""
        if not self._pending:
            return
        ext = self._external_loader()
        try:
            for _, _, p in self._pending:
                if p.offset + p.nbytes > ext.size:
                    raise self.fail(
                        f"{p.what}: external data [{p.offset}, {p.offset + p.nbytes}) lies past the end of "
                        f"the external data file ({ext.size} bytes)"
                    )
            self._check_disjoint(
                [(p.offset, p.offset + p.nbytes, p.what) for _, _, p in self._pending if p.nbytes], "external data"
            )
            for out, key, p in self._pending:
                raw = ext.array(p.offset, p.nbytes, p.what) if p.nbytes else np.zeros(0, np.uint8)
                out[key] = self.view(raw, 0, p.dtype, p.shape, p.what)
        finally:
            ext.close()

    # -- the checkpoint --------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        if self.n < 12:
            raise self.fail(f"truncated: {self.n} bytes cannot hold a checkpoint")
        ident = bytes(self.mv[4:8])
        if ident != FILE_IDENTIFIER:
            raise self.fail(
                f"not an ONNX Runtime Training checkpoint: file identifier is {ident!r}, "
                f"expected {FILE_IDENTIFIER!r}"
            )
        root = self.table(self.u32(0, "root offset"), "checkpoint")
        version = self.scalar(root, _C_VERSION, "i", 0, "version")
        if version != CHECKPOINT_VERSION:
            raise self.fail(
                f"unsupported checkpoint version {version}; jaxort reads version {CHECKPOINT_VERSION} "
                "(ONNX Runtime Training 1.19)"
            )

        trainable: dict[str, Any] = {}
        frozen: dict[str, Any] = {}
        nominal = has_external = False
        module_pos = self.ref(root, _C_MODULE, "module_state")
        if module_pos is not None:
            module = self.table(module_pos, "module_state")
            nominal = bool(self.scalar(module, _M_NOMINAL, "?", False, "is_nominal_state"))
            has_external = bool(self.scalar(module, _M_EXTERNAL, "?", False, "has_external_data"))
            seen: dict[str, str] = {}
            trainable = self.tensors(module, _M_TRAINABLE, "requires_grad_params", nominal, seen)
            frozen = self.tensors(module, _M_FROZEN, "frozen_params", nominal, seen)

        groups = []
        group_names: set[str] = set()
        for i, pos in enumerate(self.tables(root, _C_GROUPS, "optimizer_groups")):
            group = self._group(pos, f"optimizer_groups[{i}]")
            if group.name in group_names:
                raise self.fail(f"optimizer_groups[{i}]: group name {group.name!r} appears twice")
            group_names.add(group.name)
            groups.append(group)

        properties: dict[str, Any] = {}
        bag_pos = self.ref(root, _C_PROPERTIES, "property_bag")
        if bag_pos is not None:
            properties = self._properties(self.table(bag_pos, "property_bag"))

        self._check_disjoint(self._inline_ranges, "raw_data")
        self._read_external()

        return Checkpoint(
            trainable=trainable,
            frozen=frozen,
            optimizer_groups=tuple(groups),
            properties=properties,
            is_nominal=nominal,
            has_external_data=has_external,
        )

    def _group(self, pos: int, what: str) -> OptimizerGroup:
        t = self.table(pos, what)
        name = self.required_string(t, _G_NAME, "group_name")
        t.what = what = f"{what} {name!r}"
        step = self.scalar(t, _G_STEP, "q", 0, "step")
        if not 0 <= step <= MAX_STEP:
            raise self.fail(f"{what}: {step_problem(step)}")
        lr = self.scalar(t, _G_LR, "f", 0.0, "initial_learning_rate")
        states: dict[str, dict[str, np.ndarray]] = {}
        for i, state_pos in enumerate(self.tables(t, _G_STATES, "optimizer_states")):
            st = self.table(state_pos, f"{what} optimizer_states[{i}]")
            param = self.required_string(st, _P_NAME, "param_name")
            if param in states:
                raise self.fail(f"{st.what}: parameter {param!r} appears twice")
            st.what = f"{st.what} {param!r}"
            states[param] = self.tensors(st, _P_MOMENTUMS, f"{st.what} momentums", False, {})
        return OptimizerGroup(name=name, step=int(step), initial_learning_rate=float(lr), states=states)

    def _properties(self, bag: _Table) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for slot, kind, fmt, default in ((_B_INTS, "ints", "q", 0), (_B_FLOATS, "floats", "f", 0.0)):
            for i, pos in enumerate(self.tables(bag, slot, kind)):
                p = self.table(pos, f"property_bag.{kind}[{i}]")
                name = self.required_string(p, 0, "name")
                if name in out:
                    raise self.fail(f"{p.what}: property {name!r} appears twice")
                value = self.scalar(p, 1, fmt, default, "value")
                out[name] = int(value) if fmt == "q" else float(value)
        for i, pos in enumerate(self.tables(bag, _B_STRINGS, "strings")):
            p = self.table(pos, f"property_bag.strings[{i}]")
            name = self.required_string(p, 0, "name")
            if name in out:
                raise self.fail(f"{p.what}: property {name!r} appears twice")
            out[name] = self.required_string(p, 1, "value")
        return out


def uses_external_data(data: np.ndarray) -> bool:
    """Whether checkpoint bytes set ``has_external_data`` (False for bytes that are no checkpoint)."""
    try:
        w = _Walker(data, "checkpoint", None)
        if w.n < 12 or bytes(w.mv[4:8]) != FILE_IDENTIFIER:
            return False
        root = w.table(w.u32(0, "root offset"), "checkpoint")
        module_pos = w.ref(root, _C_MODULE, "module_state")
        if module_pos is None:
            return False
        module = w.table(module_pos, "module_state")
        return bool(w.scalar(module, _M_EXTERNAL, "?", False, "has_external_data"))
    except CheckpointError:
        return False


def parse(
    data: np.ndarray,
    source: str,
    external: Optional[Callable[[], Any]] = None,
) -> Checkpoint:
    """Parses a checkpoint held in a 1-D uint8 array.

    Args:
      data: the checkpoint bytes; arrays in the result view it.
      source: how to name the checkpoint in errors (a path, or "buffer").
      external: opens the external data file (a ``_files.ExternalData``,
        raising CheckpointError when it is missing or belongs to another
        save); called only when a tensor keeps its data there, after the
        whole flatbuffer was read; None when there is no path to find it.

    Returns:
      The Checkpoint.

    Raises:
      CheckpointError: the bytes are not a valid version-2 checkpoint.
    """
    return _Walker(data, source, external).checkpoint()
