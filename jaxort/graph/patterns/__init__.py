"""Patterns: subgraphs (or single ops) with a faster implementation, one module per family.

Each module registers matchers with :func:`register_pattern`; every public
module here is imported on first use, as in ``jaxort/graph/ops``. ``JaxGraph``
runs the matching pass (:func:`plan`) once per
preparation, after slicing and before handler lookup, unless it is built with
``fuse=False``. Modules here may import the op helpers of
``jaxort.graph.numerics``, never the tracer.
"""

import importlib
import pkgutil

from jaxort.graph.patterns._match import (
    GraphView,
    Group,
    Match,
    Pattern,
    is_op,
    plan,
    register_pattern,
    registered_patterns,
)

__all__ = ["GraphView", "Group", "Match", "Pattern", "is_op", "plan", "register_pattern",
           "registered_patterns"]

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
