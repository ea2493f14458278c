"""The value lattice and what an op handler may ask of the graph layer.

A value flowing through a traced graph is either *static* (a numpy array known
at trace time: initializers kept as constants, Constant nodes, shape
arithmetic) or *traced* (a JAX array or tracer). Handlers that need a value at
trace time (a Reshape target, Slice bounds, a TopK k) get it through
:func:`static`, which raises an error naming the node when it is traced.

Errors raised here (and any :class:`~jaxort.errors.OpError` raised by a
handler) do not name the node themselves: the dispatcher prefixes the node's
description ("ai.onnx::Reshape (opset 14), node 'r1'") to every OpError that
leaves a handler.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxort.errors import OpError, StaticValueError

__all__ = ["is_static", "static", "static_ints", "OpContext"]


def is_static(x: Any) -> bool:
    """True for values known at trace time (numpy arrays and scalars, None)."""
    return x is None or isinstance(x, (np.ndarray, np.generic, int, float, bool))


def static(x: Any, what: str = "input") -> np.ndarray:
    """Returns ``x`` as a numpy array, or raises if it is only known at run time.

    Args:
      x: a value given to an op handler.
      what: what the value is, for the error ("input 'shape'").

    Raises:
      StaticValueError: when ``x`` is a traced JAX value (the dispatcher adds
        the node's name).
    """
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (np.generic, int, float, bool)):
        return np.asarray(x)
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        return np.asarray(x)
    raise StaticValueError(
        f"{what} must be known at trace time (a constant or "
        "computed from shapes), but it depends on a runtime value; jaxort cannot "
        "compile data-dependent shapes"
    )


def static_ints(x: Any, what: str = "input") -> list[int]:
    """Returns a static 0-d or 1-d integer value as a list of Python ints."""
    return [int(v) for v in np.asarray(static(x, what)).reshape(-1)]


class NodeKey:
    """The PRNG key of one node, folded from the caller's key only when a node asks for it.

    A node's key is ``fold_in`` of the caller's key with the index of each
    enclosing node (a function body's caller, then the node). Folding on
    demand keeps traces of graphs without random ops free of key arithmetic,
    and ``uses`` (shared by every key of one trace) records whether any node
    drew one, so a caller can leave its key unsplit when none did.
    """

    __slots__ = ("_root", "_path", "uses")

    def __init__(self, root: Any, path: tuple = (), uses: list | None = None):
        self._root = root
        self._path = path
        self.uses = [] if uses is None else uses

    def child(self, index: int) -> "NodeKey":
        """The key of the node at ``index`` under this one."""
        return NodeKey(self._root, self._path + (int(index),), self.uses)

    def get(self) -> jax.Array:
        """The key array; records the use."""
        self.uses.append(self._path)
        key = self._root
        for index in self._path:
            key = jax.random.fold_in(key, index)
        return key


@dataclasses.dataclass
class OpContext:
    """What a handler that declares a keyword-only ``ctx`` parameter receives.

    Attributes:
      node_name: the node's name.
      opset: the opset version the node was dispatched at.
      training: True inside a training step (BatchNormalization in inference
        form uses batch statistics, Dropout with a training_mode input is random).
      input_names: the node's input names ("" for absent optional inputs).
      output_names: the node's output names.
    """

    node_name: str
    opset: int
    training: bool
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    _key: Any = None
    _updates: dict | None = None

    @property
    def has_rng(self) -> bool:
        """True when the caller gave a PRNG key (``apply(..., rng=key)``)."""
        return self._key is not None

    def rng(self) -> jax.Array:
        """Returns a PRNG key for this node.

        Raises:
          OpError: when the caller gave no ``rng`` key to the traced function
            (the dispatcher adds the node's name).
        """
        if self._key is None:
            raise OpError(
                "the node is random in this mode and needs a PRNG key: "
                "pass rng=jax.random.key(seed) to apply"
            )
        return self._key.get() if isinstance(self._key, NodeKey) else self._key

    def update_state(self, input_index: int, value: Any) -> None:
        """Records a new value for the parameter feeding input ``input_index``.

        Used by training-mode BatchNormalization to write running statistics
        back into the state; ignored when that input is not a parameter.
        """
        if self._updates is not None and input_index < len(self.input_names):
            name = self.input_names[input_index]
            if name:
                self._updates[name] = value
