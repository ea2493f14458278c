"""TrainProgram.train_steps: several train_and_update steps in one compiled call, against ORT's golden run."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxort.errors import InputError, TrainingError
from jaxort.training import make_mesh, set_learning_rate, shard
from jaxort.training.packing import pack, unpack


def _golden_run(golden):
    """ORT's golden mlp_adamw run: one train step, optimizer step and lazy reset per batch at lr 0.01."""
    program, start, batches, folder = golden("mlp_adamw")
    traj = json.loads((folder / "trajectory.json").read_text())
    steps = traj["steps"]
    assert all(len(s["train_batches"]) == 1 for s in steps)
    order = [s["train_batches"][0] for s in steps]
    xs = np.stack([batches["train::input"][i] for i in order])
    ys = np.stack([batches["train::labels"][i] for i in order])
    losses = np.array([s["train_losses"][0] for s in steps], np.float32)
    state = set_learning_rate(program.init_state(start), steps[0]["lr"])
    return program, state, xs, ys, losses, dict(np.load(folder / "params_after.npz"))


@pytest.mark.parametrize("packed", [False, True], ids=["state", "packed"])
def test_train_steps_give_ort_s_losses_and_parameters(golden, packed):
    program, state, xs, ys, losses, params_after = _golden_run(golden)
    state = pack(state) if packed else state
    state, (got,) = program.train_steps(state, xs, ys)
    assert got.shape == losses.shape
    np.testing.assert_allclose(np.asarray(got), losses, rtol=1e-5)
    params = unpack(state).params
    for name, want in params_after.items():
        np.testing.assert_allclose(np.asarray(params[name]), want, rtol=1e-4, atol=1e-6, err_msg=name)
    assert int(unpack(state).step) == len(losses)
    # Two calls of three steps continue where the first left off, compiled once.
    program2, state2, *_ = _golden_run(golden)
    state2 = pack(state2) if packed else state2
    state2, (first,) = program2.train_steps(state2, xs[:3], ys[:3])
    state2, (second,) = program2.train_steps(state2, xs[3:], ys[3:])
    np.testing.assert_allclose(np.concatenate([first, second]), losses, rtol=1e-5)
    assert program2.trace_count("train_steps") == 1


def test_train_steps_refuse_what_one_step_refuses(golden):
    program, state, xs, ys, _, _ = _golden_run(golden)
    with pytest.raises(InputError, match=r"leading axis .* 'input' \[6, 8, 20\], 'labels' \[5, 8\]"):
        program.train_steps(state, xs, ys[:5])
    with pytest.raises(InputError, match="nonzero length"):
        program.train_steps(state, xs[:0], ys[:0])
    with pytest.raises(InputError, match="input"):
        program.train_steps(state, xs[:, :, :3], ys)
    bad = ys.copy()
    bad[4, 2] = 5  # the MLP has 5 classes: out of range in the fifth batch only
    with pytest.raises(InputError, match="out of range"):
        program.train_steps(state, xs, bad)


def test_train_steps_run_on_one_device(golden):
    program, state, xs, ys, _, _ = _golden_run(golden)
    mesh = make_mesh(devices=jax.devices()[:1])
    with pytest.raises(TrainingError, match="one device"):
        program.train_steps(shard(state, mesh), xs, ys)
