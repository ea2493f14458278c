"""The ``jaxort`` command line.

Commands:

- ``jaxort demo [--out DIR] [--epochs N] [--seed S]``: the digits demo.
- ``jaxort summary CHECKPOINT``: describe an ONNX Runtime Training checkpoint
  (parameters, optimizer state, properties, sizes).
- ``jaxort export --checkpoint C --training-model T --eval-model E
  [--output-names N ...] OUT``: write the inference model for a checkpoint,
  as ``Module.export_model_for_inferencing`` does.

``python -m jaxort`` runs the same command line. A facade: it imports the
layers below and nothing imports it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxort", description="Train ONNX models with JAX, "
                                     "compatible with ONNX Runtime Training artifacts and checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train the digits classifier through jaxort.api",
                               description="Train an MLP on the 8x8 UCI digits through jaxort.api and "
                                           "report held-out accuracy.")
    demo.add_argument("--out", default=None,
                      help="directory for the artifacts, checkpoint and inference model "
                           "(default: a new temporary directory)")
    demo.add_argument("--epochs", type=int, default=12, help="passes over the training split")
    demo.add_argument("--seed", type=int, default=0, help="seed of weights, split and shuffling")
    summary = commands.add_parser("summary", help="describe a checkpoint file")
    summary.add_argument("checkpoint")
    export = commands.add_parser("export", help="write the inference model of a checkpoint")
    export.add_argument("--checkpoint", required=True, help="the checkpoint with the trained parameters")
    export.add_argument("--training-model", required=True, help="training_model.onnx")
    export.add_argument("--eval-model", required=True, help="eval_model.onnx")
    export.add_argument("--output-names", nargs="+", default=["output"],
                        help="graph outputs to keep (default: output)")
    export.add_argument("out", help="where to write the inference model")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line; returns the exit status.

    Args:
      argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
      0 on success, 1 on a jaxort error (its message goes to stderr), 2 on
      bad usage.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    from jaxort.errors import JaxortError

    try:
        if args.command == "demo":
            from jaxort.demo import run_demo

            run_demo(args.out, epochs=args.epochs, seed=args.seed)
        elif args.command == "summary":
            from jaxort import checkpoint

            print(checkpoint.summary(args.checkpoint))
        else:
            from jaxort import session

            state = session.load_checkpoint(args.checkpoint)
            with session.TrainingSession(state, args.training_model, args.eval_model) as training:
                training.export_model_for_inferencing(args.out, args.output_names)
            print(f"wrote {args.out} (outputs {args.output_names})")
    except JaxortError as exc:
        print(f"jaxort {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
