"""Testing helpers for users of jaxort: an op test harness, conformance runs, hypothesis strategies.

``jaxort.testing`` itself holds the harness (:mod:`jaxort.testing.harness`):
build a one-node model (:class:`NodeCase`), run it through ONNX's reference
evaluator and through jaxort (jitted, strict dtype promotion, 64-bit types),
and compare outputs against one per-dtype tolerance table. It needs numpy,
onnx and ml_dtypes; JAX loads when jaxort runs.

``jaxort.testing.conformance`` runs ONNX's backend node test cases through
``jaxort.backend``; ``jaxort.testing.strategies`` has hypothesis strategies
(it needs hypothesis, a test extra).
"""

from jaxort.testing.harness import (
    TOLERANCES,
    NodeCase,
    assert_outputs_match,
    check_node,
    default_tolerance,
    node_model,
    run_jaxort,
    run_reference,
)

__all__ = [
    "NodeCase",
    "TOLERANCES",
    "assert_outputs_match",
    "check_node",
    "default_tolerance",
    "node_model",
    "run_jaxort",
    "run_reference",
]
