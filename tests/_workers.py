"""Running a test's worker script in a process of its own and reading the JSON line it prints last.

Tests that need a fresh process (eight fake CPU devices, a peak RSS of its
own, another Python) run a worker beside them; a failed worker's stderr tail
is the assertion message.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Optional

# Eight host CPU devices for JAX, in a new process (the flag is read once, at JAX's start).
EIGHT_CPU_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


def run_worker(script: pathlib.Path, *args, env: Optional[dict] = None, python: str = sys.executable,
               timeout: float = 600) -> dict:
    """Runs ``python script *args`` with ``env`` added to the environment; returns its last stdout line as JSON."""
    proc = subprocess.run([python, str(script), *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=timeout)
    assert proc.returncode == 0, (f"{script.name} {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                                  f"{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
