"""The ``jaxort`` command line.

Commands:

- ``jaxort demo [--out DIR] [--epochs N] [--seed S]``: the digits demo.
- ``jaxort summary CHECKPOINT``: describe an ONNX Runtime Training checkpoint
  (parameters, optimizer state, properties, sizes).
- ``jaxort export --checkpoint C --training-model T --eval-model E
  [--output-names N[,N...]] OUT``: write the inference model for a
  checkpoint, as ``Module.export_model_for_inferencing`` does.

Every failure is one line on stderr and a non-zero exit status (1 for a
failed command, 2 for bad usage); ``--verbose`` adds the traceback. Arguments
are checked before any work: a path that is not a regular file, a missing
output directory, a directory where a file is to be written, a count that is
not positive.

``python -m jaxort`` runs the same command line. A facade: it imports the
layers below and nothing imports it.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import traceback
from typing import Optional, Sequence

__all__ = ["main"]


class _UsageError(Exception):
    """A bad argument found after parsing (exit status 2)."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _names(text: str) -> list:
    names = [n for n in text.split(",") if n]
    if not names:
        raise argparse.ArgumentTypeError(f"expected output names separated by commas, got {text!r}")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxort", description="Train ONNX models with JAX, "
                                     "compatible with ONNX Runtime Training artifacts and checkpoints.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", help="print the traceback of a failure")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", parents=[common], help="train the digits classifier through jaxort.api",
                               description="Train an MLP on the 8x8 UCI digits through jaxort.api and "
                                           "report held-out accuracy.")
    demo.add_argument("--out", default=None,
                      help="directory for the artifacts, checkpoint and inference model, created if "
                           "missing (default: a new temporary directory)")
    demo.add_argument("--epochs", type=_positive_int, default=12, help="passes over the training split")
    demo.add_argument("--seed", type=int, default=0, help="seed of weights, split and shuffling")
    summary = commands.add_parser("summary", parents=[common], help="describe a checkpoint file")
    summary.add_argument("checkpoint")
    export = commands.add_parser("export", parents=[common], help="write the inference model of a checkpoint")
    export.add_argument("--checkpoint", required=True, help="the checkpoint with the trained parameters")
    export.add_argument("--training-model", required=True, help="training_model.onnx")
    export.add_argument("--eval-model", required=True, help="eval_model.onnx")
    export.add_argument("--output-names", type=_names, action="extend", default=None,
                        help="graph outputs to keep, separated by commas or repeated (default: output)")
    export.add_argument("out", help="where to write the inference model")
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


def _run(args) -> None:
    if args.command == "demo":
        from jaxort.demo import run_demo

        if args.out is not None:
            _output_dir(args.out, "--out")
        run_demo(args.out, epochs=args.epochs, seed=args.seed)
    elif args.command == "summary":
        from jaxort import checkpoint

        _regular_file(args.checkpoint, "checkpoint")
        print(checkpoint.summary(args.checkpoint))
    else:
        from jaxort import session

        for path, what in ((args.checkpoint, "--checkpoint"), (args.training_model, "--training-model"),
                           (args.eval_model, "--eval-model")):
            _regular_file(path, what)
        _output_file(args.out, "output")
        names = args.output_names or ["output"]
        state = session.load_checkpoint(args.checkpoint)
        with session.TrainingSession(state, args.training_model, args.eval_model) as training:
            training.export_model_for_inferencing(args.out, names)
        print(f"wrote {args.out} (outputs {names})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line; returns the exit status.

    Args:
      argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
      0 on success; 1 when the command fails (a jaxort error, a file that
      cannot be written, anything unexpected), with one line on stderr; 2 on
      bad usage (argparse's message, or a bad path or count).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    from jaxort.errors import JaxortError

    try:
        _run(args)
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
    return 0


def _fail(args, exc: BaseException, line: str, status: int) -> int:
    if args.verbose:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(" ".join(line.split("\n")), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
