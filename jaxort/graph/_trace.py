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

Here programs run: ``jaxort.graph._prepare`` makes them from the protos (nodes
with handlers and parsed attributes, fused pattern groups) and
``jaxort.graph._inputs`` checks the values fed for inputs and params.

This module knows nothing of training: the training layer asks for the slice it
needs (``outputs=``), for parameters fed as graph inputs (``param_inputs=``),
and for training-mode behaviour (``training=True``, an ``rng`` key).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import InputError, JaxortError, ModelError, OpError, StaticValueError
from jaxort.graph._host import host_plan
from jaxort.graph._host_memory import settle_allocator
from jaxort.graph.compilation_cache import use_compilation_cache
from jaxort.graph._inputs import _canonical, check_input
from jaxort.graph._model import ModelSource, load_model
from jaxort.graph._prepare import (
    _free_names,
    _Node,
    _reads,
    _prepare_nodes,
    _Preparer,
    _Program,
    backward_slice,
    initializer_values,
    outer_reads,
)
from jaxort.graph._registry import normalize_domain
from jaxort.graph._structure import check_graph_structure
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
        opsets[normalize_domain(imp.domain)] = imp.version
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
                result = _to_static(_fold(h.fn, args, kwargs))
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


def _fold(fn: Callable, args: list, kwargs: dict):
    """``fn(*args, **kwargs)`` on static values, in 64-bit mode at trace time.

    JAX 0.10 can hand a numpy int64 argument of an eager call in 64-bit mode
    to the program compiled for it as a 32-bit buffer, once the same value
    was captured by a trace in 32-bit mode ("RuntimeProgramInputMismatch ...
    expected s64[] but got s32[]"); the arguments made JAX arrays in 64-bit
    mode first are passed as they are.
    """
    try:
        return fn(*args, **kwargs)
    except jax.errors.JaxRuntimeError as e:
        if "RuntimeProgramInputMismatch" not in str(e):
            raise
    args = [jnp.asarray(a) if isinstance(a, np.ndarray) and a.dtype != object else a for a in args]
    return fn(*args, **kwargs)


def _run_program(prog: _Program, env, runtime: _Runtime) -> None:
    _run_nodes(prog.nodes, env, runtime)


def _run_nodes(nodes: Sequence, env, runtime: _Runtime) -> None:
    for node in nodes:
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


def _run_program_remat(prog: _Program, env, runtime: _Runtime, policy: Callable) -> None:
    """:func:`_run_program` in about sqrt(n) segments of consecutive nodes, each under
    ``jax.checkpoint(policy=policy)``: the backward pass keeps the values that cross segment
    boundaries (and what ``policy`` saves inside one) and computes the rest again.

    Static values (numpy: shape arithmetic) stay static: they enter a segment by closure and
    leave it through a side table, never as traced arguments or results.
    """
    nodes = prog.nodes
    size = max(1, math.ceil(math.sqrt(len(nodes))))
    chunks = [nodes[i:i + size] for i in range(0, len(nodes), size)]
    needed_after = []
    needed = set(prog.output_names)
    for chunk in reversed(chunks):
        needed_after.append(set(needed))
        for node in chunk:
            needed |= _reads(node)
    needed_after.reverse()
    for chunk, later in zip(chunks, needed_after):
        produced = [o for node in chunk for o in node.outputs if o]
        inside = set(produced)
        reads = sorted({n for node in chunk for n in _reads(node)} - inside)
        live = [n for n in reads if n in env]
        traced = [n for n in live if not is_static(env[n])]
        closed = {n: env[n] for n in live if is_static(env[n])}
        keep = [o for o in produced if o in later]
        static_out: dict = {}

        def segment(*values, chunk=chunk, traced=traced, closed=closed, keep=keep, static_out=static_out):
            local = dict(closed)
            local.update(zip(traced, values))
            inner = dataclasses.replace(runtime, updates=None if runtime.updates is None else {})
            _run_nodes(chunk, local, inner)
            out = {}
            for name in keep:
                if is_static(local[name]):
                    static_out[name] = local[name]  # concrete: safe to carry out of the trace
                else:
                    out[name] = local[name]
            return out, inner.updates or {}

        out, updates = jax.checkpoint(segment, policy=policy)(*(env[n] for n in traced))
        env.update(static_out)
        env.update(out)
        if runtime.updates is not None:
            runtime.updates.update(updates)


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
      host: the :class:`~jaxort.graph.HostPlan` of ops whose output shape
        depends on run-time values (NonZero, NonMaxSuppression): under
        ``jit`` their outputs come from :meth:`host_values`.

    Raises:
      ModelError: an invalid model: :func:`jaxort.graph.check_graph_structure`
        names a cycle, a value made twice, a dangling read or nodes out of
        order (before ``onnx.checker`` runs); otherwise the checker's message.
      InputError: names in ``params``, ``param_inputs``, ``inputs`` or
        ``outputs`` the graph does not have.

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
        use_compilation_cache()  # likewise: see compilation_cache
        self.model = load_model(model, check=False)
        # Before onnx.checker, whose message names one node of a cycle, and
        # before the passes below, which assume a sorted, acyclic node list.
        check_graph_structure(self.model.graph)
        if check:
            load_model(self.model, check=True)
        graph = self.model.graph
        self.opsets = {}
        for imp in self.model.opset_import:
            self.opsets[normalize_domain(imp.domain)] = int(imp.version)
        _check_default_opset(self.opsets)
        functions = {(f.domain, f.name): f for f in self.model.functions}

        import jaxort.graph.ops  # noqa: F401  (fills the registry)

        prep = _Preparer(self.opsets, functions)
        initializers = initializer_values(graph)
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
        self.host = host_plan(nodes, tuple(inputs) + self._param_names, self._param_names)
        hosted = [n for n in nodes if not any(n is h for h in self.host.nodes)]
        self._hosted = _Program(hosted, tuple(inputs), tuple(outputs), self.constants, frozenset())
        self._host_jit = None
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

    def host_values(self, params: Mapping, *inputs, training: bool = False) -> dict:
        """The outputs of the host ops (``self.host``) for these values, computed eagerly.

        Runs the nodes the host ops need (``self.host.prefix``) as one
        compiled program (op by op where a host op reads another's outputs),
        then the host ops on its concrete results, outside any ``jit``. Pass
        the result as ``host=`` to :meth:`apply` inside ``jit``: the compiled
        program then takes the host ops' outputs as inputs, and compiles
        once per their shapes.

        Args:
          params: name -> array; only the parameters the prefix reads
            (``self.host.params``) are used.
          *inputs: the positional inputs, as for :meth:`apply`.
          training: evaluate training-mode behaviour.

        Returns:
          ``{name: numpy array}`` for every name in ``self.host.names`` (empty
          when the graph has no host op).

        Raises:
          InputError: bad inputs, or a parameter the prefix reads is missing.
          StaticValueError: a value the prefix reads is traced (called inside ``jit``).

        Example:
          >>> host = graph.host_values(graph.params, ids)                       # doctest: +SKIP
          >>> (y,) = jax.jit(graph.apply)(graph.params, ids, host=host)         # doctest: +SKIP
        """
        if not self.host.nodes:
            return {}
        self._check_inputs(inputs)
        missing = sorted(p for p in self.host.params if p not in params)
        if missing:
            raise InputError(f"params is missing {missing}, which the host ops' prefix reads")
        used = {p: params[p] for p in self.host.params}
        if any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves((used, inputs))):
            raise StaticValueError(f"host ops {[n.describe for n in self.host.nodes]} read traced values: "
                                   "their outputs need concrete inputs, call host_values outside jit")
        env = dict(self.constants)
        runtime = _Runtime(training, None, {}, self.opsets, self._functions, _x64_enabled())
        if self.host.nested:
            # A host op reads another's outputs: the prefix runs op by op.
            env.update(used)
            env.update(zip(self._program.input_names, inputs))
            nodes = self.host.prefix
        else:
            # The values the host ops read, from one compiled program per input shapes.
            if self._host_jit is None:
                self._host_jit = jax.jit(self._host_feeds, static_argnames="training")
            feeds = self._host_jit(used, *inputs, training=training)
            env.update(zip(self.host.feeds, (np.asarray(v) for v in feeds)))
            nodes = self.host.nodes
        try:
            _run_nodes(nodes, env, runtime)
        except StaticValueError as e:
            e.args = (f"{e.args[0] if e.args else ''} (computing the outputs of host ops "
                      f"{[n.describe for n in self.host.nodes]} before the compiled call needs "
                      "concrete values: call host_values outside jit)",) + tuple(e.args[1:])
            raise
        return {n: np.asarray(env[n]) for n in self.host.names}

    def _host_feeds(self, params: Mapping, *inputs, training: bool) -> tuple:
        """The values the host ops read (``self.host.feeds``), by the prefix without them."""
        env = dict(self.constants)
        env.update(params)
        env.update(zip(self._program.input_names, inputs))
        runtime = _Runtime(training, None, {}, self.opsets, self._functions, _x64_enabled())
        hosts = {id(n) for n in self.host.nodes}
        _run_nodes([n for n in self.host.prefix if id(n) not in hosts], env, runtime)
        return tuple(env[n] for n in self.host.feeds)

    def _check_host(self, host) -> None:
        if not isinstance(host, Mapping) or set(host) != set(self.host.names):
            given = sorted(host) if isinstance(host, Mapping) else type(host).__name__
            raise InputError(f"host must map the host ops' outputs {list(self.host.names)} "
                             f"(from host_values) to arrays, got {given}")

    def apply_with_updates(self, params: Mapping, *inputs, rng=None, training: bool = False,
                           remat: Callable | None = None, host: Mapping | None = None):
        """Like :meth:`apply`, and also returns state updates made by training-mode ops.

        ``rng`` may also be a :class:`~jaxort.graph.NodeKey`, whose
        ``uses`` then tells the caller whether any node drew a key.

        ``remat``: a ``jax.checkpoint`` policy. The nodes then run in about
        sqrt(n) segments, each rematerialised under the policy: a backward
        pass through this call keeps the values crossing segment boundaries
        and what the policy saves, and computes the rest again (the same
        values, less memory). None: no rematerialisation.

        ``host``: the host ops' outputs (:meth:`host_values`), which the
        call then takes instead of computing them; None computes them, which
        needs their inputs concrete (outside ``jit``).

        Returns:
          ``(outputs, updates)``: the output tuple, and a dict param name -> new
          value (running statistics of BatchNormalization in training mode).
        """
        self._check_inputs(inputs)
        self._check_params(params)
        program = self._program
        if host is not None:
            self._check_host(host)
            program = self._hosted
        x64 = _x64_enabled()
        if not x64:
            self._require_x64()
        env = dict(self.constants)
        env.update(params)
        env.update(zip(self._program.input_names, inputs))
        if host is not None:
            env.update(host)
        updates = {}
        if rng is not None and not isinstance(rng, NodeKey):
            rng = NodeKey(rng)
        runtime = _Runtime(training, rng, updates, self.opsets, self._functions, x64)
        if remat is None:
            _run_program(program, env, runtime)
        else:
            _run_program_remat(program, env, runtime, remat)
        outs = tuple(_as_output(n, env[n], x64) for n in program.output_names)
        return outs, updates

    def apply(self, params: Mapping, *inputs, rng=None, training: bool = False,
              host: Mapping | None = None) -> tuple:
        """Evaluates the graph; a pure function of ``params`` and ``inputs``.

        Args:
          params: name -> array for every parameter (``self.params`` gives the
            initial values) and every ``param_inputs`` name.
          *inputs: the positional inputs, in ``self.input_names`` order.
          rng: a PRNG key, needed when random ops are active (Dropout in
            training mode).
          training: evaluate training-mode behaviour (see ``OpContext``).
          host: under ``jit``, the outputs of the ops whose output shape
            depends on run-time values, from :meth:`host_values`; None
            outside ``jit`` (they are computed as the graph runs).

        Returns:
          A tuple with one array per output.

        Raises:
          InputError: a missing, extra, or mis-shaped/mistyped input or param,
            or a float64 one while JAX's 64-bit mode is off.
          ModelError: a float64 constant reaches a traced op while 64-bit mode
            is off (constants folded at trace time are fine).
          OpError: an op failed; the message names the node.
        """
        return self.apply_with_updates(params, *inputs, rng=rng, training=training, host=host)[0]

    def jit_apply(self, params: Mapping, *inputs) -> tuple:
        """``jax.jit(self.apply)``, compiled once per input shapes and dtypes.

        A graph with host ops (``self.host``) computes their outputs first
        (:meth:`host_values`) and compiles once per their shapes too.
        """
        if self._jit is None:
            self._jit = jax.jit(self.apply)
        if self.host.nodes:
            return self._jit(params, *inputs, host=self.host_values(params, *inputs))
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
    if info.kind == "tensor":  # sequences are Python lists, optionals None or a value
        check_input(info.name, info.shape, info.dtype, x, what=what, lists=False, combined=True)
