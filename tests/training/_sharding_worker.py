"""Run by test_sharding.py in a subprocess with 8 fake CPU devices (XLA_FLAGS set before JAX loads).

Trains the golden MLP and CNN for 5 steps on 1 device and on 8 (data
parallel, fsdp, a 2x4 data x fsdp mesh, and through jaxort.api.Module with a
mesh) and prints one JSON object of the results for the test to check.
"""

import json
import os
import pathlib
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxort import api, checkpoint  # noqa: E402
from jaxort.errors import InputError  # noqa: E402
from jaxort.training import TrainProgram, make_mesh, set_learning_rate, shard  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "golden"


def batches(case):
    data = np.load(GOLDEN / case / "batches.npz")
    names = [k[len("train::"):] for k in data.files if k.startswith("train::")]
    arrays = [data["train::" + n] for n in names]
    if case == "cnn_bce":  # batches of 4: two golden batches make one of 8
        arrays = [np.concatenate([a[:-1], a[1:]], axis=1) for a in arrays]
    return names, arrays


def program(case):
    folder = GOLDEN / case
    start = checkpoint.load(folder / "checkpoint")
    prog = TrainProgram.from_artifacts(folder / "training_model.onnx", folder / "eval_model.onnx",
                                       folder / "optimizer_model.onnx", checkpoint=start)
    return prog, start


def train(prog, start, arrays, mesh=None, strategy="data"):
    state = set_learning_rate(prog.init_state(start), 0.01)
    if mesh is not None:
        state = shard(state, mesh, strategy)
    losses = []
    for i in range(5):
        state, (loss,) = prog.train_step(state, *(a[i] for a in arrays))
        state = prog.lazy_reset_grad(prog.optimizer_step(state))
        losses.append(float(loss))
    return state, losses


def per_device_fraction(state):
    total = sum(int(np.prod(v.shape)) * v.dtype.itemsize for v in state.params.values())
    device0 = jax.devices()[0]
    local = sum(s.data.nbytes for v in state.params.values() for s in v.addressable_shards
                if s.device == device0)
    return local / total


def excess(a, b, rtol=1e-5, atol=1e-7):
    """max(|a - b| - (atol + rtol |b|)): <= 0 when numpy.testing.assert_allclose(a, b, rtol, atol) passes."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) - (atol + rtol * np.abs(b))))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))


def main():
    assert jax.device_count() == 8, jax.devices()
    out = {}
    meshes = {"data": (make_mesh((8,), ("data",)), "data"),
              "fsdp": (make_mesh((8,), ("fsdp",)), "fsdp"),
              "data2xfsdp4": (make_mesh((2, 4), ("data", "fsdp")), "fsdp")}
    for case in ("mlp_adamw", "cnn_bce"):
        prog, start = program(case)
        names, arrays = batches(case)
        ref, ref_losses = train(prog, start, arrays)
        ref_bytes = checkpoint.to_bytes(prog.to_checkpoint(ref))
        for label, (mesh, strategy) in meshes.items():
            traces = prog.trace_count("train_step")
            state, losses = train(prog, start, arrays, mesh, strategy)
            sharded_again = shard(ref, mesh, strategy)
            out[f"{case}/{label}"] = {
                "loss_rel": rel(losses, ref_losses),
                "param_rel": max(rel(state.params[n], ref.params[n]) for n in ref.params),
                "param_excess": max(excess(state.params[n], ref.params[n]) for n in ref.params),
                "moment_excess": max(excess(a, b) for a, b in zip(jax.tree.leaves(state.opt_state),
                                                                  jax.tree.leaves(ref.opt_state))),
                "param_abs": max(float(np.max(np.abs(np.asarray(state.params[n]) - np.asarray(ref.params[n]))))
                                 for n in ref.params),
                "moment_rel": max(rel(a, b) for a, b in zip(jax.tree.leaves(state.opt_state),
                                                              jax.tree.leaves(ref.opt_state))),
                "specs": {n: str(v.sharding.spec) for n, v in state.params.items()},
                "moment_specs": sorted({str(v.sharding.spec) for v in jax.tree.leaves(state.opt_state)}),
                "grad_specs": {n: str(v.sharding.spec) for n, v in state.grads.items()},
                "fraction": per_device_fraction(state),
                "compiles": prog.trace_count("train_step") - traces,
                "same_bytes": checkpoint.to_bytes(prog.to_checkpoint(sharded_again)) == ref_bytes,
                "trained_same_bytes": checkpoint.to_bytes(prog.to_checkpoint(state)) == ref_bytes,
                "step": int(state.step),
            }
        # a batch the data axis does not divide
        mesh = meshes["data"][0]
        state = shard(set_learning_rate(prog.init_state(start), 0.01), mesh, "data")
        try:
            prog.train_step(state, *(a[0][:6] for a in arrays))
            out[f"{case}/error"] = None
        except InputError as e:
            out[f"{case}/error"] = str(e)
        out[f"{case}/ref_losses"] = ref_losses

    # The demo-sized MLP (64-64-10) under fsdp: how much of the parameters one device holds.
    from jaxort.demo import build_digits_mlp
    from jaxort.training.artifacts import LossType, OptimType, float_initializers, generate_artifacts
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        model = build_digits_mlp(64, 0)
        arts = generate_artifacts(model, float_initializers(model), loss=LossType.CrossEntropyLoss,
                                  optimizer=OptimType.AdamW, artifact_directory=tmp)
        start = checkpoint.load(arts.checkpoint)
        prog = TrainProgram.from_artifacts(arts.training_model, arts.eval_model, arts.optimizer_model,
                                           checkpoint=start)
        state = shard(prog.init_state(start), meshes["fsdp"][0], "fsdp")
        out["digits_mlp/fsdp_fraction"] = per_device_fraction(state)

        # The facade: jaxort.api.Module with a mesh, 5 steps vs the same on 1 device.
        rng = np.random.default_rng(0)
        xs = rng.random((5, 64, 64), np.float32)
        ys = rng.integers(0, 10, (5, 64)).astype(np.int64)
        losses = {}
        for label, mesh, strategy in (("one", None, "data"), ("fsdp", meshes["fsdp"][0], "fsdp")):
            st = api.CheckpointState.load_checkpoint(str(arts.checkpoint))
            module = api.Module(str(arts.training_model), st, str(arts.eval_model), mesh=mesh, strategy=strategy)
            opt = api.Optimizer(str(arts.optimizer_model), module)
            opt.set_learning_rate(0.01)
            losses[label] = []
            for i in range(5):
                losses[label].append(float(module(xs[i], ys[i])))
                opt.step()
                module.lazy_reset_grad()
            losses[label + "_param"] = st.parameters["fc1.weight"].data
            losses[label + "_spec"] = str(module._state.session_state.train.params["fc1.weight"].sharding.spec) \
                if mesh is not None else None
        out["api/loss_rel"] = rel(losses["fsdp"], losses["one"])
        out["api/param_rel"] = rel(losses["fsdp_param"], losses["one_param"])
        out["api/param_excess"] = excess(losses["fsdp_param"], losses["one_param"])
        out["api/spec"] = losses["fsdp_spec"]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
