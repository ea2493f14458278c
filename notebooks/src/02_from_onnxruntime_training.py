# %% [markdown]
# # Coming from onnxruntime.training
#
# You have ONNX Runtime Training artifacts (a training model, an eval model,
# an optimizer model and a checkpoint, written by
# `onnxruntime.training.artifacts.generate_artifacts`) and a training script
# written against `onnxruntime.training.api`. `jaxort.api` has the same
# names, signatures and behaviour (onnxruntime-training 1.19.2), so the
# script changes by one import and trains with JAX:
#
# ```python
# # from onnxruntime.training.api import CheckpointState, Module, Optimizer
# from jaxort.api import CheckpointState, Module, Optimizer
# ```
#
# This notebook takes artifacts that ONNX Runtime itself wrote, together
# with what ONNX Runtime computed on them (the golden data of jaxort's test
# suite, `tests/fixtures/golden/mlp_adamw/`), makes the same calls ORT made,
# and checks that jaxort gives the same losses and parameters, that the
# checkpoint files go both ways, and that the exported inference model runs
# in `onnxruntime.InferenceSession`. It runs on a CPU in seconds, and writes
# only into a temporary directory.

# %%
import json
import pathlib
import tempfile

import matplotlib
import numpy as np
import onnxruntime
from IPython.display import Image

import jaxort
from jaxort.api import CheckpointState, Module, Optimizer

# Figures are written to files (and shown from them), so the notebook runs
# the same in Jupyter, as a script and headless in CI.
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

# Everything this notebook writes goes here.
workdir = tempfile.TemporaryDirectory()
out = pathlib.Path(workdir.name)

# %% [markdown]
# ## 1. ONNX Runtime's artifacts and its recorded run
#
# The case `mlp_adamw`: an MLP 20 -> 16 -> 5 (MatMul/Add/Relu/MatMul/Add),
# CrossEntropyLoss, AdamW, written by onnxruntime-training 1.19.2 on CPU.
# ORT then trained it for 6 steps (learning rate 0.01, one batch of 8 per
# step) and recorded every loss, the parameters after the run, the eval loss
# and the exported inference model's output on a held-out batch.
#
# The folder is found from the jaxort checkout (`jaxort` installed editable
# from the repository) or from the working directory, so the notebook runs
# from `notebooks/`, from the repository root or from anywhere else.

# %%
def find_golden_case(case: str) -> pathlib.Path:
    """The folder tests/fixtures/golden/<case> of the jaxort checkout."""
    cwd = pathlib.Path.cwd().resolve()
    for root in (pathlib.Path(jaxort.__file__).resolve().parents[1], cwd, *cwd.parents):
        folder = root / "tests" / "fixtures" / "golden" / case
        if (folder / "trajectory.json").is_file():
            return folder
    raise FileNotFoundError(
        f"tests/fixtures/golden/{case} not found: run this notebook from a jaxort checkout")


golden = find_golden_case("mlp_adamw")
print(golden)
print(sorted(p.name for p in golden.iterdir()))

trajectory = json.loads((golden / "trajectory.json").read_text())
with np.load(golden / "batches.npz") as f:
    train_x, train_labels = f["train::input"], f["train::labels"]
    eval_x, eval_labels = f["eval::input"], f["eval::labels"]
with np.load(golden / "params_after.npz") as f:
    ort_params_after = {name: f[name] for name in f.files}
with np.load(golden / "eval_outputs.npz") as f:
    ort_eval_output = f["output"]

ort_losses = [loss for step in trajectory["steps"] for loss in step["train_losses"]]
ort_lr = trajectory["steps"][0]["lr"]
ort_eval_loss = trajectory["eval_loss_after"]
print("ORT's train losses:", np.round(ort_losses, 4), "lr", ort_lr, "eval loss", round(ort_eval_loss, 4))
train_x.shape, train_labels.shape, eval_x.shape

# %% [markdown]
# ## 2. Load the checkpoint, build Module and Optimizer
#
# Exactly as with `onnxruntime.training.api`. The parameters are ORT's
# initial ones; `Module` traces the training and eval graphs with jaxort and
# compiles them with `jax.jit`; `Optimizer` reads the optimizer model (here
# `com.microsoft::AdamWOptimizer` with its attributes). As in ORT, a fresh
# optimizer starts at learning rate 0.001.

# %%
state = CheckpointState.load_checkpoint(str(golden / "checkpoint"))
module = Module(str(golden / "training_model.onnx"), state, str(golden / "eval_model.onnx"), device="cpu")
optimizer = Optimizer(str(golden / "optimizer_model.onnx"), module)
print("parameters:", {name: p.data.shape for name, p in state.parameters.items()})
print("inputs:", module.input_names(), "outputs:", module.output_names())
print("trainable parameter elements:", module.get_parameters_size())
initial_params = {name: p.data.copy() for name, p in state.parameters.items()}
initial_lr = optimizer.get_learning_rate()
initial_lr

# %% [markdown]
# ## 3. Train the way ORT did
#
# ORT's loop: set the learning rate, then per batch a train step (forward,
# backward, gradients accumulated), `optimizer.step()`, and
# `lazy_reset_grad()` so the next train step overwrites the gradients
# instead of adding to them. Then one eval step on the held-out batch.

# %%
optimizer.set_learning_rate(0.01)
module.train()
jaxort_losses = []
for x, labels in zip(train_x, train_labels):
    jaxort_losses.append(float(module(x, labels)))
    optimizer.step()
    module.lazy_reset_grad()
module.eval()
jaxort_eval_loss = float(module(eval_x, eval_labels))

print("jaxort's train losses:", np.round(jaxort_losses, 4), "eval loss", round(jaxort_eval_loss, 4))
np.testing.assert_allclose(jaxort_losses, ort_losses, rtol=1e-4)
np.testing.assert_allclose(jaxort_eval_loss, ort_eval_loss, rtol=1e-4)
for name, value in ort_params_after.items():
    np.testing.assert_allclose(state.parameters[name].data, value, rtol=1e-4, atol=1e-5, err_msg=name)
max_param_diff = max(float(np.abs(state.parameters[name].data - value).max())
                     for name, value in ort_params_after.items())
print(f"largest difference from ORT's parameters: {max_param_diff:.2e}")

# %% [markdown]
# ## 4. Checkpoints go both ways
#
# `CheckpointState.save_checkpoint` writes ORT's flatbuffer format, with the
# optimizer state (step, AdamW moments) when asked and the user properties.
# Reading it back gives the same arrays bit for bit; ORT reads it too, and
# jaxort reads the checkpoint ORT saved after its own run.

# %%
state.properties["epoch"] = 1
state.properties["run_name"] = "from-onnxruntime-training"
saved = out / "checkpoint_after"
CheckpointState.save_checkpoint(state, str(saved), include_optimizer_state=True)
reloaded = CheckpointState.load_checkpoint(str(saved))
ort_saved = CheckpointState.load_checkpoint(str(golden / "ckpt_after_with_opt"))

print("saved", saved.stat().st_size, "bytes; properties", dict(reloaded.properties.items()))
for name, parameter in state.parameters.items():
    np.testing.assert_array_equal(reloaded.parameters[name].data, parameter.data)
    np.testing.assert_allclose(ort_saved.parameters[name].data, parameter.data, rtol=1e-4, atol=1e-5)
print("ORT's checkpoint properties:", dict(ort_saved.properties.items()))

# %% [markdown]
# ## 5. Export for inference and run it in ONNX Runtime
#
# `export_model_for_inferencing` cuts the eval graph at the model output
# (dropping the loss) and bakes the trained parameters in. ONNX Runtime's
# ordinary `InferenceSession` runs it. Its logits give, through a numpy
# cross entropy, the eval loss `Module` reported, and match the output ORT
# recorded from its own exported model.

# %%
inference_path = out / "inference_model.onnx"
module.export_model_for_inferencing(str(inference_path), ["output"])
session = onnxruntime.InferenceSession(str(inference_path), providers=["CPUExecutionProvider"])
print([i.name for i in session.get_inputs()], "->", [o.name for o in session.get_outputs()])
(logits,) = session.run(["output"], {"input": eval_x})


def cross_entropy(logits, labels):
    """Mean softmax cross entropy, in float64 numpy."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -log_p[np.arange(len(labels)), labels].mean()


inference_loss = cross_entropy(logits, eval_labels)
np.testing.assert_allclose(logits, ort_eval_output, rtol=1e-4, atol=1e-5)
np.testing.assert_allclose(inference_loss, jaxort_eval_loss, rtol=1e-5)
logits.shape, inference_loss

# %% [markdown]
# ## 6. The two runs side by side
#
# ORT's recorded losses and jaxort's, per step; and their relative
# difference: float32 rounding where there is a bar, none where there is not.

# %%
steps = np.arange(1, len(ort_losses) + 1)
relative = np.abs(np.array(jaxort_losses) - ort_losses) / np.abs(ort_losses)
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
left.plot(steps, ort_losses, "o-", label="onnxruntime.training (recorded)")
left.plot(steps, jaxort_losses, "x--", label="jaxort.api")
left.set(title="train loss per step", xlabel="optimizer step", ylabel="cross entropy")
left.legend()
right.bar(steps, relative)
right.set(title="|jaxort - ORT| / ORT (no bar: identical)", xlabel="optimizer step",
          yscale="log", ylim=(1e-10, 1e-3))
fig.tight_layout()
png_path = out / "ort_vs_jaxort.png"
fig.savefig(png_path, dpi=80)
plt.close(fig)
Image(filename=str(png_path))

# %% [markdown]
# ## Checks
#
# The optimizer started at ORT's default learning rate; jaxort's losses and
# parameters are ORT's; the checkpoint round trip is exact and keeps the
# properties; the exported model runs in ONNX Runtime and agrees with
# `Module`; the plot is a PNG file.

# %%
assert initial_lr == np.float32(0.001), initial_lr
assert len(jaxort_losses) == len(ort_losses) == 6
np.testing.assert_allclose(jaxort_losses, ort_losses, rtol=1e-4)
np.testing.assert_allclose(jaxort_eval_loss, ort_eval_loss, rtol=1e-4)
for name, value in ort_params_after.items():
    assert not np.array_equal(value, initial_params[name]), name
    np.testing.assert_allclose(reloaded.parameters[name].data, value, rtol=1e-4, atol=1e-5, err_msg=name)
assert reloaded.properties["epoch"] == 1 and reloaded.properties["run_name"] == "from-onnxruntime-training"
np.testing.assert_allclose(logits, ort_eval_output, rtol=1e-4, atol=1e-5)
np.testing.assert_allclose(inference_loss, jaxort_eval_loss, rtol=1e-5)
assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png_path.read_bytes()[:8]
workdir.cleanup()
print("all checks passed")
