"""A detection head whose outputs' lengths depend on the image (tests/fixtures/detection_head):
scores > 0.5 selected by NonZero, then NonMaxSuppression. Its host ops run first, on the
parameters and the image, and the graph compiles once per their output shapes."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest

from jaxort import backend
from jaxort.graph import JaxGraph

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "detection_head"
OUTPUTS = ("boxes", "scores", "keep_indices")


@pytest.fixture(scope="module")
def fixture():
    with np.load(ROOT / "inputs.npz") as f:
        images = [f[f"image_{i}"] for i in range(len(f.files))]
    with np.load(ROOT / "expected.npz") as f:
        expected = [{name: f[f"{name}_{i}"] for name in OUTPUTS} for i in range(len(images))]
    return images, expected


def _check(got, want):
    np.testing.assert_allclose(got[0], want["boxes"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], want["scores"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[2], want["keep_indices"])


def test_the_backend_matches_pytorch_and_compiles_once_per_count(fixture):
    images, expected = fixture
    rep = backend.prepare(str(ROOT / "model.onnx"))
    counts = {(len(w["scores"]), len(w["keep_indices"])) for w in expected}
    assert len(counts) == len(images)  # every image selects a different number of boxes
    for image, want in zip(images + images, expected + expected):
        _check(rep.run([image]), want)
    assert rep.mode == "hosted"
    assert rep._jitted._cache_size() == len(counts)  # the second pass compiles nothing


def test_a_user_s_own_jit_with_host_values(fixture):
    images, expected = fixture
    graph = JaxGraph(str(ROOT / "model.onnx"))
    assert sorted(n.op_type for n in graph.host.nodes) == ["NonMaxSuppression", "NonZero", "NonZero"]
    assert graph.host.params  # the selection reads the scores the backbone computes
    apply = jax.jit(graph.apply)
    for image, want in zip(images, expected):
        _check(apply(graph.params, image, host=graph.host_values(graph.params, image)), want)
