"""What the step cache's key is made of (jaxort/training/step_cache.py).

Reading and writing entries across processes is tested with the compilation
cache, in tests/graph/test_compilation_cache.py.
"""

from __future__ import annotations

import types

import numpy as np
import onnx
from onnx import helper

from jaxort.training import step_cache


def _model(alpha: float) -> onnx.ModelProto:
    node = helper.make_node("LeakyRelu", ["x"], ["y"], alpha=alpha)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_fingerprint_follows_the_models_and_options():
    a = step_cache.program_fingerprint([_model(0.1), None], ["AdamW", True])
    assert a == step_cache.program_fingerprint([_model(0.1), None], ["AdamW", True])
    assert len({a,
                step_cache.program_fingerprint([_model(0.2), None], ["AdamW", True]),
                step_cache.program_fingerprint([_model(0.1), _model(0.1)], ["AdamW", True]),
                step_cache.program_fingerprint([_model(0.1), None], ["SGD", True]),
                step_cache.program_fingerprint([_model(0.1), None], ["AdamW", False])}) == 5


def test_an_op_registered_outside_jaxort_turns_the_cache_off(monkeypatch):
    def users_op(x):
        return x
    assert step_cache.program_fingerprint([_model(0.1)], []) is not None
    foreign = types.SimpleNamespace(fn=users_op)
    monkeypatch.setattr(step_cache, "registered", lambda: [foreign])
    assert step_cache.program_fingerprint([_model(0.1)], []) is None


def test_a_model_protobuf_cannot_serialize_turns_the_cache_off():
    class Unserializable:
        def SerializeToString(self, deterministic=False):
            raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB")
    assert step_cache.program_fingerprint([Unserializable()], []) is None


def test_the_signature_tells_shapes_dtypes_and_structure_apart():
    x = np.zeros((2, 3), np.float32)
    signatures = {step_cache._signature(args) for args in [
        (x,), (x.astype(np.int32),), (x.reshape(3, 2),), ((x,),), ({"a": x},), ({"b": x},)]}
    assert len(signatures) == 6
    assert step_cache._signature((x,)) == step_cache._signature((np.ones((2, 3), np.float32),))


def test_the_signature_takes_python_scalars_and_tells_weak_types_apart():
    assert step_cache._signature((2.0,)) != step_cache._signature((np.float32(2.0),))
    assert step_cache._signature((2.0,)) == step_cache._signature((3.5,))
