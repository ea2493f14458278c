"""jaxort.onnxblock.TrainingBlock, save_checkpoint and load_checkpoint_to_model.

References: ORT 1.19.2's golden files (tests/fixtures/golden/: its eval model
and checkpoints, byte for byte), numpy, and ``jax.grad`` of the model written
in jax.numpy here; the gradient graph runs in onnxruntime inference.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from jaxort import checkpoint as ckpt
from jaxort import onnxblock
from jaxort.errors import CheckpointError, StateError, TrainingError

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"
TRAINABLE = ["w1", "b1", "w_reg", "b_reg", "w_cls"]


class TwoLosses(onnxblock.TrainingBlock):
    """MSE on the regression head plus half the cross-entropy of the class head."""

    def __init__(self):
        super().__init__()
        self.mse = onnxblock.loss.MSELoss()
        self.ce = onnxblock.loss.CrossEntropyLoss()
        self.add, self.mul, self.half = onnxblock.blocks.Add(), onnxblock.blocks.Mul(), onnxblock.blocks.Constant(0.5)

    def build(self, reg, cls):
        return self.add(self.mse(reg), self.mul(self.half(), self.ce(cls)))


def _reference_loss(p, x, target, labels, helpers, xp=jnp):
    h = xp.maximum(x @ p["w1"] + p["b1"], 0)
    reg = h @ p["w_reg"] + p["b_reg"]
    cls = h @ p["w_cls"] + p["b_cls"]
    return xp.mean((reg - target) ** 2) + 0.5 * helpers.cross_entropy(cls, labels, xp=xp)


def _built(helpers, params):
    block = TwoLosses()
    for name in TRAINABLE:
        block.requires_grad(name)
    block.requires_grad("b_cls", False)
    with onnxblock.base(helpers.two_head_model(params)) as accessor:
        loss = block("reg", "cls")
    return block, loss, accessor


def _batch(rng, helpers):
    return (rng.normal(size=(helpers.BATCH, helpers.IN)).astype(np.float32),
            rng.normal(size=(helpers.BATCH, helpers.REG)).astype(np.float32),
            rng.integers(0, helpers.CLASSES, helpers.BATCH).astype(np.int64))


def test_training_model_layout_is_orts(helpers):
    params = helpers.two_head_params()
    block, loss, accessor = _built(helpers, params)
    training, evaluation = block.to_model_proto()
    buffers = [f"{p}_grad.accumulation.buffer" for p in TRAINABLE]
    assert [i.name for i in training.graph.input] == (
        ["x", "target", "labels"] + TRAINABLE + ["b_cls"] + buffers + ["lazy_reset_grad"])
    assert [o.name for o in training.graph.output] == [loss] + [f"{p}_grad.accumulation.out" for p in TRAINABLE]
    accumulators = [n for n in training.graph.node if n.op_type == "InPlaceAccumulatorV2"]
    assert [list(n.input) for n in accumulators] == [
        [f"{p}_grad.accumulation.buffer", f"{p}_grad", "lazy_reset_grad"] for p in TRAINABLE]
    assert [i.name for i in evaluation.graph.input] == ["x", "target", "labels"] + TRAINABLE + ["b_cls"]
    assert [o.name for o in evaluation.graph.output] == [loss]
    assert not any(n.domain == "com.microsoft" for n in evaluation.graph.node)
    # Parameters are inputs now, in initializer order; the loss's constants stay initializers.
    assert not {t.name for t in training.graph.initializer} & set(params)
    trainable, frozen = block.parameters()
    assert [t.name for t in trainable] == TRAINABLE and [t.name for t in frozen] == ["b_cls"]
    for t in trainable + frozen:
        np.testing.assert_array_equal(numpy_helper.to_array(t), params[t.name])
    # As in ORT, the open model became the training model.
    assert accessor.model == training


def test_loss_and_gradients_match_jax_grad(helpers, rng):
    params = helpers.two_head_params()
    block, _, _ = _built(helpers, params)
    training, evaluation = block.to_model_proto()
    x, target, labels = _batch(rng, helpers)
    feeds = {"x": x, "target": target, "labels": labels, **params}
    (loss,) = helpers.ort_run(evaluation, feeds)
    want = _reference_loss(params, x, target, labels, helpers, xp=np)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    want_grads = jax.grad(lambda p: _reference_loss({**params, **p}, x, target, labels, helpers))(
        {k: jnp.asarray(params[k]) for k in TRAINABLE})
    for runner, grads in helpers.gradient_runs(training, TRAINABLE, feeds).items():
        for name in TRAINABLE:
            np.testing.assert_allclose(grads[name], np.asarray(want_grads[name]), rtol=1e-4, atol=1e-6,
                                       err_msg=f"{name} ({runner})")


def test_requires_grad_false_then_true_trains_it(helpers):
    block = TwoLosses()
    block.requires_grad("w1", False)
    block.requires_grad("w1")
    with onnxblock.base(helpers.two_head_model(helpers.two_head_params())):
        block("reg", "cls")
    trainable, frozen = block.parameters()
    assert [t.name for t in trainable] == ["w1"] and frozen == []


class _Golden(onnxblock.TrainingBlock):
    def __init__(self):
        super().__init__()
        self.loss = onnxblock.loss.CrossEntropyLoss()

    def build(self, output):
        return self.loss(output)


def _golden_block(case="mlp_adamw", offset=6):
    manifest = json.loads((GOLDEN / case / "manifest.json").read_text())
    block = _Golden()
    for name in manifest["requires_grad"]:
        block.requires_grad(name)
    with onnxblock.base(onnx.load(GOLDEN / case / "model.onnx"), name_offset=offset):
        block("output")
    return block


def test_eval_model_and_checkpoint_are_byte_for_byte_orts(tmp_path):
    # ORT's generate_artifacts is a TrainingBlock around the loss; its counter stood at 6.
    block = _golden_block()
    _, evaluation = block.to_model_proto()
    assert evaluation.SerializeToString() == (GOLDEN / "mlp_adamw" / "eval_model.onnx").read_bytes()
    onnxblock.save_checkpoint(block.parameters(), tmp_path / "checkpoint")
    assert (tmp_path / "checkpoint").read_bytes() == (GOLDEN / "mlp_adamw" / "checkpoint").read_bytes()


def test_save_and_load_checkpoint_round_trip(tmp_path):
    block = _golden_block()
    trainable, frozen = block.parameters()
    onnxblock.save_checkpoint((trainable, frozen), tmp_path / "full")
    state = ckpt.load(tmp_path / "full")
    assert list(state.trainable) == [t.name for t in trainable] and not state.frozen
    for t in trainable:
        np.testing.assert_array_equal(state.trainable[t.name], numpy_helper.to_array(t))
    onnxblock.save_checkpoint((trainable, frozen), tmp_path / "nominal", nominal_checkpoint=True)
    nominal = ckpt.load(tmp_path / "nominal")
    assert nominal.is_nominal and list(nominal.trainable) == list(state.trainable)

    # Into a model: every initializer named in the checkpoint takes its value, in place.
    model = onnx.load(GOLDEN / "mlp_adamw" / "model.onnx")
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
    assert onnxblock.load_checkpoint_to_model(tmp_path / "full", model) is None
    for init in model.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(init), state.trainable[init.name])
    # A checkpoint ORT wrote after training: the values it trained to.
    trained = onnx.load(GOLDEN / "mlp_adamw" / "model.onnx")
    onnxblock.load_checkpoint_to_model(GOLDEN / "mlp_adamw" / "ckpt_after_no_opt", trained)
    after = np.load(GOLDEN / "mlp_adamw" / "params_after.npz")
    for init in trained.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(init), after[init.name])
    with pytest.raises(CheckpointError, match="nominal"):
        onnxblock.load_checkpoint_to_model(tmp_path / "nominal", trained)


@pytest.mark.parametrize("parameters", [None, ([], [], []), "params"])
def test_save_checkpoint_needs_a_pair_of_lists(parameters, tmp_path):
    with pytest.raises(CheckpointError, match=r"\(trainable, frozen\)"):
        onnxblock.save_checkpoint(parameters, tmp_path / "checkpoint")


# --------------------------------------------------------------------------- errors


def test_unknown_or_integer_parameters_are_named(helpers):
    params = helpers.two_head_params()
    model = helpers.two_head_model(params)
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 2], np.int64), "steps"))
    block = TwoLosses()
    block.requires_grad("w1")
    block.requires_grad("nope")
    with onnxblock.base(model):
        with pytest.raises(TrainingError, match=r"\['nope'\] are not initializers of the model"):
            block("reg", "cls")
    block = TwoLosses()
    block.requires_grad("steps")
    with onnxblock.base(model):
        with pytest.raises(TrainingError, match=r"parameters \['steps'\] are not floating point"):
            block("reg", "cls")


@pytest.mark.parametrize("args, message", [
    ((3,), "requires_grad takes an initializer name, got 3"),
    (("",), "requires_grad takes an initializer name"),
    (("w1", "yes"), r"requires_grad\('w1', value\) takes a bool, got 'yes'"),
])
def test_bad_requires_grad_arguments(args, message):
    with pytest.raises(TrainingError, match=message):
        TwoLosses().requires_grad(*args)


def test_results_before_building_are_state_errors():
    block = TwoLosses()
    with pytest.raises(StateError, match="TwoLosses has not built its parameters yet"):
        block.parameters()
    with pytest.raises(StateError, match="TwoLosses has not built its models yet"):
        block.to_model_proto()
    with pytest.raises(StateError, match="block TwoLosses was called outside a base model context"):
        block("reg", "cls")


def test_a_subclass_that_skips_super_init_is_told_so(helpers):
    class NoInit(onnxblock.TrainingBlock):
        def __init__(self):
            self.loss = onnxblock.loss.MSELoss()

        def build(self, reg, cls):
            return self.loss(reg)

    with onnxblock.base(helpers.two_head_model(helpers.two_head_params())):
        with pytest.raises(StateError, match=r"NoInit.__call__: its __init__ did not call super\(\).__init__\(\)"):
            NoInit()("reg", "cls")


def test_a_loss_op_without_a_gradient_rule_is_named(helpers):
    class Norm(onnxblock.TrainingBlock):
        def __init__(self):
            super().__init__()
            self.norm = onnxblock.blocks.ReduceAllL2()

        def build(self, reg, cls):
            return self.norm(reg)

    block = Norm()
    block.requires_grad("w1")
    model = helpers.two_head_model(helpers.two_head_params())
    with onnxblock.base(model):
        with pytest.raises(TrainingError, match=r"ReduceAllL2.*no gradient rule"):
            block("reg", "cls")


def test_checkpoint_types_are_kept(tmp_path):
    protos = ([numpy_helper.from_array(np.arange(3, dtype=np.float16), "h")],
              [numpy_helper.from_array(np.array([4, 5], np.int64), "i")])
    onnxblock.save_checkpoint(protos, tmp_path / "c")
    state = ckpt.load(tmp_path / "c")
    assert state.trainable["h"].dtype == np.float16 and state.frozen["i"].dtype == np.int64
    assert helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT16) == state.trainable["h"].dtype
