"""Checkpoints <-> onnx TensorProto / ModelProto (ORT's TensorProto overloads).

``onnx`` is imported inside the functions only, so ``jaxort.checkpoint``
itself imports with numpy and flatbuffers alone. Never imports JAX.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from jaxort.dtypes import to_onnx_type
from jaxort.errors import CheckpointError
from jaxort.external_data import EXTERNAL, external_bytes

from ._api import check_flag, check_threshold, load
from ._files import write_files
from ._format import DEFAULT_EXTERNAL_DATA_THRESHOLD, STRING, SUPPORTED_DTYPES, check_path, type_label
from ._state import NominalTensor
from ._write import TensorRecord, _string_items, build_tensors

__all__ = ["save_tensors", "load_to_model"]

# TensorProto typed fields and how their values become element bytes.
_TYPED_FIELDS = {
    1: ("float_data", np.float32, None),
    14: ("float_data", np.float32, None),  # complex64: (re, im) float pairs
    11: ("double_data", np.float64, None),
    15: ("double_data", np.float64, None),  # complex128
    7: ("int64_data", np.int64, None),
    12: ("uint64_data", np.uint64, np.uint32),
    13: ("uint64_data", np.uint64, None),
    6: ("int32_data", np.int32, None),
    5: ("int32_data", np.int32, np.int16),
    3: ("int32_data", np.int32, np.int8),
    4: ("int32_data", np.int32, np.uint16),
    2: ("int32_data", np.int32, np.uint8),
    9: ("int32_data", np.int32, np.uint8),  # bool
    # float16, bfloat16 and float8 hold their bit patterns in int32_data.
    10: ("int32_data", np.int32, np.uint16),
    16: ("int32_data", np.int32, np.uint16),
    17: ("int32_data", np.int32, np.uint8),
    18: ("int32_data", np.int32, np.uint8),
    19: ("int32_data", np.int32, np.uint8),
    20: ("int32_data", np.int32, np.uint8),
}


def _proto_record(proto: Any, what: str, nominal: bool) -> tuple[TensorRecord, int]:
    """Returns the TensorRecord of a TensorProto and its serialized size."""
    from onnx import TensorProto

    if not isinstance(proto, TensorProto):
        raise CheckpointError(f"{what}: expected an onnx.TensorProto, got {type(proto).__name__}")
    name = proto.name
    code = int(proto.data_type)
    what = f"{what} {name!r}"
    if code not in SUPPORTED_DTYPES:
        raise CheckpointError(f"{what}: unsupported data_type {type_label(code)}")
    shape = tuple(int(d) for d in proto.dims)
    if any(d < 0 for d in shape):
        raise CheckpointError(f"{what}: negative dimension in dims {list(shape)}")
    doc = proto.doc_string if proto.HasField("doc_string") else None
    size = proto.ByteSize()
    if nominal:
        return TensorRecord(name, code, shape, None), size
    count = math.prod(shape)
    if proto.data_location == EXTERNAL:
        if code == STRING:
            raise CheckpointError(f"{what}: a string tensor cannot keep external data")
        try:  # memory-mapped: the writer streams it to the file
            data = memoryview(external_bytes(proto, count * SUPPORTED_DTYPES[code].itemsize))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{what}: its external data cannot be read: {e}") from None
        # ORT compares the threshold with the size of the proto holding its data (raw_data: tag,
        # length prefix and bytes), not of the reference to it.
        size += 1 + _varint_size(data.nbytes) + data.nbytes
        return TensorRecord(name, code, shape, data, doc), size
    if code == STRING:
        strings = _string_items(np.asarray(list(proto.string_data), dtype=object), what)
        if len(strings) != count:
            raise CheckpointError(f"{what}: {len(strings)} strings for dims {list(shape)}")
        return TensorRecord(name, code, shape, strings, doc), size
    nbytes = count * SUPPORTED_DTYPES[code].itemsize
    if proto.HasField("raw_data"):
        data = memoryview(proto.raw_data)
    else:
        field, src, dst = _TYPED_FIELDS[code]
        values = np.asarray(getattr(proto, field), dtype=src)
        if dst is not None:
            values = values.astype(dst)
        data = memoryview(values.astype(values.dtype.newbyteorder("<")).reshape(-1).view(np.uint8))
    if data.nbytes != nbytes:
        raise CheckpointError(f"{what}: {data.nbytes} data bytes but dims {list(shape)} need {nbytes}")
    return TensorRecord(name, code, shape, data, doc), size


def _varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def save_tensors(
    trainable_tensor_protos: Sequence[Any],
    frozen_tensor_protos: Sequence[Any],
    path: Union[str, os.PathLike],
    nominal: bool = False,
    external_data_threshold: Optional[int] = DEFAULT_EXTERNAL_DATA_THRESHOLD,
) -> None:
    """Saves onnx TensorProtos as a checkpoint, in the given order.

    This is ONNX Runtime's SaveCheckpoint(trainable, non-trainable, path,
    nominal, threshold), which writes the initial checkpoint of an artifact
    set: for the same protos the bytes are identical to ONNX Runtime's,
    except that a nominal checkpoint keeps each tensor's dims (ONNX Runtime
    1.19.2 writes none). External data is used when the protos' serialized
    sizes add up to ``external_data_threshold``; then every non-string
    tensor of at least 64 bytes goes to the external data file.

    Args:
      trainable_tensor_protos: onnx.TensorProto list of trainable parameters.
      frozen_tensor_protos: onnx.TensorProto list of frozen parameters.
      path: the checkpoint file to write (crash-safely, like ``save``).
      nominal: write names, dims and types only.
      external_data_threshold: see above; None never uses external data.

    Raises:
      CheckpointError: arguments of the wrong type, duplicate names,
        unsupported types, data that does not match dims, external data
        that cannot be read (it is memory-mapped, not loaded), or an OS
        error.
    """
    path = check_path(path)
    nominal = check_flag(nominal, "nominal")
    threshold = check_threshold(external_data_threshold)
    trainable, frozen, total = [], [], 0
    for protos, records, what in (
        (trainable_tensor_protos, trainable, "trainable tensor"),
        (frozen_tensor_protos, frozen, "frozen tensor"),
    ):
        if isinstance(protos, (str, bytes)) or not isinstance(protos, Sequence):
            raise CheckpointError(f"{what}s: expected a sequence of onnx.TensorProto, got {type(protos).__name__}")
        for proto in protos:
            record, size = _proto_record(proto, what, nominal)
            records.append(record)
            total += size
    b, external = build_tensors(trainable, frozen, nominal, threshold, total)
    write_files(path, b, external)


def _to_proto(name: str, array: np.ndarray) -> Any:
    from onnx import TensorProto

    proto = TensorProto()
    proto.name = name
    proto.dims.extend(array.shape)
    if array.dtype == np.dtype(object):
        proto.data_type = STRING
        proto.string_data.extend(_string_items(array, f"parameter {name!r}"))
    else:
        proto.data_type = to_onnx_type(array.dtype)
        proto.raw_data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return proto


def load_to_model(path: Union[str, os.PathLike], model_proto: Any) -> Any:
    """Returns a copy of a model whose initializers hold a checkpoint's parameters.

    Like ONNX Runtime's LoadCheckpointToModel: every initializer named like a
    checkpoint parameter (trainable or frozen) is replaced by it; other
    initializers are kept. The given model is not modified.

    Args:
      path: the checkpoint file.
      model_proto: an onnx.ModelProto.

    Returns:
      The new onnx.ModelProto.

    Raises:
      CheckpointError: ``model_proto`` is not an onnx.ModelProto, or the
        checkpoint cannot be read or is nominal.
    """
    import onnx

    if not isinstance(model_proto, onnx.ModelProto):
        raise CheckpointError(f"load_to_model needs an onnx.ModelProto, got {type(model_proto).__name__}")
    state = load(path)
    if state.is_nominal or any(isinstance(v, NominalTensor) for v in state.parameters.values()):
        raise CheckpointError(f"{os.fspath(path)!r} is a nominal checkpoint: it has no parameter data")
    model = onnx.ModelProto()
    model.CopyFrom(model_proto)
    params = state.parameters
    for init in model.graph.initializer:
        if init.name in params:
            init.CopyFrom(_to_proto(init.name, params[init.name]))
    return model
