"""Run by test_orbax.py in a subprocess with 8 fake CPU devices (XLA_FLAGS set before JAX loads).

Trains the golden MLP (AdamW) 3 steps on a 2x4 ("data", "fsdp") mesh, saves
it with Orbax (asynchronously), restores it on the mesh and on one device
and trains 2 more steps on each; does the same from a one-device save; and
converts a restored state to an ORT checkpoint. Prints one JSON object of
the results for the test to check. ``argv[1]``, if given, is a folder to keep
the converted checkpoint file in (for a check with ONNX Runtime).
"""

import json
import os
import pathlib
import sys
import tempfile

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxort import checkpoint  # noqa: E402
from jaxort.training import TrainProgram, make_mesh, set_learning_rate, shard  # noqa: E402
from jaxort.training import orbax as jo  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "golden" / "mlp_adamw"
PROPERTIES = {"epoch": 3, "best_loss": 0.25, "note": "saved by orbax"}


def steps(prog, state, arrays, first, last):
    losses = []
    for i in range(first, last):
        state, (loss,) = prog.train_step(state, *(a[i] for a in arrays))
        state = prog.lazy_reset_grad(prog.optimizer_step(state))
        losses.append(float(loss))
    return state, losses


def host(state):
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def same(a, b):
    """Every leaf (parameters, gradients, moments, count, learning rates, key) equal bit for bit."""
    return all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(host(a), host(b)))


def excess(a, b, rtol=1e-5, atol=1e-7):
    """max(|a - b| - (atol + rtol |b|)) over the float leaves: <= 0 when assert_allclose passes."""
    out = -np.inf
    for x, y in zip(host(a), host(b)):
        if x.dtype.kind == "f":
            x, y = x.astype(np.float64), y.astype(np.float64)
            out = max(out, float(np.max(np.abs(x - y) - (atol + rtol * np.abs(y)), initial=-np.inf)))
    return out


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))


def max_abs(a, b):
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0))
               for x, y in zip(host(a), host(b)) if x.dtype.kind == "f")


def specs(state):
    return {n: str(v.sharding.spec) for n, v in state.params.items()}


def main():
    assert jax.device_count() == 8, jax.devices()
    keep = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None
    start = checkpoint.load(GOLDEN / "checkpoint")
    prog = TrainProgram.from_artifacts(GOLDEN / "training_model.onnx", GOLDEN / "eval_model.onnx",
                                       GOLDEN / "optimizer_model.onnx", checkpoint=start)
    data = np.load(GOLDEN / "batches.npz")
    arrays = [data[k] for k in data.files if k.startswith("train::")]
    mesh = make_mesh((2, 4), ("data", "fsdp"))

    def fresh(on_mesh):
        state = set_learning_rate(prog.init_state(start), 0.01)
        return shard(state, mesh, "fsdp") if on_mesh else state

    ref8, ref8_losses = steps(prog, fresh(True), arrays, 0, 5)  # uninterrupted, 8 devices
    ref1, ref1_losses = steps(prog, fresh(False), arrays, 0, 5)  # uninterrupted, 1 device
    out = {}
    conts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for saved_on in ("8", "1"):
            mngr = jo.manager(pathlib.Path(tmp) / f"run{saved_on}", max_to_keep=2)
            state, losses = steps(prog, fresh(saved_on == "8"), arrays, 0, 3)
            saved = host(state)
            treedef = jax.tree.structure(state)
            started = jo.save(mngr, 3, state, PROPERTIES)
            # Training goes on while the files are written: the steps donate `state`'s buffers.
            _, going_on = steps(prog, state, arrays, 3, 5)
            mngr.wait_until_finished()
            for restored_on in ("8", "1"):
                like = fresh(restored_on == "8")  # step 0: only its structure and placement are used
                back, props = jo.restore(mngr, 3, like)
                restored = host(back)
                back_specs = specs(back) if restored_on == "8" else None
                cont, more = steps(prog, back, arrays, 3, 5)
                # The same state moved there without orbax (a host copy of the saved leaves), trained on.
                moved = jax.tree.unflatten(treedef, [np.array(x) for x in saved])
                moved = shard(moved, mesh, "fsdp") if restored_on == "8" else jax.device_put(moved)
                direct, direct_losses = steps(prog, moved, arrays, 3, 5)
                ref, ref_losses = (ref8, ref8_losses) if restored_on == "8" else (ref1, ref1_losses)
                conts[f"{saved_on}->{restored_on}"] = (cont, more)
                out[f"{saved_on}->{restored_on}"] = {
                    "save_started": bool(started),
                    "saved_run_went_on": losses + going_on == (ref8_losses if saved_on == "8" else ref1_losses),
                    "restored_equal_saved": all(x.dtype == y.dtype and np.array_equal(x, y)
                                                for x, y in zip(restored, saved)),
                    "properties": props,
                    "specs": back_specs,
                    "like_specs": specs(like) if restored_on == "8" else None,
                    "step": int(cont.step),
                    "losses_equal": losses + more == ref_losses,
                    "state_equal": same(cont, ref),
                    "direct_equal": more == direct_losses and same(cont, direct),
                    "loss_rel": rel(losses + more, ref_losses),
                    "excess": excess(cont, ref),
                    "loss_rel_vs_8": rel(losses + more, ref8_losses),
                    "excess_vs_8": excess(cont, ref8),
                    "max_abs_vs_8": max_abs(cont, ref8),
                }
            if saved_on == "8":
                # ORT's format from the state restored on the mesh: the same file as from the saved state
                back, _ = jo.restore(mngr, None, fresh(True))
                ort = prog.to_checkpoint(back, properties=PROPERTIES)
                path = (keep or pathlib.Path(tmp)) / "converted_checkpoint"
                checkpoint.save(ort, path, include_optimizer_state=True)
                loaded = checkpoint.load(path)
                group = loaded.optimizer_groups[0]
                # the converted file trains on (1 device) as the orbax state restored on 1 device does
                # (the PRNG key is not in ORT's format; this MLP draws no random numbers)
                again, again_losses = steps(prog, set_learning_rate(prog.init_state(loaded), 0.01), arrays, 3, 5)
                cont1, more1 = conts["8->1"]
                names = sorted(back.params)
                out["ort"] = {
                    "names": sorted(loaded.trainable) == names,
                    "params_equal": all(np.array_equal(loaded.trainable[n], np.asarray(back.params[n]))
                                        for n in names),
                    "moments_equal": all(
                        np.array_equal(group.states[n]["momentum0"], np.asarray(back.opt_state.mu[n])) and
                        np.array_equal(group.states[n]["momentum1"], np.asarray(back.opt_state.nu[n]))
                        for n in names),
                    "step": int(group.step),
                    "properties": dict(loaded.properties),
                    "resumed_losses_equal": again_losses == more1,
                    "resumed_equal": same(again.replace(rng=cont1.rng), cont1),
                }
            mngr.close()
    out["ref_losses"] = ref8_losses
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
