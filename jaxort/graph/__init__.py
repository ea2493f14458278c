"""The graph layer: ONNX models traced into pure JAX functions.

Public API: :class:`JaxGraph` (trace a model), :func:`load_model`,
:func:`register` (add an op handler), :class:`OpContext`, :func:`static`,
:func:`backward_slice` / :func:`outer_reads` for graph surgery on protos, the
proto helpers :func:`normalize_domain`, :func:`default_opset`,
:func:`numpy_dtype`, :func:`tensor_from_numpy` and :func:`tensor_to_numpy`,
:func:`check_input`, the check of a value fed for a declared input, and
:func:`check_graph_structure`, the check every pass over a node list runs
first (cycles, values made twice, dangling reads, order), and
:func:`set_compilation_cache` / :func:`compilation_cache_dir`, the persistent
compilation cache jaxort turns on (:mod:`jaxort.graph.compilation_cache`), and
:func:`lowering_platform`, which makes the CPU-or-default choices of the op
handlers at trace time.
This layer knows nothing of training or sessions.
"""

from jaxort.graph._device import resolve_device
from jaxort.graph._host import HOST_OPS, HostPlan
from jaxort.graph._inputs import check_input
from jaxort.graph._model import (
    MAX_MODEL_BYTES,
    check_model,
    default_opset,
    load_model,
    numpy_dtype,
    save_model,
    tensor_from_numpy,
    tensor_to_numpy,
)
from jaxort.graph._registry import OpHandler, lookup, normalize_domain, register, registered
from jaxort.graph._structure import check_graph_structure
from jaxort.graph.compilation_cache import compilation_cache_dir, set_compilation_cache
from jaxort.graph.numerics import lowering_platform
from jaxort.graph._trace import (
    JaxGraph,
    Subgraph,
    TensorInfo,
    backward_slice,
    outer_reads,
    x64_enabled_scope,
)
from jaxort.graph._values import NodeKey, OpContext, is_static, static, static_ints

__all__ = [
    "HOST_OPS",
    "HostPlan",
    "MAX_MODEL_BYTES",
    "JaxGraph",
    "NodeKey",
    "OpContext",
    "OpHandler",
    "Subgraph",
    "TensorInfo",
    "backward_slice",
    "check_graph_structure",
    "check_input",
    "check_model",
    "compilation_cache_dir",
    "default_opset",
    "is_static",
    "load_model",
    "lookup",
    "lowering_platform",
    "normalize_domain",
    "numpy_dtype",
    "outer_reads",
    "register",
    "registered",
    "resolve_device",
    "save_model",
    "set_compilation_cache",
    "static",
    "static_ints",
    "tensor_from_numpy",
    "tensor_to_numpy",
    "x64_enabled_scope",
]
