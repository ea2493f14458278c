"""Shared fixtures of the jaxort.api tests: artifacts from ONNX Runtime and from jaxort.

tests/fixtures/ort_api/<case>/ holds artifacts written by onnxruntime-training
1.19.2 and what ORT's own ``onnxruntime.training.api`` returned on them
(tools/make_api_fixtures.py). The ``artifacts`` fixture gives, for each case,
either those ORT files or files jaxort's ``generate_artifacts`` writes from the
same forward model, so every test runs on both and compares with ORT's
numbers or with a numpy reference.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import numpy as np
import pytest

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
ORT_API = FIXTURES / "ort_api"
GOLDEN = FIXTURES / "golden"
CASES = ("frozen_sgd", "two_outputs_adamw")
SOURCES = ("ort", "jaxort")


@dataclass
class Artifacts:
    """One set of artifacts plus ORT's recorded results for its case."""

    case: str
    source: str
    root: pathlib.Path
    info: dict
    expected: dict
    batches: dict
    nominal: bool

    def path(self, name: str) -> str:
        return str(self.root / name)

    @property
    def train(self) -> str:
        return self.path("training_model.onnx")

    @property
    def eval(self) -> str:
        return self.path("eval_model.onnx")

    @property
    def optimizer(self) -> str:
        return self.path("optimizer_model.onnx")

    @property
    def checkpoint(self) -> str:
        return self.path("checkpoint")

    def batch(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.batches["train::input"][index], self.batches["train::labels"][index]

    def eval_batch(self) -> tuple[np.ndarray, np.ndarray]:
        return self.batches["eval::input"], self.batches["eval::labels"]


def _load_case(case: str) -> tuple[dict, dict, dict]:
    root = ORT_API / case
    info = json.loads((root / "expected.json").read_text())
    with np.load(root / "expected.npz") as f:
        expected = {k: f[k] for k in f.files}
    with np.load(root / "batches.npz") as f:
        batches = {k: f[k] for k in f.files}
    return info, expected, batches


def _generate(case: str, info: dict, out: pathlib.Path) -> None:
    import onnx

    from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

    model = onnx.load(str(ORT_API / case / "model.onnx"))
    params = [t.name for t in model.graph.initializer]
    frozen = list(info["frozen_params"])
    generate_artifacts(
        model,
        requires_grad=[p for p in params if p not in frozen],
        frozen_params=frozen,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType[info["optimizer"]],
        artifact_directory=str(out),
        nominal_checkpoint="nominal" in info,
        additional_output_names=info.get("additional_output_names"),
    )


@pytest.fixture(scope="session")
def _jaxort_dirs(tmp_path_factory):
    made = {}

    def get(case: str) -> pathlib.Path:
        if case not in made:
            out = tmp_path_factory.mktemp(f"jaxort_{case}")
            _generate(case, _load_case(case)[0], out)
            made[case] = out
        return made[case]

    return get


@pytest.fixture(params=[(c, s) for c in CASES for s in SOURCES], ids=lambda p: f"{p[0]}-{p[1]}")
def artifacts(request, _jaxort_dirs) -> Artifacts:
    case, source = request.param
    return make_artifacts(case, source, _jaxort_dirs)


@pytest.fixture(params=SOURCES)
def frozen_artifacts(request, _jaxort_dirs) -> Artifacts:
    """The case with a frozen first layer (SGD), from each source."""
    return make_artifacts("frozen_sgd", request.param, _jaxort_dirs)


@pytest.fixture
def make(_jaxort_dirs):
    """``make(case, source)`` -> Artifacts."""
    return lambda case, source: make_artifacts(case, source, _jaxort_dirs)


def make_artifacts(case: str, source: str, jaxort_dirs) -> Artifacts:
    info, expected, batches = _load_case(case)
    root = ORT_API / case if source == "ort" else jaxort_dirs(case)
    return Artifacts(case, source, root, info, expected, batches, "nominal" in info)


# numpy references --------------------------------------------------------------


def mlp_forward(params: dict, x: np.ndarray) -> np.ndarray:
    """The fixtures' MLP (MatMul, Add, Relu, MatMul, Add) in float64."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    h = np.maximum(x.astype(np.float64) @ p["fc1.weight"] + p["fc1.bias"], 0.0)
    return h @ p["fc2.weight"] + p["fc2.bias"]


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean softmax cross-entropy (ORT's LossType.CrossEntropyLoss) in float64."""
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), labels].mean())


def cross_entropy_grads(params: dict, x: np.ndarray, labels: np.ndarray) -> dict:
    """Gradients of the mean cross-entropy w.r.t. the MLP parameters, float64."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    x = x.astype(np.float64)
    pre = x @ p["fc1.weight"] + p["fc1.bias"]
    h = np.maximum(pre, 0.0)
    logits = h @ p["fc2.weight"] + p["fc2.bias"]
    z = logits - logits.max(axis=1, keepdims=True)
    soft = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    onehot = np.eye(logits.shape[1])[labels]
    d_logits = (soft - onehot) / len(labels)
    d_h = d_logits @ p["fc2.weight"].T * (pre > 0)
    return {
        "fc2.weight": h.T @ d_logits,
        "fc2.bias": d_logits.sum(axis=0),
        "fc1.weight": x.T @ d_h,
        "fc1.bias": d_h.sum(axis=0),
    }
