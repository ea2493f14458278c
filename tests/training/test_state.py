"""TrainState: pytree behaviour, checkpoint conversion, mixed precision."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxort import checkpoint as ckpt
from jaxort.errors import CheckpointError
from jaxort.training import (
    TrainProgram,
    TrainState,
    bfloat16_policy,
    set_learning_rate,
)

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"


def _program(case, policy=None):
    folder = GOLDEN / case
    start = ckpt.load(folder / "checkpoint")
    return TrainProgram.from_artifacts(
        folder / "training_model.onnx", folder / "eval_model.onnx",
        folder / "optimizer_model.onnx", checkpoint=start, policy=policy), start


def test_state_is_a_pytree_of_arrays_with_one_step_counter():
    program, start = _program("mlp_adamw")
    state = program.init_state(start)
    leaves, treedef = jax.tree_util.tree_flatten(state)
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert isinstance(back, TrainState)
    assert all(isinstance(leaf, jax.Array) for leaf in leaves)
    # 4 params + 4 grads + accumulate + count/mu/nu (1 + 4 + 4) + 2 lrs + rng: no
    # property bag, and the optimizer's count is the only step counter.
    assert len(leaves) == 4 + 4 + 1 + 9 + 2 + 1
    assert state.step is state.opt_state.count


def test_restore_from_ort_checkpoint_with_optimizer_state():
    program, _ = _program("mlp_adamw")
    saved = ckpt.load(GOLDEN / "mlp_adamw" / "ckpt_after_with_opt")
    state = program.init_state(saved)
    group = saved.optimizer_groups[0]
    assert int(state.step) == group.step == 6
    # jaxort restores the learning rate from the group (ORT 1.19.2 resets it to 0.001).
    assert np.float32(state.learning_rate) == np.float32(group.initial_learning_rate)
    for name, moments in group.states.items():
        np.testing.assert_array_equal(np.asarray(state.opt_state.mu[name]), moments["momentum0"])
        np.testing.assert_array_equal(np.asarray(state.opt_state.nu[name]), moments["momentum1"])
    out = program.to_checkpoint(state, properties=saved.properties)
    assert dict(out.properties) == {"epoch": 6, "best_metric": 0.125, "run_name": "golden-run"}
    for name, value in saved.trainable.items():
        np.testing.assert_array_equal(out.trainable[name], value)
    assert out.optimizer_groups[0].step == 6


def test_without_optimizer_state_checkpoint_equals_ort_no_opt_file():
    program, _ = _program("mlp_sgd")
    saved = ckpt.load(GOLDEN / "mlp_sgd" / "ckpt_after_no_opt")
    out = program.to_checkpoint(program.init_state(saved), include_optimizer_state=False)
    assert out.optimizer_groups == ()
    assert list(out.trainable) == list(saved.trainable)


def test_bfloat16_policy_keeps_float32_master_weights():
    program, start = _program("mlp_adamw", policy=bfloat16_policy())
    batches = np.load(GOLDEN / "mlp_adamw" / "batches.npz")
    traj = json.loads((GOLDEN / "mlp_adamw" / "trajectory.json").read_text())
    want = [s["train_losses"][0] for s in traj["steps"]]
    state = set_learning_rate(program.init_state(start), 0.01)
    losses = []
    for i in range(6):
        state, (loss,) = program.train_step(
            state, batches["train::input"][i], batches["train::labels"][i])
        losses.append(float(loss))
        assert loss.dtype == jnp.float32
        state = program.lazy_reset_grad(program.optimizer_step(state))
    for tree in (state.params, state.grads, state.opt_state.mu, state.opt_state.nu):
        assert all(v.dtype == jnp.float32 for v in tree.values())
    # bfloat16 has an 8-bit mantissa: the losses follow ORT's float32 run loosely.
    np.testing.assert_allclose(losses, want, rtol=3e-2)
    assert losses != want
    after = np.load(GOLDEN / "mlp_adamw" / "params_after.npz")
    for name in after.files:
        np.testing.assert_allclose(np.asarray(state.params[name]), after[name], atol=3e-2)
    assert np.dtype(ml_dtypes.bfloat16) == program.policy.compute_dtype


@pytest.mark.parametrize("step", [2**31 - 1, 2**31, 2**40])
def test_a_step_the_int32_counter_cannot_continue_is_refused(step):
    program, _ = _program("mlp_adamw")
    saved = ckpt.load(GOLDEN / "mlp_adamw" / "ckpt_after_with_opt")
    group = saved.optimizer_groups[0].replace(step=step)
    with pytest.raises(CheckpointError, match=rf"group 'group0': step {step} is outside the range"):
        program.init_state(saved.replace(optimizer_groups=(group,)))


def test_the_largest_resumable_step_trains_and_counts_on():
    program, _ = _program("mlp_adamw")
    saved = ckpt.load(GOLDEN / "mlp_adamw" / "ckpt_after_with_opt")
    group = saved.optimizer_groups[0].replace(step=2**31 - 2)
    state = program.init_state(saved.replace(optimizer_groups=(group,)))
    assert int(state.step) == 2**31 - 2
    batch = np.load(GOLDEN / "mlp_adamw" / "batches.npz")
    state, _ = program.train_step(state, batch["train::input"][0], batch["train::labels"][0])
    state = program.optimizer_step(state)
    assert int(state.step) == 2**31 - 1
    assert program.to_checkpoint(state).optimizer_groups[0].step == 2**31 - 1
