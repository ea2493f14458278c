"""Checkers for ONNX models run through jaxort: values, gradients, checkpoints, training.

- :func:`assert_matches_reference`: jaxort's outputs against ONNX's
  ``ReferenceEvaluator`` or ONNX Runtime, with per-dtype tolerances and a
  readable diff (which output, max absolute and relative error, where).
- :func:`check_gradients`: ``jax.grad`` of a model against central finite
  differences, in float64.
- :func:`assert_checkpoint_roundtrip`: a :class:`jaxort.checkpoint.Checkpoint`
  through bytes and a file and back.
- :func:`assert_trains_like`: a few train steps of jaxort (its functional core, under jaxort.api) against
  onnxruntime-training or a recorded trajectory.

A failing check saves the model (and its inputs) so it can be opened in
Netron or ``onnx.printer``: to ``$JAXORT_FAILURE_DIR`` if set, else to a
temporary directory, and names the file in the message (a check that raises
instead of asserting gets the file in a note). Every failing example is
saved, under hypothesis while it shrinks too: a file is named by a hash of
the model and inputs, so a replayed example rewrites its own, and the
message of the final, shrunk example names the minimal model.

Imports numpy and onnx; JAX, jaxort's graph and training layers and
onnxruntime load when a check runs. No hypothesis.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np
import onnx
from onnx import TensorProto

from jaxort.testing.harness import (
    TOLERANCES,
    _model_and_feeds,
    assert_outputs_match,
    run_jaxort,
    run_reference,
)

__all__ = [
    "assert_checkpoint_roundtrip",
    "assert_matches_reference",
    "assert_trains_like",
    "check_gradients",
    "failure_dir",
    "load_failure",
    "run_onnxruntime",
    "save_failure",
    "to_float64",
]


# --------------------------------------------------------------------------- failures


def failure_dir() -> pathlib.Path:
    """Where failing models are saved: ``$JAXORT_FAILURE_DIR`` or ``<tmp>/jaxort-failures``."""
    path = pathlib.Path(os.environ.get("JAXORT_FAILURE_DIR")
                        or pathlib.Path(tempfile.gettempdir()) / "jaxort-failures")
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_failure(model: onnx.ModelProto, feeds: Mapping) -> pathlib.Path:
    """Saves a model and its inputs as ``failure-<hash>.onnx`` and ``.npz``; returns the model's path.

    It writes on every call, hypothesis shrinking or not; the hash covers the
    model and the inputs, so saving one example twice rewrites the same files.

    Args:
      model: the model.
      feeds: graph input name -> array.

    Returns:
      The path of the ``.onnx`` file, in :func:`failure_dir`.
    """
    data = model.SerializeToString()
    digest = hashlib.sha256(data + repr(sorted((k, np.asarray(v).tobytes())
                                               for k, v in feeds.items())).encode()).hexdigest()[:12]
    path = failure_dir() / f"failure-{digest}.onnx"
    path.write_bytes(data)
    np.savez(path.with_suffix(".npz"), **{k: np.asarray(v) for k, v in feeds.items()})
    return path


def load_failure(path: Union[str, os.PathLike]) -> tuple:
    """``(model, inputs in graph input order)`` of a file :func:`save_failure` wrote."""
    path = pathlib.Path(path)
    model = onnx.load(path)
    with np.load(path.with_suffix(".npz")) as npz:
        feeds = dict(npz)
    inits = {t.name for t in model.graph.initializer}
    return model, [feeds[i.name] for i in model.graph.input if i.name not in inits]


@contextlib.contextmanager
def _saving_on_failure(model: onnx.ModelProto, feeds: Mapping, what: str):
    try:
        yield
    except AssertionError as err:
        ops = [n.op_type for n in model.graph.node]
        raise AssertionError(f"{what} failed for a model of {len(ops)} nodes {ops}: "
                             f"{err}\n{_saved(model, feeds)}") from None
    except Exception as err:
        err.add_note(_saved(model, feeds))
        raise


def _saved(model: onnx.ModelProto, feeds: Mapping) -> str:
    """Saves a failing example; the line of the message that names the files."""
    path = save_failure(model, feeds)
    return (f"model saved to {path} (inputs in {path.with_suffix('.npz').name}; "
            "load both with jaxort.testing.load_failure)")


# --------------------------------------------------------------------------- values

# Extra room (times the table) for a model that is more than one op: each
# op may round once more, and XLA's float64 transcendentals and ONNX's
# reference (which computes some float64 constants in float32, e.g.
# HardSwish's 1/6) differ by ~1e-8.
_FLOOR = {np.dtype(np.float64): (1e-7, 1e-9)}


def _default_tolerances(model: onnx.ModelProto) -> dict:
    n = max(1, len(model.graph.node))
    out = {}
    for dt, (r, a) in TOLERANCES.items():
        lo_r, lo_a = _FLOOR.get(dt, (0.0, 0.0))
        out[dt] = (max(r * 4 * n, lo_r), max(a * 4 * n, lo_a))
    return out


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping) -> list:
    """Runs a model in ``onnxruntime.InferenceSession`` on CPU; returns its outputs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, dict(feeds))]


def assert_matches_reference(
    model,
    inputs: Union[Sequence, Mapping, None] = None,
    reference: str = "onnx",
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    *,
    scale: Optional[float] = None,
    jit: bool = True,
    enable_x64: bool = True,
    _run_reference=None,
) -> tuple:
    """Asserts jaxort computes what a reference runtime computes for ``model``.

    jaxort runs ``JaxGraph(model).apply`` (under ``jax.jit`` by default, strict
    dtype promotion, 64-bit types) with the float initializers as params.

    Args:
      model: an ``onnx.ModelProto`` (or a ``NodeCase`` / ``ModelCase``, then
        ``inputs`` defaults to its own).
      inputs: arrays in graph input order (as :func:`model_inputs` draws
        them), or a dict graph input name -> array.
      reference: ``"onnx"`` (``onnx.reference.ReferenceEvaluator``) or
        ``"onnxruntime"`` (``InferenceSession`` on CPU, graph optimizations
        off).
      rtol: relative tolerance for every float output; default per output
        dtype (:data:`TOLERANCES`, widened by the number of nodes, or times
        ``scale``).
      atol: absolute tolerance, likewise.
      scale: a factor on the table's tolerances instead of the per-node
        widening.
      jit: run jaxort under ``jax.jit``.
      enable_x64: run with 64-bit types.

    Returns:
      jaxort's outputs, a tuple.

    Raises:
      AssertionError: an output differs in count, dtype, shape or values; the
        message names the output, the max absolute and relative error and the
        worst index, and the file the model was saved to. An error raised by
        either run is saved too and keeps its type, the file named in a note.

    Example:
      >>> from jaxort.testing import node_model
      >>> m = node_model("Relu", [np.zeros(3, np.float32)])
      >>> (y,) = assert_matches_reference(m, [np.float32([-1, 0, 2])])
    """
    proto, feeds = _model_and_feeds(model, inputs)
    if reference not in ("onnx", "onnxruntime"):
        raise ValueError(f"reference must be 'onnx' or 'onnxruntime', not {reference!r}")
    if scale is None:
        table = _default_tolerances(proto)
    else:
        table = {dt: (r * scale, a * scale) for dt, (r, a) in TOLERANCES.items()}
    if rtol is not None or atol is not None:
        table = {dt: (r if rtol is None else rtol, a if atol is None else atol)
                 for dt, (r, a) in table.items()}
    with _saving_on_failure(proto, feeds, f"comparison with {reference}"):
        if _run_reference is not None:
            expected = _run_reference(proto, feeds)
        elif reference == "onnx":
            expected = run_reference(proto, feeds)
        else:
            expected = run_onnxruntime(proto, feeds)
        got = run_jaxort(proto, feeds, jit=jit, params=None, enable_x64=enable_x64)
        assert_outputs_match(got, expected, tolerances=table,
                             names=[o.name for o in proto.graph.output])
    return tuple(got)


# --------------------------------------------------------------------------- gradients

_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _retype(t: onnx.TypeProto) -> None:
    if t.HasField("tensor_type") and t.tensor_type.elem_type in _FLOAT_TYPES:
        t.tensor_type.elem_type = TensorProto.DOUBLE


def _retype_graph(g: onnx.GraphProto) -> None:
    from onnx import numpy_helper

    for vi in list(g.input) + list(g.output) + list(g.value_info):
        _retype(vi.type)
    for i, t in enumerate(g.initializer):
        if t.data_type in _FLOAT_TYPES:
            g.initializer[i].CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(t).astype(np.float64), t.name))
    for node in g.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i in _FLOAT_TYPES:
                attr.i = TensorProto.DOUBLE
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in _FLOAT_TYPES:
                attr.t.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(attr.t).astype(np.float64), attr.t.name))
            if attr.type == onnx.AttributeProto.GRAPH:
                _retype_graph(attr.g)


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every float16/bfloat16/float32 type and initializer made float64."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _retype_graph(out.graph)
    return out


def check_gradients(
    model: onnx.ModelProto,
    inputs: Union[Sequence, Mapping],
    wrt: Optional[Sequence[str]] = None,
    *,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    seed: int = 0,
) -> dict:
    """Checks ``jax.grad`` through jaxort against central finite differences, in float64.

    The model is made float64 (:func:`to_float64`); the scalar differentiated
    is ``sum_k <c_k, output_k>`` with fixed random cotangents ``c_k`` over the
    float outputs. Each element of each ``wrt`` tensor is perturbed by
    ``+-eps``. At a kink (a Relu at 0, two Clips with the same bound) the
    central difference is the mean of the two one-sided derivatives, which
    no gradient convention gives: there an element may match either
    one-sided difference instead (to ``1e3 * eps``, their truncation error).

    Args:
      model: the model.
      inputs: arrays in graph input order or name -> array.
      wrt: graph input and/or initializer names; default every float graph
        input and float initializer.
      eps: the finite-difference step.
      rtol: relative tolerance of the comparison.
      atol: absolute tolerance.
      seed: seed of the cotangents.

    Returns:
      name -> jaxort's gradient.

    Raises:
      AssertionError: a gradient element differs; the message names the
        tensor, the worst index and both values, and where the model was saved.
    """
    import jax
    import jax.numpy as jnp

    from jaxort.graph import JaxGraph, x64_enabled_scope

    proto, feeds = _model_and_feeds(model, inputs)
    proto64 = to_float64(proto)
    feeds64 = {k: (np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f"
                   or np.asarray(v).dtype.name == "bfloat16" else np.asarray(v))
               for k, v in feeds.items()}
    with x64_enabled_scope():
        graph = JaxGraph(proto64, check=False)
        inits = {k: np.asarray(v) for k, v in graph.params.items()}
        if wrt is None:
            wrt = [n for n in graph.input_names if feeds64[n].dtype == np.float64]
            wrt += [n for n, v in inits.items() if v.dtype == np.float64]
        unknown = [n for n in wrt if n not in feeds64 and n not in inits]
        if unknown:
            raise ValueError(f"wrt names {unknown} are neither graph inputs nor params")
        rng = np.random.default_rng(seed)
        apply = jax.jit(graph.apply)
        cot = None

        def scalar(values: Mapping):
            nonlocal cot
            params = {**inits, **{k: v for k, v in values.items() if k in inits}}
            args = [values.get(n, feeds64[n]) for n in graph.input_names]
            outs = [o for o in apply(params, *args)
                    if o is not None and jnp.issubdtype(o.dtype, jnp.floating)]
            if cot is None:
                cot = [rng.standard_normal(np.shape(o)) for o in outs]
            return sum(jnp.sum(o * c) for o, c in zip(outs, cot))

        point = {n: jnp.asarray(feeds64[n] if n in feeds64 else inits[n]) for n in wrt}
        scalar(point)  # fixes the cotangents
        grads = jax.grad(scalar)(point)
        with _saving_on_failure(proto, feeds, "gradient check"):
            for name in wrt:
                base = np.asarray(point[name], np.float64)
                got = np.asarray(grads[name])
                fd = np.zeros_like(base)
                for idx in np.ndindex(base.shape):
                    up, down = base.copy(), base.copy()
                    up[idx] += eps
                    down[idx] -= eps
                    f_up, f_down = float(scalar({**point, name: up})), float(scalar({**point, name: down}))
                    fd[idx] = (f_up - f_down) / (2 * eps)
                    if not np.isclose(got[idx], fd[idx], rtol=rtol, atol=atol):
                        fd[idx] = _one_sided(got[idx], fd[idx], f_up, f_down, float(scalar(point)), eps)
                assert_outputs_match([got], [fd], tolerances={np.float64: (rtol, atol)},
                                     names=[f"d/d {name}"])
    return {k: np.asarray(v) for k, v in grads.items()}


def _one_sided(got: float, central: float, f_up: float, f_down: float, f_at: float, eps: float) -> float:
    """The one-sided difference ``got`` matches at a kink (the value to compare with), else ``central``."""
    for side in ((f_up - f_at) / eps, (f_at - f_down) / eps):
        if np.isclose(got, side, rtol=1e3 * eps, atol=1e3 * eps):
            return side
    return central


# --------------------------------------------------------------------------- checkpoints


def _same_tensor(where: str, got, expected) -> None:
    from jaxort.checkpoint import NominalTensor

    if isinstance(expected, NominalTensor):
        assert isinstance(got, NominalTensor), f"{where}: expected a nominal tensor"
        assert (tuple(got.shape), np.dtype(got.dtype)) == (tuple(expected.shape),
                                                           np.dtype(expected.dtype)), where
        return
    g, e = np.asarray(got), np.asarray(expected)
    assert g.dtype == e.dtype, f"{where}: dtype {g.dtype} != {e.dtype}"
    assert g.shape == e.shape, f"{where}: shape {g.shape} != {e.shape}"
    if e.dtype.kind in "OUS":
        assert g.tolist() == e.tolist(), f"{where}: strings differ"
    else:
        assert g.tobytes() == e.tobytes(), f"{where}: bytes differ"


def assert_checkpoint_roundtrip(state, *, include_optimizer_state: bool = True) -> Any:
    """Asserts a checkpoint survives bytes and a file unchanged, and its bytes are stable.

    ``to_bytes`` then ``load_from_buffer``, and ``save`` then ``load``, must
    give back every tensor bit for bit (names, dtypes, shapes), the optimizer
    groups (names, steps, learning rates, momentums) and the properties; and
    writing the loaded state again gives the same bytes.

    Args:
      state: a :class:`jaxort.checkpoint.Checkpoint`.
      include_optimizer_state: keep the optimizer groups.

    Returns:
      The state loaded back.

    Raises:
      AssertionError: a difference, named.
    """
    import jaxort.checkpoint as ckpt

    data = ckpt.to_bytes(state, include_optimizer_state=include_optimizer_state)
    back = ckpt.load_from_buffer(data)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "checkpoint"
        ckpt.save(state, path, include_optimizer_state=include_optimizer_state)
        from_file = ckpt.load(path)
    for loaded, how in ((back, "bytes"), (from_file, "file")):
        for part in ("trainable", "frozen"):
            got, expected = getattr(loaded, part), getattr(state, part)
            # the writer orders tensors by name (as ORT does); the set must match
            assert sorted(got) == sorted(expected), (
                f"{how}: {part} names {sorted(got)} != {sorted(expected)}")
            for name in expected:
                _same_tensor(f"{how}: {part} {name!r}", got[name], expected[name])
        expected_props = {k: ckpt.normalize_property(k, v) for k, v in state.properties.items()}
        assert dict(loaded.properties) == expected_props, f"{how}: properties differ"
        groups = state.optimizer_groups if include_optimizer_state else ()
        assert len(loaded.optimizer_groups) == len(groups), f"{how}: optimizer group count"
        for g, e in zip(loaded.optimizer_groups, groups):
            assert (g.name, g.step) == (e.name, e.step), f"{how}: group {e.name!r}"
            assert np.float32(g.initial_learning_rate) == np.float32(e.initial_learning_rate), (
                f"{how}: group {e.name!r} learning rate")
            assert sorted(g.states) == sorted(e.states), f"{how}: group {e.name!r} parameters"
            for p, moments in e.states.items():
                assert sorted(g.states[p]) == sorted(moments), f"{how}: {p!r} momentum names"
                for m, value in moments.items():
                    _same_tensor(f"{how}: {e.name}/{p}/{m}", g.states[p][m], value)
    again = ckpt.to_bytes(back, include_optimizer_state=include_optimizer_state)
    assert again == data, "writing the loaded checkpoint again gives different bytes"
    return back


# --------------------------------------------------------------------------- training


def _ort_training_available() -> bool:
    try:
        import onnxruntime.training.api  # noqa: F401
    except ImportError:
        return False
    return True


def _train(api, case, directory: pathlib.Path, steps: int) -> dict:
    """Runs ``steps`` train + optimizer steps with an ``onnxruntime.training.api``-shaped module."""
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state,
                        str(directory / "eval_model.onnx"))
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(case.learning_rate)
    module.train()
    losses = []
    for inputs, labels in case.batches[:steps]:
        losses.append(float(np.asarray(module(*inputs, *labels))))
        optimizer.step()
        module.lazy_reset_grad()
    # (name, Parameter) pairs, as ORT's Parameters iterate (it has no items()).
    params = {name: np.asarray(p.data) for name, p in sorted(state.parameters, key=lambda item: item[0])}
    return {"losses": np.asarray(losses), "parameters": params}


def _train_jaxort(case, directory: pathlib.Path, steps: int) -> dict:
    """The same calls through jaxort's functional core (what jaxort.api delegates to).

    ``train_and_update`` is ``train_step``, ``optimizer_step`` and
    ``lazy_reset_grad`` in one compiled call.
    """
    from jaxort import checkpoint as ckpt
    from jaxort.training import TrainProgram, set_learning_rate

    start = ckpt.load(str(directory / "checkpoint"))
    program = TrainProgram.from_artifacts(directory / "training_model.onnx", directory / "eval_model.onnx",
                                          directory / "optimizer_model.onnx", checkpoint=start)
    state = set_learning_rate(program.init_state(start), case.learning_rate)
    losses = []
    for inputs, labels in case.batches[:steps]:
        state, outputs = program.train_and_update(state, *inputs, *labels)
        losses.append(float(np.asarray(outputs[0])))
    params = {name: np.asarray(value) for name, value in sorted(state.parameters.items())}
    return {"losses": np.asarray(losses), "parameters": params}


def record_trajectory(case, steps: int = 3, *, runtime: str = "jaxort") -> dict:
    """Trains a :func:`training_artifacts` case for ``steps`` steps; returns losses and parameters.

    Args:
      case: a :class:`TrainingCase`.
      steps: train steps (each followed by an optimizer step and a reset).
      runtime: ``"jaxort"`` (its functional core) or ``"onnxruntime"``
        (``onnxruntime.training.api``).

    Returns:
      ``{"losses": array of floats, "parameters": name -> array}``, what
      :func:`assert_trains_like` takes as a recorded reference (save it with
      ``np.savez``).
    """
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp)
        case.generate(directory)
        if runtime == "jaxort":
            return _train_jaxort(case, directory, steps)
        if runtime == "onnxruntime":
            import onnxruntime.training.api as api
        else:
            raise ValueError(f"runtime must be 'jaxort' or 'onnxruntime', not {runtime!r}")
        return _train(api, case, directory, steps)


def assert_trains_like(case, reference: Union[str, Mapping, None] = None, *, steps: int = 3,
                       rtol: float = 1e-4, atol: float = 1e-6) -> dict:
    """Asserts jaxort's train steps follow a reference runtime's.

    Generates the case's artifacts, trains ``steps`` steps with
    jaxort's functional core (what :mod:`jaxort.api` runs) and compares the losses and final parameters with
    onnxruntime-training's on the same files, or with a recorded trajectory.

    Args:
      case: a :class:`TrainingCase` (from :func:`training_artifacts`).
      reference: ``"onnxruntime"``; a trajectory (``{"losses": ...,
        "parameters": {...}}``, e.g. from :func:`record_trajectory`, or the
        path of an ``.npz`` with ``losses`` and ``param:<name>`` entries); or
        None: onnxruntime-training when importable, else an error.
      steps: train steps compared.
      rtol: relative tolerance (float32 steps).
      atol: absolute tolerance.

    Returns:
      jaxort's trajectory.

    Raises:
      AssertionError: a loss or a parameter differs; the model is saved.
      ImportError: ``reference`` needs onnxruntime-training and it is missing.
    """
    if reference is None or reference == "onnxruntime":
        if not _ort_training_available():
            raise ImportError("assert_trains_like(reference='onnxruntime') needs "
                              "onnxruntime-training; pass a recorded trajectory instead")
        expected = record_trajectory(case, steps, runtime="onnxruntime")
    elif isinstance(reference, (str, os.PathLike)):
        with np.load(reference) as npz:
            expected = {"losses": npz["losses"],
                        "parameters": {k[len("param:"):]: npz[k] for k in npz.files
                                       if k.startswith("param:")}}
    else:
        expected = reference
    got = record_trajectory(case, steps, runtime="jaxort")
    feeds = {f"batch{i}:{j}": x for i, (ins, labels) in enumerate(case.batches[:steps])
             for j, x in enumerate(list(ins) + list(labels))}
    with _saving_on_failure(case.model, feeds, "training comparison"):
        n = min(steps, len(expected["losses"]))
        assert_outputs_match([got["losses"][:n]], [np.asarray(expected["losses"][:n], np.float64)],
                             tolerances={np.float64: (rtol, atol)}, names=["losses"])
        names = sorted(expected["parameters"])
        assert_outputs_match([got["parameters"][k] for k in names],
                             [expected["parameters"][k] for k in names],
                             tolerances={np.float32: (rtol, atol)}, names=names)
    return got
