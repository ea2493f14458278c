"""Shared paths and helpers for the checkpoint tests (golden ONNX Runtime files)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from jaxort.checkpoint import NominalTensor

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = FIXTURES / "golden"
ORT_FILES = FIXTURES / "checkpoint"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "manifest.json").exists())
AFTER = ("ckpt_after_with_opt", "ckpt_after_no_opt")
ALL_GOLDEN_FILES = sorted(
    [str(GOLDEN / c / f) for c in CASES for f in ("checkpoint", *AFTER)]
    + [str(GOLDEN / "mlp_adamw" / "nominal_checkpoint")]
    + [str(p) for p in ORT_FILES.glob("*.ckpt") if not p.name.startswith("ext_")]
)


def manifest(case: str) -> dict:
    return json.loads((GOLDEN / case / "manifest.json").read_text())


def assert_tensor_equal(a, b, what: str = "") -> None:
    """Bit-exact equality of two arrays: dtype, shape and bytes."""
    if isinstance(a, NominalTensor) or isinstance(b, NominalTensor):
        assert a == b, what
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    if a.dtype == object:
        # ONNX strings are bytes: loading decodes valid UTF-8 to str.
        def enc(x):
            return [v.encode("utf-8") if isinstance(v, str) else v for v in x.reshape(-1).tolist()]

        assert enc(a) == enc(b), what
    else:
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), what


def assert_state_equal(x, y) -> None:
    """Two Checkpoints hold the same values (order of dicts ignored)."""
    assert set(x.trainable) == set(y.trainable)
    assert set(x.frozen) == set(y.frozen)
    for n in x.trainable:
        assert_tensor_equal(x.trainable[n], y.trainable[n], n)
    for n in x.frozen:
        assert_tensor_equal(x.frozen[n], y.frozen[n], n)
    assert x.properties == y.properties
    for k in x.properties:
        assert type(x.properties[k]) is type(y.properties[k])
    assert x.is_nominal == y.is_nominal
    gx = {g.name: g for g in x.optimizer_groups}
    gy = {g.name: g for g in y.optimizer_groups}
    assert set(gx) == set(gy)
    for name, g in gx.items():
        h = gy[name]
        assert (g.step, g.initial_learning_rate) == (h.step, h.initial_learning_rate)
        assert set(g.states) == set(h.states)
        for p in g.states:
            assert set(g.states[p]) == set(h.states[p])
            for m in g.states[p]:
                assert_tensor_equal(g.states[p][m], h.states[p][m], f"{name}/{p}/{m}")


@pytest.fixture(params=ALL_GOLDEN_FILES, ids=lambda p: "/".join(pathlib.Path(p).parts[-2:]))
def golden_file(request) -> str:
    return request.param
