"""Real models: jaxort.api against ONNX Runtime Training on ORT's artifacts of the real-model corpus.

Every model of ``tests/fixtures/models`` (its training, optimizer and
checkpoint files are what ORT's ``generate_artifacts`` wrote) is trained
through ``jaxort.api`` and, when it is importable, ``onnxruntime.training.api``
1.19.2: one step is ``Module.__call__`` on the model's first batch,
``Optimizer.step`` and ``lazy_reset_grad``, the loss brought to numpy. Both
systems run in one process per model and thread setting, for a fixed slice
of time each per round, in an order that alternates by round; a figure is
the median over rounds, a ratio the median of the per-round ratios. Pinned
runs set the CPU affinity to one core before importing jax or onnxruntime,
and give ORT one intra-op thread.

The first step's loss is checked against the one ORT recorded for the model
(``expected.npz``), so a broken model stops the run rather than timing it.

Run: ``python benchmarks/bench_models.py [--models bert,gru] [--rounds 7] [--slice 0.4]``
(or ``make bench``); writes ``benchmarks/results/models.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from suite import _cpu_model, _summary  # as the suite reports them; both are scripts in this folder

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "models")


def corpus() -> list[str]:
    """The corpus' model names, sorted."""
    return sorted(d for d in os.listdir(MODELS) if os.path.isfile(os.path.join(MODELS, d, "case.json")))


def _feeds(folder: str) -> list:
    import numpy as np

    with open(os.path.join(folder, "case.json")) as f:
        case = json.load(f)
    batches = np.load(os.path.join(folder, "batches.npz"))
    return [batches[f"train::{n}"][0] for n in case["input_names"]] + [batches["train::labels"][0]]


def _step_fn(lib, folder: str, pinned: bool):
    """One train step of ``lib`` (jaxort.api or onnxruntime.training.api) on ``folder``'s artifacts."""
    import numpy as np

    state = lib.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
    kwargs = {}
    if pinned and lib.__name__.startswith("onnxruntime"):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        kwargs["session_options"] = options
    module = lib.Module(os.path.join(folder, "training_model.onnx"), state, None, "cpu", **kwargs)
    optimizer = lib.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
    module.train()
    feeds = _feeds(folder)

    def step():
        loss = module(*feeds)
        optimizer.step()
        module.lazy_reset_grad()
        return float(np.asarray(loss))

    return step


def run_model(name: str, threads: str, rounds: int, time_slice: float, warmup: int = 5) -> dict:
    """Steps/s of each system on model ``name``, in this process (pin it before importing jax)."""
    import numpy as np

    import jaxort.api

    folder = os.path.join(MODELS, name)
    recorded = float(np.load(os.path.join(folder, "expected.npz"))["losses"][0])
    libs = {"api_ort": jaxort.api}
    try:
        from onnxruntime.training import api as ort_api

        libs["ort"] = ort_api
    except ImportError:
        pass
    systems, out = {}, {"model": name, "threads": threads, "systems": {}}
    for key, lib in libs.items():
        start = time.perf_counter()
        step = _step_fn(lib, folder, threads == "1")
        first = step()
        compile_s = time.perf_counter() - start
        if not np.isclose(first, recorded, rtol=1e-4, atol=1e-6):
            raise RuntimeError(f"{name}: {key}'s first loss {first} is not ORT's recorded {recorded}")
        for _ in range(warmup):
            step()
        systems[key] = step
        out["systems"][key] = {"first_loss": first, "first_step_s": compile_s, "rounds": []}
    order = list(systems)
    for r in range(rounds):
        for key in (order if r % 2 == 0 else order[::-1]):
            step, count, start = systems[key], 0, time.perf_counter()
            while time.perf_counter() - start < time_slice:
                step()
                count += 1
            out["systems"][key]["rounds"].append(count / (time.perf_counter() - start))
    for figures in out["systems"].values():
        figures["train_steps_per_s"] = _summary(figures["rounds"])
    if "ort" in out["systems"]:
        pairs = zip(out["systems"]["api_ort"]["rounds"], out["systems"]["ort"]["rounds"])
        out["api_ort/ort"] = _summary([a / o for a, o in pairs])
    return out


def markdown(report: dict) -> str:
    machine = report.get("machine")
    lines = ([f"{machine['cpus']} CPUs ({machine['cpu']}), {report['rounds']} rounds of {report['slice_s']} s "
              "per system.", ""] if machine else [])
    lines += ["| model | threads | jaxort.api steps/s | ORT steps/s | api ÷ ORT (min-max) |",
              "|---|---|---|---|---|"]
    for c in report["configs"]:
        api = c["systems"]["api_ort"]["train_steps_per_s"]["median"]
        ort = c["systems"].get("ort", {}).get("train_steps_per_s", {}).get("median")
        ratio = c.get("api_ort/ort")
        ratio_text = f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else "—"
        lines.append(f"| {c['model']} | {'one core' if c['threads'] == '1' else 'default'} | {api:.0f} | "
                     f"{'—' if ort is None else f'{ort:.0f}'} | {ratio_text} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", help="comma-separated subset of the corpus, e.g. bert,gru")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--slice", type=float, default=0.4, dest="time_slice", help="seconds per system per round")
    p.add_argument("--threads", choices=["default", "1", "both"], default="both")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        if args.threads == "1":  # before jax or onnxruntime is imported
            os.sched_setaffinity(0, {0})
        print(json.dumps(run_model(args.worker, args.threads, args.rounds, args.time_slice)))
        return 0
    names = args.models.split(",") if args.models else corpus()
    unknown = sorted(set(names) - set(corpus()))
    if unknown:
        p.error(f"not in the corpus: {', '.join(unknown)} (it has {', '.join(corpus())})")
    report = {"rounds": args.rounds, "slice_s": args.time_slice,
              "machine": {"cpus": os.cpu_count(), "cpu": _cpu_model()}, "configs": []}
    for threads in (["default", "1"] if args.threads == "both" else [args.threads]):
        for name in names:
            print(f"== {name} threads={threads}", file=sys.stderr, flush=True)
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name, "--threads", threads,
                                  "--rounds", str(args.rounds), "--slice", str(args.time_slice)],
                                 capture_output=True, text=True, timeout=900)
            if res.returncode:
                raise SystemExit(f"{name} ({threads} threads): {res.stderr.strip()[-2000:]}")
            report["configs"].append(json.loads(res.stdout.strip().splitlines()[-1]))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "models.json"), "w") as f:
        json.dump(report, f, indent=1)
    table = markdown(report)
    with open(os.path.join(args.out, "models.md"), "w") as f:
        f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
