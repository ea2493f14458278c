"""optax transforms as optimizers: their whole state in the ORT checkpoint's optimizer group.

A run checkpointed mid-way (bytes on disk) and resumed by a fresh program
with a freshly built transform must equal the run that never stopped, bit
for bit, through jaxort.training and through jaxort.api; a checkpoint
written by another transform is refused with every mismatched entry named.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxort import checkpoint as ckpt
from jaxort.errors import CheckpointError, TrainingError
from jaxort.training import (
    OptaxOptimizer,
    OrtOptimizer,
    TrainProgram,
    opt_state_from_checkpoint_states,
    opt_state_to_checkpoint_states,
    scale_by_ort_adamw,
    set_learning_rate,
)

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"
CASE = GOLDEN / "mlp_adamw"  # MLP 20->16->5, 4 trainable parameters, 6 batches of 8
PARAMS = ("fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight")
STEPS, SAVE_AT = 6, 3


def _schedule():
    return optax.linear_schedule(1e-2, 1e-3, transition_steps=STEPS)


def _clip_adamw():
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(_schedule(), weight_decay=1e-2))


def _masked_adamw():
    # Only the weights get AdamW; the biases keep no moments.
    return optax.masked(optax.adamw(_schedule()), lambda p: {n: n.endswith("weight") for n in p})


# The optimizer table: name -> a factory of a fresh transform (a resumed run
# builds its own, as a new process would). One entry joins every test below.
TRANSFORMS = {
    "clip_adamw_schedule": _clip_adamw,
    "masked_adamw": _masked_adamw,
    "sgd_momentum": lambda: optax.sgd(0.05, momentum=0.9, nesterov=True),
    "adafactor": lambda: optax.adafactor(1e-2, min_dim_size_to_factor=4),
    "inject_hyperparams_adam": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=_schedule()),
    "lion": lambda: optax.lion(1e-3),
    "multi_transform": lambda: optax.multi_transform(
        {"w": optax.adam(1e-2), "b": optax.sgd(1e-2)},
        lambda p: {n: "w" if n.endswith("weight") else "b" for n in p}),
}


def _batches():
    with np.load(CASE / "batches.npz") as f:
        return f["train::input"], f["train::labels"]


def _program(transform):
    start = ckpt.load(CASE / "checkpoint")
    return TrainProgram.from_artifacts(CASE / "training_model.onnx", CASE / "eval_model.onnx",
                                       transform, checkpoint=start), start


def _train(program, state, steps):
    xs, ys = _batches()
    losses = []
    for i in steps:
        state, (loss,) = program.train_and_update(state, xs[i], ys[i])
        losses.append(np.asarray(loss))
    return state, np.array(losses)


def _numpy(tree):
    return jax.tree.map(np.asarray, tree)


def _assert_trees_identical(got, want):
    """Same tree, same dtypes and shapes (JAX weak types included), same bits."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.asarray(g).dtype == np.asarray(w).dtype and np.shape(g) == np.shape(w)
        assert getattr(g, "weak_type", False) == getattr(w, "weak_type", False)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _interrupted_and_full(make, tmp_path):
    """(uninterrupted losses, state) and (resumed losses, state) of one transform factory."""
    program, start = _program(make())
    state, losses = _train(program, program.init_state(start), range(SAVE_AT))
    path = tmp_path / "checkpoint"
    ckpt.save(program.to_checkpoint(state), path, include_optimizer_state=True)
    full_state, rest = _train(program, state, range(SAVE_AT, STEPS))

    resumed_program, _ = _program(make())
    resumed, resumed_losses = _train(resumed_program, resumed_program.init_state(ckpt.load(path)),
                                     range(SAVE_AT, STEPS))
    return (np.concatenate([losses, rest]), full_state), (resumed_losses, resumed)


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_a_resumed_run_equals_the_uninterrupted_one_bit_for_bit(name, tmp_path):
    (losses, full), (resumed_losses, resumed) = _interrupted_and_full(TRANSFORMS[name], tmp_path)
    np.testing.assert_array_equal(resumed_losses, losses[SAVE_AT:])
    for n in PARAMS:
        np.testing.assert_array_equal(np.asarray(resumed.params[n]), np.asarray(full.params[n]))
    _assert_trees_identical(resumed.opt_state, full.opt_state)
    assert int(resumed.step) == int(full.step)


def test_chain_with_clipping_and_a_schedule_saves_its_state_by_path(tmp_path):
    program, start = _program(_clip_adamw())
    state, _ = _train(program, program.init_state(start), range(SAVE_AT))
    ckpt.save(program.to_checkpoint(state), tmp_path / "c", include_optimizer_state=True)
    group = ckpt.load(tmp_path / "c").optimizer_groups[0]
    assert group.name == "group0" and group.step == SAVE_AT
    assert sorted(group.states) == list(PARAMS)
    # state[1][0] is adamw's ScaleByAdamState, state[1][2] the schedule's state.
    for n in PARAMS:
        saved = group.states[n]
        assert sorted(saved) == ["1.0.count", "1.0.mu", "1.0.nu", "1.2.count"]
        np.testing.assert_array_equal(saved["1.0.mu"], np.asarray(state.opt_state[1][0].mu[n]))
        np.testing.assert_array_equal(saved["1.0.nu"], np.asarray(state.opt_state[1][0].nu[n]))
        for count in ("1.0.count", "1.2.count"):
            assert saved[count].dtype == np.int32 and saved[count].shape == ()
            assert int(saved[count]) == SAVE_AT


def test_the_saved_state_is_what_continues_the_run(tmp_path):
    # Without the optimizer group the same parameters continue differently:
    # the bit-exact resume above is the restored state's doing.
    (_, full), _ = _interrupted_and_full(_clip_adamw, tmp_path)
    program, start = _program(_clip_adamw())
    state, _ = _train(program, program.init_state(start), range(SAVE_AT))
    ckpt.save(program.to_checkpoint(state), tmp_path / "no_opt", include_optimizer_state=False)
    fresh, _ = _train(program, program.init_state(ckpt.load(tmp_path / "no_opt")), range(SAVE_AT, STEPS))
    assert int(fresh.step) == STEPS - SAVE_AT
    assert not np.array_equal(np.asarray(fresh.params["fc1.weight"]), np.asarray(full.params["fc1.weight"]))


def test_masked_parameters_hold_only_the_shared_counts(tmp_path):
    program, start = _program(_masked_adamw())
    state, _ = _train(program, program.init_state(start), range(2))
    group = ckpt.load_from_buffer(ckpt.to_bytes(program.to_checkpoint(state), True)).optimizer_groups[0]
    counts = ["inner_state.0.count", "inner_state.2.count"]  # adam's and the schedule's
    for n in PARAMS:
        moments = ["inner_state.0.mu", "inner_state.0.nu"] if n.endswith("weight") else []
        assert sorted(group.states[n]) == sorted(counts + moments)
        assert [int(group.states[n][c]) for c in counts] == [2, 2]


def test_the_same_transform_resumes_through_the_api_optimizer(tmp_path):
    from jaxort.api import CheckpointState, Module, Optimizer

    xs, ys = _batches()
    path = str(tmp_path / "checkpoint")

    def run(state, steps, save_at=None):
        module = Module(str(CASE / "training_model.onnx"), state, str(CASE / "eval_model.onnx"))
        optimizer = Optimizer(_clip_adamw(), module)
        losses = []
        for i in steps:
            losses.append(module(xs[i], ys[i]))
            optimizer.step()
            module.lazy_reset_grad()
            if i + 1 == save_at:
                CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
        return np.array(losses), {n: p.data for n, p in state.parameters}

    losses, params = run(CheckpointState.load_checkpoint(str(CASE / "checkpoint")), range(STEPS), SAVE_AT)
    resumed_losses, resumed = run(CheckpointState.load_checkpoint(path), range(SAVE_AT, STEPS))
    np.testing.assert_array_equal(resumed_losses, losses[SAVE_AT:])
    for n in PARAMS:
        np.testing.assert_array_equal(resumed[n], params[n])
    # The api run is the training-layer run: the facade adds no numbers.
    program, start = _program(_clip_adamw())
    core, core_losses = _train(program, program.init_state(start), range(STEPS))
    np.testing.assert_array_equal(losses, core_losses)
    np.testing.assert_array_equal(params["fc2.weight"], np.asarray(core.params["fc2.weight"]))


def test_an_api_optimizer_of_another_transform_refuses_the_checkpoint(tmp_path):
    from jaxort.api import CheckpointState, Module, Optimizer

    program, start = _program(_clip_adamw())
    state, _ = _train(program, program.init_state(start), range(1))
    ckpt.save(program.to_checkpoint(state), tmp_path / "c", include_optimizer_state=True)
    module = Module(str(CASE / "training_model.onnx"), CheckpointState.load_checkpoint(str(tmp_path / "c")))
    with pytest.raises(CheckpointError, match=r"'0\.trace' of 'fc1\.bias' is missing"):
        Optimizer(optax.sgd(0.1, momentum=0.9), module)


def test_a_checkpoint_of_another_transform_is_a_clear_error(tmp_path):
    program, start = _program(_clip_adamw())
    state, _ = _train(program, program.init_state(start), range(1))
    saved = ckpt.load_from_buffer(ckpt.to_bytes(program.to_checkpoint(state), True))
    other, _ = _program(optax.sgd(0.1, momentum=0.9))
    with pytest.raises(CheckpointError) as info:
        other.init_state(saved)
    message = str(info.value)
    assert "optimizer state '0.trace' of 'fc1.weight' is missing" in message
    assert ("parameter 'fc2.bias' has optimizer states this optimizer does not keep: "
            "['1.0.count', '1.0.mu', '1.0.nu', '1.2.count']") in message


def test_an_ort_checkpoint_is_refused_by_an_optax_optimizer():
    program, _ = _program(_clip_adamw())
    with pytest.raises(CheckpointError, match=r"'fc1\.weight' has optimizer states this optimizer does not "
                                              r"keep: \['momentum0', 'momentum1'\].*'1\.0\.mu' of"):
        program.init_state(ckpt.load(CASE / "ckpt_after_with_opt"))


def _saved_group(steps=1):
    program, start = _program(_clip_adamw())
    state, _ = _train(program, program.init_state(start), range(steps))
    return program, program.to_checkpoint(state)


def _with_states(saved, edit):
    group = saved.optimizer_groups[0]
    states = {p: dict(s) for p, s in group.states.items()}
    edit(states)
    return saved.replace(optimizer_groups=(group.replace(states=states),))


def test_a_count_of_another_dtype_is_named():
    program, saved = _saved_group()

    def widen(states):
        states["fc1.bias"]["1.0.count"] = states["fc1.bias"]["1.0.count"].astype(np.int64)
    with pytest.raises(CheckpointError, match=r"'1\.0\.count' of 'fc1\.bias' is int64\[\], this optimizer "
                                              r"keeps int32\[\]"):
        program.init_state(_with_states(saved, widen))


def test_copies_of_a_shared_leaf_must_agree():
    program, saved = _saved_group()

    def tamper(states):
        states["fc2.weight"]["1.2.count"] = np.array(7, np.int32)
    with pytest.raises(CheckpointError, match=r"'1\.2\.count' of 'fc2\.weight' differs from the copy of "
                                              r"'fc1\.bias'"):
        program.init_state(_with_states(saved, tamper))


def test_states_of_an_unknown_parameter_are_named():
    program, saved = _saved_group()

    def add(states):
        states["fc3.weight"] = dict(states["fc1.bias"])
    with pytest.raises(CheckpointError, match=r"parameters the model does not train: \['fc3\.weight'\]"):
        program.init_state(_with_states(saved, add))


def test_a_group_step_that_disagrees_with_the_saved_counts_is_refused():
    program, saved = _saved_group(2)
    group = saved.optimizer_groups[0].replace(step=5)
    with pytest.raises(CheckpointError, match=r"step 5, but the optimizer state saved with it counts 2"):
        program.init_state(saved.replace(optimizer_groups=(group,)))


def test_a_hand_built_ort_optimizer_saves_its_whole_state(tmp_path):
    # ORT's kernel chained with clipping: its state is no longer ORT's own, so
    # it is saved by path instead of as zero momentum0/momentum1.
    def make():
        tx = optax.chain(optax.clip_by_global_norm(1.0), scale_by_ort_adamw(None, weight_decay=0.01))
        return OrtOptimizer("AdamW", {}, tx, ("momentum0", "momentum1"))

    program, start = _program(make())
    state = set_learning_rate(program.init_state(start), 0.01)
    state, losses = _train(program, state, range(SAVE_AT))
    saved = program.to_checkpoint(state)
    assert sorted(saved.optimizer_groups[0].states["fc1.weight"]) == ["1.count", "1.mu", "1.nu"]
    ckpt.save(saved, tmp_path / "c", include_optimizer_state=True)
    full, rest = _train(program, state, range(SAVE_AT, STEPS))
    again, _ = _program(make())
    restored = again.init_state(ckpt.load(tmp_path / "c"))
    # The kernel reads the state's learning rate; a checkpoint keeps the
    # initial one (ORT's rule), so the resumed run sets its own, as ORT's must.
    assert np.float32(restored.learning_rate) == np.float32(1e-3)
    resumed, resumed_losses = _train(again, set_learning_rate(restored, 0.01), range(SAVE_AT, STEPS))
    np.testing.assert_array_equal(resumed_losses, rest)
    for n in PARAMS:
        np.testing.assert_array_equal(np.asarray(resumed.params[n]), np.asarray(full.params[n]))


# The pure mapping --------------------------------------------------------------------

def _params():
    rng = np.random.default_rng(0)
    return {"a.weight": jnp.asarray(rng.standard_normal((6, 4)), jnp.float32),
            "a.bias": jnp.asarray(rng.standard_normal(4), jnp.float32),
            "b": jnp.asarray(rng.standard_normal((3, 5)), jnp.bfloat16)}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_the_mapping_round_trips_every_leaf_through_checkpoint_bytes(name):
    params = _params()
    tx = TRANSFORMS[name]()
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.25), params)
    for _ in range(2):
        _, opt_state = tx.update(grads, opt_state, params)
    group = ckpt.OptimizerGroup("group0", 2, 1e-3, opt_state_to_checkpoint_states(opt_state, params))
    data = ckpt.Checkpoint(trainable={n: np.asarray(p) for n, p in params.items()}, optimizer_groups=(group,))
    loaded = ckpt.load_from_buffer(ckpt.to_bytes(data, True)).optimizer_groups[0].states
    # A fresh transform from the factory restores it (bfloat16 moments that
    # an injected float32 hyperparameter made float32 stay float32).
    back = OptaxOptimizer(TRANSFORMS[name]()).restore(params, loaded, 2)
    _assert_trees_identical(back, opt_state)


def test_a_dtype_the_state_takes_at_its_first_update_is_accepted():
    # The injected hyperparameters take the widest parameter dtype, float32.
    params = {"a": jnp.ones(2, jnp.float32), "b": jnp.ones((3, 5), jnp.bfloat16)}
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
    template = tx.init(params)
    _, after = tx.update(params, template, params)
    assert template.inner_state[0].mu["b"].dtype == jnp.bfloat16
    assert after.inner_state[0].mu["b"].dtype == jnp.float32
    saved = opt_state_to_checkpoint_states(after, params)
    with pytest.raises(CheckpointError, match=r"'inner_state\.0\.mu' of 'b' is float32\[3, 5\], this optimizer "
                                              r"keeps bfloat16\[3, 5\]"):
        opt_state_from_checkpoint_states(template, params, saved)
    updated = jax.eval_shape(lambda: tx.update(params, template, params)[1])
    _assert_trees_identical(opt_state_from_checkpoint_states(template, params, saved, updated=updated), after)


def test_a_weakly_typed_scalar_stays_weak():
    params = {"w": jnp.ones(3)}
    template = {"scale": jnp.asarray(2.0), "trace": {"w": jnp.zeros(3)}}
    assert template["scale"].weak_type
    states = opt_state_to_checkpoint_states({"scale": jnp.asarray(0.5), "trace": {"w": jnp.ones(3)}}, params)
    assert sorted(states["w"]) == ["scale", "trace"]
    back = opt_state_from_checkpoint_states(template, params, states)
    assert back["scale"].weak_type and back["scale"].dtype == jnp.float32 and float(back["scale"]) == 0.5
    np.testing.assert_array_equal(np.asarray(back["trace"]["w"]), np.ones(3, np.float32))


def test_leaves_that_would_share_a_name_are_refused():
    params = {"w": jnp.ones(2)}
    states = opt_state_to_checkpoint_states(({"mu": {"w": jnp.zeros(2)}}, {"x": jnp.zeros(())}), params)
    assert sorted(states["w"]) == ["0.mu", "1.x"]
    # w's "mu" and a shared leaf "mu" beside it.
    with pytest.raises(CheckpointError, match=r"shared leaf \['mu'\] and the leaf \['w'\]\['mu'\] of 'w' are "
                                              r"both named 'mu'"):
        opt_state_to_checkpoint_states({"w": {"mu": jnp.zeros(2)}, "mu": jnp.zeros(())}, params)
    with pytest.raises(CheckpointError, match=r"two leaves named 'a' for 'w'"):
        opt_state_to_checkpoint_states({"w": {"a": jnp.zeros(2)}, "a": {"w": jnp.zeros(2)}}, params)


def test_an_optax_optimizer_needs_a_transform():
    with pytest.raises(TrainingError, match="GradientTransformation"):
        OptaxOptimizer("adam")
    opt = OptaxOptimizer(optax.clip_by_global_norm(1.0))  # a plain transform ignores the learning rate
    p = {"w": jnp.full(4, 3.0)}
    updates, _ = opt.update(p, opt.init(p), p, learning_rate=jnp.float32(0.1))
    np.testing.assert_allclose(float(optax.tree.norm(updates)), 1.0, rtol=1e-6)


def test_onnx_runtime_loads_the_parameters_of_an_optax_checkpoint(tmp_path):
    ort_api = pytest.importorskip("onnxruntime.training.api", reason="needs onnxruntime-training (the oracle "
                                                                   "environment)")
    program, start = _program(_clip_adamw())
    state, _ = _train(program, program.init_state(start), range(SAVE_AT))
    ckpt.save(program.to_checkpoint(state), tmp_path / "c", include_optimizer_state=True)
    loaded = ort_api.CheckpointState.load_checkpoint(str(tmp_path / "c"))
    for n in PARAMS:
        np.testing.assert_array_equal(np.asarray(loaded.parameters[n].data), np.asarray(state.params[n]))
