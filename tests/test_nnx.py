"""jaxort.nnx: an ONNX model as a flax.nnx module, against jaxort's functional core.

Every training run here is run twice: through ``nnx.Optimizer`` on an
``OnnxModule`` inside a user's nnx model, and as the functional core does it,
``jax.value_and_grad`` over ``JaxGraph.apply_with_updates`` plus the same
optax transform on a dict of params; the losses must agree to rtol 1e-6.
Models: a small MLP written with onnx.helper (Gemm with transB=1, MatMul, a
shape constant, names with dots and slashes) and the corpus ResNet-18
(tests/fixtures/models/resnet18, BatchNormalization in training mode).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

nnx = pytest.importorskip("flax.nnx")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from jaxort import checkpoint  # noqa: E402
from jaxort.errors import InputError, UnknownNameError  # noqa: E402
from jaxort.graph import JaxGraph  # noqa: E402
from _onnx_module_cases import (  # noqa: E402  (tests/_onnx_module_cases.py)
    B1, B2, RESNET, W1, W2, core_losses, cross_entropy, mlp_batches, mlp_head_core_losses, mlp_model,
    resnet_batches)
from jaxort.nnx import OnnxFrozen, OnnxModule  # noqa: E402

def elementwise_model(op: str, weight: str) -> onnx.ModelProto:
    """y = op(x, weight), a [2, 2] float initializer named ``weight``."""
    graph = helper.make_graph(
        [helper.make_node(op, ["x", weight], ["y"], name="node")], "elementwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.full((2, 2), 3.0, np.float32), weight)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def graph_apply(graph: JaxGraph):
    """``apply`` for :func:`core_losses`: the graph's first output and its state updates."""
    def apply(params, frozen, x, training):
        outputs, updates = graph.apply_with_updates({**params, **frozen}, x, training=training)
        return outputs[0], updates
    return apply


def nnx_losses(model, batches, tx, wrt=nnx.Param):
    optimizer = nnx.Optimizer(model, tx, wrt=wrt)

    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: cross_entropy(m(x), y), argnums=nnx.DiffState(0, wrt))(model)
        optimizer.update(model, grads)
        return loss

    return [float(step(model, optimizer, x, y)) for x, y in zip(*batches)], step, optimizer


def arrays(variables) -> dict:
    return {n: np.asarray(v.get_value()) for n, v in variables.items()}


class Classifier(nnx.Module):
    """A user's nnx model: the ONNX MLP, then an nnx.Linear head of its own."""

    def __init__(self, model, rngs):
        self.body = OnnxModule(model)
        self.head = nnx.Linear(3, 3, rngs=rngs)

    def __call__(self, x):
        return self.head(jax.nn.relu(self.body(x)))


def test_initializers_are_nnx_variables_named_as_in_onnx():
    module = OnnxModule(mlp_model())
    assert list(module.params) == [W1, B1, W2, B2]
    assert all(isinstance(v, nnx.Param) for v in module.params.values())
    assert len(module.frozen) == 0  # the int64 shape stays a constant of the graph
    state = nnx.to_flat_state(nnx.state(module, nnx.Param))
    assert sorted(path[-1] for path, _ in state) == sorted([W1, B1, W2, B2])
    model = mlp_model()
    for init in model.graph.initializer[:4]:
        np.testing.assert_array_equal(module.params[init.name][...], numpy_helper.to_array(init))
    x = mlp_batches()[0][0]
    np.testing.assert_array_equal(module(x), JaxGraph(model).apply(JaxGraph(model).params, x)[0])

    frozen = OnnxModule(mlp_model(), params=[W2, B2])
    assert list(frozen.params) == [W2, B2]
    assert list(frozen.frozen) == [W1, B1]
    assert all(type(v) is OnnxFrozen for v in frozen.frozen.values())
    assert len(nnx.to_flat_state(nnx.state(frozen, nnx.Param))) == 2

    for name in ("items", "train", "_hidden"):  # any name, even a dict's or a Module's method
        odd = OnnxModule(elementwise_model("Add", name))
        assert list(odd.params) == [name]
        np.testing.assert_array_equal(odd(np.ones((2, 2), np.float32)), np.full((2, 2), 4.0))


def test_mlp_inside_a_user_model_trains_like_the_functional_core(compiles):
    batches, tx = mlp_batches(), optax.adam(0.05)
    model = Classifier(mlp_model(), nnx.Rngs(0))
    everything = batches[0].reshape(-1, 4), batches[1].reshape(-1)
    initial_loss = float(cross_entropy(model(everything[0]), everything[1]))
    kernel, bias = np.asarray(model.head.kernel[...]), np.asarray(model.head.bias[...])
    got, step, optimizer = nnx_losses(model, batches, tx)

    want, trained = mlp_head_core_losses(kernel, bias, batches, tx)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert float(cross_entropy(model(everything[0]), everything[1])) < 0.8 * initial_loss  # it learned
    for name, value in arrays(model.body.params).items():
        np.testing.assert_allclose(value, trained["body"][name], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(model.head.kernel[...], trained["kernel"], rtol=1e-5, atol=1e-6)
    x, y = batches[0][0], batches[1][0]
    assert compiles.during(step, model, optimizer, x, y) == 0  # compiled once


def test_resnet_trains_like_the_functional_core_and_writes_running_statistics():
    case = json.loads((RESNET / "case.json").read_text())

    class Net(nnx.Module):
        def __init__(self):
            self.backbone = OnnxModule(RESNET / "model.onnx")

        def __call__(self, x):
            return self.backbone(x)

    model = Net()
    # The default split is PyTorch's (and ORT's artifacts'): parameters train, buffers are frozen.
    assert list(model.backbone.params) == case["requires_grad"]
    assert list(model.backbone.frozen) == case["frozen_params"]
    initial_frozen = arrays(model.backbone.frozen)
    x0 = resnet_batches()[0][0]
    assert model.backbone.deterministic is True  # inference mode by default
    model.train()
    assert model.backbone.deterministic is False
    tx = optax.adamw(1e-3, weight_decay=0.1)  # decay would move frozen values the optimizer saw
    got, _, _ = nnx_losses(model, resnet_batches(), tx)

    graph = JaxGraph(RESNET / "model.onnx", params=case["requires_grad"] + case["frozen_params"])
    params = {n: jnp.asarray(graph.params[n]) for n in case["requires_grad"]}
    frozen = {n: jnp.asarray(graph.params[n]) for n in case["frozen_params"]}
    want, trained, stats = core_losses(graph_apply(graph), params, frozen, resnet_batches(), tx,
                                       training=True)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for name, value in arrays(model.backbone.params).items():
        np.testing.assert_allclose(value, trained[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for name, value in arrays(model.backbone.frozen).items():
        np.testing.assert_allclose(value, stats[name], rtol=1e-5, atol=1e-6, err_msg=name)
        assert not np.array_equal(value, initial_frozen[name]), name  # written by the train steps

    model.eval()
    assert model.backbone.deterministic is True
    before = arrays(model.backbone.frozen)
    nnx.jit(lambda model, x: model(x))(model, x0)  # eagerly, op by op, a ResNet call takes seconds
    assert all(np.array_equal(v, before[n]) for n, v in arrays(model.backbone.frozen).items())

    saved = model.backbone.to_checkpoint()
    assert list(saved.trainable) == sorted(case["requires_grad"])
    assert list(saved.frozen) == sorted(case["frozen_params"])
    np.testing.assert_array_equal(saved.frozen["bn1.running_mean"], model.backbone.frozen["bn1.running_mean"][...])


def test_lora_on_a_gemm_weight_trains_only_the_lora_params():
    xs, ys = mlp_batches(1)
    batches, tx = (np.repeat(xs, 6, axis=0), np.repeat(ys, 6, axis=0)), optax.sgd(0.1)  # one batch, 6 steps
    module = OnnxModule(mlp_model())
    x = batches[0][0]
    before_lora = np.asarray(module(x))
    module.lora(W1, 2, rngs=nnx.Rngs(3))
    adapter = module.lora_adapters[W1]
    assert adapter.lora_a[...].shape == (4, 2) and adapter.lora_b[...].shape == (2, 8)  # [in, r], [r, out]
    assert isinstance(adapter.lora_a, nnx.LoRAParam)
    np.testing.assert_array_equal(module(x), before_lora)  # B starts at zero
    base = arrays(module.params)
    a0, b0 = np.asarray(adapter.lora_a[...]), np.asarray(adapter.lora_b[...])

    got, _, _ = nnx_losses(module, batches, tx, wrt=nnx.LoRAParam)

    for name, value in arrays(module.params).items():  # the base weights did not move
        np.testing.assert_array_equal(value, base[name], err_msg=name)
    assert not np.array_equal(adapter.lora_a[...], a0)
    assert not np.array_equal(adapter.lora_b[...], b0)

    # The functional core trains A and B of W1 + (A @ B)^T (the Gemm weight is [out, in]).
    graph = JaxGraph(mlp_model())
    fixed = {n: jnp.asarray(v) for n, v in base.items()}

    def apply(p, frozen, x, training):
        weights = {**fixed, W1: fixed[W1] + (p["a"] @ p["b"]).T}
        (logits,), updates = graph.apply_with_updates(weights, x, training=training)
        return logits, updates

    want, trained, _ = core_losses(apply, {"a": jnp.asarray(a0), "b": jnp.asarray(b0)}, {}, batches, tx,
                                   training=False)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert want[-1] < want[0]
    np.testing.assert_allclose(adapter.lora_a[...], trained["a"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adapter.lora_b[...], trained["b"], rtol=1e-5, atol=1e-6)


def test_lora_orients_matmul_and_gemm_weights():
    module = OnnxModule(mlp_model())
    module.lora([W1, W2], 3, rngs=nnx.Rngs(0), b_initializer=nnx.initializers.normal(1.0))
    a1, b1 = (np.asarray(v) for v in (module.lora_adapters[W1].lora_a[...], module.lora_adapters[W1].lora_b[...]))
    a2, b2 = (np.asarray(v) for v in (module.lora_adapters[W2].lora_a[...], module.lora_adapters[W2].lora_b[...]))
    assert a2.shape == (8, 3) and b2.shape == (3, 3)  # MatMul weight [in, out] = [8, 3]
    values = module.values()
    base = arrays(module.params)
    np.testing.assert_allclose(values[W1], base[W1] + (a1 @ b1).T, rtol=1e-6)
    np.testing.assert_allclose(values[W2], base[W2] + a2 @ b2, rtol=1e-6)
    x = mlp_batches()[0][0]
    want = np.maximum(x @ values[W1].T + base[B1], 0) @ values[W2] + base[B2]
    np.testing.assert_allclose(module(x), want, rtol=1e-5, atol=1e-5)


def test_export_round_trip_equals_the_module(tmp_path):
    import onnxruntime

    module = OnnxModule(mlp_model(), params=[W2, B2])
    module.lora(W2, 2, rngs=nnx.Rngs(1))
    nnx_losses(module, mlp_batches(3), optax.sgd(0.1))  # W2, B2 and the adapter train; W1, B1 frozen
    values = {n: np.asarray(v) for n, v in module.values().items()}
    assert not np.array_equal(values[W2], module.params[W2][...])  # the adapter is merged

    module.save_checkpoint(tmp_path / "ckpt", properties={"epoch": 3})
    loaded = checkpoint.load(tmp_path / "ckpt")
    assert list(loaded.trainable) == [B2, W2] and list(loaded.frozen) == [B1, W1]  # by name, as ORT
    assert loaded.properties == {"epoch": 3}
    for name, value in loaded.parameters.items():
        np.testing.assert_array_equal(value, values[name], err_msg=name)

    module.save_onnx(tmp_path / "model.onnx")
    exported = onnx.load(tmp_path / "model.onnx")
    inits = {t.name: numpy_helper.to_array(t) for t in exported.graph.initializer}
    assert sorted(inits) == sorted([W1, B1, W2, B2, "shape"])
    for name, value in values.items():
        np.testing.assert_array_equal(inits[name], value, err_msg=name)
    np.testing.assert_array_equal(inits["shape"], [-1, 3])
    x = mlp_batches()[0][1]
    graph = JaxGraph(exported)
    np.testing.assert_array_equal(graph.apply(graph.params, x)[0], module(x))
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], module(x), rtol=1e-5, atol=1e-6)
    # The checkpoint fits the original model too.
    restored = checkpoint.load_to_model(tmp_path / "ckpt", mlp_model())
    assert {t.name: numpy_helper.to_array(t).tolist() for t in restored.graph.initializer} == {
        n: v.tolist() for n, v in inits.items()}


def test_bad_names_raise_errors_that_name_them():
    with pytest.raises(UnknownNameError, match="'nope'"):
        OnnxModule(mlp_model(), params=[W1, "nope"])
    with pytest.raises(InputError, match=r"shape \(int64\)"):
        OnnxModule(mlp_model(), params=["shape"])
    module = OnnxModule(mlp_model())
    with pytest.raises(UnknownNameError, match="'fc9.weight'"):
        module.lora(["fc9.weight"], 2, rngs=nnx.Rngs(0))
    with pytest.raises(InputError, match=f"'{B1}' has shape \\(8,\\)"):
        module.lora(B1, 2, rngs=nnx.Rngs(0))
    with pytest.raises(InputError, match="rank"):
        module.lora(W1, 0, rngs=nnx.Rngs(0))
    module.lora(W1, 2, rngs=nnx.Rngs(0))
    with pytest.raises(InputError, match=f"'{W1}' already has a LoRA adapter"):
        module.lora(W1, 2, rngs=nnx.Rngs(0))
    resnet = OnnxModule(RESNET / "model.onnx")
    with pytest.raises(InputError, match=r"'conv1.weight' has shape \(3, 3, 7, 7\)"):
        resnet.lora("conv1.weight", 2, rngs=nnx.Rngs(0))
    resnet.lora("fc.weight", 2, rngs=nnx.Rngs(0))  # the Gemm head (transB=1): [out, in] = [10, 24]
    assert resnet.lora_adapters["fc.weight"].lora_a[...].shape == (24, 2)
    with pytest.raises(InputError, match="'w' is input 1 of Mul node 'node'"):
        OnnxModule(elementwise_model("Mul", "w")).lora("w", 1, rngs=nnx.Rngs(0))


def test_the_core_never_imports_flax_or_equinox():
    code = ("import sys, jaxort, jaxort.graph, jaxort.training, jaxort.api, jaxort.session, "
            "jaxort.checkpoint, jaxort.backend\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flax', 'equinox')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    blocked = subprocess.run([sys.executable, "-c", "import sys; sys.modules['flax'] = None; import jaxort.nnx"],
                             capture_output=True, text=True)
    assert blocked.returncode != 0 and "pip install 'jaxort[flax]'" in blocked.stderr
