"""Sharded training on 8 fake CPU devices equals 1 device; micro-batches equal one big batch.

The multi-device part runs ``_sharding_worker.py`` in a subprocess, since the
device count (``XLA_FLAGS=--xla_force_host_platform_device_count=8``) must be
set before JAX starts.
"""

from __future__ import annotations

import pathlib
import tempfile

import numpy as np
import pytest

from _workers import EIGHT_CPU_DEVICES, run_worker
from jaxort import checkpoint
from jaxort.errors import InputError, TrainingError
from jaxort.training import TrainProgram, make_mesh, set_learning_rate, shard

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def eight_devices():
    return run_worker(HERE / "_sharding_worker.py", env=EIGHT_CPU_DEVICES, timeout=120)


@pytest.mark.parametrize("case", ["mlp_adamw", "cnn_bce"])
@pytest.mark.parametrize("layout", ["data", "fsdp", "data2xfsdp4"])
def test_eight_devices_equal_one(eight_devices, case, layout):
    r = eight_devices[f"{case}/{layout}"]
    assert r["step"] == 5
    assert r["loss_rel"] <= 1e-5
    # assert_allclose(rtol=1e-5, atol=1e-7) on every parameter and moment
    assert r["param_excess"] <= 0 and r["moment_excess"] <= 0, r
    assert r["compiles"] == 1  # five steps, one compilation
    assert r["same_bytes"]  # a sharded state saves the same file as the state it came from


def test_fsdp_splits_parameters_gradients_and_moments(eight_devices):
    r = eight_devices["mlp_adamw/fsdp"]
    # the largest dim the axis size (8) divides; fc2.bias [5] has none and is replicated
    assert r["specs"] == {"fc1.weight": "P(None, 'fsdp')", "fc1.bias": "P('fsdp',)",
                          "fc2.weight": "P('fsdp', None)", "fc2.bias": "P()"}
    assert r["grad_specs"] == r["specs"]
    assert set(r["moment_specs"]) >= set(r["specs"].values())
    # one device holds ~1/8 of the parameter bytes: (40 + 2 + 10 + 5) / 421 floats
    assert abs(r["fraction"] - 57 / 421) < 1e-9
    assert abs(eight_devices["digits_mlp/fsdp_fraction"] - 1 / 8) < 0.005
    assert eight_devices["mlp_adamw/data"]["fraction"] == 1.0


def test_two_dimensional_mesh(eight_devices):
    r = eight_devices["mlp_adamw/data2xfsdp4"]
    assert r["specs"]["fc1.weight"] == "P('fsdp', None)"  # 20 divides by 4 and is the largest dim
    assert abs(r["fraction"] - (80 + 4 + 20 + 5) / 421) < 1e-9


def test_batch_not_divisible_by_the_data_axis(eight_devices):
    msg = eight_devices["mlp_adamw/error"]
    assert "'input'" in msg and "batch size 6" in msg and "size 8" in msg


def test_api_module_with_a_mesh(eight_devices):
    assert eight_devices["api/spec"] == "P('fsdp', None)"
    assert eight_devices["api/loss_rel"] <= 1e-5
    assert eight_devices["api/param_excess"] <= 0


# --- in this process (one device) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    from jaxort.demo import build_digits_mlp, load_digits
    from jaxort.training.artifacts import LossType, OptimType, float_initializers, generate_artifacts
    with tempfile.TemporaryDirectory() as tmp:
        model = build_digits_mlp(64, 0)
        arts = generate_artifacts(model, float_initializers(model), loss=LossType.CrossEntropyLoss,
                                  optimizer=OptimType.AdamW, artifact_directory=tmp,
                                  additional_output_names=["output"])
        start = checkpoint.load(arts.checkpoint)
        prog = TrainProgram.from_artifacts(arts.training_model, arts.eval_model, arts.optimizer_model,
                                           checkpoint=start)
    images, target = load_digits()
    x = (images.reshape(len(images), 64) / 16.0).astype(np.float32)
    return prog, start, x, target.astype(np.int64)


def test_micro_batches_equal_one_batch(digits):
    prog, start, x, y = digits
    ref = whole = None
    for micro in (1, 4):
        state = set_learning_rate(prog.init_state(start), 0.01)
        losses, logits = [], []
        for i in range(5):
            batch = slice(64 * i, 64 * (i + 1))
            state, (loss, out) = prog.train_step(state, x[batch], y[batch], micro_batches=micro)
            grads = {n: np.asarray(g) for n, g in state.grads.items()} if i == 0 else grads
            state = prog.lazy_reset_grad(prog.optimizer_step(state))
            losses.append(float(loss))
            logits.append(np.asarray(out))
        result = (losses, grads, logits, {n: np.asarray(v) for n, v in state.params.items()})
        if micro == 1:
            ref = result
        else:
            whole = result
    np.testing.assert_allclose(whole[0], ref[0], rtol=1e-5)
    for n in ref[1]:
        np.testing.assert_allclose(whole[1][n], ref[1][n], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(whole[3][n], ref[3][n], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.concatenate(whole[2]), np.concatenate(ref[2]), rtol=1e-5, atol=1e-6)


def test_micro_batches_are_the_mean_of_four_train_steps(digits):
    # ORT's semantics: a train step over a batch gives the gradient of the mean loss;
    # four train steps over its quarters add four such gradients: their mean is the batch's.
    prog, start, x, y = digits
    state, _ = prog.train_step(prog.init_state(start), x[:64], y[:64], micro_batches=4)
    summed = prog.init_state(start)
    for q in range(4):
        summed, _ = prog.train_step(summed, x[16 * q:16 * (q + 1)], y[16 * q:16 * (q + 1)])
    for n in state.grads:
        np.testing.assert_allclose(np.asarray(state.grads[n]), np.asarray(summed.grads[n]) / 4,
                                   rtol=1e-5, atol=1e-7)


def test_micro_batches_compile_once_and_check_the_batch(digits):
    prog, start, x, y = digits
    state, _ = prog.train_step(prog.init_state(start), x[:64], y[:64], micro_batches=4)
    before = prog.trace_count("train_step")
    for i in range(3):
        state, _ = prog.train_step(state, x[64 * i:64 * (i + 1)], y[64 * i:64 * (i + 1)], micro_batches=4)
    assert prog.trace_count("train_step") == before
    with pytest.raises(InputError, match="'input': batch size 30 is not divisible by micro_batches=4"):
        prog.train_step(state, x[:30], y[:30], micro_batches=4)
    with pytest.raises(InputError, match="positive integer"):
        prog.train_step(state, x[:64], y[:64], micro_batches=0)


def test_shard_refuses_bad_meshes_and_strategies(digits):
    prog, start, _, _ = digits
    mesh = make_mesh((1,), ("data",))
    with pytest.raises(TrainingError, match="strategy must be one of"):
        shard(prog.init_state(start), mesh, "zero3")
    with pytest.raises(TrainingError, match="needs a mesh axis named 'fsdp'"):
        shard(prog.init_state(start), mesh, "fsdp")
    with pytest.raises(TrainingError, match="'data' and/or 'fsdp'"):
        shard(prog.init_state(start), make_mesh((1,), ("model",)), "data")


@pytest.mark.accelerator
@pytest.mark.parametrize("strategy", ["data", "fsdp"])
def test_the_local_devices_train_like_one_device(digits, strategy):
    # On whatever devices this process sees (one CPU in `make test`, every GPU in `make gpu-check`).
    import jax

    prog, start, x, y = digits
    n = len(jax.local_devices())
    batch = 16 * n
    mesh = make_mesh((n,), (strategy,))
    runs = []
    for state in (prog.init_state(start), shard(prog.init_state(start), mesh, strategy)):
        state = set_learning_rate(state, 0.01)
        losses = []
        for i in range(3):
            state, (loss, _) = prog.train_and_update(state, x[batch * i:batch * (i + 1)], y[batch * i:batch * (i + 1)])
            losses.append(float(loss))
        runs.append((losses, {k: np.asarray(v) for k, v in state.params.items()}))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-5)
    for k in runs[0][1]:
        np.testing.assert_allclose(runs[1][1][k], runs[0][1][k], rtol=1e-5, atol=1e-6)
