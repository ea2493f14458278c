"""The large-model run of ``make test-large``, one phase per call, in its own process.

``python large_worker.py PHASE DIR [--dim D]`` runs one phase on the files in
DIR and prints one JSON line: what the phase measured (seconds, peak RSS in
bytes, values to compare). Each phase is a separate process so that its peak
RSS is its own. The model: four parallel ``x @ W_i`` (``W_i``: D x D float32)
summed; D = 12800 makes 2.62 GB of weights, kept in one external data file.
Its loss is MSE, so the columns of every ``W_i`` evolve independently: a
float64 numpy reference follows a slice of them through AdamW.

Phases:
  make       write ``big.onnx`` + ``big.onnx.data`` (onnx's external data writer)
  artifacts  ``jaxort.training.artifacts.generate_artifacts`` on it
  train      ``jaxort.api``: 3 AdamW steps, save the checkpoint (optimizer
             state included), reload it, export for inference
  ort_run    onnxruntime runs the inference export
  ort_checkpoint  (ONNX Runtime Training 1.19.2's environment) loads the trained
             checkpoint with its external data, and trains the artifacts one step
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

BATCH = 4
SLICE = 16  # columns of each W_i the reference follows
STEPS = 3
NAMES = ("W0", "W1", "W2", "W3")


def _status_bytes(field: str) -> int:
    """A size field of /proc/self/status (VmHWM: peak RSS, VmRSS: RSS), in bytes; 0 where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _peak_rss() -> int:
    return _status_bytes("VmHWM")


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def _rss() -> int:
    return _status_bytes("VmRSS")


def _weight(i: int, dim: int, rows: slice = slice(None)) -> np.ndarray:
    """Row block ``rows`` of W_i: N(0, 1/dim), from a generator seeded per (i, row block)."""
    start, stop = rows.indices(dim)[:2]
    out = np.empty((stop - start, dim), np.float32)
    block = 256
    for r in range(start - start % block, stop, block):
        values = np.random.default_rng([i, r]).standard_normal((min(block, dim - r), dim), np.float32)
        values *= np.float32(dim ** -0.5)
        lo, hi = max(r, start), min(r + block, stop)
        out[lo - start:hi - start] = values[lo - r:hi - r]
    return out


def _inputs(dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((BATCH, dim)).astype(np.float32)
    target = rng.standard_normal((BATCH, dim)).astype(np.float32)
    return x, target


def make(out: str, dim: int) -> dict:
    import onnx
    from onnx import helper

    t0 = time.perf_counter()
    data_name = "big.onnx.data"
    graph_inits = []
    with open(os.path.join(out, data_name), "wb") as f:
        for i, name in enumerate(NAMES):
            offset = f.tell()
            for r in range(0, dim, 1024):  # never the whole matrix in memory
                f.write(_weight(i, dim, slice(r, min(r + 1024, dim))).tobytes())
            t = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=[dim, dim])
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(dim * dim * 4))):
                t.external_data.add(key=k, value=v)
            graph_inits.append(t)
    nodes = [helper.make_node("MatMul", ["x", n], [f"y{i}"]) for i, n in enumerate(NAMES)]
    nodes.append(helper.make_node("Sum", [f"y{i}" for i in range(len(NAMES))], ["y"]))
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", 1, ["batch", dim])],
                              [helper.make_tensor_value_info("y", 1, ["batch", dim])], graph_inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, os.path.join(out, "big.onnx"))
    return {"seconds": time.perf_counter() - t0, "weights_bytes": 4 * dim * dim * len(NAMES)}


def artifacts(out: str, dim: int) -> dict:
    from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

    t0 = time.perf_counter()
    generate_artifacts(os.path.join(out, "big.onnx"), requires_grad=list(NAMES), loss=LossType.MSELoss,
                       optimizer=OptimType.AdamW, artifact_directory=os.path.join(out, "art"))
    files = {f: os.path.getsize(os.path.join(out, "art", f)) for f in sorted(os.listdir(os.path.join(out, "art")))}
    return {"seconds": time.perf_counter() - t0, "peak_rss": _peak_rss(), "files": files}


def _reference(out: str, dim: int) -> dict:
    """float64 numpy: 3 AdamW steps of columns [0, SLICE) of every W_i, hyperparameters from the file."""
    import onnx
    from onnx import helper

    node = onnx.load(os.path.join(out, "art", "optimizer_model.onnx")).graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    alpha, beta = attrs.get("alpha", 0.9), attrs.get("beta", 0.999)
    eps, wd = attrs.get("epsilon", 1e-8), attrs.get("weight_decay", 0.0)
    mode = attrs.get("adam_mode", 0)
    assert attrs.get("correct_bias", 1) == 1, attrs
    lr = 1e-3  # a fresh optimizer's learning rate, as in ONNX Runtime
    x, target = _inputs(dim)
    x, target = x.astype(np.float64), target.astype(np.float64)
    w = [_weight(i, dim)[:, :SLICE].astype(np.float64) for i in range(len(NAMES))]
    m = [np.zeros_like(a) for a in w]
    v = [np.zeros_like(a) for a in w]
    for step in range(1, STEPS + 1):
        y = sum(x @ a for a in w)
        dy = 2.0 * (y - target[:, :SLICE]) / target.size  # MSE's mean is over every element
        g = x.T @ dy
        for i in range(len(w)):
            m[i] = alpha * m[i] + (1 - alpha) * g
            v[i] = beta * v[i] + (1 - beta) * g * g
            ac, bc = 1 - alpha ** step, 1 - beta ** step
            if mode == 0:  # PyTorch's AdamW: decay first, eps on the corrected root
                w[i] = w[i] * (1 - lr * wd)
                w[i] = w[i] - lr * m[i] / (ac * (np.sqrt(v[i] / bc) + eps))
            else:  # Hugging Face's: the step with a corrected rate, eps on the raw root, then decay
                w[i] = w[i] - lr * np.sqrt(bc) / ac * m[i] / (np.sqrt(v[i]) + eps)
                w[i] = w[i] * (1 - lr * wd)
    return {"w": w, "m": m, "v": v}


def train(out: str, dim: int) -> dict:
    import jaxort.api as api
    from jaxort import checkpoint

    art = os.path.join(out, "art")
    result = {}
    t0 = time.perf_counter()
    state = api.CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
    module = api.Module(os.path.join(art, "training_model.onnx"), state, os.path.join(art, "eval_model.onnx"))
    optimizer = api.Optimizer(os.path.join(art, "optimizer_model.onnx"), module)
    result["load_seconds"] = time.perf_counter() - t0
    result["load_peak_rss"] = _peak_rss()
    x, target = _inputs(dim)
    _reset_peak()
    result["rss_before_steps"] = _rss()
    steps, losses = [], []
    for _ in range(STEPS):
        t = time.perf_counter()
        losses.append(float(module(x, target)))
        optimizer.step()
        module.lazy_reset_grad()
        steps.append(time.perf_counter() - t)
    result["step_seconds"] = steps
    result["steps_peak_rss"] = _peak_rss()
    result["losses"] = losses
    ref = _reference(out, dim)
    got = {n: state.parameters[n].data[:, :SLICE].copy() for n in NAMES}  # not views of full copies
    result["max_param_diff"] = max(float(np.abs(got[n] - ref["w"][i]).max()) for i, n in enumerate(NAMES))
    result["max_param_rel"] = max(float((np.abs(got[n] - ref["w"][i]) / np.abs(ref["w"][i]).clip(1e-6)).max())
                                  for i, n in enumerate(NAMES))
    # The first step's loss needs every column: float64, from the initial weights.
    x64 = x.astype(np.float64)
    y0 = sum(x64 @ _weight(i, dim).astype(np.float64) for i in range(len(NAMES)))
    result["first_loss_ref"] = float(np.mean((y0 - target) ** 2))
    del y0

    np.savez(os.path.join(out, "trained_slices.npz"), losses=np.asarray(losses), **got)
    for n in NAMES:  # the whole trained values, for ONNX Runtime's reading of the checkpoint
        np.save(os.path.join(out, f"trained_{n}.npy"), state.parameters[n].data)
    ckpt = os.path.join(out, "trained", "checkpoint")
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    _reset_peak()
    t = time.perf_counter()
    api.CheckpointState.save_checkpoint(state, ckpt, include_optimizer_state=True)
    result["save_seconds"] = time.perf_counter() - t
    result["save_peak_rss"] = _peak_rss()
    result["checkpoint_files"] = {f: os.path.getsize(os.path.join(out, "trained", f))
                                  for f in sorted(os.listdir(os.path.join(out, "trained")))}
    # Read back memory-mapped (the training state is still alive beside it): every value equal.
    t = time.perf_counter()
    reloaded = checkpoint.load(ckpt, mmap=True)
    result["reload_equal"] = all(
        np.array_equal(reloaded.trainable[n], np.asarray(state.parameters[n].data)) for n in NAMES)
    group = reloaded.optimizer_group()
    result["reload_moments"] = sorted(group.states[NAMES[0]])
    result["reload_step"] = int(group.step)
    result["reload_seconds"] = time.perf_counter() - t
    del reloaded, group
    t = time.perf_counter()
    module.export_model_for_inferencing(os.path.join(out, "inference.onnx"), ["y"])
    result["export_seconds"] = time.perf_counter() - t
    result["export_files"] = {f: os.path.getsize(os.path.join(out, f)) for f in sorted(os.listdir(out))
                              if f.startswith("inference")}
    # The expected inference outputs: the trained weights, from jaxort's state, in float64.
    probe = x[:1].astype(np.float64)
    expected = sum(probe @ np.asarray(state.parameters[n].data, np.float64) for n in NAMES)
    np.save(os.path.join(out, "expected_y.npy"), expected)
    return result


def ort_run(out: str, dim: int) -> dict:
    import onnxruntime as ort

    x, _ = _inputs(dim)
    t = time.perf_counter()
    session = ort.InferenceSession(os.path.join(out, "inference.onnx"), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x[:1]})
    expected = np.load(os.path.join(out, "expected_y.npy"))
    return {"seconds": time.perf_counter() - t, "max_diff": float(np.abs(y - expected).max()),
            "scale": float(np.abs(expected).max())}


def ort_checkpoint(out: str, dim: int) -> dict:
    from onnxruntime.training import api as ort_api

    result = {}
    slices = np.load(os.path.join(out, "trained_slices.npz"))
    t = time.perf_counter()
    state = ort_api.CheckpointState.load_checkpoint(os.path.join(out, "trained", "checkpoint"))
    result["load_seconds"] = time.perf_counter() - t
    # Every value of every parameter, one parameter at a time.
    result["params_equal"] = all(
        np.array_equal(state.parameters[n].data, np.load(os.path.join(out, f"trained_{n}.npy"), mmap_mode="r"))
        for n in NAMES)
    del state
    # ONNX Runtime trains jaxort's artifacts from their first checkpoint: its first loss.
    art = os.path.join(out, "art")
    state = ort_api.CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
    module = ort_api.Module(os.path.join(art, "training_model.onnx"), state, os.path.join(art, "eval_model.onnx"))
    optimizer = ort_api.Optimizer(os.path.join(art, "optimizer_model.onnx"), module)
    x, target = _inputs(dim)
    t = time.perf_counter()
    result["first_loss"] = float(module(x, target))
    optimizer.step()
    result["step_seconds"] = time.perf_counter() - t
    result["jaxort_first_loss"] = float(slices["losses"][0])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["make", "artifacts", "train", "ort_run", "ort_checkpoint"])
    parser.add_argument("dir")
    parser.add_argument("--dim", type=int, default=12800)
    args = parser.parse_args()
    result = globals()[args.phase](args.dir, args.dim)
    result.setdefault("peak_rss", _peak_rss())
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
