"""Replays ONNX Runtime Training golden runs through TrainProgram.

Each case in tests/fixtures/golden/ records the exact ORT 1.19.2 API calls of a
training run and their results. Replaying the same calls with jaxort on ORT's
own artifacts must give the recorded losses, gradients, learning rates,
parameters and checkpoint.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from jaxort import checkpoint as ckpt
from jaxort.training import (
    TrainProgram,
    apply_schedule,
    linear_lr_schedule,
    set_initial_learning_rate,
    set_learning_rate,
)

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"
CASES = ["mlp_adamw", "mlp_sgd", "mlp_frozen", "cnn_bce", "l1_gemm"]


def _tol(manifest, key):
    t = manifest["tolerances"][key]
    return {"rtol": t["rtol"], "atol": t["atol"]}


def _batch(npz, names, spec):
    if spec["split"] == "train":
        return [npz[f"train::{n}"][spec["index"]] for n in names]
    return [npz[f"eval::{n}"] for n in names]


def replay(case):
    """Replays ``case``; returns what the checks compare."""
    folder = GOLDEN / case
    traj = json.loads((folder / "trajectory.json").read_text())
    start = ckpt.load(folder / "checkpoint")
    program = TrainProgram.from_artifacts(
        folder / "training_model.onnx", folder / "eval_model.onnx",
        folder / "optimizer_model.onnx", checkpoint=start)
    batches = np.load(folder / "batches.npz")
    state = program.init_state(start)
    schedule = None
    record = {"losses": [], "eval_losses": [], "lr_used": [], "lr_after": [],
              "grads": [], "params": [], "program": program}
    for call in traj["calls"]:
        kind = call["call"]
        if kind == "Optimizer.__init__":
            record["lr_init"] = float(state.learning_rate)
            assert float(state.learning_rate) == pytest.approx(call["lr_after"], rel=1e-7)
        elif kind == "optimizer.set_learning_rate":
            state = set_learning_rate(state, call["args"]["learning_rate"])
        elif kind == "LinearLRScheduler.__init__":
            args = call["args"]
            # ORT 1.19.2's Python binding swaps the two counts: its effective warmup
            # is the value passed as total_step_count.
            schedule = linear_lr_schedule(args["initial_lr"], args["total_step_count"],
                                          args["warmup_step_count"])
            state = set_initial_learning_rate(state, args["initial_lr"])
            state = apply_schedule(state, schedule)
            record["lr_after"].append((float(state.learning_rate), call["lr_after"]))
        elif kind == "module.__call__":
            names = program.input_names if call["mode"] == "train" else program.eval_input_names
            inputs = _batch(batches, names, call["batch"])
            if call["mode"] == "train":
                state, outs = program.train_step(state, *inputs)
                record["losses"].append((float(outs[0]), call["result"]["loss"]))
            else:
                outs = program.eval_step(state, *inputs)
                record["eval_losses"].append((float(outs[0]), call["result"]["loss"]))
        elif kind == "optimizer.step":
            record["lr_used"].append((float(state.learning_rate), call["lr_used"]))
            record["grads"].append({n: np.asarray(g) for n, g in state.grads.items()})
            state = program.optimizer_step(state)
            assert int(state.step) == call["optimizer_step_count_after"]
            record["params"].append({n: np.asarray(p) for n, p in state.parameters.items()})
            record["lr_after"].append((float(state.learning_rate), call["lr_after"]))
        elif kind == "scheduler.step":
            state = apply_schedule(state, schedule)
            record["lr_after"].append((float(state.learning_rate), call["lr_after"]))
        elif kind == "module.lazy_reset_grad":
            state = program.lazy_reset_grad(state)
    record["state"] = state
    return record


@pytest.fixture(scope="module", params=CASES)
def replayed(request):
    return request.param, replay(request.param)


def _manifest(case):
    return json.loads((GOLDEN / case / "manifest.json").read_text())


def test_losses(replayed):
    case, rec = replayed
    m = _manifest(case)
    assert rec["losses"], "no train steps replayed"
    got, want = np.array(rec["losses"]).T
    np.testing.assert_allclose(got, want, **_tol(m, "train_loss"))
    got, want = np.array(rec["eval_losses"]).T
    np.testing.assert_allclose(got, want, **_tol(m, "eval_loss"))


def test_learning_rates_equal(replayed):
    case, rec = replayed
    assert rec["lr_init"] == np.float32(0.001)
    for got, want in rec["lr_used"] + rec["lr_after"]:
        assert np.float32(got) == np.float32(want)


def test_step_gradients_and_params(replayed):
    case, rec = replayed
    m = _manifest(case)
    snaps = np.load(GOLDEN / case / "step_snapshots.npz")
    for k, (grads, params) in enumerate(zip(rec["grads"], rec["params"]), start=1):
        for name, g in grads.items():
            np.testing.assert_allclose(g, snaps[f"step{k}::grad::{name}"],
                                       **_tol(m, "gradients"), err_msg=f"step {k} grad {name}")
        for name, p in params.items():
            np.testing.assert_allclose(p, snaps[f"step{k}::param::{name}"],
                                       **_tol(m, "params_after"), err_msg=f"step {k} param {name}")


def test_params_after(replayed):
    case, rec = replayed
    m = _manifest(case)
    want = np.load(GOLDEN / case / "params_after.npz")
    got = rec["state"].parameters
    assert sorted(got) == sorted(want.files)
    for name in want.files:
        np.testing.assert_allclose(np.asarray(got[name]), want[name], rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def test_checkpoint_equals_ort(replayed):
    case, rec = replayed
    m = _manifest(case)
    want = ckpt.load(GOLDEN / case / "ckpt_after_with_opt")
    got = rec["program"].to_checkpoint(rec["state"], include_optimizer_state=True,
                                       properties={"epoch": 6, "best_metric": 0.125,
                                                   "run_name": "golden-run"})
    assert list(got.trainable) == list(want.trainable)
    assert list(got.frozen) == list(want.frozen)
    for name in want.trainable:
        np.testing.assert_allclose(got.trainable[name], want.trainable[name], rtol=1e-4,
                                   atol=1e-6, err_msg=name)
    for name in want.frozen:
        np.testing.assert_array_equal(got.frozen[name], want.frozen[name], err_msg=name)
    assert len(got.optimizer_groups) == len(want.optimizer_groups) == 1
    g, w = got.optimizer_groups[0], want.optimizer_groups[0]
    assert (g.name, g.step) == (w.name, w.step)
    assert np.float32(g.initial_learning_rate) == np.float32(w.initial_learning_rate)
    assert list(g.states) == list(w.states)
    for pname, moments in w.states.items():
        assert list(g.states[pname]) == list(moments)
        for mname, value in moments.items():
            np.testing.assert_allclose(g.states[pname][mname], value,
                                       **_tol(m, "optimizer_state"), err_msg=f"{pname} {mname}")
    assert dict(got.properties) == dict(want.properties)
    # Written and read back by the checkpoint layer, it is still the same state.
    back = ckpt.load_from_buffer(ckpt.to_bytes(got, include_optimizer_state=True))
    assert back.optimizer_groups[0].step == w.step
    assert dict(back.properties) == dict(want.properties)
