"""Every public module, class, function and method of jaxort has a docstring.

Public: the names in the ``__all__`` of the packages users import, and the
methods and properties of those classes whose names do not start with ``_``.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

PUBLIC_MODULES = [
    "jaxort", "jaxort.api", "jaxort.session", "jaxort.training", "jaxort.training.artifacts",
    "jaxort.training.artifacts.gradient", "jaxort.checkpoint", "jaxort.graph", "jaxort.testing",
    "jaxort.backend", "jaxort.errors", "jaxort.distributed", "jaxort.dtypes",
    "jaxort.onnxblock", "jaxort.onnxblock.blocks", "jaxort.onnxblock.loss", "jaxort.onnxblock.optim",
    "jaxort.training.artifacts.blocks", "jaxort.training.compiled", "jaxort.training.steps",
    "jaxort.training.pending", "jaxort.training.inputs", "jaxort.training.packing",
    "jaxort.training.session_state", "jaxort.training.process", "jaxort.training.optimizer_states",
    "jaxort.graph.numerics", "jaxort.nnx", "jaxort.equinox",
    "jaxort.training.orbax",
]


def undocumented(module) -> list[str]:
    """The public objects of ``module`` without a docstring, as dotted names."""
    missing = [] if (module.__doc__ or "").strip() else [module.__name__]
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(f"{module.__name__}.{name}")
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(value, property):
                    value = value.fget
                elif isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                if inspect.isfunction(value) and not (value.__doc__ or "").strip():
                    missing.append(f"{module.__name__}.{name}.{attr}")
    return missing


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_objects_have_docstrings(name):
    assert undocumented(importlib.import_module(name)) == []


def test_the_check_finds_a_missing_docstring():
    import types

    module = types.ModuleType("fake", "A module.")

    class Documented:
        """A class."""

        def method(self):
            pass

    def function():
        pass

    module.Documented, module.function, module.__all__ = Documented, function, ["Documented", "function"]
    assert undocumented(module) == ["fake.Documented.method", "fake.function"]
