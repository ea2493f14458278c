"""The facades defer optimizer steps, scheduler steps and lazy resets to the next train step.

ORT's loop (``module(x, y)``, ``optimizer.step()``, ``scheduler.step()``,
``module.lazy_reset_grad()``) runs in jaxort as one compiled call per step:
the three calls after a train step are recorded and run at the start of the
next one (``SessionState.defer``). These tests check that nothing can tell:
the numbers equal the same calls run one by one on the functional core
(whose numbers the golden replays check against ORT), every read in between
sees the deferred calls done, a failed step keeps them, and the loop compiles
one train step.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from jaxort import checkpoint as ckpt
from jaxort import errors
from jaxort import session as js
from jaxort.api import CheckpointState, LinearLRScheduler, Module, Optimizer
from jaxort.training import TrainProgram, apply_schedule, linear_lr_schedule, set_learning_rate
from jaxort.training.pending import Pending

CASE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "mlp_adamw"


def _batch(i):
    with np.load(CASE / "batches.npz") as b:
        return b["train::input"][i % len(b["train::input"])], b["train::labels"][i % len(b["train::labels"])]


def _api():
    state = CheckpointState.load_checkpoint(CASE / "checkpoint")
    module = Module(CASE / "training_model.onnx", state, CASE / "eval_model.onnx")
    return state, module, Optimizer(CASE / "optimizer_model.onnx", module)


def _core():
    start = ckpt.load(CASE / "checkpoint")
    program = TrainProgram.from_artifacts(CASE / "training_model.onnx", CASE / "eval_model.onnx",
                                          CASE / "optimizer_model.onnx", checkpoint=start)
    return program, program.init_state(start)


def _params(state):
    return {name: np.array(p.data) for name, p in state.parameters}


def _core_params(st):
    return {n: np.asarray(v) for n, v in st.params.items()}


def _assert_params_equal(got, want):
    assert got.keys() >= want.keys()
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-6, atol=1e-7, err_msg=n)


def test_the_loop_gives_the_numbers_of_the_calls_run_one_by_one():
    state, module, opt = _api()
    scheduler = LinearLRScheduler(opt, 2, 6, 0.05)
    program, st = _core()
    schedule = linear_lr_schedule(0.05, 2, 6)
    st = apply_schedule(st, schedule)
    for i in range(6):
        x, y = _batch(i)
        loss = module(x, y)
        opt.step()
        scheduler.step()
        module.lazy_reset_grad()
        st, (want,) = program.train_step(st, x, y)
        st = program.lazy_reset_grad(apply_schedule(program.optimizer_step(st), schedule))
        np.testing.assert_allclose(loss, np.asarray(want), rtol=1e-6, err_msg=f"step {i}")
    _assert_params_equal(_params(state), _core_params(st))
    assert opt.get_learning_rate() == pytest.approx(float(st.learning_rate), rel=1e-7)


def test_reads_between_the_calls_see_them_done():
    state, module, opt = _api()
    program, st = _core()
    x, y = _batch(0)
    module(x, y)
    st, _ = program.train_step(st, x, y)
    opt.step()
    st = program.optimizer_step(st)
    # parameters, the contiguous buffer and the learning rate, right after the deferred step
    _assert_params_equal(_params(state), _core_params(st))
    flat = np.concatenate([np.asarray(st.params[n]).ravel() for n in program.layout.buffer_names(True)])
    np.testing.assert_allclose(module.get_contiguous_parameters(trainable_only=True).numpy(), flat,
                               rtol=1e-6, atol=1e-7)
    # the gradients are kept by the optimizer step; a reset is lazy, so they stay until the next step
    module.lazy_reset_grad()
    for name, p in state.parameters:
        if p.requires_grad:
            np.testing.assert_allclose(p.grad, np.asarray(st.grads[name]), rtol=1e-6, atol=1e-8)
    # an eval step runs on the updated parameters
    module.eval()
    (want,) = program.eval_step(st, x, y)
    np.testing.assert_allclose(module(x, y), np.asarray(want), rtol=1e-6)


def test_calls_out_of_the_deferred_order_run_in_the_order_made():
    # scheduler before optimizer, and two optimizer steps in a row: the
    # pending calls run first, so the order is the caller's.
    state, module, opt = _api()
    scheduler = LinearLRScheduler(opt, 3, 8, 0.02)
    program, st = _core()
    schedule = linear_lr_schedule(0.02, 3, 8)
    st = apply_schedule(st, schedule)
    x, y = _batch(1)
    module(x, y)
    st, _ = program.train_step(st, x, y)
    scheduler.step()
    opt.step()
    opt.step()
    scheduler.step()
    st = apply_schedule(st, schedule)
    st = program.optimizer_step(program.optimizer_step(st))
    st = apply_schedule(st, schedule)
    x, y = _batch(2)
    loss = module(x, y)
    st, (want,) = program.train_step(st, x, y)
    np.testing.assert_allclose(loss, np.asarray(want), rtol=1e-6)
    _assert_params_equal(_params(state), _core_params(st))
    assert opt.get_learning_rate() == pytest.approx(float(st.learning_rate), rel=1e-7)


def test_a_refused_batch_keeps_the_deferred_calls():
    state, module, opt = _api()
    program, st = _core()
    x, y = _batch(0)
    module(x, y)
    opt.step()
    module.lazy_reset_grad()
    with pytest.raises(errors.InputError, match="dtype"):
        module(x.astype(np.float64), y)
    st, _ = program.train_step(st, x, y)
    st = program.lazy_reset_grad(program.optimizer_step(st))
    x, y = _batch(1)
    loss = module(x, y)
    st, (want,) = program.train_step(st, x, y)
    np.testing.assert_allclose(loss, np.asarray(want), rtol=1e-6)
    _assert_params_equal(_params(state), _core_params(st))


def test_set_learning_rate_after_a_deferred_step_leaves_that_step_its_rate():
    state, module, opt = _api()
    program, st = _core()
    x, y = _batch(0)
    module(x, y)
    opt.step()
    opt.set_learning_rate(0.5)  # the step already made used the rate before
    st, _ = program.train_step(st, x, y)
    st = set_learning_rate(program.optimizer_step(st), 0.5)
    _assert_params_equal(_params(state), _core_params(st))
    assert opt.get_learning_rate() == 0.5


def test_a_saved_checkpoint_holds_the_deferred_step(tmp_path):
    state, module, opt = _api()
    program, st = _core()
    x, y = _batch(0)
    module(x, y)
    opt.step()
    CheckpointState.save_checkpoint(state, tmp_path / "ck", include_optimizer_state=True)
    st, _ = program.train_step(st, x, y)
    st = program.optimizer_step(st)
    saved = ckpt.load(tmp_path / "ck")
    _assert_params_equal({n: np.asarray(v) for n, v in saved.trainable.items()}, _core_params(st))
    assert saved.optimizer_groups[0].step == 1


def test_the_loop_compiles_one_train_step(compiles):
    # Every combination of deferred calls (none on the first step, all three
    # later, some after a read ran them) is one compiled program.
    state, module, opt = _api()
    scheduler = LinearLRScheduler(opt, 2, 10, 0.05)
    program = state.session_state.program  # shared with other tests' sessions (ORT's session cache)
    before = {k: program.trace_count(k) for k in ("train_step_after", "train_step", "train_and_update")}
    first = compiles.during(module, *_batch(0))
    assert first >= 1
    for i in range(1, 7):
        opt.step()
        if i % 2:
            scheduler.step()
        module.lazy_reset_grad()
        if i == 3:
            opt.set_learning_rate(0.01)  # deferred too, after the optimizer step
        if i == 5:
            module.get_contiguous_parameters()
        assert compiles.during(module, *_batch(i)) == 0, f"step {i} compiled"
    traced = {k: program.trace_count(k) - n for k, n in before.items()}
    assert traced == {"train_step_after": 1, "train_step": 0, "train_and_update": 0}


def test_accumulating_gradients_compiles_one_more_program_and_adds_them(compiles):
    # A step that overwrites the gradients (the first, or after a lazy reset,
    # whether the reset waited for the step or a read ran it) runs a program
    # that does not read them; a step that adds to them runs the other one.
    # Two programs for a loop that accumulates, the numbers of the calls run
    # one by one.
    from jaxort.training.session_state import PROGRAMS

    PROGRAMS.clear()  # a program of its own, not one other tests compiled variants of
    state, module, opt = _api()
    program = state.session_state.program
    core, st = _core()
    before = program.trace_count("train_step_after")
    counts = []
    for i in range(8):
        x, y = _batch(i)
        counts.append(compiles.during(module, x, y))
        st, _ = core.train_step(st, x, y)
        if i % 2:  # every two batches: one optimizer step on their summed gradients
            opt.step()
            st = core.optimizer_step(st)
            module.lazy_reset_grad()
            st = core.lazy_reset_grad(st)
            if i == 5:  # a read runs the deferred reset now
                module.get_contiguous_parameters()
    assert counts[0] >= 1 and counts[1] >= 1 and counts[2:] == [0] * 6, counts
    assert program.trace_count("train_step_after") - before == 2
    _assert_params_equal(_params(state), _core_params(st))
    for name, p in state.parameters:
        if p.requires_grad:
            np.testing.assert_allclose(p.grad, np.asarray(st.grads[name]), rtol=1e-6, atol=1e-8, err_msg=name)


def test_a_learning_rate_set_every_step_is_deferred_with_the_step(monkeypatch):
    # ORT's loop with a hand-made schedule: train, optimizer step, set the
    # rate, reset. The set waits with the optimizer step for the next train
    # step (one compiled call per step, no separate optimizer step), with
    # the numbers of the calls run one by one.
    state, module, opt = _api()
    shared = state.session_state.program
    separate = []
    run_alone = shared.optimizer_step
    monkeypatch.setattr(shared, "optimizer_step", lambda s: separate.append(1) or run_alone(s))
    program, st = _core()
    for i in range(5):
        x, y = _batch(i)
        loss = module(x, y)
        opt.step()
        opt.set_learning_rate(0.05 / (i + 1))
        module.lazy_reset_grad()
        st, (want,) = program.train_step(st, x, y)
        st = program.lazy_reset_grad(set_learning_rate(program.optimizer_step(st), 0.05 / (i + 1)))
        np.testing.assert_allclose(loss, np.asarray(want), rtol=1e-6, err_msg=f"step {i}")
    assert separate == []
    assert opt.get_learning_rate() == pytest.approx(0.05 / 5, rel=1e-7)  # this read runs the last ones
    assert separate == [1]
    _assert_params_equal(_params(state), _core_params(st))


def test_learning_rate_sets_keep_the_order_they_were_made_in():
    state, module, opt = _api()
    scheduler = LinearLRScheduler(opt, 2, 8, 0.04)
    program, st = _core()
    schedule = linear_lr_schedule(0.04, 2, 8)
    st = apply_schedule(st, schedule)
    x, y = _batch(3)
    module(x, y)
    st, _ = program.train_step(st, x, y)
    # a set before an optimizer step is that step's rate; of two sets the later wins
    opt.set_learning_rate(0.3)
    opt.set_learning_rate(0.2)
    opt.step()
    st = program.optimizer_step(set_learning_rate(st, 0.2))
    # a scheduler step after a set overrides it; a set after a scheduler step overrides that
    opt.set_learning_rate(0.7)
    scheduler.step()
    st = apply_schedule(set_learning_rate(st, 0.7), schedule)
    assert opt.get_learning_rate() == pytest.approx(float(st.learning_rate), rel=1e-7)
    scheduler.step()
    opt.set_learning_rate(0.9)
    opt.step()
    st = program.optimizer_step(set_learning_rate(apply_schedule(st, schedule), 0.9))
    x, y = _batch(4)
    loss = module(x, y)
    st, (want,) = program.train_step(st, x, y)
    np.testing.assert_allclose(loss, np.asarray(want), rtol=1e-6)
    _assert_params_equal(_params(state), _core_params(st))
    assert opt.get_learning_rate() == pytest.approx(0.9, rel=1e-7)


def test_a_bad_learning_rate_is_refused_and_keeps_the_deferred_calls():
    state, module, opt = _api()
    program, st = _core()
    x, y = _batch(0)
    module(x, y)
    opt.step()
    with pytest.raises(errors.InputError, match="learning rate"):
        opt.set_learning_rate(float("nan"))
    st, _ = program.train_step(st, x, y)
    st = program.optimizer_step(st)
    _assert_params_equal(_params(state), _core_params(st))


def test_the_c_api_session_defers_too():
    handle = js.load_checkpoint(CASE / "checkpoint")
    session = js.TrainingSession(handle, CASE / "training_model.onnx", CASE / "eval_model.onnx",
                                 CASE / "optimizer_model.onnx")
    program, st = _core()
    for i in range(3):
        x, y = _batch(i)
        (loss,) = session.train_step(x, y)
        session.optimizer_step()
        session.lazy_reset_grad()
        st, (want,) = program.train_step(st, x, y)
        st = program.lazy_reset_grad(program.optimizer_step(st))
        np.testing.assert_allclose(loss, np.asarray(want), rtol=1e-6)
    for name in st.params:
        np.testing.assert_allclose(js.get_parameter(handle, name), np.asarray(st.params[name]),
                                   rtol=1e-6, atol=1e-7)


def test_session_state_replace_copies_and_refuses_unknown_fields():
    state, module, _ = _api()
    module(*_batch(0))
    before = state.session_state
    after = before.replace(pending=Pending(reset_grad=True))
    assert after.pending == Pending(reset_grad=True) and before.pending == Pending()
    assert after.train is before.train and after.program is before.program
    with pytest.raises(TypeError, match="no field"):
        before.replace(pendng=())


def test_pending_calls_join_in_order_or_ask_for_a_flush():
    none = Pending()
    step = none.then("optimizer_step")
    assert step == Pending(optimizer_step=True)
    assert step.then("optimizer_step") is None  # a second step runs the first
    rate = step.then("learning_rate", 0.5)
    assert rate == Pending(optimizer_step=True, set_learning_rate=True, learning_rate=0.5)
    assert rate.then("learning_rate", 0.25).learning_rate == 0.25  # the later set wins
    assert rate.then("optimizer_step") is None  # it would run before the rate
    scheduled = rate.then("schedule_step")
    assert scheduled.then("learning_rate", 0.1) is None and scheduled.then("schedule_step") is None
    assert scheduled.then("reset_grad").reset_grad and none.then("reset_grad").then("optimizer_step") == \
        Pending(optimizer_step=True, reset_grad=True)  # a reset commutes with the others
    with pytest.raises(ValueError, match="cannot defer"):
        none.then("eval_step")


def test_train_after_gives_the_numbers_of_the_calls_run_one_by_one():
    program, st = _core()
    _, fused = _core()
    schedule = linear_lr_schedule(0.05, 1, 4)
    st, _ = program.train_step(st, *_batch(0))
    fused, _ = program.train_step(fused, *_batch(0))
    st = program.lazy_reset_grad(apply_schedule(set_learning_rate(program.optimizer_step(st), 0.3), schedule))
    st, (want,) = program.train_step(st, *_batch(1))
    fused, (loss,) = program.train_after(
        fused, Pending(optimizer_step=True, set_learning_rate=True, learning_rate=0.3, schedule_step=True,
                       reset_grad=True), *_batch(1), schedule=schedule)
    np.testing.assert_allclose(np.asarray(loss), np.asarray(want), rtol=1e-6)
    _assert_params_equal(_core_params(fused), _core_params(st))
    np.testing.assert_allclose(float(fused.learning_rate), float(schedule(1)), rtol=1e-6)


def test_train_after_refuses_calls_the_program_cannot_run():
    start = ckpt.load(CASE / "checkpoint")
    bare = TrainProgram.from_artifacts(CASE / "training_model.onnx", checkpoint=start)
    with pytest.raises(errors.TrainingError, match="no optimizer model"):
        bare.train_after(bare.init_state(start), Pending(optimizer_step=True), *_batch(0))
    program, st = _core()
    with pytest.raises(errors.TrainingError, match="needs a schedule"):
        program.train_after(st, Pending(schedule_step=True), *_batch(0))
