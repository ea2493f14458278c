"""``python -m jaxort``: the demo, and the command line of :mod:`jaxort.cli`.

``python -m jaxort demo [--out DIR]`` trains the digits classifier (see
:mod:`jaxort.demo`). Any other command goes to ``jaxort.cli.main``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Optional, Sequence

_USAGE = "usage: python -m jaxort demo [--out DIR] [--epochs N]"


def _demo(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxort demo",
        description="Train an MLP on the 8x8 UCI digits through jaxort.api and report "
                    "held-out accuracy.")
    parser.add_argument("--out", default=None,
                        help="directory for the artifacts, checkpoint and inference model "
                             "(default: a new temporary directory)")
    parser.add_argument("--epochs", type=int, default=12, help="passes over the training split")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, split and shuffling")
    args = parser.parse_args(list(argv))
    from jaxort.demo import run_demo

    run_demo(args.out, epochs=args.epochs, seed=args.seed)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``python -m jaxort``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":
        return _demo(argv[1:])
    if importlib.util.find_spec("jaxort.cli") is None:
        print(_USAGE, file=sys.stderr)
        return 2
    from jaxort import cli

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
