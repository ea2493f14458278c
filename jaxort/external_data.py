"""Tensor data kept in external files (ONNX's ``data_location = EXTERNAL``).

Format layer: numpy only (the graph layer and the checkpoint writer use it). A tensor's external data is read by memory-mapping
its file, so that a model of several GiB is never held twice: the mapped
pages are handed to whoever copies them (JAX's ``device_put``, a checkpoint
writer) and are dropped with the last view. Locations are taken as they
stand; the graph layer makes them absolute when it loads a model from a file.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["EXTERNAL", "external_bytes", "external_info"]

EXTERNAL = 1  # onnx.TensorProto.EXTERNAL


def external_info(tensor) -> tuple[str, int, int | None]:
    """A tensor's ``(location, offset, length)``; ``length`` is None when the proto gives none.

    Raises:
      ValueError: no location, or an offset or length that is not a
        non-negative integer.
    """
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    if not location:
        raise ValueError("its external_data has no location")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ValueError(f"its external_data has a bad offset or length: {info}") from None
    if offset < 0 or (length is not None and length < 0):
        raise ValueError(f"its external_data has a negative offset or length: {info}")
    return location, offset, length


def external_bytes(tensor, need: int) -> np.ndarray:
    """The ``need`` bytes of a tensor's external data, as a read-only memory map (uint8).

    Args:
      tensor: an ``onnx.TensorProto`` whose ``data_location`` is EXTERNAL.
      need: the bytes its dims and type take.

    Raises:
      ValueError: the location, offset or length is bad, or the file holds
        fewer bytes than asked for; the message names the file.
      OSError: the file cannot be opened.
    """
    location, offset, length = external_info(tensor)
    if length is not None and length != need:
        raise ValueError(f"its external_data length {length} is not the {need} bytes its dims and type need")
    size = os.path.getsize(location)
    if offset + need > size:
        raise ValueError(f"needs {need} bytes at offset {offset} of {location!r}, which holds {size} bytes")
    if need == 0:
        return np.zeros(0, np.uint8)
    return np.memmap(location, dtype=np.uint8, mode="r", offset=offset, shape=(need,))
