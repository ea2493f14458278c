"""What rematerialisation saves: the train step's memory with each ``remat`` option, at working sizes.

For each model of the working-size suite (the exports ``benchmarks/scale.py
export`` leaves in ``build/bench-scale/<model>/``: ORT's artifacts and one
batch), and each ``remat`` option of ``TrainProgram.from_artifacts``, a
subprocess builds the program on ORT's artifacts, compiles the forward and
backward pass and reads XLA's memory analysis of it (the temporary buffers:
the activations the backward pass keeps, and scratch), then takes one train
step and records its time and the process' peak RSS (VmHWM). The loss and
the gradients' norm are printed so that a reader sees they do not change.

    python benchmarks/remat.py [--models S4,S5] [--cache build/bench-scale] [--out benchmarks/results]

Writes ``remat.json`` and ``remat.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OPTIONS = ["none", "dots", "dots_no_batch", "nothing_saveable"]
NAMES = {"S1": "ResNet-18, 3x64x64, batch 8", "S2": "ResNet-50, 3x224x224, batch 8",
         "S3": "MobileNetV3-Large, 3x224x224, batch 16", "S4": "BERT-base, seq 128, batch 8",
         "S5": "GPT-2 small, seq 128, batch 4", "S6": "ViT-B/16, 3x224x224, batch 4"}


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(folder: str, option: str) -> dict:
    """One model and remat option, in this process: memory analysis, one step's time, peak RSS."""
    import jax
    import numpy as np

    from jaxort import checkpoint as ckpt
    from jaxort.training import TrainProgram

    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    with np.load(os.path.join(folder, "batch.npz")) as f:
        feeds = [f[n] for n in config["input_names"]] + [f["labels"]]
    ort = os.path.join(folder, "ort")
    data = ckpt.load(os.path.join(ort, "checkpoint"))
    program = TrainProgram.from_artifacts(os.path.join(ort, "training_model.onnx"), None,
                                          os.path.join(ort, "optimizer_model.onnx"), checkpoint=data,
                                          remat=None if option == "none" else option)
    state = program.init_state(data)
    steps = program._steps.steps  # the pure functions: the forward and backward pass alone
    compiled = jax.jit(lambda s, *x: steps.forward_grad(s, x)[1:3]).lower(state, *feeds).compile()
    analysis = compiled.memory_analysis()
    start = time.perf_counter()
    state, outs = program.train_step(state, *feeds)
    loss = float(np.asarray(outs[0]))
    first = time.perf_counter() - start
    start = time.perf_counter()
    state, outs = program.train_step(state, *feeds)
    jax.block_until_ready(state.grads)
    step = time.perf_counter() - start
    norm = float(np.sqrt(sum(float(np.sum(np.square(np.asarray(g, np.float64)))) for g in state.grads.values())))
    return {"option": option, "temp_mb": analysis.temp_size_in_bytes / 2 ** 20,
            "argument_mb": analysis.argument_size_in_bytes / 2 ** 20, "loss": loss,
            "grad_norm_after_two_steps": norm, "first_step_s": first, "step_s": step,
            "peak_rss_mb": _peak_rss_mb()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="S4,S5")
    p.add_argument("--cache", default=str(ROOT / "build" / "bench-scale"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(*args.worker)))
        return 0
    rows = []
    for model in args.models.split(","):
        for option in OPTIONS:
            out = subprocess.run([sys.executable, __file__, "--worker", os.path.join(args.cache, model), option],
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            row = {"model": model, **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(f"{model} {option}: temp {row['temp_mb']:.0f} MB, peak RSS {row['peak_rss_mb']:.0f} MB, "
                  f"step {row['step_s']:.2f} s, loss {row['loss']:.6g}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "remat.json"), "w") as f:
        json.dump(rows, f, indent=1)
    lines = [f"`python benchmarks/remat.py --models {args.models}`; jaxort's TrainProgram on ORT's artifacts, "
             "one subprocess per row, default threads.", "",
             "temp: XLA's memory analysis of the compiled forward and backward pass (the values the backward "
             "pass keeps, and scratch); peak RSS: the subprocess' VmHWM over building, compiling and two train "
             "steps; step: the second train step.", "",
             "| model | remat | temp MB | peak RSS MB | step s | first loss | gradient norm after 2 steps |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} {NAMES.get(r['model'], '')} | {r['option']} | {r['temp_mb']:.0f} | "
                     f"{r['peak_rss_mb']:.0f} | {r['step_s']:.2f} | {r['loss']:.6g} | "
                     f"{r['grad_norm_after_two_steps']:.6g} |")
    with open(os.path.join(args.out, "remat.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
