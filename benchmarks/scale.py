"""Working-size models S1-S6: jaxort against ONNX Runtime Training and PyTorch, one train step at a time.

Models, exported from PyTorch at full size with random initialisation (fixed
seed, nothing downloaded):

- S1 ResNet-18 (torchvision, 1000 classes), 3x64x64, batch 8;
- S2 ResNet-50 (torchvision, 1000 classes), 3x224x224, batch 8;
- S3 MobileNetV3-Large (torchvision, 1000 classes), 3x224x224, batch 16, its
  Hardswish and Hardsigmoid written with Relu (ORT 1.19.2 has no gradient for them);
- S4 BERT-base (transformers ``BertForSequenceClassification``, ``BertConfig()``,
  2 labels), input_ids only, seq 128, batch 8;
- S5 GPT-2 small (transformers ``GPT2LMHeadModel``, ``GPT2Config()``), the
  next-token logits of the last position, seq 128, batch 4;
- S6 ViT-B/16 (transformers ``ViTForImageClassification``, ``ViTConfig()``, 2 labels),
  3x224x224, batch 4.

Dropout is off in every model (the transformers' configs and MobileNet's
classifier): each system draws its own dropout masks, so the first-step losses
could not be compared otherwise. The loss is ORT's CrossEntropyLoss on int64
labels, the optimizer ORT's AdamW (``generate_artifacts`` defaults).

Stages:

1. ``export`` (the oracle environment: torch, torchvision, transformers,
   onnxruntime-training): for each model, in its own subprocess, the legacy
   exporter in training mode (opset 17, no constant folding, as
   tools/make_model_corpus.py does and with its workarounds), then ORT's
   ``generate_artifacts`` (requires_grad: the float initializers but
   BatchNorm running statistics; frozen: the other float initializers). Files
   go to ``build/bench-scale/<model>/`` (``--cache``): ``model.onnx``,
   ``batch.npz`` (the inputs by name and ``labels``), ``ort/`` (ORT's
   artifacts) and ``config.json``, whose key (a hash of the model's config)
   lets a rerun skip the model.
2. ``run`` (the default; exports what is missing first): each model x thread
   setting in its own subprocess ("pinned" calls ``os.sched_setaffinity(0, {0})``
   before importing jax, onnxruntime or torch, and gives ORT and torch one
   thread). Systems, on ORT's artifacts where they take artifacts:

   - ``ort``: ``onnxruntime.training.api`` Module + Optimizer;
   - ``api``: ``jaxort.api``, the same calls;
   - ``core``: ``TrainProgram.train_and_update`` on a packed state
     (``jaxort.training.pack``);
   - ``torch``: the same PyTorch module in eager mode, ``torch.optim.AdamW``
     and ``F.cross_entropy``.

   One step is forward, backward, AdamW, gradient reset, the loss brought to
   the host. Every system is built (timed: "build"), takes its first step
   (timed: "first step", its loss recorded) and one warm-up step, then all
   are timed in interleaved rounds of one step each, in an order rotated
   round by round. Figures are s/step, median (min-max) over rounds; a ratio
   A/ORT is the median of the per-round ratios of A's steps/s to ORT's
   (above 1: A is faster). RSS: each system's growth over build and first
   step, and the subprocess' peak (VmHWM). jaxort's persistent compilation
   cache is off there; two more subprocesses time jaxort.api's first step
   with the cache in a fresh directory ("cold") and again on it ("warm").

Run (the oracle environment; ``make bench-scale`` runs both stages, 30-45
minutes on 2 cores)::

    python benchmarks/scale.py export [--models S1,S4]
    python benchmarks/scale.py run [--models S1,S4] [--threads default,pinned] [--rounds 6]
    python benchmarks/scale.py --smoke   # tiny S1 and S4, 2 rounds (the test's)

Writes ``benchmarks/results/scale.json`` and ``scale.md`` (``--out DIR``
elsewhere; ``--smoke`` writes to a temporary directory unless given one, and
caches in ``build/bench-scale-smoke``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOLS = os.path.join(ROOT, "tools")

sys.path.insert(0, HERE)
from suite import _cpu_model, _rss_mb, _summary, _versions  # noqa: E402 - a script beside this one

# Bump when a change to the export makes the cached files stale.
EXPORT_FORMAT = 1
SEED = 0
SYSTEMS = ("ort", "api", "core", "torch")
RATIOS = ("api", "core", "torch")  # each over ort
THREADS = ("default", "pinned")
NO_DROPOUT_BERT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
NO_DROPOUT_GPT2 = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}

# What the cache key hashes: everything that decides the exported model and batch.
MODELS = {
    "S1": dict(arch="resnet18", image=64, batch=8, classes=1000),
    "S2": dict(arch="resnet50", image=224, batch=8, classes=1000),
    "S3": dict(arch="mobilenet_v3_large", image=224, batch=16, classes=1000, width_mult=1.0),
    "S4": dict(arch="bert", seq=128, batch=8, config=dict(num_labels=2, **NO_DROPOUT_BERT)),
    "S5": dict(arch="gpt2", seq=128, batch=4, config=dict(NO_DROPOUT_GPT2)),
    "S6": dict(arch="vit", image=224, batch=4, config={}),
}
# Tiny versions for --smoke (S1 and S4 unless --models says otherwise; the
# others check that every model's code path exports and trains).
SMOKE_MODELS = {
    "S1": dict(arch="resnet18", image=32, batch=2, classes=10),
    # At 32x32 and batch 2, ResNet-50's BatchNorms over 2-8 values make the
    # float32 loss differ from the float64 one by 8%: no loss to compare.
    "S2": dict(arch="resnet50", image=64, batch=4, classes=10),
    "S3": dict(arch="mobilenet_v3_large", image=32, batch=2, classes=10, width_mult=0.25),
    "S4": dict(arch="bert", seq=16, batch=2,
               config=dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, max_position_embeddings=64, num_labels=2, **NO_DROPOUT_BERT)),
    "S5": dict(arch="gpt2", seq=16, batch=2,
               config=dict(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=2, **NO_DROPOUT_GPT2)),
    "S6": dict(arch="vit", image=32, batch=2,
               config=dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=128)),
}
SMOKE_DEFAULT = ("S1", "S4")
CACHE = os.path.join(ROOT, "build", "bench-scale")
SMOKE_CACHE = os.path.join(ROOT, "build", "bench-scale-smoke")
ARCH_NAMES = {"resnet18": "ResNet-18", "resnet50": "ResNet-50", "mobilenet_v3_large": "MobileNetV3-Large",
              "bert": "BERT", "gpt2": "GPT-2", "vit": "ViT"}


def _specs(smoke: bool) -> dict:
    return SMOKE_MODELS if smoke else MODELS


def _describe(spec: dict) -> str:
    """A short line naming the model, its size and its batch."""
    cfg = spec.get("config", {})
    if "image" in spec:
        size = f"3x{spec['image']}x{spec['image']}"
    else:
        size = f"seq {spec['seq']}"
    extra = ""
    if spec.get("width_mult", 1.0) != 1.0:
        extra = f" width {spec['width_mult']}"
    if "hidden_size" in cfg or "n_embd" in cfg:
        layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
        extra = f" {layers} layers, hidden {cfg.get('hidden_size', cfg.get('n_embd'))}"
    return f"{ARCH_NAMES[spec['arch']]}{extra}, {size}, batch {spec['batch']}"


def _key(name: str, spec: dict) -> str:
    text = json.dumps({"format": EXPORT_FORMAT, "seed": SEED, "name": name, **spec}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _corpus():
    """tools/make_model_corpus.py, whose export helpers this script shares."""
    if TOOLS not in sys.path:
        sys.path.insert(0, TOOLS)
    import make_model_corpus

    return make_model_corpus


# -- models (torch, torchvision, transformers) ---------------------------------------------------

def build_torch(spec: dict):
    """The torch module of ``spec`` (training mode, seeded), returning logits from its inputs.

    Builds the same weights every call, so the torch system of ``run`` trains
    the module ``export`` exported.

    Args:
      spec: an entry of ``MODELS`` or ``SMOKE_MODELS``.

    Returns:
      The module.
    """
    import torch

    corpus = _corpus()
    corpus._import_torchvision()  # before transformers, which imports torchvision
    torch.manual_seed(SEED)
    arch, cfg = spec["arch"], spec.get("config", {})
    if arch in ("resnet18", "resnet50"):
        import torchvision.models

        model = getattr(torchvision.models, arch)(weights=None, num_classes=spec["classes"])
    elif arch == "mobilenet_v3_large":
        from torchvision.models import mobilenet_v3_large

        model = corpus._relu_hard_activations(mobilenet_v3_large(
            weights=None, width_mult=spec["width_mult"], num_classes=spec["classes"], dropout=0.0))
    elif arch == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        wrap = corpus._classifier(lambda m, i: m(input_ids=i, return_dict=False)[0])
        model = wrap(BertForSequenceClassification(BertConfig(attn_implementation="eager", **cfg)))
    elif arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        # The LM head on the last position only: the logits of all 128 would
        # add a fifth to the step for the same loss.
        wrap = corpus._classifier(lambda m, i: m.lm_head(m.transformer(input_ids=i, return_dict=False)[0][:, -1]))
        model = wrap(GPT2LMHeadModel(GPT2Config(attn_implementation="eager", **cfg)))
    elif arch == "vit":
        from transformers import ViTConfig, ViTForImageClassification

        wrap = corpus._classifier(lambda m, x: m(pixel_values=x, return_dict=False)[0])
        model = wrap(ViTForImageClassification(ViTConfig(attn_implementation="eager", **cfg)))
    else:
        raise KeyError(arch)
    return model.train()


def torch_step(model, inputs, labels, device: str = "cpu"):
    """One train step of torch ``model`` on numpy ``inputs`` and int64 ``labels``, as a function.

    The step is cross-entropy, backward and ORT's AdamW of generate_artifacts
    (lr 1e-3, betas (0.9, 0.999), eps 1e-6, no weight decay); it returns the
    loss as a float (which waits for the device).
    """
    import torch
    import torch.nn.functional as F

    model = model.to(device)
    xs = [torch.from_numpy(x).to(device) for x in inputs]
    y = torch.from_numpy(labels).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(*xs), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def _batch(spec: dict):
    """(input names, input arrays, int64 labels) of ``spec``, from a fixed seed."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    b, cfg = spec["batch"], spec.get("config", {})
    if "image" in spec:
        x = rng.standard_normal((b, 3, spec["image"], spec["image"]), dtype=np.float32)
        names = ["input" if spec["arch"] != "vit" else "pixel_values"]
        classes = spec["classes"] if "classes" in spec else cfg.get("num_labels", 2)
    else:
        vocab = cfg.get("vocab_size", 30522 if spec["arch"] == "bert" else 50257)
        x = rng.integers(0, vocab, (b, spec["seq"]), dtype=np.int64)
        names = ["input_ids"]
        classes = cfg.get("num_labels", 2) if spec["arch"] == "bert" else vocab
    return names, [x], rng.integers(0, classes, b, dtype=np.int64)


# -- export (one model per subprocess) ---------------------------------------------------------

def _cached(folder: str, key: str) -> bool:
    try:
        with open(os.path.join(folder, "config.json")) as f:
            if json.load(f)["key"] != key:
                return False
    except (OSError, ValueError, KeyError):
        return False
    return all(os.path.exists(os.path.join(folder, *p)) for p in
               [("model.onnx",), ("batch.npz",), ("ort", "training_model.onnx"), ("ort", "optimizer_model.onnx"),
                ("ort", "checkpoint")])


def export_model(name: str, spec: dict, folder: str, artifacts: str = "ort") -> dict:
    """Exports ``spec``'s model and batch to ``folder`` and makes training artifacts beside them.

    Args:
      name: the model's name (S1-S6).
      spec: its entry of ``MODELS`` or ``SMOKE_MODELS``.
      folder: where the files go (created; config.json is written last).
      artifacts: "ort" for ONNX Runtime Training's generate_artifacts (in
        ``folder/ort``), "jaxort" for jaxort's own, without a gradient graph
        (in ``folder/jaxort``; where onnxruntime-training is not installed).

    Returns:
      The contents of config.json.
    """
    import copy
    import io

    import numpy as np
    import onnx
    import torch

    if artifacts not in ("ort", "jaxort"):
        raise ValueError(f"artifacts must be 'ort' or 'jaxort', not {artifacts!r}")
    start = time.perf_counter()
    corpus = _corpus()
    model = build_torch(spec)
    names, inputs, labels = _batch(spec)
    os.makedirs(folder, exist_ok=True)
    for stale in ("config.json", "model.onnx", "batch.npz"):
        if os.path.exists(os.path.join(folder, stale)):
            os.remove(os.path.join(folder, stale))
    shutil.rmtree(os.path.join(folder, artifacts), ignore_errors=True)
    buffer = io.BytesIO()
    # Tracing in training mode moves BatchNorm statistics: trace a copy.
    torch.onnx.export(copy.deepcopy(model), tuple(torch.from_numpy(x) for x in inputs), buffer, dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, opset_version=17,
                      input_names=names, output_names=["logits"])
    proto = onnx.load_from_string(buffer.getvalue())
    del buffer
    layernorms = corpus._add_layernorm_stats(proto)  # ORT 1.19.2's LayerNormalization gradient needs them
    onnx.checker.check_model(proto)
    running_stats = {i for node in proto.graph.node if node.op_type == "BatchNormalization"
                     for i in node.input[3:5]}
    floats = [t.name for t in proto.graph.initializer
              if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)]
    requires_grad = [n for n in floats if n not in running_stats]
    frozen = [n for n in floats if n in running_stats]
    onnx.save(proto, os.path.join(folder, "model.onnx"))
    np.savez(os.path.join(folder, "batch.npz"), labels=labels, **dict(zip(names, inputs)))
    out_dir = os.path.join(folder, artifacts)
    os.makedirs(out_dir)  # ORT's generate_artifacts does not create it
    if artifacts == "ort":
        import onnxruntime
        from onnxruntime.training import artifacts as lib

        onnxruntime.set_default_logger_severity(3)
        kw = {}
    else:
        from jaxort.training import artifacts as lib

        kw = {"gradient_graph": False}  # jaxort trains the forward graph
    lib.generate_artifacts(proto, requires_grad=requires_grad, frozen_params=frozen,
                           loss=lib.LossType.CrossEntropyLoss, optimizer=lib.OptimType.AdamW,
                           artifact_directory=out_dir, **kw)
    parameters = {n for n, _ in model.named_parameters()}
    config = {
        "key": _key(name, spec), "name": name, "spec": spec, "description": _describe(spec),
        "input_names": names, "nodes": len(proto.graph.node),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "requires_grad": len(requires_grad), "frozen_params": len(frozen),
        # Float initializers that are no torch parameter (ORT trains them; torch does not).
        "requires_grad_not_torch_parameters": sorted(n for n in requires_grad if n not in parameters),
        "layernorm_stats_added": layernorms, "export_s": time.perf_counter() - start,
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return config


def export(names, smoke: bool, cache: str) -> dict:
    """Exports each model of ``names`` that ``cache`` lacks, each in a subprocess; returns their configs."""
    specs = _specs(smoke)
    out = {}
    for name in names:
        folder = os.path.join(cache, name)
        if not _cached(folder, _key(name, specs[name])):
            print(f"== export {name}: {_describe(specs[name])}", file=sys.stderr, flush=True)
            _subprocess(["--export-worker", name, "--cache", cache] + (["--smoke"] if smoke else []))
        with open(os.path.join(folder, "config.json")) as f:
            out[name] = json.load(f)
    return out


# -- one model x thread setting (in a subprocess) --------------------------------------------

def _ort_options(pinned: bool):
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    options = onnxruntime.SessionOptions()
    if pinned:
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
    return options


def _factories(folder: str, spec: dict, feeds: list, pinned: bool) -> dict:
    """{system: factory() -> step() -> loss}; a factory builds the system, a step is one train step."""
    import numpy as np

    ort_dir = os.path.join(folder, "ort")
    train_p, opt_p, ck = (os.path.join(ort_dir, n) for n in
                          ("training_model.onnx", "optimizer_model.onnx", "checkpoint"))

    def facade(lib_name):
        def factory():
            if lib_name == "ort":
                from onnxruntime.training import api as lib

                kw = {"session_options": _ort_options(pinned)}
            else:
                import jaxort.api as lib

                kw = {}
            # No eval model: ORT 1.19.2's Module refuses the one it writes for a
            # training-mode BatchNormalization (S1-S3), and no step here evaluates.
            module = lib.Module(train_p, lib.CheckpointState.load_checkpoint(ck), None, "cpu", **kw)
            optimizer = lib.Optimizer(opt_p, module)
            module.train()

            def step():
                loss = module(*feeds)
                optimizer.step()
                module.lazy_reset_grad()
                return float(np.asarray(loss))
            return step
        return factory

    def core():
        from jaxort import checkpoint as ckpt
        from jaxort.training import TrainProgram, pack

        data = ckpt.load(ck)
        program = TrainProgram.from_artifacts(train_p, None, opt_p, checkpoint=data)
        box = {"state": pack(program.init_state(data))}  # the README's advice for the core on CPU

        def step():
            box["state"], out = program.train_and_update(box["state"], *feeds)
            return float(np.asarray(out[0]))
        return step

    def torch_eager():
        import torch

        if pinned:
            torch.set_num_threads(1)
        return torch_step(build_torch(spec), feeds[:-1], feeds[-1])

    return {"ort": facade("ort"), "api": facade("jaxort"), "core": core, "torch": torch_eager}


def run_config(name: str, cache: str, threads: str, systems, rounds: int, first_only: bool) -> dict:
    """Builds and times ``systems`` on model ``name`` in this process (pinned before any import).

    Args:
      name: the model (its files in ``cache/name``).
      cache: the cache directory.
      threads: "default" or "pinned".
      systems: the systems to run, a subset of ``SYSTEMS``.
      rounds: the timed rounds.
      first_only: build and take the first step only.

    Returns:
      The configuration's figures: per system build_s, first_step_s,
      first_loss, rss_growth_mb, and (unless first_only) the per-round
      s/step; the subprocess' peak RSS.
    """
    import importlib

    import numpy as np

    folder = os.path.join(cache, name)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    with np.load(os.path.join(folder, "batch.npz")) as f:
        feeds = [f[n] for n in config["input_names"]] + [f["labels"]]
    pinned = threads == "pinned"
    available = []
    # Imported before any system is built: a system's RSS growth is then its own.
    needs = {"ort": ["onnxruntime.training.api"], "api": ["jaxort.api"], "core": ["jaxort.training"],
             "torch": ["torch"]}
    for s in systems:
        try:
            for lib in needs[s]:
                importlib.import_module(lib)
        except ImportError as exc:
            print(f"  {name} {s}: skipped ({exc})", file=sys.stderr)
            continue
        available.append(s)
    if "torch" in available:
        _corpus()._import_torchvision()
        if config["spec"]["arch"] in ("bert", "gpt2", "vit"):
            import transformers  # noqa: F401
    factories = _factories(folder, config["spec"], feeds, pinned)
    made, result = {}, {"model": name, "description": config["description"], "threads": threads, "systems": {}}
    for s in available:
        rss0 = _rss_mb()
        start = time.perf_counter()
        step = factories[s]()
        built = time.perf_counter()
        loss = step()
        first = time.perf_counter()
        made[s] = step
        result["systems"][s] = {"build_s": built - start, "first_step_s": first - built, "first_loss": loss,
                                "rss_growth_mb": _rss_mb() - rss0}
    if not first_only:
        for s in made:
            made[s]()  # a warm-up step: anything a second call still sets up stays out of the rounds
        names = list(made)
        times = {s: [] for s in names}
        for r in range(rounds):
            k = r % len(names)
            for s in names[k:] + names[:k]:
                start = time.perf_counter()
                made[s]()
                times[s].append(time.perf_counter() - start)
        for s in names:
            result["systems"][s]["rounds_s"] = times[s]
            result["systems"][s]["s_per_step"] = _summary(times[s])
            result["systems"][s]["steps_per_s"] = _summary([1 / t for t in times[s]])
    result["peak_rss_mb"] = _rss_mb("VmHWM")
    return result


def _ratios(config: dict) -> dict:
    """A/ORT for each system A: the median (min-max) of the per-round ratios of A's steps/s to ORT's."""
    sysd = config["systems"]
    out = {}
    for a in RATIOS:
        if a in sysd and "ort" in sysd and sysd[a].get("rounds_s"):
            out[f"{a}/ort"] = _summary([o / t for t, o in zip(sysd[a]["rounds_s"], sysd["ort"]["rounds_s"])])
    return out


# -- orchestration --------------------------------------------------------------------------

def _subprocess(args, threads: str = "default", env=None, timeout: float = 3600):
    cmd = [sys.executable, os.path.abspath(__file__)] + args + (["--pin"] if threads == "pinned" else [])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode:
        raise RuntimeError(f"{' '.join(args)}: {res.stderr.strip()[-3000:]}")
    for line in res.stderr.splitlines():
        if "skipped" in line:
            print(line, file=sys.stderr)
    return json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else None


def _env(cache_dir):
    """The environment of a run: jaxort's compilation cache in ``cache_dir``, or off when None."""
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # JAX's own setting would win over jaxort's
    env["JAXORT_COMPILATION_CACHE"] = cache_dir or "off"
    return env


def run_model(name: str, cache: str, threads: str, systems, rounds: int, timeout: float,
              first_steps: bool = False) -> dict:
    """One model at one thread setting: the timed subprocess, then jaxort.api cold and warm.

    With ``first_steps`` the first subprocess builds each system and takes its
    first step only (no timed rounds).
    """
    args = ["--worker", name, "--cache", cache, "--threads", threads, "--systems", ",".join(systems),
            "--rounds", str(rounds)]
    start = time.perf_counter()
    config = _subprocess(args + (["--first-only"] if first_steps else []), threads, _env(None), timeout)
    config["wall_s"] = time.perf_counter() - start
    config["ratios"] = _ratios(config)
    if "api" in systems:
        first = args[:6] + ["--systems", "api", "--first-only"]
        with tempfile.TemporaryDirectory(prefix="jaxort-xla-") as xla:
            # A fresh directory, then the same one: compiled, then loaded from the cache.
            config["api_compilation_cache"] = {
                when: _subprocess(first, threads, _env(xla), timeout)["systems"].get("api")
                for when in ("cold", "warm")}
    return config


def _command(argv) -> str:
    """The command line, paths inside the repository relative to it."""
    words = []
    for a in argv:
        if os.path.isabs(a) and os.path.abspath(a).startswith(ROOT + os.sep):
            a = os.path.relpath(a, ROOT)
        words.append(a)
    return " ".join(["python", "benchmarks/scale.py"] + words)


def _fmt(summary) -> str:
    """A summary as median (min–max), three significant digits."""
    if not summary:
        return "—"
    m, lo, hi = (summary[k] for k in ("median", "min", "max"))
    return f"{m:.3g} ({lo:.3g}–{hi:.3g})"


def _s(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def markdown(report: dict) -> str:
    """The report as markdown: the command and machine, then a table per thread setting."""
    m = report["machine"]
    lines = [f"`{report['command']}`", "",
             f"{m['cpus']} CPUs ({m['cpu']}); " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
             "",
             (f"{report['rounds']} interleaved rounds of one train step per system (order rotated); s/step is "
              "the median (min–max) over rounds; A/ORT is the median of per-round ratios of A's steps/s to "
              "ORT's (above 1: A is faster)." if report["rounds"] else "First steps only, no timed rounds.")
             + " First step: after the system is built (jaxort.api cold: a "
             "fresh persistent compilation cache, warm: the same cache in a new process). RSS: growth over "
             "each system's build and first step, and the subprocess' peak.", ""]
    for threads in dict.fromkeys(c["threads"] for c in report["configs"]):
        configs = [c for c in report["configs"] if c["threads"] == threads]
        title = "default threads" if threads == "default" else "pinned to one core (ORT and torch one thread)"
        lines += [f"**{title}**", "",
                  "| model | ORT s/step | api s/step | core s/step | torch s/step | api/ORT | core/ORT | "
                  "torch/ORT | first step s: ORT / api cold / api warm | build s: ORT / api / core / torch | "
                  "RSS growth MB: ORT / api / core / torch | peak RSS MB |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in configs:
            sysd = c["systems"]

            def field(s, key):
                return sysd[s].get(key) if s in sysd else None
            cache = c.get("api_compilation_cache") or {}
            firsts = [field("ort", "first_step_s")] + [(cache.get(w) or {}).get("first_step_s")
                                                      for w in ("cold", "warm")]
            lines.append(
                f"| {c['model']} {c['description']} | "
                + " | ".join(_fmt(field(s, "s_per_step")) for s in SYSTEMS) + " | "
                + " | ".join(_fmt(c["ratios"].get(f"{a}/ort")) for a in RATIOS) + " | "
                + " / ".join(_s(x) for x in firsts) + " | "
                + " / ".join(_s(field(s, "build_s")) for s in SYSTEMS) + " | "
                + " / ".join("—" if field(s, "rss_growth_mb") is None else f"{field(s, 'rss_growth_mb'):.0f}"
                             for s in SYSTEMS)
                + f" | {c['peak_rss_mb']:.0f} |")
        lines += ["", f"First-step losses, {title}: "
                  + "; ".join(f"{c['model']} " + " / ".join(
                      f"{s} {c['systems'][s]['first_loss']:.6g}" for s in SYSTEMS if s in c["systems"])
                              for c in configs) + ".", ""]
    lines.append(f"Wall time {report['wall_s']:.0f} s (export {report['export_wall_s']:.0f} s).")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", nargs="?", choices=["export", "run"], default="run")
    p.add_argument("--models", help="comma-separated subset of S1-S6 (--smoke: S1,S4 by default)")
    p.add_argument("--threads", help="comma-separated: default, pinned (default both; --smoke: default)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of ort, api, core, torch")
    p.add_argument("--rounds", type=int, help="timed rounds (default 6; --smoke: 2)")
    p.add_argument("--smoke", action="store_true", help="tiny models, 2 rounds, default threads only")
    p.add_argument("--cache", help="where exports go (default build/bench-scale, --smoke: build/bench-scale-smoke)")
    p.add_argument("--out", help="where scale.json and scale.md go (default benchmarks/results; --smoke: a temp dir)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per subprocess")
    p.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--export-worker", help=argparse.SUPPRESS)
    p.add_argument("--first-steps", action="store_true",
                   help="first steps only: each system's build and first step, jaxort.api's with a cold and a "
                        "warm compilation cache; no timed rounds")
    p.add_argument("--first-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.pin:  # before jax, onnxruntime or torch is imported
        os.sched_setaffinity(0, {0})
    specs = _specs(args.smoke)
    cache = os.path.abspath(args.cache or (SMOKE_CACHE if args.smoke else CACHE))
    rounds = args.rounds or (2 if args.smoke else 6)
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    if args.export_worker:
        name = args.export_worker
        print(json.dumps(export_model(name, specs[name], os.path.join(cache, name))))
        return 0
    if args.worker:
        print(json.dumps(run_config(args.worker, cache, "pinned" if args.pin else "default", systems,
                                    rounds, args.first_only)))
        return 0

    names = args.models.split(",") if args.models else list(SMOKE_DEFAULT if args.smoke else specs)
    unknown = [n for n in names if n not in specs]
    threads = args.threads.split(",") if args.threads else ["default"] if args.smoke else list(THREADS)
    if unknown or not set(threads) <= set(THREADS) or not systems:
        p.error(f"models are {', '.join(specs)}, threads {', '.join(THREADS)}, systems {', '.join(SYSTEMS)}")
    wall = time.perf_counter()
    exported = export(names, args.smoke, cache)
    export_wall = time.perf_counter() - wall
    if args.stage == "export":
        return 0
    report = {"command": _command(argv), "smoke": args.smoke, "rounds": 0 if args.first_steps else rounds,
              "machine": {"cpus": os.cpu_count(), "cpu": _cpu_model(),
                          "versions": _versions() | _versions_extra()},
              "models": exported, "configs": []}
    for t in threads:
        for name in names:
            print(f"== {name} threads={t}", file=sys.stderr, flush=True)
            report["configs"].append(run_model(name, cache, t, systems, rounds, args.timeout, args.first_steps))
    report["export_wall_s"] = export_wall
    report["wall_s"] = time.perf_counter() - wall
    out = args.out or (tempfile.mkdtemp(prefix="bench-scale-smoke-") if args.smoke else os.path.join(HERE, "results"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "scale.json"), "w") as f:
        json.dump(report, f, indent=1)
    table = markdown(report)
    with open(os.path.join(out, "scale.md"), "w") as f:
        f.write(table)
    print(table)
    print(f"wrote {os.path.join(out, 'scale.md')} and scale.json", file=sys.stderr)
    return 0


def _versions_extra() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("torchvision", "transformers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


if __name__ == "__main__":
    sys.exit(main())
