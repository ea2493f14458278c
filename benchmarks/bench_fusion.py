"""Fusion: forward and forward+backward time of each pattern's subgraph, fused vs op by op.

Each workload is an ONNX graph written out as exporters write it, traced twice
(``JaxGraph(model)`` and ``JaxGraph(model, fuse=False)``) and jitted. Rounds
alternate the two paths in one process; each round times STEPS calls. Prints a
markdown table of median ms per call and the speedup (op-by-op time / fused
time), the median of the per-round ratios, with its min-max over the rounds.
"""

from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from jaxort.graph import JaxGraph

ROUNDS = 7
STEPS = 20


class _Builder:
    def __init__(self):
        self.nodes, self.inputs, self.inits, self.n = [], [], [], 0

    def op(self, op_type, *inputs, **attrs):
        self.n += 1
        out = f"{op_type.lower()}{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=np.float32):
        self.n += 1
        name = f"c{self.n}"
        self.nodes.append(helper.make_node("Constant", [], [name],
                                           value=numpy_helper.from_array(np.asarray(value, dtype))))
        return name

    def input(self, name, shape, elem=TensorProto.FLOAT):
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def init(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def model(self, out):
        graph = helper.make_graph(self.nodes, "bench", self.inputs,
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                                  initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _layer_norm(b, x, w, bias):
    d = b.op("Sub", x, b.op("ReduceMean", x, axes=[-1]))
    var = b.op("ReduceMean", b.op("Pow", d, b.const(2.0)), axes=[-1])
    n = b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const(1e-5))))
    return b.op("Add", b.op("Mul", n, w), bias)


def _gelu(b, x):
    e = b.op("Erf", b.op("Div", x, b.const(np.sqrt(2.0))))
    return b.op("Mul", b.op("Mul", x, b.const(0.5)), b.op("Add", e, b.const(1.0)))


def _attention(b, q, k, v, mask, dh):
    s = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
    s = b.op("Add", b.op("Div", s, b.const(np.sqrt(dh))), mask)
    return b.op("MatMul", b.op("Softmax", s, axis=-1), v)


def _workloads(rng):
    batch, seq, d, heads = 16, 64, 128, 4
    dh = d // heads
    causal = np.triu(np.full((seq, seq), -1e4, np.float32), 1).reshape(1, 1, seq, seq)
    out = {}

    b = _Builder()
    x = b.input("x", [batch * seq, d])
    out["layer norm [1024, 128]"] = (b.model(_layer_norm(
        b, x, b.init("w", rng.standard_normal(d)), b.init("b", np.zeros(d)))),
        [rng.standard_normal((batch * seq, d)).astype(np.float32)])

    b = _Builder()
    x = b.input("x", [batch, heads, seq, seq])
    m = b.op("ReduceMax", x, axes=[-1])
    e = b.op("Exp", b.op("Sub", x, m))
    out["softmax written out [16, 4, 64, 64]"] = (
        b.model(b.op("Div", e, b.op("ReduceSum", e, b.const([-1], np.int64)))),
        [rng.standard_normal((batch, heads, seq, seq)).astype(np.float32)])

    b = _Builder()
    x = b.input("x", [batch * seq, 1000])
    b.input("labels", [batch * seq], TensorProto.INT64)
    out["softmax cross-entropy [1024, 1000]"] = (
        b.model(b.op("SoftmaxCrossEntropyLoss", x, "labels", reduction="mean")),
        [rng.standard_normal((batch * seq, 1000)).astype(np.float32),
         rng.integers(0, 1000, batch * seq).astype(np.int64)])

    b = _Builder()
    x = b.input("x", [batch * seq, 4 * d])
    h = b.op("Add", x, b.init("bias", rng.standard_normal(4 * d) * 0.1))
    out["Erf-Gelu + bias [1024, 512]"] = (b.model(_gelu(b, h)),
                                          [rng.standard_normal((batch * seq, 4 * d)).astype(np.float32)])

    b = _Builder()
    q, k, v = (b.input(n, [batch, heads, seq, dh]) for n in "qkv")
    mask = b.input("mask", [1, 1, seq, seq])
    out["attention [16, 4, 64, 32]"] = (
        b.model(_attention(b, q, k, v, mask, dh)),
        [rng.standard_normal((batch, heads, seq, dh)).astype(np.float32) for _ in range(3)]
        + [causal])

    out["2-block pre-LN transformer (d 128, seq 64, batch 16)"] = _transformer(
        rng, batch, seq, d, heads, causal)
    return out


def _transformer(rng, batch, seq, d, heads, causal):
    b = _Builder()
    x = b.input("x", [batch, seq, d])
    mask = b.input("mask", [1, 1, seq, seq])
    dh = d // heads

    def w(name, *shape):
        return b.init(name, rng.standard_normal(shape) / np.sqrt(shape[0]))

    def split(t):
        r = b.op("Reshape", t, b.const([batch, seq, heads, dh], np.int64))
        return b.op("Transpose", r, perm=[0, 2, 1, 3])

    for i in range(2):
        h = _layer_norm(b, x, b.init(f"ln1_{i}.w", np.ones(d)), b.init(f"ln1_{i}.b", np.zeros(d)))
        q, k, v = (split(b.op("Add", b.op("MatMul", h, w(f"{n}{i}.w", d, d)),
                              b.init(f"{n}{i}.b", np.zeros(d)))) for n in "qkv")
        o = b.op("Reshape", b.op("Transpose", _attention(b, q, k, v, mask, dh), perm=[0, 2, 1, 3]),
                 b.const([batch, seq, d], np.int64))
        x = b.op("Add", x, b.op("MatMul", o, w(f"o{i}.w", d, d)))
        h = _layer_norm(b, x, b.init(f"ln2_{i}.w", np.ones(d)), b.init(f"ln2_{i}.b", np.zeros(d)))
        f = _gelu(b, b.op("Add", b.op("MatMul", h, w(f"f1_{i}.w", d, 4 * d)),
                          b.init(f"f1_{i}.b", np.zeros(4 * d))))
        x = b.op("Add", x, b.op("MatMul", f, w(f"f2_{i}.w", 4 * d, d)))
    y = _layer_norm(b, x, b.init("lnf.w", np.ones(d)), b.init("lnf.b", np.zeros(d)))
    return b.model(y), [rng.standard_normal((batch, seq, d)).astype(np.float32), causal]


def _steps(graph, inputs):
    """Jitted forward and forward+backward (grads of params and float inputs) of one graph."""
    forward = jax.jit(lambda p, *xs: graph.apply(p, *xs)[0])
    floats = tuple(i for i, x in enumerate(inputs) if x.dtype.kind == "f")

    def loss(p, fl, xs):
        full = list(xs)
        for i, v in zip(floats, fl):
            full[i] = v
        return jnp.sum(graph.apply(p, *full)[0] * 1e-3)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    fl = tuple(inputs[i] for i in floats)
    return (lambda: forward(graph.params, *inputs),
            lambda: grad(graph.params, fl, tuple(inputs)))


def _time(fn) -> float:
    jax.block_until_ready(fn())
    start = time.perf_counter()
    for _ in range(STEPS):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / STEPS * 1e3


def main() -> int:
    rng = np.random.default_rng(0)
    rows = []
    for name, (model, inputs) in _workloads(rng).items():
        fused, plain = JaxGraph(model, check=False), JaxGraph(model, check=False, fuse=False)
        assert fused.fusions, f"{name}: nothing fused"
        for kind, index in (("forward", 0), ("forward+backward", 1)):
            f_step, p_step = _steps(fused, inputs)[index], _steps(plain, inputs)[index]
            f_ms, p_ms, ratios = [], [], []
            for r in range(ROUNDS):
                pair = [(_time, f_step, f_ms), (_time, p_step, p_ms)]
                for timer, step, sink in (pair if r % 2 == 0 else pair[::-1]):
                    sink.append(timer(step))
                ratios.append(p_ms[-1] / f_ms[-1])
            rows.append((name, kind, statistics.median(f_ms), statistics.median(p_ms),
                         statistics.median(ratios), min(ratios), max(ratios)))
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {ROUNDS} interleaved rounds of "
          f"{STEPS} calls; speedup = op-by-op ms / fused ms, median of per-round ratios "
          "(min-max)\n")
    print("| subgraph | pass | fused ms | op-by-op ms | speedup |")
    print("|---|---|---|---|---|")
    for name, kind, f, p, r, lo, hi in rows:
        print(f"| {name} | {kind} | {f:.2f} | {p:.2f} | {r:.2f} ({lo:.2f}-{hi:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
