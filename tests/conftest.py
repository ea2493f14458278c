"""Settings for the whole suite.

Hypothesis runs derandomized: the examples a property test draws are fixed by
the test itself, so a failure in CI reproduces on any machine. ``HYPOTHESIS_PROFILE=explore``
draws fresh random examples (and more of them) for a local bug hunt.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("explore", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
