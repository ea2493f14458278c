"""Device names -> JAX devices.

The ONNX backend, the training layer and the session facades all accept a
device as a string; this module is the one place that maps it to a
``jax.Device``. It imports only JAX and ``jaxort.errors``.
"""

from __future__ import annotations

import jax

from jaxort.errors import InputError

__all__ = ["resolve_device"]

# Device names, case-insensitive: ONNX backends say "CPU"/"CUDA", ORT's
# training API "cpu"/"cuda".
_DEVICE_PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "tpu": "tpu"}


def resolve_device(device: str) -> jax.Device:
    """Maps a device name to a JAX device.

    Args:
      device: ``"cpu"``, ``"cuda"``, ``"gpu"`` or ``"tpu"`` in any case,
        optionally followed by ``":<index>"`` (default index 0).

    Returns:
      The JAX device of that platform and index.

    Raises:
      InputError: an unknown device name, a bad index, or a device JAX does
        not have in this process.

    Example:
      >>> resolve_device("CPU").platform
      'cpu'
    """
    if not isinstance(device, str):
        raise InputError(f"device must be a string such as 'cpu' or 'cuda:0', got {device!r}")
    kind, _, index = device.partition(":")
    platform = _DEVICE_PLATFORMS.get(kind.strip().lower())
    if platform is None:
        raise InputError(f"unknown device {device!r}; jaxort supports 'cpu', 'cuda', 'gpu' and "
                         "'tpu', optionally followed by ':<index>'")
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        available = sorted({d.platform for d in jax.devices()})
        raise InputError(f"device {device!r} is not available: JAX has no {platform!r} backend "
                         f"in this process (available: {available})") from None
    try:
        position = int(index) if index else 0
    except ValueError:
        raise InputError(f"device {device!r}: the index after ':' must be an integer") from None
    if not 0 <= position < len(devices):
        raise InputError(f"device {device!r} is not available: JAX sees {len(devices)} "
                         f"{platform} device(s)")
    return devices[position]
