"""The standard ONNX backend interface (``onnx.backend.base.Backend``) over jaxort.

Module-level ``prepare``, ``run_model``, ``run_node`` and ``supports_device``
follow ``onnxruntime.backend``. A prepared model is jit-compiled once per input
shapes and dtypes. Backend runs compute with 64-bit types enabled, so float64
and int64 models keep their declared precision.

Example:
  >>> import jaxort.backend as backend                   # doctest: +SKIP
  >>> rep = backend.prepare(model, "CPU")                 # doctest: +SKIP
  >>> outputs = rep.run([x])                              # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from jaxort.errors import InputError, StaticValueError
from jaxort.graph import JaxGraph, x64_enabled_scope

__all__ = [
    "JaxBackend",
    "JaxBackendRep",
    "prepare",
    "resolve_device",
    "run_model",
    "run_node",
    "supports_device",
]

# Device names, case-insensitive: ONNX backends say "CPU"/"CUDA", ORT's
# training API "cpu"/"cuda".
_DEVICE_PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "tpu": "tpu"}


def resolve_device(device: str) -> jax.Device:
    """Maps ``"cpu" | "cuda" | "gpu" | "tpu"`` (any case, optionally ``":<index>"``) to a JAX device.

    Raises:
      InputError: an unknown device name, or one JAX does not have here.
    """
    if not isinstance(device, str):
        raise InputError(f"device must be a string such as 'cpu' or 'cuda:0', got {device!r}")
    kind, _, index = device.partition(":")
    platform = _DEVICE_PLATFORMS.get(kind.strip().lower())
    if platform is None:
        raise InputError(f"unknown device {device!r}; jaxort supports 'cpu', 'cuda', 'gpu' and "
                         "'tpu', optionally followed by ':<index>'")
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        available = sorted({d.platform for d in jax.devices()})
        raise InputError(f"device {device!r} is not available: JAX has no {platform!r} backend "
                         f"in this process (available: {available})") from None
    try:
        position = int(index) if index else 0
    except ValueError:
        raise InputError(f"device {device!r}: the index after ':' must be an integer") from None
    if not 0 <= position < len(devices):
        raise InputError(f"device {device!r} is not available: JAX sees {len(devices)} "
                         f"{platform} device(s)")
    return devices[position]


class JaxBackendRep(BackendRep):
    """A model prepared for repeated runs; compiled once per input signature."""

    def __init__(self, graph: JaxGraph, device: str = "CPU"):
        self.graph = graph
        self.device = resolve_device(device)
        self._jitted = jax.jit(graph.apply)
        # Inputs the graph needs at trace time (shapes, axes given as graph
        # inputs, as ONNX's node tests do) are found on the first call and then
        # baked into the compiled function, one compilation per distinct value.
        self._static_ints = False
        self._eager = False
        self._baked = {}

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        """Runs the model.

        Args:
          inputs: a list of arrays in graph input order, a dict name -> array,
            or a single array for a one-input model.

        Returns:
          A tuple of numpy arrays, one per graph output.
        """
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
                outs = self.graph.apply(self.graph.params, *inputs)
            else:
                with jax.default_device(self.device):
                    outs = self._run_jit(inputs)
            return tuple(_to_numpy(o) for o in outs)

    def _run_jit(self, inputs):
        if self._eager:
            return self.graph.apply(self.graph.params, *inputs)
        if not self._static_ints:
            try:
                return self._jitted(self.graph.params, *inputs)
            except StaticValueError:
                self._static_ints = True
        try:
            return self._run_baked(inputs)
        except StaticValueError:
            # Output shapes depend on float data (NonZero of a float tensor,
            # Unique): no compiled form exists, so evaluate at trace time.
            self._eager = True
            return self.graph.apply(self.graph.params, *inputs)

    def _run_baked(self, inputs):
        static_pos = [i for i, x in enumerate(inputs)
                      if np.asarray(x).dtype.kind in "biu"]
        key = tuple((i, np.asarray(inputs[i]).dtype.str, np.asarray(inputs[i]).shape,
                     np.asarray(inputs[i]).tobytes()) for i in static_pos)
        fn = self._baked.get(key)
        if fn is None:
            baked = {i: np.asarray(inputs[i]) for i in static_pos}
            apply = self.graph.apply

            def fn(params, *dynamic):
                it = iter(dynamic)
                args = [baked[i] if i in baked else next(it) for i in range(len(inputs))]
                return apply(params, *args)

            fn = self._baked[key] = jax.jit(fn)
        return fn(self.graph.params, *[x for i, x in enumerate(inputs) if i not in static_pos])


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
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> JaxBackendRep:
        """Traces ``model`` (path, bytes or ModelProto) for ``device``."""
        with x64_enabled_scope():
            graph = JaxGraph(model, params=[], **kwargs)
        return JaxBackendRep(graph, device)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs) -> tuple:
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
        try:
            resolve_device(device)
        except InputError:
            return False
        return True


prepare = JaxBackend.prepare
run_model = JaxBackend.run_model
run_node = JaxBackend.run_node
supports_device = JaxBackend.supports_device
