"""Replays every golden ONNX Runtime trajectory through jaxort.api and jaxort.session.

Each tests/fixtures/golden/<case>/trajectory.json lists the exact
onnxruntime.training.api calls of an ORT 1.19.2 run and their results. The
same calls on the same ORT artifacts, through either facade, must give the
recorded losses, learning rates, gradients and parameters (the golden
tolerances), and the checkpoints saved at the end must hold what ORT's
ckpt_after_* hold.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import onnx
import pytest

from jaxort import checkpoint as ckpt
from jaxort import session as jsession
from jaxort.api import CheckpointState, LinearLRScheduler, Module, Optimizer

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "trajectory.json").exists())
PROPERTIES = {"epoch": 6, "best_metric": 0.125, "run_name": "golden-run"}


class _ApiDriver:
    """Makes the trajectory's calls through jaxort.api, as the golden run did through ORT."""

    def __init__(self, root: pathlib.Path):
        self.root = root

    def load(self, path):
        self.state = CheckpointState.load_checkpoint(self.root / path)

    def module(self, train, eval_model):
        self.module_ = Module(str(self.root / train), self.state, str(self.root / eval_model), device="cpu")

    def optimizer(self, path):
        self.optimizer_ = Optimizer(str(self.root / path), self.module_)

    def scheduler(self, warmup_passed, total_passed, initial_lr):
        # ORT 1.19.2's binding swapped the counts; jaxort uses them as documented,
        # so the ORT-effective values are passed.
        self.scheduler_ = LinearLRScheduler(self.optimizer_, total_passed, warmup_passed, initial_lr)

    def set_lr(self, lr):
        self.optimizer_.set_learning_rate(lr)

    def lr(self):
        return self.optimizer_.get_learning_rate()

    def train_step(self, args):
        return self.module_.train()(*args)

    def eval_step(self, args):
        return self.module_.eval()(*args)

    def optimizer_step(self):
        self.optimizer_.step()

    def scheduler_step(self):
        self.scheduler_.step()

    def lazy_reset_grad(self):
        self.module_.lazy_reset_grad()

    def param(self, name):
        return self.state.parameters[name].data

    def grad(self, name):
        return self.state.parameters[name].grad

    def save(self, path, include_optimizer_state):
        for name, value in PROPERTIES.items():
            self.state.properties[name] = value
        CheckpointState.save_checkpoint(self.state, path, include_optimizer_state=include_optimizer_state)

    def export(self, path):
        self.module_.export_model_for_inferencing(path, ["output"])


class _SessionDriver(_ApiDriver):
    """The same calls through the C-API-shaped jaxort.session."""

    def load(self, path):
        self.state = jsession.load_checkpoint_from_buffer((self.root / path).read_bytes())

    def module(self, train, eval_model):
        self.models = (self.root / train, self.root / eval_model)

    def optimizer(self, path):
        train, eval_model = self.models
        self.session = jsession.TrainingSession.from_buffers(
            self.state, train.read_bytes(), eval_model.read_bytes(), (self.root / path).read_bytes())

    def scheduler(self, warmup_passed, total_passed, initial_lr):
        self.session.register_linear_lr_scheduler(total_passed, warmup_passed, initial_lr)

    def set_lr(self, lr):
        self.session.set_learning_rate(lr)

    def lr(self):
        return self.session.get_learning_rate()

    def train_step(self, args):
        (loss,) = self.session.train_step(*args)
        return loss

    def eval_step(self, args):
        (loss,) = self.session.eval_step(*args)
        return loss

    def optimizer_step(self):
        self.session.optimizer_step()

    def scheduler_step(self):
        self.session.scheduler_step()

    def lazy_reset_grad(self):
        self.session.lazy_reset_grad()

    def param(self, name):
        return jsession.get_parameter(self.state, name)

    def grad(self, name):
        return self.state.get_gradient(name)

    def save(self, path, include_optimizer_state):
        for name, value in PROPERTIES.items():
            jsession.add_property(self.state, name, value)
        jsession.save_checkpoint(self.state, path, include_optimizer_state)

    def export(self, path):
        self.session.export_model_for_inferencing(path, ["output"])


def _manifest(case):
    return json.loads((GOLDEN / case / "manifest.json").read_text())


def _tol(manifest, key):
    t = manifest["tolerances"][key]
    return dict(rtol=t["rtol"], atol=t["atol"])


def _replay(driver, case):
    root = GOLDEN / case
    manifest = _manifest(case)
    trajectory = json.loads((root / "trajectory.json").read_text())
    names = [i["name"] for i in manifest["user_inputs"]] + [manifest["label"]["name"]]
    trainable = manifest["requires_grad"]
    all_params = [p["name"] for p in manifest["parameters"]]
    with np.load(root / "batches.npz") as f:
        batches = {k: f[k] for k in f.files}
    with np.load(root / "step_snapshots.npz") as f:
        snapshots = {k: f[k] for k in f.files}
    loss_tol, grad_tol, param_tol = _tol(manifest, "train_loss"), _tol(manifest, "gradients"), _tol(
        manifest, "params_after")
    step = 0
    for call in trajectory["calls"]:
        kind = call["call"]
        if kind == "CheckpointState.load_checkpoint":
            driver.load(call["args"]["path"])
        elif kind == "Module.__init__":
            assert call["args"]["device"] == "cpu"
            driver.module(call["args"]["train_model"], call["args"]["eval_model"])
        elif kind == "Optimizer.__init__":
            driver.optimizer(call["args"]["optimizer_model"])
            assert driver.lr() == call["lr_after"]
        elif kind == "optimizer.set_learning_rate":
            driver.set_lr(call["args"]["learning_rate"])
            assert driver.lr() == call["lr_after"]
        elif kind == "LinearLRScheduler.__init__":
            a = call["args"]
            driver.scheduler(a["warmup_step_count"], a["total_step_count"], a["initial_lr"])
            assert driver.lr() == call["lr_after"]
        elif kind in ("module.train", "module.eval"):
            pass  # the driver picks the mode per call
        elif kind == "module.__call__":
            b = call["batch"]
            if b["split"] == "train":
                args = [batches[f"train::{n}"][b["index"]] for n in names]
            else:
                args = [batches[f"eval::{n}"] for n in names]
            loss = driver.train_step(args) if call["mode"] == "train" else driver.eval_step(args)
            np.testing.assert_allclose(loss, call["result"]["loss"], **loss_tol, err_msg=f"{case} {call}")
        elif kind == "optimizer.step":
            step += 1
            assert driver.lr() == call["lr_used"]
            for p in trainable:
                np.testing.assert_allclose(driver.grad(p), snapshots[f"step{step}::grad::{p}"], **grad_tol,
                                           err_msg=f"{case} step {step} grad {p}")
            driver.optimizer_step()
            assert driver.lr() == call["lr_after"]
            for p in all_params:
                np.testing.assert_allclose(driver.param(p), snapshots[f"step{step}::param::{p}"], **param_tol,
                                           err_msg=f"{case} step {step} param {p}")
        elif kind == "scheduler.step":
            driver.scheduler_step()
            assert driver.lr() == call["lr_after"]
        elif kind == "module.lazy_reset_grad":
            driver.lazy_reset_grad()
        else:
            raise AssertionError(f"unknown call {kind}")
    assert step == manifest["optimizer_steps"]
    assert driver.lr() == trajectory["final_learning_rate"]
    with np.load(root / "params_after.npz") as f:
        for p in f.files:
            np.testing.assert_allclose(driver.param(p), f[p], **param_tol, err_msg=f"{case} {p}")
    eval_args = [batches[f"eval::{n}"] for n in names]
    np.testing.assert_allclose(driver.eval_step(eval_args), trajectory["eval_loss_after"],
                               **_tol(manifest, "eval_loss"))


def _assert_checkpoint_matches(ours_path, theirs_path, manifest):
    ours, theirs = ckpt.load(ours_path), ckpt.load(theirs_path)
    assert list(ours.trainable) == list(theirs.trainable)
    assert list(ours.frozen) == list(theirs.frozen)
    param_tol = _tol(manifest, "params_after")
    for name, value in {**theirs.trainable, **theirs.frozen}.items():
        mine = ours.parameters[name]
        assert mine.dtype == value.dtype and mine.shape == value.shape
        np.testing.assert_allclose(mine, value, **param_tol, err_msg=name)
    assert ours.properties == theirs.properties == PROPERTIES
    assert [type(v) for v in ours.properties.values()] == [type(v) for v in theirs.properties.values()]
    assert len(ours.optimizer_groups) == len(theirs.optimizer_groups)
    for g_ours, g_theirs in zip(ours.optimizer_groups, theirs.optimizer_groups):
        assert (g_ours.name, g_ours.step, g_ours.initial_learning_rate) == (
            g_theirs.name, g_theirs.step, g_theirs.initial_learning_rate)
        assert list(g_ours.states) == list(g_theirs.states)
        for pname, moments in g_theirs.states.items():
            assert list(g_ours.states[pname]) == list(moments)
            for mname, value in moments.items():
                np.testing.assert_allclose(g_ours.states[pname][mname], value, **_tol(manifest, "optimizer_state"),
                                           err_msg=f"{pname} {mname}")
    # Same layout as ORT's file: same tables, names and tensor sizes.
    assert pathlib.Path(ours_path).stat().st_size == pathlib.Path(theirs_path).stat().st_size


@pytest.mark.parametrize("facade", ["api", "session"])
@pytest.mark.parametrize("case", CASES)
def test_replay_golden_trajectory(case, facade, tmp_path):
    driver = (_ApiDriver if facade == "api" else _SessionDriver)(GOLDEN / case)
    _replay(driver, case)
    manifest = _manifest(case)
    for name, include in (("ckpt_after_with_opt", True), ("ckpt_after_no_opt", False)):
        path = tmp_path / name
        driver.save(path, include)
        _assert_checkpoint_matches(path, GOLDEN / case / name, manifest)
    if (GOLDEN / case / "inference_model.onnx").exists():
        path = tmp_path / "inference_model.onnx"
        driver.export(path)
        with np.load(GOLDEN / case / "batches.npz") as f:
            x = f["eval::input"]
        with np.load(GOLDEN / case / "eval_outputs.npz") as f:
            expected = f["output"]
        for model in (path, GOLDEN / case / "inference_model.onnx"):
            got = _run_inference(model, x)
            np.testing.assert_allclose(got, expected, **_tol(manifest, "eval_outputs"), err_msg=str(model.name))
    if facade == "api":
        _check_resume_from_ort_checkpoint(driver, case)


def _run_inference(model, x):
    """The model's "output" for "input" ``x``: in onnxruntime, or where it is not installed (a
    GPU image), through jaxort's ONNX backend."""
    try:
        import onnxruntime
    except ImportError:
        from jaxort.backend import prepare

        proto = onnx.load(str(model))
        names = [o.name for o in proto.graph.output]
        return np.asarray(prepare(proto).run({"input": x})[names.index("output")])
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(["output"], {"input": x})[0]


def _check_resume_from_ort_checkpoint(live, case):
    """ORT's ckpt_after_with_opt restores step and moments: one more step matches the live run."""
    manifest = _manifest(case)
    root = GOLDEN / case
    resumed_state = CheckpointState.load_checkpoint(root / "ckpt_after_with_opt")
    resumed = Module(str(root / "training_model.onnx"), resumed_state, str(root / "eval_model.onnx"))
    optimizer = Optimizer(str(root / "optimizer_model.onnx"), resumed)
    group = ckpt.load(root / "ckpt_after_with_opt").optimizer_groups[0]
    # jaxort starts from the saved initial learning rate (ORT 1.19.2 starts at 0.001).
    assert optimizer.get_learning_rate() == group.initial_learning_rate
    lr = manifest["verification"]["resume_from_ckpt_after_with_opt"]["resume_lr"]
    names = [i["name"] for i in manifest["user_inputs"]] + [manifest["label"]["name"]]
    with np.load(root / "batches.npz") as f:
        args = [f[f"train::{n}"][0] for n in names]
    for module, opt in ((resumed, optimizer), (live.module_, live.optimizer_)):
        opt.set_learning_rate(lr)
        module.lazy_reset_grad()
        module.train()(*args)
        opt.step()
    for name in resumed_state.parameters.keys():
        np.testing.assert_allclose(resumed_state.parameters[name].data, live.param(name),
                                   **_tol(manifest, "params_after"), err_msg=name)


def test_replay_with_synchronous_cpu_dispatch():
    """The README's advice for small models: with JAX's async CPU dispatch off, ORT's numbers still.

    In a fresh interpreter (the setting is read when JAX creates its CPU
    client), both facades replay two golden trajectories.
    """
    import subprocess
    import sys

    code = "\n".join([
        "import importlib.util, jax",
        "jax.config.update('jax_cpu_enable_async_dispatch', False)",
        f"spec = importlib.util.spec_from_file_location('replay', {str(pathlib.Path(__file__))!r})",
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)",
        "for case in ('mlp_adamw', 'cnn_bce'):",
        "    m._replay(m._ApiDriver(m.GOLDEN / case), case)",
        "    m._replay(m._SessionDriver(m.GOLDEN / case), case)",
        "assert jax.config.values['jax_cpu_enable_async_dispatch'] is False",
        "print('replayed')",
    ])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["replayed"]


def test_the_inference_check_runs_without_onnxruntime(monkeypatch):
    # A GPU image has no onnxruntime: ORT's exported inference model then runs through
    # jaxort's backend, to ORT's recorded outputs all the same.
    (model,) = GOLDEN.glob("*/inference_model.onnx")
    case = model.parent.name
    with np.load(GOLDEN / case / "batches.npz") as f:
        x = f["eval::input"]
    with np.load(GOLDEN / case / "eval_outputs.npz") as f:
        expected = f["output"]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    with pytest.raises(ImportError):
        import onnxruntime  # noqa: F401
    np.testing.assert_allclose(_run_inference(model, x), expected, **_tol(_manifest(case), "eval_outputs"))
