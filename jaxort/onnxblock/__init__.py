"""Build training artifacts from blocks: a drop-in for ``onnxruntime.training.onnxblock``.

Custom losses and optimizers written for ORT's onnxblock port by changing the
import::

    from jaxort import onnxblock
    from jaxort.training import artifacts

    class WeightedLoss(onnxblock.Block):
        def __init__(self):
            super().__init__()
            self.mse, self.ce = onnxblock.loss.MSELoss(), onnxblock.loss.CrossEntropyLoss()
            self.add, self.mul, self.w = onnxblock.blocks.Add(), onnxblock.blocks.Mul(), onnxblock.blocks.Constant(0.5)

        def build(self, regression, scores):
            return self.add(self.mse(regression), self.mul(self.w(), self.ce(scores)))

    artifacts.generate_artifacts(model, requires_grad=[...], loss=WeightedLoss(),
                                 optimizer=onnxblock.optim.AdamW(weight_decay=0.01))

What is here, with ORT 1.19.2's names, arguments and defaults:

- :class:`Block` (and :mod:`~jaxort.onnxblock.blocks`: Add, Sub, Mul, Div, Pow,
  Neg, Abs, Log, Sigmoid, ReduceMean, ReduceSum, ReduceAllL2, Constant, Clip,
  Cast, Linear, InputLike, PassThrough, SequenceConstruct, LabelEncoder),
  :class:`ForwardBlock`, :class:`TrainingBlock`;
- :mod:`~jaxort.onnxblock.loss`: MSELoss, CrossEntropyLoss, BCEWithLogitsLoss, L1Loss;
- :mod:`~jaxort.onnxblock.optim`: AdamW, SGD, ClipGradNorm (and the node
  blocks AdamWOptimizer, SGDOptimizer);
- the contexts :func:`base` and :func:`empty_base`, and
  :func:`save_checkpoint` / :func:`load_checkpoint_to_model`.

Blocks make the nodes and names ORT's make. The gradient graph is jaxort's
(:mod:`jaxort.training.artifacts.gradient`, which ORT trains as it
trains its own); errors are jaxort's: :class:`jaxort.errors.StateError` (a
RuntimeError, as ORT raises) for calls out of order, such as a block called
outside a base context, and :class:`jaxort.errors.TrainingError` for bad
arguments. See docs/onnxblock.md.

The blocks are defined in :mod:`jaxort.training.artifacts.blocks`, below
:func:`~jaxort.training.artifacts.generate_artifacts`, which builds its
losses and optimizer models with them; this package is ORT's layout of them.

Part of the training layer: imports the artifact generator's blocks and the
checkpoint layer, never the facades.
"""

from jaxort.onnxblock import blocks, loss, optim
from jaxort.onnxblock._checkpoint import load_checkpoint_to_model, save_checkpoint
from jaxort.training.artifacts.blocks import (
    Block,
    ForwardBlock,
    ModelAccessor,
    TrainingBlock,
    base,
    custom_op_library,
    empty_base,
)

__all__ = [
    "Block",
    "ForwardBlock",
    "ModelAccessor",
    "TrainingBlock",
    "base",
    "blocks",
    "custom_op_library",
    "empty_base",
    "load_checkpoint_to_model",
    "loss",
    "optim",
    "save_checkpoint",
]
