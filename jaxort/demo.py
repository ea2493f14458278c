"""The end-to-end demo: train a digit classifier through ``jaxort.api``.

``python -m jaxort demo`` (and ``make demo``) builds a small MLP as an ONNX
model for the 8x8 handwritten digits shipped in ``jaxort/data/digits.npz``
(UCI, 1,797 images; credit in ``jaxort/data/README.md``), generates training
artifacts with :func:`jaxort.training.artifacts.generate_artifacts`, trains with the
``onnxruntime.training.api``-shaped facade (``CheckpointState``, ``Module``,
``Optimizer``), evaluates on a held-out split, and saves the checkpoint and
the exported inference model.

This is a facade-level module: it may import everything below it.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["build_digits_mlp", "load_digits", "run_demo"]

N_FEATURES, N_CLASSES = 64, 10


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The UCI 8x8 digits as scikit-learn ships them.

    Returns:
      ``(images, target)``: uint8 arrays of shape (1797, 8, 8), pixel counts
      0..16, and (1797,), the digits 0..9.
    """
    with resources.files("jaxort").joinpath("data/digits.npz").open("rb") as f:
        with np.load(f) as data:
            return data["images"], data["target"]


def build_digits_mlp(hidden: int = 64, seed: int = 0) -> onnx.ModelProto:
    """An MLP classifier 64 -> hidden -> 10 as an ONNX model.

    ``input`` is float32 [batch, 64] (pixels scaled to [0, 1]); ``output`` the
    float32 [batch, 10] logits. Parameters ``fc1.weight`` [64, hidden],
    ``fc1.bias``, ``fc2.weight`` [hidden, 10], ``fc2.bias`` are He-initialized
    with ``seed``. Opset 17 and IR version 8, which ONNX Runtime 1.19.2 reads.

    Args:
      hidden: width of the hidden layer.
      seed: numpy seed of the initial weights.

    Returns:
      The forward ``ModelProto``.
    """
    rng = np.random.default_rng(seed)
    params = {
        "fc1.weight": rng.normal(0, np.sqrt(2 / N_FEATURES), (N_FEATURES, hidden)).astype(np.float32),
        "fc1.bias": np.zeros(hidden, np.float32),
        "fc2.weight": rng.normal(0, np.sqrt(2 / hidden), (hidden, N_CLASSES)).astype(np.float32),
        "fc2.bias": np.zeros(N_CLASSES, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["input", "fc1.weight"], ["fc1.mm"], name="fc1_matmul"),
        helper.make_node("Add", ["fc1.mm", "fc1.bias"], ["fc1.out"], name="fc1_add"),
        helper.make_node("Relu", ["fc1.out"], ["relu.out"], name="relu"),
        helper.make_node("MatMul", ["relu.out", "fc2.weight"], ["fc2.mm"], name="fc2_matmul"),
        helper.make_node("Add", ["fc2.mm", "fc2.bias"], ["output"], name="fc2_add"),
    ]
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", N_FEATURES])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", N_CLASSES])],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="jaxort.demo")
    # ONNX Runtime 1.19.2 reads IR <= 10; newer onnx writes a higher default.
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _split(seed: int, test_fraction: float):
    images, target = load_digits()
    x = images.reshape(len(images), N_FEATURES).astype(np.float32) / 16.0
    y = target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def run_demo(
    out_dir: Optional[os.PathLike] = None,
    *,
    epochs: int = 12,
    batch_size: int = 32,
    learning_rate: float = 0.01,
    hidden: int = 64,
    seed: int = 0,
    test_fraction: float = 0.2,
    progress: Optional[bool] = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Trains the digits MLP through ``jaxort.api`` and reports its accuracy.

    Steps: build the model, ``generate_artifacts`` (CrossEntropyLoss, AdamW,
    the logits kept as a second output so evaluation can count hits), train
    ``epochs`` passes of shuffled fixed-size batches (one ``Module`` call,
    ``Optimizer.step`` and ``lazy_reset_grad`` per batch, a progress line per
    epoch), evaluate the held-out split, save the checkpoint (with optimizer
    state) and the exported inference model.

    Args:
      out_dir: where the artifacts, checkpoint and inference model go
        (created); default a new temporary directory.
      epochs: passes over the training split.
      batch_size: examples per train step (the last partial batch of an
        epoch is skipped, so one compiled step serves the run).
      learning_rate: AdamW learning rate.
      hidden: hidden layer width.
      seed: seed of the weights, the split and the shuffling.
      test_fraction: share of the 1,797 images held out.
      progress: show a tqdm progress bar on stderr (None: only on a terminal).
      log: receives each output line.

    Returns:
      A dict with ``accuracy`` (held-out), ``eval_loss``, ``train_loss``
      (mean of the last epoch), ``steps``, ``steps_per_second`` (after the
      first epoch, which compiles), ``seconds``
      ``losses`` (every step's train loss) and the paths ``artifacts``,
      ``checkpoint``, ``inference_model`` and ``loss_curve`` (a PNG of the
      step losses, beside the checkpoint).
    """
    from tqdm.auto import tqdm

    from jaxort import api
    from jaxort.train_loop import plot_loss_curve
    from jaxort.training.artifacts import LossType, OptimType, float_initializers, generate_artifacts

    start = time.perf_counter()
    out = pathlib.Path(out_dir) if out_dir is not None else pathlib.Path(
        tempfile.mkdtemp(prefix="jaxort-demo-"))
    art_dir = out / "artifacts"
    art_dir.mkdir(parents=True, exist_ok=True)
    x_train, y_train, x_test, y_test = _split(seed, test_fraction)
    log(f"digits: {len(x_train)} train / {len(x_test)} held-out images, MLP 64-{hidden}-10")

    model = build_digits_mlp(hidden, seed)
    arts = generate_artifacts(
        model, requires_grad=float_initializers(model), loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW, artifact_directory=art_dir, additional_output_names=["output"])
    state = api.CheckpointState.load_checkpoint(str(arts.checkpoint))
    module = api.Module(str(arts.training_model), state, str(arts.eval_model))
    optimizer = api.Optimizer(str(arts.optimizer_model), module)
    optimizer.set_learning_rate(learning_rate)

    rng = np.random.default_rng(seed)
    n_batches = len(x_train) // batch_size
    steps, timed_steps, train_time, mean_loss = 0, 0, 0.0, float("nan")
    all_losses = []
    bar = tqdm(total=epochs * n_batches, unit="step", desc="digits", dynamic_ncols=True,
               disable=(not progress) if progress is not None else None)
    module.train()
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(x_train))
        losses = []
        t0 = time.perf_counter()
        for b in range(n_batches):
            idx = order[b * batch_size:(b + 1) * batch_size]
            loss, _ = module(x_train[idx], y_train[idx])
            optimizer.step()
            module.lazy_reset_grad()
            losses.append(float(loss))
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.4f}", refresh=False)
        all_losses += losses
        seconds = time.perf_counter() - t0
        steps += n_batches
        if epoch > 1 or epochs == 1:
            # The first epoch includes compiling the steps; the rate excludes it.
            train_time += seconds
            timed_steps += n_batches
        mean_loss = float(np.mean(losses))
        note = "  (includes compilation)" if epoch == 1 else ""
        bar.write(f"epoch {epoch:2d}/{epochs}  loss {mean_loss:.4f}  {n_batches / seconds:8.1f} steps/s{note}",
                  file=_LogFile(log))
    bar.close()

    module.eval()
    eval_loss, logits = module(x_test, y_test)
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == y_test))

    checkpoint_path = out / "checkpoint"
    api.CheckpointState.save_checkpoint(state, str(checkpoint_path), include_optimizer_state=True)
    inference_path = out / "inference_model.onnx"
    module.export_model_for_inferencing(str(inference_path), ["output"])
    curve_path = plot_loss_curve(
        out / "loss_curve.png", {"train (per step)": (range(1, steps + 1), all_losses)},
        title=f"digits MLP 64-{hidden}-10: held-out accuracy {accuracy:.3f}")
    seconds = time.perf_counter() - start
    log(f"saved checkpoint to {checkpoint_path}")
    log(f"saved inference model to {inference_path} (input 'input' [batch, 64] pixels/16, "
        f"output 'output' [batch, 10] logits)")
    log(f"saved loss curve to {curve_path}")
    log(f"held-out accuracy {accuracy:.4f} ({int(round(accuracy * len(y_test)))}/{len(y_test)}), "
        f"eval loss {float(eval_loss):.4f}, {seconds:.1f} s in all")
    return {
        "accuracy": accuracy,
        "eval_loss": float(eval_loss),
        "train_loss": mean_loss,
        "steps": steps,
        "steps_per_second": timed_steps / train_time if train_time else float("nan"),
        "seconds": seconds,
        "artifacts": art_dir,
        "checkpoint": checkpoint_path,
        "inference_model": inference_path,
        "loss_curve": curve_path,
        "losses": all_losses,
    }


class _LogFile:
    """A file-like ``write`` that hands each line to ``log``, so tqdm can print above its bar."""

    def __init__(self, log: Callable[[str], None]):
        self._log = log

    def write(self, text: str) -> None:
        if text.strip():
            self._log(text.rstrip("\n"))

    def flush(self) -> None:
        pass
