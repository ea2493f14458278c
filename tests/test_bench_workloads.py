"""The benchmark suite's hand-written networks compute what its ONNX workloads compute.

The suite compares jaxort with hand-written JAX (and PyTorch) versions of the
workloads; they are only a fair baseline if they are the same networks. Each
one's logits on the workload's first batch must equal those of ONNX's own
reference evaluator on the workload's model, with the same weights.
"""

from __future__ import annotations

import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def workloads():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import workloads
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return workloads


HAND_WRITTEN = ["W1", "W3", "W4", "W5", "W8", "W9"]  # W2 is W1's network, larger


def _first_batch_and_reference(workloads, name):
    w = workloads.build(name)
    x, _ = w.batches[0]
    return w, x, ReferenceEvaluator(w.model).run(None, {"input": x})[0]


@pytest.mark.parametrize("name", HAND_WRITTEN)
def test_hand_written_jax_matches_the_onnx_reference(workloads, name):
    w, x, expected = _first_batch_and_reference(workloads, name)
    logits = workloads.jax_logits(w)({k: jnp.asarray(v) for k, v in w.params.items()}, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", HAND_WRITTEN)
def test_pytorch_version_matches_the_onnx_reference(workloads, name):
    torch = pytest.importorskip("torch")
    w, x, expected = _first_batch_and_reference(workloads, name)
    params = {k: torch.tensor(v) for k, v in w.params.items()}
    with torch.no_grad():
        out = workloads.torch_logits(w)(params, torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
