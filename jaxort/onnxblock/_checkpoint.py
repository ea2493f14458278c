"""save_checkpoint and load_checkpoint_to_model, as ORT's ``onnxblock`` has them.

Both go through :mod:`jaxort.checkpoint` (ORT's flatbuffer checkpoint format).
Part of the training layer; imports the checkpoint layer only.
"""

from __future__ import annotations

import os
from typing import Union

import onnx

from jaxort import checkpoint as _ckpt
from jaxort.errors import CheckpointError

__all__ = ["load_checkpoint_to_model", "save_checkpoint"]


def save_checkpoint(parameters: tuple, path_to_checkpoint: Union[str, os.PathLike],
                    nominal_checkpoint: bool = False) -> None:
    """Writes parameters as an ORT checkpoint, as ORT's ``onnxblock.save_checkpoint``.

    For the same protos the file is byte for byte ORT's, except that a
    nominal checkpoint keeps each tensor's dims (ORT 1.19.2 writes none).

    Args:
      parameters: ``(trainable, frozen)`` lists of onnx TensorProtos, as
        :meth:`jaxort.onnxblock.TrainingBlock.parameters` returns them.
      path_to_checkpoint: the file to write.
      nominal_checkpoint: write names, shapes and types without data.

    Raises:
      CheckpointError: ``parameters`` is not such a pair, or the file cannot
        be written.
    """
    if not isinstance(parameters, (tuple, list)) or len(parameters) != 2:
        raise CheckpointError(
            f"save_checkpoint needs parameters as (trainable, frozen) TensorProto lists, got {parameters!r}")
    trainable, frozen = parameters
    _ckpt.save_tensors(list(trainable), list(frozen), path_to_checkpoint, nominal=nominal_checkpoint)


def load_checkpoint_to_model(path_to_checkpoint: Union[str, os.PathLike], model: onnx.ModelProto) -> None:
    """Puts a checkpoint's parameters into the model's initializers, in place, as ORT's ``load_checkpoint_to_model``.

    Every initializer named like a checkpoint parameter takes its value;
    others are kept.

    Args:
      path_to_checkpoint: the checkpoint file.
      model: the ``onnx.ModelProto`` to change.

    Raises:
      CheckpointError: ``model`` is not a ModelProto, or the checkpoint cannot
        be read or is nominal.
    """
    model.CopyFrom(_ckpt.load_to_model(path_to_checkpoint, model))
