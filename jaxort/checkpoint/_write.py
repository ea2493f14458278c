"""Laying out ONNX Runtime Training checkpoints (the files are written by _files.py).

Layout follows ONNX Runtime Training 1.19.2 byte for byte: the same objects
created in the same order with the same builder rules (see _builder.py), so
that jaxort and ONNX Runtime write identical files for the same state. Two
entry points mirror ORT's two SaveCheckpoint overloads:

- ``build_state``: a Checkpoint (ORT sorts tensors, optimizer groups,
  parameters, momentums and properties by name);
- ``build_tensors``: tensors given in order (ORT's TensorProto overload,
  used for the initial checkpoint of an artifact set).

Imports numpy, the standard library and the generated jaxort._fbs code
(which needs the ``flatbuffers`` package); never JAX or onnx.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from jaxort._fbs import Checkpoint as _C
from jaxort._fbs import FloatProperty as _FP
from jaxort._fbs import IntProperty as _IP
from jaxort._fbs import ModuleState as _M
from jaxort._fbs import OptimizerGroup as _G
from jaxort._fbs import ParameterOptimizerState as _P
from jaxort._fbs import PropertyBag as _B
from jaxort._fbs import StringProperty as _SP
from jaxort._fbs import Tensor as _T
from jaxort.dtypes import NUMPY_TO_ONNX
from jaxort.errors import CheckpointError, InputError

from ._builder import Builder
from ._format import (
    CHECKPOINT_VERSION,
    FILE_IDENTIFIER,
    MAX_STEP,
    MIN_EXTERNAL_TENSOR_BYTES,
    STRING,
    SUPPORTED_DTYPES,
    external_alignment,
    step_problem,
)
from ._state import Checkpoint, NominalTensor, OptimizerGroup, normalize_property

__all__ = ["TensorRecord", "build_state", "build_tensors", "check_state", "tensor_record"]


class TensorRecord(NamedTuple):
    """One tensor ready to be written."""

    name: str
    code: int  # ONNX element type
    shape: tuple[int, ...]
    data: Union[memoryview, list[bytes], None]  # bytes, strings, or None (nominal)
    doc_string: Optional[str] = None


def _utf8_key(name: str) -> bytes:
    # ORT sorts std::string keys, i.e. by UTF-8 bytes.
    return name.encode("utf-8")


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str):
        raise CheckpointError(f"{what}: name {name!r} is not a str")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointError(f"{what}: name {name!r} is not valid unicode") from None
    return name


def _string_items(array: np.ndarray, what: str) -> list[bytes]:
    out = []
    for item in array.reshape(-1).tolist():
        if isinstance(item, bytes):
            out.append(item)
        elif isinstance(item, str):
            try:
                out.append(item.encode("utf-8"))
            except UnicodeEncodeError:
                raise CheckpointError(f"{what}: string {item!r} is not valid unicode") from None
        else:
            raise CheckpointError(f"{what}: string tensor holds {type(item).__name__}, not str or bytes")
    return out


def tensor_record(name: str, value: Any, what: str, nominal: bool = False) -> TensorRecord:
    """Turns an array (or NominalTensor) into a TensorRecord, checking it.

    Raises:
      CheckpointError: unsupported dtype, non-array value, or data missing.
    """
    _check_name(name, what)
    if isinstance(value, NominalTensor):
        if not nominal:
            raise CheckpointError(
                f"{what} {name!r} is a NominalTensor (no data) but the state is not nominal"
            )
        dtype, shape = np.dtype(value.dtype), tuple(int(d) for d in value.shape)
    else:
        try:
            array = np.asarray(value)
        except Exception as e:
            raise CheckpointError(f"{what} {name!r}: cannot be converted to a numpy array ({e})") from e
        dtype, shape = array.dtype, array.shape
    if dtype.kind in ("U", "S", "O"):
        code = STRING
    else:
        code = NUMPY_TO_ONNX.get(dtype.newbyteorder("=") if dtype.byteorder == ">" else dtype, -1)
        if code not in SUPPORTED_DTYPES:
            raise CheckpointError(f"{what} {name!r}: dtype {dtype} has no checkpoint element type")
    if any(d < 0 for d in shape):
        raise CheckpointError(f"{what} {name!r}: negative dimension in shape {shape}")
    if nominal:
        return TensorRecord(name, code, shape, None)
    if code == STRING:
        return TensorRecord(name, code, shape, _string_items(array, f"{what} {name!r}"))
    # Little-endian C-order bytes; a copy only when the array is not already so.
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return TensorRecord(name, code, shape, memoryview(array.reshape(-1).view(np.uint8)))


class _ExternalData:
    """Collects the external data file's layout: (padding, data) pieces."""

    def __init__(self) -> None:
        self.pieces: list[Union[bytes, memoryview]] = []
        self.size = 0

    def add(self, code: int, data: memoryview) -> int:
        pad = -self.size % external_alignment(SUPPORTED_DTYPES[code])
        if pad:
            self.pieces.append(bytes(pad))
            self.size += pad
        offset = self.size
        self.pieces.append(data)
        self.size += data.nbytes
        return offset


def _write_tensor(b: Builder, rec: TensorRecord, external: Optional[_ExternalData], min_external: int) -> int:
    name = b.CreateString(rec.name)
    doc = b.CreateString(rec.doc_string) if rec.doc_string is not None else 0
    # ORT's nominal tensors keep name and type; jaxort also keeps the dims.
    dims = b.CreateInt64Vector(rec.shape)
    strings = raw = 0
    offset = -1
    if rec.code == STRING and rec.data is not None:
        # CreateVectorOfStrings: the strings first, in order, then the vector.
        strings = b.CreateOffsetVector([b.CreateString(s) for s in rec.data])
    elif rec.data is None:
        raw = b.CreateBytesVector(memoryview(b""))
    elif external is not None and rec.data.nbytes >= min_external:
        offset = external.add(rec.code, rec.data)
    else:
        raw = b.CreateBytesVector(rec.data)
    _T.TensorStart(b)
    _T.TensorAddName(b, name)
    _T.TensorAddDocString(b, doc)
    _T.TensorAddDims(b, dims)
    _T.TensorAddDataType(b, rec.code)
    if strings:
        _T.TensorAddStringData(b, strings)
    elif offset != -1:
        _T.TensorAddExternalDataOffset(b, offset)
    else:
        _T.TensorAddRawData(b, raw)
    return _T.TensorEnd(b)


def _module_state(
    b: Builder,
    trainable: Sequence[TensorRecord],
    frozen: Sequence[TensorRecord],
    nominal: bool,
    external: Optional[_ExternalData],
    min_external: int,
) -> int:
    rg = [_write_tensor(b, r, external, min_external) for r in trainable]
    fz = [_write_tensor(b, r, external, min_external) for r in frozen]
    rg_vec = b.CreateOffsetVector(rg)
    fz_vec = b.CreateOffsetVector(fz)
    _M.ModuleStateStart(b)
    _M.ModuleStateAddRequiresGradParams(b, rg_vec)
    _M.ModuleStateAddFrozenParams(b, fz_vec)
    _M.ModuleStateAddIsNominalState(b, nominal)
    _M.ModuleStateAddHasExternalData(b, external is not None)
    return _M.ModuleStateEnd(b)


def _check_unique(records: Iterable[TensorRecord], what: str) -> None:
    seen: set[str] = set()
    for r in records:
        if r.name in seen:
            raise CheckpointError(f"{what}: tensor name {r.name!r} appears twice")
        seen.add(r.name)


def _step(value: Any, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise CheckpointError(f"{what}: step {value!r} is not an int")
    value = int(value)
    if not 0 <= value <= MAX_STEP:
        raise CheckpointError(f"{what}: {step_problem(value)}")
    return value


def _float32(value: Any, what: str) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", float(value)))[0]
    except (OverflowError, TypeError, ValueError):
        raise CheckpointError(f"{what}: {value!r} is not a float32 value") from None


def _property_bag(b: Builder, properties: Mapping[str, Any]) -> int:
    ints, floats, strings = [], [], []
    for name in sorted(properties, key=lambda n: _utf8_key(_check_name(n, "property"))):
        what = f"property {name!r}"
        try:
            value = normalize_property(name, properties[name])
        except InputError as e:
            raise CheckpointError(f"{e}; it cannot be saved") from None
        name_off = b.CreateString(name)
        if isinstance(value, int):
            _IP.IntPropertyStart(b)
            _IP.IntPropertyAddName(b, name_off)
            _IP.IntPropertyAddValue(b, value)
            ints.append(_IP.IntPropertyEnd(b))
        elif isinstance(value, float):
            _FP.FloatPropertyStart(b)
            _FP.FloatPropertyAddName(b, name_off)
            _FP.FloatPropertyAddValue(b, value)
            floats.append(_FP.FloatPropertyEnd(b))
        else:
            value_off = b.CreateString(_check_name(value, what + " value"))
            _SP.StringPropertyStart(b)
            _SP.StringPropertyAddName(b, name_off)
            _SP.StringPropertyAddValue(b, value_off)
            strings.append(_SP.StringPropertyEnd(b))
    ints_vec = b.CreateOffsetVector(ints)
    floats_vec = b.CreateOffsetVector(floats)
    strings_vec = b.CreateOffsetVector(strings)
    _B.PropertyBagStart(b)
    _B.PropertyBagAddInts(b, ints_vec)
    _B.PropertyBagAddFloats(b, floats_vec)
    _B.PropertyBagAddStrings(b, strings_vec)
    return _B.PropertyBagEnd(b)


def _sorted_records(tensors: Mapping[str, Any], what: str, nominal: bool) -> list[TensorRecord]:
    names = sorted(tensors, key=lambda n: _utf8_key(_check_name(n, what)))
    return [tensor_record(n, tensors[n], what, nominal) for n in names]


def _data_bytes(records: Iterable[TensorRecord]) -> int:
    return sum(r.data.nbytes for r in records if isinstance(r.data, memoryview))


def check_state(state: Any, include_optimizer_state: Any) -> None:
    """Checks the arguments of a save: a Checkpoint and a bool.

    Raises:
      CheckpointError: naming what was given instead.
    """
    if not isinstance(state, Checkpoint):
        raise CheckpointError(f"expected a jaxort.checkpoint.Checkpoint to save, got {type(state).__name__}")
    if not isinstance(include_optimizer_state, (bool, np.bool_)):
        raise CheckpointError(f"include_optimizer_state must be a bool, got {include_optimizer_state!r}")
    for field in ("trainable", "frozen", "properties"):
        value = getattr(state, field)
        if not isinstance(value, Mapping):
            raise CheckpointError(f"Checkpoint.{field} must be a mapping, got {type(value).__name__}")
    groups = state.optimizer_groups
    if not isinstance(groups, (tuple, list)) or not all(isinstance(g, OptimizerGroup) for g in groups):
        raise CheckpointError(f"Checkpoint.optimizer_groups must be a tuple of OptimizerGroup, got {groups!r:.80}")
    for g in groups if include_optimizer_state else ():
        if not isinstance(g.states, Mapping) or not all(isinstance(m, Mapping) for m in g.states.values()):
            raise CheckpointError(f"optimizer group {g.name!r}: states must map parameter names to mappings")


def build_state(
    state: Checkpoint, include_optimizer_state: bool, external_data_threshold: Optional[int]
) -> tuple[Builder, Optional[_ExternalData]]:
    """Lays out a Checkpoint as ORT's SaveCheckpoint(state) does.

    Args:
      state: the state to write.
      include_optimizer_state: write the optimizer groups.
      external_data_threshold: when the tensors hold at least this many
        bytes, all non-string tensor data goes to the external data file;
        None never does.

    Returns:
      The finished builder and the external data layout (None when unused).

    Raises:
      CheckpointError: the state cannot be written (bad names, dtypes, ...).
    """
    check_state(state, include_optimizer_state)
    trainable = _sorted_records(state.trainable, "trainable parameter", state.is_nominal)
    frozen = _sorted_records(state.frozen, "frozen parameter", state.is_nominal)
    _check_unique([*trainable, *frozen], "parameters")
    groups = []
    if include_optimizer_state:
        group_names = [_check_name(g.name, "optimizer group") for g in state.optimizer_groups]
        if len(set(group_names)) != len(group_names):
            raise CheckpointError(f"optimizer groups: duplicate group name in {group_names}")
        for group in sorted(state.optimizer_groups, key=lambda g: _utf8_key(g.name)):
            what = f"optimizer group {group.name!r}"
            params = sorted(group.states, key=lambda n: _utf8_key(_check_name(n, what)))
            states = [
                (p, _sorted_records(group.states[p], f"{what} parameter {p!r} momentum", False)) for p in params
            ]
            groups.append((group, states))

    all_records = [*trainable, *frozen, *(r for _, st in groups for _, rs in st for r in rs)]
    external = None
    if (
        not state.is_nominal
        and (trainable or frozen)
        and external_data_threshold is not None
        and _data_bytes(all_records) >= external_data_threshold
    ):
        external = _ExternalData()

    b = Builder()
    module = 0
    # ORT writes no module state for a state without parameters; an empty
    # nominal state keeps one so that the flag survives.
    if trainable or frozen or state.is_nominal:
        # ORT's state path sends every tensor to the external file (no minimum size).
        module = _module_state(b, trainable, frozen, state.is_nominal, external, 0)
    group_offsets = []
    for group, states in groups:
        what = f"optimizer group {group.name!r}"
        state_offsets = []
        for param, records in states:
            momentums = [_write_tensor(b, r, external, 0) for r in records]
            param_off = b.CreateString(param)
            momentums_vec = b.CreateOffsetVector(momentums)
            _P.ParameterOptimizerStateStart(b)
            _P.ParameterOptimizerStateAddParamName(b, param_off)
            _P.ParameterOptimizerStateAddMomentums(b, momentums_vec)
            state_offsets.append(_P.ParameterOptimizerStateEnd(b))
        name_off = b.CreateString(group.name)
        states_vec = b.CreateOffsetVector(state_offsets)
        _G.OptimizerGroupStart(b)
        _G.OptimizerGroupAddGroupName(b, name_off)
        _G.OptimizerGroupAddInitialLearningRate(b, _float32(group.initial_learning_rate, what + " learning rate"))
        _G.OptimizerGroupAddStep(b, _step(group.step, what))
        _G.OptimizerGroupAddOptimizerStates(b, states_vec)
        group_offsets.append(_G.OptimizerGroupEnd(b))
    bag = _property_bag(b, state.properties) if state.properties else 0
    groups_vec = b.CreateOffsetVector(group_offsets)
    _C.CheckpointStart(b)
    _C.CheckpointAddVersion(b, CHECKPOINT_VERSION)
    _C.CheckpointAddModuleState(b, module)
    _C.CheckpointAddOptimizerGroups(b, groups_vec)
    _C.CheckpointAddPropertyBag(b, bag)
    b.Finish(_C.CheckpointEnd(b), FILE_IDENTIFIER)
    return b, external


def build_tensors(
    trainable: Sequence[TensorRecord],
    frozen: Sequence[TensorRecord],
    nominal: bool,
    external_data_threshold: Optional[int],
    total_bytes: Optional[int] = None,
) -> tuple[Builder, Optional[_ExternalData]]:
    """Lays out tensors in the given order, as ORT's SaveCheckpoint(tensor protos) does.

    Args:
      trainable: the requires_grad tensors, in file order.
      frozen: the other tensors, in file order.
      nominal: write a nominal checkpoint (records carry no data).
      external_data_threshold: external data is used when ``total_bytes``
        reaches it; then tensors of at least 64 bytes (not strings) go to the
        external data file. None never does.
      total_bytes: the size ORT compares with the threshold (serialized
        TensorProto sizes); defaults to the tensor data bytes.

    Returns:
      The finished builder and the external data layout (None when unused).

    Raises:
      CheckpointError: duplicate names.
    """
    _check_unique([*trainable, *frozen], "parameters")
    if total_bytes is None:
        total_bytes = _data_bytes([*trainable, *frozen])
    external = None
    if not nominal and external_data_threshold is not None and total_bytes >= external_data_threshold:
        external = _ExternalData()
    b = Builder()
    module = _module_state(b, trainable, frozen, nominal, external, MIN_EXTERNAL_TENSOR_BYTES)
    _C.CheckpointStart(b)
    _C.CheckpointAddVersion(b, CHECKPOINT_VERSION)
    _C.CheckpointAddModuleState(b, module)
    b.Finish(_C.CheckpointEnd(b), FILE_IDENTIFIER)
    return b, external
