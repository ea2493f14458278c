"""Loading and validating ONNX models (paths, bytes, ModelProto).

Whether or not ``onnx.checker`` runs, every initializer's stored data is
checked against its dims and type, so that a truncated file or a crafted
proto is a :class:`jaxort.errors.ModelError` naming the initializer, never a
numpy reshape error at trace time.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Union

import numpy as np
import onnx
from onnx import helper, numpy_helper

from jaxort.dtypes import ONNX_TO_NUMPY, to_numpy_dtype
from jaxort.errors import ModelError
from jaxort.graph._registry import normalize_domain

__all__ = ["ModelSource", "check_initializers", "default_opset", "load_model", "numpy_dtype",
           "tensor_from_numpy", "tensor_to_numpy"]

ModelSource = Union[str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto]


def load_model(source: ModelSource, *, check: bool = True) -> onnx.ModelProto:
    """Loads an ONNX model and validates it with ``onnx.checker``.

    Args:
      source: a path to a ``.onnx`` file (external data files next to it are
        loaded), the serialized bytes, or a ``ModelProto`` (used as is).
      check: run ``onnx.checker.check_model`` and surface its message.

    Returns:
      The ``ModelProto``.

    Raises:
      ModelError: when the file is missing or unreadable, the checker fails,
        or an initializer's data does not fit its dims and type (checked
        even with ``check=False``).
    """
    if isinstance(source, onnx.ModelProto):
        model = source
    elif isinstance(source, (bytes, bytearray, memoryview)):
        try:
            model = onnx.load_model_from_string(bytes(source))
        except Exception as e:  # protobuf raises DecodeError and friends
            raise ModelError(f"cannot parse ONNX model bytes: {e}") from e
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ModelError(f"ONNX model file not found: {path}")
        try:
            model = onnx.load(path, load_external_data=True)
        except Exception as e:
            raise ModelError(f"cannot load ONNX model {path}: {e}") from e
    else:
        raise ModelError(
            f"expected a path, bytes or onnx.ModelProto, got {type(source).__name__}"
        )
    if check:
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as e:
            if "must specify opset_import" in str(e) and len(model.opset_import):
                # onnx < 1.17: the checker's C++ side failed to parse the model
                # (nested too deep) and checked an empty one instead.
                raise _cannot_check(e) from e
            raise ModelError(f"invalid ONNX model: {e}") from e
        except Exception as e:  # noqa: BLE001  the checker's C++ side raises ValueError and others
            raise _cannot_check(e) from e
    check_initializers(model)
    return model


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the model's first opset import of the default domain, 0 if it has none.

    Args:
      model: the model; ``""`` and ``"ai.onnx"`` both name the default domain.

    Returns:
      The opset version, or 0 when ``opset_import`` has no default-domain entry.

    Example:
      >>> default_opset(onnx.helper.make_model(onnx.GraphProto(), opset_imports=[
      ...     onnx.helper.make_opsetid("ai.onnx", 17)]))
      17
    """
    for imp in model.opset_import:
        if normalize_domain(imp.domain) == "":
            return int(imp.version)
    return 0


def tensor_to_numpy(tensor: onnx.TensorProto) -> np.ndarray:
    """``onnx.numpy_helper.to_array`` in the tensor's own dtype.

    onnx < 1.17 returns bfloat16 and float8 tensors as float32 (and its
    float8 decoder fails under numpy 2), 4-bit integers as 8-bit ones, and
    does not know 4-bit floats: the narrow types stored as raw data are read
    here, the rest cast back, exactly, to the ml_dtypes type jaxort maps
    them to, so a model's dtypes do not depend on the installed onnx.
    """
    if tensor.data_type in _NARROW_FLOATS and tensor.raw_data and sys.byteorder == "little":
        dtype = to_numpy_dtype(tensor.data_type)
        return np.frombuffer(tensor.raw_data, dtype).reshape(tuple(tensor.dims)).copy()
    if tensor.data_type in _FOUR_BIT_CODES.values() and tensor.raw_data:
        dtype, shape = to_numpy_dtype(tensor.data_type), tuple(tensor.dims)
        packed = np.frombuffer(tensor.raw_data, np.uint8)
        nibbles = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(-1)[:math.prod(shape)]
        if tensor.data_type == onnx.TensorProto.INT4:  # two's complement in four bits
            nibbles = np.where(nibbles >= 8, nibbles.astype(np.int16) - 16, nibbles)
            return nibbles.astype(np.int8).astype(dtype).reshape(shape)
        # uint4 and float4e2m1: ml_dtypes holds the four bits in the low half of a byte.
        return nibbles.astype(np.uint8).view(dtype).reshape(shape)
    arr = numpy_helper.to_array(tensor)
    try:
        dtype = to_numpy_dtype(tensor.data_type)
    except KeyError:
        return arr
    if arr.dtype != dtype and arr.dtype.kind not in "OSU":
        return arr.astype(dtype)
    return arr


def tensor_from_numpy(array: np.ndarray, name: str = "") -> onnx.TensorProto:
    """``onnx.numpy_helper.from_array``, with ml_dtypes' narrow types written as raw bytes here.

    onnx < 1.17 cannot map ml_dtypes' bfloat16, float8 and 4-bit types;
    newer ones write the same raw bytes (4-bit values two to a byte, the
    first in the low half).
    """
    dtype = np.dtype(array.dtype)
    code = _NARROW_CODES.get(dtype)
    if code is not None and sys.byteorder == "little":
        array = np.asarray(array)  # not np.ascontiguousarray, which makes a scalar [1]; tobytes() is C order
        return _raw_tensor(name, code, array.shape, array.tobytes())
    code = _FOUR_BIT_CODES.get(dtype)
    if code is not None:
        nibbles = np.ascontiguousarray(array).reshape(-1).view(np.uint8) & 0x0F  # ml_dtypes: one per byte
        if nibbles.size % 2:
            nibbles = np.append(nibbles, np.uint8(0))
        packed = nibbles[0::2] | (nibbles[1::2] << 4)
        return _raw_tensor(name, code, array.shape, packed.astype(np.uint8).tobytes())
    return numpy_helper.from_array(array, name)


def _raw_tensor(name: str, code: int, shape, data: bytes) -> onnx.TensorProto:
    # Not helper.make_tensor: it checks the size with onnx's own table, which
    # lacks the newer types (float4e2m1 before onnx 1.18).
    tensor = onnx.TensorProto(name=name, data_type=code, dims=list(shape))
    tensor.raw_data = data
    return tensor


def numpy_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype of ONNX element type ``elem_type``.

    jaxort's table first (bfloat16 and float8 as ml_dtypes types, which
    ``onnx.helper.tensor_dtype_to_np_dtype`` of onnx < 1.17 gives as
    float32), then onnx's for types the table lacks.
    """
    try:
        return to_numpy_dtype(elem_type)
    except KeyError:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


# bfloat16 and the float8 types jaxort maps to ml_dtypes (TensorProto codes).
_NARROW_FLOATS = frozenset(code for code in (16, 17, 18, 19, 20, 24) if code in ONNX_TO_NUMPY)
_NARROW_CODES = {ONNX_TO_NUMPY[code]: code for code in _NARROW_FLOATS}


def _cannot_check(e: Exception) -> ModelError:
    return ModelError(f"onnx.checker cannot check the model ({type(e).__name__}: {e}); a model "
                      "nested deeper than protobuf's parse limit or over 2 GiB cannot be checked, "
                      "pass check=False to skip the checker")


# Packed types: bits per element in raw_data (UINT4, INT4, FLOAT4E2M1, UINT2
# and INT2 by number, whatever the installed onnx knows).
_SUB_BYTE_BITS = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2}
_SUB_BYTE_BITS.update({getattr(onnx.TensorProto, name): 6 for name in ("FLOAT6E2M3", "FLOAT6E3M2")
                       if hasattr(onnx.TensorProto, name)})
# uint4, int4, float4e2m1 by dtype: two to a byte in ONNX, one to a byte in ml_dtypes.
_FOUR_BIT_CODES = {ONNX_TO_NUMPY[code]: code for code, bits in _SUB_BYTE_BITS.items()
                   if bits == 4 and code in ONNX_TO_NUMPY}


def _graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph in its nodes' attributes."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


def check_initializers(model: onnx.ModelProto) -> None:
    """Checks that each initializer (subgraphs' too) stores as much data as its dims and type need.

    Args:
      model: the model, external data loaded or not.

    Raises:
      ModelError: a name that is not valid UTF-8, or naming the first
        initializer whose data is too short or too long, whose dims are
        negative, whose type is unknown, or whose external data file is
        missing or too short.
    """
    for imp in model.opset_import:
        if not isinstance(imp.domain, str):
            raise ModelError(f"an opset_import domain is not valid UTF-8: {imp.domain!r}")
    for graph in _graphs(model.graph):
        _check_names(graph)
        for tensor in graph.initializer:
            problem = _tensor_problem(tensor)
            if problem:
                raise ModelError(f"initializer {tensor.name!r} of graph {graph.name!r}: {problem}")
        for sparse in graph.sparse_initializer:
            problem = _tensor_problem(sparse.values) or _tensor_problem(sparse.indices)
            if problem:
                raise ModelError(f"sparse initializer {sparse.values.name!r} of graph {graph.name!r}: "
                                 f"{problem}")


def _check_names(graph: onnx.GraphProto) -> None:
    """Refuses names that are not text: protobuf hands invalid UTF-8 in a string field back as bytes."""
    names = [v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)]
    names += [t.name for t in graph.initializer]
    for node in graph.node:
        names += [node.name, node.op_type, node.domain, *node.input, *node.output]
        names += [a.name for a in node.attribute]
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise ModelError(f"graph {graph.name!r} has names that are not valid UTF-8: {bad[:3]}")


def _tensor_problem(tensor: onnx.TensorProto) -> str:
    """What is wrong with a tensor's stored data, or ""."""
    dims = [int(d) for d in tensor.dims]
    if any(d < 0 for d in dims):
        return f"negative dims {dims}"
    dtype = tensor.data_type
    if (dtype not in onnx.TensorProto.DataType.values() and dtype not in ONNX_TO_NUMPY) or dtype == 0:
        return f"unknown data_type {dtype}"  # jaxort's table knows types newer than some onnx versions
    count = math.prod(dims)
    if dtype == onnx.TensorProto.STRING:
        given = len(tensor.string_data)
        return "" if given == count else f"dims {dims} need {count} strings, string_data holds {given}"
    bits = _SUB_BYTE_BITS.get(dtype)
    itemsize = numpy_dtype(dtype).itemsize
    need = (count * bits + 7) // 8 if bits else count * itemsize
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", need))
            size = os.path.getsize(location)
        except (OSError, ValueError) as e:
            return f"cannot read its external data {location!r} ({type(e).__name__}: {e})"
        if length != need or offset < 0 or offset + length > size:
            return (f"dims {dims} need {need} bytes of external data, {location!r} has {size} bytes and "
                    f"the tensor asks for {length} at offset {offset}")
        return ""
    if tensor.raw_data:
        given = len(tensor.raw_data)
        return "" if given == need else f"dims {dims} need {need} bytes of raw_data, given {given}"
    if bits:
        return ""
    field = helper.tensor_dtype_to_field(dtype)
    per = 2 if dtype in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1
    given = len(getattr(tensor, field))
    if given != count * per:
        return f"dims {dims} need {count * per} values in {field}, given {given}"
    return ""
