"""ONNX Runtime Training checkpoints: read, write and inspect, with numpy only.

The format is ONNX Runtime Training's on-device checkpoint (flatbuffers,
file identifier "ODTC", version 2), as written by onnxruntime-training
1.19.2: files jaxort writes load in ONNX Runtime and the reverse, and for the
same state the bytes are the same. See docs/checkpoint-format.md.

This package imports numpy, ml_dtypes and flatbuffers only: no JAX (a user
inspecting a file needs nothing else) and no onnx at import time (the
TensorProto functions import it when called).

Example:
  >>> import numpy as np
  >>> import jaxort.checkpoint as ckpt
  >>> state = ckpt.Checkpoint(trainable={"w": np.ones(3, np.float32)}, properties={"epoch": 2})
  >>> ckpt.load_from_buffer(ckpt.to_bytes(state)).properties
  {'epoch': 2}
"""

from jaxort.errors import CheckpointError

from ._api import load, load_from_buffer, save, to_bytes
from ._format import CHECKPOINT_VERSION, DEFAULT_EXTERNAL_DATA_THRESHOLD, external_data_path
from ._onnx import load_to_model, save_tensors
from ._state import Checkpoint, NominalTensor, OptimizerGroup, PropertyValue, normalize_property
from ._summary import summary

__all__ = [
    "CHECKPOINT_VERSION",
    "DEFAULT_EXTERNAL_DATA_THRESHOLD",
    "CheckpointError",
    "Checkpoint",
    "NominalTensor",
    "OptimizerGroup",
    "PropertyValue",
    "external_data_path",
    "load",
    "load_from_buffer",
    "load_to_model",
    "normalize_property",
    "save",
    "save_tensors",
    "summary",
    "to_bytes",
]
