"""jaxort.onnxblock.loss against numpy formulas: values, gradients, labels, errors.

Each loss goes on ``scores = x * w`` (``w`` trainable) through a TrainingBlock.
The eval model's loss (onnxruntime inference) is compared with the formula in
numpy, and the training model's gradient of ``w`` (onnxruntime running the
gradient graph) with ``jax.grad`` of the same formula in jax.numpy, summed
where the reduction is "none".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from onnx import TensorProto, helper

from jaxort import onnxblock
from jaxort.errors import TrainingError

SHAPE, CE_SHAPE = (4, 3), (4, 5)


class _LossOn(onnxblock.TrainingBlock):
    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def build(self, name):
        return self.loss(name)


def _reduce(loss, reduction, xp):
    return {"mean": xp.mean, "sum": xp.sum, "none": lambda v: v}[reduction](loss)


def _mse(s, t, reduction, xp):
    return _reduce((s - t) ** 2, reduction, xp)


def _l1(s, t, reduction, xp):
    return _reduce(xp.abs(s - t), reduction, xp)


def _bce(s, t, reduction, xp, weight=None, pos_weight=None):
    # torch.nn.BCEWithLogitsLoss's definition.
    sig = 1 / (1 + xp.exp(-s))
    pos = t * xp.log(sig) * (1.0 if pos_weight is None else pos_weight)
    loss = -(pos + (1 - t) * xp.log(1 - sig))
    return _reduce(loss * (1.0 if weight is None else weight), reduction, xp)


def _build(loss, model):
    block = _LossOn(loss)
    block.requires_grad("w")
    with onnxblock.base(model):
        out = block("scores")
    training, evaluation = block.to_model_proto()
    return out, training, evaluation


def _check(loss_block, shape, feeds, reference, helpers, *, rtol=1e-5, atol=1e-6):
    """Loss value and d loss / d w of the block against ``reference(scores, xp)``."""
    out, training, evaluation = _build(loss_block, helpers.scores_model(shape))
    (got,) = helpers.ort_run(evaluation, feeds)
    x, w = feeds["x"], feeds["w"]
    want = reference(x * w, np)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    want_grad = jax.grad(lambda wj: jnp.sum(reference(jnp.asarray(x) * wj, jnp)))(jnp.asarray(w))
    for runner, grads in helpers.gradient_runs(training, ["w"], feeds).items():
        np.testing.assert_allclose(grads["w"], np.asarray(want_grad), rtol=1e-4, atol=1e-5, err_msg=runner)
    return training, evaluation


def _feeds(rng, shape, **labels):
    return {"x": rng.normal(size=shape).astype(np.float32),
            "w": rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32), **labels}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss, formula", [(onnxblock.loss.MSELoss, _mse), (onnxblock.loss.L1Loss, _l1)])
def test_mse_and_l1(loss, formula, reduction, rng, helpers):
    t = rng.normal(size=SHAPE).astype(np.float32)
    feeds = _feeds(rng, SHAPE, target=t)
    _check(loss(reduction=reduction), SHAPE, feeds, lambda s, xp: formula(s, t, reduction, xp), helpers)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weight, pos_weight", [
    (None, None), (np.array([0.5, 2.0, 1.5], np.float32), None),
    (None, np.array([3.0, 0.5, 1.0], np.float32)), (np.float32(0.25), np.array([2.0, 2.0, 0.1], np.float32))])
def test_bce_with_logits(weight, pos_weight, reduction, rng, helpers):
    t = rng.uniform(0, 1, SHAPE).astype(np.float32)
    t[0] = (t[0] > 0.5)  # hard and soft targets
    feeds = _feeds(rng, SHAPE, target=t)
    _check(onnxblock.loss.BCEWithLogitsLoss(weight=weight, reduction=reduction, pos_weight=pos_weight), SHAPE,
           feeds, lambda s, xp: _bce(s, t, reduction, xp, weight, pos_weight), helpers)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 2, -100])
def test_cross_entropy(weighted, ignore_index, reduction, rng, helpers):
    labels = np.array([2, 0, 4, 2], np.int64)
    if ignore_index == -100:
        labels[1] = -100
    weight = np.array([1.0, 2.0, 0.5, 1.5, 3.0], np.float32) if weighted else None
    feeds = _feeds(rng, CE_SHAPE, labels=labels)
    block = onnxblock.loss.CrossEntropyLoss(weight=weight, reduction=reduction, ignore_index=ignore_index)
    _check(block, CE_SHAPE, feeds,
           lambda s, xp: helpers.cross_entropy(s, labels, weight, reduction, ignore_index, xp=xp), helpers)


def test_class_weights_may_be_a_list_and_take_the_scores_type(rng, helpers):
    # ORT 1.19.2 tests the weight array's truth value (a ValueError for more than one class).
    labels = np.array([1, 0, 3, 4], np.int64)
    weight = [1.0, 2.0, 0.5, 1.5, 3.0]
    feeds = _feeds(rng, CE_SHAPE, labels=labels)
    _, training, _ = _build(onnxblock.loss.CrossEntropyLoss(weight=np.array(weight)),
                            helpers.scores_model(CE_SHAPE))
    init = next(t for t in training.graph.initializer if "celoss.weight" in t.name)
    assert init.data_type == TensorProto.FLOAT  # float64 array, float32 scores
    _check(onnxblock.loss.CrossEntropyLoss(weight=weight), CE_SHAPE, feeds,
           lambda s, xp: helpers.cross_entropy(s, labels, np.array(weight, np.float32), xp=xp), helpers)



@pytest.mark.parametrize("loss, name, shape", [
    (onnxblock.loss.CrossEntropyLoss(weight=[1.0, 2.0, 0.5, 1.5, 3.0]), "celoss.weight", CE_SHAPE),
    (onnxblock.loss.BCEWithLogitsLoss(weight=[1.0, 2.0, 0.1]), "bceloss.weight", SHAPE)])
def test_loss_constants_take_bfloat16_scores_type(loss, name, shape, helpers):
    # onnx < 1.17 maps bfloat16 to float32 and cannot write ml_dtypes' bfloat16;
    # ORT writes BCEWithLogitsLoss's ones as float32 (an ill-typed model here).
    import ml_dtypes

    from jaxort.graph._model import tensor_from_numpy

    model = helpers.scores_model(shape)
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.BFLOAT16
    model.graph.initializer[0].CopyFrom(tensor_from_numpy(np.ones(shape[-1], ml_dtypes.bfloat16), "w"))
    _, training, _ = _build(loss, model)
    init = next(t for t in training.graph.initializer if name in t.name)
    assert init.data_type == TensorProto.BFLOAT16
    want = np.asarray(loss._weight, np.float64).astype(ml_dtypes.bfloat16)
    assert init.raw_data == want.tobytes()
    assert {t.data_type for t in training.graph.initializer if "loss" in t.name} == {TensorProto.BFLOAT16}

def _input_types(model):
    return {i.name: (i.type.tensor_type.elem_type, [d.dim_value for d in i.type.tensor_type.shape.dim])
            for i in model.graph.input}


@pytest.mark.parametrize("loss, label, want", [
    (onnxblock.loss.MSELoss(), "target", (TensorProto.FLOAT, [4, 3])),
    (onnxblock.loss.L1Loss(), "target", (TensorProto.FLOAT, [4, 3])),
    (onnxblock.loss.BCEWithLogitsLoss(), "target", (TensorProto.FLOAT, [4, 3])),
    (onnxblock.loss.CrossEntropyLoss(), "labels", (TensorProto.INT64, [4])),
])
def test_label_inputs_are_named_and_typed_as_in_ort(loss, label, want, helpers):
    _, training, evaluation = _build(loss, helpers.scores_model(SHAPE))
    for model in (training, evaluation):
        assert [i.name for i in model.graph.input][:3] == ["x", label, "w"]
        assert _input_types(model)[label] == want


def test_an_existing_graph_input_is_used_as_the_label(rng, helpers):
    # The target is already an (unused) graph input: no second input of that name.
    model = helpers.scores_model(SHAPE)
    model.graph.input.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, list(SHAPE)))
    with onnxblock.base(model) as accessor:
        loss = onnxblock.loss.MSELoss()("scores", "t")
    assert [i.name for i in accessor.model.graph.input] == ["x", "t"]
    t = rng.normal(size=SHAPE).astype(np.float32)
    x = rng.normal(size=SHAPE).astype(np.float32)
    accessor.model.graph.output.append(helper.make_tensor_value_info(loss, TensorProto.FLOAT, []))
    got = helpers.ort_run(accessor.model, {"x": x, "t": t}, [loss])[0]
    np.testing.assert_allclose(got, np.mean((x - t) ** 2), rtol=1e-6)


def test_a_loss_on_an_inner_value_types_its_label_by_inference(rng, helpers):
    # ORT needs a graph output; jaxort also takes a value whose type shape inference knows.
    class OnDouble(onnxblock.Block):
        def build(self, name):
            return onnxblock.loss.CrossEntropyLoss()(onnxblock.blocks.Add()(name, name))

    with onnxblock.base(helpers.scores_model(CE_SHAPE)) as accessor:
        loss = OnDouble()("scores")
    assert _input_types(accessor.model)["labels"] == (TensorProto.INT64, [4])
    accessor.model.graph.output.append(helper.make_tensor_value_info(loss, TensorProto.FLOAT, []))
    x = rng.normal(size=CE_SHAPE).astype(np.float32)
    labels = np.array([0, 1, 2, 3], np.int64)
    got = helpers.ort_run(accessor.model, {"x": x, "labels": labels}, [loss])[0]
    np.testing.assert_allclose(got, helpers.cross_entropy(2 * x, labels), rtol=1e-5)


@pytest.mark.parametrize("make, message", [
    (lambda: onnxblock.loss.MSELoss(reduction="avg"),
     r"MSELoss: reduction must be one of \['mean', 'sum', 'none'\], got 'avg'"),
    (lambda: onnxblock.loss.L1Loss(reduction=None), "L1Loss: reduction must be one of"),
    (lambda: onnxblock.loss.BCEWithLogitsLoss(reduction="Mean"), "BCEWithLogitsLoss: reduction"),
    (lambda: onnxblock.loss.CrossEntropyLoss(reduction="batchmean"), "CrossEntropyLoss: reduction"),
    (lambda: onnxblock.loss.CrossEntropyLoss(weight=np.ones((2, 2))), r"weight must be a 1-D array.*\[2, 2\]"),
    (lambda: onnxblock.loss.CrossEntropyLoss(ignore_index=1.5), "ignore_index must be an int or None, got 1.5"),
    (lambda: onnxblock.loss.BCEWithLogitsLoss(pos_weight="heavy"), "pos_weight must be a number or an array"),
])
def test_bad_loss_arguments_are_training_errors(make, message):
    with pytest.raises(TrainingError, match=message):
        make()


def test_cross_entropy_needs_opset_12(helpers):
    model = helpers.scores_model(CE_SHAPE, opset=11)
    with onnxblock.base(model):
        with pytest.raises(TrainingError, match=r"CrossEntropyLoss needs SoftmaxCrossEntropyLoss \(opset >= 12\); "
                                                r"the model has opset 11"):
            onnxblock.loss.CrossEntropyLoss()("scores")


def test_a_loss_on_an_unknown_value_names_it(helpers):
    with onnxblock.base(helpers.scores_model(SHAPE)):
        with pytest.raises(TrainingError, match="'nowhere' is not a graph input or output"):
            onnxblock.loss.MSELoss()("nowhere")
