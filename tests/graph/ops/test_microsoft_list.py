"""The ops ONNX Runtime Training 1.19.2 can leave on the forward+loss path, and jaxort's registry.

The table is docs/ort-training-ops.md's: every op that ORT's generate_artifacts
(its pre-training graph optimizer, its onnxblock losses) can write outside the
gradient part of training_model.onnx or into eval_model.onnx, plus the fused
contrib ops and training ops a user model may already hold. The test fails when
a listed op has no handler, when a registered com.microsoft op is not listed,
or when an op ORT was seen to emit (tests/fixtures/training_ops/survey.json,
recorded by tools/make_training_op_fixtures.py) is missing from the table.
"""

import json
import pathlib

import pytest

import jaxort.graph.ops  # noqa: F401  (fills the registry)
from jaxort.graph import lookup, registered

# (domain, op_type, since): who emits it is in docs/ort-training-ops.md
ORT_TRAINING_GRAPH_OPS = [
    # pre-training rewrites of generate_artifacts (GeneratePreTrainingTransformers)
    ("com.microsoft", "BatchNormInternal", 1),      # BatchNormReplacement
    ("com.microsoft", "ConcatTraining", 1),         # ConcatReplacement (level 2)
    ("com.microsoft", "LSTMTraining", 1),           # LSTMReplacement
    ("com.microsoft", "GRUTraining", 1),            # GRUReplacement
    ("com.microsoft", "Gelu", 1),                   # GeluFusion
    ("com.microsoft", "BiasGelu", 1),               # BiasGeluFusion (CUDA builds, the PyPI wheel)
    ("com.microsoft", "FastGelu", 1),               # FastGeluFusion
    ("com.microsoft", "QuickGelu", 1),              # QuickGeluFusion
    ("", "LayerNormalization", 1),                  # LayerNormFusion (ORT's, ai.onnx domain)
    ("", "SimplifiedLayerNormalization", 1),        # SimplifiedLayerNormFusion (ai.onnx domain)
    ("com.microsoft", "SoftmaxCrossEntropyLossInternal", 1),  # SoftmaxCrossEntropyLossInternalFusion
    # ops a user model may hold (ORTModule exports, ORT-optimized inference models)
    ("com.microsoft", "NegativeLogLikelihoodLossInternal", 1),
    ("com.microsoft", "SoftmaxCrossEntropy", 1),
    ("", "SparseSoftmaxCrossEntropy", 9),
    ("com.microsoft", "SplitTraining", 1),
    ("com.microsoft", "ReduceSumTraining", 1),
    ("com.microsoft", "BiasDropout", 1),
    ("com.microsoft", "BitmaskDropout", 1),
    ("com.microsoft", "BitmaskBiasDropout", 1),
    ("com.microsoft", "BiasSoftmax", 1),
    ("com.microsoft", "ScaledSum", 1),             # ScaledSumFusion (DeBERTa's scaled additions)
    ("com.microsoft", "FusedMatMul", 1),
    ("com.microsoft", "TransposeMatMul", 1),
    ("com.microsoft", "FusedGemm", 1),
    ("com.microsoft", "FusedConv", 1),
    ("com.microsoft", "SkipLayerNormalization", 1),
    ("com.microsoft", "SkipSimplifiedLayerNormalization", 1),
]

# Gradient-only or session-only ops: in the gradient part of training_model.onnx
# (never on the backward slice of the user outputs) or never in artifacts at all.
NOT_ON_THE_FORWARD_PATH = {
    "InPlaceAccumulatorV2", "SoftmaxCrossEntropyLossGrad", "DropoutGrad", "BitmaskDropoutGrad",
    "GeluGrad", "QuickGeluGrad", "TanhGrad", "SigmoidGrad", "ReluGrad", "LeakyReluGrad", "ConvGrad",
    "BatchNormalizationGrad", "GatherGrad", "GatherNDGrad", "SliceGrad", "LSTMGrad", "GRUGrad", "Scale", "SoftmaxGrad_13",
    "LogSoftmaxGrad_13", "LayerNormalizationGrad", "YieldOp", "PassThrough", "RecordEvent", "WaitEvent",
}

_SURVEY = json.loads((pathlib.Path(__file__).parents[2] / "fixtures" / "training_ops"
                      / "survey.json").read_text())
_LISTED = {(d, op) for d, op, _ in ORT_TRAINING_GRAPH_OPS}
@pytest.mark.parametrize("domain,op,since", ORT_TRAINING_GRAPH_OPS,
                         ids=[f"{d or 'ai.onnx'}::{o}" for d, o, _ in ORT_TRAINING_GRAPH_OPS])
def test_listed_op_has_a_handler(domain, op, since):
    handler = lookup(domain, op, since)
    assert handler is not None, f"jaxort does not implement {domain or 'ai.onnx'}::{op}"
    assert handler.since == since, f"{op}: registered since {handler.since}, ORT's schema {since}"


# Gradient ops jaxort implements all the same: the gradient graphs it writes for ORT hold
# them (jaxort/training/artifacts/gradient/), and so its tests and users can run those.
GRADIENT_OPS_JAXORT_RUNS = {"LSTMGrad", "GRUGrad", "ConvGrad", "BatchNormalizationGrad", "ReluGrad", "LeakyReluGrad",
                            "SigmoidGrad", "QuickGeluGrad", "SoftmaxCrossEntropyLossGrad", "Scale", "TanhGrad",
                            "SoftmaxGrad_13", "LogSoftmaxGrad_13", "LayerNormalizationGrad", "GatherGrad",
                            "SliceGrad", "GatherNDGrad"}


def test_every_registered_microsoft_op_is_listed():
    assert GRADIENT_OPS_JAXORT_RUNS <= NOT_ON_THE_FORWARD_PATH
    extra = sorted({h.op_type for h in registered() if h.domain == "com.microsoft"}
                   - {op for d, op in _LISTED if d == "com.microsoft"} - GRADIENT_OPS_JAXORT_RUNS)
    assert not extra, f"com.microsoft ops registered but not in the list: {extra}"


def test_every_op_ort_emitted_in_the_survey_is_listed():
    seen = set()
    for case in _SURVEY.values():
        for key in case.get("training_forward", []) + case.get("eval", []) + \
                case.get("optimized", []):
            domain, op = key.split("::")
            seen.add(("" if domain == "ai.onnx" else domain, op))
    ms = {(d, op) for d, op in seen if d == "com.microsoft"}
    assert ms, "the survey saw no com.microsoft op"
    missing = sorted(ms - _LISTED)
    assert not missing, f"ORT emitted {missing} on the forward path; add them to the list"
    assert ("", "SimplifiedLayerNormalization") in seen  # ORT writes it in the ai.onnx domain
    # the standard ops it left there are jaxort's standard handlers
    for d, op in sorted(seen - ms):
        assert (d, op) in _LISTED or lookup(d, op, 17) is not None, op


def test_gradient_only_ops_never_on_the_surveyed_forward_path():
    for name, case in _SURVEY.items():
        forward = {k.split("::")[1] for k in case.get("training_forward", [])}
        assert not forward & NOT_ON_THE_FORWARD_PATH, name
        assert not {k for k in case.get("eval", []) if k.startswith("com.microsoft")}, name
