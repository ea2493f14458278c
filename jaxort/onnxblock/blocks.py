"""Building blocks: :class:`Block` and the ops of ORT's ``onnxblock.blocks``.

Call a block inside :func:`jaxort.onnxblock.base` with value names; it
appends its nodes and returns the names of what it made, with the names ORT
1.19.2 draws. Defined in :mod:`jaxort.training.artifacts.blocks`, where
``generate_artifacts`` builds with them; this module is ORT's layout of them.

Part of the training layer: it imports jaxort.training.artifacts.blocks only.
"""

from jaxort.training.artifacts.blocks import Block
from jaxort.training.artifacts.blocks.ops import (
    Abs,
    Add,
    Cast,
    Clip,
    Constant,
    Div,
    InputLike,
    LabelEncoder,
    Linear,
    Log,
    Mul,
    Neg,
    PassThrough,
    Pow,
    ReduceAllL2,
    ReduceMean,
    ReduceSum,
    SequenceConstruct,
    Sigmoid,
    Sub,
)

__all__ = ["Abs", "Add", "Block", "Cast", "Clip", "Constant", "Div", "InputLike", "LabelEncoder", "Linear", "Log",
           "Mul", "Neg", "PassThrough", "Pow", "ReduceAllL2", "ReduceMean", "ReduceSum", "SequenceConstruct",
           "Sigmoid", "Sub"]
