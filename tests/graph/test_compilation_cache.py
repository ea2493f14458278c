"""The persistent compilation cache jaxort turns on (jaxort/graph/compilation_cache.py),
and the traced steps it keeps beside it (jaxort/training/step_cache.py).

Each case runs in fresh Python processes: the cache is process-wide JAX
state, decided at the first compile. The suite itself runs with the cache
off (tests/conftest.py), so these set the environment they need.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "mlp_adamw"

# One train step and one optimizer step through jaxort.api on ORT's artifacts
# of the golden MLP; prints what JAX's cache did, the directory jaxort chose
# and the loss.
_TRAIN = r"""
import json, sys
import jax, numpy as np
from jax import monitoring
events = {}
monitoring.register_event_listener(lambda name, **kw: events.__setitem__(name, events.get(name, 0) + 1))
import jaxort.graph
from jaxort.api import CheckpointState, Module, Optimizer
d = sys.argv[1]
state = CheckpointState.load_checkpoint(d + "/checkpoint")
module = Module(d + "/training_model.onnx", state, d + "/eval_model.onnx")
optimizer = Optimizer(d + "/optimizer_model.onnx", module)
batches = np.load(d + "/batches.npz")
loss = module(batches["train::input"][0], batches["train::labels"][0])
optimizer.step()
loss = module(batches["train::input"][1], batches["train::labels"][1])
print(json.dumps({"hits": events.get("/jax/compilation_cache/cache_hits", 0),
                  "misses": events.get("/jax/compilation_cache/cache_misses", 0),
                  "dir": jaxort.graph.compilation_cache_dir(),
                  "jax_dir": jax.config.jax_compilation_cache_dir,
                  "min_secs": jax.config.jax_persistent_cache_min_compile_time_secs,
                  "loss": float(loss)}))
"""


def _run(env_changes: dict, script: str = _TRAIN, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAXORT_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR",
                        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    # Cache every program, however fast it compiles (jaxort's threshold is 0.1 s).
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env.update({k: v for k, v in env_changes.items() if v is not None})
    for k in [k for k, v in env_changes.items() if v is None]:
        env.pop(k, None)
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _entries(path: pathlib.Path) -> list:
    return sorted(p.name for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))


def test_a_second_process_loads_its_train_step_from_the_cache(tmp_path):
    cache = tmp_path / "xla"
    first = _run({"JAXORT_COMPILATION_CACHE": str(cache)}, _TRAIN, str(GOLDEN))
    assert first["dir"] == str(cache) and first["jax_dir"] == str(cache)
    assert first["hits"] == 0 and first["misses"] > 0
    written = _entries(cache)
    assert len(written) >= first["misses"]
    second = _run({"JAXORT_COMPILATION_CACHE": str(cache)}, _TRAIN, str(GOLDEN))
    # Every program the second process needs was compiled by the first.
    assert second["misses"] == 0
    assert second["hits"] >= first["misses"]
    assert _entries(cache) == written
    assert second["loss"] == first["loss"]


def test_the_default_directory_is_under_the_user_cache(tmp_path):
    home = tmp_path / "cachehome"
    out = _run({"XDG_CACHE_HOME": str(home)}, _TRAIN, str(GOLDEN))
    assert out["dir"] == str(home / "jaxort" / "xla")
    assert _entries(home / "jaxort" / "xla")
    assert (home / "jaxort" / "xla").stat().st_mode & 0o077 == 0  # owner only


@pytest.mark.parametrize("off", ["0", "off", "None", "false"])
def test_the_environment_turns_the_cache_off(tmp_path, off):
    home = tmp_path / "cachehome"
    out = _run({"XDG_CACHE_HOME": str(home), "JAXORT_COMPILATION_CACHE": off}, _TRAIN, str(GOLDEN))
    assert out["dir"] is None and out["jax_dir"] is None
    assert out["hits"] == 0 and out["misses"] == 0
    assert not home.exists()


def test_a_directory_given_to_jax_wins(tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "jaxort"
    out = _run({"JAX_COMPILATION_CACHE_DIR": str(mine), "JAXORT_COMPILATION_CACHE": str(theirs)},
               _TRAIN, str(GOLDEN))
    assert out["dir"] == str(mine) and out["jax_dir"] == str(mine)
    assert _entries(mine) and not theirs.exists()


_MOVE = r"""
import json, sys
import jax, jax.numpy as jnp
import jaxort.graph
first, second = sys.argv[1], sys.argv[2]
assert jaxort.graph.compilation_cache_dir() == first
jax.jit(lambda x: x * 2.0)(jnp.ones(3)).block_until_ready()
moved = jaxort.graph.set_compilation_cache(second)
jax.jit(lambda x: x * 3.0)(jnp.ones(4)).block_until_ready()
off = jaxort.graph.set_compilation_cache(None)
jax.jit(lambda x: x * 4.0)(jnp.ones(5)).block_until_ready()
print(json.dumps({"moved": moved, "off": off, "jax_dir": jax.config.jax_compilation_cache_dir,
                  "dir": jaxort.graph.compilation_cache_dir()}))
"""


def test_set_compilation_cache_moves_it_and_turns_it_off(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    out = _run({"JAXORT_COMPILATION_CACHE": str(first)}, _MOVE, str(first), str(second))
    assert out == {"moved": str(second), "off": None, "jax_dir": None, "dir": None}
    # Each lambda's program in the directory in use when it compiled; the last one nowhere.
    lambdas = [[n for n in _entries(d) if n.startswith("jit__lambda")] for d in (first, second)]
    assert [len(x) for x in lambdas] == [1, 1]
    assert lambdas[0] != lambdas[1]


def test_an_unwritable_directory_warns_and_compiles_without_a_cache(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    script = "import warnings\nwarnings.simplefilter('error', RuntimeWarning)\n" + _TRAIN
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["JAXORT_COMPILATION_CACHE"] = str(blocker / "xla")
    done = subprocess.run([sys.executable, "-c", script, str(GOLDEN)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode != 0
    assert "no persistent compilation cache: cannot create" in done.stderr and str(blocker) in done.stderr
    # Without warnings as errors the same process trains, uncached.
    out = _run({"JAXORT_COMPILATION_CACHE": str(blocker / "xla")}, _TRAIN, str(GOLDEN))
    assert out["dir"] is None and out["hits"] == 0 and out["misses"] == 0


@pytest.mark.parametrize("given,expected", [(None, 0.1), ("0.5", 0.5)])
def test_jaxort_lowers_jax_s_default_compile_time_threshold_only(tmp_path, given, expected):
    out = _run({"JAXORT_COMPILATION_CACHE": str(tmp_path / "xla"),
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": given}, _TRAIN, str(GOLDEN))
    assert out["min_secs"] == expected


_OFF_KEEPS_JAX_S = r"""
import json, sys
import jax
import jaxort.graph
print(json.dumps({"before": jaxort.graph.compilation_cache_dir(),
                  "after": jaxort.graph.set_compilation_cache(None),
                  "jax_dir": jax.config.jax_compilation_cache_dir}))
"""


def test_turning_jaxort_s_cache_off_leaves_a_directory_given_to_jax(tmp_path):
    mine = str(tmp_path / "mine")
    out = _run({"JAX_COMPILATION_CACHE_DIR": mine}, _OFF_KEEPS_JAX_S)
    assert out == {"before": mine, "after": mine, "jax_dir": mine}


# Two train steps around an optimizer step, two more accumulating (the second
# on a smaller batch), then eval, through jaxort.api on
# a golden case's artifacts (its optimizer model replaced by argv[2] when
# given); prints the losses, how many steps were traced and how many read
# from the step cache, and the entries of the step cache.
_STEPS = r"""
import json, os, pathlib, sys
import numpy as np
import jaxort.graph
from jaxort.api import CheckpointState, Module, Optimizer
d = sys.argv[1]
optimizer_model = sys.argv[2] if len(sys.argv) > 2 else d + "/optimizer_model.onnx"
module = Module(d + "/training_model.onnx", CheckpointState.load_checkpoint(d + "/checkpoint"),
                d + "/eval_model.onnx")
optimizer = Optimizer(optimizer_model, module)
optimizer.set_learning_rate(0.01)
batches = np.load(d + "/batches.npz")
losses = [float(module(batches["train::input"][0], batches["train::labels"][0]))]
optimizer.step()
module.lazy_reset_grad()
losses.append(float(module(batches["train::input"][1], batches["train::labels"][1])))
for rows in (None, 3):  # the same step on a smaller batch, as an epoch's last one
    losses.append(float(module(batches["train::input"][2][:rows], batches["train::labels"][2][:rows])))
module.eval()
losses.append(float(module(batches["eval::input"], batches["eval::labels"])))
program = module._state.session_state.program
cache = jaxort.graph.compilation_cache_dir()
steps = pathlib.Path(cache or ".", "jaxort-steps")
print(json.dumps({"losses": losses, "traces": program.trace_count(), "loads": program.load_count(),
                  "entries": sorted(p.name for p in steps.glob("*.jaxexport")) if cache else []}))
"""


def _golden_train_losses(case: str) -> list:
    """ORT's losses of the first two train calls of _STEPS."""
    calls = json.loads((GOLDEN.parent / case / "trajectory.json").read_text())["calls"]
    return [c["result"]["loss"] for c in calls if c["call"] == "module.__call__" and c["mode"] == "train"][:2]


def test_a_second_process_reads_its_steps_instead_of_tracing_them(tmp_path):
    cache = {"JAXORT_COMPILATION_CACHE": str(tmp_path / "xla")}
    first = _run(cache, _STEPS, str(GOLDEN))
    assert first["traces"] >= 2 and first["loads"] == 0
    assert len(first["entries"]) == first["traces"]
    second = _run(cache, _STEPS, str(GOLDEN))
    assert second["traces"] == 0 and second["loads"] == first["traces"]
    assert second["entries"] == first["entries"]
    # The same programs, compiled once: the same numbers, and ORT's.
    assert second["losses"] == first["losses"]
    uncached = _run({"JAXORT_COMPILATION_CACHE": "off"}, _STEPS, str(GOLDEN))
    assert uncached["entries"] == [] and uncached["loads"] == 0
    np.testing.assert_allclose(first["losses"], uncached["losses"], rtol=1e-6)
    np.testing.assert_allclose(first["losses"][:2], _golden_train_losses("mlp_adamw"), rtol=1e-5)


def test_another_optimizer_does_not_read_the_first_one_s_steps(tmp_path):
    cache = {"JAXORT_COMPILATION_CACHE": str(tmp_path / "xla")}
    adamw = _run(cache, _STEPS, str(GOLDEN))
    sgd_model = str(GOLDEN.parent / "mlp_sgd" / "optimizer_model.onnx")
    sgd = _run(cache, _STEPS, str(GOLDEN), sgd_model)
    # The optimizer is part of the program's fingerprint: every step is traced anew, eval too.
    assert sgd["traces"] == adamw["traces"] and sgd["loads"] == 0
    assert len(sgd["entries"]) == len(adamw["entries"]) + sgd["traces"]
    uncached = _run({"JAXORT_COMPILATION_CACHE": "off"}, _STEPS, str(GOLDEN), sgd_model)
    np.testing.assert_allclose(sgd["losses"], uncached["losses"], rtol=1e-6)
    assert sgd["losses"][1] != pytest.approx(adamw["losses"][1], rel=1e-4)


def test_a_damaged_entry_is_traced_and_written_again(tmp_path):
    cache = {"JAXORT_COMPILATION_CACHE": str(tmp_path / "xla")}
    first = _run(cache, _STEPS, str(GOLDEN))
    steps = tmp_path / "xla" / "jaxort-steps"
    for name in first["entries"]:
        (steps / name).write_bytes(b"not an exported program")
    damaged = _run(cache, _STEPS, str(GOLDEN))
    assert damaged["traces"] == first["traces"] and damaged["loads"] == 0
    assert damaged["losses"] == first["losses"]
    again = _run(cache, _STEPS, str(GOLDEN))
    assert again["traces"] == 0 and again["loads"] == first["traces"]


_OPTAX = r"""
import json, pathlib, sys
import numpy as np, optax
import jaxort.graph
from jaxort import checkpoint as ckpt
from jaxort.training import TrainProgram
d = sys.argv[1]
checkpoint = ckpt.load(d + "/checkpoint")
program = TrainProgram.from_artifacts(d + "/training_model.onnx", optimizer_model=optax.sgd(0.01),
                                      checkpoint=checkpoint)
state = program.init_state(checkpoint)
batches = np.load(d + "/batches.npz")
state, outputs = program.train_and_update(state, batches["train::input"][0], batches["train::labels"][0])
steps = pathlib.Path(jaxort.graph.compilation_cache_dir(), "jaxort-steps")
print(json.dumps({"traces": program.trace_count(), "loads": program.load_count(),
                  "entries": sorted(p.name for p in steps.glob("*.jaxexport"))}))
"""


def test_steps_that_depend_on_python_code_are_not_saved(tmp_path):
    # An optax optimizer is Python the fingerprint cannot see: its steps are traced every time.
    cache = {"JAXORT_COMPILATION_CACHE": str(tmp_path / "xla")}
    for _ in range(2):
        out = _run(cache, _OPTAX, str(GOLDEN))
        assert out == {"traces": 1, "loads": 0, "entries": []}
