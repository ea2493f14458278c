"""ai.onnx.preview.training optimizer ops against ONNX's reference evaluator."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

from jaxort.graph import JaxGraph

COVERED_OPS = {"Adagrad", "Adam", "Momentum"}

_DOMAIN = "ai.onnx.preview.training"
# op -> (state tensors per parameter, attribute strategies)
_OPS = {
    "Adagrad": (1, dict(decay_factor=st.floats(0, 0.5), epsilon=st.floats(1e-6, 1e-2),
                        norm_coefficient=st.floats(0, 0.1))),
    "Adam": (2, dict(alpha=st.floats(0.5, 0.99), beta=st.floats(0.5, 0.999),
                     epsilon=st.floats(1e-6, 1e-2), norm_coefficient=st.floats(0, 0.1),
                     norm_coefficient_post=st.floats(0, 0.1))),
    "Momentum": (1, dict(alpha=st.floats(0.5, 0.99), beta=st.floats(0.1, 1.0),
                         mode=st.sampled_from(["standard", "nesterov"]),
                         norm_coefficient=st.floats(0, 0.1))),
}


def _model(op, n_params, n_state, shapes, attrs):
    kinds = ["X", "G"] + [f"S{i}" for i in range(n_state)]
    names = [f"{k}{i}" for k in kinds for i in range(n_params)]
    outs = [f"new_{k}{i}" for k in ["X"] + kinds[2:] for i in range(n_params)]
    node = helper.make_node(op, ["R", "T"] + names, outs, domain=_DOMAIN, **attrs)
    inputs = [helper.make_tensor_value_info("R", T.FLOAT, []),
              helper.make_tensor_value_info("T", T.INT64, [])]
    inputs += [helper.make_tensor_value_info(n, T.FLOAT, shapes[int(n[-1])]) for n in names]
    outputs = [helper.make_tensor_value_info(n, T.FLOAT, shapes[int(n[-1])]) for n in outs]
    graph = helper.make_graph([node], op, inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(_DOMAIN, 1)]), names


@pytest.mark.parametrize("op", sorted(_OPS))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_matches_reference(op, data):
    n_state, attr_strategies = _OPS[op]
    n_params = data.draw(st.integers(1, 2))
    shapes = [data.draw(st.lists(st.integers(1, 3), max_size=2)) for _ in range(n_params)]
    attrs = {k: data.draw(s) for k, s in attr_strategies.items()}
    model, names = _model(op, n_params, n_state, shapes, attrs)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    feeds = {"R": np.array(data.draw(st.floats(0.01, 0.5)), np.float32),
             "T": np.array(data.draw(st.integers(0, 5)), np.int64)}
    for n in names:
        value = rng.standard_normal(shapes[int(n[-1])]).astype(np.float32)
        feeds[n] = np.abs(value) if n.startswith("S") and (op != "Momentum") else value
    want = ReferenceEvaluator(model).run(None, feeds)
    g = JaxGraph(model, check=False)
    with jax.enable_x64(True):
        got = jax.jit(g.apply)(g.params, *[feeds[i.name] for i in g.inputs])
    for w, o in zip(want, got):
        assert np.asarray(o).dtype == np.float32
        np.testing.assert_allclose(np.asarray(o), np.asarray(w, np.float32), rtol=2e-5, atol=2e-6)
