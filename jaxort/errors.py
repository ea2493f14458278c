"""The jaxort exception hierarchy.

Every error jaxort raises on purpose derives from :class:`JaxortError`. Where a
built-in exception has the same meaning (a bad value, an unsupported feature, a
missing name), the jaxort class derives from it too, so ``except ValueError``
keeps working for callers who do not know jaxort.

This module is at the bottom of the layers: it imports nothing from jaxort and
nothing but the standard library.
"""

from __future__ import annotations

__all__ = [
    "JaxortError",
    "ModelError",
    "UnsupportedOpError",
    "OpError",
    "StaticValueError",
    "InputError",
    "ArgumentTypeError",
    "UnknownNameError",
    "CheckpointError",
    "TrainingError",
    "StateError",
    "NoGradientGraphWarning",
]


class JaxortError(Exception):
    """Base class of every error jaxort raises on purpose."""


class ModelError(JaxortError, ValueError):
    """An ONNX model is invalid or cannot be traced (checker message, bad graph)."""


class UnsupportedOpError(JaxortError, NotImplementedError):
    """An ONNX operator (domain, type, opset) has no jaxort implementation."""

    def __init__(self, op_type: str, domain: str, opset: int, node_name: str = ""):
        self.op_type = op_type
        self.domain = domain or "ai.onnx"
        self.opset = opset
        self.node_name = node_name
        super().__init__(
            f"jaxort does not implement {self.domain}::{op_type} (opset {opset}), "
            f"used by node {node_name!r}"
        )


class OpError(JaxortError, ValueError):
    """An operator failed on its inputs or attributes; names the node."""


class StaticValueError(OpError):
    """An op needs a value at trace time (a shape, axes) but it is only known at run time."""


class InputError(JaxortError, ValueError):
    """A user input is missing, unknown, or has the wrong shape or dtype."""


class ArgumentTypeError(InputError, TypeError):
    """An argument of the wrong type (a facade given None for a state, a number for a path)."""


class UnknownNameError(InputError, KeyError):
    """A parameter or property name the state does not have.

    It is a ``KeyError`` too, as in ``onnxruntime.training.api``.
    """

    def __str__(self) -> str:
        # KeyError quotes its message; this is a sentence.
        return str(self.args[0]) if self.args else ""


class CheckpointError(JaxortError, ValueError):
    """A checkpoint file is malformed, unsupported, or cannot be written."""


class TrainingError(JaxortError, ValueError):
    """Training artifacts or a training configuration are invalid."""


class StateError(JaxortError, RuntimeError):
    """A session call was made out of order (e.g. optimizer step before any train step)."""


class NoGradientGraphWarning(UserWarning):
    """Training artifacts were written without the gradient graph ONNX Runtime trains with.

    jaxort trains such artifacts (it differentiates the forward graph itself);
    ONNX Runtime refuses to load their training model.

    Attributes:
      reason: why the gradient graph could not be written (the TrainingError
        ``gradient_graph=True`` raises, naming the node).
    """

    def __init__(self, reason: str):
        super().__init__(
            f"wrote the training model without a gradient graph: {reason}. jaxort trains these artifacts; "
            "ONNX Runtime refuses to load their training model. gradient_graph=True makes this an error, "
            "gradient_graph=False skips the gradient graph without this warning")
        self.reason = reason
