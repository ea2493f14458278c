"""CompiledSteps: each step traced for the platform of the state it is first called with."""

from __future__ import annotations

import jax
import numpy as np

from jaxort.graph import JaxGraph, lowering_platform, numerics


def test_compiled_steps_trace_for_their_state_s_platform(golden, monkeypatch):
    # cnn_bce (ORT's golden artifacts: Conv 1 -> 4, MaxPool) has CPU-only forms in both ops.
    calls = []
    real = numerics.lax.platform_dependent
    monkeypatch.setattr(numerics.lax, "platform_dependent", lambda *a, **k: calls.append(1) or real(*a, **k))
    program, start, batches, folder = golden("cnn_bce")
    state = program.init_state(start)
    state, (loss,) = program.train_step(state, batches["train::input"][0], batches["train::target"][0])
    # The first loss of ORT's run of the same artifacts (trajectory.json, step 0).
    np.testing.assert_allclose(float(loss), 0.7031580805778503, rtol=1e-5)
    assert calls == []
    # The same graph under a user's own jit, platform unknown: the choice is the compiler's.
    graph = JaxGraph(str(folder / "model.onnx"))
    (y,) = jax.jit(lambda p, x: graph.apply(p, x))(graph.params, batches["train::input"][0])
    assert calls
    with lowering_platform("cpu"):
        (y_cpu,) = jax.jit(lambda p, x: graph.apply(p, x))(graph.params, batches["train::input"][0])
    np.testing.assert_allclose(np.asarray(y_cpu), np.asarray(y), rtol=1e-6, atol=1e-6)
