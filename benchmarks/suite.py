"""The benchmark suite: W1-W9 on every system that imports, at default threads and pinned to one core.

W1-W7 are the quick mode's; W8 and W9 (an LSTM and a GRU of working size) join
them in ``--full`` (or ``--workloads W8,W9``).

Systems (each one skipped when its library does not import or it does not apply):

- ``core``: jaxort's functional core, ``TrainProgram.train_and_update`` on ORT's artifacts
  (jaxort's own where ORT is not importable and none are cached), on a packed state
  (``jaxort.training.pack``, as the README advises on CPU; ``core_steps`` and
  ``core_nofuse`` too);
- ``core_steps``: the core's three jitted calls (``train_step``, ``optimizer_step``,
  ``lazy_reset_grad``), W5 only: the reference of the facade overhead;
- ``core_nofuse``: ``core`` with ``fuse=False`` (``--full`` only);
- ``api_ort``: ``jaxort.api`` (Module + Optimizer + lazy_reset_grad) on ORT's artifacts;
- ``api_own``: ``jaxort.api`` on the artifacts of ``jaxort.training.artifacts.generate_artifacts``;
- ``api_steps``: ``jaxort.api``'s ``Module.train_steps`` (ORT's loop over ``STACKED`` stacked
  batches in one call) on the core's artifacts, W5 only;
- ``hand_jax``: W1-W4, W8, W9 in jax.numpy + optax.adamw under one jit, state donated
  (the recurrences as ``lax.scan``);
- ``ort``: ``onnxruntime.training.api`` (one intra-op thread when pinned);
- ``torch``: W1-W4, W8, W9 in PyTorch eager with torch.optim.AdamW (one thread when pinned;
  the recurrences as ``nn.LSTM``/``nn.GRU``).

One train step is forward + backward + AdamW update + gradient reset, the loss
brought to the host every step (ORT's and the facade's Module return numpy).
Each configuration (workload x threads) runs in its own subprocess; pinned
ones call ``os.sched_setaffinity(0, {0})`` before importing jax, onnxruntime
or torch. In a configuration every system is built and warmed up, then timed
in rounds: each round runs each system for about ``chunk`` seconds, in an
order rotated round by round (``TIMING_ORDER``: the systems a ratio compares
run next to each other). Reported: the median steps/s with min-max over
the rounds; a ratio A/B is the median of the per-round ratios. Compile time is
the first train step (and first eval step) after construction. RSS is the
resident-set growth while a system was built and warmed up, and the
subprocess' peak (VmHWM). Also: checkpoint save/load MB/s against raw file I/O
and numpy's save/load of the same arrays, and a soak of W5 under jaxort.api
(RSS every 1,000 steps).

Run: ``python benchmarks/suite.py --quick`` (``make bench-quick``), ``--full``
(``make bench``), ``--smoke`` (the test's few seconds). Writes
``benchmarks/results/<mode>.json`` and ``.md`` (``--out DIR`` elsewhere).
ORT's artifacts are made with onnxruntime-training's generate_artifacts and
cached in ``build/bench/`` (git-ignored), as are jaxort's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CACHE = os.path.join(ROOT, "build", "bench")

MODES = {
    # workloads, threads, rounds, chunk seconds, checkpoint MB, soak steps, extra systems,
    # systems left out when pinned to one core
    "smoke": dict(workloads=["W5"], threads=["default"], rounds=2, chunk=0.02, warmup=2,
                  checkpoint_mb=4, soak_steps=300, extra=[], skip_pinned=[]),
    # Under 5 minutes on 2 cores: jaxort.api on its own artifacts and the functional core
    # (most of the pinned runs' compile time) run at default threads only.
    "quick": dict(workloads=["W1", "W2", "W3", "W4", "W5", "W6", "W7"], threads=["default", "1"],
                  rounds=3, chunk=0.08, warmup=2, checkpoint_mb=64, soak_steps=3000, extra=[],
                  skip_pinned=["core", "api_own"]),
    "full": dict(workloads=["W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9"], threads=["default", "1"],
                 rounds=11, chunk=0.25, warmup=5, checkpoint_mb=256, soak_steps=20000,
                 extra=["core_nofuse"], skip_pinned=[]),
}
SYSTEMS = ("core", "core_steps", "core_nofuse", "api_ort", "api_own", "api_steps", "hand_jax", "ort", "torch")
# The order of a round (rotated round by round, which keeps neighbours
# neighbours): jaxort.api on ORT's artifacts between the two systems the
# acceptance ratios compare it with, so each paired ratio comes from chunks
# run one after the other.
TIMING_ORDER = ("core", "core_steps", "core_nofuse", "api_own", "hand_jax", "api_ort", "ort", "api_steps",
                "torch")
LR = 1e-3
STACKED = 100  # batches per call of api_steps


def _rss_mb(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":"))


def _summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# -- artifacts (in the orchestrator, once per workload) ----------------------------------------

def _model_hash(model) -> str:
    return hashlib.sha256(model.SerializeToString()).hexdigest()[:16]


def prepare(name: str) -> dict:
    """Makes (or finds cached) ORT's and jaxort's artifacts of a workload; returns their folders."""
    sys.path.insert(0, HERE)
    import workloads

    w = workloads.build(name)
    stamp = _model_hash(w.model)
    out = {}
    for kind in ("ort", "jaxort"):
        folder = os.path.join(CACHE, name, kind)
        stamp_file = os.path.join(folder, "model.sha256")
        if os.path.exists(stamp_file) and open(stamp_file).read() == stamp:
            out[kind] = folder
            continue
        os.makedirs(folder, exist_ok=True)
        try:
            if kind == "ort":
                # In a subprocess: ORT's generate_artifacts loads onnxruntime and torch.
                code = ("import sys, onnx, onnxruntime; onnxruntime.set_default_logger_severity(3);"
                        "sys.path.insert(0, sys.argv[1]); import workloads;"
                        "from onnxruntime.training import artifacts as a;"
                        "w = workloads.build(sys.argv[2]);"
                        "a.generate_artifacts(w.model, requires_grad=w.requires_grad,"
                        " frozen_params=w.frozen_params, loss=a.LossType.CrossEntropyLoss,"
                        " optimizer=a.OptimType.AdamW, artifact_directory=sys.argv[3])")
                res = subprocess.run([sys.executable, "-c", code, HERE, name, folder],
                                     capture_output=True, text=True)
                if res.returncode:
                    raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr else "failed")
            else:
                from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

                generate_artifacts(w.model, requires_grad=w.requires_grad, frozen_params=w.frozen_params,
                                   loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                                   artifact_directory=folder,
                                   # jaxort trains the forward graph; no gradient graph needed
                                   gradient_graph=False)
        except Exception as exc:  # noqa: BLE001 - a missing library or a refused model: skip
            print(f"  {name}: no {kind} artifacts ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        with open(stamp_file, "w") as f:
            f.write(stamp)
        out[kind] = folder
    return out


# -- one configuration (in a subprocess) ------------------------------------------------------

def _paths(folder):
    return [os.path.join(folder, n) for n in
            ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")]


def _make_systems(w, folders, pinned, wanted, warmup):
    """{name: (setup seconds, train fn(i) -> loss, eval fn(i) -> loss or None, close fn)}."""
    import numpy as np

    batches = w.batches
    nb = len(batches)
    made = {}

    def add(name, factory):
        if name not in wanted:
            return
        rss0 = _rss_mb()
        start = time.perf_counter()
        try:
            train, evaluate = factory()
        except ImportError as exc:
            print(f"  {w.name} {name}: skipped ({exc})", file=sys.stderr)
            return
        setup = time.perf_counter() - start
        start = time.perf_counter()
        first_loss = float(train(0))
        first_train = time.perf_counter() - start
        first_eval = None
        if evaluate is not None:
            start = time.perf_counter()
            evaluate(0, True)
            first_eval = time.perf_counter() - start
            evaluate(0, False)
        for i in range(warmup):
            train(i)
        start = time.perf_counter()
        train(0)
        made[name] = dict(train=train, eval=evaluate, setup_s=setup, first_train_s=first_train,
                          first_eval_s=first_eval, first_loss=first_loss,
                          per_step=(time.perf_counter() - start) / getattr(train, "steps_per_call", 1),
                          rss_added_mb=_rss_mb() - rss0)

    own = folders.get("jaxort")
    ort_folder = folders.get("ort")
    core_folder = ort_folder or own

    def core(fuse=True, separate=False):
        def factory():
            from jaxort import checkpoint as ckpt
            from jaxort.training import TrainProgram, pack

            train_p, eval_p, opt_p, ck = _paths(core_folder)
            data = ckpt.load(ck)
            program = TrainProgram.from_artifacts(train_p, eval_p, opt_p, checkpoint=data, fuse=fuse)
            box = {"s": pack(program.init_state(data))}  # the README's advice for the core on CPU

            def train(i):
                x, y = batches[i % nb]
                if separate:
                    s, out = program.train_step(box["s"], x, y)
                    box["s"] = program.lazy_reset_grad(program.optimizer_step(s))
                else:
                    box["s"], out = program.train_and_update(box["s"], x, y)
                return np.asarray(out[0])

            def evaluate(i, _mode=None):
                x, y = batches[i % nb]
                return np.asarray(program.eval_step(box["s"], x, y)[0])
            return train, evaluate
        return factory

    def api(folder, lib):
        def factory():
            if lib == "ort":
                import onnxruntime
                from onnxruntime.training import api as ort_api

                onnxruntime.set_default_logger_severity(3)
                options = onnxruntime.SessionOptions()
                if pinned:
                    options.intra_op_num_threads = 1
                    options.inter_op_num_threads = 1
                CheckpointState, Module, Optimizer = ort_api.CheckpointState, ort_api.Module, ort_api.Optimizer
                kw = {"session_options": options}
            else:
                from jaxort.api import CheckpointState, Module, Optimizer
                kw = {}
            train_p, eval_p, opt_p, ck = _paths(folder)
            state = CheckpointState.load_checkpoint(ck)
            try:
                module = Module(train_p, state, eval_p, "cpu", **kw)
                has_eval = True
            except Exception:  # noqa: BLE001 - ORT 1.19.2 refuses its eval model of a 3-output BatchNorm
                state = CheckpointState.load_checkpoint(ck)
                module = Module(train_p, state, None, "cpu", **kw)
                has_eval = False
            optimizer = Optimizer(opt_p, module)
            module.train()

            def train(i):
                x, y = batches[i % nb]
                loss = module(x, y)
                optimizer.step()
                module.lazy_reset_grad()
                return np.asarray(loss)

            def evaluate(i, mode=None):
                if mode is True:
                    module.eval()
                elif mode is False:
                    module.train()
                x, y = batches[i % nb]
                return np.asarray(module(x, y)) if mode is None or mode else None
            return train, (evaluate if has_eval else None)
        return factory

    def api_steps():
        from jaxort.api import CheckpointState, Module, Optimizer

        train_p, eval_p, opt_p, ck = _paths(core_folder)
        module = Module(train_p, CheckpointState.load_checkpoint(ck), eval_p, "cpu")
        Optimizer(opt_p, module)
        stacked = [np.stack([batches[j % nb][k] for j in range(STACKED)]) for k in range(2)]

        def train(i):
            return np.asarray(module.train_steps(*stacked))[0]  # the loss of the call's first step
        train.steps_per_call = STACKED
        return train, None

    def hand_jax():
        import jax
        import jax.numpy as jnp
        import optax

        import workloads

        logits = workloads.jax_logits(w)
        if logits is None:
            raise ImportError("no hand-written JAX model of this workload")
        opt = optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)

        def loss_fn(p, x, y):
            return optax.softmax_cross_entropy_with_integer_labels(logits(p, x), y).mean()

        @jax.jit
        def evaluate_j(p, x, y):
            return loss_fn(p, x, y)

        def step(p, s, x, y):
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s, loss

        step = jax.jit(step, donate_argnums=(0, 1))
        params = jax.device_put({k: jnp.asarray(v) for k, v in w.params.items()})
        box = {"p": params, "s": opt.init(params)}
        dev = [jax.device_put(b) for b in batches]

        def train(i):
            x, y = dev[i % nb]
            box["p"], box["s"], loss = step(box["p"], box["s"], x, y)
            return np.asarray(loss)

        def evaluate(i, _mode=None):
            x, y = dev[i % nb]
            return np.asarray(evaluate_j(box["p"], x, y))
        return train, evaluate

    def torch_eager():
        import torch
        import torch.nn.functional as F

        import workloads

        logits = workloads.torch_logits(w)
        if logits is None:
            raise ImportError("no PyTorch model of this workload")
        if pinned:
            torch.set_num_threads(1)
        params = {k: torch.tensor(v, requires_grad=True) for k, v in w.params.items()}
        opt = torch.optim.AdamW(params.values(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        tb = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]

        def train(i):
            x, y = tb[i % nb]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(logits(params, x), y)
            loss.backward()
            opt.step()
            return loss.item()

        def evaluate(i, _mode=None):
            x, y = tb[i % nb]
            with torch.no_grad():
                return F.cross_entropy(logits(params, x), y).item()
        return train, evaluate

    if core_folder:
        add("core", core())
        if w.name == "W5":
            add("core_steps", core(separate=True))
        add("core_nofuse", core(fuse=False))
    if ort_folder:
        add("api_ort", api(ort_folder, "jaxort"))
    if own:
        add("api_own", api(own, "jaxort"))
    if core_folder and w.name == "W5":
        add("api_steps", api_steps)
    add("hand_jax", hand_jax)
    if ort_folder:
        add("ort", api(ort_folder, "ort"))
    add("torch", torch_eager)
    return made


def _timed(fn, steps, offset):
    """Steps/s of ``steps`` steps of ``fn`` (which runs ``fn.steps_per_call`` steps a call, default 1)."""
    per_call = getattr(fn, "steps_per_call", 1)
    calls = max(1, steps // per_call)
    start = time.perf_counter()
    for i in range(calls):
        fn(offset + i)
    return calls * per_call / (time.perf_counter() - start)


def run_config(name, threads, mode, folders) -> dict:
    """Builds, warms up and times every system on one workload (in this process)."""
    cfg = MODES[mode]
    pinned = threads == "1"
    sys.path.insert(0, HERE)
    import workloads

    w = workloads.build(name)
    wanted = [s for s in SYSTEMS if (s not in ("core_nofuse",) or s in cfg["extra"])
              and not (pinned and s in cfg["skip_pinned"])]
    for lib in ("jax", "jaxort.api", "jaxort.training", "optax", "onnxruntime.training.api", "torch"):
        try:  # imported before any system is built: RSS growth is then the system's own
            __import__(lib)
        except ImportError:
            pass
    made = _make_systems(w, folders, pinned, wanted, cfg["warmup"])
    names = sorted(made, key=TIMING_ORDER.index)
    result = {"workload": name, "description": w.description, "threads": threads, "systems": {}}
    rounds = {n: {"train": [], "eval": []} for n in names}
    for phase in ("train", "eval"):
        active = [n for n in names if phase == "train" or made[n]["eval"] is not None]
        for n in active:
            if phase == "eval":
                made[n]["eval"](0, True)  # eval mode; warm
                start = time.perf_counter()
                made[n]["eval"](0)
                made[n]["per_eval"] = time.perf_counter() - start
        for r in range(cfg["rounds"]):
            order = active[r % len(active):] + active[:r % len(active)] if active else []
            for n in order:
                s = made[n]
                per = s["per_step"] if phase == "train" else s["per_eval"]
                steps = max(2, min(5000, int(cfg["chunk"] / max(per, 1e-6))))
                fn = s["train"] if phase == "train" else s["eval"]
                rounds[n][phase].append(_timed(fn, steps, r * steps))
        for n in active:
            if phase == "eval":
                made[n]["eval"](0, False)
    for n in names:
        s = made[n]
        result["systems"][n] = {
            "train_steps_per_s": _summary(rounds[n]["train"]),
            "eval_steps_per_s": _summary(rounds[n]["eval"]),
            "train_rounds": rounds[n]["train"], "eval_rounds": rounds[n]["eval"],
            "setup_s": s["setup_s"], "first_train_s": s["first_train_s"],
            "first_eval_s": s["first_eval_s"], "first_loss": s["first_loss"],
            "rss_added_mb": s["rss_added_mb"],
        }
    result["peak_rss_mb"] = _rss_mb("VmHWM")
    return result


# -- checkpoint and soak (each in a subprocess) -------------------------------------------------

def run_checkpoint(megabytes: int, repeats: int = 5) -> dict:
    """jaxort.checkpoint save/load vs raw write+fsync/read and numpy's save (+fsync)/load."""
    import numpy as np

    import jaxort.checkpoint as ckpt

    rng = np.random.default_rng(0)
    n_big = 16
    each = max(1024, megabytes * 1024**2 // n_big // 4 // 1024 * 1024)
    trainable = {f"layer{i}.weight": rng.standard_normal(each, dtype=np.float32).reshape(-1, 1024)
                 for i in range(n_big)}
    trainable.update({f"layer{i}.bias": rng.standard_normal(1024, dtype=np.float32) for i in range(n_big)})
    state = ckpt.Checkpoint(trainable=trainable, frozen={"running_mean": np.zeros(4096, np.float32)},
                            properties={"epoch": 3})
    arrays = dict(trainable, running_mean=state.frozen["running_mean"])

    def best(fns):
        """Each fn's best time, the fns run round-robin so that each faces the machine's same phases."""
        times = {name: [] for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        return {name: min(ts) for name, ts in times.items()}

    def raw_write(path, data):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            view = memoryview(data).cast("B")
            while view.nbytes:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def raw_read(path, nbytes):
        out = np.empty(nbytes, np.uint8)
        with open(path, "rb", buffering=0) as f:
            view, done = memoryview(out), 0
            while done < nbytes:
                done += f.readinto(view[done:])
        return out

    def np_save(path, fsync):
        with open(path, "wb") as f:
            np.savez(f, **arrays)
            if fsync:
                f.flush()
                os.fsync(f.fileno())

    def np_load(path):
        with np.load(path) as f:
            return {k: f[k] for k in f.files}

    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "build")) as tmp:
        path, raw, npz = (os.path.join(tmp, n) for n in ("checkpoint", "raw", "arrays.npz"))
        ckpt.save(state, path)
        size = os.path.getsize(path)
        payload = np.fromfile(path, np.uint8)
        t = best({"save": lambda: ckpt.save(state, path),
                  "raw_write_fsync": lambda: raw_write(raw, payload),
                  "numpy_savez_fsync": lambda: np_save(npz, True),
                  "numpy_savez": lambda: np_save(npz, False)})
        t.update(best({"load": lambda: ckpt.load(path),
                       "raw_read": lambda: raw_read(raw, size),
                       "numpy_load": lambda: np_load(npz)}))
    mb = size / 1e6
    return {"megabytes": mb, "tensors": len(arrays), "repeats": repeats,
            "mb_per_s": {k: mb / v for k, v in t.items()},
            "ratios": {"save_vs_numpy_savez_fsync": t["numpy_savez_fsync"] / t["save"],
                       "save_vs_numpy_savez": t["numpy_savez"] / t["save"],
                       "save_vs_raw_write_fsync": t["raw_write_fsync"] / t["save"],
                       "load_vs_raw_read": t["raw_read"] / t["load"],
                       "load_vs_numpy_load": t["numpy_load"] / t["load"]}}


def run_soak(steps: int, folders) -> dict:
    """W5 under jaxort.api for ``steps`` train steps; RSS every steps/20 steps."""
    sys.path.insert(0, HERE)
    import workloads
    from jaxort.api import CheckpointState, Module, Optimizer

    w = workloads.build("W5")
    folder = folders.get("ort") or folders["jaxort"]
    train_p, eval_p, opt_p, ck = _paths(folder)
    module = Module(train_p, CheckpointState.load_checkpoint(ck), eval_p)
    optimizer = Optimizer(opt_p, module)
    every = max(1, steps // 20)
    samples, start = [], time.perf_counter()
    for i in range(1, steps + 1):
        x, y = w.batches[i % len(w.batches)]
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        if i % every == 0:
            samples.append((i, _rss_mb(), time.perf_counter() - start))
    total = time.perf_counter() - start
    ref_step = min(2000, steps // 10)
    ref = next(rss for i, rss, _ in samples if i >= ref_step)
    return {"steps": steps, "artifacts": "ort" if folders.get("ort") else "jaxort",
            "steps_per_s": steps / total, "rss_mb": samples, "reference_step": ref_step,
            "rss_growth_after_reference": samples[-1][1] / ref - 1.0}


# -- orchestration ----------------------------------------------------------------------------

def _subprocess(args, pinned=False, timeout=900):
    cmd = [sys.executable, os.path.abspath(__file__)] + args + (["--pin"] if pinned else [])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode:
        raise RuntimeError(f"{' '.join(args)}: {res.stderr.strip()[-2000:]}")
    if res.stderr.strip():
        print("\n".join(l for l in res.stderr.splitlines() if "skipped" in l or "no " in l), file=sys.stderr)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _ratio(a_rounds, b_rounds):
    if not a_rounds or not b_rounds:
        return None
    return _summary([a / b for a, b in zip(a_rounds, b_rounds)])


RATIOS = (("api_ort", "ort"), ("core", "ort"), ("api_own", "ort"), ("hand_jax", "ort"),
          ("api_ort", "hand_jax"), ("core", "hand_jax"), ("torch", "ort"), ("core_nofuse", "core"),
          ("core_steps", "api_ort"), ("api_steps", "ort"))


def _add_ratios(config):
    sysd = config["systems"]
    config["ratios"] = {}
    for a, b in RATIOS:
        for phase in ("train", "eval"):
            if a in sysd and b in sysd:
                r = _ratio(sysd[a][f"{phase}_rounds"], sysd[b][f"{phase}_rounds"])
                if r:
                    config["ratios"][f"{a}/{b}:{phase}"] = r


def _cpu_model() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), else what ``platform`` knows of it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions():
    import importlib.metadata as md

    out = {}
    for pkg in ("jax", "jaxlib", "optax", "numpy", "onnx", "onnxruntime-training", "torch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    for m in MODES:
        g.add_argument(f"--{m}", dest="mode", action="store_const", const=m)
    p.add_argument("--workloads", help="comma-separated subset, e.g. W1,W5")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--folders", help=argparse.SUPPRESS)
    p.add_argument("--threads", default="default", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", type=int, help=argparse.SUPPRESS)
    p.add_argument("--soak", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    mode = args.mode or "quick"
    if args.pin:  # before jax, onnxruntime or torch is imported
        os.sched_setaffinity(0, {0})
    if args.worker or args.checkpoint or args.soak:
        folders = json.loads(args.folders) if args.folders else {}
        if args.worker:
            out = run_config(args.worker, args.threads, mode, folders)
        elif args.checkpoint:
            out = run_checkpoint(args.checkpoint)
        else:
            out = run_soak(args.soak, folders)
        print(json.dumps(out))
        return 0

    cfg = MODES[mode]
    names = args.workloads.split(",") if args.workloads else cfg["workloads"]
    os.makedirs(CACHE, exist_ok=True)
    wall = time.perf_counter()
    report = {"mode": mode, "machine": {"cpus": os.cpu_count(), "cpu": _cpu_model(),
                                        "python": platform.python_version(),
                                        "platform": platform.machine(), "versions": _versions()},
              "settings": {k: cfg[k] for k in ("rounds", "chunk", "warmup", "checkpoint_mb", "soak_steps", "skip_pinned")},
              "configs": []}
    folders = {}
    for name in names:
        folders[name] = prepare(name)
    report["prepare_wall_s"] = time.perf_counter() - wall
    for threads in cfg["threads"]:
        for name in names:
            print(f"== {name} threads={threads}", file=sys.stderr, flush=True)
            start = time.perf_counter()
            config = _subprocess(["--worker", name, "--threads", threads, f"--{mode}",
                                  "--folders", json.dumps(folders[name])], pinned=threads == "1")
            config["wall_s"] = time.perf_counter() - start  # the subprocess, imports and compiles included
            _add_ratios(config)
            report["configs"].append(config)
    print("== checkpoint", file=sys.stderr, flush=True)
    start = time.perf_counter()
    report["checkpoint"] = _subprocess(["--checkpoint", str(cfg["checkpoint_mb"])])
    report["checkpoint"]["wall_s"] = time.perf_counter() - start
    print("== soak", file=sys.stderr, flush=True)
    w5 = folders.get("W5") or prepare("W5")
    start = time.perf_counter()
    report["soak"] = _subprocess(["--soak", str(cfg["soak_steps"]), "--folders", json.dumps(w5)],
                                 timeout=3600)
    report["soak"]["wall_s"] = time.perf_counter() - start
    report["wall_s"] = time.perf_counter() - wall
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{mode}.json"), "w") as f:
        json.dump(report, f, indent=1)
    table = markdown(report)
    with open(os.path.join(args.out, f"{mode}.md"), "w") as f:
        f.write(table)
    print(table)
    return 0


def _fmt(s, digits=None):
    if not s:
        return "—"
    m = s["median"]
    d = digits if digits is not None else (0 if m >= 100 else 1 if m >= 10 else 2)
    return f"{m:.{d}f} ({s['min']:.{d}f}–{s['max']:.{d}f})"


LABELS = {"core": "core", "core_steps": "core 3 calls", "core_nofuse": "core fuse=False",
          "api_ort": "api on ORT art.", "api_own": "api on own art.",
          "api_steps": f"api train_steps ×{STACKED}", "hand_jax": "hand-JAX",
          "ort": "ORT Training", "torch": "PyTorch eager"}


def markdown(report) -> str:
    """The report's tables in markdown."""
    lines = [f"Mode `{report['mode']}`: {report['settings']['rounds']} interleaved rounds of "
             f"~{report['settings']['chunk']} s per system, order rotated; median (min–max) over rounds; "
             "ratios are medians of per-round ratios. "
             + (f"The pinned runs leave out {', '.join(LABELS[n] for n in report['settings']['skip_pinned'])} "
                "(to keep the mode short). "
                if report["settings"].get("skip_pinned") else "")
             + f"{report['machine']['cpus']} CPUs"
             + (f" ({report['machine']['cpu']})" if report["machine"].get("cpu") else "") + "; versions: "
             + ", ".join(f"{k} {v}" for k, v in report["machine"]["versions"].items()) + ".", ""]
    present = [s for s in SYSTEMS if any(s in c["systems"] for c in report["configs"])]
    for threads in dict.fromkeys(c["threads"] for c in report["configs"]):
        configs = [c for c in report["configs"] if c["threads"] == threads]
        title = "default threads" if threads == "default" else "pinned to one core"
        for phase in ("train", "eval"):
            lines += [f"**{phase.capitalize()} steps/s, {title}**", "",
                      "| workload | " + " | ".join(LABELS[s] for s in present) + " |",
                      "|---|" + "---|" * len(present)]
            for c in configs:
                row = [_fmt(c["systems"].get(s, {}).get(f"{phase}_steps_per_s")) for s in present]
                lines.append(f"| {c['workload']} {c['description']} | " + " | ".join(row) + " |")
            lines.append("")
        keys = [f"{a}/{b}" for a, b in RATIOS if any(f"{a}/{b}:train" in c["ratios"] for c in configs)]
        lines += [f"**Train-step ratios, {title}** (median of paired rounds, min–max)", "",
                  "| workload | " + " | ".join(k.replace("/", " ÷ ") for k in keys) + " |",
                  "|---|" + "---|" * len(keys)]
        for c in configs:
            lines.append(f"| {c['workload']} | " + " | ".join(
                _fmt(c["ratios"].get(f"{k}:train"), 2) for k in keys) + " |")
        lines.append("")
    lines += ["**Compile (first train step after construction, s) and memory, default threads**", "",
              "| workload | " + " | ".join(LABELS[s] for s in present) + " | peak RSS MB |",
              "|---|" + "---|" * (len(present) + 1)]
    for c in report["configs"]:
        if c["threads"] != report["configs"][0]["threads"]:
            continue
        cells = []
        for s in present:
            d = c["systems"].get(s)
            cells.append("—" if not d else
                         f"{d['first_train_s']:.2f} (+{d['rss_added_mb']:.0f} MB)")
        lines.append(f"| {c['workload']} | " + " | ".join(cells) + f" | {c['peak_rss_mb']:.0f} |")
    ck = report["checkpoint"]
    r = ck["ratios"]
    lines += ["", f"**Checkpoint, {ck['megabytes']:.0f} MB, {ck['tensors']} tensors, best of "
              f"{ck['repeats']} rounds** (MB/s; the writes alternate in each round, and the reads)", "",
              "| save | raw write+fsync | numpy savez+fsync | numpy savez | load | raw read | numpy load |",
              "|---|---|---|---|---|---|---|",
              "| " + " | ".join(f"{ck['mb_per_s'][k]:.0f}" for k in
                               ("save", "raw_write_fsync", "numpy_savez_fsync", "numpy_savez", "load",
                                "raw_read", "numpy_load")) + " |", "",
              f"save ÷ numpy savez+fsync {r['save_vs_numpy_savez_fsync']:.2f}x, ÷ numpy savez (no fsync) "
              f"{r['save_vs_numpy_savez']:.2f}x, ÷ raw write+fsync {r['save_vs_raw_write_fsync']:.2f}x; "
              f"load ÷ raw read {r['load_vs_raw_read']:.2f}x, ÷ numpy load {r['load_vs_numpy_load']:.2f}x."]
    sk = report["soak"]
    lines += ["", f"**Soak**: W5 under jaxort.api ({sk['artifacts']} artifacts), {sk['steps']} steps, "
              f"{sk['steps_per_s']:.0f} steps/s; RSS {sk['rss_mb'][0][1]:.0f} MB at step {sk['rss_mb'][0][0]}, "
              f"growth from step {sk['reference_step']} to the end {100 * sk['rss_growth_after_reference']:+.2f}%.",
              "", f"Suite wall time {report['wall_s']:.0f} s" + _wall_parts(report) + "."]
    return "\n".join(lines) + "\n"


def _wall_parts(report) -> str:
    # Where the wall time went (reports written before these were recorded have none).
    if "prepare_wall_s" not in report:
        return ""
    by_threads: dict = {}
    for c in report["configs"]:
        by_threads.setdefault(c["threads"], []).append(f"{c['workload']} {c.get('wall_s', 0):.0f}")
    parts = [f"artifacts {report['prepare_wall_s']:.0f} s"]
    parts += [f"{'default threads' if t == 'default' else 'pinned'}: " + ", ".join(v)
              for t, v in by_threads.items()]
    parts += [f"checkpoint {report['checkpoint'].get('wall_s', 0):.0f}", f"soak {report['soak'].get('wall_s', 0):.0f}"]
    return " (" + "; ".join(parts) + ")"


if __name__ == "__main__":
    sys.exit(main())
