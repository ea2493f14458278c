"""Dropout (ops/dropout.py): the inference forms against ONNX's reference evaluator,
the training form's drops, rescaling and gradient against their definition.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from jaxort.graph import JaxGraph, lookup

from ._harness import Example, F16, F32, F64, OpCase, node, table_tests
from ._strategies import arr, floats

COVERED_OPS = {
    "Dropout",
}


@st.composite
def dropout_case(draw):
    dt = floats(draw, (F32, F64, F16))
    x = arr(draw, dt, tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 3)))))
    form = draw(st.sampled_from(["7", "12", "13-ratio", "13-train-false"]))
    if form == "7":
        return Example((x,), dict(ratio=0.3), 7)
    if form == "12":
        return Example((x,), {}, 12, n_out=2)
    ratio = np.array(0.25, np.float32)
    if form == "13-ratio":
        return Example((x, ratio), {}, 13, n_out=2)
    return Example((x, ratio, np.array(False)), {}, 13, n_out=2)


CASES = [
    OpCase("Dropout", dropout_case()),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- specific behaviour


def _dropout_graph(ratio, training_mode):
    inits = [numpy_helper.from_array(np.array(ratio, np.float32), "ratio")]
    inputs = ["x", "ratio"]
    if training_mode is not None:
        inits.append(numpy_helper.from_array(np.array(training_mode), "training_mode"))
        inputs.append("training_mode")
    node = helper.make_node("Dropout", inputs, ["y", "mask"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_empty_tensor_value_info("y"), helper.make_empty_tensor_value_info("mask")],
        initializer=inits)
    return JaxGraph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                    check=False)


def test_dropout_training_drops_and_rescales():
    g = _dropout_graph(0.25, True)
    x = np.random.default_rng(0).uniform(1, 2, (64, 64)).astype(np.float32)
    apply = jax.jit(lambda p, x, k: g.apply(p, x, rng=k, training=True))
    y, mask = (np.asarray(v) for v in apply(g.params, x, jax.random.key(0)))
    assert mask.dtype == np.bool_ and y.dtype == np.float32
    np.testing.assert_allclose(y[mask], x[mask] / 0.75, rtol=1e-6)
    assert np.all(y[~mask] == 0)
    assert abs(mask.mean() - 0.75) < 0.03
    y2, _ = apply(g.params, x, jax.random.key(1))
    assert not np.array_equal(np.asarray(y2), y)
    grad = jax.grad(lambda x: g.apply(g.params, x, rng=jax.random.key(0), training=True)[0]
                    .sum())(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(grad), mask / 0.75, rtol=1e-6)


@pytest.mark.parametrize("ratio,training_mode,training", [
    (0.25, True, False), (0.25, False, True), (0.25, None, True), (0.0, True, True)])
def test_dropout_is_identity_unless_training(ratio, training_mode, training):
    # Outside a training step without a key (an eval step), training_mode true
    # is the identity; with a key it draws (see the next test).
    g = _dropout_graph(ratio, training_mode)
    x = np.random.default_rng(0).uniform(1, 2, (64, 64)).astype(np.float32)
    y, mask = g.apply(g.params, x, rng=jax.random.key(0) if training else None, training=training)
    np.testing.assert_array_equal(np.asarray(y), x)
    assert np.asarray(mask).dtype == np.bool_ and np.asarray(mask).all()


def test_dropout_with_a_key_outside_a_training_step_follows_training_mode():
    g = _dropout_graph(0.25, True)
    x = np.random.default_rng(0).uniform(1, 2, (64, 64)).astype(np.float32)
    y, mask = (np.asarray(v) for v in g.apply(g.params, x, rng=jax.random.key(0)))
    np.testing.assert_allclose(y, np.where(mask, x / 0.75, 0), rtol=1e-6)
    assert abs(mask.mean() - 0.75) < 6 * np.sqrt(0.75 * 0.25 / mask.size)
    off = _dropout_graph(0.25, False)
    y_off, mask_off = off.apply(off.params, x, rng=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(y_off), x)
    assert np.asarray(mask_off).all()


def test_dropout_is_never_folded():
    from jaxort.graph import lookup

    assert not lookup("", "Dropout", 13).foldable
