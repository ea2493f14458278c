"""Preparing ONNX protos for dispatch, once per model.

:func:`backward_slice` prunes a node list to what some outputs need, on the
protos. A :class:`_Preparer` turns GraphProtos and FunctionProtos into
``_Program`` objects: each node gets its handler looked up and its attributes
parsed with the spec's defaults, and subgraph attributes become programs of
their own; :func:`_prepare_nodes` makes each group the pattern matcher
accepts one node. Running programs is ``jaxort.graph._trace``'s part; this
module imports the registry, ``_model`` and ``jaxort.errors`` only (and the
patterns package when fusion is asked for).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import numpy as np
import onnx
from onnx import helper

# _registry.lookup is read at each call, so that a test may plant a handler by patching it.
import jaxort.graph._registry as _registry
from jaxort.errors import ModelError, OpError, UnsupportedOpError
from jaxort.graph._model import tensor_to_numpy
from jaxort.graph._registry import OpHandler, normalize_domain


def _tensor_to_numpy(t: onnx.TensorProto) -> np.ndarray:
    arr = tensor_to_numpy(t)
    if arr.dtype.kind in ("S", "U"):
        arr = arr.astype(object)
    return arr


def _sparse_to_numpy(sp: onnx.SparseTensorProto) -> np.ndarray:
    values = _tensor_to_numpy(sp.values)
    dense = np.zeros(tuple(sp.dims), dtype=values.dtype)
    idx = tensor_to_numpy(sp.indices)
    if idx.ndim == 1:
        dense.reshape(-1)[idx] = values
    else:
        dense[tuple(idx.T)] = values
    return dense


def initializer_values(graph: onnx.GraphProto) -> dict:
    """The graph's initializers, sparse ones made dense, name -> numpy array (strings as objects)."""
    values = {t.name: _tensor_to_numpy(t) for t in graph.initializer}
    for sp in graph.sparse_initializer:
        values[sp.values.name] = _sparse_to_numpy(sp)
    return values


def _text(value: bytes, attr: onnx.AttributeProto) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelError(f"attribute {attr.name!r} holds bytes that are not UTF-8 text: {value[:16]!r}") from None


def _attr_to_python(attr: onnx.AttributeProto):
    """Converts an attribute to Python/numpy (graphs are returned as protos).

    Raises:
      ModelError: a string attribute that is not UTF-8.
    """
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return _text(value, attr)
    if isinstance(value, onnx.TensorProto):
        return _tensor_to_numpy(value)
    if isinstance(value, onnx.SparseTensorProto):
        return _sparse_to_numpy(value)
    if isinstance(value, list):
        if value and isinstance(value[0], bytes):
            return [_text(v, attr) for v in value]
        if value and isinstance(value[0], onnx.TensorProto):
            return [_tensor_to_numpy(v) for v in value]
    return value


@dataclasses.dataclass(eq=False, slots=True)
class _Node:
    """A node prepared for dispatch: handler found, attributes parsed once.

    ``handler`` is None for a node expanded from a function body; then
    ``function`` says which (``("local", FunctionProto)`` for a model's own
    function, ``("static" | "context", ...)`` for a schema's).
    """

    index: int
    proto: onnx.NodeProto
    op_type: str
    domain: str
    opset: int
    inputs: tuple
    outputs: tuple
    describe: str
    handler: OpHandler | None = None
    function: tuple | None = None
    kwargs: dict = dataclasses.field(default_factory=dict)
    subgraphs: dict = dataclasses.field(default_factory=dict)
    name: str = dataclasses.field(init=False)

    def __post_init__(self):
        self.name = self.proto.name
        self.inputs = tuple(self.inputs)
        self.outputs = tuple(self.outputs)


@dataclasses.dataclass
class _Program:
    """A graph or subgraph ready to run."""

    nodes: list
    input_names: tuple
    output_names: tuple
    constants: dict
    free_names: frozenset  # names read from an enclosing scope


class _Preparer:
    """Turns GraphProtos and FunctionProtos into _Programs for one model."""

    def __init__(self, opsets: dict, functions: dict):
        self.opsets = opsets
        self.functions = functions  # (domain, name) -> FunctionProto (model-local)
        self.counter = 0

    def program(self, graph: onnx.GraphProto, *, opsets=None, input_names=None,
                output_names=None, constants=None) -> _Program:
        opsets = opsets or self.opsets
        if constants is None:
            constants = initializer_values(graph)
        if input_names is None:
            input_names = tuple(i.name for i in graph.input if i.name not in constants)
        if output_names is None:
            output_names = tuple(o.name for o in graph.output)
        nodes = [self.node(n, opsets) for n in graph.node]
        return _Program(nodes, tuple(input_names), tuple(output_names), constants,
                        _free_names(nodes, set(input_names) | set(constants)))

    def node(self, proto: onnx.NodeProto, opsets: dict) -> _Node:
        index = self.counter
        self.counter += 1
        op_type, domain = proto.op_type, normalize_domain(proto.domain)
        local = self.functions.get((proto.domain, op_type))
        if local is not None:
            return _Node(index, proto, op_type, domain, opsets.get(domain, 1), proto.input, proto.output,
                         f"{proto.domain}::{op_type} (model function), node {proto.name!r}",
                         function=("local", local))
        if domain not in opsets:
            raise ModelError(
                f"node {proto.name!r} ({proto.domain}::{op_type}) uses domain "
                f"{proto.domain!r}, which the model's opset_import does not declare"
            )
        opset = opsets[domain]
        node = _Node(index, proto, op_type, domain, opset, proto.input, proto.output,
                     f"{domain or 'ai.onnx'}::{op_type} (opset {opset}), node {proto.name!r}",
                     handler=_registry.lookup(domain, op_type, opset))
        schema = _get_schema(op_type, opset, domain)
        given = {a.name: a for a in proto.attribute}
        if node.handler is None:
            node.function = _schema_function(schema, node.opset)
            if node.function is None:
                raise UnsupportedOpError(node.op_type, node.domain, node.opset, proto.name)
            return node
        h = node.handler
        for name, attr in given.items():
            if attr.ref_attr_name:
                raise ModelError(f"{node.describe}: attribute {name!r} refers to "
                                 f"{attr.ref_attr_name!r} outside a function body")
            if name not in h.attr_names and not h.accepts_all_attrs:
                raise OpError(
                    f"{node.describe}: jaxort's handler does not support attribute {name!r}")
            if attr.type == onnx.AttributeProto.GRAPH:
                node.subgraphs[name] = self.program(attr.g, opsets=opsets)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                raise OpError(f"{node.describe}: graph-list attributes are not supported")
            else:
                try:
                    node.kwargs[name] = _attr_to_python(attr)
                except ModelError as e:
                    raise ModelError(f"{node.describe}: {e}") from None
        if schema is not None:
            for name, spec in schema.attributes.items():
                if name in given or name not in h.attr_names:
                    continue
                if spec.required:
                    raise ModelError(f"{node.describe}: required attribute {name!r} is missing")
                if spec.default_value.type != onnx.AttributeProto.UNDEFINED:
                    node.kwargs[name] = _attr_to_python(spec.default_value)
                else:
                    node.kwargs[name] = None
        return node


def _free_names(nodes, bound: set) -> frozenset:
    produced = set(bound)
    free = set()
    for n in nodes:
        for i in n.inputs:
            if i and i not in produced:
                free.add(i)
        for sub in n.subgraphs.values():
            free |= {x for x in sub.free_names if x not in produced}
        produced.update(o for o in n.outputs if o)
    return frozenset(free)


def _reads(node) -> set:
    """The names a node reads: its inputs and what its subgraphs read from outside them."""
    names = {n for n in node.inputs if n}
    for sub in node.subgraphs.values():
        for program in (sub if isinstance(sub, (list, tuple)) else [sub]):
            names |= set(program.free_names)
    return names


@functools.lru_cache(maxsize=None)
def _get_schema(op_type: str, opset: int, domain: str):
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def _schema_function(schema, opset: int):
    """Returns how to expand an op from its schema's function body, or None."""
    if schema is None:
        return None
    versions = [v for v in getattr(schema, "function_opset_versions", []) if v <= opset]
    if schema.has_function and versions:
        fproto = onnx.FunctionProto()
        fproto.ParseFromString(schema.get_function_with_opset_version(max(versions)))
        return ("static", fproto)
    cd_versions = [
        v for v in getattr(schema, "context_dependent_function_opset_versions", []) if v <= opset
    ]
    if schema.has_context_dependent_function and cd_versions:
        return ("context", (schema, max(cd_versions)))
    return None


def _proto_free_names(graph: onnx.GraphProto) -> set:
    """Names a subgraph reads from its enclosing scopes."""
    bound = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    free = set()
    for n in graph.node:
        free.update(i for i in n.input if i and i not in bound)
        free.update(x for x in outer_reads(n) if x not in bound)
        bound.update(o for o in n.output if o)
    return free


def outer_reads(node: onnx.NodeProto) -> set:
    """Names the subgraphs of ``node`` (If branches, Loop/Scan bodies) read from the outer scope."""
    reads = set()
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            reads |= _proto_free_names(g)
    return reads


def backward_slice(nodes: Sequence[onnx.NodeProto], wanted: Sequence[str]) -> tuple[list, set]:
    """Returns the nodes needed to compute ``wanted`` and every name they read.

    Topological order is kept. Pruning happens on the protos, before handlers
    are looked up, so a slice never needs ops it does not use (an ORT training
    model's gradient nodes).
    """
    needed = set(wanted)
    keep = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output if o):
            keep.append(node)
            needed.update(i for i in node.input if i)
            needed.update(outer_reads(node))
    keep.reverse()
    return keep, needed



def _prepare_nodes(prep: _Preparer, kept: list, opsets: dict, static: dict, outputs, fuse: bool):
    """Prepares the sliced nodes, each matched pattern group as one node.

    Returns the nodes and one (pattern name, node names) pair per group. A node
    keeps its index in ``kept`` (a group takes its last node's), so random
    nodes draw the same keys with or without fusion.
    """
    if not fuse:
        return [prep.node(n, opsets) for n in kept], ()
    from jaxort.graph.patterns import plan

    nodes, fusions = [], []
    for index, item in plan(kept, opsets, static, set(outputs), outer_reads):
        if isinstance(item, onnx.NodeProto):
            node = prep.node(item, opsets)
            node.index = index
        else:
            node = _fused_node(item, opsets, index)
            fusions.append((item.pattern.name, item.node_names))
        nodes.append(node)
    return nodes, tuple(fusions)


def _fused_node(group, opsets: dict, index: int) -> _Node:
    m, name, domain = group.match, group.pattern.name, "jaxort.patterns"
    opset = opsets.get("", 0)
    names = ", ".join(repr(n) for n in group.node_names)
    handler = OpHandler(
        domain=domain, op_type=name, since=1, fn=group.pattern.handler,
        foldable=True, wants_ctx=False, accepts_all_attrs=True, attr_names=frozenset(m.attrs))
    return _Node(index, m.nodes[-1], name, domain, opset, m.inputs, m.outputs,
                 f"pattern {name} (opset {opset}), nodes {names}", handler=handler, kwargs=dict(m.attrs))

