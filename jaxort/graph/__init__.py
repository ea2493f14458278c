"""The graph layer: ONNX models traced into pure JAX functions.

Public API: :class:`JaxGraph` (trace a model), :func:`load_model`,
:func:`register` (add an op handler), :class:`OpContext`, :func:`static`,
and :func:`backward_slice` / :func:`outer_reads` for graph surgery on protos.
This layer knows nothing of training or sessions.
"""

from jaxort.graph._device import resolve_device
from jaxort.graph._model import load_model
from jaxort.graph._registry import OpHandler, lookup, register, registered
from jaxort.graph._trace import (
    JaxGraph,
    Subgraph,
    TensorInfo,
    backward_slice,
    outer_reads,
    x64_enabled_scope,
)
from jaxort.graph._values import OpContext, is_static, static, static_ints

__all__ = [
    "JaxGraph",
    "OpContext",
    "OpHandler",
    "Subgraph",
    "TensorInfo",
    "backward_slice",
    "is_static",
    "load_model",
    "lookup",
    "outer_reads",
    "register",
    "registered",
    "resolve_device",
    "static",
    "static_ints",
    "x64_enabled_scope",
]
