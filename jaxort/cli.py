"""The ``jaxort`` command line (also ``python -m jaxort``).

Commands (``jaxort COMMAND --help`` for each):

- ``jaxort demo [--out DIR] [--epochs N] [--seed S]``: the digits demo, with
  a progress bar and a loss-curve PNG beside the checkpoint.
- ``jaxort train --artifacts DIR --data FILE.npz|DIR [...]``: train an artifact
  set (ORT's or jaxort's) on named arrays, with periodic eval, checkpoints
  every N steps, exact resume and a JSON lines metrics log
  (:mod:`jaxort.train_loop`).
- ``jaxort generate-artifacts MODEL.onnx --loss L [--optimizer O] -o DIR``:
  :func:`jaxort.training.artifacts.generate_artifacts`.
- ``jaxort inspect PATH [--json]`` (alias ``summary``): a checkpoint, an ONNX
  model or an artifact directory: parameters, optimizer state, properties,
  sizes, and a model's ops with their support in jaxort.
- ``jaxort export --artifacts DIR --checkpoint C -o OUT [--outputs N,...]``
  (or ``--training-model T --eval-model E OUT``): the inference model of a
  checkpoint, as ``Module.export_model_for_inferencing`` writes it.

Every failure is one line on stderr and a non-zero exit status (1 for a
failed command, 2 for bad usage, 130 for a training run stopped by Ctrl-C
after saving its checkpoint); ``--verbose`` adds the traceback. Arguments
are checked before any work: a path that is not a regular file, a missing
output directory, a directory where a file is to be written, a count that is
not positive.

A facade: it imports the layers below and nothing imports it but
``jaxort/__main__.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import traceback
import warnings
from typing import Any, Callable, Optional, Sequence

__all__ = ["main"]


class _UsageError(Exception):
    """A bad argument found after parsing (exit status 2)."""


def _number(convert: Callable[[str], Any], words: str, accept: Callable[[Any], bool]) -> Callable[[str], Any]:
    """An argparse ``type``: ``convert(text)``, refused as "expected {words}" unless ``accept`` takes it."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {words}, got {text}")
        return value

    return parse


_positive_int = _number(int, "a positive integer", lambda value: value >= 1)
_non_negative_int = _number(int, "an integer >= 0", lambda value: value >= 0)
_positive_float = _number(float, "a positive number", lambda value: 0 < value < float("inf"))  # nan fails too


def _names(text: str) -> list:
    names = [n for n in text.split(",") if n]
    if not names:
        raise argparse.ArgumentTypeError(f"expected output names separated by commas, got {text!r}")
    return names


_LOSSES = ("MSELoss", "CrossEntropyLoss", "BCEWithLogitsLoss", "L1Loss")
_OPTIMIZERS = ("AdamW", "SGD")


def _parser() -> argparse.ArgumentParser:
    from jaxort import __version__
    from jaxort.train_loop import SCHEDULES

    parser = argparse.ArgumentParser(prog="jaxort", description="Train ONNX models with JAX, "
                                     "compatible with ONNX Runtime Training artifacts and checkpoints.")
    parser.add_argument("--version", action="version", version=f"jaxort {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", help="print the traceback of a failure")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", parents=[common], help="train the digits classifier through jaxort.api",
                               description="Train an MLP on the 8x8 UCI digits through jaxort.api, report "
                                           "held-out accuracy and save the loss curve as loss_curve.png.")
    demo.add_argument("--out", default=None,
                      help="directory for the artifacts, checkpoint, inference model and loss curve, created "
                           "if missing (default: a new temporary directory)")
    demo.add_argument("--epochs", type=_positive_int, default=12, help="passes over the training split")
    demo.add_argument("--seed", type=int, default=0, help="seed of weights, split and shuffling")

    train = commands.add_parser(
        "train", parents=[common], help="train an artifact set on arrays from an .npz file or .npy files",
        description="Train ONNX Runtime Training artifacts (ORT's or jaxort's) on the arrays of an .npz file, "
                    "or of a directory of .npy files read a batch at a time (data larger than memory), named like the "
                    "training model's inputs. Checkpoints hold the optimizer state and the "
                    "position in the data, so --resume continues exactly where a run stopped; Ctrl-C saves "
                    "a checkpoint first (exit status 130).")
    train.add_argument("--artifacts", required=True, metavar="DIR",
                       help="directory with training_model.onnx, optimizer_model.onnx, checkpoint and "
                            "optionally eval_model.onnx")
    train.add_argument("--data", required=True, metavar="FILE.npz|DIR",
                       help="training arrays, examples first: an .npz, or a directory of <input name>.npy files "
                            "(rows read a batch at a time)")
    train.add_argument("--epochs", type=_positive_int, default=1, help="passes over the data (default 1)")
    train.add_argument("--batch-size", type=_positive_int, default=32, help="examples per step (default 32)")
    train.add_argument("--lr", type=_positive_float, default=None,
                       help="(peak) learning rate (default: the checkpoint's, else 0.001)")
    train.add_argument("--schedule", choices=SCHEDULES, default="constant",
                       help="learning-rate schedule over the run's steps (default constant)")
    train.add_argument("--warmup-steps", type=_non_negative_int, default=0,
                       help="warmup steps of the linear and cosine schedules")
    train.add_argument("--eval-data", default=None, metavar="FILE.npz|DIR",
                       help="arrays for the eval model, evaluated after each epoch")
    train.add_argument("--eval-every", type=_positive_int, default=None, metavar="N",
                       help="also evaluate every N steps")
    train.add_argument("--checkpoint-out", default="checkpoint_out", metavar="PATH",
                       help="checkpoint written every N steps, on Ctrl-C and at the end (default checkpoint_out)")
    train.add_argument("--every", type=_positive_int, default=None, metavar="N",
                       help="save the checkpoint every N steps")
    train.add_argument("--resume", default=None, metavar="CKPT", help="continue from a checkpoint of jaxort train")
    train.add_argument("--seed", type=int, default=0, help="seed of the batch order and Dropout (default 0)")
    train.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="batches in file order")
    train.add_argument("--device", default="cpu", help="cpu, gpu, cuda or tpu, optionally :INDEX (default cpu)")
    train.add_argument("--metrics", default=None, metavar="FILE.jsonl",
                       help="metrics log, one JSON object a line (default CHECKPOINT_OUT.metrics.jsonl)")
    train.add_argument("--plot", default=None, metavar="FILE.png",
                       help="loss-curve PNG (default CHECKPOINT_OUT.loss.png)")
    train.add_argument("--stop-after", type=_positive_int, default=None, metavar="STEPS",
                       help="stop with a checkpoint once this many steps are done")
    train.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="show the progress bar (default: when stderr is a terminal)")

    gen = commands.add_parser(
        "generate-artifacts", parents=[common], help="write training artifacts for an ONNX model",
        description="Write training_model.onnx, eval_model.onnx, optimizer_model.onnx and checkpoint, as "
                    "onnxruntime.training.artifacts.generate_artifacts does.")
    gen.add_argument("model", metavar="MODEL.onnx", help="the forward model")
    gen.add_argument("--requires-grad", type=_names, action="extend", default=None, metavar="NAMES",
                     help="initializers to train, separated by commas or repeated (default: every "
                          "floating-point initializer not frozen)")
    gen.add_argument("--frozen", type=_names, action="extend", default=None, metavar="NAMES",
                     help="initializers kept as frozen parameters")
    gen.add_argument("--loss", choices=_LOSSES, required=True, help="loss added after the first output")
    gen.add_argument("--optimizer", choices=_OPTIMIZERS, default="AdamW", help="optimizer (default AdamW)")
    gen.add_argument("--additional-outputs", type=_names, action="extend", default=None, metavar="NAMES",
                     help="values the training and eval models return after the loss")
    gen.add_argument("--nominal-checkpoint", action="store_true", help="also write nominal_checkpoint")
    graph = gen.add_mutually_exclusive_group()
    graph.add_argument("--gradient-graph", dest="gradient_graph", action="store_true", default=None,
                       help="fail, naming the node, where the gradient graph ONNX Runtime trains with "
                            "cannot be written (default: write jaxort-only artifacts and warn)")
    graph.add_argument("--no-gradient-graph", dest="gradient_graph", action="store_false",
                       help="write jaxort-only artifacts, without the gradient graph ONNX Runtime trains "
                            "with")
    gen.add_argument("-o", "--out", required=True, metavar="DIR", help="directory to write (created)")

    for name, alias in (("inspect", []), ("summary", [])):
        insp = commands.add_parser(
            name, parents=[common], aliases=alias,
            help="describe a checkpoint, an ONNX model or an artifact directory"
                 + (" (alias of inspect)" if name == "summary" else ""),
            description="Describe a checkpoint (parameters, optimizer state, properties, sizes), an ONNX "
                        "model (inputs, outputs, parameters, ops and their support in jaxort) or an artifact "
                        "directory (all of its files).")
        insp.add_argument("path", metavar="PATH")
        insp.add_argument("--json", action="store_true", help="print JSON instead of tables")

    export = commands.add_parser(
        "export", parents=[common], help="write the inference model of a checkpoint",
        description="Write the eval graph up to the named outputs with the checkpoint's parameters as "
                    "initializers, as Module.export_model_for_inferencing does.")
    export.add_argument("--artifacts", default=None, metavar="DIR",
                        help="artifact directory (its training_model.onnx and eval_model.onnx)")
    export.add_argument("--checkpoint", required=True, help="the checkpoint with the trained parameters")
    export.add_argument("--training-model", default=None, help="training_model.onnx (default: in --artifacts)")
    export.add_argument("--eval-model", default=None, help="eval_model.onnx (default: in --artifacts)")
    export.add_argument("--outputs", "--output-names", dest="output_names", type=_names, action="extend",
                        default=None, metavar="NAMES",
                        help="graph outputs to keep, separated by commas or repeated (default: output)")
    export.add_argument("-o", "--output", dest="out_option", default=None, metavar="OUT",
                        help="where to write the inference model")
    export.add_argument("out", nargs="?", default=None, help="the same as -o")
    return parser


def _regular_file(path: str, what: str) -> None:
    """Refuses what is not a readable regular file (a FIFO would block the reader forever)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise _UsageError(f"{what} {path!r}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise _UsageError(f"{what} {path!r} is not a regular file")


def _output_file(path: str, what: str) -> None:
    if os.path.isdir(path):
        raise _UsageError(f"{what} {path!r} is a directory; give a file path")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise _UsageError(f"{what} {path!r}: directory {parent!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise _UsageError(f"{what} {path!r}: directory {parent!r} is not writable")


def _output_dir(path: str, what: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise _UsageError(f"{what} {path!r} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise _UsageError(f"{what} {path!r}: cannot create the directory: {e.strerror}") from None
    if not os.access(path, os.W_OK):
        raise _UsageError(f"{what} {path!r} is not writable")


def _artifact_dir(path: str, what: str, need: Sequence[str]) -> dict:
    """The artifact files of a directory, by role; refuses a missing directory or file."""
    from jaxort.train_loop import ARTIFACT_FILES

    if not os.path.isdir(path):
        raise _UsageError(f"{what} {path!r} is not a directory" if os.path.exists(path)
                          else f"{what} {path!r}: No such file or directory")
    files = {role: os.path.join(path, name) for role, name in ARTIFACT_FILES.items()}
    for role in need:
        _regular_file(files[role], f"{what} {path!r}: {ARTIFACT_FILES[role]}")
    return {role: p for role, p in files.items() if os.path.isfile(p)}


def _device(name: str) -> None:
    from jaxort.graph import resolve_device

    try:
        resolve_device(name)
    except ValueError as exc:
        raise _UsageError(f"--device: {exc}") from None


def _run_train(args) -> int:
    from jaxort.train_loop import run_training

    _artifact_dir(args.artifacts, "--artifacts",
                  ["training_model", "optimizer_model"] + ([] if args.resume else ["checkpoint"]))
    for path, what in ((args.data, "--data"), (args.eval_data, "--eval-data")):
        if path is not None and not os.path.isdir(path):  # an .npz, or a directory of .npy files
            _regular_file(path, what)
    if args.resume is not None:
        _regular_file(args.resume, "--resume")
    _output_file(args.checkpoint_out, "--checkpoint-out")
    for path, what in ((args.metrics, "--metrics"), (args.plot, "--plot")):
        if path is not None:
            _output_file(path, what)
    _device(args.device)
    result = run_training(
        args.artifacts, args.data, epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
        schedule=args.schedule, warmup_steps=args.warmup_steps, eval_data=args.eval_data,
        eval_every=args.eval_every, checkpoint_out=args.checkpoint_out, every=args.every, resume=args.resume,
        seed=args.seed, shuffle=args.shuffle, device=args.device, metrics=args.metrics, plot=args.plot,
        stop_after=args.stop_after, progress=args.progress)
    return 130 if result["interrupted"] else 0


def _run_generate(args) -> None:
    from jaxort.errors import NoGradientGraphWarning
    from jaxort.training.artifacts import LossType, OptimType, float_initializers, generate_artifacts

    _regular_file(args.model, "model")
    _output_dir(args.out, "--out")
    requires_grad = args.requires_grad
    if requires_grad is None:
        requires_grad = float_initializers(args.model, exclude=args.frozen or ())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NoGradientGraphWarning)
        arts = generate_artifacts(
            args.model, requires_grad=requires_grad, frozen_params=args.frozen,
            loss=LossType[args.loss], optimizer=OptimType[args.optimizer], artifact_directory=args.out,
            additional_output_names=args.additional_outputs, nominal_checkpoint=args.nominal_checkpoint,
            gradient_graph=args.gradient_graph)
    for w in caught:
        if issubclass(w.category, NoGradientGraphWarning):
            print(f"warning: jaxort-only artifacts, ONNX Runtime cannot train them: {w.message.reason} "
                  "(--gradient-graph makes this an error)", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    for path in (arts.training_model, arts.eval_model, arts.optimizer_model, arts.checkpoint,
                 arts.nominal_checkpoint):
        if path is not None:
            print(f"wrote {path}")


def _run_export(args) -> None:
    from jaxort import session

    out = args.out_option or args.out
    if args.out_option and args.out:
        raise _UsageError(f"give the output once: -o {args.out_option!r} and {args.out!r}")
    if out is None:
        raise _UsageError("give the output path: -o OUT")
    files = {}
    if args.artifacts is not None:
        files = _artifact_dir(args.artifacts, "--artifacts", [])
    training_model = args.training_model or files.get("training_model")
    eval_model = args.eval_model or files.get("eval_model")
    if training_model is None or eval_model is None:
        missing = [flag for flag, value in (("--training-model", training_model), ("--eval-model", eval_model))
                   if value is None]
        raise _UsageError(f"give {' and '.join(missing)} (or --artifacts DIR holding "
                          "training_model.onnx and eval_model.onnx)")
    for path, what in ((args.checkpoint, "--checkpoint"), (training_model, "--training-model"),
                       (eval_model, "--eval-model")):
        _regular_file(path, what)
    _output_file(out, "output")
    names = args.output_names or ["output"]
    state = session.load_checkpoint(args.checkpoint)
    with session.TrainingSession(state, training_model, eval_model) as training:
        training.export_model_for_inferencing(out, names)
    print(f"wrote {out} (outputs {names})")


def _run(args) -> int:
    if args.command == "demo":
        from jaxort.demo import run_demo

        if args.out is not None:
            _output_dir(args.out, "--out")
        run_demo(args.out, epochs=args.epochs, seed=args.seed)
    elif args.command == "train":
        return _run_train(args)
    elif args.command == "generate-artifacts":
        _run_generate(args)
    elif args.command in ("inspect", "summary"):
        from jaxort.inspection import describe, render

        if os.path.isdir(args.path):
            _artifact_dir(args.path, "path", [])
        else:
            _regular_file(args.path, "path" if args.command == "inspect" else "checkpoint")
        info = describe(args.path)
        print(json.dumps(info, indent=1) if args.json else render(info))
    else:
        _run_export(args)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line; returns the exit status.

    Args:
      argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
      0 on success; 1 when the command fails (a jaxort error, a file that
      cannot be written, anything unexpected), with one line on stderr; 2 on
      bad usage (argparse's message, or a bad path or count); 130 when
      ``train`` was stopped by Ctrl-C (after saving its checkpoint).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    from jaxort.errors import JaxortError

    try:
        status = _run(args)
    except KeyboardInterrupt as exc:
        return _fail(args, exc, f"jaxort {args.command}: interrupted", 130)
    except _UsageError as exc:
        return _fail(args, exc, f"jaxort {args.command}: error: {exc}", 2)
    except JaxortError as exc:
        return _fail(args, exc, f"jaxort {args.command}: {exc}", 1)
    except OSError as exc:
        return _fail(args, exc, f"jaxort {args.command}: {exc.strerror or exc}"
                     + (f": {exc.filename!r}" if exc.filename else ""), 1)
    except Exception as exc:  # noqa: BLE001  one line for the user; --verbose for the traceback
        return _fail(args, exc, f"jaxort {args.command}: unexpected {type(exc).__name__}: {exc} "
                     "(run with --verbose for the traceback)", 1)
    return status


def _fail(args, exc: BaseException, line: str, status: int) -> int:
    if args.verbose:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(" ".join(line.split("\n")), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
