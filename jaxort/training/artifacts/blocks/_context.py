"""The model blocks build on: ``base`` and ``empty_base``, as in ORT's onnxblock.

ORT's blocks are called with value names only and find the model they change
through a process-wide global that its context managers set. jaxort keeps
those calls, with a ``contextvars.ContextVar`` in place of the global: the
open model belongs to one thread (or asyncio task), and it is closed when the
``with`` block ends, also on an error. As in ORT, one model is open at a time.

The context also numbers the names blocks draw (``onnx::<token>::<n>``).
ORT counts across the whole process; jaxort counts per context, from
``name_offset``, so a fresh context gives the names ORT gives in a fresh
process.

Part of the training layer; this module imports onnx and jaxort.errors only.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import os
from collections.abc import Iterator
from typing import Optional, Union

import onnx
from onnx import helper

from jaxort.errors import StateError, TrainingError

__all__ = ["ModelAccessor", "base", "custom_op_library", "empty_base"]

# ORT 1.19.2 reads models up to IR version 10 and default-domain opset 21.
_ORT_IR_VERSION = 10
_ORT_MAX_OPSET = 21

_OPEN: contextvars.ContextVar[Optional["ModelAccessor"]] = contextvars.ContextVar(
    "jaxort_onnxblock_base", default=None)


class ModelAccessor:
    """The model being built inside :func:`base` or :func:`empty_base`, as ORT's ``ModelAccessor``.

    Attributes:
      model: the ``onnx.ModelProto`` the blocks change (a copy of the one
        given to :func:`base`).
      path: the model path given to :func:`base`.
      has_path: whether a path was given.
      name_count: how many ``onnx::<token>::<n>`` names were drawn so far,
        counting from the context's ``name_offset`` (the ``n`` of the last one).
    """

    def __init__(self, model: onnx.ModelProto, path: Optional[str] = None, name_offset: int = 0):
        """Wraps ``model`` (not copied; :func:`base` copies it)."""
        self._model = model
        self._path = path
        self._count = int(name_offset)
        self._depth = 0

    @property
    def model(self) -> onnx.ModelProto:
        """The model the blocks change."""
        return self._model

    @property
    def path(self) -> str:
        """The path given to :func:`base`.

        Raises:
          StateError: no path was given.
        """
        if self._path is None:
            raise StateError("no model path was given to onnxblock.base(model, model_path)")
        return self._path

    @property
    def has_path(self) -> bool:
        """Whether :func:`base` was given a model path."""
        return self._path is not None

    @property
    def name_count(self) -> int:
        """The number of the last ``onnx::<token>::<n>`` name drawn (the offset if none was)."""
        return self._count

    def _name(self, token: str) -> str:
        self._count += 1
        return f"onnx::{token}::{self._count}"

    @contextlib.contextmanager
    def _building(self) -> Iterator[bool]:
        # Yields whether this is the outermost block call: only that one checks
        # the model (ORT checks after every block, nested ones too; the verdict
        # on the finished model is the same).
        outermost = self._depth == 0
        self._depth += 1
        try:
            yield outermost
        finally:
            self._depth -= 1


def current(what: str) -> ModelAccessor:
    """The open model, for a block called as ``what``.

    Raises:
      StateError: no :func:`base` or :func:`empty_base` context is open.
    """
    accessor = _OPEN.get()
    if accessor is None:
        raise StateError(
            f"{what} was called outside a base model context: build inside "
            "`with onnxblock.base(model):` (or `with onnxblock.empty_base():` for an optimizer graph)")
    return accessor


@contextlib.contextmanager
def _open(model: onnx.ModelProto, path: Optional[str], name_offset: int) -> Iterator[ModelAccessor]:
    if _OPEN.get() is not None:
        raise StateError("a base model is already open; onnxblock builds one model at a time "
                         "(ORT raises the same), so close it before opening another")
    if isinstance(name_offset, bool) or not isinstance(name_offset, int) or name_offset < 0:
        raise TrainingError(f"name_offset must be a non-negative int, got {name_offset!r}")
    accessor = ModelAccessor(model, path, name_offset)
    token = _OPEN.set(accessor)
    try:
        yield accessor
    finally:
        _OPEN.reset(token)


@contextlib.contextmanager
def base(model: onnx.ModelProto, model_path: Union[str, os.PathLike, None] = None, *,
         name_offset: int = 0) -> Iterator[ModelAccessor]:
    """Opens a copy of ``model`` for blocks to build on, as ORT's ``onnxblock.base``.

    Args:
      model: the base ``onnx.ModelProto`` (copied; the given one is unchanged).
      model_path: the model's path, kept for ORT's API (``accessor.path``);
        jaxort checks and infers shapes in memory.
      name_offset: the count that names drawn by blocks start after
        (jaxort only; ORT's count is process-wide).

    Yields:
      The :class:`ModelAccessor`; ``accessor.model`` is the model as built so far.

    Raises:
      StateError: a base model is already open.
      TrainingError: ``model`` is not an ``onnx.ModelProto``.

    Example:
      >>> with base(model) as accessor:  # doctest: +SKIP
      ...     loss = MyLoss()("output")
      >>> built = accessor.model  # doctest: +SKIP
    """
    if not isinstance(model, onnx.ModelProto):
        raise TrainingError(
            f"onnxblock.base needs an onnx.ModelProto, got {type(model).__name__}; use "
            "onnxblock.empty_base() to build a model from nothing")
    path = None if model_path is None else os.fspath(model_path)
    with _open(copy.deepcopy(model), path, name_offset) as accessor:
        yield accessor


def empty_model(opset_version: Optional[int] = None) -> onnx.ModelProto:
    """The empty model of :func:`empty_base`."""
    opset = _ORT_MAX_OPSET if opset_version is None else opset_version
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < 1:
        raise TrainingError(f"opset_version must be a positive int, got {opset_version!r}")
    model = onnx.ModelProto()
    main = helper.make_opsetid("", opset)
    # ORT writes onnx.IR_VERSION of the onnx it runs with (10 for 1.19.2's);
    # jaxort writes the oldest that covers the opset, at least 10, so ORT 1.19.2 reads it.
    model.ir_version = max(_ORT_IR_VERSION, helper.find_min_ir_version_for([main], ignore_unknown=True))
    model.producer_name = "orttraining"
    model.graph.name = "graph"
    model.opset_import.extend((helper.make_opsetid("com.microsoft", 1), main))
    return model


@contextlib.contextmanager
def empty_base(opset_version: Optional[int] = None, *, name_offset: int = 0) -> Iterator[ModelAccessor]:
    """Opens an empty model for blocks to build on (an optimizer graph), as ORT's ``onnxblock.empty_base``.

    The model imports the default domain at ``opset_version`` and
    com.microsoft at 1, with producer "orttraining", as ORT's.

    Args:
      opset_version: the default-domain opset. Default 21, the newest ONNX
        Runtime 1.19.2 reads (ORT's default is the newest of the installed onnx).
      name_offset: as for :func:`base`.

    Yields:
      The :class:`ModelAccessor`.

    Raises:
      StateError: a base model is already open.
      TrainingError: a bad ``opset_version``.
    """
    with _open(empty_model(opset_version), None, name_offset) as accessor:
        yield accessor


@contextlib.contextmanager
def custom_op_library(custom_op_library_path: Union[str, os.PathLike]) -> Iterator[None]:
    """ORT's ``onnxblock.custom_op_library``; refused, as jaxort runs no ORT kernels.

    Raises:
      TrainingError: always, naming the library.
    """
    raise TrainingError(
        f"custom op library {os.fspath(custom_op_library_path)!r}: jaxort runs no ONNX Runtime kernels, "
        "so it cannot load one (ops jaxort lacks are jaxort.graph ops to add)")
    yield  # pragma: no cover  (a generator, for contextmanager)
