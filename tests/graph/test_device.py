"""jaxort.graph.resolve_device: device names -> JAX devices."""

import jax
import pytest

from jaxort import errors
from jaxort.graph import resolve_device


def test_names_and_indices():
    cpu = jax.devices("cpu")
    assert resolve_device("cpu") == cpu[0]
    assert resolve_device("CPU") == cpu[0]
    assert resolve_device(" Cpu :0") == cpu[0]


@pytest.mark.parametrize("device, match", [
    ("npu", "unknown device 'npu'"),
    ("cpu:x", "must be an integer"),
    ("cpu:99", "not available: JAX sees"),
    (0, "must be a string"),
])
def test_bad_names(device, match):
    with pytest.raises(errors.InputError, match=match):
        resolve_device(device)


def test_missing_platforms():
    platforms = {d.platform for d in jax.devices()}
    for device, platform in (("cuda", "gpu"), ("gpu", "gpu"), ("tpu", "tpu")):
        if platform not in platforms:
            with pytest.raises(errors.InputError, match="not available"):
                resolve_device(device)
        else:
            assert resolve_device(device).platform == platform
