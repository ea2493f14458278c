"""Kills processes saving a checkpoint in a loop, and checks every load afterwards.

Run by test_crash_kill.py in a fresh interpreter (it forks, so it must not
have JAX's threads): ``python crash_driver.py DIR MODE KILLS SEED``. MODE is
``inline`` (single-file saves), ``external`` (checkpoint + data file, the
first pair and every tenth one written without jaxort's pairing record, as
ONNX Runtime writes them) or ``mixed`` (alternating). Every other kill is
injected by the saver itself right after a chosen file operation (a
temporary file written, a rename), the others land at a random moment.
Prints one JSON object: the counts and what went wrong.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import time

import numpy as np

import jaxort.checkpoint as ckpt
from jaxort.checkpoint import _files

N = 1 << 15  # float32 elements of the large tensors: a save takes a few milliseconds


def state_of(k: int) -> ckpt.Checkpoint:
    """Version k: every value derives from k, so a mix of two versions is visible."""
    return ckpt.Checkpoint(
        trainable={"a": np.full(N, k, np.float32), "b": np.full(1000, k, np.float64)},
        frozen={"c": np.full(77, k % 127, np.int8)},
        optimizer_groups=(ckpt.OptimizerGroup("group0", k, 0.001, {"a": {"momentum0": np.full(N, -k, np.float32)}}),),
        properties={"version": k},
    )


def version_of(state: ckpt.Checkpoint) -> int:
    """The version a loaded state is, or AssertionError when its parts disagree."""
    k = state.properties["version"]
    expected = state_of(k)
    for name, value in expected.parameters.items():
        if not np.array_equal(state.parameters[name], value):
            raise AssertionError(f"mixed state: {name} is not that of version {k}")
    group = state.optimizer_group()
    if group.step != k or not np.array_equal(group.states["a"]["momentum0"], expected.optimizer_groups[0].states["a"]["momentum0"]):
        raise AssertionError(f"mixed state: the optimizer group is not that of version {k}")
    return k


def threshold(mode: str, k: int):
    if mode == "inline":
        return None
    if mode == "external":
        return 0
    return 0 if k % 2 else None


def save(path: str, mode: str, k: int) -> None:
    ckpt.save(state_of(k), path, include_optimizer_state=True, external_data_threshold=threshold(mode, k))


def strip_records(path: str) -> None:
    """Makes a jaxort pair look like ONNX Runtime's: no pairing record at the ends."""
    for p in (path, path + ".data"):
        if os.path.exists(p):
            with open(p, "r+b") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(size - _files.TRAILER_SIZE)
                if f.read()[-8:].startswith(b"JXO"):
                    f.truncate(size - _files.TRAILER_SIZE)


def saver(path: str, mode: str, first: int, kill_after: int) -> None:
    """Saves versions first, first + 1, ... until killed (by itself after ``kill_after`` file operations)."""
    if kill_after:
        events = [0]
        real_replace, real_write_temp = os.replace, _files._write_temp

        def tick():
            events[0] += 1
            if events[0] == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)

        def replace(*args, **kwargs):
            real_replace(*args, **kwargs)
            tick()

        def write_temp(*args, **kwargs):
            out = real_write_temp(*args, **kwargs)
            tick()
            return out

        _files.os.replace = replace
        _files._write_temp = write_temp
    k = first
    while True:
        save(path, mode, k)
        k += 1


def main() -> None:
    directory, mode, kills, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    path = os.path.join(directory, "ckpt")
    save(path, mode, 0)
    if mode == "external":
        strip_records(path)
    out = {"kills": 0, "injected": 0, "complete": 0, "newer": 0, "errors": [], "problems": [],
           "temps_seen": 0, "cleanups": 0}
    temp_name = re.compile(r"\..*\.jaxort-(tmp|prev)")
    base = 0
    for i in range(kills):
        first = (i + 1) * 100_000
        injected = i % 2 == 1
        kill_after = rng.randint(1, 12) if injected else 0
        pid = os.fork()
        if pid == 0:
            try:
                saver(path, mode, first, kill_after)
            finally:
                os._exit(3)
        if not injected:
            time.sleep(rng.uniform(0.0, 0.03))
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            out["problems"].append(f"kill {i}: the saver ended with status {status}")
            continue
        out["kills"] += 1
        out["injected"] += injected
        try:
            k = version_of(ckpt.load(path, mmap=rng.random() < 0.5))
        except ckpt.CheckpointError as e:
            out["errors"].append(f"kill {i}: {e}")
        except Exception as e:  # a mix, or an error that is not jaxort's
            out["problems"].append(f"kill {i}: {type(e).__name__}: {e}")
        else:
            out["complete"] += 1
            if k < base:
                out["problems"].append(f"kill {i}: loaded version {k}, older than {base}")
            out["newer"] += k > base
            base = k
        out["temps_seen"] += sum(bool(temp_name.fullmatch(n)) for n in os.listdir(directory))
        if i % 3 == 2 or i == kills - 1:
            # The next save removes what the killed savers left.
            base = first + 99_999
            save(path, mode, base)
            expected = ["ckpt", "ckpt.data"] if threshold(mode, base) is not None else ["ckpt"]
            found = sorted(os.listdir(directory))
            if found != expected:
                out["problems"].append(f"kill {i}: after a save the directory holds {found}")
            out["cleanups"] += 1
            if mode == "external" and i % 10 == 8:
                strip_records(path)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
