"""The standard ONNX backend interface (``onnx.backend.base.Backend``) over jaxort.

Module-level ``prepare``, ``run_model``, ``run_node`` and ``supports_device``
follow ``onnxruntime.backend``. A prepared model is jit-compiled once per input
shapes and dtypes; a graph that needs its integer inputs at trace time is
compiled once per their values, and one whose output shapes depend on float
data is evaluated without compiling (the choice is made on the first run, see
:class:`JaxBackendRep`). Backend runs compute with 64-bit types enabled, so
float64 and int64 models keep their declared precision.

This module belongs to the graph layer: it imports jaxort.graph and the format
layer, nothing of training or the facades.

Example:
  >>> import jaxort.backend as backend                   # doctest: +SKIP
  >>> rep = backend.prepare(model, "CPU")                 # doctest: +SKIP
  >>> outputs = rep.run([x])                              # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any, Sequence

import jax
import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from jaxort.errors import InputError, StaticValueError
from jaxort.graph import JaxGraph, normalize_domain, resolve_device, x64_enabled_scope

__all__ = [
    "JaxBackend",
    "JaxBackendRep",
    "prepare",
    "resolve_device",  # re-exported from jaxort.graph for existing callers
    "run_model",
    "run_node",
    "supports_device",
]

# How a prepared model runs tensor inputs. Decided once, on the first run:
# deciding takes a trace, and the baked mode needs the integer inputs' values.
_JIT = "jit"  # every input traced: one compilation per input shapes and dtypes
_HOSTED = "hosted"  # NonZero-like ops run first (JaxGraph.host_values): one compilation per their shapes
_BAKED = "baked"  # integer and bool inputs baked in: one compilation per their values
_EAGER = "eager"  # evaluated at trace time, without a compiled form

# Ops that draw random numbers. A model with one that has no ``seed`` attribute
# (Dropout ignores its seed) gets a fresh PRNG key on every run.
_RANDOM_OPS = frozenset({"Bernoulli", "Dropout", "Multinomial", "RandomNormal",
                         "RandomNormalLike", "RandomUniform", "RandomUniformLike"})


def _draws_unseeded(model: onnx.ModelProto) -> bool:
    """True when a node of ``model`` (subgraphs and local functions included)
    draws random numbers without a fixed seed."""
    def graphs():
        stack = [model.graph]
        while stack:
            g = stack.pop()
            yield g.node
            stack.extend(a.g for n in g.node for a in n.attribute if a.HasField("g"))
            stack.extend(sg for n in g.node for a in n.attribute for sg in a.graphs)
        for f in model.functions:
            yield f.node

    for nodes in graphs():
        for n in nodes:
            if normalize_domain(n.domain) == "" and n.op_type in _RANDOM_OPS and (
                    n.op_type == "Dropout" or not any(a.name == "seed" for a in n.attribute)):
                return True
    return False


class JaxBackendRep(BackendRep):
    """A model prepared for repeated runs; compiled once per input signature.

    Attributes:
      graph: the traced model.
      device: the JAX device it runs on.
      mode: how tensor inputs are run, decided on the first run: ``"jit"``,
        ``"hosted"``, ``"baked"`` or ``"eager"`` (None before the first run).
    """

    def __init__(self, graph: JaxGraph, device: str = "CPU"):
        self.graph = graph
        self.device = resolve_device(device)
        self.mode = None
        self._jitted = jax.jit(graph.apply)
        self._baked = {}
        self._random = _draws_unseeded(graph.model)
        self._seed = secrets.randbits(31)
        self._runs = itertools.count()

    def run(self, inputs: Any, rng=None, **kwargs: Any) -> tuple:
        """Runs the model.

        Args:
          inputs: a list of arrays in graph input order, a dict name -> array,
            or a single array for a one-input model.
          rng: a PRNG key for the random nodes (Dropout with training_mode
            true, Bernoulli, RandomUniform, ...). By default a model whose
            random nodes lack a ``seed`` attribute draws anew on every run, as
            ONNX Runtime does; seeded nodes repeat their numbers.

        Returns:
          A tuple of numpy arrays, one per graph output.
        """
        if rng is None and self._random:
            rng = jax.random.fold_in(jax.random.key(self._seed), next(self._runs))
        names = self.graph.input_names
        if isinstance(inputs, dict):
            missing = [n for n in names if n not in inputs]
            if missing:
                raise InputError(f"missing inputs {missing}")
            inputs = [inputs[n] for n in names]
        elif isinstance(inputs, np.ndarray):
            inputs = [inputs]
        inputs = [x if x is None or isinstance(x, (list, np.ndarray)) else np.asarray(x)
                  for x in inputs]
        with x64_enabled_scope():
            if any(x is None or isinstance(x, list)
                   or (isinstance(x, np.ndarray) and x.dtype == object) for x in inputs):
                # Strings and sequences cannot cross a jit boundary: evaluate at
                # trace time, where such values stay numpy.
                outs = self.graph.apply(self.graph.params, *inputs, rng=rng)
            else:
                with jax.default_device(self.device):
                    host = None
                    if self.mode is None:
                        self.mode, host = self._choose_mode(inputs, rng)
                    outs = self._run_tensors(inputs, rng, host)
            return tuple(_to_numpy(o) for o in outs)

    def _choose_mode(self, inputs: list, rng) -> tuple[str, dict | None]:
        """Picks the cheapest mode that can compile this graph; returns it and the host values it computed.

        Some graphs need a graph input at trace time: ONNX's node cases feed a
        Reshape target, Slice bounds or a TopK k as inputs, and only a
        constant can fix an output shape. Others have output shapes set by
        values: NonZero and NonMaxSuppression run first on the host
        (``JaxGraph.host_values``) and the graph compiles once per their
        output shapes; Unique of a float tensor has no compiled form. Which
        one a graph is shows when it is traced, so the first run traces it
        abstractly (``jit(...).trace``, whose trace the compiled call
        then reuses) in each mode in turn and keeps the first that traces.
        The hosted mode's host values of these inputs come back with it, so
        the first run does not compute them twice.
        """
        if _traces(self._jitted, self.graph.params, *inputs, rng=rng):
            return _JIT, None
        if self.graph.host.nodes:
            try:
                host = self.graph.host_values(self.graph.params, *inputs)
            except StaticValueError:  # the host ops read an input only a constant can fix
                host = None
            if host is not None and _traces(self._jitted, self.graph.params, *inputs, rng=rng, host=host):
                return _HOSTED, host
        fn, dynamic = self._baked_fn(inputs)
        if _traces(fn, self.graph.params, *dynamic, rng=rng):
            return _BAKED, None
        return _EAGER, None

    def _run_tensors(self, inputs: list, rng, host: dict | None = None) -> tuple:
        if self.mode == _JIT:
            return self._jitted(self.graph.params, *inputs, rng=rng)
        if self.mode == _HOSTED:
            if host is None:
                host = self.graph.host_values(self.graph.params, *inputs)
            return self._jitted(self.graph.params, *inputs, rng=rng, host=host)
        if self.mode == _BAKED:
            fn, dynamic = self._baked_fn(inputs)
            return fn(self.graph.params, *dynamic, rng=rng)
        return self.graph.apply(self.graph.params, *inputs, rng=rng)

    def _baked_fn(self, inputs: list):
        """Returns a jitted function with the integer and bool inputs baked in, and
        the inputs it still takes; one function (and compilation) per their values."""
        static_pos = [i for i, x in enumerate(inputs) if np.asarray(x).dtype.kind in "biu"]
        key = tuple((i, np.asarray(inputs[i]).dtype.str, np.asarray(inputs[i]).shape,
                     np.asarray(inputs[i]).tobytes()) for i in static_pos)
        fn = self._baked.get(key)
        if fn is None:
            baked = {i: np.asarray(inputs[i]) for i in static_pos}
            apply = self.graph.apply
            count = len(inputs)

            def fn(params, *dynamic, rng=None):
                it = iter(dynamic)
                args = [baked[i] if i in baked else next(it) for i in range(count)]
                return apply(params, *args, rng=rng)

            fn = self._baked[key] = jax.jit(fn)
        return fn, [x for i, x in enumerate(inputs) if i not in static_pos]


def _traces(jitted, *args, **kwargs) -> bool:
    """True when ``jitted`` traces on ``args`` with every argument abstract.

    A StaticValueError is the tracer's answer "this value must be a constant";
    any other error is a real one and propagates.
    """
    try:
        jitted.trace(*args, **kwargs)
    except StaticValueError:
        return False
    return True


def _to_numpy(x):
    if isinstance(x, (list, tuple)):
        return [_to_numpy(v) for v in x]
    if x is None:
        return None
    return np.asarray(x)


class JaxBackend(Backend):
    """jaxort as an ONNX backend."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs) -> bool:
        """Whether the device is available (ops are checked when the model is prepared)."""
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> JaxBackendRep:
        """Traces ``model`` (path, bytes or ModelProto) for ``device``.

        Every node runs as ONNX specifies it: fusion is off unless
        ``fuse=True`` is passed. A fused rule computes half-precision
        subgraphs in float32 and rounds once, which is more accurate than the
        spec's node-by-node rounding but not the spec's numbers.
        """
        kwargs.setdefault("fuse", False)
        with x64_enabled_scope():
            graph = JaxGraph(model, params=[], **kwargs)
        return JaxBackendRep(graph, device)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs) -> tuple:
        """Prepares ``model`` and runs it once on ``inputs``; returns the outputs."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence, device: str = "CPU",
                 outputs_info=None, **kwargs) -> tuple:
        """Runs one node on numpy inputs (opset from ``opset_version``, else the newest)."""
        from onnx import helper

        from jaxort.dtypes import to_onnx_type

        inputs = [np.asarray(x) for x in inputs]
        graph_inputs = [
            helper.make_tensor_value_info(name, to_onnx_type(x.dtype), list(x.shape))
            for name, x in zip(node.input, inputs) if name
        ]
        graph_outputs = [helper.make_empty_tensor_value_info(name) for name in node.output if name]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)])
        rep = cls.prepare(model, device, check=False)
        return rep.run([x for name, x in zip(node.input, inputs) if name])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether JAX has a device of this kind (``CPU``, ``CUDA``/``GPU``)."""
        try:
            resolve_device(device)
        except InputError:
            return False
        return True


prepare = JaxBackend.prepare
run_model = JaxBackend.run_model
run_node = JaxBackend.run_node
supports_device = JaxBackend.supports_device
