"""jaxort.onnxblock against ORT's own onnxblock, run where onnxruntime-training is installed.

The same custom loss is written once for each package (only the import
differs). ORT's ``generate_artifacts`` with ORT's blocks and jaxort's with
jaxort's must give the same eval and optimizer models (names aside: ORT
numbers them across the process), and ONNX Runtime 1.19.2's training API must
train both sets of files to the same losses and parameters. Skipped without
onnxruntime.training (the project's own environment has inference only).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

ort_training = pytest.importorskip("onnxruntime.training")

from onnxruntime.training import api as ort_api  # noqa: E402
from onnxruntime.training import artifacts as ort_artifacts  # noqa: E402
from onnxruntime.training import onnxblock as ort_onnxblock  # noqa: E402

from jaxort import api as jaxort_api  # noqa: E402
from jaxort import onnxblock  # noqa: E402
from jaxort.training import artifacts as jaxort_artifacts  # noqa: E402

TRAINABLE = ["w1", "b1", "w_reg", "b_reg", "w_cls"]


_NAME = re.compile(r"onnx::([^:\s\"']+)::(\d+)")


def _canonical(model: onnx.ModelProto) -> str:
    """The model as text with the ``n`` of ``onnx::<token>::<n>`` counted from its smallest (ORT's
    counter runs across the process); the order in which names were drawn still shows."""
    text = str(model)
    first = min((int(m.group(2)) for m in _NAME.finditer(text)), default=0)
    return _NAME.sub(lambda m: f"onnx::{m.group(1)}::{int(m.group(2)) - first}", text)


def _both(helpers, tmp_path, loss, optimizer, requires_grad=TRAINABLE, **kwargs):
    """(params, ORT's artifact directory, jaxort's) for ``loss(ob)`` and ``optimizer(ob)``."""
    params = helpers.two_head_params()
    model = helpers.two_head_model(params)
    dirs = {}
    for name, ob, generate in (("ort", ort_onnxblock, ort_artifacts.generate_artifacts),
                               ("jaxort", onnxblock, jaxort_artifacts.generate_artifacts)):
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        generate(model, requires_grad=requires_grad, frozen_params=["b_cls"], loss=loss(ob),
                 optimizer=optimizer(ob), artifact_directory=dirs[name], **kwargs)
    return params, dirs["ort"], dirs["jaxort"]


def _batches(helpers, n, seed=5):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(helpers.BATCH, helpers.IN)).astype(np.float32),
             rng.normal(size=(helpers.BATCH, helpers.REG)).astype(np.float32),
             rng.integers(0, helpers.CLASSES, helpers.BATCH).astype(np.int64)) for _ in range(n)]


def _train(api, directory, batches, lr, optimizer_uri=None):
    """Losses and final parameters of a run of ``api`` (ORT's or jaxort's training API) on the files."""
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    optimizer = api.Optimizer(optimizer_uri or str(directory / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(lr)
    losses = []
    for batch in batches:
        module.train()
        losses.append(float(np.asarray(module(*batch)).reshape(-1)[0]))
        optimizer.step()
        module.lazy_reset_grad()
    return np.array(losses), {n: np.array(state.parameters[n].data) for n in TRAINABLE}


def test_custom_loss_and_adamw_train_in_ort_as_orts_own(helpers, tmp_path):
    _, ort_dir, jaxort_dir = _both(helpers, tmp_path, helpers.weighted_losses,
                                   lambda ob: ob.optim.AdamW(weight_decay=0.01))
    for name in ("eval_model.onnx", "optimizer_model.onnx"):
        assert _canonical(onnx.load(jaxort_dir / name)) == _canonical(onnx.load(ort_dir / name)), name
    assert (jaxort_dir / "checkpoint").read_bytes() == (ort_dir / "checkpoint").read_bytes()
    batches = _batches(helpers, 2) * 3
    ort_losses, ort_params = _train(ort_api, ort_dir, batches, 0.05)
    ours_losses, ours_params = _train(ort_api, jaxort_dir, batches, 0.05)
    print("ORT on ORT's files:", ort_losses.tolist(), "\nORT on jaxort's files:", ours_losses.tolist())
    assert ort_losses[4] < ort_losses[0] and ort_losses[5] < ort_losses[1]  # it trains
    np.testing.assert_allclose(ours_losses, ort_losses, rtol=1e-5)
    for name in TRAINABLE:
        np.testing.assert_allclose(ours_params[name], ort_params[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # jaxort's own training API on jaxort's files, for the same numbers.
    jax_losses, jax_params = _train(jaxort_api, jaxort_dir, batches, 0.05)
    np.testing.assert_allclose(jax_losses, ort_losses, rtol=1e-5)
    for name in TRAINABLE:
        np.testing.assert_allclose(jax_params[name], ort_params[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("loss", [
    lambda ob: ob.loss.MSELoss(reduction="sum"),
    lambda ob: ob.loss.L1Loss(),
    lambda ob: ob.loss.BCEWithLogitsLoss(weight=np.float32([0.5, 1.0, 2.0]), pos_weight=np.float32([3.0, 1.0, 0.5])),
    lambda ob: ob.loss.CrossEntropyLoss(reduction="sum", ignore_index=1),
], ids=["mse_sum", "l1", "bce_weights", "ce_sum_ignore"])
def test_loss_blocks_write_orts_nodes_and_train_alike(loss, helpers, tmp_path):
    on_cls = "CrossEntropy" in loss(onnxblock).__class__.__name__
    _, ort_dir, jaxort_dir = _both(helpers, tmp_path, loss, lambda ob: ob.optim.SGD(),
                                   ["w1", "b1", "w_cls"] if on_cls else ["w1", "b1", "w_reg", "b_reg"],
                                   loss_input_names=["cls" if on_cls else "reg"])
    assert _canonical(onnx.load(jaxort_dir / "eval_model.onnx")) == _canonical(onnx.load(ort_dir / "eval_model.onnx"))
    rng = np.random.default_rng(3)
    batches = []
    for x, target, labels in _batches(helpers, 2):
        if "BCE" in loss(onnxblock).__class__.__name__:
            target = rng.uniform(0, 1, target.shape).astype(np.float32)
        batches.append((x, labels) if on_cls else (x, target))
    batches *= 2  # each batch twice: its loss must drop
    ort_losses, ort_state = _train_subset(ort_api, ort_dir, batches)
    ours_losses, ours_state = _train_subset(ort_api, jaxort_dir, batches)
    print(loss(onnxblock).__class__.__name__, ort_losses.tolist(), ours_losses.tolist())
    assert ort_losses[2] < ort_losses[0] and ort_losses[3] < ort_losses[1]  # it trains
    np.testing.assert_allclose(ours_losses, ort_losses, rtol=1e-5)
    np.testing.assert_allclose(ours_state.parameters["w1"].data, ort_state.parameters["w1"].data, rtol=1e-5,
                               atol=1e-7)


def _train_subset(api, directory, batches):
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(0.02)
    losses = []
    for batch in batches:
        losses.append(float(np.asarray(module(*batch)).reshape(-1)[0]))
        optimizer.step()
        module.lazy_reset_grad()
    return np.array(losses), state


def test_ort_clips_jaxorts_optimizer_model_as_torch_does(helpers, tmp_path):
    # ORT 1.19.2 runs the InplaceClipGradNorm jaxort writes; jaxort runs block.to_optimizer().
    def sgd(ob):
        return ob.optim.SGD(clip_grad=ob.optim.ClipGradNorm(0.5))

    params, ort_dir, jaxort_dir = _both(helpers, tmp_path, helpers.weighted_losses, sgd)
    assert _canonical(onnx.load(jaxort_dir / "optimizer_model.onnx")) == _canonical(
        onnx.load(ort_dir / "optimizer_model.onnx"))
    batch = _batches(helpers, 1)[0]
    state = ort_api.CheckpointState.load_checkpoint(str(jaxort_dir / "checkpoint"))
    module = ort_api.Module(str(jaxort_dir / "training_model.onnx"), state)
    optimizer = ort_api.Optimizer(str(jaxort_dir / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(0.1)
    module(*batch)
    grads = {n: np.array(state.parameters[n].grad) for n in TRAINABLE}
    optimizer.step()
    clipped = helpers.clip_grad_norm(grads, 0.5)
    assert not np.allclose(clipped["w1"], grads["w1"])
    for name in TRAINABLE:
        np.testing.assert_allclose(state.parameters[name].data, params[name] - np.float32(0.1) * clipped[name],
                                   rtol=1e-5, atol=1e-7, err_msg=name)
    _, jax_params = _train(jaxort_api, jaxort_dir, [batch], 0.1, optimizer_uri=sgd(onnxblock).to_optimizer())
    for name in TRAINABLE:
        np.testing.assert_allclose(jax_params[name], state.parameters[name].data, rtol=1e-5, atol=1e-7,
                                   err_msg=name)


@pytest.mark.parametrize("case", ["at_max", "clipped", "kept"])
def test_recorded_torch_clip_numbers(case, helpers):
    torch = pytest.importorskip("torch")
    grads, max_norm, norm, clipped = helpers.TORCH_CLIP[case]
    params = [torch.zeros(np.shape(g), requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g, dtype=torch.float32)
    assert float(torch.nn.utils.clip_grad_norm_(params, max_norm)) == norm
    for p, want in zip(params, clipped):
        assert p.grad.numpy().tolist() == want


def _every_block(ob):
    """A ForwardBlock that chains most of ORT's building blocks, written against ``ob``."""

    class EveryBlock(ob.ForwardBlock):
        def build(self, x, y):
            b = ob.blocks
            z = b.InputLike(x)("z")
            v = b.Div()(b.Mul()(b.Sub()(b.Add()(x, y), z), b.Constant(2.0)()), y)
            v = b.Sigmoid()(b.Log()(b.Abs()(b.Neg()(b.Pow(3.0)(v)))))
            v = b.Add()(b.ReduceMean()(b.Clip(0.1, 0.9)(v)), b.ReduceSum(keepdims=False)(b.Clip(clip_max=0.5)(v)))
            return b.Cast(onnx.TensorProto.FLOAT)(b.Linear(4, 2, bias=True, alpha=0.5)(b.Mul()(v, x)))

    return EveryBlock()


def test_building_blocks_write_orts_nodes_and_names():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["out"])], "base",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 4]) for n in ("x", "y")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 4])])
    base = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    models = []
    for ob in (ort_onnxblock, onnxblock):
        np.random.seed(11)  # Linear draws its weights from numpy's global generator in both
        block = _every_block(ob)
        with ob.base(base):
            block("x", "y")
        models.append(block.to_model_proto())
    assert _canonical(models[1]) == _canonical(models[0])
