"""jaxort.checkpoint works with numpy and flatbuffers alone: no JAX, no onnx."""

from __future__ import annotations

import subprocess
import sys

from .conftest import GOLDEN

SCRIPT = """
import sys
sys.modules["jax"] = None      # importing jax now raises ImportError
sys.modules["jaxlib"] = None
sys.modules["onnx"] = None
import jaxort.checkpoint as ckpt
state = ckpt.load(sys.argv[1])
data = ckpt.to_bytes(state, include_optimizer_state=True)
assert data == open(sys.argv[1], "rb").read()
print(ckpt.summary(sys.argv[1]).splitlines()[1])
assert not any(m == "jax" or m.startswith(("jax.", "onnx")) for m in sys.modules if sys.modules[m] is not None)
"""


def test_checkpoint_package_needs_no_jax():
    path = str(GOLDEN / "mlp_adamw" / "ckpt_after_with_opt")
    out = subprocess.run([sys.executable, "-c", SCRIPT, path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("checkpoint: 4 parameters")
