"""``make test-large``'s phases at a small size, in ``make test``: the worker and its reference stay right.

At 256 x 256 the files stay under every threshold (no external data), so this
checks the phases' math (numpy's float64 AdamW on a column slice, the first
loss, onnxruntime on the export) and keeps the large run from rotting between
the runs of its own tier.
"""

from __future__ import annotations

import pathlib

from _workers import run_worker

WORKER = pathlib.Path(__file__).with_name("large_worker.py")


def _phase(phase: str, directory: pathlib.Path) -> dict:
    return run_worker(WORKER, phase, directory, "--dim", 256)


def test_the_large_phases_at_a_small_size(tmp_path):
    assert _phase("make", tmp_path)["weights_bytes"] == 4 * 256 * 256 * 4
    assert _phase("artifacts", tmp_path)["files"]["checkpoint"] > 4 * 256 * 256 * 4
    trained = _phase("train", tmp_path)
    assert trained["max_param_diff"] < 1e-6
    assert abs(trained["losses"][0] - trained["first_loss_ref"]) <= 1e-5 * trained["first_loss_ref"]
    assert trained["reload_equal"] and trained["reload_step"] == 3
    ran = _phase("ort_run", tmp_path)
    assert ran["max_diff"] <= 1e-5 * ran["scale"]
