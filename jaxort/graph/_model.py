"""Loading and validating ONNX models (paths, bytes, ModelProto).

Whether or not ``onnx.checker`` runs, every initializer's stored data is
checked against its dims and type, so that a truncated file or a crafted
proto is a :class:`jaxort.errors.ModelError` naming the initializer, never a
numpy reshape error at trace time.

Models over protobuf's 2 GiB keep their weights in external data files.
:func:`load_model` leaves such data where it is (the tensors' locations made
absolute) and :func:`tensor_to_numpy` memory-maps it, so the weights are read
once, by whoever copies them; the checker then runs on the file, or on the
graph with its weights turned into inputs. :func:`save_model` writes a model
too big for one proto with its tensors in a data file beside it.
"""

from __future__ import annotations

import math
import os
import secrets
import sys
from typing import Optional, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper

from jaxort.dtypes import ONNX_TO_NUMPY, to_numpy_dtype
from jaxort.errors import ModelError
from jaxort.external_data import external_bytes, external_info
from jaxort.graph._registry import normalize_domain

__all__ = ["MAX_MODEL_BYTES", "ModelSource", "check_initializers", "check_model", "default_opset",
           "load_model", "numpy_dtype", "save_model", "tensor_from_numpy", "tensor_to_numpy"]

# protobuf cannot serialize a message of 2 GiB or more; jaxort keeps 16 MiB
# of room for what a writer adds after measuring.
MAX_MODEL_BYTES = 2**31 - 2**24

ModelSource = Union[str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto]


def load_model(source: ModelSource, *, check: bool = True) -> onnx.ModelProto:
    """Loads an ONNX model and validates it with ``onnx.checker``.

    Args:
      source: a path to a ``.onnx`` file, the serialized bytes, or a
        ``ModelProto`` (used as is). A file's external data stays on disk:
        its tensors' locations become absolute paths, and
        :func:`tensor_to_numpy` memory-maps them.
      check: run ``onnx.checker`` and surface its message (see
        :func:`check_model`).

    Returns:
      The ``ModelProto``.

    Raises:
      ModelError: when the file is missing or unreadable, the checker fails,
        an external data location leaves the model's directory, or an
        initializer's data does not fit its dims and type or its external
        data file is missing or short (checked even with ``check=False``).
    """
    path = None
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
            model = onnx.load(path, load_external_data=False)
        except Exception as e:
            raise ModelError(f"cannot load ONNX model {path}: {e}") from e
    else:
        raise ModelError(
            f"expected a path, bytes or onnx.ModelProto, got {type(source).__name__}"
        )
    external = [t for t in _tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL]
    if path is not None and external:
        _locate(external, os.path.dirname(os.path.abspath(path)), path)
    check_initializers(model)
    if check:
        # A file with external data is checked as a file: the checker finds the data beside it.
        check_model(path if path is not None and external else model)
    return model


def check_model(model: Union[str, onnx.ModelProto], *, full_check: bool = False) -> None:
    """Runs ``onnx.checker.check_model``, also on models it cannot take as a proto.

    A model with external data, or too big to serialize, is checked as its
    graph without weights: each such initializer becomes a graph input of
    its type and shape. (Its data is checked against its dims by
    :func:`check_initializers`.)

    Args:
      model: a ``ModelProto``, or the path of a model file (external data
        beside it is checked by the checker).
      full_check: also run strict shape inference.

    Raises:
      ModelError: the checker's message, or why it could not run.
    """
    if isinstance(model, onnx.ModelProto) and (
            any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
            or _model_bytes(model) > MAX_MODEL_BYTES):
        model = _without_weights(model)
    try:
        onnx.checker.check_model(model, full_check=full_check)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        if (isinstance(model, onnx.ModelProto) and "must specify opset_import" in str(e)
                and len(model.opset_import)):
            # onnx < 1.17: the checker's C++ side failed to parse the model
            # (nested too deep) and checked an empty one instead.
            raise _cannot_check(e) from e
        raise ModelError(f"invalid ONNX model: {e}") from e
    except Exception as e:  # noqa: BLE001  the checker's C++ side raises ValueError and others
        raise _cannot_check(e) from e


def _model_bytes(model: onnx.ModelProto) -> int:
    """The model's serialized size, estimated from its tensors' dims when they hold 1 GiB or more.

    ``ByteSize`` of a model over 2 GiB fails, and of one near it costs about
    as much as serializing it.
    """
    data = sum(_data_bytes(t) for t in _tensors(model)
               if t.data_location != onnx.TensorProto.EXTERNAL and t.data_type != onnx.TensorProto.STRING)
    return data + (1 << 20) if data >= 1 << 30 else model.ByteSize()


# Initializers at least this big leave the checker's copy of a model too big to serialize.
_BIG_TENSOR_BYTES = 1 << 20


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose external and big initializers are graph inputs instead."""
    copy = onnx.ModelProto()
    _copy_fields(model, copy, skip="graph")
    graph = copy.graph
    _copy_fields(model.graph, graph, skip="initializer")
    inputs = {i.name for i in graph.input}
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or (
                t.HasField("raw_data") and _data_bytes(t) >= _BIG_TENSOR_BYTES):
            if t.name not in inputs:
                graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            graph.initializer.append(t)
    return copy


def _copy_fields(src, dst, skip: str) -> None:
    """Copies every set field of message ``src`` into ``dst`` except ``skip``."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        # protobuf 6 added is_repeated; 7 removed label.
        if getattr(field, "is_repeated", None) or getattr(field, "label", None) == 3:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _tensors(model: onnx.ModelProto):
    """Every TensorProto of the model that can hold data: initializers and attribute tensors."""
    for graph in _graphs(model.graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == onnx.AttributeProto.TENSORS:
                    yield from attr.tensors
                elif attr.type == onnx.AttributeProto.SPARSE_TENSOR:
                    yield attr.sparse_tensor.values
                    yield attr.sparse_tensor.indices


def _locate(tensors, base: str, path: str) -> None:
    """Makes external data locations absolute, refusing any outside ``base`` (as onnx.load does)."""
    root = os.path.realpath(base)
    for t in tensors:
        try:
            location, _, _ = external_info(t)
        except ValueError as e:
            raise ModelError(f"tensor {t.name!r} of {path}: {e}") from None
        full = os.path.realpath(os.path.join(root, location))
        if os.path.isabs(location) or os.path.commonpath([root, full]) != root:
            raise ModelError(f"tensor {t.name!r} of {path}: external data location {location!r} is not a "
                             f"file inside the model's directory {base}")
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = full


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

    External data is memory-mapped, read-only, not read into memory.

    Raises:
      ModelError: external data that is missing, short or misplaced, named.
    """
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return _external_to_numpy(tensor)
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


def _data_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of raw data a (non-string) tensor's dims and type need."""
    count = math.prod(int(d) for d in tensor.dims)
    bits = _SUB_BYTE_BITS.get(tensor.data_type)
    return (count * bits + 7) // 8 if bits else count * numpy_dtype(tensor.data_type).itemsize


def _mapped(tensor: onnx.TensorProto) -> np.ndarray:
    """A tensor's external data bytes, memory-mapped (ModelError naming the tensor if they are not there)."""
    if tensor.data_type == onnx.TensorProto.STRING:
        raise ModelError(f"tensor {tensor.name!r}: string tensors cannot keep external data")
    try:
        return external_bytes(tensor, _data_bytes(tensor))
    except (OSError, ValueError) as e:
        raise ModelError(f"tensor {tensor.name!r} has no readable external data: {e}") from None


def _external_to_numpy(tensor: onnx.TensorProto) -> np.ndarray:
    data = _mapped(tensor)
    shape = tuple(int(d) for d in tensor.dims)
    if tensor.data_type not in _SUB_BYTE_BITS and sys.byteorder == "little":
        return data.view(numpy_dtype(tensor.data_type)).reshape(shape)
    # Packed and big-endian data: decoded from a copy, as raw_data.
    inline = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=shape)
    inline.raw_data = data.tobytes()
    return tensor_to_numpy(inline)


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
        try:
            external_bytes(tensor, need)
        except (OSError, ValueError) as e:
            return f"its external data cannot be read ({e})"
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


# Tensors below this many bytes stay in the model file when the rest moves out.
_MIN_EXTERNAL_BYTES = 1024
# Offsets of tensors of 1 MiB and more are aligned for memory mapping (64 KiB: Windows' granularity).
_ALIGN_BIG, _ALIGN = 1 << 16, 64


def save_model(model: onnx.ModelProto, path: Union[str, os.PathLike], *,
               external_data_threshold: Optional[int] = -1) -> Optional[str]:
    """Writes ``model`` to ``path`` crash-safely, with external data when it is too big for one proto.

    A model that holds ``external_data_threshold`` bytes or more (its
    serialized size plus the external data its tensors refer to) is written
    as ``path`` plus ``<name of path>.data`` beside it: every tensor of at
    least 1 KiB goes there, read straight from its raw data or from the
    memory-mapped file it refers to, and ``model``'s tensors are changed to
    refer to the new data file (their raw data freed). Smaller models are
    written in one file, with any external data read back in. Each file is
    written to a temporary name and renamed into place.

    Args:
      model: the model to write.
      path: the ``.onnx`` file.
      external_data_threshold: bytes from which external data is used
        (default: :data:`MAX_MODEL_BYTES`, read at the call); None never
        uses it.

    Returns:
      The data file's path, or None when the model went into one file.

    Raises:
      ModelError: the model is too big for one proto and
        ``external_data_threshold`` is None, or an OS error (named).
    """
    path = os.fspath(path)
    if external_data_threshold == -1:
        external_data_threshold = MAX_MODEL_BYTES
    tensors = list(_tensors(model))
    external = [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]
    size = _model_bytes(model) + sum(_data_bytes(t) for t in external)
    if external_data_threshold is None or size < external_data_threshold:
        if size > MAX_MODEL_BYTES:
            raise ModelError(f"cannot write {path}: the model holds {size} bytes, too many for one protobuf "
                             "message, and external_data_threshold is None")
        if external:
            model = _inlined(model)
        _write_atomic(path, [model.SerializeToString()])
        return None
    data_path = path + ".data"
    location = os.path.basename(data_path)
    moved = []

    def pieces():  # one tensor's bytes at a time: none is held after it is written
        offset = 0
        for t in tensors:
            original = None
            if t.data_location == onnx.TensorProto.EXTERNAL:
                data, original = _mapped(t), [(e.key, e.value) for e in t.external_data]
            elif t.HasField("raw_data") and _data_bytes(t) >= _MIN_EXTERNAL_BYTES:
                data = t.raw_data
            else:
                continue
            size = len(data)
            pad = -offset % (_ALIGN_BIG if size >= 1 << 20 else _ALIGN)
            yield bytes(pad)
            moved.append((t, offset + pad, size, original))
            yield data
            offset += pad + size

    data_temp = _write_temp(data_path, pieces())
    full = os.path.abspath(data_path)
    for t, start, length, _ in moved:
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        for key, value in (("location", location), ("offset", str(start)), ("length", str(length))):
            t.external_data.add(key=key, value=value)
    backup = None  # the previous data file, until the new model is in place
    try:
        model_temp = _write_temp(path, [model.SerializeToString()])
        try:
            if os.path.exists(data_path):
                backup = f"{data_temp}.previous"
                os.replace(data_path, backup)
            os.replace(data_temp, data_path)
            os.replace(model_temp, path)
        except BaseException:
            _remove(model_temp)
            raise
        if backup is not None:
            _remove(backup)
    except BaseException as e:
        if backup is not None and os.path.exists(backup):
            if os.path.exists(data_temp):
                os.replace(backup, data_path)
            else:  # the new data is in place: it goes back to its temporary name, the previous file back
                os.replace(data_path, data_temp)
                os.replace(backup, data_path)
        # Nothing lost: the tensors get their bytes back from the data file just written.
        source = data_temp if os.path.exists(data_temp) else data_path
        with open(source, "rb") as f:
            for t, start, length, original in moved:
                del t.external_data[:]
                if original is not None:  # it refers to its own file again
                    for key, value in original:
                        t.external_data.add(key=key, value=value)
                    continue
                f.seek(start)
                t.raw_data = f.read(length)
                t.ClearField("data_location")
        _remove(data_temp)
        if isinstance(e, OSError):
            raise ModelError(f"cannot write {path}: {e}") from e
        raise
    for t, *_ in moved:  # in memory, the tensors refer to the data file wherever the process runs
        t.external_data[0].value = full
    return data_path


def _inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose external tensors hold their data as raw_data."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for t in _tensors(copy):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            data = _mapped(t).tobytes()
            del t.external_data[:]
            t.ClearField("data_location")
            t.raw_data = data
    return copy


def _write_atomic(path: str, pieces) -> None:
    """Writes ``pieces`` to a temporary file beside ``path`` and renames it into place."""
    temp = _write_temp(path, pieces)
    try:
        os.replace(temp, path)
    except OSError as e:
        _remove(temp)
        raise ModelError(f"cannot write {path}: {e}") from e


def _write_temp(path: str, pieces) -> str:
    """Writes ``pieces`` to a fsynced temporary file beside ``path``; returns its path."""
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    try:
        with open(temp, "wb") as f:
            for piece in pieces:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        _remove(temp)
        if isinstance(e, OSError):
            raise ModelError(f"cannot write {path}: {e}") from e
        raise
    return temp


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
