"""Tracing ONNX graphs into pure JAX functions.

``JaxGraph(model)`` prepares a model once (opsets resolved, handlers looked up,
attributes parsed with the spec's defaults, unused nodes pruned) and exposes
``apply(params, *inputs) -> tuple(outputs)``, a pure function that composes
with ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

Values are static (numpy, known at trace time) or traced (JAX). A node whose
inputs are all static is evaluated at trace time ("folded"), so shape
arithmetic exported by PyTorch (Shape -> Gather -> Concat -> Reshape) never
reaches XLA as data. Folding runs with 64-bit types enabled, so int64 shape
values keep their width whatever the caller's JAX configuration.

This module knows nothing of training: the training layer asks for the slice it
needs (``outputs=``), for parameters fed as graph inputs (``param_inputs=``),
and for training-mode behaviour (``training=True``, an ``rng`` key).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper, numpy_helper

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import InputError, JaxortError, ModelError, OpError, UnsupportedOpError
from jaxort.graph import _registry
from jaxort.graph._host_memory import settle_allocator
from jaxort.graph._model import ModelSource, load_model, tensor_to_numpy
from jaxort.graph._values import NodeKey, OpContext, is_static

__all__ = ["JaxGraph", "TensorInfo", "Subgraph", "backward_slice", "outer_reads",
           "x64_enabled_scope"]


def x64_enabled_scope():
    """A context in which JAX computes with 64-bit types."""
    enable = getattr(jax, "enable_x64", None)
    if enable is None:  # jax < 0.5 spells it in experimental
        from jax.experimental import enable_x64 as enable
    return enable(True)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of a graph input or output.

    ``shape`` holds ints for static dims, the dim_param string (or None) for
    symbolic ones; it is None when the rank is unknown. ``dtype`` is a numpy
    dtype, or None when the model does not say.
    """

    name: str
    shape: tuple | None
    dtype: np.dtype | None
    kind: str = "tensor"


def _value_info(vi: onnx.ValueInfoProto) -> TensorInfo:
    t = vi.type
    if not t.HasField("tensor_type"):
        # Sequences are Python lists, optionals None or a value.
        kind = t.WhichOneof("value") or "tensor"
        return TensorInfo(vi.name, None, None, kind.replace("_type", ""))
    tt = t.tensor_type
    try:
        dtype = to_numpy_dtype(tt.elem_type) if tt.elem_type else None
    except KeyError:
        dtype = None
    if not tt.HasField("shape"):
        return TensorInfo(vi.name, None, dtype)
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or None)
    return TensorInfo(vi.name, tuple(dims), dtype)


def _tensor_to_numpy(t: onnx.TensorProto) -> np.ndarray:
    arr = tensor_to_numpy(t)
    if arr.dtype.kind in ("S", "U"):
        arr = arr.astype(object)
    return arr


def _sparse_to_numpy(sp: onnx.SparseTensorProto) -> np.ndarray:
    values = _tensor_to_numpy(sp.values)
    dense = np.zeros(tuple(sp.dims), dtype=values.dtype)
    idx = numpy_helper.to_array(sp.indices)
    if idx.ndim == 1:
        dense.reshape(-1)[idx] = values
    else:
        dense[tuple(idx.T)] = values
    return dense


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


class _Node:
    """A node prepared for dispatch: handler found, attributes parsed once."""

    __slots__ = (
        "index", "name", "op_type", "domain", "opset", "inputs", "outputs",
        "handler", "kwargs", "subgraphs", "function", "proto", "describe",
    )


@dataclasses.dataclass
class _Program:
    """A graph or subgraph ready to run."""

    nodes: list
    input_names: tuple
    output_names: tuple
    constants: dict
    free_names: frozenset  # names read from an enclosing scope


@dataclasses.dataclass
class _Runtime:
    """Per-call settings shared by every node of one trace."""

    training: bool
    key: Any
    updates: dict | None
    opsets: dict
    functions: dict
    x64: bool = True  # JAX computes float64 as float64 (see _require_x64)


class Subgraph:
    """A graph-valued attribute (If branches, Loop/Scan bodies) bound to its scope.

    Calling it with the subgraph's inputs returns the tuple of its outputs; it
    reads values of the enclosing graph by name, as ONNX scoping says.
    """

    def __init__(self, program: _Program, outer: Mapping, runtime: _Runtime):
        self._program = program
        self._outer = outer
        self._runtime = runtime

    @property
    def input_names(self) -> tuple:
        """The subgraph's input names, in order."""
        return self._program.input_names

    @property
    def output_names(self) -> tuple:
        """The subgraph's output names, in order."""
        return self._program.output_names

    def __call__(self, *args) -> tuple:
        prog = self._program
        if len(args) != len(prog.input_names):
            raise OpError(
                f"subgraph expects {len(prog.input_names)} inputs "
                f"{list(prog.input_names)}, got {len(args)}"
            )
        env = collections.ChainMap(dict(zip(prog.input_names, args)), prog.constants, self._outer)
        _run_program(prog, env, self._runtime)
        return tuple(env[n] for n in prog.output_names)


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
            constants = {t.name: _tensor_to_numpy(t) for t in graph.initializer}
            for sp in graph.sparse_initializer:
                constants[sp.values.name] = _sparse_to_numpy(sp)
        if input_names is None:
            input_names = tuple(i.name for i in graph.input if i.name not in constants)
        if output_names is None:
            output_names = tuple(o.name for o in graph.output)
        nodes = [self.node(n, opsets) for n in graph.node]
        return _Program(nodes, tuple(input_names), tuple(output_names), constants,
                        _free_names(nodes, set(input_names) | set(constants)))

    def node(self, proto: onnx.NodeProto, opsets: dict) -> _Node:
        node = _Node()
        node.index = self.counter
        self.counter += 1
        node.proto = proto
        node.name = proto.name
        node.op_type = proto.op_type
        node.domain = _registry.normalize_domain(proto.domain)
        node.inputs = tuple(proto.input)
        node.outputs = tuple(proto.output)
        node.subgraphs = {}
        node.function = None
        node.kwargs = {}
        local = self.functions.get((proto.domain, proto.op_type))
        if local is not None:
            node.opset = opsets.get(node.domain, 1)
            node.describe = f"{proto.domain}::{proto.op_type} (model function), node {proto.name!r}"
            node.handler = None
            node.function = ("local", local)
            return node
        if node.domain not in opsets:
            raise ModelError(
                f"node {proto.name!r} ({proto.domain}::{proto.op_type}) uses domain "
                f"{proto.domain!r}, which the model's opset_import does not declare"
            )
        node.opset = opsets[node.domain]
        node.describe = (
            f"{node.domain or 'ai.onnx'}::{node.op_type} (opset {node.opset}), node {proto.name!r}"
        )
        node.handler = _registry.lookup(node.domain, node.op_type, node.opset)
        schema = _get_schema(node.op_type, node.opset, node.domain)
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


def _type_proto(value) -> onnx.TypeProto:
    dtype = np.dtype(value.dtype) if not isinstance(value, np.ndarray) else value.dtype
    if dtype.kind in ("U", "S"):
        dtype = np.dtype(object)
    from jaxort.dtypes import to_onnx_type

    return helper.make_tensor_type_proto(to_onnx_type(dtype), list(np.shape(value)))


def _substitute_attrs(fproto: onnx.FunctionProto, caller: onnx.NodeProto) -> list:
    """Returns the body nodes with ``ref_attr_name`` attributes resolved."""
    given = {a.name: a for a in caller.attribute}
    defaults = {a.name: a for a in getattr(fproto, "attribute_proto", [])}

    def resolve(nodes):
        out = []
        for n in nodes:
            new = onnx.NodeProto()
            new.CopyFrom(n)
            del new.attribute[:]
            for a in n.attribute:
                if a.ref_attr_name:
                    src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                    if src is None:
                        continue
                    b = onnx.AttributeProto()
                    b.CopyFrom(src)
                    b.name = a.name
                    new.attribute.append(b)
                elif a.type == onnx.AttributeProto.GRAPH:
                    b = onnx.AttributeProto()
                    b.CopyFrom(a)
                    del b.g.node[:]
                    b.g.node.extend(resolve(a.g.node))
                    new.attribute.append(b)
                else:
                    new.attribute.append(a)
            out.append(new)
        return out

    return resolve(fproto.node)


def _run_function(node: _Node, args: list, runtime: _Runtime) -> tuple:
    kind, payload = node.function
    if kind == "context":
        schema, version = payload
        types = [_type_proto(a).SerializeToString() if a is not None else
                 onnx.TypeProto().SerializeToString() for a in args]
        try:
            raw = schema.get_context_dependent_function_with_opset_version(
                version, node.proto.SerializeToString(), types)
        except Exception as e:
            raise OpError(f"{node.describe}: cannot expand its function body: {e}") from e
        fproto = onnx.FunctionProto()
        fproto.ParseFromString(raw)
    else:
        fproto = payload
    opsets = dict(runtime.opsets)
    for imp in fproto.opset_import:
        opsets[_registry.normalize_domain(imp.domain)] = imp.version
    body = onnx.GraphProto()
    body.node.extend(_substitute_attrs(fproto, node.proto))
    # The body's nodes are numbered from 0 under a key of their own, folded from
    # the caller's key and index: every random node gets a distinct key, however
    # many nodes the model has and however deep the expansion nests.
    prep = _Preparer(opsets, runtime.functions)
    prog = prep.program(body, opsets=opsets, input_names=tuple(fproto.input),
                        output_names=tuple(fproto.output), constants={})
    env = {}
    for formal, value in zip(fproto.input, args):
        env[formal] = value
    for formal in fproto.input[len(args):]:
        env[formal] = None
    key = None if runtime.key is None else runtime.key.child(node.index)
    sub_rt = dataclasses.replace(runtime, opsets=opsets, key=key)
    _run_program(prog, env, sub_rt)
    return tuple(env.get(o) for o in fproto.output)


def _to_static(value):
    if isinstance(value, (list, tuple)):
        return type(value)(_to_static(v) for v in value)
    if value is None or isinstance(value, np.ndarray):
        return value
    return np.asarray(value)


def _name_the_node(err: OpError, node: _Node) -> None:
    """Prefixes ``node``'s description to ``err``, unless a node already claimed it.

    Handlers and the helpers of ``_values`` raise OpErrors without naming the
    node; the innermost dispatcher the error passes through (the node in a
    subgraph or function body, not the If or the expanded op around it) names it
    once, and marks the error so the enclosing dispatchers leave it alone.
    """
    if getattr(err, "node", None) is not None:
        return
    message = str(err.args[0]) if err.args else ""
    if not message.startswith(node.describe):
        err.args = (f"{node.describe}: {message}",) + tuple(err.args[1:])
    err.node = node.describe


def _call_node(node: _Node, args: list, env: Mapping, runtime: _Runtime) -> tuple:
    try:
        return _dispatch(node, args, env, runtime)
    except OpError as e:
        _name_the_node(e, node)
        raise


def _dispatch(node: _Node, args: list, env: Mapping, runtime: _Runtime) -> tuple:
    if node.handler is None:
        return _run_function(node, args, runtime)
    h = node.handler
    kwargs = dict(node.kwargs)
    for name, prog in node.subgraphs.items():
        kwargs[name] = Subgraph(prog, env, runtime)
    if h.wants_ctx:
        key = None if runtime.key is None else runtime.key.child(node.index)
        kwargs["ctx"] = OpContext(node.name, node.opset, runtime.training, node.inputs,
                                  node.outputs, key, runtime.updates)
    fold = h.foldable and not node.subgraphs and all(is_static(a) for a in args)
    if not fold and not runtime.x64:
        for name, a in zip(node.inputs, args):
            if isinstance(a, np.ndarray) and a.dtype in _WIDE_FLOATS:
                raise ModelError(f"{node.describe}: {_x64_message('value', name, a.dtype)}")
        # Ops that make float64 out of narrower values (Cast to DOUBLE, random
        # ops with dtype DOUBLE, EyeLike...) name the type in an attribute.
        for attr in ("to", "dtype"):
            if node.kwargs.get(attr) in _WIDE_ONNX_TYPES:
                wide = np.dtype(to_numpy_dtype(node.kwargs[attr]))
                subject = f"attribute {attr} asks for {wide}"
                raise ModelError(f"{node.describe}: {_x64_message('', '', wide, subject)}")
    try:
        if fold:
            with jax.ensure_compile_time_eval(), x64_enabled_scope():
                result = h.fn(*args, **kwargs)
                result = _to_static(result)
        else:
            result = h.fn(*args, **kwargs)
    except JaxortError:
        raise
    except Exception as e:
        raise OpError(f"{node.describe} failed: {type(e).__name__}: {e}") from e
    if not isinstance(result, tuple):
        # A list is one sequence value; several outputs come as a tuple.
        result = (result,)
    n_out = len(node.outputs)
    while n_out and not node.outputs[n_out - 1]:
        n_out -= 1
    if len(result) < n_out:
        raise OpError(
            f"{node.describe}: the node has {n_out} outputs but jaxort's handler "
            f"returned {len(result)}"
        )
    return tuple(result)


def _run_program(prog: _Program, env, runtime: _Runtime) -> None:
    for node in prog.nodes:
        args = []
        for name in node.inputs:
            if not name:
                args.append(None)
                continue
            try:
                args.append(env[name])
            except KeyError:
                raise ModelError(
                    f"{node.describe}: input {name!r} is not a graph input, an "
                    "initializer or the output of an earlier node"
                ) from None
        outs = _call_node(node, args, env, runtime)
        for name, value in zip(node.outputs, outs):
            if name:
                env[name] = value


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


def _check_default_opset(opsets: Mapping) -> None:
    """Refuses a default-domain opset the installed onnx does not know.

    Dispatch picks the newest handler whose ``since`` is <= the opset, so an
    unknown future opset would run with today's semantics and no warning.
    """
    if "" not in opsets:
        return
    version, newest = opsets[""], onnx.defs.onnx_opset_version()
    if not 1 <= version <= newest:
        raise ModelError(
            f"the model imports opset {version} of the default domain (ai.onnx); the installed onnx "
            f"{onnx.__version__} supports opsets 1 to {newest}")


def _prepare_nodes(prep: _Preparer, kept: list, opsets: dict, static: dict, outputs, fuse: bool):
    """Prepares the sliced nodes, each matched pattern group as one node.

    Returns the nodes and one (pattern name, node names) pair per group. A node
    keeps its index in ``kept`` (a group takes its last node's), so random
    nodes draw the same keys with or without fusion.
    """
    if not fuse:
        return [prep.node(n, opsets) for n in kept], ()
    from jaxort.graph import patterns

    nodes, fusions = [], []
    for index, item in patterns.plan(kept, opsets, static, set(outputs), outer_reads):
        if isinstance(item, onnx.NodeProto):
            node = prep.node(item, opsets)
        else:
            node = _fused_node(item, opsets)
            fusions.append((item.pattern.name, item.node_names))
        node.index = index
        nodes.append(node)
    return nodes, tuple(fusions)


def _fused_node(group, opsets: dict) -> _Node:
    m = group.match
    node = _Node()
    node.proto = m.nodes[-1]
    node.name = node.proto.name
    node.op_type = group.pattern.name
    node.domain = "jaxort.patterns"
    node.opset = opsets.get("", 0)
    node.inputs = tuple(m.inputs)
    node.outputs = tuple(m.outputs)
    node.subgraphs = {}
    node.function = None
    node.kwargs = dict(m.attrs)
    names = ", ".join(repr(n) for n in group.node_names)
    node.describe = f"pattern {group.pattern.name} (opset {node.opset}), nodes {names}"
    node.handler = _registry.OpHandler(
        domain=node.domain, op_type=node.op_type, since=1, fn=group.pattern.handler,
        foldable=True, wants_ctx=False, accepts_all_attrs=True, attr_names=frozenset(m.attrs))
    return node


def _canonical(dtype) -> np.dtype:
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


# Dtypes JAX narrows to 32 bits when its 64-bit mode is off.
_WIDE_FLOATS = (np.dtype(np.float64), np.dtype(np.complex128))
_WIDE_ONNX_TYPES = (onnx.TensorProto.DOUBLE, onnx.TensorProto.COMPLEX128)


def _x64_enabled() -> bool:
    return _canonical(np.float64) == np.float64


def _x64_message(what: str, name: str, dtype, subject: str = "") -> str:
    subject = subject or f"{what} {name!r} is {np.dtype(dtype)}"
    return (
        f"{subject}, but JAX's 64-bit mode is off, so it would be "
        f"computed in {_canonical(dtype)}; enable 64-bit types around the call with "
        "`with jax.enable_x64(True):`, or for the whole program with "
        "`jax.config.update(\"jax_enable_x64\", True)`")


class JaxGraph:
    """An ONNX graph traced into a pure JAX function.

    Args:
      model: a path, serialized bytes, or ``onnx.ModelProto``.
      params: names of the initializers that become parameters (the ``params``
        pytree ``apply`` takes); the others stay trace-time constants. Default:
        every floating-point initializer.
      param_inputs: graph inputs that are fed from ``params`` rather than
        positionally (ONNX Runtime training models list parameters as inputs).
      inputs: the graph inputs ``apply`` takes positionally, in this order.
        Default: every graph input that is neither an initializer nor in
        ``param_inputs``. Graph inputs left out must not be needed.
      outputs: the values to return, graph outputs or any intermediate value.
        Default: the graph outputs. Only the nodes they need are evaluated.
      extra_outputs: intermediate values to return after ``outputs``.
      check: validate the model with ``onnx.checker``.
      fuse: replace recognised subgraphs (layer norm, softmax and its loss,
        Gelu, attention; see ``jaxort.graph.patterns``) by fused handlers with
        their own backward rules. ``fuse=False`` runs every node op by op.

    Attributes:
      model: the ``ModelProto``.
      opsets: domain -> opset version ("" for the default domain).
      params: initial parameter values, name -> numpy array (a dict pytree).
      constants: initializers kept static, name -> numpy array.
      inputs: ``TensorInfo`` of each positional input.
      outputs: ``TensorInfo`` of each output.
      fusions: one ``(pattern name, node names)`` pair per fused group.

    Example:
      >>> g = JaxGraph("model.onnx")                      # doctest: +SKIP
      >>> (y,) = jax.jit(g.apply)(g.params, x)            # doctest: +SKIP
    """

    def __init__(
        self,
        model: ModelSource,
        *,
        params: Sequence[str] | None = None,
        param_inputs: Sequence[str] = (),
        inputs: Sequence[str] | None = None,
        outputs: Sequence[str] | None = None,
        extra_outputs: Sequence[str] = (),
        check: bool = True,
        fuse: bool = True,
    ):
        settle_allocator()  # before any step of this graph is compiled and run: see _host_memory
        self.model = load_model(model, check=check)
        graph = self.model.graph
        self.opsets = {}
        for imp in self.model.opset_import:
            self.opsets[_registry.normalize_domain(imp.domain)] = int(imp.version)
        _check_default_opset(self.opsets)
        functions = {(f.domain, f.name): f for f in self.model.functions}

        import jaxort.graph.ops  # noqa: F401  (fills the registry)

        prep = _Preparer(self.opsets, functions)
        initializers = {t.name: _tensor_to_numpy(t) for t in graph.initializer}
        for sp in graph.sparse_initializer:
            initializers[sp.values.name] = _sparse_to_numpy(sp)
        default_params = params is None
        if default_params:
            params = [n for n, v in initializers.items() if v.dtype.kind in "fc"
                      or v.dtype == np.dtype("bfloat16") or v.dtype.name.startswith("float")]
        unknown = [p for p in params if p not in initializers]
        if unknown:
            raise InputError(f"params {unknown} are not initializers of the graph")
        graph_inputs = {i.name: _value_info(i) for i in graph.input if i.name not in initializers}
        bad = [p for p in param_inputs if p not in graph_inputs]
        if bad:
            raise InputError(f"param_inputs {bad} are not graph inputs")
        if inputs is None:
            inputs = [n for n in graph_inputs if n not in set(param_inputs)]
        bad = [n for n in inputs if n not in graph_inputs]
        if bad:
            raise InputError(
                f"inputs {bad} are not graph inputs; the graph inputs are {list(graph_inputs)}")

        value_infos = {v.name: _value_info(v) for v in list(graph.value_info) + list(graph.output)}
        value_infos.update(graph_inputs)
        produced = {o for n in graph.node for o in n.output if o}
        if outputs is None:
            outputs = [o.name for o in graph.output]
        outputs = list(outputs) + list(extra_outputs)
        available = produced | set(graph_inputs) | set(initializers)
        missing = [o for o in outputs if o not in available]
        if missing:
            raise InputError(
                f"unknown output names {missing}: not produced by any node, nor graph inputs "
                "or initializers")

        kept, _ = backward_slice(graph.node, outputs)
        static = {n: v for n, v in initializers.items() if n not in set(params)}
        nodes, self.fusions = _prepare_nodes(prep, kept, self.opsets, static, outputs, fuse)
        bound = set(inputs) | set(param_inputs) | set(initializers)
        needed_free = _free_names(nodes, bound)
        if needed_free:
            raise InputError(
                f"the requested outputs need graph inputs {sorted(needed_free)} that are "
                f"neither positional inputs {list(inputs)} nor param_inputs")
        used = set(outputs)
        for node in nodes:
            used.update(i for i in node.inputs if i)
            for sub in node.subgraphs.values():
                used.update(sub.free_names)
        if default_params:
            # A slice needs only the initializers its nodes read.
            params = [n for n in params if n in used]
            initializers = {n: v for n, v in initializers.items() if n in used}
        self.params = {n: initializers[n] for n in params}
        self.constants = {n: v for n, v in initializers.items() if n not in self.params}
        self._param_names = tuple(params) + tuple(param_inputs)
        self.param_inputs = tuple(param_inputs)
        self.inputs = tuple(graph_inputs[n] for n in inputs)
        self.param_input_info = {n: graph_inputs[n] for n in param_inputs}
        self.outputs = tuple(
            value_infos.get(o) or TensorInfo(o, None, None) for o in outputs)
        self._program = _Program(nodes, tuple(inputs), tuple(outputs), self.constants,
                                 frozenset())
        self._functions = functions
        self._jit = None

    @property
    def input_names(self) -> list[str]:
        """The names of the traced inputs (``apply``'s positional arguments after ``params``)."""
        return [i.name for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        """The names of the values ``apply`` returns, in order."""
        return [o.name for o in self.outputs]

    @property
    def node_count(self) -> int:
        """How many nodes (fused groups counting once) ``apply`` evaluates."""
        return len(self._program.nodes)

    def _check_inputs(self, inputs) -> None:
        if len(inputs) != len(self.inputs):
            names = [i.name for i in self.inputs]
            if len(inputs) < len(self.inputs):
                raise InputError(
                    f"missing inputs {names[len(inputs):]}: expected {len(names)} inputs "
                    f"{names}, given {len(inputs)}")
            raise InputError(f"too many inputs: expected {len(names)} {names}, given {len(inputs)}")
        for info, x in zip(self.inputs, inputs):
            _check_value(info, x, "input")

    def _check_params(self, params: Mapping) -> None:
        if not isinstance(params, Mapping):
            raise InputError(f"params must be a mapping of name -> array, got {type(params).__name__}")
        missing = [n for n in self._param_names if n not in params]
        if missing:
            raise InputError(f"params is missing {missing}")
        unknown = [n for n in params if n not in self._param_names]
        if unknown:
            raise InputError(f"params has unknown names {unknown}; expected {list(self._param_names)}")
        for name in self.param_inputs:
            _check_value(self.param_input_info[name], params[name], "param")
        for name, init in self.params.items():
            _check_value(TensorInfo(name, init.shape, init.dtype), params[name], "param")

    def _require_x64(self) -> None:
        """Refuses float64 values when JAX's 64-bit mode is off.

        JAX would silently compute them in float32 and return float32, a wrong
        answer for a model that asks for double precision. Raising beats turning
        64-bit mode on behind the caller's back: that is a global JAX setting,
        it would change the dtypes of the caller's own arrays and of everything
        else jitted in the process. int64 is not refused: ONNX exporters use
        it for labels, indices and shapes, whose values fit in int32 (shape
        arithmetic is folded at trace time with 64-bit types anyway), and ONNX
        Runtime training models rely on that.
        """
        for info in self.inputs:
            if info.dtype in _WIDE_FLOATS:
                raise InputError(_x64_message("input", info.name, info.dtype))
        for name, info in self.param_input_info.items():
            if info.dtype in _WIDE_FLOATS:
                raise InputError(_x64_message("param", name, info.dtype))
        for name, init in self.params.items():
            if init.dtype in _WIDE_FLOATS:
                raise InputError(_x64_message("param (initializer)", name, init.dtype))

    def apply_with_updates(self, params: Mapping, *inputs, rng=None, training: bool = False):
        """Like :meth:`apply`, and also returns state updates made by training-mode ops.

        ``rng`` may also be a :class:`~jaxort.graph._values.NodeKey`, whose
        ``uses`` then tells the caller whether any node drew a key.

        Returns:
          ``(outputs, updates)``: the output tuple, and a dict param name -> new
          value (running statistics of BatchNormalization in training mode).
        """
        self._check_inputs(inputs)
        self._check_params(params)
        x64 = _x64_enabled()
        if not x64:
            self._require_x64()
        env = dict(self.constants)
        env.update(params)
        env.update(zip(self._program.input_names, inputs))
        updates = {}
        if rng is not None and not isinstance(rng, NodeKey):
            rng = NodeKey(rng)
        runtime = _Runtime(training, rng, updates, self.opsets, self._functions, x64)
        _run_program(self._program, env, runtime)
        outs = tuple(_as_output(n, env[n], x64) for n in self._program.output_names)
        return outs, updates

    def apply(self, params: Mapping, *inputs, rng=None, training: bool = False) -> tuple:
        """Evaluates the graph; a pure function of ``params`` and ``inputs``.

        Args:
          params: name -> array for every parameter (``self.params`` gives the
            initial values) and every ``param_inputs`` name.
          *inputs: the positional inputs, in ``self.input_names`` order.
          rng: a PRNG key, needed when random ops are active (Dropout in
            training mode).
          training: evaluate training-mode behaviour (see ``OpContext``).

        Returns:
          A tuple with one array per output.

        Raises:
          InputError: a missing, extra, or mis-shaped/mistyped input or param,
            or a float64 one while JAX's 64-bit mode is off.
          ModelError: a float64 constant reaches a traced op while 64-bit mode
            is off (constants folded at trace time are fine).
          OpError: an op failed; the message names the node.
        """
        return self.apply_with_updates(params, *inputs, rng=rng, training=training)[0]

    def jit_apply(self, params: Mapping, *inputs) -> tuple:
        """``jax.jit(self.apply)``, compiled once per input shapes and dtypes."""
        if self._jit is None:
            self._jit = jax.jit(self.apply)
        return self._jit(params, *inputs)

    def __repr__(self) -> str:
        ins = ", ".join(f"{i.name}{list(i.shape) if i.shape is not None else ''}" for i in self.inputs)
        outs = ", ".join(o.name for o in self.outputs)
        return f"JaxGraph(inputs=[{ins}], outputs=[{outs}], params={len(self.params)}, nodes={self.node_count})"


def _as_output(name: str, value, x64: bool):
    if isinstance(value, np.ndarray) and value.dtype != object:
        if not x64 and value.dtype in _WIDE_FLOATS:
            # A value folded at trace time in float64 would leave as float32.
            raise ModelError(_x64_message("output", name, value.dtype))
        return jnp.asarray(value)
    return value


def _check_value(info: TensorInfo, x, what: str) -> None:
    if info.kind != "tensor":
        return
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is None or dtype is None:
        raise InputError(
            f"{what} {info.name!r}: expected an array, given {type(x).__name__}")
    problems = []
    if info.dtype is not None and np.dtype(dtype) != info.dtype:
        # Only a JAX value may stand for a wider declared dtype (int64 as int32
        # while 64-bit mode is off): JAX made it so. A numpy float64 for a
        # float32 input is the caller's mistake, refused as ONNX Runtime does.
        if info.dtype == object or not isinstance(x, jax.Array) or _canonical(dtype) != _canonical(info.dtype):
            problems.append("dtype")
    if info.shape is not None:
        if len(shape) != len(info.shape) or any(
            isinstance(e, int) and e != g for e, g in zip(info.shape, shape)
        ):
            problems.append("shape")
    if problems:
        exp_shape = list(info.shape) if info.shape is not None else "any"
        raise InputError(
            f"{what} {info.name!r} has the wrong {' and '.join(problems)}: expected "
            f"shape {exp_shape} dtype {info.dtype}, given shape {list(shape)} dtype "
            f"{np.dtype(dtype)}")
