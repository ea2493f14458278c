"""Random ops (ops/random.py): shapes, dtypes, ranges and determinism of their draws.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from onnx import TensorProto

from jaxort.errors import OpError
from jaxort.graph import JaxGraph
from jaxort.testing import run_jaxort

from ._harness import example

RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Bernoulli", "Multinomial")
COVERED_OPS = set(RANDOM_OPS)


def _random_model(op, attrs, x=None):
    inputs = [] if x is None else [x]
    return example(op, inputs, attrs, opset=17)


def test_random_ops_draw_from_the_key_with_the_right_shapes_and_ranges():
    key = jax.random.key(0)
    x = np.full((200, 50), 0.3, np.float32)

    def draw(op, attrs, x=None):
        return run_jaxort(_random_model(op, attrs, x), rng=key, jit=False)[0]

    u = draw("RandomUniformLike", {"low": -2.0, "high": 3.0}, x)
    assert u.shape == x.shape and u.dtype == np.float32
    assert u.min() >= -2.0 and u.max() < 3.0 and abs(u.mean() - 0.5) < 0.1
    n = draw("RandomNormalLike", {"mean": 1.0, "scale": 2.0, "dtype": TensorProto.DOUBLE}, x)
    assert n.dtype == np.float64 and abs(n.mean() - 1.0) < 0.1 and abs(n.std() - 2.0) < 0.1
    n2 = draw("RandomNormal", {"shape": [3, 4]})
    assert n2.shape == (3, 4) and n2.dtype == np.float32
    u2 = draw("RandomUniform", {"shape": [5], "dtype": TensorProto.FLOAT16})
    assert u2.shape == (5,) and u2.dtype == np.float16 and (u2 >= 0).all() and (u2 <= 1).all()
    b = draw("Bernoulli", {}, x)
    assert b.dtype == np.float32 and set(np.unique(b)) <= {0.0, 1.0}
    assert abs(b.mean() - 0.3) < 0.05
    b2 = draw("Bernoulli", {"dtype": TensorProto.INT64}, np.asarray([0.0, 1.0, 0.0, 1.0]))
    np.testing.assert_array_equal(b2, [0, 1, 0, 1])
    logits = np.log(np.asarray([[1e-9, 1.0, 1e-9], [1e-9, 1e-9, 1.0]], np.float32))
    m = draw("Multinomial", {"sample_size": 4}, logits)
    assert m.dtype == np.int32
    np.testing.assert_array_equal(m, [[1] * 4, [2] * 4])


def test_random_ops_need_a_key_or_a_seed():
    ex = _random_model("RandomNormal", {"shape": [2]})
    g = JaxGraph(ex.model(), check=False, params=[])
    with pytest.raises(OpError, match="RandomNormal.*needs a PRNG key"):
        g.apply(g.params)
    seeded = _random_model("RandomNormal", {"shape": [2], "seed": 5.0})
    first, second = run_jaxort(seeded)[0], run_jaxort(seeded)[0]
    np.testing.assert_array_equal(first, second)
    a = run_jaxort(ex, rng=jax.random.key(1))[0]
    b = run_jaxort(ex, rng=jax.random.key(2))[0]
    assert not np.array_equal(a, b)
