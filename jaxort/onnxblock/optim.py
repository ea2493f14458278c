"""Optimizer blocks, as ORT's ``onnxblock.optim``: AdamW, SGD and ClipGradNorm.

Called with the parameters inside :func:`jaxort.onnxblock.empty_base`,
:class:`AdamW` and :class:`SGD` build ORT's ``optimizer_model.onnx``; their
``to_optimizer()`` is the optimizer jaxort runs for it. Defined in
:mod:`jaxort.training.artifacts.blocks.optim`, which describes the models
they build.

Part of the training layer: it imports jaxort.training.artifacts.blocks only.
"""

from jaxort.training.artifacts.blocks.optim import (
    AdamW,
    AdamWOptimizer,
    ClipGradNorm,
    SGD,
    SGDOptimizer,
)

__all__ = [
    "AdamW",
    "AdamWOptimizer",
    "ClipGradNorm",
    "SGD",
    "SGDOptimizer",
]
