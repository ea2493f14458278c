"""A resumable training loop over an artifact set, for ``jaxort train``.

:func:`run_training` trains ONNX Runtime Training artifacts (ORT's or
jaxort's) with the functional core (:class:`jaxort.training.TrainProgram`) on
arrays from an ``.npz`` file whose names are the model's inputs, or from a
directory of ``<input name>.npy`` files whose rows are read a batch at a
time (:class:`NpyRows`: data larger than memory), or from any iterable of
batches given in Python (a list, a data loader, a grain dataset): shuffled
fixed-size batches of arrays, a progress bar (tqdm), periodic evaluation,
checkpoints every N steps (atomic, as :func:`jaxort.checkpoint.save` writes
them), a JSON lines metrics log, a loss-curve PNG, and a checkpoint on
Ctrl-C.

Resuming is exact. A checkpoint written here holds the optimizer state and,
as integer properties, where the run stood (``jaxort.train.step``,
``.epoch``, ``.batch``, ``.seed``, ``.batch_size``). The batch order of epoch
``e`` depends only on ``(seed, e)``, the learning rate of step ``n`` only on
the schedule and ``n``, and the Dropout key of step ``n`` only on
``(seed, n)``; so a run resumed from the checkpoint of step ``k`` computes the
same losses and parameters as one that never stopped.

Also :func:`load_arrays` (an ``.npz`` or a directory of ``.npy`` as a dict, or an ``InputError``) and
:func:`plot_loss_curve` (matplotlib with the Agg canvas, no global backend
change). A facade module: it imports the layers below and nothing imports it
but the command line and the demo.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import signal
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import IO, Optional, Union

import numpy as np

from jaxort.errors import CheckpointError, InputError

__all__ = ["ARTIFACT_FILES", "POSITION_PROPERTIES", "SCHEDULES", "load_arrays", "plot_loss_curve",
           "read_metrics", "run_training"]

PathLike = Union[str, os.PathLike]

# The files of an artifact directory, as ORT's generate_artifacts names them.
ARTIFACT_FILES = {
    "training_model": "training_model.onnx",
    "eval_model": "eval_model.onnx",
    "optimizer_model": "optimizer_model.onnx",
    "checkpoint": "checkpoint",
}

# Checkpoint properties that say where a run stood.
POSITION_PROPERTIES = ("jaxort.train.step", "jaxort.train.epoch", "jaxort.train.batch",
                       "jaxort.train.seed", "jaxort.train.batch_size")

SCHEDULES = ("constant", "linear", "cosine")

# A checkpoint property: the JSON state of an iterable's iterator (grain's), where it has one.
DATA_STATE = "jaxort.train.data_state"


def load_arrays(path: PathLike, what: str = "data") -> dict:
    """Reads every array of an ``.npz`` file, or opens every ``.npy`` file of a directory.

    A directory holds one ``<input name>.npy`` per array (examples first). Its
    arrays are not loaded: each is a :class:`NpyRows` that reads the rows a
    batch asks for from the file, so data larger than memory trains batch by
    batch, and the process holds only the batch (the rows stay in the
    operating system's file cache, not in the process).

    Args:
      path: the ``.npz`` file or the directory.
      what: how error messages name it (e.g. ``"--data"``).

    Returns:
      Array name -> numpy array (a :class:`NpyRows` for a directory's), in
      the file's order (a directory's by name).

    Raises:
      InputError: the file is not a readable ``.npz`` archive (a ``.npy``
        array, a pickle, a truncated or foreign file); the directory has no
        ``.npy`` file, or one that cannot be read as an array (object
        arrays, Fortran order, a truncated file).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return _row_readers(path, what)
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise InputError(f"{what} {path!r} is a single .npy array, not an .npz archive of named arrays")
        with data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{what} {path!r} is not a readable .npz archive: {exc}") from None


class NpyRows:
    """A ``.npy`` file's rows, read on demand: ``rows[index]`` for an integer array or a slice.

    Each row is read with one ``os.pread`` (a slice with one), so random
    batches cost the rows they take and map nothing into the process (a
    memory map would: the kernel maps the cached pages around every row it
    faults in, and a shuffled run over a file soon holds all of it).
    """

    def __init__(self, path: str):
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f".npy format version {version[0]}.{version[1]} is not read here (1.0 and 2.0 are)")
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
        if dtype.hasobject or fortran or not shape:
            raise ValueError("an array of rows must be C-ordered, not of objects, and at least 1-D")
        self.path, self.shape, self.dtype, self._offset = path, tuple(shape), dtype, offset
        self._row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        expected = offset + shape[0] * self._row_bytes
        if os.path.getsize(path) < expected:
            raise ValueError(f"the file has {os.path.getsize(path)} bytes, its header says {expected}")
        self._fd = os.open(path, os.O_RDONLY)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            if step == 1:
                data = os.pread(self._fd, max(stop - start, 0) * self._row_bytes,
                                self._offset + start * self._row_bytes)
                return np.frombuffer(data, self.dtype).reshape((-1,) + self.shape[1:]).copy()
            index = np.arange(start, stop, step)
        rows = np.asarray(index, np.int64).reshape(-1)
        out = np.empty((len(rows),) + self.shape[1:], self.dtype)
        flat = out.reshape(len(rows), -1).view(np.uint8)
        for k, row in enumerate(rows):
            flat[k] = np.frombuffer(os.pread(self._fd, self._row_bytes, self._offset + int(row) * self._row_bytes),
                                    np.uint8)
        return out

    def __del__(self):
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


def _row_readers(path: str, what: str) -> dict:
    names = sorted(f for f in os.listdir(path) if f.endswith(".npy"))
    if not names:
        raise InputError(f"{what} {path!r} is a directory with no .npy file; it needs one <input name>.npy "
                         f"per model input")
    arrays = {}
    for name in names:
        file = os.path.join(path, name)
        try:
            arrays[name[:-len(".npy")]] = NpyRows(file)
        except (OSError, ValueError, EOFError) as exc:
            raise InputError(f"{what} {file!r} cannot be read as a .npy array of rows: {exc}") from None
    return arrays


def _columns(arrays: Mapping, names: Sequence[str], path: PathLike, what: str) -> list:
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(f"{what} {os.fspath(path)!r} has no array for the model input(s) {missing}; "
                         f"the model takes {list(names)}, the file has {list(arrays)}")
    columns = [arrays[n] if isinstance(arrays[n], NpyRows) else np.asarray(arrays[n]) for n in names]
    lengths = {n: (c.shape[0] if c.ndim else None) for n, c in zip(names, columns)}
    if len(set(lengths.values())) != 1 or None in lengths.values():
        raise InputError(f"{what} {os.fspath(path)!r}: the arrays must have one length along their first "
                         f"axis (the examples); got {lengths}")
    return columns


def plot_loss_curve(path: PathLike, curves: Mapping[str, tuple], *, title: str = "loss",
                    xlabel: str = "step") -> pathlib.Path:
    """Saves loss curves as a PNG.

    Args:
      path: the PNG to write.
      curves: label -> ``(xs, ys)``; ``label`` ending in ``"eval"`` is drawn
        with markers.
      title: the plot title.
      xlabel: the x-axis label.

    Returns:
      The path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, (xs, ys) in curves.items():
        style = {"marker": "o", "linestyle": "--"} if label.endswith("eval") else {}
        ax.plot(list(xs), list(ys), label=label, **style)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, format="png")
    return path


def read_metrics(path: PathLike) -> list:
    """The records of a metrics log written by :func:`run_training` (one JSON object a line)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _schedule(name: str, lr: float, warmup: int, total: int) -> Callable[[int], float]:
    from jaxort.training import linear_lr_schedule

    if name == "constant":
        return lambda n: lr
    if name == "linear":
        sched = linear_lr_schedule(lr, warmup, total)
        return lambda n: float(sched(n))
    if name == "cosine":
        import optax

        sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total, warmup + 1))
        return lambda n: float(sched(n))
    raise InputError(f"unknown schedule {name!r}; expected one of {list(SCHEDULES)}")


class _Interrupt:
    """Turns SIGINT into a flag the loop checks after each step (main thread only)."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def run_training(
    artifacts: PathLike,
    data: Union[PathLike, Iterable],
    *,
    epochs: int = 1,
    batch_size: int = 32,
    learning_rate: Optional[float] = None,
    schedule: str = "constant",
    warmup_steps: int = 0,
    eval_data: Optional[PathLike] = None,
    eval_every: Optional[int] = None,
    checkpoint_out: PathLike = "checkpoint_out",
    every: Optional[int] = None,
    resume: Optional[PathLike] = None,
    seed: int = 0,
    shuffle: bool = True,
    device: str = "cpu",
    metrics: Optional[PathLike] = None,
    plot: Optional[PathLike] = None,
    stop_after: Optional[int] = None,
    progress: Optional[bool] = None,
    log: Callable[[str], None] = print,
    steps_per_epoch: Optional[int] = None,
) -> dict:
    """Trains an artifact set on the arrays of an ``.npz`` file, or on any iterable of batches.

    Each step is one ``TrainProgram.train_and_update`` (train step, optimizer
    step, ``lazy_reset_grad``) on ``batch_size`` examples; the last partial
    batch of an epoch is skipped, so one compiled step serves the run.

    Args:
      artifacts: a directory with training_model.onnx, optimizer_model.onnx,
        checkpoint and optionally eval_model.onnx.
      data: an ``.npz`` (or a directory of ``<name>.npy`` files, :class:`NpyRows`)
        with one array per training-model input (user inputs
        and labels), examples along the first axis. Or an iterable of
        batches (a list, a generator's iterator, a data loader), each a
        sequence of arrays in the model's input order or a mapping of input
        name to array; its batches are trained as they come (``seed`` and
        ``shuffle`` do not apply to them, ``batch_size`` only to
        ``eval_data``). An object iterated anew each epoch (a list, a
        dataset) may run several epochs; a one-shot iterator runs one.
        Resuming skips the batches the checkpoint's run had trained, so the
        iterable must give the same batches in the same order again; an
        iterator with ``get_state`` and ``set_state`` (a grain dataset's) is
        restored to its saved state instead.
      epochs: passes over ``data``.
      batch_size: examples per step.
      learning_rate: the (peak) learning rate; default the checkpoint's
        optimizer group's, else ORT's 0.001.
      schedule: ``"constant"``, ``"linear"`` (ORT's LinearLRScheduler:
        warmup then linear decay to 0 at the last step) or ``"cosine"``
        (warmup then cosine decay), over the run's steps.
      warmup_steps: warmup length for ``linear`` and ``cosine``.
      eval_data: an ``.npz`` (or directory) for the eval model's inputs; evaluated at the end
        of each epoch, every ``eval_every`` steps and at the end.
      eval_every: evaluate every this many steps too.
      checkpoint_out: the checkpoint written every ``every`` steps, on
        interrupt and at the end (with optimizer state and position).
      every: steps between checkpoints; None: only at the end.
      resume: a checkpoint written by this function to continue from.
      seed: seed of the batch order and of Dropout.
      shuffle: shuffle each epoch (False: file order).
      device: ``"cpu"``, ``"gpu"``, ``"cuda"`` or ``"tpu"`` (``":<index>"``).
      metrics: the JSON lines log; default ``<checkpoint_out>.metrics.jsonl``.
        Records: ``{"event": "train", "step", "epoch", "loss", "lr",
        "seconds"}``, ``{"event": "eval", "step", "epoch", "eval_loss"}``,
        ``{"event": "checkpoint", "step", "path"}``. A resumed run keeps the
        records up to its checkpoint's step and appends.
      plot: the loss-curve PNG; default ``<checkpoint_out>.loss.png``.
      stop_after: stop (with a checkpoint) once this many steps are done.
      progress: show a tqdm bar on stderr (None: only on a terminal).
      log: receives each output line.
      steps_per_epoch: for an iterable of batches, how many make an epoch
        (default its ``len()``; an iterable without one and without this
        runs until it ends, one epoch, with the constant schedule).

    Returns:
      A dict: ``steps`` (done, the resumed ones included), ``loss`` (last
      train loss), ``eval_loss`` (last, or None), ``checkpoint``,
      ``metrics``, ``plot``, ``interrupted`` (stopped by SIGINT),
      ``stopped`` (stopped by ``stop_after``), ``params`` (name -> numpy
      array, trainable and frozen).

    Raises:
      InputError: unreadable data, missing input arrays, too few examples,
        a bad schedule, a resume checkpoint of another run; a batch of an
        iterable that is not the model's inputs, an iterable that ends
        before the step a run resumes at, several epochs of a one-shot
        iterator.
      CheckpointError: a resume checkpoint without optimizer state or position.
      TrainingError, ModelError: artifacts that cannot be trained.
    """
    import jax
    from tqdm.auto import tqdm

    art = pathlib.Path(artifacts)
    program, start_ckpt, dev = _open_artifacts(art, device, resume)
    if isinstance(data, (str, os.PathLike)):
        columns, eval_columns = _data_columns(program, data, eval_data, batch_size)
        n_examples = len(columns[0])
        per_epoch = n_examples // batch_size
        epoch_batches = _array_batches(columns, batch_size, seed, shuffle, per_epoch)
        described = f"{n_examples} examples, {per_epoch} batches of {batch_size} per epoch"
    else:
        eval_columns = _data_columns(program, None, eval_data, batch_size)[1]
        per_epoch = _iterable_length(data, epochs, steps_per_epoch, schedule)
        epoch_batches = _IterableBatches(data, program.input_names, per_epoch,
                                         start_ckpt.properties.get(DATA_STATE) if resume is not None else None)
        described = "batches from " + type(data).__name__ + (f", {per_epoch} per epoch" if per_epoch else "")
    total = epochs * per_epoch if per_epoch is not None else None
    step = 0
    if resume is not None:
        step = _resumed_step(start_ckpt, resume, seed=seed, batch_size=batch_size, epochs=epochs,
                             per_epoch=per_epoch)
    state = jax.device_put(program.init_state(start_ckpt, seed=seed), dev)
    peak = float(np.asarray(state.learning_rate)) if learning_rate is None else float(learning_rate)
    lr_at = _schedule(schedule, peak, warmup_steps, total or 0)

    out = pathlib.Path(checkpoint_out)
    metrics_path = pathlib.Path(metrics) if metrics is not None else out.with_name(out.name + ".metrics.jsonl")
    plot_path = pathlib.Path(plot) if plot is not None else out.with_name(out.name + ".loss.png")
    run = _Run(program, state, step, dict(start_ckpt.properties), int(seed), int(batch_size), out,
               _open_metrics(metrics_path, resume is not None, step), eval_columns,
               getattr(epoch_batches, "state", None))
    log(f"training {program.input_names} -> {program.output_names[0]}: {described}, {epochs} epoch(s)"
        + (f", resuming at step {step}" if resume is not None else ""))
    bar = tqdm(total=total, initial=step, unit="step", file=sys.stderr, disable=(not progress) if progress
               is not None else None, dynamic_ncols=True, desc="train")
    try:
        loss, eval_loss, interrupted, stopped = _train(
            run, epoch_batches, lr_at, epochs=epochs, per_epoch=per_epoch, eval_every=eval_every,
            every=every, stop_after=stop_after, bar=bar, log=log)
    finally:
        bar.close()
        run.metrics_file.close()

    plotted = _plot_metrics(metrics_path, plot_path, title=f"jaxort train: {art.name}")
    step = run.step
    if interrupted:
        log(f"interrupted at step {step}; saved checkpoint to {out} (continue with --resume {out})")
    elif stopped:
        log(f"stopped after step {step}; saved checkpoint to {out} (continue with --resume {out})")
    else:
        log(f"done: {step} steps, loss {loss if loss is not None else math.nan:.4f}; saved checkpoint to {out}")
    log(f"metrics in {metrics_path}" + (f", loss curve in {plot_path}" if plotted else ""))
    params = {name: np.asarray(v) for name, v in {**run.state.params, **run.state.frozen}.items()}
    return {"steps": step, "loss": loss, "eval_loss": eval_loss, "checkpoint": out, "metrics": metrics_path,
            "plot": plot_path if plotted else None, "interrupted": interrupted, "stopped": stopped,
            "params": params}


def _open_artifacts(art: pathlib.Path, device: str, resume: Optional[PathLike]) -> tuple:
    """``(program, checkpoint, device)``: the artifacts' TrainProgram and the checkpoint it starts from."""
    from jaxort import checkpoint as ckpt_io
    from jaxort.graph import resolve_device
    from jaxort.training import TrainProgram

    dev = resolve_device(device)
    start_ckpt = ckpt_io.load(resume if resume is not None else art / ARTIFACT_FILES["checkpoint"])
    eval_path = art / ARTIFACT_FILES["eval_model"]
    program = TrainProgram.from_artifacts(
        art / ARTIFACT_FILES["training_model"], eval_path if eval_path.exists() else None,
        art / ARTIFACT_FILES["optimizer_model"], checkpoint=start_ckpt)
    return program, start_ckpt, dev


def _data_columns(program, data: Optional[PathLike], eval_data: Optional[PathLike], batch_size: int) -> tuple:
    """``(columns, eval_columns)``: the arrays of the model's inputs (None without ``data`` or ``eval_data``)."""
    columns = None
    if data is not None:
        columns = _columns(load_arrays(data, "--data"), program.input_names, data, "--data")
        n_examples = len(columns[0])
        if n_examples < batch_size:
            raise InputError(f"--data {os.fspath(data)!r} has {n_examples} examples, fewer than one batch "
                             f"of {batch_size}")
    eval_columns = None
    if eval_data is not None:
        eval_columns = _columns(load_arrays(eval_data, "--eval-data"), program.eval_input_names, eval_data,
                                "--eval-data")
    return columns, eval_columns


def _array_batches(columns: list, batch_size: int, seed: int, shuffle: bool, per_epoch: int) -> Callable:
    """``batches(epoch, start)``: the batches of an epoch of arrays from batch ``start`` on."""
    n_examples = len(columns[0])

    def batches(epoch: int, start: int):
        # int32 positions where they fit, shuffled in place: a large data set's order in a
        # quarter of the memory of permutation(n), and the same order.
        order = np.arange(n_examples, dtype=np.int32 if n_examples < 2 ** 31 else np.int64)
        if shuffle:
            np.random.default_rng([seed, epoch]).shuffle(order)
        for index in range(start, per_epoch):
            idx = order[index * batch_size:(index + 1) * batch_size]
            yield tuple(c[idx] for c in columns)
    return batches


def _iterable_length(data, epochs: int, steps_per_epoch: Optional[int], schedule: str) -> Optional[int]:
    """Batches per epoch of an iterable (None: until it ends), checked against ``epochs`` and ``schedule``."""
    if not isinstance(data, Iterable) or isinstance(data, (bytes, Mapping)):
        raise InputError(f"data must be a path to an .npz file or a directory of .npy files, or an iterable "
                         f"of batches; got {type(data).__name__}")
    if iter(data) is data and epochs != 1:
        raise InputError(f"data is an iterator, which can be read once: epochs must be 1 (given {epochs}); "
                         "pass an object iterated anew each epoch (a list, a dataset) for more")
    length = steps_per_epoch
    if length is None and isinstance(data, Sized):
        length = len(data)
    if length is None:
        if epochs != 1 or schedule != "constant":
            raise InputError(f"data ({type(data).__name__}) has no len(): pass steps_per_epoch for epochs > 1 "
                             f"or the {schedule!r} schedule")
        return None
    if int(length) < 1:
        raise InputError(f"an epoch of data needs at least one batch; got {length}")
    return int(length)


class _IterableBatches:
    """``batches(epoch, start)``: an iterable's batches from batch ``start`` of an epoch on.

    An iterator with ``get_state()`` / ``set_state(state)`` (grain's
    ``DatasetIterator``) is put where a checkpoint's run stood by its own state
    (:meth:`state`, saved as the ``jaxort.train.data_state`` property); any
    other skips the batches before ``start``.
    """

    def __init__(self, data: Iterable, names: Sequence[str], per_epoch: Optional[int],
                 resume_state: Optional[str] = None):
        self.data, self.names, self.per_epoch = data, names, per_epoch
        self.resume_state = resume_state
        self.iterator = None

    def state(self) -> Optional[str]:
        """The current iterator's state as JSON, when it has one."""
        get_state = getattr(self.iterator, "get_state", None)
        return None if get_state is None else json.dumps(get_state())

    def __call__(self, epoch: int, start: int):
        self.iterator = it = iter(self.data)
        skip = start
        if start and self.resume_state is not None and hasattr(it, "set_state"):
            it.set_state(json.loads(self.resume_state))
            skip = 0
        self.resume_state = None  # the resumed epoch only
        seen = start - skip
        for batch in it:
            if self.per_epoch is not None and seen >= self.per_epoch:
                return
            seen += 1
            if seen > start:
                yield _batch_inputs(batch, self.names, seen - 1)
        if seen < start:
            raise InputError(f"data ended after {seen} batches of epoch {epoch + 1}, before batch {start + 1}, "
                             "where the resumed run stood")


def _batch_inputs(batch, names: Sequence[str], index: int) -> tuple:
    """A batch of an iterable as the model's inputs, in order."""
    if isinstance(batch, Mapping):
        missing = [n for n in names if n not in batch]
        if missing:
            raise InputError(f"batch {index + 1} of data has no {missing}; the model takes {list(names)}, "
                             f"the batch has {list(batch)}")
        return tuple(batch[n] for n in names)
    if isinstance(batch, (str, bytes)) or not isinstance(batch, Sequence) or len(batch) != len(names):
        given = f"{len(batch)} values" if isinstance(batch, Sequence) else type(batch).__name__
        raise InputError(f"batch {index + 1} of data must be {len(names)} arrays {list(names)} (or a mapping "
                         f"of those names), got {given}")
    return tuple(batch)


def _resumed_step(start_ckpt, resume: PathLike, *, seed: int, batch_size: int, epochs: int,
                  per_epoch: Optional[int]) -> int:
    """The step a checkpoint written by :func:`run_training` stood at, checked against this run."""
    props = start_ckpt.properties
    missing = [p for p in POSITION_PROPERTIES if p not in props]
    if missing or not start_ckpt.optimizer_groups:
        raise CheckpointError(
            f"--resume {os.fspath(resume)!r} was not written by jaxort train: it lacks "
            + ("optimizer state" if not start_ckpt.optimizer_groups else f"the properties {missing}"))
    for name, given in (("seed", seed), ("batch_size", batch_size)):
        saved = props[f"jaxort.train.{name}"]
        if saved != given:
            raise InputError(f"--resume {os.fspath(resume)!r} comes from a run with {name} {saved}; "
                             f"resume with the same {name} (given {given})")
    step = int(props["jaxort.train.step"])
    total = epochs * per_epoch if per_epoch is not None else step
    if step > total:
        raise InputError(f"--resume {os.fspath(resume)!r} is at step {step}, past the {total} steps of "
                         f"{epochs} epoch(s) of {per_epoch} batches")
    return step


def _open_metrics(path: pathlib.Path, resumed: bool, step: int):
    """The metrics log, opened for writing; a resumed run's keeps the records up to ``step``."""
    kept = []
    if resumed and path.exists():
        kept = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    metrics_file = open(path, "w", encoding="utf-8")
    for r in kept:
        metrics_file.write(json.dumps(r) + "\n")
    metrics_file.flush()
    return metrics_file


@dataclasses.dataclass
class _Run:
    """Where a run stands: its program and state, the step, and its checkpoint and metrics files."""

    program: object
    state: object
    step: int
    props: dict
    seed: int
    batch_size: int
    out: pathlib.Path
    metrics_file: IO[str]
    eval_columns: Optional[list]
    data_state: Optional[Callable[[], Optional[str]]] = None

    def record(self, **fields) -> None:
        self.metrics_file.write(json.dumps(fields) + "\n")
        self.metrics_file.flush()

    def save(self, epoch: int, batch: int) -> None:
        from jaxort import checkpoint as ckpt_io

        position = dict(zip(POSITION_PROPERTIES, (self.step, epoch, batch, self.seed, self.batch_size)))
        state = self.data_state() if self.data_state is not None and batch else None
        if state is not None:
            position[DATA_STATE] = state
        ckpt_io.save(self.program.to_checkpoint(self.state, include_optimizer_state=True,
                                                properties={**self.props, **position}), self.out,
                     include_optimizer_state=True)
        self.record(event="checkpoint", step=self.step, path=str(self.out))

    def evaluate(self, epoch: int) -> Optional[float]:
        if self.eval_columns is None:
            return None
        total_loss, count = 0.0, 0
        n = len(self.eval_columns[0])
        for lo in range(0, n, self.batch_size):
            batch = [c[lo:lo + self.batch_size] for c in self.eval_columns]
            loss = float(np.asarray(self.program.eval_step(self.state, *batch)[0]))
            total_loss += loss * len(batch[0])
            count += len(batch[0])
        value = total_loss / count
        self.record(event="eval", step=self.step, epoch=epoch, eval_loss=value)
        return value


def _train(run: _Run, epoch_batches: Callable, lr_at: Callable[[int], float], *, epochs: int,
           per_epoch: Optional[int], eval_every: Optional[int], every: Optional[int], stop_after: Optional[int],
           bar, log: Callable[[str], None]) -> tuple:
    """Trains from ``run.step`` to the end, a stop or an interrupt, then saves the checkpoint.

    ``epoch_batches(epoch, start)`` gives an epoch's batches from batch
    ``start`` on; ``per_epoch`` is their count, or None (an epoch ends with
    its batches).

    Returns:
      ``(loss, eval_loss, interrupted, stopped)``: the last losses (None
      where none was computed) and why the loop stopped early.
    """
    import jax

    from jaxort.training import set_learning_rate

    total = epochs * per_epoch if per_epoch is not None else None
    base_key = jax.random.PRNGKey(run.seed)
    epoch, batch_index = divmod(run.step, per_epoch) if per_epoch is not None else (0, run.step)
    loss = eval_loss = None
    interrupted = stopped = False
    started = time.perf_counter()
    with _Interrupt() as interrupt:
        while epoch < epochs and not (interrupted or stopped):
            rolled = False
            for batch in epoch_batches(epoch, batch_index):
                lr = lr_at(run.step)
                run.state = set_learning_rate(run.state, lr).replace(rng=jax.random.fold_in(base_key, run.step))
                run.state, outs = run.program.train_and_update(run.state, *batch)
                loss = float(np.asarray(outs[0]))
                run.step += 1
                batch_index += 1
                run.record(event="train", step=run.step, epoch=epoch + 1, loss=loss, lr=float(np.float32(lr)),
                           seconds=round(time.perf_counter() - started, 4))
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
                if eval_every and run.step % eval_every == 0 and batch_index != per_epoch:
                    eval_loss = run.evaluate(epoch + 1)
                rolled = batch_index == per_epoch
                if rolled:
                    epoch, batch_index, eval_loss = _next_epoch(run, epoch, epochs, loss, eval_loss, log)
                if interrupt.requested:
                    interrupted = True
                    break
                if stop_after is not None and run.step >= stop_after:
                    stopped = True
                    break
                if every and run.step % every == 0 and (total is None or run.step < total):
                    run.save(epoch, batch_index)
                if rolled:
                    break  # the next epoch draws its own order
            else:
                if not rolled:  # the batches ended before per_epoch (or per_epoch is unknown)
                    epoch, batch_index, eval_loss = _next_epoch(run, epoch, epochs, loss, eval_loss, log)
    run.save(epoch, batch_index)
    return loss, eval_loss, interrupted, stopped


def _next_epoch(run: _Run, epoch: int, epochs: int, loss, eval_loss, log: Callable[[str], None]) -> tuple:
    """``(epoch, batch, eval_loss)`` after epoch ``epoch`` ends: evaluated and logged."""
    epoch += 1
    eval_loss = run.evaluate(epoch) if run.eval_columns is not None else eval_loss
    log(f"epoch {epoch}/{epochs}  step {run.step}  loss {loss if loss is not None else math.nan:.4f}"
        + (f"  eval loss {eval_loss:.4f}" if eval_loss is not None else ""))
    return epoch, 0, eval_loss


def _plot_metrics(metrics_path: pathlib.Path, plot_path: pathlib.Path, *, title: str) -> bool:
    """Plots the train and eval losses of a metrics log; False (and no file) when it has none."""
    records = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in records if r["event"] == "train"]
    evals = [(r["step"], r["eval_loss"]) for r in records if r["event"] == "eval"]
    curves = {"train": tuple(zip(*train))} if train else {}
    if evals:
        curves["eval"] = tuple(zip(*evals))
    if curves:
        plot_loss_curve(plot_path, curves, title=title)
    return bool(curves)
