"""summary(): the text `jaxort inspect-checkpoint` prints for a checkpoint.

Imports numpy only (through the checkpoint modules); never JAX or onnx.
"""

from __future__ import annotations

import os
from typing import Union

import numpy as np

from jaxort.dtypes import onnx_type_name, to_onnx_type
from jaxort.errors import CheckpointError

from ._api import load
from ._format import check_path, external_data_path
from ._state import Checkpoint, NominalTensor

__all__ = ["summary"]


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _nbytes(value) -> int:
    if isinstance(value, NominalTensor):
        return 0
    if value.dtype == np.dtype(object):
        return sum(len(s.encode("utf-8") if isinstance(s, str) else s) for s in value.reshape(-1).tolist())
    return int(value.nbytes)


def _float32(value: float) -> str:
    # Shortest text that reads back as the same float32 (the stored type).
    return str(np.float32(value))


def _dtype_name(dtype: np.dtype) -> str:
    return "string" if dtype == np.dtype(object) else str(dtype)


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def summary(state_or_path: Union[Checkpoint, str, os.PathLike]) -> str:
    """Describes a checkpoint: parameters, optimizer groups, properties, sizes.

    Args:
      state_or_path: a Checkpoint, or the path of a checkpoint file.

    Returns:
      Multi-line text (no trailing newline).

    Raises:
      CheckpointError: neither a Checkpoint nor a path, or a path that does
        not hold a valid checkpoint.

    Example:
      >>> import numpy as np
      >>> s = Checkpoint(trainable={"w": np.zeros((2, 3), np.float32)})
      >>> print(summary(s).splitlines()[0])
      checkpoint: 1 parameter (1 trainable, 0 frozen), 6 elements, 24 B of parameter data
    """
    lines: list[str] = []
    if isinstance(state_or_path, Checkpoint):
        state = state_or_path
    else:
        if not isinstance(state_or_path, (str, os.PathLike)):
            raise CheckpointError(
                "summary() needs a Checkpoint or a checkpoint path (str or os.PathLike), "
                f"got {type(state_or_path).__name__}"
            )
        path = check_path(state_or_path)
        state = load(path, mmap=True)
        lines.append(f"file: {path} ({_size(os.path.getsize(path))})")
        if state.has_external_data:
            ext = external_data_path(path)
            lines.append(f"external data: {ext} ({_size(os.path.getsize(ext))})")

    params = [(n, "trainable", v) for n, v in state.trainable.items()]
    params += [(n, "frozen", v) for n, v in state.frozen.items()]
    elements = sum(int(np.prod(v.shape, dtype=object)) for _, _, v in params)
    param_bytes = sum(_nbytes(v) for _, _, v in params)
    noun = "parameter" if len(params) == 1 else "parameters"
    head = (
        f"checkpoint: {len(params)} {noun} ({len(state.trainable)} trainable, {len(state.frozen)} frozen), "
        f"{elements} elements, {_size(param_bytes)} of parameter data"
    )
    lines.append(head)
    flags = []
    if state.is_nominal:
        flags.append("nominal (names, shapes and types only)")
    if state.has_external_data:
        flags.append("external data")
    if flags:
        lines.append("flags: " + ", ".join(flags))
    if params:
        rows = [
            (
                n,
                role,
                str(list(v.shape)),
                f"{_dtype_name(v.dtype)} ({onnx_type_name(to_onnx_type(v.dtype))})",
                "-" if isinstance(v, NominalTensor) else str(_nbytes(v)),
            )
            for n, role, v in params
        ]
        lines += _table(rows, ("name", "role", "shape", "dtype", "bytes"), {4})

    lines.append(f"optimizer groups: {len(state.optimizer_groups)}")
    for g in state.optimizer_groups:
        moments = sorted({m for ms in g.states.values() for m in ms})
        nbytes = sum(_nbytes(a) for ms in g.states.values() for a in ms.values())
        lines.append(
            f"  {g.name}: step {g.step}, initial learning rate {_float32(g.initial_learning_rate)}, "
            f"{len(g.states)} parameters, states {', '.join(moments) or '-'} ({_size(nbytes)})"
        )

    lines.append(f"properties: {len(state.properties)}")
    for name, value in state.properties.items():
        kind = "int" if isinstance(value, int) else "float" if isinstance(value, float) else "str"
        shown = _float32(value) if kind == "float" else repr(value) if kind == "str" else str(value)
        lines.append(f"  {name} ({kind}) = {shown}")
    return "\n".join(lines)
