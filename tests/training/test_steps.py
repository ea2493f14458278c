"""TrainProgram steps: accumulation, lazy reset, recompilation, Dropout seeds, BatchNorm."""

from __future__ import annotations


import numpy as np
import pytest

from jaxort import checkpoint as ckpt
from jaxort.errors import CheckpointError, InputError
from jaxort.training import TrainProgram, set_learning_rate, set_seed

def test_accumulation_and_lazy_reset_match_numpy(models, golden):
    program, start, batches, _ = golden("mlp_sgd")
    params = {n: np.asarray(v) for n, v in start.trainable.items()}
    x0, y0 = batches["train::input"][0], batches["train::labels"][0]
    x1, y1 = batches["train::input"][1], batches["train::labels"][1]
    loss0, g0 = models.mlp_softmax_ce(params, x0, y0)
    _, g1 = models.mlp_softmax_ce(params, x1, y1)

    state = program.init_state(start)
    state, (loss,) = program.train_step(state, x0, y0)
    np.testing.assert_allclose(float(loss), loss0, rtol=1e-5)
    for n in g0:
        np.testing.assert_allclose(np.asarray(state.grads[n]), g0[n], rtol=1e-5, atol=1e-6)
    state, _ = program.train_step(state, x0, y0)
    for n in g0:  # two steps on the same batch without a reset: twice one step's gradient
        np.testing.assert_allclose(np.asarray(state.grads[n]), 2 * g0[n], rtol=1e-5, atol=1e-6)
    state = program.lazy_reset_grad(state)
    for n in g0:  # ORT: the reset is lazy, the buffer still holds the old sum
        np.testing.assert_allclose(np.asarray(state.grads[n]), 2 * g0[n], rtol=1e-5, atol=1e-6)
    state, _ = program.train_step(state, x1, y1)
    for n in g1:  # ... and the next train step overwrites it
        np.testing.assert_allclose(np.asarray(state.grads[n]), g1[n], rtol=1e-5, atol=1e-6)


def test_optimizer_step_keeps_gradients_and_uses_learning_rate(models, golden):
    program, start, batches, _ = golden("mlp_sgd")
    params = {n: np.asarray(v) for n, v in start.trainable.items()}
    x0, y0 = batches["train::input"][0], batches["train::labels"][0]
    _, g0 = models.mlp_softmax_ce(params, x0, y0)
    state = set_learning_rate(program.init_state(start), 0.25)
    state, _ = program.train_step(state, x0, y0)
    state = program.optimizer_step(state)
    assert int(state.step) == 1
    for n in g0:
        np.testing.assert_allclose(np.asarray(state.grads[n]), g0[n], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(state.params[n]),
                                   params[n] - np.float32(0.25) * g0[n], rtol=1e-5, atol=1e-6)


def test_learning_rate_and_batch_contents_never_recompile(golden):
    program, start, batches, _ = golden("mlp_adamw")
    xs, ys = batches["train::input"], batches["train::labels"]
    state = program.init_state(start)
    for i in range(4):
        state = set_learning_rate(state, 0.01 * (i + 1))
        state, _ = program.train_step(state, xs[i], ys[i])
        state = program.optimizer_step(state)
        state = program.lazy_reset_grad(state)
        program.eval_step(state, xs[i], ys[i])
        state, _ = program.train_and_update(state, xs[i], ys[i])
    assert program.trace_count("train_step") == 1
    assert program.trace_count("optimizer_step") == 1
    assert program.trace_count("eval_step") == 1
    assert program.trace_count("train_and_update") == 1
    # A new batch shape compiles once, then is cached.
    for i in range(3):
        state, _ = program.train_step(state, xs[i][:4], ys[i][:4])
    assert program.trace_count("train_step") == 2
    # Neither does lazy_reset_grad, whose flag stays on the state's device.
    state = program.lazy_reset_grad(state)
    state, _ = program.train_step(state, xs[0], ys[0])
    assert program.trace_count("train_step") == 2


def test_train_and_update_matches_the_ort_call_pattern_result(golden):
    # train_and_update == train_step, optimizer_step, lazy_reset_grad; the golden
    # mlp_adamw run makes exactly these calls, so the result is ORT's.
    program, start, batches, folder = golden("mlp_adamw")
    state = set_learning_rate(program.init_state(start), 0.01)
    for i in range(6):
        state, (loss,) = program.train_and_update(
            state, batches["train::input"][i], batches["train::labels"][i])
    want = np.load(folder / "params_after.npz")
    for n in want.files:
        np.testing.assert_allclose(np.asarray(state.params[n]), want[n], rtol=1e-4, atol=1e-6)
    assert int(state.step) == 6 and not bool(state.accumulate)


def test_wrong_inputs_are_reported(golden):
    program, start, batches, _ = golden("mlp_adamw")
    state = program.init_state(start)
    with pytest.raises(InputError, match="input"):
        program.train_step(state, batches["train::input"][0])
    with pytest.raises(CheckpointError, match="fc1.weight"):
        program.init_state(start.replace(trainable={k: v for k, v in start.trainable.items()
                                                    if k != "fc1.weight"}))


def _dropout_program(models, seed_w=0):
    rng = np.random.default_rng(seed_w)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    model = models.dropout_model(w)
    start = ckpt.Checkpoint(trainable={"W": w})
    return TrainProgram.from_artifacts(model, checkpoint=start), start, w


def _dropout_losses(program, start, seed):
    rng = np.random.default_rng(1)
    state = set_seed(program.init_state(start), seed)
    losses = []
    for _ in range(3):
        x = rng.standard_normal((16, 8)).astype(np.float32)
        y = rng.integers(0, 4, 16).astype(np.int64)
        state, (loss,) = program.train_step(state, x, y)
        losses.append(np.asarray(loss))
    return np.array(losses)


def test_set_seed_makes_dropout_reproducible(models):
    program, start, _ = _dropout_program(models)
    a = _dropout_losses(program, start, 7)
    b = _dropout_losses(program, start, 7)
    c = _dropout_losses(program, start, 8)
    assert a.tobytes() == b.tobytes()
    assert not np.array_equal(a, c)


def test_dropout_is_random_in_train_and_identity_in_eval(models):
    program, start, w = _dropout_program(models)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.integers(0, 4, 16).astype(np.int64)
    z = x.astype(np.float64) @ w
    z = z - z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    want = -np.mean(logp[np.arange(16), y])
    state = program.init_state(start)
    (loss,) = program.eval_step(state, x, y)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    state, (train_loss,) = program.train_step(state, x, y)
    state, (train_loss2,) = program.train_step(state, x, y)
    assert float(train_loss) != float(train_loss2)  # a new mask each step


def test_the_key_advances_only_when_a_random_op_draws_one(models, golden):
    # A step splits the state's key for its random nodes; without any (the
    # MLP) the key stays as it was, so XLA can drop the split from the step.
    import jax

    program, start, _ = _dropout_program(models)
    state = program.init_state(start)
    key0 = np.asarray(state.rng)
    x = np.ones((16, 8), np.float32)
    y = np.zeros(16, np.int64)
    state, _ = program.train_step(state, x, y)
    np.testing.assert_array_equal(np.asarray(state.rng), np.asarray(jax.random.split(key0)[0]))

    program, start, batches, _ = golden("mlp_adamw")
    state = program.init_state(start)
    key0 = np.asarray(state.rng)
    state, _ = program.train_and_update(state, batches["train::input"][0], batches["train::labels"][0])
    np.testing.assert_array_equal(np.asarray(state.rng), key0)


def test_batchnorm_training_updates_running_stats(models):
    c, momentum, eps = 3, 0.8, 1e-5
    rng = np.random.default_rng(5)
    params = {"scale": rng.uniform(0.5, 1.5, c).astype(np.float32),
              "bias": rng.standard_normal(c).astype(np.float32),
              "mean": rng.standard_normal(c).astype(np.float32),
              "var": rng.uniform(0.5, 2.0, c).astype(np.float32)}
    model = models.bn_model(c, momentum, eps, params)
    start = ckpt.Checkpoint(
        trainable={"scale": params["scale"], "bias": params["bias"]},
        frozen={"mean": params["mean"], "var": params["var"]})
    program = TrainProgram.from_artifacts(model, checkpoint=start)
    assert program.trainable_names == ["scale", "bias"]
    assert program.frozen_names == ["mean", "var"]
    state = program.init_state(start)
    run_mean = params["mean"].astype(np.float64)
    run_var = params["var"].astype(np.float64)
    for _ in range(2):
        x = (rng.standard_normal((6, c, 4, 4)) * 2 + 1).astype(np.float32)
        xd = x.astype(np.float64)
        bm = xd.mean(axis=(0, 2, 3))
        bv = xd.var(axis=(0, 2, 3))  # biased
        shape = (1, c, 1, 1)
        yd = ((xd - bm.reshape(shape)) / np.sqrt(bv.reshape(shape) + eps)
              * params["scale"].reshape(shape) + params["bias"].reshape(shape))
        state, (loss,) = program.train_step(state, x)
        np.testing.assert_allclose(float(loss), np.mean(yd * yd), rtol=1e-5)
        run_mean = momentum * run_mean + (1 - momentum) * bm
        run_var = momentum * run_var + (1 - momentum) * bv
        np.testing.assert_allclose(np.asarray(state.frozen["mean"]), run_mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(state.frozen["var"]), run_var, rtol=1e-5, atol=1e-6)
    # Inference mode uses the running statistics.
    x = rng.standard_normal((6, c, 4, 4)).astype(np.float32)
    shape = (1, c, 1, 1)
    yd = ((x - run_mean.reshape(shape)) / np.sqrt(run_var.reshape(shape) + eps)
          * params["scale"].reshape(shape) + params["bias"].reshape(shape))
    (loss,) = program.eval_step(state, x)
    np.testing.assert_allclose(float(loss), np.mean(yd * yd), rtol=1e-5)
    saved = program.to_checkpoint(state, include_optimizer_state=False)
    np.testing.assert_allclose(saved.frozen["mean"], run_mean, rtol=1e-5, atol=1e-6)


def test_jax_callable_loss(models):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["output"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 6])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", 3])],
        initializer=[numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def mse(output, target):
        return ((output - target) ** 2).mean()

    start = ckpt.Checkpoint(trainable={"W": w})
    program = TrainProgram.from_artifacts(model, checkpoint=start, loss_fn=mse)
    assert program.input_names == ["x", "target"]
    assert program.output_names == ["loss", "output"]
    x = rng.standard_normal((5, 6)).astype(np.float32)
    t = rng.standard_normal((5, 3)).astype(np.float32)
    state, (loss, out) = program.train_step(program.init_state(start), x, t)
    r = x.astype(np.float64) @ w - t
    np.testing.assert_allclose(float(loss), np.mean(r * r), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out), x @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state.grads["W"]), 2 * x.T @ r / r.size, rtol=1e-5,
                               atol=1e-6)
    (eval_loss, _) = program.eval_step(state, x, t)
    np.testing.assert_allclose(float(eval_loss), np.mean(r * r), rtol=1e-5)
