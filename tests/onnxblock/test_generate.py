"""generate_artifacts with jaxort.onnxblock losses and optimizers, trained with jaxort.api.

References: ``jax.grad`` of the model and loss written in jax.numpy here, ORT's
AdamW and SGD update formulas in numpy, torch.nn.utils.clip_grad_norm_'s
numbers (recorded in conftest.py), and ORT 1.19.2's own optimizer models
(tests/fixtures/golden/, byte for byte).
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from jaxort import onnxblock
from jaxort.api import CheckpointState, Module, Optimizer
from jaxort.errors import TrainingError
from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"
TRAINABLE = ["w1", "b1", "w_reg", "b_reg", "w_cls"]
f32 = np.float32


def _reference_loss(p, x, target, labels, helpers):
    h = jnp.maximum(x @ p["w1"] + p["b1"], 0)
    reg = h @ p["w_reg"] + p["b_reg"]
    cls = h @ p["w_cls"] + p["b_cls"]
    return 0.4 * jnp.mean((reg - target) ** 2) + 0.6 * helpers.cross_entropy(cls, labels, xp=jnp)


def _reference_grads(params, batch, helpers):
    grads = jax.grad(lambda p: _reference_loss({**params, **p}, *batch, helpers))(
        {k: jnp.asarray(params[k]) for k in TRAINABLE})
    return {k: np.asarray(v) for k, v in grads.items()}


def _adamw_step(w, g, m, v, t, lr, *, alpha=0.9, beta=0.999, eps=1e-6, wd=0.0):
    """ORT's AdamWOptimizer kernel, adam_mode 1 (HuggingFace), correct_bias 1, in float32."""
    a, b, eps, wd, lr = f32(alpha), f32(beta), f32(eps), f32(wd), f32(lr)
    m = a * m + (f32(1) - a) * g
    v = b * v + ((f32(1) - b) * g) * g
    ac, bc = f32(1) - a ** f32(t), f32(1) - b ** f32(t)
    w = w - (lr * np.sqrt(bc) / ac) * m / (np.sqrt(v) + eps)
    return w - (lr * wd) * w, m, v


def _batches(helpers, n, seed=5):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(helpers.BATCH, helpers.IN)).astype(np.float32),
             rng.normal(size=(helpers.BATCH, helpers.REG)).astype(np.float32),
             rng.integers(0, helpers.CLASSES, helpers.BATCH).astype(np.int64)) for _ in range(n)]


def _generate(helpers, tmp_path, optimizer, loss=None, requires_grad=TRAINABLE, **kwargs):
    params = helpers.two_head_params()
    arts = generate_artifacts(helpers.two_head_model(params), requires_grad=requires_grad, frozen_params=["b_cls"],
                              loss=loss if loss is not None else helpers.weighted_losses(onnxblock),
                              optimizer=optimizer, artifact_directory=tmp_path, **kwargs)
    return params, arts


def _node_attributes(path) -> dict:
    (node,) = [n for n in onnx.load(path).graph.node if n.op_type == "AdamWOptimizer"]
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# --------------------------------------------------------------------------- custom loss, AdamW


def test_two_loss_block_trains_as_the_jax_reference(helpers, tmp_path):
    params, arts = _generate(helpers, tmp_path, onnxblock.optim.AdamW(weight_decay=0.01))
    assert arts.label_names == ("target", "labels") and arts.loss_fn is None
    state = CheckpointState.load_checkpoint(str(arts.checkpoint))
    module = Module(str(arts.training_model), state, str(arts.eval_model))
    optimizer = Optimizer(str(arts.optimizer_model), module)
    optimizer.set_learning_rate(0.05)
    ref = dict(params)
    moments = {k: (np.zeros_like(params[k]), np.zeros_like(params[k])) for k in TRAINABLE}
    for step, batch in enumerate(_batches(helpers, 4), start=1):
        module.train()
        loss = module(*batch)
        np.testing.assert_allclose(loss, _reference_loss(ref, *batch, helpers), rtol=1e-5)
        want = _reference_grads(ref, batch, helpers)
        for name in TRAINABLE:
            np.testing.assert_allclose(state.parameters[name].grad, want[name], rtol=1e-4, atol=1e-6, err_msg=name)
        optimizer.step()
        module.lazy_reset_grad()
        for name in TRAINABLE:
            ref[name], *moments[name] = _adamw_step(ref[name], want[name], *moments[name], step, 0.05, wd=0.01)
    for name in TRAINABLE + ["b_cls"]:
        np.testing.assert_allclose(state.parameters[name].data, ref[name], rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(state.parameters["b_cls"].data, params["b_cls"])  # frozen
    module.eval()
    x, target, labels = _batches(helpers, 1, seed=9)[0]
    np.testing.assert_allclose(module(x, target, labels), _reference_loss(ref, x, target, labels, helpers),
                               rtol=1e-4)


def test_adamw_arguments_reach_the_optimizer_node(helpers, tmp_path):
    _, arts = _generate(helpers, tmp_path / "a", onnxblock.optim.AdamW(weight_decay=0.01))
    assert _node_attributes(arts.optimizer_model) == {
        "alpha": f32(0.9), "beta": f32(0.999), "epsilon": f32(1e-6), "weight_decay": f32(0.01),
        "correct_bias": 1, "adam_mode": 1}
    _, arts = _generate(helpers, tmp_path / "b", onnxblock.optim.AdamW(
        bias_correction=False, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1))
    assert _node_attributes(arts.optimizer_model) == {
        "alpha": f32(0.8), "beta": f32(0.95), "epsilon": f32(1e-8), "weight_decay": f32(0.1),
        "correct_bias": 0, "adam_mode": 1}


@pytest.mark.parametrize("case, block, offset", [
    # ORT wrote mlp_frozen's with onnxblock.optim.AdamW(weight_decay=0.01), its counter at 25.
    ("mlp_frozen", lambda: onnxblock.optim.AdamW(weight_decay=0.01), 25),
    ("mlp_adamw", onnxblock.optim.AdamW, 10),
    ("mlp_sgd", onnxblock.optim.SGD, 16),
])
def test_optimizer_blocks_write_orts_optimizer_models_byte_for_byte(case, block, offset):
    params = ([numpy_helper.from_array(np.zeros(2, np.float32), "p")], [])
    with onnxblock.empty_base(opset_version=17, name_offset=offset):
        optimizer = block()
        optimizer(params)
    assert optimizer.to_model_proto().SerializeToString() == (GOLDEN / case / "optimizer_model.onnx").read_bytes()


def test_sgd_block_trains_as_orts_sgd(helpers, tmp_path):
    params, arts = _generate(helpers, tmp_path, onnxblock.optim.SGD())
    state = CheckpointState.load_checkpoint(str(arts.checkpoint))
    module = Module(str(arts.training_model), state)
    optimizer = Optimizer(str(arts.optimizer_model), module)
    optimizer.set_learning_rate(0.1)
    batch = _batches(helpers, 1)[0]
    module(*batch)
    optimizer.step()
    want = _reference_grads(params, batch, helpers)
    for name in TRAINABLE:
        np.testing.assert_allclose(state.parameters[name].data, params[name] - f32(0.1) * want[name],
                                   rtol=1e-5, atol=1e-7, err_msg=name)


# --------------------------------------------------------------------------- ClipGradNorm

@pytest.mark.parametrize("case", ["at_max", "clipped", "kept"])
def test_clip_grad_norm_matches_torch(case, helpers):
    grads, max_norm, torch_norm, torch_clipped = helpers.TORCH_CLIP[case]
    grads = {"a": np.array(grads[0], np.float32), "b": np.array(grads[1], np.float32)}
    total = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
    np.testing.assert_allclose(total, torch_norm, rtol=1e-6)
    want = helpers.clip_grad_norm(grads, max_norm)
    for name, t in zip("ab", torch_clipped):
        np.testing.assert_allclose(want[name], np.array(t, np.float32), rtol=1e-6, atol=1e-7)
    tx = onnxblock.optim.ClipGradNorm(max_norm).transform()
    got, _ = tx.update({k: jnp.asarray(v) for k, v in grads.items()}, tx.init(grads))
    for name, t in zip("ab", torch_clipped):
        np.testing.assert_allclose(np.asarray(got[name]), np.array(t, np.float32), rtol=1e-6, atol=1e-7)
        assert got[name].dtype == jnp.float32


def test_clip_grad_norm_in_the_optimizer_model(helpers, tmp_path):
    _, arts = _generate(helpers, tmp_path, onnxblock.optim.AdamW(clip_grad=onnxblock.optim.ClipGradNorm(0.5)))
    model = onnx.load(arts.optimizer_model)
    clip, adamw = model.graph.node
    assert (clip.domain, clip.op_type, list(clip.input)) == ("com.microsoft", "InplaceClipGradNorm", ["gradients"])
    assert {a.name: helper.get_attribute_value(a) for a in clip.attribute} == {"max_norm": f32(0.5)}
    assert adamw.op_type == "AdamWOptimizer" and adamw.input[3] == clip.output[0]
    # jaxort reads an optimizer model for its optimizer node only and refuses one that also clips ...
    state = CheckpointState.load_checkpoint(str(arts.checkpoint))
    module = Module(str(arts.training_model), state)
    with pytest.raises(TrainingError, match="InplaceClipGradNorm"):
        Optimizer(str(arts.optimizer_model), module)


@pytest.mark.parametrize("optim", ["SGD", "AdamW"])
def test_to_optimizer_clips_then_steps(optim, helpers, tmp_path):
    # ... and runs the same update from block.to_optimizer().
    clip = onnxblock.optim.ClipGradNorm(0.5)
    block = onnxblock.optim.SGD(clip_grad=clip) if optim == "SGD" else onnxblock.optim.AdamW(
        weight_decay=0.01, clip_grad=clip)
    params, arts = _generate(helpers, tmp_path, block)
    state = CheckpointState.load_checkpoint(str(arts.checkpoint))
    module = Module(str(arts.training_model), state)
    optimizer = Optimizer(block.to_optimizer(), module)
    optimizer.set_learning_rate(0.1)
    clipped_ref, plain_ref = dict(params), dict(params)
    moments = {k: [(np.zeros_like(params[k]),) * 2] * 2 for k in TRAINABLE}
    for step, batch in enumerate(_batches(helpers, 2), start=1):
        module(*batch)
        optimizer.step()
        module.lazy_reset_grad()
        for i, (ref, clipped) in enumerate(((clipped_ref, True), (plain_ref, False))):
            grads = _reference_grads(ref, batch, helpers)
            grads = helpers.clip_grad_norm(grads, 0.5) if clipped else grads
            for name in TRAINABLE:
                g = grads[name].astype(np.float32)
                if optim == "SGD":
                    ref[name] = ref[name] - f32(0.1) * g
                else:
                    ref[name], *m = _adamw_step(ref[name], g, *moments[name][i], step, 0.1, wd=0.01)
                    moments[name][i] = tuple(m)
    for name in TRAINABLE:
        np.testing.assert_allclose(state.parameters[name].data, clipped_ref[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    # The clipping mattered: without it the parameters differ.
    assert max(np.abs(clipped_ref[n] - plain_ref[n]).max() for n in TRAINABLE) > 1e-3


@pytest.mark.parametrize("max_norm", [0, -1.0, float("nan"), float("inf"), "1", True, None])
def test_clip_grad_norm_needs_a_positive_finite_max_norm(max_norm):
    with pytest.raises(TrainingError, match="ClipGradNorm max_norm must be a finite number > 0"):
        onnxblock.optim.ClipGradNorm(max_norm)


@pytest.mark.parametrize("kwargs, message", [
    (dict(betas=(1.0, 0.999)), r"AdamW betas\[0\] must be a finite number >= 0 and < 1, got 1.0"),
    (dict(betas=(0.9,)), "AdamW betas must be a pair"),
    (dict(eps=-1e-8), "AdamW eps must be a finite number >= 0"),
    (dict(weight_decay=float("nan")), "AdamW weight_decay"),
    (dict(clip_grad=1.0), "clip_grad must be a block such as ClipGradNorm"),
])
def test_bad_adamw_arguments(kwargs, message):
    with pytest.raises(TrainingError, match=message):
        onnxblock.optim.AdamW(**kwargs)


# --------------------------------------------------------------------------- how generate_artifacts takes blocks


def test_a_block_loss_may_return_more_outputs(helpers, tmp_path):
    class LossAndScores(onnxblock.Block):
        def build(self, reg, cls):
            return onnxblock.loss.MSELoss(reduction="sum")(reg), cls

    _, arts = _generate(helpers, tmp_path, None, loss=LossAndScores(), additional_output_names=["reg"])
    train = onnx.load(arts.training_model)
    assert [o.name for o in train.graph.output][1:3] == ["cls", "reg"]
    assert arts.label_names == ("target",)


def test_loss_input_names_choose_what_the_block_gets(helpers, tmp_path):
    params, arts = _generate(helpers, tmp_path, None, loss=onnxblock.loss.CrossEntropyLoss(reduction="sum"),
                             loss_input_names=["cls"], requires_grad=["w1", "b1", "w_cls"])
    state = CheckpointState.load_checkpoint(str(arts.checkpoint))
    module = Module(str(arts.training_model), state)
    x, _, labels = _batches(helpers, 1)[0]
    h = np.maximum(x @ params["w1"] + params["b1"], 0)
    want = helpers.cross_entropy(h @ params["w_cls"] + params["b_cls"], labels, reduction="sum")
    np.testing.assert_allclose(module(x, labels), want, rtol=1e-5)


def test_loss_types_and_blocks_write_the_same_files(helpers, tmp_path):
    _, by_type = _generate(helpers, tmp_path / "t", OptimType.AdamW, loss=LossType.CrossEntropyLoss,
                           loss_input_names=["cls"])
    _, by_block = _generate(helpers, tmp_path / "b", onnxblock.optim.AdamW(),
                            loss=onnxblock.loss.CrossEntropyLoss(), loss_input_names=["cls"])
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"):
        assert (tmp_path / "t" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_gradient_graph_false_with_a_block_loss(helpers, tmp_path):
    _, arts = _generate(helpers, tmp_path, None, gradient_graph=False)
    train = onnx.load(arts.training_model)
    assert [(n.domain, n.op_type) for n in train.graph.node if n.domain == "ai.jaxort"] == [
        ("ai.jaxort", "NoGradientGraph")]


def _ort_like(name, module):
    # Stand-ins for ORT's blocks (onnxblock needs onnxruntime-training), and a user's
    # block derived from ORT's Block in a module of its own.
    ort_block = type("Block", (), {"__module__": "onnxruntime.training.onnxblock.blocks",
                                   "__call__": lambda self, *a: a})
    base = type(name, (ort_block,), {"__module__": module})
    return base()


@pytest.mark.parametrize("what, value, message", [
    ("loss", _ort_like("MSELoss", "onnxruntime.training.onnxblock.loss.loss"),
     r"the loss MSELoss is an onnxruntime.training.onnxblock block; jaxort takes the same blocks from "
     r"jaxort.onnxblock: change the import to `from jaxort import onnxblock` \(onnxblock.loss.MSELoss\)"),
    ("loss", _ort_like("MyLoss", "my_training_script"),
     r"the loss MyLoss is an onnxruntime.training.onnxblock block.*\(onnxblock.blocks.Block\)"),
    ("optimizer", _ort_like("AdamW", "onnxruntime.training.onnxblock.optim.optim"),
     r"the optimizer AdamW is an onnxruntime.training.onnxblock block.*\(onnxblock.optim.AdamW\)"),
])
def test_orts_own_blocks_are_refused_pointing_at_jaxort_onnxblock(what, value, message, helpers, tmp_path):
    kwargs = {"loss": value} if what == "loss" else {"optimizer": value}
    with pytest.raises(TrainingError, match=message):
        generate_artifacts(helpers.two_head_model(helpers.two_head_params()), artifact_directory=tmp_path,
                           **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("optimizer, message", [
    (onnxblock.blocks.Add(), "the optimizer Add is a plain Block; an optimizer block must be a ForwardBlock"),
    (onnxblock.loss.MSELoss(), "an optimizer block must be a ForwardBlock"),
    (3, "unknown optimizer 3"),
])
def test_bad_optimizer_blocks_write_nothing(optimizer, message, helpers, tmp_path):
    with pytest.raises(TrainingError, match=message):
        generate_artifacts(helpers.two_head_model(helpers.two_head_params()), TRAINABLE,
                           loss=helpers.weighted_losses(onnxblock), optimizer=optimizer, artifact_directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_whole_model_blocks_are_not_losses(helpers, tmp_path):
    class Training(onnxblock.TrainingBlock):
        def build(self, reg, cls):
            return onnxblock.loss.MSELoss()(reg)

    with pytest.raises(TrainingError, match="the loss Training is a TrainingBlock, which builds a whole model"):
        generate_artifacts(helpers.two_head_model(helpers.two_head_params()), loss=Training(),
                           artifact_directory=tmp_path)


def test_a_block_loss_on_a_missing_value_names_it(helpers, tmp_path):
    with pytest.raises(TrainingError, match="'missing' is not a graph input or output"):
        generate_artifacts(helpers.two_head_model(helpers.two_head_params()), loss=onnxblock.loss.L1Loss(),
                           loss_input_names=["missing"], artifact_directory=tmp_path)


def test_blocks_are_not_taken_for_jax_losses(helpers, tmp_path):
    # A Block is callable; it must build an ONNX loss, not be handed back as loss_fn.
    _, arts = _generate(helpers, tmp_path, None, loss=onnxblock.loss.MSELoss(), loss_input_names=["reg"])
    assert arts.loss_fn is None
    assert any(n.op_type == "InPlaceAccumulatorV2" for n in onnx.load(arts.training_model).graph.node)
    assert TensorProto.FLOAT == onnx.load(arts.eval_model).graph.output[0].type.tensor_type.elem_type
