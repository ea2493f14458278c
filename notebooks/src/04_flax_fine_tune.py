# %% [markdown]
# # Fine-tuning an exported torchvision model inside a flax model
#
# `jaxort.nnx.OnnxModule` turns an ONNX model into a `flax.nnx` module: its
# initializers become nnx variables named as in the ONNX file, trainable
# ones `nnx.Param`, frozen ones `jaxort.nnx.OnnxFrozen`. It composes inside
# your own nnx model, trains with `nnx.Optimizer`, takes LoRA adapters
# (`nnx.LoRA`) on MatMul and Gemm weights, and exports what it learned as an
# ONNX Runtime Training checkpoint or as the ONNX model with updated
# initializers. (`jaxort.equinox.OnnxModule` does the same for equinox.)
#
# The model is a torchvision ResNet-18 exported to ONNX with
# `torch.onnx.export`. PyTorch is not needed here: the notebook uses the
# export committed with jaxort's test suite,
# `tests/fixtures/models/resnet18/model.onnx` (torchvision's ResNet-18 at
# stage widths 3-6-12-24, random initial weights, 3x32x32 images in batches
# of 8). It fine-tunes the model's head, the last `Gemm` (`fc.weight`,
# `fc.bias`), on synthetic data, first the head itself and then a LoRA
# adapter on it, exports the result and runs the export in `jaxort.backend`
# and ONNX Runtime. It needs the `flax` extra (`pip install 'jaxort[flax]'`),
# runs on a CPU in under a minute, and writes only into a temporary directory.

# %%
import pathlib
import tempfile

import jax
import matplotlib
import numpy as np
import onnx
import onnxruntime
import optax
from flax import nnx
from IPython.display import Image

import jaxort
import jaxort.backend
from jaxort import checkpoint
from jaxort.nnx import OnnxFrozen, OnnxModule

# Figures are written to files (and shown from them), so the notebook runs
# the same in Jupyter, as a script and headless in CI.
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

# Everything this notebook writes goes here.
workdir = tempfile.TemporaryDirectory()
out = pathlib.Path(workdir.name)

# %% [markdown]
# ## 1. The exported model
#
# The file is found from the jaxort checkout (`jaxort` installed editable
# from the repository) or from the working directory, so the notebook runs
# from `notebooks/`, from the repository root or from anywhere else.

# %%
def find_corpus_model(case: str) -> pathlib.Path:
    """The file tests/fixtures/models/<case>/model.onnx of the jaxort checkout."""
    cwd = pathlib.Path.cwd().resolve()
    for root in (pathlib.Path(jaxort.__file__).resolve().parents[1], cwd, *cwd.parents):
        path = root / "tests" / "fixtures" / "models" / case / "model.onnx"
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"tests/fixtures/models/{case}/model.onnx not found: run this notebook from a jaxort checkout")


model_path = find_corpus_model("resnet18")
model = onnx.load(model_path)
head = [n for n in model.graph.node if n.op_type == "Gemm"][-1]
print(model_path)
print("inputs:", [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input])
print("head:", head.op_type, list(head.input), {a.name: onnx.helper.get_attribute_value(a) for a in head.attribute})

# %% [markdown]
# ## 2. The ONNX network inside a flax model
#
# `params=["fc.weight", "fc.bias"]` makes the head's weights the only
# `nnx.Param`s; every other floating-point initializer (convolutions,
# BatchNorm scales and running statistics) is an `OnnxFrozen` variable,
# which `nnx.Optimizer(..., wrt=nnx.Param)` does not touch. The names are
# the ONNX initializer names, dots and all. `FineTuner` is the user's own
# nnx model; the ONNX module is one of its attributes.

# %%
class FineTuner(nnx.Module):
    """A user's flax model around the exported ResNet, of which only ``params`` train."""

    def __init__(self, path, params):
        self.net = OnnxModule(path, params=params)

    def __call__(self, images):
        return self.net(images)


tuner = FineTuner(model_path, params=["fc.weight", "fc.bias"])
print("trainable:", {n: v.shape for n, v in tuner.net.params.items()})
print("frozen:", len(tuner.net.frozen), "initializers, e.g.", list(tuner.net.frozen)[:3])
print("nnx.Param leaves:", len(jax.tree.leaves(nnx.state(tuner, nnx.Param))),
      "OnnxFrozen leaves:", len(jax.tree.leaves(nnx.state(tuner, OnnxFrozen))))
initial_head = {n: np.asarray(v[...]) for n, v in tuner.net.params.items()}
initial_frozen = {n: np.asarray(v[...]) for n, v in tuner.net.frozen.items()}

# %% [markdown]
# ## 3. Synthetic data and the training step
#
# Four batches of 8 random images, each with a random class of 10: the
# head learns to tell these 32 images apart from the frozen features. The
# step is one `nnx.jit` program: forward, gradients of the trainable
# `nnx.Param`s, and the optimizer update.

# %%
rng = np.random.default_rng(0)
images = rng.normal(size=(4, 8, 3, 32, 32)).astype(np.float32)
labels = rng.integers(0, 10, size=(4, 8)).astype(np.int32)


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@nnx.jit(static_argnums=3)
def train_step(model, optimizer, batch, wrt):
    x, y = batch
    loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, wrt))(model, x, y)
    optimizer.update(model, grads)
    return loss


def train(model, optimizer, wrt, epochs):
    """Mean loss per epoch over the four batches."""
    history = []
    for _ in range(epochs):
        history.append(float(np.mean([train_step(model, optimizer, (x, y), wrt)
                                      for x, y in zip(images, labels)])))
    return history


# %% [markdown]
# ## 4. Fine-tune the head
#
# Adam on the two `nnx.Param`s. The backbone's BatchNormalization nodes are
# in training form in this export (`training_mode=1`, as
# `torch.onnx.export` writes a model in train mode), so they normalize with
# each batch's statistics; in the module's default inference mode they do
# not write their running statistics, and the frozen variables stay as
# they were.

# %%
optimizer = nnx.Optimizer(tuner, optax.adam(0.05), wrt=nnx.Param)
head_losses = train(tuner, optimizer, nnx.Param, epochs=15)
print("mean loss per epoch:", np.round(head_losses, 3))
assert head_losses[-1] < 0.5 * head_losses[0], head_losses
for name, value in tuner.net.frozen.items():
    np.testing.assert_array_equal(value[...], initial_frozen[name], err_msg=name)

# %% [markdown]
# ## 5. Or: a LoRA adapter on the head
#
# A fresh module with nothing trainable (`params=[]`), and an `nnx.LoRA`
# adapter on `fc.weight`: the weight computes as `W + (A @ B)^T` (the Gemm
# has `transB=1`, so the weight is stored `[out, in]` and the product is
# transposed), `A` `[24, 4]` and `B` `[4, 10]`, `B` starting at zero.
# `wrt=nnx.LoRAParam` trains `A` and `B` alone.

# %%
lora_tuner = FineTuner(model_path, params=[])
lora_tuner.net.lora("fc.weight", 4, rngs=nnx.Rngs(0))
adapter = lora_tuner.net.lora_adapters["fc.weight"]
print("adapter:", adapter.lora_a[...].shape, adapter.lora_b[...].shape)
lora_optimizer = nnx.Optimizer(lora_tuner, optax.adam(0.05), wrt=nnx.LoRAParam)
lora_losses = train(lora_tuner, lora_optimizer, nnx.LoRAParam, epochs=15)
print("mean loss per epoch:", np.round(lora_losses, 3))
np.testing.assert_array_equal(lora_tuner.net.frozen["fc.weight"][...], initial_head["fc.weight"])
merged = np.asarray(lora_tuner.net.values()["fc.weight"])
np.testing.assert_allclose(merged, initial_head["fc.weight"] + (adapter.lora_a[...] @ adapter.lora_b[...]).T,
                           rtol=1e-6, atol=1e-7)

# %% [markdown]
# ## 6. The loss curves
#
# Mean cross entropy per epoch, for the head and for the adapter. The
# figure is saved as a PNG and shown from the file.

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.5))
ax.plot(np.arange(1, len(head_losses) + 1), head_losses, "o-", label="head (fc.weight, fc.bias)")
ax.plot(np.arange(1, len(lora_losses) + 1), lora_losses, "x--", label="LoRA rank 4 on fc.weight")
ax.set(title="fine-tuning the ResNet-18 head", xlabel="epoch", ylabel="mean cross entropy")
ax.legend()
fig.tight_layout()
png_path = out / "fine_tune.png"
fig.savefig(png_path, dpi=80)
plt.close(fig)
Image(filename=str(png_path))

# %% [markdown]
# ## 7. Export, and run the export elsewhere
#
# `save_checkpoint` writes ONNX Runtime Training's checkpoint format: the
# `nnx.Param`s as its trainable parameters, the frozen variables as its
# frozen ones, LoRA merged into its weight. `save_onnx` writes the ONNX
# model with its initializers replaced. `jaxort.backend` (ONNX's backend
# API, op by op) and ONNX Runtime's `InferenceSession` then run the exported
# LoRA model and give the module's outputs; `checkpoint.load_to_model`
# (ORT's LoadCheckpointToModel) puts the checkpoint into the original
# model, and gives the same file.

# %%
lora_tuner.net.save_checkpoint(out / "checkpoint", properties={"epochs": 15})
lora_tuner.net.save_onnx(out / "fine_tuned.onnx")
saved = checkpoint.load(out / "checkpoint")
print(checkpoint.summary(out / "checkpoint").splitlines()[0])
print("trainable in the checkpoint:", list(saved.trainable), "frozen:", len(saved.frozen))

x = images[0]
want = np.asarray(nnx.jit(lambda model, x: model(x))(lora_tuner, x))
backend_out = np.asarray(jaxort.backend.prepare(onnx.load(out / "fine_tuned.onnx")).run([x])[0])
session = onnxruntime.InferenceSession(str(out / "fine_tuned.onnx"), providers=["CPUExecutionProvider"])
(ort_out,) = session.run(None, {"input": x})
restored = checkpoint.load_to_model(out / "checkpoint", model)
print("largest difference, jaxort.backend:", float(np.abs(backend_out - want).max()),
      "onnxruntime:", float(np.abs(ort_out - want).max()))

# %% [markdown]
# ## Checks
#
# Both fine-tunings lowered the loss, and trained only what they were asked
# to; the checkpoint holds the merged head weight and the untouched frozen
# initializers; the exported model gives the module's outputs in
# `jaxort.backend` and ONNX Runtime; the checkpoint loaded into the original
# model is the exported model; the plot is a PNG file.

# %%
assert head_losses[-1] < 0.5 * head_losses[0], head_losses
assert lora_losses[-1] < 0.5 * lora_losses[0], lora_losses
assert not np.array_equal(tuner.net.params["fc.weight"][...], initial_head["fc.weight"])
assert saved.trainable == {} and saved.properties == {"epochs": 15}
np.testing.assert_array_equal(saved.frozen["fc.weight"], merged)
for name, value in initial_frozen.items():
    np.testing.assert_array_equal(saved.frozen[name], value, err_msg=name)
np.testing.assert_allclose(backend_out, want, rtol=1e-4, atol=1e-4)  # float32 rounding, logits ~5
np.testing.assert_allclose(ort_out, want, rtol=1e-4, atol=1e-4)
exported = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(out / "fine_tuned.onnx").graph.initializer}
for init in restored.graph.initializer:
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), exported[init.name], err_msg=init.name)
assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png_path.read_bytes()[:8]
workdir.cleanup()
print("all checks passed")
