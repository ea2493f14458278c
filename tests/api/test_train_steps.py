"""The facades' multi-step call (``Module.train_steps``, ``TrainingSession.train_steps``) against ORT's golden runs.

Each golden run is a loop of train step, optimizer step, scheduler step
(cnn_bce) and lazy reset, one batch a step. The same batches, stacked and
given to ``train_steps`` in two calls with one step of the plain loop
between them, must give ORT's losses, learning rates, gradients and
parameters.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from jaxort import session as jsession
from jaxort.api import CheckpointState, LinearLRScheduler, Module, Optimizer
from jaxort.errors import InputError, StateError

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"
CASES = ["mlp_adamw", "mlp_frozen", "cnn_bce", "l1_gemm"]  # one batch a step (mlp_sgd accumulates two)


class _Api:
    def __init__(self, root, calls):
        self.state = CheckpointState.load_checkpoint(root / "checkpoint")
        self.module = Module(str(root / "training_model.onnx"), self.state, str(root / "eval_model.onnx"))
        self.optimizer = Optimizer(str(root / "optimizer_model.onnx"), self.module)
        self.scheduler = None
        for call in calls:
            if call["call"] == "optimizer.set_learning_rate":
                self.optimizer.set_learning_rate(call["args"]["learning_rate"])
            elif call["call"] == "LinearLRScheduler.__init__":
                a = call["args"]  # ORT 1.19.2's binding swapped the counts; the effective ones are passed
                self.scheduler = LinearLRScheduler(self.optimizer, a["total_step_count"],
                                                   a["warmup_step_count"], a["initial_lr"])

    def train_steps(self, *stacked):
        return self.module.train_steps(*stacked)

    def loop_step(self, *batch):
        loss = self.module(*batch)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.module.lazy_reset_grad()
        return loss

    def lr(self):
        return self.optimizer.get_learning_rate()

    def param(self, name):
        return self.state.parameters[name].data

    def grad(self, name):
        return self.state.parameters[name].grad


class _Session(_Api):
    def __init__(self, root, calls):
        self.state = jsession.load_checkpoint(root / "checkpoint")
        self.session = jsession.TrainingSession(self.state, root / "training_model.onnx",
                                                root / "eval_model.onnx", root / "optimizer_model.onnx")
        self.scheduler = None
        for call in calls:
            if call["call"] == "optimizer.set_learning_rate":
                self.session.set_learning_rate(call["args"]["learning_rate"])
            elif call["call"] == "LinearLRScheduler.__init__":
                a = call["args"]
                self.session.register_linear_lr_scheduler(a["total_step_count"], a["warmup_step_count"],
                                                          a["initial_lr"])
                self.scheduler = "registered"

    def train_steps(self, *stacked):
        (losses,) = self.session.train_steps(*stacked)
        return losses

    def loop_step(self, *batch):
        (loss,) = self.session.train_step(*batch)
        self.session.optimizer_step()
        if self.scheduler is not None:
            self.session.scheduler_step()
        self.session.lazy_reset_grad()
        return loss

    def lr(self):
        return self.session.get_learning_rate()

    def param(self, name):
        return jsession.get_parameter(self.state, name)

    def grad(self, name):
        return self.state.get_gradient(name)


def _golden(case):
    root = GOLDEN / case
    manifest = json.loads((root / "manifest.json").read_text())
    trajectory = json.loads((root / "trajectory.json").read_text())
    names = [i["name"] for i in manifest["user_inputs"]] + [manifest["label"]["name"]]
    order = [s["train_batches"][0] for s in trajectory["steps"]]
    with np.load(root / "batches.npz") as f:
        stacked = [f[f"train::{n}"][order] for n in names]
    with np.load(root / "step_snapshots.npz") as f:
        snapshots = {k: f[k] for k in f.files}
    setup = trajectory["calls"][:[c["call"] for c in trajectory["calls"]].index("module.__call__")]
    tol = {k: dict(rtol=v["rtol"], atol=v["atol"]) for k, v in manifest["tolerances"].items() if isinstance(v, dict)}
    return root, manifest, trajectory, setup, stacked, snapshots, tol


@pytest.mark.parametrize("facade", [_Api, _Session], ids=["api", "session"])
@pytest.mark.parametrize("case", CASES)
def test_train_steps_replay_ort_s_loop(case, facade):
    root, manifest, trajectory, setup, stacked, snapshots, tol = _golden(case)
    steps = trajectory["steps"]
    losses = np.array([s["train_losses"][0] for s in steps], np.float32)
    run = facade(root, setup)
    params = [p["name"] for p in manifest["parameters"]]

    first = run.train_steps(*(x[:2] for x in stacked))
    np.testing.assert_allclose(first, losses[:2], **tol["train_loss"])
    assert run.lr() == np.float32(steps[1]["lr_after_scheduler_step"] if run.scheduler else steps[1]["lr"])
    for p in params:
        np.testing.assert_allclose(run.param(p), snapshots[f"step2::param::{p}"], **tol["params_after"], err_msg=p)
    np.testing.assert_allclose(run.loop_step(*(x[2] for x in stacked)), losses[2], **tol["train_loss"])
    rest = run.train_steps(*(x[3:] for x in stacked))
    np.testing.assert_allclose(rest, losses[3:], **tol["train_loss"])

    assert run.lr() == np.float32(trajectory["final_learning_rate"])
    with np.load(root / "params_after.npz") as after:
        for p in params:
            np.testing.assert_allclose(run.param(p), after[p], **tol["params_after"], err_msg=p)
    for p in manifest["requires_grad"]:  # the last batch's gradients stay, as after ORT's loop
        np.testing.assert_allclose(run.grad(p), snapshots[f"step{len(steps)}::grad::{p}"], **tol["gradients"],
                                   err_msg=p)


def test_train_steps_compile_once_per_length_and_a_train_step_follows():
    root, manifest, trajectory, setup, stacked, snapshots, tol = _golden("mlp_adamw")
    losses = np.array([s["train_losses"][0] for s in trajectory["steps"]], np.float32)
    run = _Api(root, setup)
    traces = []
    for i in (0, 2):
        np.testing.assert_allclose(run.train_steps(*(x[i:i + 2] for x in stacked)), losses[i:i + 2],
                                   **tol["train_loss"])
        traces.append(run.module._state.session_state.program.trace_count("train_steps"))
    assert traces[0] >= 1 and traces[1] == traces[0]  # (the program may be shared with another test's)
    # After the multi-step call the reset is done: a plain train step overwrites the gradients.
    np.testing.assert_allclose(run.loop_step(*(x[4] for x in stacked)), losses[4], **tol["train_loss"])
    for p in manifest["requires_grad"]:
        np.testing.assert_allclose(run.grad(p), snapshots[f"step5::grad::{p}"], **tol["gradients"], err_msg=p)


def test_train_steps_refuse_what_the_loop_cannot_run():
    root, _, _, _, stacked, _, _ = _golden("mlp_adamw")
    state = CheckpointState.load_checkpoint(root / "checkpoint")
    module = Module(str(root / "training_model.onnx"), state, str(root / "eval_model.onnx"))
    before = {name: p.data.copy() for name, p in state.parameters.items()}
    with pytest.raises(StateError, match="no optimizer model"):
        module.train_steps(*stacked)
    Optimizer(str(root / "optimizer_model.onnx"), module)
    with pytest.raises(StateError, match="eval mode"):
        module.eval().train_steps(*stacked)
    module.train()
    with pytest.raises(InputError, match="leading axis"):
        module.train_steps(stacked[0], stacked[1][:3])
    with pytest.raises(InputError, match="takes 2 inputs"):
        module.train_steps(stacked[0])
    for name, p in state.parameters.items():  # nothing ran
        np.testing.assert_array_equal(p.data, before[name], err_msg=name)
    session = jsession.TrainingSession(jsession.load_checkpoint(root / "checkpoint"), root / "training_model.onnx")
    with pytest.raises(StateError, match="no optimizer model"):
        session.train_steps(*stacked)
