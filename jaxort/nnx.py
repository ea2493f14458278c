"""flax.nnx modules over ONNX models: the ``flax`` extra (``pip install 'jaxort[flax]'``).

:class:`OnnxModule` is an ``nnx.Module`` that evaluates an ONNX graph through
:class:`jaxort.graph.JaxGraph`. Its initializers are nnx variables keyed by
their ONNX names, verbatim: the trainable ones ``nnx.Param``\\ s in
``module.params``, the frozen ones (BatchNormalization running statistics,
initializers left out of ``params=``) :class:`OnnxFrozen` variables in
``module.frozen``, which ``nnx.Optimizer(..., wrt=nnx.Param)`` leaves alone
and training-mode BatchNormalization writes back. The module composes
inside a user's nnx model, trains with ``nnx.Optimizer``, takes LoRA
adapters (``nnx.LoRA``) on chosen MatMul and Gemm weights, and exports what
it learned as an ONNX Runtime Training checkpoint or as the ONNX model with
updated initializers.

Only this module imports flax (and :mod:`jaxort.equinox` equinox); the rest
of jaxort never does. It imports the graph and checkpoint layers.

Example:
  >>> from flax import nnx                                                 # doctest: +SKIP
  >>> body = OnnxModule("model.onnx")                                      # doctest: +SKIP
  >>> optimizer = nnx.Optimizer(body, optax.adam(1e-3), wrt=nnx.Param)     # doctest: +SKIP
  >>> body.save_onnx("trained.onnx")                                       # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import onnx

try:
    from flax import nnx
except ImportError as e:  # the optional module itself: say which extra brings flax
    raise ImportError(
        "jaxort.nnx needs flax: pip install 'jaxort[flax]' (or pip install flax)") from e

from jaxort import checkpoint
from jaxort._onnx_modules import lora_names, module_checkpoint, split_initializers, weight_layout, with_initializers
from jaxort.errors import InputError
from jaxort.graph import JaxGraph, load_model, save_model

__all__ = ["OnnxFrozen", "OnnxModule"]

ModelSource = Union[str, os.PathLike, bytes, onnx.ModelProto]



class OnnxFrozen(nnx.Variable):
    """A frozen initializer of an ONNX model: module state, not a parameter.

    Not an ``nnx.Param``, so ``nnx.Optimizer(..., wrt=nnx.Param)``,
    ``nnx.grad`` and ``nnx.state(module, nnx.Param)`` leave it out;
    ``nnx.state(module, OnnxFrozen)`` selects it. Training-mode
    BatchNormalization writes its running statistics into these variables.
    """


class OnnxModule(nnx.Module):
    """An ONNX model as an ``nnx.Module``; its initializers are nnx variables.

    The trainable initializers are ``nnx.Param``\\ s in ``self.params`` and
    the frozen ones :class:`OnnxFrozen` variables in ``self.frozen``, both
    dicts keyed by the initializer names of the ONNX model, verbatim
    (``module.params["layer1.0.conv1.weight"]``). Initializers that
    are not floating point (shapes, indices) stay constants of the traced
    graph, outside the module's state, and are exported unchanged.

    Calling the module evaluates the graph (``JaxGraph.apply``) on its
    current values, LoRA adapters (:meth:`lora`) added to their weights. It
    returns the ONNX model's output, a single array when the model has one
    output and a tuple in graph order when it has several. In training mode
    BatchNormalization computes with batch statistics and writes the new
    running statistics into its :class:`OnnxFrozen` variables (as ONNX
    Runtime Training does), and Dropout draws from ``rng``. The mode follows
    nnx's convention: ``deterministic=True`` (the default, inference, as the
    model runs in ONNX Runtime) until ``model.train()`` sets it to False on
    every submodule and ``model.eval()`` back; ``training=`` on a call
    overrides it.

    Args:
      model: a path, serialized bytes or ``onnx.ModelProto``.
      params: names of the initializers to train. Default: every
        floating-point initializer the graph reads except the running
        statistics of BatchNormalization (PyTorch's parameters, not its
        buffers). The other floating-point initializers are frozen.
      fuse: run recognised subgraphs through jaxort's fused rules
        (``JaxGraph(fuse=...)``).
      check: validate the model with ``onnx.checker``.
      deterministic: start in inference mode (True) or training mode.

    Attributes:
      graph: the :class:`~jaxort.graph.JaxGraph` (its ``params`` are the
        initial values).
      params: name -> ``nnx.Param``, the trainable initializers.
      frozen: name -> :class:`OnnxFrozen`, the frozen initializers.
      lora_adapters: weight name -> ``nnx.LoRA``.
      deterministic: inference mode when True.

    Raises:
      UnknownNameError: a name in ``params`` is not an initializer of the model.
      InputError: a name in ``params`` is not a floating-point initializer.
      ModelError: an invalid model (see :class:`~jaxort.graph.JaxGraph`).

    Example:
      >>> class Classifier(nnx.Module):                                 # doctest: +SKIP
      ...     def __init__(self, rngs):
      ...         self.body = OnnxModule("resnet.onnx", params=["fc.weight", "fc.bias"])
      ...         self.scale = nnx.Param(jnp.ones(()))
      ...     def __call__(self, x):
      ...         return self.body(x) * self.scale[...]
      >>> model = Classifier(nnx.Rngs(0))                               # doctest: +SKIP
      >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)  # doctest: +SKIP
    """

    def __init__(self, model: ModelSource, *, params: Optional[Sequence[str]] = None,
                 fuse: bool = True, check: bool = True, deterministic: bool = True):
        proto = load_model(model, check=False)
        trainable, frozen = split_initializers(proto, params)
        self.graph = JaxGraph(proto, params=trainable + frozen, fuse=fuse, check=check)
        initial = self.graph.params
        # Plain dicts marked as data, not nnx.Dict: that one keeps its entries as
        # attributes, and an initializer called "items" or "train" would shadow a method.
        self.params = nnx.data({n: nnx.Param(jnp.asarray(initial[n])) for n in trainable})
        self.frozen = nnx.data({n: OnnxFrozen(jnp.asarray(initial[n])) for n in frozen})
        self.lora_adapters = nnx.data({})
        # Weights stored [out, in] (Gemm with transB=1, the first MatMul input),
        # whose LoRA product is transposed before it is added.
        self._lora_transposed = ()
        self.deterministic = deterministic

    def __call__(self, *inputs, training: Optional[bool] = None, rng=None):
        """Evaluates the ONNX graph on the module's current values.

        Args:
          *inputs: the graph inputs, in ``self.graph.input_names`` order.
          training: training mode (batch statistics written back, random
            Dropout); None follows ``not self.deterministic``.
          rng: a PRNG key, needed when a random op is active (Dropout in
            training mode), e.g. ``rngs.dropout()``.

        Returns:
          The output array when the model has one output, else the tuple of
          outputs in ``self.graph.output_names`` order.

        Raises:
          InputError: a missing, extra, or mis-shaped/mistyped input.
          OpError: an op failed; the message names the node.
        """
        if training is None:
            training = not self.deterministic
        outputs, updates = self.graph.apply_with_updates(
            self.values(), *inputs, rng=rng, training=bool(training))
        for name, value in updates.items():
            # Running statistics made trainable through params= are not written.
            if name in self.frozen:
                self.frozen[name].set_value(value)
        return outputs[0] if len(outputs) == 1 else outputs

    def values(self) -> dict[str, jax.Array]:
        """Every initializer the graph takes, by name, LoRA adapters merged into their weights.

        Returns:
          name -> array, trainable then frozen: what the module computes
          with and what :meth:`to_checkpoint` and :meth:`to_onnx` export.
        """
        values = {n: v.get_value() for n, v in self.params.items()}
        values.update((n, v.get_value()) for n, v in self.frozen.items())
        transposed = set(self._lora_transposed)
        for name, adapter in self.lora_adapters.items():
            delta = adapter.lora_a.get_value() @ adapter.lora_b.get_value()
            values[name] = values[name] + (delta.T if name in transposed else delta).astype(values[name].dtype)
        return values

    def lora(self, names: Union[str, Sequence[str]], rank: int, *, rngs: nnx.Rngs,
             **lora_kwargs: Any) -> None:
        """Adds an ``nnx.LoRA`` adapter to each named MatMul or Gemm weight, in place.

        The weight ``W`` then computes as ``W + A @ B`` (transposed where the
        weight is stored ``[out, in]``: a Gemm ``B`` with ``transB=1``, a
        Gemm ``A`` with ``transA=0``, the first input of a MatMul), with
        ``A`` ``[in, rank]`` and ``B`` ``[rank, out]`` the adapter's
        ``nnx.LoRAParam``\\ s (``B`` starts at zero, so the outputs do not
        change until it trains). ``nnx.Optimizer(model, tx,
        wrt=nnx.LoRAParam)`` then trains the adapters alone; ``nnx.LoRAParam``
        is an ``nnx.Param``, so ``wrt=nnx.Param`` trains them with the rest.
        The exports merge each adapter into its weight.

        Args:
          names: the initializer name(s) of 2-D floating-point weights read
            only by MatMul or Gemm nodes (as an operand, not a bias).
          rank: the adapters' rank.
          rngs: the ``nnx.Rngs`` the adapters draw their initial ``A`` from.
          **lora_kwargs: passed on to ``nnx.LoRA`` (``a_initializer``,
            ``b_initializer``, ``lora_param_type``).

        Raises:
          UnknownNameError: a name that is not an initializer of the module.
          InputError: a weight that is not 2-D, already has an adapter, or is
            read by another op (the message names the node); a rank below 1.

        Example:
          >>> module.lora(["fc.weight"], 4, rngs=nnx.Rngs(0))              # doctest: +SKIP
          >>> optimizer = nnx.Optimizer(module, optax.adam(1e-3), wrt=nnx.LoRAParam)  # doctest: +SKIP
        """
        current = {**self.params, **self.frozen}
        names = lora_names(names, rank, current, self.params)
        transposed = []
        for name in names:
            shape = current[name].get_value().shape
            if len(shape) != 2:
                raise InputError(f"lora: initializer {name!r} has shape {tuple(shape)}; LoRA needs a 2-D weight")
            if name in self.lora_adapters:
                raise InputError(f"lora: initializer {name!r} already has a LoRA adapter")
            if weight_layout(self.graph.model, name):
                transposed.append(name)
        for name in names:
            weight = current[name].get_value()
            out_features, in_features = weight.shape if name in transposed else weight.shape[::-1]
            self.lora_adapters[name] = nnx.LoRA(in_features, int(rank), out_features, rngs=rngs,
                                                param_dtype=weight.dtype, **lora_kwargs)
        self._lora_transposed = tuple(self._lora_transposed) + tuple(transposed)

    def to_checkpoint(self, properties: Optional[Mapping[str, Any]] = None) -> checkpoint.Checkpoint:
        """The module's values as an ONNX Runtime Training checkpoint state.

        Trainable initializers are the checkpoint's ``requires_grad``
        parameters, frozen ones its frozen parameters, each ordered by name
        as ONNX Runtime writes them; LoRA adapters are merged into their
        weights, so the checkpoint fits the original ONNX model (and ORT's
        artifacts made from it). No optimizer state.

        Args:
          properties: the property bag (name -> int, float or str).

        Returns:
          The :class:`jaxort.checkpoint.Checkpoint`, numpy arrays.
        """
        values = self.values()
        return module_checkpoint(values, list(self.params), list(self.frozen), properties)

    def save_checkpoint(self, path: Union[str, os.PathLike],
                        properties: Optional[Mapping[str, Any]] = None) -> None:
        """Writes :meth:`to_checkpoint` to ``path`` (crash-safely, ``jaxort.checkpoint.save``).

        Raises:
          CheckpointError: a property of the wrong type, or an OS error.
        """
        checkpoint.save(self.to_checkpoint(properties), path)

    def to_onnx(self) -> onnx.ModelProto:
        """The ONNX model with its initializers replaced by the module's values.

        LoRA adapters are merged into their weights; everything else (nodes,
        inputs, outputs, non-float initializers, metadata) is the model's.

        Returns:
          A new ``onnx.ModelProto``.
        """
        return with_initializers(self.graph.model, self.values())

    def save_onnx(self, path: Union[str, os.PathLike]) -> None:
        """Writes :meth:`to_onnx` to ``path``, crash-safely (``jaxort.graph.save_model``).

        A model over 2 GiB keeps its tensors in ``<file name>.data`` beside it.
        """
        save_model(self.to_onnx(), path)
