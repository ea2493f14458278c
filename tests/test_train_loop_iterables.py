"""``jaxort.train_loop.run_training`` on an iterable of batches: ORT's golden trajectory, several
epochs, resuming at the exact batch, and bad batches named (the .npz and .npy paths are
tested through the command line in tests/test_train_cli.py)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from jaxort import checkpoint as ckpt
from jaxort.errors import InputError
from jaxort.train_loop import read_metrics, run_training

GOLDEN = pathlib.Path(__file__).resolve().parent / "fixtures" / "golden" / "mlp_adamw"


def _golden_batches():
    with np.load(GOLDEN / "batches.npz") as f:
        return [(x, y) for x, y in zip(f["train::input"], f["train::labels"])]


def _ort_losses():
    calls = json.loads((GOLDEN / "trajectory.json").read_text())["calls"]
    return [c["result"]["loss"] for c in calls if c["call"] == "module.__call__" and c.get("mode") == "train"]


def _losses(result):
    return [r["loss"] for r in read_metrics(result["metrics"]) if r["event"] == "train"]


def _run(data, out, **options):
    options.setdefault("learning_rate", 0.01)
    return run_training(GOLDEN, data, checkpoint_out=out, progress=False, log=lambda line: None, **options)


def test_a_generator_of_batches_trains_ort_s_golden_trajectory(tmp_path):
    batches = _golden_batches()
    result = _run((b for b in batches), tmp_path / "ck")  # a one-shot iterator, no len(): until it ends
    np.testing.assert_allclose(_losses(result), _ort_losses(), rtol=1e-6)
    reference = np.load(GOLDEN / "params_after.npz")
    for name in reference.files:
        np.testing.assert_allclose(result["params"][name], reference[name], rtol=1e-5, atol=1e-6)
    assert result["steps"] == len(batches)
    # Mappings of input name to array work the same.
    named = _run([{"input": x, "labels": y} for x, y in batches], tmp_path / "named")
    assert _losses(named) == _losses(result)


def test_epochs_of_a_list_and_an_exact_resume(tmp_path):
    batches = _golden_batches()
    full = _run(batches, tmp_path / "full", epochs=2, schedule="linear")
    assert len(_losses(full)) == 2 * len(batches)
    part = _run(batches, tmp_path / "part", epochs=2, schedule="linear", stop_after=8)
    saved = ckpt.load(part["checkpoint"])
    assert saved.properties["jaxort.train.step"] == 8 and saved.properties["jaxort.train.epoch"] == 1
    assert saved.properties["jaxort.train.batch"] == 2
    resumed = _run(batches, tmp_path / "part", epochs=2, schedule="linear", resume=part["checkpoint"])
    for name, value in full["params"].items():
        np.testing.assert_array_equal(resumed["params"][name], value)
    assert _losses(resumed) == _losses(full)


def test_eval_data_is_evaluated_in_batch_size_batches(tmp_path):
    batches = _golden_batches()
    with np.load(GOLDEN / "batches.npz") as f:
        eval_x, eval_y = f["eval::input"], f["eval::labels"]
    eval_path = tmp_path / "eval.npz"
    np.savez(eval_path, input=eval_x, labels=eval_y)
    calls = json.loads((GOLDEN / "trajectory.json").read_text())["calls"]
    ort_eval = [c["result"]["loss"] for c in calls if c["call"] == "module.__call__" and c.get("mode") == "eval"]
    result = _run(batches, tmp_path / "ck", eval_data=eval_path, batch_size=len(eval_x))
    assert result["eval_loss"] == pytest.approx(ort_eval[-1], rel=1e-5)


def test_steps_per_epoch_takes_the_first_batches_of_each_pass(tmp_path):
    batches = _golden_batches()
    result = _run(batches, tmp_path / "ck", epochs=2, steps_per_epoch=2)
    three = _run(batches[:2] + batches[:2], tmp_path / "ref")
    assert _losses(result) == _losses(three)


def test_bad_iterables_and_batches_are_named(tmp_path):
    batches = _golden_batches()
    with pytest.raises(InputError, match="an iterator, which can be read once: epochs must be 1"):
        _run(iter(batches), tmp_path / "a", epochs=2)
    with pytest.raises(InputError, match=r"has no len\(\): pass steps_per_epoch .* 'linear' schedule"):
        _run((b for b in batches), tmp_path / "b", schedule="linear")
    with pytest.raises(InputError, match=r"batch 2 of data must be 2 arrays \['input', 'labels'\].*got 1 values"):
        _run([batches[0], batches[1][:1]], tmp_path / "c")
    with pytest.raises(InputError, match=r"batch 1 of data has no \['labels'\]"):
        _run([{"input": batches[0][0]}], tmp_path / "d")
    part = _run(batches, tmp_path / "e", stop_after=4)
    with pytest.raises(InputError, match="data ended after 2 batches of epoch 1, before batch 5"):
        _run((b for b in batches[:2]), tmp_path / "e", resume=part["checkpoint"])
    with pytest.raises(InputError, match=r"is at step 4, past the 2 steps of 1 epoch\(s\) of 2 batches"):
        _run(batches[:2], tmp_path / "e", resume=part["checkpoint"])
    with pytest.raises(InputError, match="or an iterable of batches; got int"):
        _run(3, tmp_path / "f")


def test_a_grain_dataset_resumes_from_its_own_saved_state(tmp_path):
    grain = pytest.importorskip("grain")
    from jaxort.train_loop import DATA_STATE

    batches = _golden_batches()
    read = []

    def dataset():
        def load(i):
            read.append(i)
            return batches[i]
        return grain.MapDataset.range(len(batches)).map(load)

    full = _run(dataset(), tmp_path / "full", epochs=2)
    part = _run(dataset(), tmp_path / "part", epochs=2, stop_after=10)
    saved = ckpt.load(part["checkpoint"])
    assert json.loads(saved.properties[DATA_STATE]) == {"next_index": 4}  # epoch 2, batch 4
    read.clear()
    resumed = _run(dataset(), tmp_path / "part", epochs=2, resume=part["checkpoint"])
    assert min(read) == 4  # set to its state: the batches before were not read again
    assert _losses(resumed) == _losses(full)
    for name, value in full["params"].items():
        np.testing.assert_array_equal(resumed["params"][name], value)
