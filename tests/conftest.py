"""Settings for the whole suite.

Hypothesis runs derandomized: the examples a property test draws are fixed by
the test itself, so a failure in CI reproduces on any machine. ``HYPOTHESIS_PROFILE=explore``
draws fresh random examples (and more of them) for a local bug hunt.
"""

import os

# The suite does not write to the user's compilation cache (tests of the
# cache set their own directory): see jaxort/graph/compilation_cache.py.
os.environ.setdefault("JAXORT_COMPILATION_CACHE", "off")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("explore", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class _CompileCounter:
    """Counts XLA compilations (jax.monitoring events) while a call runs."""

    def __init__(self):
        import jax

        self.active = False
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, name, secs, **kwargs):
        if self.active and name == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def during(self, fn, *args):
        """The number of compilations while ``fn(*args)`` runs."""
        self.count, self.active = 0, True
        try:
            fn(*args)
        finally:
            self.active = False
        return self.count


_COMPILES = []


@pytest.fixture
def compiles() -> _CompileCounter:
    """One process-wide compile counter (jax.monitoring listeners cannot be removed)."""
    if not _COMPILES:
        _COMPILES.append(_CompileCounter())
    return _COMPILES[0]


@pytest.fixture
def load_tool():
    """``load_tool(name)``: the script ``tools/<name>.py`` imported as a module."""
    import importlib.util
    import pathlib

    def load(name):
        path = pathlib.Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load
