"""summary(): the inspect-checkpoint text."""

from __future__ import annotations

import numpy as np

import jaxort.checkpoint as ckpt

from .conftest import GOLDEN


def test_summary_of_a_golden_file():
    text = ckpt.summary(GOLDEN / "mlp_frozen" / "ckpt_after_with_opt")
    lines = text.splitlines()
    assert lines[0].startswith("file: ") and lines[0].endswith("(3.2 KiB)")
    assert lines[1] == "checkpoint: 4 parameters (2 trainable, 2 frozen), 421 elements, 1.6 KiB of parameter data"
    assert lines[2].split() == ["name", "role", "shape", "dtype", "bytes"]
    assert lines[3].split() == ["fc2.bias", "trainable", "[5]", "float32", "(FLOAT)", "20"]
    assert lines[5].split() == ["fc1.bias", "frozen", "[16]", "float32", "(FLOAT)", "64"]
    assert "optimizer groups: 1" in lines
    assert "  group0: step 6, initial learning rate 0.001, 2 parameters, states momentum0, momentum1 (680 B)" in lines
    assert lines[-4:] == ["properties: 3", "  epoch (int) = 6", "  best_metric (float) = 0.125", "  run_name (str) = 'golden-run'"]


def test_summary_of_states():
    nominal = ckpt.summary(GOLDEN / "mlp_adamw" / "nominal_checkpoint")
    assert "flags: nominal (names, shapes and types only)" in nominal
    s = ckpt.Checkpoint(trainable={"w": np.zeros((2, 3), np.float32)}, frozen={"s": np.array(["ab"], object)})
    text = ckpt.summary(s)
    assert text.splitlines()[0] == "checkpoint: 2 parameters (1 trainable, 1 frozen), 7 elements, 26 B of parameter data"
    assert "string (STRING)" in text and text.endswith("properties: 0")
