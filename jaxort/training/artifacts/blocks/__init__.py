"""The blocks of ``jaxort.onnxblock``, where :func:`~jaxort.training.artifacts.generate_artifacts` can use them.

``generate_artifacts`` builds its ``LossType`` losses and ``OptimType``
optimizer models with these blocks, and takes a user's block as ``loss`` or
``optimizer``; so they live below it, in the training layer's artifacts
package. Users import them from :mod:`jaxort.onnxblock`, in ORT's module
layout (``blocks``, ``loss``, ``optim``).

- :class:`Block` and :func:`output_names` (``_base``), the contexts
  :func:`base` and :func:`empty_base` (``_context``), :class:`ForwardBlock`
  and :class:`TrainingBlock` (``_training``);
- :mod:`~jaxort.training.artifacts.blocks.ops`: the op blocks (ORT's
  ``onnxblock.blocks``);
- :mod:`~jaxort.training.artifacts.blocks.loss` and
  :mod:`~jaxort.training.artifacts.blocks.optim`: ORT's loss and optimizer
  blocks.

The modules import each other by module, never through this package, so
that none of them imports a module that imports it.

Part of the training layer: imports the graph layer, the artifacts' assembly
and jaxort.training.optimizers, never the facades.
"""

from jaxort.training.artifacts.blocks import loss, ops, optim
from jaxort.training.artifacts.blocks._base import Block, output_names
from jaxort.training.artifacts.blocks._context import ModelAccessor, base, custom_op_library, empty_base
from jaxort.training.artifacts.blocks._training import ForwardBlock, TrainingBlock

__all__ = ["Block", "ForwardBlock", "ModelAccessor", "TrainingBlock", "base", "custom_op_library", "empty_base",
           "loss", "ops", "optim", "output_names"]
