"""Mixed precision: float32 master weights, low-precision compute where it is safe.

A :class:`Policy` on a :class:`jaxort.training.TrainProgram` keeps parameters,
gradients, optimizer moments and the loss in float32 while the graph computes
in ``compute_dtype`` (bfloat16 by default). The traced model is a copy made
by :func:`cast_model`: its float32 tensors (graph inputs, initializers,
Constant values, Cast targets) become ``compute_dtype``, except in the nodes
that must stay float32:

- the loss head: every node on the way to the outputs after the last node
  that reads a parameter (the loss block ORT appends, e.g.
  SoftmaxCrossEntropyLoss, or Sub/Pow/ReduceMean for an MSE loss, and the
  float targets it reads);
- Softmax, LogSoftmax and the accumulating reductions (ReduceSum, ReduceMean,
  ReduceL1/L2, ReduceSumSquare, ReduceLogSum(Exp), ReduceProd) anywhere, and
  the loss ops themselves.

Casts are inserted at the boundaries of those nodes. Parameters and inputs
the cast model takes in ``compute_dtype`` are cast on entry (the gradient
with respect to the float32 master weights comes back in float32); outputs
are cast back to float32, and the optimizer works in float32 as ORT's
kernels do.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from jaxort.errors import TrainingError
from jaxort.graph import normalize_domain, tensor_from_numpy, tensor_to_numpy

__all__ = ["FLOAT32_OPS", "Policy", "bfloat16_policy", "cast_model", "compute_names", "float32_nodes"]

# (domain, op type) of the nodes that always compute in float32 under a policy.
FLOAT32_OPS = frozenset(
    [("", op) for op in ("Softmax", "LogSoftmax", "ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2",
                         "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd",
                         "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")]
    + [("com.microsoft", op) for op in ("SoftmaxCrossEntropyLossInternal",
                                        "NegativeLogLikelihoodLossInternal", "SoftmaxCrossEntropy")])
# Ops whose outputs are not floats whatever their inputs are (for the dtype fallback).
_NON_FLOAT_OUTPUTS = frozenset(["Shape", "Size", "NonZero", "ArgMax", "ArgMin", "Equal", "Less", "Greater",
                                "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"])

_ONNX_OF = {
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.float32): TensorProto.FLOAT,
}


@dataclasses.dataclass(frozen=True)
class Policy:
    """Which dtypes parameters, computation and outputs use.

    Attributes:
      param_dtype: dtype of the master weights and the optimizer (float32).
      compute_dtype: dtype the graph computes in.
      output_dtype: dtype of returned outputs and of the loss.
    """

    param_dtype: np.dtype = np.dtype(np.float32)
    compute_dtype: np.dtype = np.dtype(ml_dtypes.bfloat16)
    output_dtype: np.dtype = np.dtype(np.float32)

    def __post_init__(self):
        for f in ("param_dtype", "compute_dtype", "output_dtype"):
            object.__setattr__(self, f, np.dtype(getattr(self, f)))
        if self.compute_dtype not in _ONNX_OF:
            raise TrainingError(f"unsupported compute dtype {self.compute_dtype}")

    def cast_to_compute(self, x):
        """Casts a float32 array to ``compute_dtype``; other dtypes pass through."""
        if jnp.asarray(x).dtype == self.param_dtype:
            return jnp.asarray(x).astype(self.compute_dtype)
        return x

    def cast_to_output(self, x):
        """Casts a floating array to ``output_dtype``; other dtypes pass through."""
        if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
            return jnp.asarray(x).astype(self.output_dtype)
        return x


def bfloat16_policy() -> Policy:
    """float32 master weights and optimizer, bfloat16 compute, float32 loss and outputs.

    Returns:
      The policy.
    """
    return Policy()


def _retype(type_proto: onnx.TypeProto, to: int) -> None:
    if type_proto.HasField("tensor_type") and type_proto.tensor_type.elem_type == TensorProto.FLOAT:
        type_proto.tensor_type.elem_type = to


def _cast_tensor(t: onnx.TensorProto, dtype: np.dtype) -> onnx.TensorProto:
    if t.data_type != TensorProto.FLOAT:
        return t
    return tensor_from_numpy(tensor_to_numpy(t).astype(dtype), t.name)


def _cast_graph(graph: onnx.GraphProto, dtype: np.dtype) -> None:
    to = _ONNX_OF[dtype]
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        _retype(vi.type, to)
    inits = [_cast_tensor(t, dtype) for t in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    for node in graph.node:
        _cast_node(node, dtype)


def _cast_node(node: onnx.NodeProto, dtype: np.dtype) -> None:
    to = _ONNX_OF[dtype]
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            attr.t.CopyFrom(_cast_tensor(attr.t, dtype))
        elif attr.type == onnx.AttributeProto.GRAPH:
            _cast_graph(attr.g, dtype)
        if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
            attr.i = to


def _names_read(node) -> set:
    """The value names a node reads, its subgraphs' outer-scope reads included."""
    names = {x for x in node.input if x}
    for attr in node.attribute:
        for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            for inner in g.node:
                names |= _names_read(inner)
    return names


def float32_nodes(graph: onnx.GraphProto, parameters) -> set:
    """Indices of the nodes of ``graph`` that stay float32 (see the module docstring).

    Args:
      graph: the graph.
      parameters: the parameter names (a node reading one ends the loss head).

    Returns:
      The set of node indices.
    """
    parameters = set(parameters)
    nodes = list(graph.node)
    consumers: dict = {}
    reads = [_names_read(n) for n in nodes]
    for i, names in enumerate(reads):
        for x in names:
            consumers.setdefault(x, []).append(i)
    feeds = [False] * len(nodes)  # the node reads a parameter or feeds one that does
    for i in range(len(nodes) - 1, -1, -1):
        feeds[i] = bool(reads[i] & parameters) or any(
            feeds[c] for o in nodes[i].output if o for c in consumers.get(o, ()) if c > i)
    keep = {i for i, n in enumerate(nodes) if not feeds[i] or (normalize_domain(n.domain), n.op_type) in FLOAT32_OPS}
    # Constants read only by float32 nodes stay float32 too.
    for i, n in enumerate(nodes):
        if n.op_type == "Constant" and all(c in keep for o in n.output for c in consumers.get(o, ())):
            keep.add(i)
    return keep


def _float_values(graph: onnx.GraphProto) -> set:
    """The names of the float32 values of ``graph``: declared, inferred, else by a dtype rule."""
    types = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(onnx.helper.make_model(graph)).graph
    except Exception:  # noqa: BLE001  inference helps; the rules below decide without it
        inferred = graph
    for vi in list(inferred.input) + list(inferred.output) + list(inferred.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in graph.initializer:
        types[t.name] = t.data_type
    for n in graph.node:
        for k, o in enumerate(n.output):
            if not o or o in types:
                continue
            if n.op_type == "Cast":
                types[o] = next(a.i for a in n.attribute if a.name == "to")
            elif n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
                types[o] = n.attribute[0].t.data_type
            elif n.op_type in _NON_FLOAT_OUTPUTS or k > 0:
                types[o] = TensorProto.UNDEFINED
            else:
                types[o] = next((types[x] for x in n.input if x and x in types), TensorProto.UNDEFINED)
    return {name for name, t in types.items() if t == TensorProto.FLOAT}


def cast_model(model: onnx.ModelProto, dtype, *, parameters=None) -> onnx.ModelProto:
    """Returns a copy of ``model`` computing in ``dtype`` instead of float32 where it is safe.

    Float32 graph inputs, outputs, value infos, initializers, tensor
    attributes (Constant, ConstantOfShape) and ``Cast(to=FLOAT)`` targets
    become ``dtype``, except in the float32 nodes (:func:`float32_nodes`: the
    loss head, softmax, log-softmax, reductions, loss ops). A float value
    crossing between the two parts goes through a ``Cast``; a graph input or
    initializer read only by float32 nodes stays float32.

    Args:
      model: the model.
      dtype: bfloat16 or float16 (float32 returns a copy).
      parameters: the parameter names; default the float initializers with
        more than one element.

    Returns:
      The new model.
    """
    dtype = np.dtype(dtype)
    if dtype not in _ONNX_OF:
        raise TrainingError(f"unsupported compute dtype {dtype}")
    new = onnx.ModelProto()
    new.CopyFrom(model)
    if dtype == np.dtype(np.float32):
        return new
    graph = new.graph
    if parameters is None:
        parameters = [t.name for t in graph.initializer
                      if t.data_type == TensorProto.FLOAT and int(np.prod(t.dims)) > 1]
    keep = float32_nodes(graph, parameters)
    floats = _float_values(graph)
    to = _ONNX_OF[dtype]
    nodes = list(graph.node)
    consumers: dict = {}
    for i, n in enumerate(nodes):
        for x in _names_read(n):
            consumers.setdefault(x, set()).add(i)
    # Values produced (or given) in float32: outputs of kept nodes, and inputs
    # and initializers that only kept nodes read.
    high = {o for i in keep for o in nodes[i].output if o}
    for name in [vi.name for vi in graph.input] + [t.name for t in graph.initializer]:
        users = consumers.get(name, set())
        if users and users <= keep:
            high.add(name)
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if vi.name not in high:
            _retype(vi.type, to)
    inits = [t if t.name in high else _cast_tensor(t, dtype) for t in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    casts: dict = {}
    out = []

    def cast(x: str, target: int, suffix: str) -> str:
        key = (x, target)
        if key not in casts:
            casts[key] = f"{x}__jaxort_{suffix}"
            out.append(helper.make_node("Cast", [x], [casts[key]], to=target,
                                        name=f"{x}__jaxort_cast_{suffix}"))
        return casts[key]

    for i, node in enumerate(nodes):
        kept = i in keep
        for k, x in enumerate(node.input):
            if not x or x not in floats:
                continue
            if kept and x not in high:
                node.input[k] = cast(x, TensorProto.FLOAT, "f32")
            elif not kept and x in high:
                node.input[k] = cast(x, to, str(dtype))
        if not kept:
            _cast_node(node, dtype)
        out.append(node)
    del graph.node[:]
    graph.node.extend(out)
    return new


def compute_names(model: onnx.ModelProto) -> frozenset:
    """Graph inputs and initializers of a cast model declared in a low-precision dtype.

    These are the parameters and inputs a program casts to the compute
    dtype on entry; the rest (float32 ones) pass as they are.
    """
    low = {TensorProto.BFLOAT16, TensorProto.FLOAT16}
    names = {vi.name for vi in model.graph.input
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in low}
    names |= {t.name for t in model.graph.initializer if t.data_type in low}
    return frozenset(names)
