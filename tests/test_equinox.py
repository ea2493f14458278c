"""jaxort.equinox: an ONNX model as an equinox module, against jaxort's functional core.

As in tests/test_nnx.py, every training run is made twice: with
``eqx.filter_grad`` (``filter_value_and_grad``) and ``eqx.filter_jit`` on an
``OnnxModule`` inside a user's equinox model, and as the functional core
does it, ``jax.value_and_grad`` over ``JaxGraph.apply_with_updates`` plus
the same optax transform; the losses must agree to rtol 1e-6. Models: a
small MLP written with onnx.helper and the corpus ResNet-18
(tests/fixtures/models/resnet18).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

eqx = pytest.importorskip("equinox")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from jaxort import checkpoint  # noqa: E402
from jaxort.errors import InputError, UnknownNameError  # noqa: E402
from jaxort.equinox import OnnxModule, lora_filter, trainable_filter  # noqa: E402
from jaxort.graph import JaxGraph  # noqa: E402
from _onnx_module_cases import (  # noqa: E402  (tests/_onnx_module_cases.py)
    B1, B2, RESNET, W1, W2, core_losses, cross_entropy, mlp_batches, mlp_head_core_losses, mlp_model,
    resnet_batches)

class Classifier(eqx.Module):
    """A user's equinox model: the ONNX MLP, then an eqx.nn.Linear head of its own."""

    body: OnnxModule
    head: eqx.nn.Linear

    def __init__(self, model, key):
        self.body = OnnxModule(model)
        self.head = eqx.nn.Linear(3, 3, key=key)

    def __call__(self, x):
        return jax.vmap(self.head)(jax.nn.relu(self.body(x)))


def test_initializers_are_leaves_named_as_in_onnx():
    module = OnnxModule(mlp_model())
    assert list(module.params) == [W1, B1, W2, B2] and module.frozen == {}
    leaves = jax.tree_util.tree_leaves_with_path(module)
    assert {path[-1].key for path, leaf in leaves if hasattr(path[-1], "key")} == {W1, B1, W2, B2}
    x = mlp_batches()[0][0]
    graph = JaxGraph(mlp_model())
    np.testing.assert_array_equal(module(x), graph.apply(graph.params, x)[0])
    # eqx.tree_at replaces a parameter by its ONNX name.
    zeroed = eqx.tree_at(lambda m: m.params[B2], module, jnp.full(3, 7.0))
    np.testing.assert_allclose(zeroed(x) - module(x), np.broadcast_to(7.0 - module.params[B2], (16, 3)),
                               rtol=1e-5, atol=1e-5)

    frozen = OnnxModule(mlp_model(), params=[W2, B2])
    assert list(frozen.params) == [W2, B2] and list(frozen.frozen) == [W1, B1]
    grads = eqx.filter_grad(lambda m, x: m(x).sum())(frozen, x)
    assert all(np.all(g == 0) for g in grads.frozen.values())  # read through stop_gradient
    assert all(np.any(g != 0) for g in grads.params.values())
    spec = trainable_filter(frozen)
    assert spec.params == {W2: True, B2: True} and spec.frozen == {W1: False, B1: False}
    trainable, _ = eqx.partition(frozen, spec)
    assert sorted(trainable.params) == [B2, W2] and all(v is None for v in trainable.frozen.values())


def test_mlp_inside_a_user_model_trains_like_the_functional_core(compiles):
    batches, tx = mlp_batches(), optax.adam(0.05)
    model = Classifier(mlp_model(), jax.random.key(0))
    everything = batches[0].reshape(-1, 4), batches[1].reshape(-1)
    initial_loss = float(cross_entropy(model(everything[0]), everything[1]))
    kernel, bias = np.asarray(model.head.weight).T, np.asarray(model.head.bias)
    opt_state = tx.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(lambda m: cross_entropy(m(x), y))(model)
        moves, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, moves), opt_state, loss

    got = []
    for x, y in zip(*batches):
        model, opt_state, loss = step(model, opt_state, x, y)
        got.append(float(loss))

    want, trained = mlp_head_core_losses(kernel, bias, batches, tx)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert float(cross_entropy(model(everything[0]), everything[1])) < 0.8 * initial_loss  # it learned
    for name, value in model.body.params.items():
        np.testing.assert_allclose(value, trained["body"][name], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(model.head.weight.T, trained["kernel"], rtol=1e-5, atol=1e-6)
    assert compiles.during(step, model, opt_state, batches[0][0], batches[1][0]) == 0  # compiled once


def test_resnet_trains_like_the_functional_core_with_running_statistics():
    case = json.loads((RESNET / "case.json").read_text())
    module = OnnxModule(RESNET / "model.onnx")
    # The default split is PyTorch's (and ORT's artifacts'): parameters train, buffers are frozen.
    assert list(module.params) == case["requires_grad"]
    assert list(module.frozen) == case["frozen_params"]
    initial_frozen = {n: np.asarray(v) for n, v in module.frozen.items()}
    assert module.inference is True
    module = eqx.nn.inference_mode(module, False)  # training mode: batch statistics written back
    assert module.inference is False

    tx = optax.adamw(1e-3, weight_decay=0.1)  # decay would move frozen values the optimizer saw
    trainable, rest = eqx.partition(module, trainable_filter(module))
    opt_state = tx.init(trainable)

    @eqx.filter_jit
    def step(trainable, rest, opt_state, x, y):
        def loss_fn(trainable):
            logits, updates = eqx.combine(trainable, rest).apply_with_updates(x)
            return cross_entropy(logits, y), updates

        (loss, updates), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(trainable)
        moves, opt_state = tx.update(grads, opt_state, trainable)
        return eqx.apply_updates(trainable, moves), rest.with_updates(updates), opt_state, loss

    got = []
    for x, y in zip(*resnet_batches()):
        trainable, rest, opt_state, loss = step(trainable, rest, opt_state, x, y)
        got.append(float(loss))
    module = eqx.combine(trainable, rest)

    graph = JaxGraph(RESNET / "model.onnx", params=case["requires_grad"] + case["frozen_params"])
    params = {n: jnp.asarray(graph.params[n]) for n in case["requires_grad"]}
    frozen = {n: jnp.asarray(graph.params[n]) for n in case["frozen_params"]}

    def apply(p, f, x, training):
        (logits,), updates = graph.apply_with_updates({**p, **f}, x, training=training)
        return logits, updates

    want, trained, stats = core_losses(apply, params, frozen, resnet_batches(), tx, training=True)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for name, value in module.params.items():
        np.testing.assert_allclose(value, trained[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for name, value in module.frozen.items():
        np.testing.assert_allclose(value, stats[name], rtol=1e-5, atol=1e-6, err_msg=name)
        assert not np.array_equal(value, initial_frozen[name]), name

    # A plain call drops the updates; in inference mode there are none.
    module = eqx.nn.inference_mode(module)
    _, updates = eqx.filter_jit(lambda m, x: m.apply_with_updates(x))(module, resnet_batches()[0][0])
    assert updates == {}
    saved = module.to_checkpoint()
    assert list(saved.trainable) == sorted(case["requires_grad"])
    assert list(saved.frozen) == sorted(case["frozen_params"])
    np.testing.assert_array_equal(saved.frozen["bn1.running_mean"], module.frozen["bn1.running_mean"])


def test_export_round_trip_equals_the_module(tmp_path):
    import onnxruntime

    module = OnnxModule(mlp_model(), params=[W2, B2])
    x, y = mlp_batches(1)
    grads = eqx.filter_grad(lambda m: cross_entropy(m(x[0]), y[0]))(module)
    module = eqx.apply_updates(module, jax.tree.map(lambda g: -0.5 * g, grads))
    assert not np.array_equal(module.params[W2], JaxGraph(mlp_model()).params[W2])
    values = {n: np.asarray(v) for n, v in module.values().items()}

    module.save_checkpoint(tmp_path / "ckpt", properties={"epoch": 1})
    loaded = checkpoint.load(tmp_path / "ckpt")
    assert list(loaded.trainable) == [B2, W2] and list(loaded.frozen) == [B1, W1]
    assert loaded.properties == {"epoch": 1}
    for name, value in loaded.parameters.items():
        np.testing.assert_array_equal(value, values[name], err_msg=name)

    module.save_onnx(tmp_path / "model.onnx")
    exported = onnx.load(tmp_path / "model.onnx")
    inits = {t.name: numpy_helper.to_array(t) for t in exported.graph.initializer}
    for name, value in values.items():
        np.testing.assert_array_equal(inits[name], value, err_msg=name)
    np.testing.assert_array_equal(inits["shape"], [-1, 3])
    graph = JaxGraph(exported)
    np.testing.assert_array_equal(graph.apply(graph.params, x[0])[0], module(x[0]))
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x[0]})[0], module(x[0]), rtol=1e-5, atol=1e-6)


def test_bad_names_raise_errors_that_name_them():
    with pytest.raises(UnknownNameError, match="'nope'"):
        OnnxModule(mlp_model(), params=[W1, "nope"])
    with pytest.raises(InputError, match=r"shape \(int64\)"):
        OnnxModule(mlp_model(), params=["shape"])
    with pytest.raises(UnknownNameError, match=f"'{W1}'"):
        OnnxModule(mlp_model()).with_updates({W1: jnp.zeros((8, 4))})  # trainable, not frozen


def test_missing_equinox_is_a_clear_import_error():
    blocked = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['equinox'] = None; import jaxort.equinox"],
        capture_output=True, text=True)
    assert blocked.returncode != 0 and "pip install 'jaxort[equinox]'" in blocked.stderr


def test_lora_trains_only_the_adapters_and_the_exports_merge_them():
    base = OnnxModule(mlp_model())
    module = base.with_lora([W1, W2], 2, key=jax.random.key(0))
    # W1 is a Gemm weight stored [out, in] (transB=1), W2 a MatMul weight [in, out].
    assert [a.shape for a in module.lora[W1]] == [(4, 2), (2, 8)] and W1 in module.lora_transposed
    assert [a.shape for a in module.lora[W2]] == [(8, 2), (2, 3)] and W2 not in module.lora_transposed
    xs, ys = mlp_batches()
    np.testing.assert_array_equal(module(xs[0]), base(xs[0]))  # B starts at zero
    train, rest = eqx.partition(module, lora_filter(module))
    tx = optax.sgd(0.5)
    opt_state = tx.init(train)

    @eqx.filter_jit
    def step(train, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(lambda t: cross_entropy(eqx.combine(t, rest)(x), y))(train)
        updates, opt_state = tx.update(grads, opt_state)
        return eqx.apply_updates(train, updates), opt_state, loss

    losses = []
    for x, y in zip(xs, ys):
        train, opt_state, loss = step(train, opt_state, x, y)
        losses.append(float(loss))
    tuned = eqx.combine(train, rest)
    assert losses[-1] < losses[0]
    for name in base.params:  # the base weights did not move ...
        np.testing.assert_array_equal(tuned.params[name], base.params[name])
    for name in (W1, W2):  # ... the adapters did
        assert not np.array_equal(tuned.lora[name][1], module.lora[name][1])
    merged = tuned.to_checkpoint().trainable
    a, b = (np.asarray(v) for v in tuned.lora[W1])
    np.testing.assert_allclose(merged[W1], np.asarray(base.params[W1]) + (a @ b).T, rtol=1e-6, atol=1e-7)
    a, b = (np.asarray(v) for v in tuned.lora[W2])
    np.testing.assert_allclose(merged[W2], np.asarray(base.params[W2]) + a @ b, rtol=1e-6, atol=1e-7)
    exported = JaxGraph(tuned.to_onnx())
    np.testing.assert_allclose(exported.apply(exported.params, xs[0])[0], tuned(xs[0]), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match=f"lora: initializer '{W1}' already has a LoRA adapter"):
        tuned.with_lora(W1, 2, key=jax.random.key(1))
    with pytest.raises(InputError, match=f"lora: initializer '{B1}' has shape"):
        base.with_lora(B1, 2, key=jax.random.key(1))
