"""Loss blocks, as ORT's ``onnxblock.loss``: MSELoss, CrossEntropyLoss, BCEWithLogitsLoss, L1Loss.

Each adds its label input when the model has no value of that name yet and
returns the loss value's name, with ORT 1.19.2's nodes and names. Defined in
:mod:`jaxort.training.artifacts.blocks.loss`, which also says where they
depart from ORT's (``reduction="none"``, class weights of any length).

Part of the training layer: it imports jaxort.training.artifacts.blocks only.
"""

from jaxort.training.artifacts.blocks.loss import (
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    L1Loss,
    MSELoss,
)

__all__ = [
    "BCEWithLogitsLoss",
    "CrossEntropyLoss",
    "L1Loss",
    "MSELoss",
]
