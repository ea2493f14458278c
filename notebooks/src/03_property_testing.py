# %% [markdown]
# # Property testing your own ONNX model with jaxort.testing
#
# A user has an ONNX model (here a small classifier written with `onnx.helper`)
# and wants to know that jaxort computes what ONNX's reference evaluator
# computes, that its gradients are right, and that a checkpoint of it
# survives a round trip. `jaxort.testing` has the strategies and checkers;
# hypothesis draws the inputs. It runs on a CPU in seconds.

# %%
import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import jaxort.checkpoint as ckpt
from jaxort.testing import (
    assert_checkpoint_roundtrip,
    assert_matches_reference,
    check_gradients,
    model_inputs,
    onnx_models,
)
from jaxort.testing.coverage import Coverage
from jaxort.testing.profiles import CI

# %% [markdown]
# ## 1. The model under test
#
# x [batch, 4] -> Gemm -> LayerNormalization -> Gelu -> MatMul -> LogSoftmax,
# with a symbolic batch dimension.

# %%
rng = np.random.default_rng(0)
inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 8)).astype(np.float32), "w1"),
         numpy_helper.from_array(np.zeros(8, np.float32), "b1"),
         numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
         numpy_helper.from_array(rng.normal(0, 0.5, (8, 3)).astype(np.float32), "w2")]
nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
         helper.make_node("LayerNormalization", ["h", "gamma"], ["n"], epsilon=1e-5),
         helper.make_node("Gelu", ["n"], ["g"]),
         helper.make_node("MatMul", ["g", "w2"], ["logits"]),
         helper.make_node("LogSoftmax", ["logits"], ["y"], axis=-1)]
graph = helper.make_graph(
    nodes, "classifier",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
onnx.checker.check_model(model, full_check=True)

# %% [markdown]
# ## 2. Against ONNX's reference evaluator, on drawn inputs
#
# `model_inputs(model)` draws one array per graph input (symbolic dimensions
# sized by `dims`), inside the domain of the ops that read it.
# `assert_matches_reference` compares every output with per-dtype
# tolerances; a failure names the output, the max absolute and relative
# error and where, and saves the model and inputs to a file.

# %%
@settings(CI, max_examples=15)
@given(st.sampled_from([1, 2, 5]).flatmap(lambda n: model_inputs(model, dims={"batch": n})))
def test_model_matches_reference(inputs):
    (y,) = assert_matches_reference(model, inputs)
    np.testing.assert_allclose(np.exp(y).sum(-1), 1.0, rtol=1e-5)


test_model_matches_reference()

# %% [markdown]
# ## 3. Gradients against finite differences
#
# `check_gradients` makes the model float64 and compares `jax.grad` through
# jaxort with central differences, here with respect to the input and two
# weights.

# %%
@settings(CI, max_examples=5)
@given(model_inputs(model, seeded=True))
def test_model_gradients(inputs):
    grads = check_gradients(model, inputs, wrt=["x", "w1", "w2"])
    assert grads["w1"].shape == (4, 8)


test_model_gradients()

# %% [markdown]
# ## 4. A checkpoint of its weights round-trips

# %%
state = ckpt.Checkpoint(
    trainable={t.name: numpy_helper.to_array(t) for t in inits},
    properties={"epoch": 3, "note": "notebook 03"})
back = assert_checkpoint_roundtrip(state)
sorted(back.trainable)

# %% [markdown]
# ## 5. Random models around it, and what they covered
#
# The same checks over random graphs of the ops this model uses (and their
# families), with a coverage tally of ops, opsets, dtypes and attributes.

# %%
coverage = Coverage()


@settings(CI, max_examples=30)
@given(st.data())
def test_random_neighbours(data):
    m = data.draw(onnx_models(ops=["matmul", "normalization", "Gelu", "LogSoftmax"],
                              max_nodes=3, opset=[20], dtypes=[np.float32]))
    coverage.add(m)
    assert_matches_reference(m, data.draw(model_inputs(m)))


test_random_neighbours()
print(coverage.report())
assert coverage.models >= 30
assert {"Gemm", "MatMul", "LayerNormalization"} <= set(coverage.ops)
assert all(count > 0 for count in coverage.ops.values())
