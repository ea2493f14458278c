"""Loading and validating ONNX models (paths, bytes, ModelProto)."""

from __future__ import annotations

import os
from typing import Union

import onnx

from jaxort.errors import ModelError

__all__ = ["ModelSource", "load_model"]

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
      ModelError: when the file is missing or unreadable, or the checker fails.
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
            raise ModelError(f"invalid ONNX model: {e}") from e
    return model
