"""Orbax checkpoints of a TrainState (jaxort.training.orbax): resume bit for bit, on 1 device or 8.

The multi-device part runs ``_orbax_worker.py`` in a subprocess, since the
device count (``XLA_FLAGS=--xla_force_host_platform_device_count=8``) must be
set before JAX starts.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

ocp = pytest.importorskip("orbax.checkpoint")

import jax  # noqa: E402

from _workers import EIGHT_CPU_DEVICES, run_worker  # noqa: E402
from jaxort import checkpoint  # noqa: E402
from jaxort.errors import CheckpointError  # noqa: E402
from jaxort.training import orbax as jo  # noqa: E402
from jaxort.training import TrainProgram, pack, set_learning_rate  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
PROPERTIES = {"epoch": 3, "best_loss": 0.25, "note": "saved by orbax"}


@pytest.fixture(scope="module")
def eight_devices():
    return run_worker(HERE / "_orbax_worker.py", env=EIGHT_CPU_DEVICES, timeout=120)


@pytest.mark.parametrize("run", ["8->8", "1->1"])
def test_resume_on_the_same_devices_is_bit_for_bit(eight_devices, run):
    # 3 steps, an async save (the run trains on while it is written), restore, 2 more steps:
    # the losses, parameters, gradients and AdamW moments of an uninterrupted 5-step run.
    r = eight_devices[run]
    assert r["save_started"] and r["saved_run_went_on"]
    assert r["restored_equal_saved"]
    assert r["step"] == 5
    assert r["losses_equal"] and r["state_equal"], r
    assert r["properties"] == PROPERTIES


def test_restore_keeps_the_mesh_sharding(eight_devices):
    for run in ("8->8", "1->8"):
        r = eight_devices[run]
        assert r["specs"] == r["like_specs"]
        assert r["specs"]["fc1.weight"] == "P('fsdp', None)" and r["specs"]["fc2.bias"] == "P()"


@pytest.mark.parametrize("run", ["8->1", "1->8"])
def test_resume_on_other_devices(eight_devices, run):
    # The same files restore exactly; the steps after them are those of the saved state moved
    # to these devices, which round like the devices they run on (sharded reductions).
    r = eight_devices[run]
    assert r["restored_equal_saved"]
    assert r["step"] == 5
    # Bit for bit what the saved state gives when moved there without orbax and trained on ...
    assert r["direct_equal"], r
    # ... and within the sharding tests' tolerance of the uninterrupted run on those devices.
    assert r["loss_rel"] <= 1e-5 and r["excess"] <= 0, r
    assert r["loss_rel_vs_8"] <= 1e-5 and r["excess_vs_8"] <= 0, r
    assert r["properties"] == PROPERTIES


def test_restored_state_converts_to_an_ort_checkpoint(eight_devices):
    r = eight_devices["ort"]
    assert r["names"] and r["params_equal"] and r["moments_equal"]
    assert r["step"] == 3
    assert r["properties"] == PROPERTIES
    # the ORT file trains on as the orbax state restored on one device does
    assert r["resumed_losses_equal"] and r["resumed_equal"]


# --- in this process (one device) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp():
    folder = HERE.parent / "fixtures" / "golden" / "mlp_adamw"
    start = checkpoint.load(folder / "checkpoint")
    prog = TrainProgram.from_artifacts(folder / "training_model.onnx", folder / "eval_model.onnx",
                                       folder / "optimizer_model.onnx", checkpoint=start)
    batches = np.load(folder / "batches.npz")
    arrays = [batches[k] for k in batches.files if k.startswith("train::")]
    state = set_learning_rate(prog.init_state(start), 0.01)
    for i in range(2):
        state, _ = prog.train_step(state, *(a[i] for a in arrays))
        state = prog.lazy_reset_grad(prog.optimizer_step(state))
    return prog, start, state


def _leaves(state):
    keys = jax.dtypes.prng_key
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, keys) else x)
            for x in jax.tree.leaves(state)]


def test_round_trip_with_a_typed_key_and_a_packed_state(mlp, tmp_path):
    prog, start, state = mlp
    with jo.manager(tmp_path, max_to_keep=1) as mngr:
        assert jo.save(mngr, 1, pack(state))  # saved as the TrainState it packs
        mngr.wait_until_finished()
        back, _ = jo.restore(mngr, 1, prog.init_state(start))
        assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(_leaves(back), _leaves(state)))
        state = state.replace(rng=jax.random.key(7))
        assert jo.save(mngr, 2, state, {"epoch": np.int64(2), "loss": np.float32(0.5)})
        mngr.wait_until_finished()
        assert list(mngr.all_steps()) == [2]  # max_to_keep
        like = prog.init_state(start).replace(rng=jax.random.key(0))
        back, props = jo.restore(mngr, None, like)  # the latest
    assert props == {"epoch": 2, "loss": 0.5}
    assert jax.dtypes.issubdtype(back.rng.dtype, jax.dtypes.prng_key)
    assert np.array_equal(jax.random.key_data(back.rng), jax.random.key_data(state.rng))
    assert jax.tree.structure(back) == jax.tree.structure(state)
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(_leaves(back), _leaves(state)))
    assert int(back.step) == 2


def test_missing_step_names_the_folder_and_the_steps(mlp, tmp_path):
    prog, start, state = mlp
    with jo.manager(tmp_path) as mngr:
        with pytest.raises(CheckpointError, match="no checkpoint to restore in .*" + tmp_path.name):
            jo.restore(mngr, None, state)
        jo.save(mngr, 2, state)
        with pytest.raises(CheckpointError, match=r"no checkpoint for step 5 in .*" + tmp_path.name +
                           r".*the steps there are \[2\]"):
            jo.restore(mngr, 5, state)


def test_a_state_that_does_not_match_lists_every_difference(mlp, tmp_path):
    prog, start, state = mlp
    with jo.manager(tmp_path) as mngr:
        jo.save(mngr, 2, state)
        params = dict(state.params)
        params["fc3.bias"] = params.pop("fc2.bias")
        params["fc1.weight"] = np.zeros((16, 20), np.float32)
        with pytest.raises(CheckpointError) as err:
            jo.restore(mngr, 2, state.replace(params=params))
    msg = str(err.value)
    assert "step 2 in " in msg and tmp_path.name in msg and "(3 problems)" in msg
    assert "params/fc3.bias: missing from the checkpoint" in msg
    assert "params/fc2.bias: in the checkpoint, not in the state to restore into" in msg
    assert "params/fc1.weight: saved float32[20, 16], expected float32[16, 20]" in msg


def test_properties_must_be_int_float_or_str(mlp, tmp_path):
    _, _, state = mlp
    with jo.manager(tmp_path) as mngr:
        with pytest.raises(CheckpointError, match="property 'flag'"):
            jo.save(mngr, 1, state, {"flag": True})
        with pytest.raises(CheckpointError, match="property 'xs'"):
            jo.save(mngr, 1, state, {"xs": [1, 2]})
        with pytest.raises(CheckpointError, match="needs a TrainState"):
            jo.save(mngr, 1, {"w": np.ones(2)})
