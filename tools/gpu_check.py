"""The accelerator check: jaxort's device-sensitive tests and a short speed section, on whatever JAX sees.

Prepared and proven on CPU so that a machine with a GPU (or TPU) runs it in
one call, with nothing installed and nothing downloaded:

1. **environment**: the versions of what jaxort needs and what the speed
   section uses, and the devices JAX sees; a missing requirement stops the
   check with a message naming it;
2. **tests**: the tests marked ``accelerator`` (fused patterns, convolutions
   and pooling forward and backward, BatchNorm training, packing and
   donation, sharding over the local devices, mixed precision, checkpoints
   saved from device arrays, ``jaxort.api``'s golden replays) in a pytest
   subprocess, float32 matrix products at full precision
   (``JAX_DEFAULT_MATMUL_PRECISION=highest`` unless set: the tests compare
   with float32 references, and XLA's GPU default is TF32);
3. **speed**: W1-W4 of the benchmark suite and S1-S6 of the working-size
   suite (exported here with torch; artifacts by jaxort's own
   ``generate_artifacts``), jaxort's functional core against PyTorch eager
   on the same device: first step (compile; jaxort's persistent compilation
   cache is off for the check) and the median of timed steps.
   The models run while the time budget lasts; the rest are reported as
   skipped;
4. **report**: ``report.json`` and ``report.md`` in the output folder
   (``build/gpu-check`` unless ``--out`` or ``$OUT`` says otherwise).

Run::

    make gpu-check                                  # everything, on the default device
    python tools/gpu_check.py --sections tests      # the marked tests only
    JAX_PLATFORMS=cpu python tools/gpu_check.py --smoke   # the few-second CPU run of the test suite

Exit status: 0 when every marked test passed and every speed row ran or was
skipped for a stated reason, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCHMARKS = os.path.join(ROOT, "benchmarks")

REQUIRED = ("jax", "jaxlib", "numpy", "ml_dtypes", "onnx", "optax", "flatbuffers", "hypothesis", "pytest")
OPTIONAL = ("torch", "torchvision", "transformers", "onnxruntime")
SECTIONS = ("tests", "speed")
WORKLOADS = ("W1", "W2", "W3", "W4")
MODELS = ("S1", "S2", "S3", "S4", "S5", "S6")


def _version(name: str):
    try:
        if name == "torchvision":  # a wheel whose C++ ops do not match torch's build still has its models
            _benchmark("scale")._corpus()._import_torchvision()
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - an optional library that fails to import is absent
        return None
    return str(getattr(module, "__version__", "?"))


def environment() -> dict:
    """The versions of the libraries the check uses, and the devices JAX sees.

    Raises:
      SystemExit: a required library does not import (named in the message).
    """
    versions = {n: _version(n) for n in REQUIRED + OPTIONAL}
    missing = [n for n in REQUIRED if versions[n] is None]
    if missing:
        raise SystemExit(f"gpu_check: required libraries do not import: {', '.join(missing)} "
                         f"(found: {', '.join(f'{k} {v}' for k, v in versions.items() if v)})")
    import jax

    devices = jax.devices()
    env = {
        "python": platform.python_version(), "machine": platform.machine(), "versions": versions,
        "backend": jax.default_backend(), "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in devices],
        "device_count": len(devices),
        "matmul_precision": str(jax.config.jax_default_matmul_precision or "default"),
    }
    if versions["torch"]:
        import torch

        env["torch_cuda"] = bool(torch.cuda.is_available())
        if env["torch_cuda"]:
            env["torch_device"] = torch.cuda.get_device_name(0)
    return env


# -- tests ------------------------------------------------------------------------------------

def marked_files() -> list:
    """The test files with tests marked ``accelerator``: only those are collected, so a test
    module that needs a library the device image lacks (onnxruntime) cannot stop the run."""
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "tests")):
        for name in sorted(files):
            if name.startswith("test_") and name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    if "mark.accelerator" in f.read():
                        found.append(path)
    return sorted(found)


# pytest, run with Ctrl-C's KeyboardInterrupt in place: a child inherits an ignored SIGINT (a
# shell's background job, nohup, a pytest-xdist worker), and Python then installs no handler for
# it, so the time limit's interrupt would be ignored and the run killed, its results lost.
_PYTEST = ("import runpy, signal, sys\n"
           "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
           "sys.argv[0] = 'pytest'\n"
           "runpy.run_module('pytest', run_name='__main__', alter_sys=True)\n")


def run_tests(out: str, select: str | None = None, paths=None, timeout: float = 600, jobs: int = 4) -> dict:
    """Runs the tests marked ``accelerator`` in a pytest subprocess; returns counts and failures.

    Args:
      out: the report folder (pytest's junit XML goes there).
      select: a pytest ``-k`` expression narrowing the marked tests, or None.
      paths: test files or folders (default: :func:`marked_files`).
      timeout: seconds before the run is stopped (as by Ctrl-C: the results so far are kept,
        and the stop counts as an error).
      jobs: pytest-xdist worker processes (up to the CPU count), where xdist is installed.

    Returns:
      ``{"passed", "failed", "errors", "skipped", "seconds", "failures": [{"test", "message"}],
      "command"}``.
    """
    xml = os.path.join(out, "tests.xml")
    # Worker processes where pytest-xdist is installed: they share the one device, so
    # none of them preallocates most of its memory (JAX's default on GPU).
    workers = ["-n", str(min(4, os.cpu_count() or 1))] if _version("xdist") and jobs > 1 else []
    paths = list(paths or marked_files())
    args = ["-m", "accelerator", "-p", "no:cacheprovider", "-q", "-rfE"] + workers + \
        (["-k", select] if select else [])
    cmd = [sys.executable, "-c", _PYTEST, f"--junitxml={xml}"] + args + paths
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    start = time.perf_counter()
    interrupted = False
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        try:
            tail = proc.communicate(timeout=timeout)[0][-4000:]
        except subprocess.TimeoutExpired:
            # As Ctrl-C would: pytest stops and still writes the results it has.
            interrupted = True
            proc.send_signal(signal.SIGINT)
            try:
                tail = proc.communicate(timeout=60)[0][-4000:]
            except subprocess.TimeoutExpired:
                proc.kill()
                tail = proc.communicate()[0][-4000:]
    result = {"seconds": round(time.perf_counter() - start, 1), "passed": 0, "failed": 0, "errors": 0,
              "skipped": 0, "failures": [], "matmul_precision": env["JAX_DEFAULT_MATMUL_PRECISION"],
              "interrupted": f"stopped after {timeout:.0f} s" if interrupted else None,
              "command": " ".join(["pytest"] + args + [os.path.relpath(p, ROOT) for p in paths])}
    if not os.path.exists(xml):
        result["errors"] = 1
        result["failures"].append({"test": "(pytest)", "message": tail})
        return result
    if interrupted:
        result["errors"] += 1
        result["failures"].append({"test": "(pytest)", "message": f"stopped after {timeout:.0f} s"})
    for case in ET.parse(xml).getroot().iter("testcase"):
        if not case.get("name"):  # the test running when the run was stopped: counted above
            continue
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                if child.tag != "skipped":
                    message = (child.get("message") or child.text or "").strip().splitlines()
                    result["failures"].append({"test": name, "message": message[0][:300] if message else ""})
        result[outcome] += 1
    os.remove(xml)
    return result


# -- speed ------------------------------------------------------------------------------------

def _median_steps(step, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _jaxort_core(folder: str, feeds) -> callable:
    """One-step function of jaxort's core on the artifacts in ``folder`` (packed on CPU, as the README advises)."""
    import jax
    import numpy as np

    from jaxort import checkpoint as ckpt
    from jaxort.training import TrainProgram, pack

    data = ckpt.load(os.path.join(folder, "checkpoint"))
    program = TrainProgram.from_artifacts(os.path.join(folder, "training_model.onnx"), None,
                                          os.path.join(folder, "optimizer_model.onnx"), checkpoint=data)
    state = program.init_state(data)
    box = {"state": pack(state) if jax.default_backend() == "cpu" else state}
    feeds = [jax.device_put(f) for f in feeds]

    def step():
        box["state"], out = program.train_and_update(box["state"], *feeds)
        return float(np.asarray(out[0]))
    return step


def _torch_step(model, inputs, labels) -> callable:
    """One AdamW step of torch ``model`` on the device JAX uses (CUDA when both have one)."""
    import jax
    import torch

    scale = _benchmark("scale")
    device = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"
    return scale.torch_step(model, inputs, labels, device)


def _benchmark(name: str):
    """A script of benchmarks/ (``workloads``, ``scale``), imported as a module."""
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    return importlib.import_module(name)


def _measure(name, description, systems: dict, steps: int) -> dict:
    """Builds each system, times its first step and the median of ``steps`` more; a failure is a row."""
    row = {"name": name, "description": description, "systems": {}}
    for system, factory in systems.items():
        try:
            start = time.perf_counter()
            step = factory()
            built = time.perf_counter()
            loss = step()
            first = time.perf_counter()
            step()  # a warm-up step
            row["systems"][system] = {"build_s": round(built - start, 3), "first_step_s": round(first - built, 3),
                                      "s_per_step": _median_steps(step, steps), "first_loss": loss}
        except ImportError as exc:
            row["systems"][system] = {"skipped": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:  # noqa: BLE001 - the report names what failed and the check goes on
            row["systems"][system] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    times = {s: v["s_per_step"] for s, v in row["systems"].items() if "s_per_step" in v}
    if "jaxort" in times and "torch" in times:
        row["jaxort_over_torch"] = times["torch"] / times["jaxort"]  # above 1: jaxort is faster
    return row


def speed_workload(name: str, steps: int, work: str) -> dict:
    """W1-W4: jaxort's core on its own artifacts against the same network in PyTorch eager."""
    workloads = _benchmark("workloads")
    w = workloads.build(name)
    x, y = w.batches[0]

    def jaxort():
        from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

        folder = os.path.join(work, name)
        generate_artifacts(w.model, requires_grad=w.requires_grad, frozen_params=w.frozen_params,
                           loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                           artifact_directory=folder, gradient_graph=False)
        return _jaxort_core(folder, [x, y])

    def torch():
        import torch

        logits = workloads.torch_logits(w)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.p = torch.nn.ParameterDict({k.replace(".", "/"): torch.nn.Parameter(torch.tensor(v))
                                                 for k, v in w.params.items()})

            def forward(self, x):
                return logits({k.replace("/", "."): v for k, v in self.p.items()}, x)
        return _torch_step(Net(), [x], y)

    return _measure(name, w.description, {"jaxort": jaxort, "torch": torch}, steps)


def speed_model(name: str, steps: int, work: str, smoke: bool = False) -> dict:
    """S1-S6: exported with torch here, trained by jaxort's core and by PyTorch eager."""
    scale = _benchmark("scale")
    spec = scale._specs(smoke)[name]
    folder = os.path.join(work, name)
    made = {}

    def jaxort():
        made.update(scale.export_model(name, spec, folder, artifacts="jaxort"))
        import numpy as np

        with np.load(os.path.join(folder, "batch.npz")) as f:
            feeds = [f[n] for n in made["input_names"]] + [f["labels"]]
        return _jaxort_core(os.path.join(folder, "jaxort"), feeds)

    def torch():
        names, inputs, labels = scale._batch(spec)
        return _torch_step(scale.build_torch(spec), inputs, labels)

    row = _measure(name, scale._describe(spec), {"jaxort": jaxort, "torch": torch}, steps)
    if "export_s" in made:
        row["export_s"] = round(made["export_s"], 1)
    return row


def run_speed(workload_names, model_names, steps: int, budget: float, smoke: bool = False) -> list:
    """The speed rows, W1-W4 then S1-S6, each started only while ``budget`` seconds remain."""
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="jaxort-gpu-check-") as work:
        for kind, names in (("workload", workload_names), ("model", model_names)):
            for name in names:
                if time.perf_counter() - start > budget:
                    rows.append({"name": name, "skipped": f"the speed budget of {budget:.0f} s was spent"})
                    continue
                print(f"== speed {name}", file=sys.stderr, flush=True)
                rows.append(speed_workload(name, steps, work) if kind == "workload"
                            else speed_model(name, steps, work, smoke))
    return rows


# -- report -----------------------------------------------------------------------------------

def _s(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def markdown(report: dict) -> str:
    """The one-page report."""
    env = report["environment"]
    lines = ["# jaxort accelerator check", "",
             f"Backend **{env['backend']}**: {', '.join(env['devices'])}.", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v) + ".", "",
             f"Command: `{report['command']}`; wall time {report['wall_s']:.0f} s.", ""]
    tests = report.get("tests")
    if tests:
        lines += ["## Tests marked `accelerator`", "",
                  f"{tests['passed']} passed, {tests['failed']} failed, {tests['errors']} errors, "
                  f"{tests['skipped']} skipped in {tests['seconds']:.0f} s (float32 matrix products: "
                  f"{tests['matmul_precision']}; `{tests['command']}`).", ""]
        lines += [f"- FAILED `{f['test']}`: {f['message']}" for f in tests["failures"]]
        lines += [""] if tests["failures"] else []
    speed = report.get("speed")
    if speed is not None:
        lines += ["## Speed: jaxort's core against PyTorch eager on the same device", "",
                  "s/step is the median of the timed steps after a warm-up step; the first step "
                  "includes compilation (jaxort's compilation cache off); torch/jaxort above 1 means "
                  "jaxort is faster.", "",
                  "| model | jaxort s/step | torch s/step | torch/jaxort | first step s: jaxort / torch | note |",
                  "|---|---|---|---|---|---|"]
        for row in speed:
            if "skipped" in row:
                lines.append(f"| {row['name']} | - | - | - | - | skipped: {row['skipped']} |")
                continue
            j, t = row["systems"].get("jaxort", {}), row["systems"].get("torch", {})
            note = "; ".join(f"{s}: {v.get('error') or v.get('skipped')}" for s, v in row["systems"].items()
                             if "s_per_step" not in v)
            lines.append(f"| {row['name']} {row['description']} | {_s(j.get('s_per_step'))} | "
                         f"{_s(t.get('s_per_step'))} | {_s(row.get('jaxort_over_torch'))} | "
                         f"{_s(j.get('first_step_s'))} / {_s(t.get('first_step_s'))} | {note} |")
        lines.append("")
    return "\n".join(lines)


def passed(report: dict) -> bool:
    """Every marked test passed and no speed row failed with an error."""
    tests = report.get("tests")
    if tests and (tests["failed"] or tests["errors"]):
        return False
    return not any("error" in v for row in report.get("speed") or [] for v in row.get("systems", {}).values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "build", "gpu-check"),
                   help="the report folder (default: $OUT, else build/gpu-check)")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: tests, speed")
    p.add_argument("-k", dest="select", help="a pytest -k expression narrowing the marked tests")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="W1-W4 of the benchmark suite ('' for none)")
    p.add_argument("--models", default=",".join(MODELS), help="S1-S6 of the working-size suite ('' for none)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per system")
    p.add_argument("--budget", type=float, default=180, help="seconds the speed section may start models in")
    p.add_argument("--test-timeout", type=float, default=240, help="seconds before the test run is stopped")
    p.add_argument("--smoke", action="store_true",
                   help="a few seconds: one small marked test file, W1, tiny S1, two steps (the suite's run)")
    args = p.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    start = time.perf_counter()
    # First steps are compilations: jaxort's persistent compilation cache stays out of the check.
    os.environ["JAXORT_COMPILATION_CACHE"] = "off"
    # JAX and torch share the device in the speed section: JAX must not take most of its memory
    # up front (its GPU default). Set before JAX starts, which environment() does.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.makedirs(args.out, exist_ok=True)
    report = {"environment": environment(),
              "command": "python tools/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(json.dumps(report["environment"]), file=sys.stderr, flush=True)
    if "tests" in sections:
        paths = [os.path.join(ROOT, "tests", "training", "test_golden.py")] if args.smoke else None
        report["tests"] = run_tests(args.out, args.select, paths, args.test_timeout, 1 if args.smoke else 4)
    if "speed" in sections:
        names = [n for n in args.workloads.split(",") if n]
        models = [n for n in args.models.split(",") if n]
        if args.smoke:
            names, models, args.steps = names[:1], models[:1], 2
        report["speed"] = run_speed(names, models, args.steps, args.budget, args.smoke)
    report["wall_s"] = time.perf_counter() - start
    report["passed"] = passed(report)
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(markdown(report))
    print(markdown(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
