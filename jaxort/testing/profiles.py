"""Hypothesis settings profiles for suites that use jaxort's strategies.

``jaxort-ci``: derandomized, a bounded number of examples, a deadline per
example (a JIT compile included), no example database: the same examples on
every machine. ``jaxort-fuzz``: fresh random examples without a bound, for
a run limited by time (:func:`fuzz_seconds`, from ``FUZZ_MINUTES``), as
``make fuzz`` and ``python -m jaxort.testing.coverage --minutes`` do.
"""

from __future__ import annotations

import datetime
import os

from hypothesis import HealthCheck, settings

__all__ = ["CI", "FUZZ", "fuzz_seconds", "register_profiles"]

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

CI = settings(max_examples=100, deadline=datetime.timedelta(seconds=30), derandomize=True,
              database=None, print_blob=True, suppress_health_check=_QUIET)
FUZZ = settings(max_examples=1_000_000, deadline=None, derandomize=False, database=None,
                print_blob=True, suppress_health_check=_QUIET)


def register_profiles() -> None:
    """Registers ``jaxort-ci`` and ``jaxort-fuzz`` with hypothesis (load one with ``settings.load_profile``)."""
    settings.register_profile("jaxort-ci", CI)
    settings.register_profile("jaxort-fuzz", FUZZ)


def fuzz_seconds() -> float:
    """Seconds a long run may take: ``FUZZ_MINUTES`` * 60, or 0 when it is unset."""
    return float(os.environ.get("FUZZ_MINUTES") or 0) * 60
