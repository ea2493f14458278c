"""The benchmark suite's workloads W1-W9: ONNX models, batches, and the hand-written references.

W1-W5 are written with ``onnx.helper`` (the shapes of issue 10); W6 is the
real-model corpus' ResNet-18 (tests/fixtures/models/resnet18: torchvision's
BasicBlock [2, 2, 2, 2] with stage widths 3-6-12-24, 3x32x32, batch 8) and W7
the BERT-tiny exported by ``benchmarks/make_w7.py`` (benchmarks/models/w7_bert).
W8 and W9 are an LSTM and a GRU of working size, written with ``onnx.helper``
as torch exports them (ORT rewrites them into LSTMTraining and GRUTraining).
For W1-W4, W8 and W9 there is the same network in jax.numpy (for hand-written
JAX + optax) and in torch (for PyTorch eager), both on the ONNX model's
initial weights (tests/test_bench_workloads.py checks them against ONNX's
reference evaluator). This module imports numpy and onnx only; the JAX and
torch references import their library when called.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMES = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9")
DESCRIPTIONS = {
    "W1": "MLP 784-500-10, batch 64",
    "W2": "MLP 1024-2048-2048-10, batch 256",
    "W3": "LeNet-style CNN 1x28x28, batch 64",
    "W4": "2-block pre-LN transformer d 128 seq 64 batch 16, Erf-Gelu",
    "W5": "tiny MLP 20-16-5, batch 8",
    "W6": "ResNet-18 (widths 3-6-12-24) 3x32x32, batch 8",
    "W7": "BERT-tiny 2 layers hidden 64 seq 16, batch 4",
    "W8": "LSTM 64->128 seq 32 + linear head on the last step, batch 16",
    "W9": "GRU 64->128 seq 32 + linear head on the last step, batch 16",
}
N_BATCHES = 4


@dataclass
class Workload:
    name: str
    description: str
    model: onnx.ModelProto  # forward model: inputs then logits "output"
    requires_grad: list
    frozen_params: list
    batches: list  # [(input, labels)] numpy
    kind: str = "onnx"  # "mlp" | "cnn" | "transformer" for the hand-written references
    config: dict = field(default_factory=dict)

    @property
    def params(self) -> dict:
        return {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer}


class _Builder:
    def __init__(self, rng):
        self.rng, self.nodes, self.inits, self.n = rng, [], [], 0

    def op(self, op_type, *inputs, **attrs):
        self.n += 1
        out = f"{op_type.lower()}_{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value, dtype=np.float32):
        self.n += 1
        name = f"const_{self.n}"
        self.nodes.append(helper.make_node("Constant", [], [name], name=name,
                                           value=numpy_helper.from_array(np.asarray(value, dtype), name)))
        return name

    def init(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def dense(self, x, name, d_in, d_out):
        w = self.init(f"{name}.weight", self.rng.standard_normal((d_in, d_out)) / np.sqrt(d_in))
        return self.op("Add", self.op("MatMul", x, w), self.init(f"{name}.bias", np.zeros(d_out)))

    def model(self, x_name, x_shape, out, out_shape):
        self.nodes[-1].output[0] = "output"
        for node in self.nodes:  # the last node's output was renamed
            for i, name in enumerate(node.input):
                if name == out:
                    node.input[i] = "output"
        graph = helper.make_graph(
            self.nodes, "bench", [helper.make_tensor_value_info(x_name, TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8  # onnxruntime-training 1.19.2 reads IR <= 9
        return model


def _mlp(rng, sizes, batch):
    b = _Builder(rng)
    h = "input"
    for i in range(len(sizes) - 1):
        h = b.dense(h, f"fc{i + 1}", sizes[i], sizes[i + 1])
        if i < len(sizes) - 2:
            h = b.op("Relu", h)
    return b.model("input", [batch, sizes[0]], h, [batch, sizes[-1]])


def _lenet(rng, batch):
    b = _Builder(rng)

    def conv(x, name, c_in, c_out, pad):
        w = b.init(f"{name}.weight", rng.standard_normal((c_out, c_in, 5, 5)) / np.sqrt(c_in * 25))
        y = b.op("Conv", x, w, b.init(f"{name}.bias", np.zeros(c_out)), kernel_shape=[5, 5],
                 pads=[pad] * 4)
        return b.op("MaxPool", b.op("Relu", y), kernel_shape=[2, 2], strides=[2, 2])

    h = conv(conv("input", "conv1", 1, 6, 2), "conv2", 6, 16, 0)
    h = b.op("Flatten", h, axis=1)
    h = b.op("Relu", b.dense(h, "fc1", 400, 120))
    h = b.op("Relu", b.dense(h, "fc2", 120, 84))
    return b.model("input", [batch, 1, 28, 28], b.dense(h, "fc3", 84, 10), [batch, 10])


TRANSFORMER = dict(batch=16, seq=64, d=128, heads=4, blocks=2, classes=16)


def _transformer(rng, batch, seq, d, heads, blocks, classes):
    """Pre-LN blocks as exporters write them: LayerNorm and Erf-Gelu spelled out, causal attention."""
    b = _Builder(rng)
    dh = d // heads
    causal = np.triu(np.full((seq, seq), -1e4, np.float32), 1).reshape(1, 1, seq, seq)

    def layer_norm(x, name):
        mean = b.op("ReduceMean", x, axes=[-1])
        c = b.op("Sub", x, mean)
        var = b.op("ReduceMean", b.op("Pow", c, b.const(2.0)), axes=[-1])
        n = b.op("Div", c, b.op("Sqrt", b.op("Add", var, b.const(1e-5))))
        return b.op("Add", b.op("Mul", n, b.init(f"{name}.weight", np.ones(d))),
                    b.init(f"{name}.bias", np.zeros(d)))

    def heads_of(t):
        return b.op("Transpose", b.op("Reshape", t, b.const([batch, seq, heads, dh], np.int64)),
                    perm=[0, 2, 1, 3])

    x = "input"
    mask = b.const(causal)
    for i in range(blocks):
        h = layer_norm(x, f"blocks.{i}.ln1")
        q, k, v = (heads_of(b.dense(h, f"blocks.{i}.{n}", d, d)) for n in ("q", "k", "v"))
        s = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
        s = b.op("Add", b.op("Div", s, b.const(np.sqrt(dh))), mask)
        o = b.op("MatMul", b.op("Softmax", s, axis=-1), v)
        o = b.op("Reshape", b.op("Transpose", o, perm=[0, 2, 1, 3]), b.const([batch, seq, d], np.int64))
        x = b.op("Add", x, b.dense(o, f"blocks.{i}.proj", d, d))
        h = b.dense(layer_norm(x, f"blocks.{i}.ln2"), f"blocks.{i}.fc1", d, 4 * d)
        e = b.op("Erf", b.op("Div", h, b.const(np.sqrt(2.0))))
        g = b.op("Mul", b.op("Mul", h, b.const(0.5)), b.op("Add", e, b.const(1.0)))
        x = b.op("Add", x, b.dense(g, f"blocks.{i}.fc2", 4 * d, d))
    y = b.op("Reshape", layer_norm(x, "ln_f"), b.const([batch * seq, d], np.int64))
    return b.model("input", [batch, seq, d], b.dense(y, "head", d, classes), [batch * seq, classes])


RECURRENT = dict(batch=16, seq=32, d=64, hidden=128, classes=10)


def _recurrent(rng, cell, batch, seq, d, hidden, classes):
    """An LSTM or GRU over a batch-first sequence, a linear head on its last step, as torch exports them.

    ONNX's gate order (LSTM i, o, f, c; GRU z, r, h), one direction, the
    GRU with ``linear_before_reset=1`` (torch's GRU); weights uniform in
    +-1/sqrt(hidden), as torch initializes them.
    """
    b = _Builder(rng)
    gates = 4 if cell == "LSTM" else 3
    bound = 1 / np.sqrt(hidden)

    def uniform(*shape):
        return rng.uniform(-bound, bound, shape)

    w = b.init("rnn.W", uniform(1, gates * hidden, d))
    r = b.init("rnn.R", uniform(1, gates * hidden, hidden))
    bias = b.init("rnn.B", uniform(1, 2 * gates * hidden))
    attrs = {"linear_before_reset": 1} if cell == "GRU" else {}
    # Zero initial states given, no sequence lengths: torch's export (ORT's LSTM gradient needs them).
    states = [b.const(np.zeros((1, batch, hidden)))] * (2 if cell == "LSTM" else 1)
    y = b.op(cell, b.op("Transpose", "input", perm=[1, 0, 2]), w, r, bias, "", *states, hidden_size=hidden,
             **attrs)
    last = b.op("Squeeze", b.op("Gather", y, b.const(seq - 1, np.int64), axis=0), b.const([0], np.int64))
    return b.model("input", [batch, seq, d], b.dense(last, "head", hidden, classes), [batch, classes])


def _float_batches(rng, shape, classes, n_labels):
    return [(rng.standard_normal(shape).astype(np.float32),
             rng.integers(0, classes, n_labels).astype(np.int64)) for _ in range(N_BATCHES)]


def build(name: str) -> Workload:
    """The workload ``name`` (W1-W9), with fixed weights and N_BATCHES batches."""
    rng = np.random.default_rng(int(name[1:]))
    desc = DESCRIPTIONS[name]
    if name in ("W1", "W2", "W5"):
        sizes, batch = {"W1": ((784, 500, 10), 64), "W2": ((1024, 2048, 2048, 10), 256),
                        "W5": ((20, 16, 5), 8)}[name]
        model = _mlp(rng, sizes, batch)
        return Workload(name, desc, model, [t.name for t in model.graph.initializer], [],
                        _float_batches(rng, (batch, sizes[0]), sizes[-1], batch), "mlp",
                        {"layers": len(sizes) - 1})
    if name == "W3":
        model = _lenet(rng, 64)
        return Workload(name, desc, model, [t.name for t in model.graph.initializer], [],
                        _float_batches(rng, (64, 1, 28, 28), 10, 64), "cnn")
    if name == "W4":
        cfg = TRANSFORMER
        model = _transformer(rng, **cfg)
        return Workload(name, desc, model, [t.name for t in model.graph.initializer], [],
                        _float_batches(rng, (cfg["batch"], cfg["seq"], cfg["d"]), cfg["classes"],
                                       cfg["batch"] * cfg["seq"]), "transformer", dict(cfg))
    if name == "W6":
        folder = ROOT / "tests" / "fixtures" / "models" / "resnet18"
        case = json.loads((folder / "case.json").read_text())
        with np.load(folder / "batches.npz") as f:
            xs, ys = f["train::input"], f["train::labels"]
        batches = [(xs[i % len(xs)], ys[i % len(ys)].astype(np.int64)) for i in range(N_BATCHES)]
        return Workload(name, desc, onnx.load(str(folder / "model.onnx")), case["requires_grad"],
                        case["frozen_params"], batches)
    if name == "W7":
        folder = ROOT / "benchmarks" / "models" / "w7_bert"
        case = json.loads((folder / "case.json").read_text())
        shape = tuple(case["input_shape"])
        batches = [(rng.integers(0, case["vocab"], shape).astype(np.int64),
                    rng.integers(0, case["classes"], shape[0]).astype(np.int64)) for _ in range(N_BATCHES)]
        return Workload(name, desc, onnx.load(str(folder / "model.onnx")), case["requires_grad"],
                        case["frozen_params"], batches)
    if name in ("W8", "W9"):
        cfg = RECURRENT
        cell = "LSTM" if name == "W8" else "GRU"
        model = _recurrent(rng, cell, **cfg)
        return Workload(name, desc, model, [t.name for t in model.graph.initializer], [],
                        _float_batches(rng, (cfg["batch"], cfg["seq"], cfg["d"]), cfg["classes"],
                                       cfg["batch"]), cell.lower(), dict(cfg))
    raise KeyError(name)


# The hand-written references: logits of W1-W4, W8 and W9 from the ONNX initializers' names.

def jax_logits(w: Workload):
    """A function (params, x) -> logits in jax.numpy, or None for W6/W7 (exported models)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def dense(p, x, name):
        return x @ p[f"{name}.weight"] + p[f"{name}.bias"]

    if w.kind == "mlp":
        n = w.config["layers"]

        def mlp(p, x):
            for i in range(1, n + 1):
                x = dense(p, x, f"fc{i}")
                x = jax.nn.relu(x) if i < n else x
            return x
        return mlp
    if w.kind == "cnn":
        def pool(x):
            return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

        def conv(p, x, name, pad):
            y = lax.conv_general_dilated(x, p[f"{name}.weight"], (1, 1), [(pad, pad)] * 2)
            return pool(jax.nn.relu(y + p[f"{name}.bias"][None, :, None, None]))

        def lenet(p, x):
            x = conv(p, conv(p, x, "conv1", 2), "conv2", 0).reshape(x.shape[0], -1)
            x = jax.nn.relu(dense(p, x, "fc1"))
            return dense(p, jax.nn.relu(dense(p, x, "fc2")), "fc3")
        return lenet
    if w.kind == "transformer":
        c = w.config
        bs, seq, d, heads = c["batch"], c["seq"], c["d"], c["heads"]
        causal = jnp.asarray(np.triu(np.full((seq, seq), -1e4, np.float32), 1))

        def ln(p, x, name):
            mean = x.mean(-1, keepdims=True)
            var = ((x - mean) ** 2).mean(-1, keepdims=True)
            return (x - mean) / jnp.sqrt(var + 1e-5) * p[f"{name}.weight"] + p[f"{name}.bias"]

        def split(t):
            return t.reshape(bs, seq, heads, d // heads).transpose(0, 2, 1, 3)

        def transformer(p, x):
            for i in range(c["blocks"]):
                h = ln(p, x, f"blocks.{i}.ln1")
                q, k, v = (split(dense(p, h, f"blocks.{i}.{n}")) for n in ("q", "k", "v"))
                s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads) + causal
                o = (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(bs, seq, d)
                x = x + dense(p, o, f"blocks.{i}.proj")
                h = dense(p, ln(p, x, f"blocks.{i}.ln2"), f"blocks.{i}.fc1")
                x = x + dense(p, jax.nn.gelu(h, approximate=False), f"blocks.{i}.fc2")
            return dense(p, ln(p, x, "ln_f").reshape(bs * seq, d), "head")
        return transformer
    if w.kind in ("lstm", "gru"):
        hs, lstm = w.config["hidden"], w.kind == "lstm"
        gates = 4 if lstm else 3

        def recurrent(p, x):
            wx, r, b = p["rnn.W"][0], p["rnn.R"][0], p["rnn.B"][0]
            xw = jnp.swapaxes(x @ wx.T + b[:gates * hs], 0, 1)  # (seq, batch, gates * hidden)
            h0 = jnp.zeros((x.shape[0], hs), x.dtype)

            def lstm_step(carry, xt):
                h, c = carry
                i, o, f, g = jnp.split(xt + h @ r.T + b[gates * hs:], 4, axis=-1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                return (jax.nn.sigmoid(o) * jnp.tanh(c), c), None

            def gru_step(h, xt):
                hr = h @ r.T + b[gates * hs:]
                z = jax.nn.sigmoid(xt[:, :hs] + hr[:, :hs])
                rt = jax.nn.sigmoid(xt[:, hs:2 * hs] + hr[:, hs:2 * hs])
                n = jnp.tanh(xt[:, 2 * hs:] + rt * hr[:, 2 * hs:])
                return (1 - z) * n + z * h, None

            if lstm:
                (h, _), _ = lax.scan(lstm_step, (h0, h0), xw)
            else:
                h, _ = lax.scan(gru_step, h0, xw)
            return dense(p, h, "head")
        return recurrent
    return None


def torch_logits(w: Workload):
    """A function (params, x) -> logits in torch, or None for W6/W7 (exported models)."""
    import torch
    import torch.nn.functional as F

    def dense(p, x, name):
        return x @ p[f"{name}.weight"] + p[f"{name}.bias"]

    if w.kind == "mlp":
        n = w.config["layers"]

        def mlp(p, x):
            for i in range(1, n + 1):
                x = dense(p, x, f"fc{i}")
                x = torch.relu(x) if i < n else x
            return x
        return mlp
    if w.kind == "cnn":
        def lenet(p, x):
            x = F.max_pool2d(torch.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"], padding=2)), 2)
            x = F.max_pool2d(torch.relu(F.conv2d(x, p["conv2.weight"], p["conv2.bias"])), 2)
            x = torch.relu(dense(p, x.flatten(1), "fc1"))
            return dense(p, torch.relu(dense(p, x, "fc2")), "fc3")
        return lenet
    if w.kind == "transformer":
        c = w.config
        bs, seq, d, heads = c["batch"], c["seq"], c["d"], c["heads"]
        causal = torch.triu(torch.full((seq, seq), -1e4), 1)

        def split(t):
            return t.reshape(bs, seq, heads, d // heads).transpose(1, 2)

        def transformer(p, x):
            for i in range(c["blocks"]):
                h = F.layer_norm(x, (d,), p[f"blocks.{i}.ln1.weight"], p[f"blocks.{i}.ln1.bias"], 1e-5)
                q, k, v = (split(dense(p, h, f"blocks.{i}.{n}")) for n in ("q", "k", "v"))
                s = q @ k.transpose(2, 3) / np.sqrt(d // heads) + causal
                o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(bs, seq, d)
                x = x + dense(p, o, f"blocks.{i}.proj")
                h = F.layer_norm(x, (d,), p[f"blocks.{i}.ln2.weight"], p[f"blocks.{i}.ln2.bias"], 1e-5)
                x = x + dense(p, F.gelu(dense(p, h, f"blocks.{i}.fc1")), f"blocks.{i}.fc2")
            y = F.layer_norm(x, (d,), p["ln_f.weight"], p["ln_f.bias"], 1e-5).reshape(bs * seq, d)
            return dense(p, y, "head")
        return transformer
    if w.kind in ("lstm", "gru"):
        hs, lstm = w.config["hidden"], w.kind == "lstm"
        gates = 4 if lstm else 3
        module = (torch.nn.LSTM if lstm else torch.nn.GRU)(w.config["d"], hs, batch_first=True)
        # ONNX's gate blocks (LSTM i, o, f, c; GRU z, r, h) in torch's order (i, f, c, o; r, z, h)
        order = [0, 2, 3, 1] if lstm else [1, 0, 2]

        def blocks(t):
            return torch.cat([t[k * hs:(k + 1) * hs] for k in order])

        def recurrent(p, x):
            b = p["rnn.B"][0]
            weights = {"weight_ih_l0": blocks(p["rnn.W"][0]), "weight_hh_l0": blocks(p["rnn.R"][0]),
                       "bias_ih_l0": blocks(b[:gates * hs]), "bias_hh_l0": blocks(b[gates * hs:])}
            y, _ = torch.func.functional_call(module, weights, (x,))
            return dense(p, y[:, -1], "head")
        return recurrent
    return None
