"""What ``jaxort inspect`` reports: a checkpoint, an ONNX model or an artifact directory.

:func:`describe` returns plain JSON-ready data; :func:`render` turns it into
the tables the command prints. For a model, each op type is listed with its
domain, node count, the opset it is read at, and its status in jaxort:
``supported`` (a registered handler at that opset, :func:`jaxort.graph.lookup`),
``missing``, or, for the gradient part of an ONNX Runtime training model,
``not run`` (jaxort differentiates the forward-and-loss slice itself and
never executes those nodes).

A facade module: it imports the layers below; only the command line imports it.
"""

from __future__ import annotations

import collections
import os
import pathlib
from typing import Union

import numpy as np

__all__ = ["describe", "render"]

PathLike = Union[str, os.PathLike]

_CHECKPOINT_ID = b"ODTC"


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _checkpoint_info(path: pathlib.Path) -> dict:
    from jaxort import checkpoint

    ckpt = checkpoint.load(path)
    params = []
    for trainable, group in ((True, ckpt.trainable), (False, ckpt.frozen)):
        for name, tensor in group.items():
            shape = [int(d) for d in tensor.shape]
            dtype = np.dtype(tensor.dtype)
            params.append({"name": name, "dtype": dtype.name, "shape": shape, "trainable": trainable,
                           "bytes": int(np.prod(shape, dtype=np.int64)) * dtype.itemsize})
    groups = []
    for group in ckpt.optimizer_groups:
        states = {p: sorted(s) for p, s in group.states.items()}
        groups.append({"name": group.name, "step": int(group.step),
                       "learning_rate": float(group.initial_learning_rate), "states": states,
                       "bytes": int(sum(np.asarray(a).nbytes for s in group.states.values() for a in s.values()))})
    return {"kind": "checkpoint", "path": str(path), "file_bytes": path.stat().st_size,
            "nominal": bool(ckpt.is_nominal), "parameters": params,
            "parameter_bytes": sum(p["bytes"] for p in params), "optimizer_groups": groups,
            "properties": dict(ckpt.properties)}


def _value_info(vi) -> dict:
    from jaxort.graph import numpy_dtype

    tt = vi.type.tensor_type
    dtype = numpy_dtype(tt.elem_type).name if tt.elem_type else "?"
    shape = [d.dim_param or (int(d.dim_value) if d.HasField("dim_value") else "?") for d in tt.shape.dim]
    return {"name": vi.name, "dtype": dtype, "shape": shape}


def _forward_nodes(model):
    """Indexes of the nodes jaxort runs in an ORT training model (None for other models)."""
    from jaxort.training import describe_training_model, slice_model
    from jaxort.training.artifacts.read import GRAD_BUFFER_SUFFIX

    if not any(i.name.endswith(GRAD_BUFFER_SUFFIX) for i in model.graph.input):
        return None
    try:
        info = describe_training_model(model)
        sliced = slice_model(model, info.output_names, keep_inputs=info.input_names)
    except Exception:  # noqa: BLE001  a model we cannot slice: report every node
        return None
    kept = collections.Counter((n.domain, n.op_type, tuple(n.output)) for n in sliced.graph.node)
    return {i for i, n in enumerate(model.graph.node) if kept[(n.domain, n.op_type, tuple(n.output))]}


def _optimizer_ops(model) -> set:
    """The op types of an optimizer model that the training layer reads as an optax optimizer."""
    from jaxort.training import optimizer_from_model

    try:
        optimizer_from_model(model)
    except Exception:  # noqa: BLE001  not an optimizer model jaxort reads
        return set()
    return {n.op_type for n in model.graph.node}


def _model_info(path: pathlib.Path) -> dict:
    import jaxort.graph.ops  # noqa: F401  (fills the registry)
    from jaxort.graph import load_model, lookup, normalize_domain, numpy_dtype
    from jaxort.training.artifacts.read import GRAD_BUFFER_SUFFIX

    model = load_model(path, check=False)
    forward = _forward_nodes(model)
    optimizer_ops = _optimizer_ops(model)
    read = {name for i, n in enumerate(model.graph.node) if forward is None or i in forward for name in n.input}
    opsets = {normalize_domain(o.domain): int(o.version) for o in model.opset_import}
    inputs = [_value_info(i) for i in model.graph.input]
    grad_buffers = {i.name[:-len(GRAD_BUFFER_SUFFIX)] for i in model.graph.input
                    if i.name.endswith(GRAD_BUFFER_SUFFIX)}
    params = []
    for t in model.graph.initializer:
        if t.name not in read:  # constants of the gradient part of a training model
            continue
        dtype = numpy_dtype(t.data_type)
        shape = [int(d) for d in t.dims]
        params.append({"name": t.name, "dtype": dtype.name, "shape": shape,
                       "trainable": None, "bytes": int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize})
    for vi in inputs:
        if vi["name"] in grad_buffers:
            params.append({**vi, "trainable": True, "bytes": None})
    counts: dict = {}
    for i, node in enumerate(model.graph.node):
        domain = normalize_domain(node.domain)
        opset = opsets.get(domain, 1)
        if forward is not None and i not in forward:
            status = "not run"
        else:
            known = lookup(domain, node.op_type, opset) is not None or node.op_type in optimizer_ops
            status = "supported" if known else "missing"
        key = (domain, node.op_type, status)
        if key not in counts:
            counts[key] = {"domain": domain or "ai.onnx", "op_type": node.op_type, "opset": opset,
                           "nodes": 0, "status": status}
        counts[key]["nodes"] += 1
    ops = sorted(counts.values(), key=lambda o: (o["status"] != "missing", o["domain"], o["op_type"], o["status"]))
    return {"kind": "model", "path": str(path), "file_bytes": path.stat().st_size,
            "ir_version": int(model.ir_version), "opsets": {k or "ai.onnx": v for k, v in opsets.items()},
            "inputs": [vi for vi in inputs if vi["name"] not in {p["name"] for p in params}
                       and not vi["name"].endswith(GRAD_BUFFER_SUFFIX)],
            "outputs": [_value_info(o) for o in model.graph.output], "parameters": params,
            "parameter_bytes": sum(p["bytes"] or 0 for p in params), "nodes": len(model.graph.node),
            "ops": ops, "missing_ops": sorted({f"{o['domain']}::{o['op_type']}" for o in ops
                                               if o["status"] == "missing"})}


def describe(path: PathLike) -> dict:
    """Describes a checkpoint file, an ONNX model file or an artifact directory.

    Args:
      path: the file or directory. A file is a checkpoint when it carries the
        flatbuffer identifier ``ODTC``, else it is read as an ONNX model.

    Returns:
      JSON-ready data with ``kind`` ``"checkpoint"``, ``"model"`` or
      ``"artifacts"`` (then ``files``: file name -> its description).

    Raises:
      CheckpointError: a file with the checkpoint identifier that does not load.
      ModelError: a file that is neither a checkpoint nor an ONNX model.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        from jaxort.train_loop import ARTIFACT_FILES

        files = {}
        for name in ARTIFACT_FILES.values():
            if (path / name).is_file():
                files[name] = describe(path / name)
        return {"kind": "artifacts", "path": str(path), "files": files}
    with open(path, "rb") as f:
        head = f.read(8)
    if head[4:8] == _CHECKPOINT_ID:
        return _checkpoint_info(path)
    return _model_info(path)


def _table(rows: list, headers: list) -> list:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def _size(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def render(info: dict) -> str:
    """The text tables ``jaxort inspect`` prints for :func:`describe`'s data."""
    lines = []
    if info["kind"] == "artifacts":
        lines.append(f"artifacts: {info['path']} ({', '.join(info['files']) or 'no artifact files'})")
        for name, sub in info["files"].items():
            lines += ["", f"== {name}", render(sub)]
        return "\n".join(lines)
    params = info["parameters"]
    lines.append(f"{info['kind']}: {info['path']} ({_size(info['file_bytes'])})")
    if info["kind"] == "checkpoint":
        n_train = sum(p["trainable"] for p in params)
        lines.append(f"parameters: {len(params)} ({n_train} trainable, {len(params) - n_train} frozen), "
                     f"{_size(info['parameter_bytes'])}" + (", nominal (no data)" if info["nominal"] else ""))
    else:
        lines.append(f"ir_version {info['ir_version']}, opsets "
                     + ", ".join(f"{d} {v}" for d, v in info["opsets"].items()) + f", {info['nodes']} nodes")
        lines.append("inputs:")
        lines += _table([(v["name"], v["dtype"], _shape(v["shape"])) for v in info["inputs"]],
                        ["name", "dtype", "shape"])
        lines.append("outputs:")
        lines += _table([(v["name"], v["dtype"], _shape(v["shape"])) for v in info["outputs"]],
                        ["name", "dtype", "shape"])
        lines.append(f"parameters: {len(params)}, {_size(info['parameter_bytes'])} in initializers")
    if params:
        lines += _table([(p["name"], p["dtype"], _shape(p["shape"]), p["trainable"], p["bytes"]) for p in params],
                        ["name", "dtype", "shape", "trainable", "bytes"])
    if info["kind"] == "checkpoint":
        groups = info["optimizer_groups"]
        lines.append(f"optimizer groups: {len(groups)}")
        for g in groups:
            names = sorted({s for states in g["states"].values() for s in states})
            lines.append(f"  {g['name']}: step {g['step']}, learning rate {g['learning_rate']:.6g}, "
                         f"{len(g['states'])} parameters with {names}, {_size(g['bytes'])}")
        props = info["properties"]
        lines.append(f"properties: {len(props)}")
        lines += [f"  {k} = {v!r}" for k, v in props.items()]
    else:
        ops = info["ops"]
        missing = info["missing_ops"]
        lines.append(f"ops: {len(ops)} kinds" + (f", {len(missing)} missing in jaxort: {missing}" if missing
                                                 else ", all supported by jaxort"))
        lines += _table([(o["domain"], o["op_type"], o["opset"], o["nodes"], o["status"]) for o in ops],
                        ["domain", "op_type", "opset", "nodes", "status"])
    return "\n".join(lines)
