"""jaxort.graph.numerics: the CPU-or-default lowering switch and the platform a trace is made for."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from jaxort.graph import lowering_platform, numerics
from jaxort.graph.numerics import on_cpu_else


def _primitives(fn, *args) -> set:
    return {e.primitive.name for e in jax.make_jaxpr(fn)(*args).eqns}


@pytest.mark.parametrize("platform,branch", [("cpu", "sin"), ("gpu", "cos"), ("tpu", "cos")])
def test_a_known_platform_traces_one_branch(platform, branch):
    f = lambda x: on_cpu_else(x, jnp.sin, jnp.cos)  # noqa: E731
    with lowering_platform(platform):
        assert _primitives(f, 1.0) == {branch}
        np.testing.assert_allclose(np.asarray(jax.jit(f)(0.5)), getattr(np, branch)(0.5), rtol=1e-6)


def test_an_unknown_platform_leaves_the_choice_to_the_compiler():
    # A new function per trace: JAX's trace caches do not see the setting.
    f = lambda x: on_cpu_else(x, jnp.sin, jnp.cos)  # noqa: E731
    with lowering_platform("cpu"):
        with lowering_platform(None):  # nested: the inner block wins, and is undone on exit
            assert _primitives(lambda x: f(x), 1.0) == {"platform_index", "cond"}
        assert _primitives(lambda x: f(x), 1.0) == {"sin"}
    assert numerics._LOWERING_PLATFORM.get() is None
    for platform, op in (("cpu", "sine"), ("cuda", "cosine")):
        text = export.export(jax.jit(f), platforms=[platform])(1.0).mlir_module()
        assert f"stablehlo.{op}" in text and ("stablehlo.sine" in text) == (op == "sine")
