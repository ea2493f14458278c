"""Hypothesis strategies for checkpoint states and training artifacts.

:func:`checkpoint_states` draws :class:`jaxort.checkpoint.Checkpoint` values
(trainable and frozen tensors of every dtype the format stores, optimizer
groups with momentums, properties) for :func:`assert_checkpoint_roundtrip`;
:func:`training_artifacts` draws a small model and the arguments of
``generate_artifacts`` with batches to train on, for
:func:`assert_trains_like`.

Imports hypothesis, numpy and onnx; the checkpoint package (numpy only) and
the training layer load when a value is made.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import ml_dtypes
import numpy as np
import onnx

from jaxort.testing.strategies import arrays, mlp_models, st

__all__ = ["TrainingCase", "checkpoint_states", "training_artifacts"]

# What a checkpoint tensor may hold (strings included, as ORT stores them).
_TENSOR_DTYPES = tuple(np.dtype(t) for t in (
    np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.int16, np.int32,
    np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_))

_names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)


@st.composite
def _tensor(draw, dtype=None):
    dt = draw(st.sampled_from(_TENSOR_DTYPES)) if dtype is None else np.dtype(dtype)
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    return draw(arrays(dt, shape))


@st.composite
def checkpoint_states(draw, *, max_parameters: int = 4, optimizer: Optional[bool] = None,
                      properties: bool = True):
    """Random :class:`jaxort.checkpoint.Checkpoint` values.

    Args:
      max_parameters: most trainable and most frozen tensors.
      optimizer: draw an optimizer group ``group0`` with AdamW-style
        ``momentum0``/``momentum1`` (or SGD-style ``momentum0``) per float32
        trainable parameter: True always, False never, None either.
      properties: draw int, float and str properties.

    Returns:
      A strategy of ``Checkpoint``; trainable tensors are float32 (as ORT
      trains them), frozen ones any dtype, names unique across both.
    """
    from jaxort.checkpoint import Checkpoint, OptimizerGroup

    names = draw(st.lists(_names, min_size=0, max_size=2 * max_parameters, unique=True))
    split = draw(st.integers(0, min(len(names), max_parameters)))
    trainable = {n: draw(_tensor(np.float32)) for n in names[:split]}
    frozen = {n: draw(_tensor()) for n in names[split:][:max_parameters]}
    groups = ()
    if trainable and (draw(st.booleans()) if optimizer is None else optimizer):
        moments = ["momentum0", "momentum1"] if draw(st.booleans()) else ["momentum0"]
        states = {p: {m: draw(arrays(np.float32, v.shape)) for m in moments}
                  for p, v in trainable.items()}
        lr = draw(st.floats(2.0 ** -20, 1.0, width=32))
        groups = (OptimizerGroup("group0", draw(st.integers(0, 2 ** 31 - 2)), lr, states),)
    props = {}
    if properties:
        props = draw(st.dictionaries(_names, st.one_of(
            st.integers(-2 ** 63, 2 ** 63 - 1), st.floats(width=32, allow_nan=False),
            st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10)),
            max_size=3))
    return Checkpoint(trainable=trainable, frozen=frozen, optimizer_groups=groups, properties=props)


@dataclasses.dataclass(frozen=True, eq=False)
class TrainingCase:
    """A forward model, the ``generate_artifacts`` arguments for it and batches to train on.

    Attributes:
      model: the forward ``onnx.ModelProto``.
      arguments: keyword arguments of ``generate_artifacts`` (``loss``,
        ``optimizer``, ``requires_grad``, ``frozen_params``).
      batches: ``(inputs, labels)`` pairs of tuples of arrays, one per step.
      learning_rate: the optimizer's learning rate.
    """

    model: onnx.ModelProto
    arguments: dict
    batches: tuple
    learning_rate: float

    def generate(self, directory: "os.PathLike") -> Any:
        """Writes the artifacts with jaxort's ``generate_artifacts``; returns its ``Artifacts``."""
        from jaxort.training.artifacts import generate_artifacts

        return generate_artifacts(self.model, artifact_directory=directory, **self.arguments)

    def __repr__(self) -> str:
        ops = [n.op_type for n in self.model.graph.node]
        args = {k: getattr(v, "name", v) for k, v in self.arguments.items()}
        return f"TrainingCase(ops={ops}, arguments={args}, steps={len(self.batches)})"


@st.composite
def training_artifacts(draw, *, steps: int = 3, losses=None, optimizers=None):
    """Random MLPs with a loss, an optimizer and batches: a :class:`TrainingCase`.

    Args:
      steps: how many batches.
      losses: ``LossType`` values to draw from; default MSELoss, L1Loss and
        CrossEntropyLoss.
      optimizers: ``OptimType`` values; default AdamW and SGD.

    Returns:
      A strategy of :class:`TrainingCase`; some weights may be frozen.
    """
    from jaxort.training.artifacts import LossType, OptimType

    case = draw(mlp_models(n_layers=(1, 2), widths=(2, 5), batch=(2, 3), dynamic_batch=False,
                           activations=("Relu", "Tanh", "Sigmoid"), opset=17))
    model = case.model
    loss = draw(st.sampled_from(losses or [LossType.MSELoss, LossType.L1Loss,
                                           LossType.CrossEntropyLoss]))
    optimizer = draw(st.sampled_from(optimizers or [OptimType.AdamW, OptimType.SGD]))
    weights = [t.name for t in model.graph.initializer]
    frozen = [w for w in weights[1:] if draw(st.booleans())]
    batch, width = case.inputs[0].shape
    out_width = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    batches = []
    for _ in range(steps):
        x = draw(arrays(np.float32, (batch, width), min_value=-1, max_value=1))
        if loss == LossType.CrossEntropyLoss:
            y = draw(arrays(np.int64, (batch,), min_value=0, max_value=out_width - 1))
        else:
            y = draw(arrays(np.float32, (batch, out_width), min_value=-1, max_value=1))
        batches.append(((x,), (y,)))
    arguments = {"loss": loss, "optimizer": optimizer,
                 "requires_grad": [w for w in weights if w not in frozen],
                 "frozen_params": frozen}
    return TrainingCase(model, arguments, tuple(batches),
                        draw(st.sampled_from([0.01, 0.1])))
