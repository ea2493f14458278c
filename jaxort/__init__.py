"""jaxort: train ONNX models with JAX, compatible with ONNX Runtime Training.

Layers, bottom up: ``jaxort.checkpoint`` (ORT checkpoint files, numpy only),
``jaxort.graph`` (ONNX -> pure JAX functions), ``jaxort.training`` (TrainState,
steps, optimizers, artifacts), and the facades ``jaxort.session`` (shaped like
ORT's training C API) and ``jaxort.api`` (a drop-in for
``onnxruntime.training.api``). Submodules load on first use, so importing
``jaxort`` does not import JAX.
"""

import importlib

from jaxort import errors
from jaxort.errors import (
    CheckpointError,
    InputError,
    JaxortError,
    ModelError,
    NoGradientGraphWarning,
    OpError,
    StateError,
    TrainingError,
    UnsupportedOpError,
)

__version__ = "0.1.0"

_SUBMODULES = ("api", "backend", "checkpoint", "distributed", "graph", "session", "training", "testing")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"jaxort.{name}")
    raise AttributeError(f"module 'jaxort' has no attribute {name!r}")


__all__ = [
    "CheckpointError",
    "InputError",
    "JaxortError",
    "ModelError",
    "NoGradientGraphWarning",
    "OpError",
    "StateError",
    "TrainingError",
    "UnsupportedOpError",
    "errors",
    *_SUBMODULES,
]
