"""Equinox modules over ONNX models: the ``equinox`` extra (``pip install 'jaxort[equinox]'``).

:class:`OnnxModule` is an ``eqx.Module`` that evaluates an ONNX graph through
:class:`jaxort.graph.JaxGraph`, with the model's initializers as its leaves,
in two dicts keyed by their ONNX names, verbatim: ``params`` (trainable) and
``frozen`` (BatchNormalization running statistics, initializers left out of
``params=``). It works with ``eqx.filter_jit``, ``eqx.filter_grad`` and
``eqx.tree_at``, composes inside a user's equinox model, and exports what it
learned as an ONNX Runtime Training checkpoint or as the ONNX model with
updated initializers.

Frozen values: ``filter_grad`` differentiates every floating-point array
leaf, so the module reads ``frozen`` through ``jax.lax.stop_gradient`` (their
gradients are exactly zero), and :func:`trainable_filter` gives the filter
spec that leaves them out of ``eqx.partition``, for optimizers whose update
is not zero on a zero gradient (weight decay) and to keep their optimizer
state away. They are not static fields: training-mode BatchNormalization
updates them, and a static field would recompile every step.

Only this module imports equinox (and :mod:`jaxort.nnx` flax); the rest of
jaxort never does. It imports the graph and checkpoint layers.

Example:
  >>> import equinox as eqx                                               # doctest: +SKIP
  >>> body = OnnxModule("model.onnx")                                     # doctest: +SKIP
  >>> grads = eqx.filter_grad(lambda m, x: m(x).sum())(body, x)           # doctest: +SKIP
  >>> body.save_onnx("trained.onnx")                                      # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import onnx

try:
    import equinox as eqx
except ImportError as e:  # the optional module itself: say which extra brings equinox
    raise ImportError(
        "jaxort.equinox needs equinox: pip install 'jaxort[equinox]' (or pip install equinox)") from e

from jaxort import checkpoint
from jaxort._onnx_modules import lora_names, module_checkpoint, split_initializers, weight_layout, with_initializers
from jaxort.errors import InputError, UnknownNameError
from jaxort.graph import JaxGraph, load_model, save_model

__all__ = ["OnnxModule", "lora_filter", "trainable_filter"]

ModelSource = Union[str, os.PathLike, bytes, onnx.ModelProto]



class OnnxModule(eqx.Module):
    """An ONNX model as an ``eqx.Module``; its initializers are the leaves.

    ``params`` and ``frozen`` map the ONNX initializer names, verbatim, to
    JAX arrays (``eqx.tree_at(lambda m: m.params["fc.weight"], module, w)``
    replaces one). Initializers that are not floating point (shapes,
    indices) stay constants of the traced graph, outside the pytree, and are
    exported unchanged.

    Calling the module evaluates the graph (``JaxGraph.apply``); it returns
    the ONNX model's output, a single array when the model has one output
    and a tuple in graph order when it has several. In training mode
    BatchNormalization computes with batch statistics and Dropout draws from
    ``rng``; the new running statistics are what :meth:`apply_with_updates`
    returns beside the outputs, for :meth:`with_updates` to write into a new
    module (a plain call drops them: equinox modules are immutable). The mode
    follows equinox's convention: ``inference=True`` (the default, as the
    model runs in ONNX Runtime) until ``eqx.nn.inference_mode(model, False)``;
    ``training=`` on a call overrides it.

    Args:
      model: a path, serialized bytes or ``onnx.ModelProto``.
      params: names of the initializers to train. Default: every
        floating-point initializer the graph reads except the running
        statistics of BatchNormalization (PyTorch's parameters, not its
        buffers). The other floating-point initializers are frozen.
      fuse: run recognised subgraphs through jaxort's fused rules
        (``JaxGraph(fuse=...)``).
      check: validate the model with ``onnx.checker``.
      inference: start in inference mode (True) or training mode.

    Attributes:
      params: name -> trainable initializer (JAX arrays).
      frozen: name -> frozen initializer, read through ``stop_gradient``.
      lora: weight name -> ``(A, B)``, the LoRA adapters :meth:`with_lora` added.
      inference: inference mode when True.
      graph: the :class:`~jaxort.graph.JaxGraph` (a static field).
      lora_transposed: the adapted weights stored ``[out, in]`` (a static field).

    Raises:
      UnknownNameError: a name in ``params`` is not an initializer of the model.
      InputError: a name in ``params`` is not a floating-point initializer.
      ModelError: an invalid model (see :class:`~jaxort.graph.JaxGraph`).

    Example:
      >>> module = OnnxModule("resnet.onnx", params=["fc.weight", "fc.bias"])  # doctest: +SKIP
      >>> train, rest = eqx.partition(module, trainable_filter(module))       # doctest: +SKIP
    """

    params: dict[str, jax.Array]
    frozen: dict[str, jax.Array]
    lora: dict[str, tuple]
    inference: bool
    graph: JaxGraph = eqx.field(static=True)
    lora_transposed: tuple = eqx.field(static=True)

    def __init__(self, model: ModelSource, *, params: Optional[Sequence[str]] = None,
                 fuse: bool = True, check: bool = True, inference: bool = True):
        proto = load_model(model, check=False)
        trainable, frozen = split_initializers(proto, params)
        self.graph = JaxGraph(proto, params=trainable + frozen, fuse=fuse, check=check)
        initial = self.graph.params
        self.params = {n: jnp.asarray(initial[n]) for n in trainable}
        self.frozen = {n: jnp.asarray(initial[n]) for n in frozen}
        self.lora = {}
        self.lora_transposed = ()
        self.inference = inference

    def __call__(self, *inputs, training: Optional[bool] = None, rng=None):
        """Evaluates the ONNX graph; training-mode state updates are dropped.

        Args:
          *inputs: the graph inputs, in ``self.graph.input_names`` order.
          training: training mode (batch statistics, random Dropout); None
            follows ``not self.inference``.
          rng: a PRNG key, needed when a random op is active (Dropout in
            training mode).

        Returns:
          The output array when the model has one output, else the tuple of
          outputs in ``self.graph.output_names`` order.

        Raises:
          InputError: a missing, extra, or mis-shaped/mistyped input.
          OpError: an op failed; the message names the node.
        """
        return self.apply_with_updates(*inputs, training=training, rng=rng)[0]

    def apply_with_updates(self, *inputs, training: Optional[bool] = None, rng=None):
        """Like calling the module, and also returns the new values of frozen initializers.

        Args:
          *inputs: the graph inputs, in ``self.graph.input_names`` order.
          training: training mode; None follows ``not self.inference``.
          rng: a PRNG key, needed when a random op is active.

        Returns:
          ``(outputs, updates)``: the outputs as a call returns them, and
          name -> new value of the frozen initializers the graph wrote
          (running statistics of BatchNormalization in training mode; empty
          in inference mode), for :meth:`with_updates`.

        Raises:
          InputError: a missing, extra, or mis-shaped/mistyped input.
          OpError: an op failed; the message names the node.
        """
        if training is None:
            training = not self.inference
        values = dict(self.params)
        values.update((n, jax.lax.stop_gradient(v)) for n, v in self.frozen.items())
        values.update(self._adapted(values))
        outputs, updates = self.graph.apply_with_updates(values, *inputs, rng=rng, training=bool(training))
        # Running statistics made trainable through params= are not written.
        updates = {n: v for n, v in updates.items() if n in self.frozen}
        return (outputs[0] if len(outputs) == 1 else outputs), updates

    def with_updates(self, updates: Mapping[str, Any]) -> "OnnxModule":
        """A copy of the module whose frozen initializers named in ``updates`` hold the new values.

        Args:
          updates: name -> array, e.g. from :meth:`apply_with_updates`.

        Returns:
          The new module.

        Raises:
          UnknownNameError: a name that is not a frozen initializer.
        """
        unknown = [n for n in updates if n not in self.frozen]
        if unknown:
            raise UnknownNameError(f"updates {unknown} are not frozen initializers of the module")
        return eqx.tree_at(lambda m: m.frozen, self, {**self.frozen, **updates})

    def values(self) -> dict[str, jax.Array]:
        """Every initializer the graph takes, by name: trainable, then frozen; LoRA merged."""
        values = {**self.params, **self.frozen}
        values.update(self._adapted(values))
        return values

    def _adapted(self, values: Mapping[str, jax.Array]) -> dict:
        """Each adapted weight as ``W + A @ B`` (transposed for an ``[out, in]`` weight)."""
        out = {}
        for name, (a, b) in self.lora.items():
            delta = a @ b
            out[name] = values[name] + (delta.T if name in self.lora_transposed else delta).astype(values[name].dtype)
        return out

    def with_lora(self, names: Union[str, Sequence[str]], rank: int, *, key: jax.Array) -> "OnnxModule":
        """A copy of the module with a LoRA adapter on each named MatMul or Gemm weight.

        The weight ``W`` then computes as ``W + A @ B`` (transposed where the
        weight is stored ``[out, in]``: a Gemm ``B`` with ``transB=1``, a Gemm
        ``A`` with ``transA=0``, the first input of a MatMul), with ``A``
        ``[in, rank]`` drawn He-uniform, as ``nnx.LoRA`` draws it, and ``B``
        ``[rank, out]`` zero, so the outputs do not change until it trains.
        ``eqx.partition(model, lora_filter(model))`` trains the adapters
        alone; the exports merge each into its weight.

        Args:
          names: the initializer name(s) of 2-D floating-point weights read
            only by MatMul or Gemm nodes (as an operand, not a bias).
          rank: the adapters' rank.
          key: the PRNG key ``A`` is drawn from.

        Returns:
          The new module.

        Raises:
          UnknownNameError: a name that is not an initializer of the module.
          InputError: a weight that is not 2-D, already has an adapter, or is
            read by another op (the message names the node); a rank below 1.
        """
        current = {**self.params, **self.frozen}
        names = lora_names(names, rank, current, self.params)
        adapters, transposed = dict(self.lora), list(self.lora_transposed)
        for name, subkey in zip(names, jax.random.split(key, len(names))):
            weight = current[name]
            if weight.ndim != 2:
                raise InputError(f"lora: initializer {name!r} has shape {tuple(weight.shape)}; "
                                 "LoRA needs a 2-D weight")
            if name in adapters:
                raise InputError(f"lora: initializer {name!r} already has a LoRA adapter")
            if weight_layout(self.graph.model, name):
                transposed.append(name)
            out_features, in_features = weight.shape if name in transposed else weight.shape[::-1]
            a = jax.nn.initializers.he_uniform()(subkey, (in_features, int(rank)), weight.dtype)
            adapters[name] = (a, jnp.zeros((int(rank), out_features), weight.dtype))
        module = eqx.tree_at(lambda m: m.lora, self, adapters)
        object.__setattr__(module, "lora_transposed", tuple(transposed))  # a static field: not a leaf
        return module

    def to_checkpoint(self, properties: Optional[Mapping[str, Any]] = None) -> checkpoint.Checkpoint:
        """The module's values as an ONNX Runtime Training checkpoint state.

        ``params`` are the checkpoint's ``requires_grad`` parameters and
        ``frozen`` its frozen parameters, each ordered by name as ONNX
        Runtime writes them. No optimizer state.

        Args:
          properties: the property bag (name -> int, float or str).

        Returns:
          The :class:`jaxort.checkpoint.Checkpoint`, numpy arrays.
        """
        return module_checkpoint(self.values(), list(self.params), list(self.frozen), properties)

    def save_checkpoint(self, path: Union[str, os.PathLike],
                        properties: Optional[Mapping[str, Any]] = None) -> None:
        """Writes :meth:`to_checkpoint` to ``path`` (crash-safely, ``jaxort.checkpoint.save``).

        Raises:
          CheckpointError: a property of the wrong type, or an OS error.
        """
        checkpoint.save(self.to_checkpoint(properties), path)

    def to_onnx(self) -> onnx.ModelProto:
        """The ONNX model with its initializers replaced by the module's values.

        Returns:
          A new ``onnx.ModelProto``; nodes, inputs, outputs, non-float
          initializers and metadata are the model's.
        """
        return with_initializers(self.graph.model, self.values())

    def save_onnx(self, path: Union[str, os.PathLike]) -> None:
        """Writes :meth:`to_onnx` to ``path``, crash-safely (``jaxort.graph.save_model``).

        A model over 2 GiB keeps its tensors in ``<file name>.data`` beside it.
        """
        save_model(self.to_onnx(), path)


def trainable_filter(model: Any) -> Any:
    """The filter spec of a model's trainable leaves, for ``eqx.partition``.

    True for every floating-point array leaf (``eqx.is_inexact_array``)
    except the ``frozen`` initializers of the :class:`OnnxModule`\\ s in
    ``model``, wherever they are nested.

    Args:
      model: a pytree, e.g. a user's ``eqx.Module`` holding OnnxModules.

    Returns:
      A pytree of bools with the structure of ``model``.

    Example:
      >>> train, rest = eqx.partition(model, trainable_filter(model))     # doctest: +SKIP
      >>> grads = eqx.filter_grad(lambda t, x: loss(eqx.combine(t, rest), x))(train, x)  # doctest: +SKIP
    """
    def spec(leaf):
        if not isinstance(leaf, OnnxModule):
            return eqx.is_inexact_array(leaf)
        marked = jax.tree.map(eqx.is_inexact_array, leaf)
        if not leaf.frozen:
            return marked
        return eqx.tree_at(lambda m: m.frozen, marked, {n: False for n in leaf.frozen})

    return jax.tree.map(spec, model, is_leaf=lambda x: isinstance(x, OnnxModule))


def lora_filter(model) -> Any:
    """The ``eqx.partition`` filter spec that trains the LoRA adapters (:meth:`OnnxModule.with_lora`) alone.

    True for the ``A`` and ``B`` arrays of every :class:`OnnxModule` in
    ``model``, wherever nested; False for every other leaf.

    Args:
      model: a pytree, e.g. a user's ``eqx.Module`` holding OnnxModules.

    Returns:
      A pytree of bools with the structure of ``model``.

    Example:
      >>> tuned = module.with_lora(["fc.weight"], 4, key=jax.random.key(0))  # doctest: +SKIP
      >>> train, rest = eqx.partition(tuned, lora_filter(tuned))            # doctest: +SKIP
    """
    def spec(leaf):
        marked = jax.tree.map(lambda _: False, leaf)
        if isinstance(leaf, OnnxModule) and leaf.lora:
            marked = eqx.tree_at(lambda m: m.lora, marked, jax.tree.map(eqx.is_inexact_array, leaf.lora))
        return marked

    return jax.tree.map(spec, model, is_leaf=lambda x: isinstance(x, OnnxModule))
