"""Checkpoint load/save speed against raw file I/O of the same byte count.

A state of ~256 MB of float32 parameters (plus small tensors and
properties) is saved and loaded with jaxort.checkpoint; the same process
times a raw write (write + fsync, as save does) and a raw read (readinto a
preallocated buffer) of the same number of bytes. Reported as throughput
ratios (1.0 = as fast as raw I/O); targets: load >= 0.8x raw read,
save >= 0.5x raw write. Peak extra memory while loading is measured in a
fresh subprocess (ru_maxrss and tracemalloc), target <= 1.2x the file size.

Run: python benchmarks/bench_checkpoint.py   (about half a minute)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import jaxort.checkpoint as ckpt

REPEATS = 3
TARGET_BYTES = 256 * 1024**2


def _state() -> ckpt.Checkpoint:
    rng = np.random.default_rng(0)
    n_big = 16
    each = TARGET_BYTES // n_big // 4
    trainable = {f"layer{i}.weight": rng.standard_normal(each, dtype=np.float32).reshape(-1, 1024) for i in range(n_big)}
    trainable.update({f"layer{i}.bias": rng.standard_normal(1024, dtype=np.float32) for i in range(n_big)})
    frozen = {"running_mean": np.zeros(4096, np.float32), "step_count": np.array(12, np.int64)}
    return ckpt.Checkpoint(trainable=trainable, frozen=frozen, properties={"epoch": 3, "loss": 0.25, "run": "bench"})


def _raw_write(path: str, data: np.ndarray) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = memoryview(data).cast("B")
        while view.nbytes:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _raw_read(path: str, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    with open(path, "rb", buffering=0) as f:
        view = memoryview(out)
        done = 0
        while done < nbytes:
            done += f.readinto(view[done:])
    return out


def _best(fn) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


# Peak resident memory of this process: VmHWM on Linux (ru_maxrss would
# include the parent's peak, as it survives exec).
_MEMORY_PROBE = """
import resource, sys, tracemalloc
import jaxort.checkpoint as ckpt

def peak_rss():
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

ckpt.load(sys.argv[2])  # warm up imports and code paths
before = peak_rss()
tracemalloc.start()
state = ckpt.load(sys.argv[1])
checksum = sum(float(v.reshape(-1)[-1]) for v in state.trainable.values())
_, peak = tracemalloc.get_traced_memory()
print(peak_rss() - before, peak)
"""


def main() -> None:
    state = _state()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "checkpoint")
        raw_path = os.path.join(tmp, "raw")
        ckpt.save(state, path)
        size = os.path.getsize(path)
        payload = np.frombuffer(open(path, "rb").read(), np.uint8).copy()

        t_save = _best(lambda: ckpt.save(state, path))
        t_raw_write = _best(lambda: _raw_write(raw_path, payload))
        t_load = _best(lambda: ckpt.load(path))
        t_raw_read = _best(lambda: _raw_read(raw_path, size))
        t_to_bytes = _best(lambda: ckpt.to_bytes(state))

        small = os.path.join(tmp, "small")
        ckpt.save(state.replace(trainable={"w": np.zeros(4, np.float32)}), small)
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_PROBE, path, small], capture_output=True, text=True, check=True
        )
        rss_extra, traced_peak = (int(x) for x in out.stdout.split())

    mb = size / 1e6
    print(f"checkpoint: {len(state.parameters)} tensors, {mb:.1f} MB (best of {REPEATS})")
    print(f"  raw write+fsync {t_raw_write * 1e3:8.1f} ms  {mb / t_raw_write:8.0f} MB/s")
    print(f"  save            {t_save * 1e3:8.1f} ms  {mb / t_save:8.0f} MB/s   ratio {t_raw_write / t_save:.2f}x (target >= 0.5x)")
    print(f"  raw read        {t_raw_read * 1e3:8.1f} ms  {mb / t_raw_read:8.0f} MB/s")
    print(f"  load            {t_load * 1e3:8.1f} ms  {mb / t_load:8.0f} MB/s   ratio {t_raw_read / t_load:.2f}x (target >= 0.8x)")
    print(f"  to_bytes        {t_to_bytes * 1e3:8.1f} ms  {mb / t_to_bytes:8.0f} MB/s")
    print(
        f"  peak extra memory while loading: resident +{rss_extra / 1e6:.1f} MB = {rss_extra / size:.2f}x file, "
        f"tracemalloc peak {traced_peak / 1e6:.1f} MB = {traced_peak / size:.2f}x file (target <= 1.2x)"
    )


if __name__ == "__main__":
    main()
