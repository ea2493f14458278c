"""Testing helpers for users of jaxort: an op test harness, conformance runs, hypothesis strategies.

``jaxort.testing`` itself holds the harness (:mod:`jaxort.testing.harness`):
build a one-node model (:class:`NodeCase`), run it through ONNX's reference
evaluator and through jaxort (jitted, strict dtype promotion, 64-bit types),
and compare outputs against one per-dtype tolerance table. It needs numpy,
onnx and ml_dtypes; JAX loads when jaxort runs.

Checkers (:mod:`jaxort.testing.checks`): :func:`assert_matches_reference`
(against ONNX's reference evaluator or ONNX Runtime), :func:`check_gradients`
(finite differences in float64), :func:`assert_checkpoint_roundtrip`,
:func:`assert_trains_like`; a failing check saves the model it failed on.

Hypothesis strategies (they need hypothesis, a test extra, and load on first
use): :func:`onnx_models`, :func:`model_inputs`, :func:`tensors`
(:mod:`jaxort.testing.models`), :func:`checkpoint_states`,
:func:`training_artifacts` (:mod:`jaxort.testing.states`), and the one-node
and MLP strategies of :mod:`jaxort.testing.strategies`. Settings profiles
for suites: :func:`register_profiles`; what a run reached:
``python -m jaxort.testing.coverage``.

``jaxort.testing.conformance`` runs ONNX's backend node test cases through
``jaxort.backend``.
"""

import importlib

from jaxort.testing.checks import (
    assert_checkpoint_roundtrip,
    assert_matches_reference,
    assert_trains_like,
    check_gradients,
    load_failure,
    record_trajectory,
    run_onnxruntime,
    save_failure,
    to_float64,
)

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

# Names that need hypothesis, imported when first used.
_LAZY = {
    "onnx_models": "models", "model_inputs": "models", "tensors": "models",
    "OP_FAMILIES": "models", "DIFFERENTIABLE_OPS": "models", "INPUT_DOMAINS": "models",
    "checkpoint_states": "states", "training_artifacts": "states", "TrainingCase": "states",
    "register_profiles": "profiles", "Coverage": "coverage",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"jaxort.testing.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'jaxort.testing' has no attribute {name!r}")


__all__ = [
    "Coverage",
    "DIFFERENTIABLE_OPS",
    "INPUT_DOMAINS",
    "NodeCase",
    "OP_FAMILIES",
    "TOLERANCES",
    "TrainingCase",
    "assert_checkpoint_roundtrip",
    "assert_matches_reference",
    "assert_outputs_match",
    "assert_trains_like",
    "check_gradients",
    "checkpoint_states",
    "load_failure",
    "model_inputs",
    "onnx_models",
    "record_trajectory",
    "register_profiles",
    "run_onnxruntime",
    "save_failure",
    "tensors",
    "to_float64",
    "training_artifacts",
    "check_node",
    "default_tolerance",
    "node_model",
    "run_jaxort",
    "run_reference",
]
