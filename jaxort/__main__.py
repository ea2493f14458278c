"""``python -m jaxort``: the same command line as the ``jaxort`` script (:mod:`jaxort.cli`)."""

import sys

from jaxort.cli import main

if __name__ == "__main__":
    sys.exit(main())
