"""Optimizer blocks, as ORT's ``onnxblock.optim``: AdamW, SGD and ClipGradNorm.

Called with the parameters (``(trainable, frozen)`` TensorProtos, as
:meth:`jaxort.onnxblock.TrainingBlock.parameters` returns them) inside
:func:`jaxort.onnxblock.empty_base`, :class:`AdamW` and :class:`SGD` build
ORT's ``optimizer_model.onnx``: inputs ``learning_rate``, ``step``, and
tensor sequences ``params``, ``gradients``, ``first_order_moments`` (and
``second_order_moments``), one com.microsoft optimizer node, and its bool
output. ``jaxort.training.artifacts.generate_artifacts(..., optimizer=AdamW(...))``
writes it.

jaxort reads an optimizer model's AdamWOptimizer or SGDOptimizerV2 node,
not the ``InplaceClipGradNorm`` node a ``clip_grad`` adds before it; for
jaxort to run such an optimizer, give ``block.to_optimizer()`` (an
``OrtOptimizer`` with the same update, clipping included) where the
optimizer model would go.

Part of the training layer: imports the blocks and jaxort.training.optimizers.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from onnx import TensorProto, helper

from jaxort.errors import TrainingError
from jaxort.training.artifacts.blocks._base import Block, _import, _name
from jaxort.training.artifacts.blocks._training import ForwardBlock
from jaxort.training.optimizers import OrtOptimizer, adamw_optimizer, sgd_optimizer

__all__ = ["AdamW", "AdamWOptimizer", "ClipGradNorm", "SGD", "SGDOptimizer"]

_MS_DOMAIN = "com.microsoft"
# ORT's InplaceClipGradNorm kernel (orttraining/training_ops/cpu/optimizer/clip_grad_norm, 1.19.2)
# adds this to the norm, as torch.nn.utils.clip_grad_norm_ does.
_CLIP_EPSILON = 1e-6


def _number(value, what: str, *, low: float, high: float = math.inf, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and value < high
    if not ok:
        bound = f"{'>' if low_open else '>='} {low:g}" + ("" if high == math.inf else f" and < {high:g}")
        raise TrainingError(f"{what} must be a finite number {bound}, got {value!r}")
    return value


class ClipGradNorm(Block):
    """Clips the gradients by their global L2 norm: ORT's ``com.microsoft::InplaceClipGradNorm``.

    With ``n = sqrt(sum of squares of all gradients)``, every gradient is
    multiplied by ``min(max_norm / (n + 1e-6), 1)``, as
    ``torch.nn.utils.clip_grad_norm_`` does.
    """

    def __init__(self, max_norm: float):
        """Makes the block.

        Args:
          max_norm: the largest global norm kept.

        Raises:
          TrainingError: ``max_norm`` is not a finite number > 0.
        """
        super().__init__()
        self._max_norm = _number(max_norm, "ClipGradNorm max_norm", low=0.0, low_open=True)

    @property
    def max_norm(self) -> float:
        """The largest global norm kept."""
        return self._max_norm

    def build(self, gradients_name: str) -> str:
        """Appends the node on the gradient sequence; returns the clipped sequence's name."""
        _import(self.base, _MS_DOMAIN, 1)
        out = _name("clip_grad_norm_output")
        self.base.graph.node.append(helper.make_node(
            "InplaceClipGradNorm", [gradients_name], [out], name=_name("InplaceClipGradNorm"),
            domain=_MS_DOMAIN, max_norm=self._max_norm))
        # As ORT: the output's type is float32, whatever the gradients'.
        self.base.graph.value_info.append(helper.make_tensor_sequence_value_info(out, TensorProto.FLOAT, None))
        return out

    def transform(self) -> optax.GradientTransformation:
        """The same clipping as an optax transform (float32, as ORT's kernel).

        Returns:
          A stateless ``GradientTransformation``.

        Example:
          >>> tx = ClipGradNorm(1.0).transform()
          >>> g = {"w": jnp.array([3.0, 4.0])}
          >>> clipped, _ = tx.update(g, tx.init(g))  # [0.6, 0.8] (up to the 1e-6)
        """
        max_norm = np.float32(self._max_norm)
        eps = np.float32(_CLIP_EPSILON)

        def init_fn(params):
            del params
            return optax.EmptyState()

        def update_fn(updates, state, params=None):
            del params
            leaves = jax.tree_util.tree_leaves(updates)
            total = jnp.sqrt(sum(jnp.sum(jnp.square(jnp.asarray(g, jnp.float32))) for g in leaves))
            coef = jnp.minimum(max_norm / (total + eps), jnp.float32(1.0))
            return jax.tree_util.tree_map(lambda g: (g * coef).astype(jnp.asarray(g).dtype), updates), state

        return optax.GradientTransformation(init_fn, update_fn)


class _OptimizerNode(Block):
    def _node(self, op_type: str, inputs: list, output_token: str, **attributes) -> str:
        _import(self.base, _MS_DOMAIN, 1)
        out = _name(output_token)
        self.base.graph.node.append(helper.make_node(
            op_type, inputs, [out], name=_name(op_type), domain=_MS_DOMAIN, **attributes))
        return out


class SGDOptimizer(_OptimizerNode):
    """One ``com.microsoft::SGDOptimizerV2`` node: ``w = w - lr * g``."""

    def build(self, learning_rate_name: str, params_name: str, gradients_name: str) -> str:
        """Appends the node; returns its bool output's name."""
        return self._node("SGDOptimizerV2", [learning_rate_name, params_name, gradients_name],
                          "update_completed")


class AdamWOptimizer(_OptimizerNode):
    """One ``com.microsoft::AdamWOptimizer`` node (``adam_mode`` 1, HuggingFace's AdamW)."""

    def __init__(self, bias_correction: bool = True, betas: tuple = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0):
        """Makes the block.

        Args:
          bias_correction: correct the moments' bias (``correct_bias``).
          betas: ``(beta1, beta2)`` (the ``alpha`` and ``beta`` attributes), each in [0, 1).
          eps: added to the denominator (``epsilon``), >= 0.
          weight_decay: decoupled weight decay, >= 0.

        Raises:
          TrainingError: a value out of range.
        """
        super().__init__()
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise TrainingError(f"AdamW betas must be a pair (beta1, beta2), got {betas!r}")
        self._attributes = {
            "alpha": _number(betas[0], "AdamW betas[0]", low=0.0, high=1.0),
            "beta": _number(betas[1], "AdamW betas[1]", low=0.0, high=1.0),
            "epsilon": _number(eps, "AdamW eps", low=0.0),
            "weight_decay": _number(weight_decay, "AdamW weight_decay", low=0.0),
            "correct_bias": 1 if bias_correction else 0,
            "adam_mode": 1,
        }

    @property
    def attributes(self) -> dict:
        """The node's attributes: alpha, beta, epsilon, weight_decay, correct_bias, adam_mode."""
        return dict(self._attributes)

    def build(self, learning_rate_name: str, step_name: str, parameter_sequence_name: str,
              gradient_sequence_name: str, first_order_moment_sequence_name: str,
              second_order_moment_sequence_name: str) -> str:
        """Appends the node; returns its bool output's name."""
        return self._node(
            "AdamWOptimizer",
            [learning_rate_name, step_name, parameter_sequence_name, gradient_sequence_name,
             first_order_moment_sequence_name, second_order_moment_sequence_name],
            "adamw.updated_flag", **self._attributes)


class _Optimizer(ForwardBlock):
    """An optimizer model: the inputs ORT's optimizer step feeds, the optional clip, the node."""

    def __init__(self, clip_grad: Optional[Block] = None):
        super().__init__()
        if clip_grad is not None and not isinstance(clip_grad, Block):
            raise TrainingError(f"clip_grad must be a block such as ClipGradNorm(max_norm), got {clip_grad!r}")
        self._clip_grad = clip_grad

    def build(self, parameters) -> str:
        """Builds the optimizer model for ``parameters`` (``(trainable, frozen)``); returns its output's name.

        Raises:
          TrainingError: no trainable parameter.
        """
        try:
            trainable, _ = parameters
            dtype = trainable[0].data_type
        except (TypeError, ValueError, IndexError, AttributeError):
            raise TrainingError(
                f"an optimizer model needs the parameters as (trainable, frozen) TensorProto lists with at "
                f"least one trainable parameter (TrainingBlock.parameters()), got {parameters!r}") from None
        g = self.base.graph
        g.input.extend([helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1]),
                        helper.make_tensor_value_info("step", TensorProto.INT64, [1])])
        for name in ("params", "gradients", "first_order_moments"):
            g.input.append(helper.make_tensor_sequence_value_info(name, dtype, None))
        gradients = "gradients" if self._clip_grad is None else self._clip_grad("gradients")
        out = self._update(gradients, dtype)
        g.output.append(helper.make_tensor_value_info(out, TensorProto.BOOL, [1]))
        return out

    def _update(self, gradients: str, dtype: int) -> str:
        raise NotImplementedError

    def _unclipped(self) -> OrtOptimizer:
        raise NotImplementedError

    def to_optimizer(self) -> OrtOptimizer:
        """The optimizer jaxort runs for the model this block builds (clipping included).

        Returns:
          An ``OrtOptimizer``, for ``jaxort.api.Optimizer`` or
          ``TrainProgram.from_artifacts`` in place of the optimizer model.

        Raises:
          TrainingError: a ``clip_grad`` other than :class:`ClipGradNorm`.
        """
        optimizer = self._unclipped()
        if self._clip_grad is None:
            return optimizer
        if not isinstance(self._clip_grad, ClipGradNorm):
            raise TrainingError(f"jaxort can run the clip_grad block ClipGradNorm only, not "
                                f"{type(self._clip_grad).__name__}")
        return OrtOptimizer(optimizer.optimizer_type, optimizer.hyperparameters,
                            optax.chain(self._clip_grad.transform(), optimizer.transform),
                            optimizer.moment_names)


class AdamW(_Optimizer):
    """ORT's AdamW optimizer model (``com.microsoft::AdamWOptimizer``, ``adam_mode`` 1).

    The defaults are ORT 1.19.2's onnxblock ones (``eps`` 1e-6, where
    PyTorch's is 1e-8).
    """

    def __init__(self, bias_correction: bool = True, betas: tuple = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, clip_grad: Optional[Block] = None):
        """Makes the block.

        Args:
          bias_correction, betas, eps, weight_decay: as for :class:`AdamWOptimizer`.
          clip_grad: a block applied to the gradients first, such as :class:`ClipGradNorm`.

        Raises:
          TrainingError: a value out of range, or a ``clip_grad`` that is not a block.
        """
        super().__init__(clip_grad)
        self._adamw = AdamWOptimizer(bias_correction=bias_correction, betas=betas, eps=eps,
                                     weight_decay=weight_decay)

    def _update(self, gradients: str, dtype: int) -> str:
        self.base.graph.input.append(helper.make_tensor_sequence_value_info("second_order_moments", dtype, None))
        return self._adamw("learning_rate", "step", "params", gradients, "first_order_moments",
                           "second_order_moments")

    def _unclipped(self) -> OrtOptimizer:
        return adamw_optimizer(**self._adamw.attributes)


class SGD(_Optimizer):
    """ORT's SGD optimizer model (``com.microsoft::SGDOptimizerV2``: no momentum, no weight decay)."""

    def __init__(self, clip_grad: Optional[Block] = None):
        """Makes the block.

        Args:
          clip_grad: a block applied to the gradients first, such as :class:`ClipGradNorm`.

        Raises:
          TrainingError: a ``clip_grad`` that is not a block.
        """
        super().__init__(clip_grad)
        self._sgd = SGDOptimizer()

    def _update(self, gradients: str, dtype: int) -> str:
        # ORT 1.19.2 feeds (learning_rate, params, gradients); step and
        # first_order_moments stay unused graph inputs.
        return self._sgd("learning_rate", "params", gradients)

    def _unclipped(self) -> OrtOptimizer:
        return sgd_optimizer()

