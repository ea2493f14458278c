"""ONNX subgraphs as exporters write them, and the checks every pattern test runs.

Each builder returns a ModelProto; ``check_against_unfused`` traces it with and
without fusion and compares values and gradients, ``check_finite_differences``
compares the fused graph's gradients with float64 central differences.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from onnx import helper

from jaxort.dtypes import to_onnx_type
from jaxort.graph._model import tensor_from_numpy
from jaxort.graph import JaxGraph, x64_enabled_scope

F16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)

# (values, gradients) tolerances, fused vs op-by-op: the fused rules compute
# statistics in float32 for float16/bfloat16 while the op-by-op path rounds every
# intermediate to the narrow type, so the narrow types differ by their rounding.
TOLERANCE = {F32: (2e-5, 1e-4), F64: (1e-12, 1e-10), F16: (1e-2, 3e-2), BF16: (6e-2, 1.5e-1)}


class Builder:
    """Nodes, inputs and initializers of one test model."""

    def __init__(self, dtype=F32):
        self.dtype = np.dtype(dtype)
        self.nodes, self.inputs, self.inits, self.count = [], [], [], 0

    def fresh(self, stem="t"):
        self.count += 1
        return f"{stem}{self.count}"

    def input(self, name, shape, dtype=None):
        elem = to_onnx_type(np.dtype(dtype or self.dtype))
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def init(self, name, value, dtype=None):
        self.inits.append(tensor_from_numpy(np.asarray(value, dtype or self.dtype), name))
        return name

    def const(self, value, dtype=None):
        name = self.fresh("c")
        array = np.asarray(value, dtype or self.dtype)
        self.nodes.append(helper.make_node("Constant", [], [name],
                                           value=tensor_from_numpy(array)))
        return name

    def op(self, op_type, *inputs, n_out=1, **attrs):
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=outs[0], **attrs))
        return outs[0] if n_out == 1 else outs

    def reduce(self, op_type, x, axes, opset):
        if opset >= (13 if op_type == "ReduceSum" else 18):
            return self.op(op_type, x, self.const(axes, np.int64), keepdims=1)
        return self.op(op_type, x, axes=list(axes), keepdims=1)

    def model(self, outputs, opset=17, domains=()):
        elem = to_onnx_type(self.dtype)
        outs = [helper.make_tensor_value_info(o, elem, None) for o in outputs]
        graph = helper.make_graph(self.nodes, "g", self.inputs, outs, initializer=self.inits)
        imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
        return helper.make_model(graph, opset_imports=imports)


def _float(x) -> bool:
    return np.dtype(x.dtype).kind == "f" or np.dtype(x.dtype) == BF16


def _scalar_of(graph, weights):
    """A scalar of all outputs with fixed random weights, as a function of (params, inputs)."""
    def f(params, *inputs):
        outs = graph.apply(params, *inputs)
        return sum(jnp.sum(o.astype(jnp.float32 if o.dtype != jnp.float64 else o.dtype) * w)
                   for o, w in zip(outs, weights) if _float(o))
    return f


def _grads(graph, params, inputs, weights):
    wrt = tuple(i for i, x in enumerate(inputs) if _float(x))
    fn = _scalar_of(graph, weights)

    def of_floats(params, floats):
        full = list(inputs)
        for i, v in zip(wrt, floats):
            full[i] = v
        return fn(params, *full)

    return jax.jit(jax.grad(of_floats, argnums=(0, 1)))(params, tuple(inputs[i] for i in wrt))


def _close(a, b, tol, what):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
    err = float(np.max(np.abs(a - b))) / scale if b.size else 0.0
    assert err <= tol, f"{what}: max error {err:.3g} (relative to {scale:.3g}) > {tol}"


def check_against_unfused(model, inputs, patterns, *, seed=0):
    """Fused and op-by-op traces of ``model`` agree on outputs and on all float gradients.

    Asserts the fused trace made exactly the groups ``patterns`` (pattern names,
    in order) and returns the fused graph.
    """
    fused, plain = JaxGraph(model, check=False), JaxGraph(model, check=False, fuse=False)
    assert [p for p, _ in fused.fusions] == list(patterns)
    assert plain.fusions == ()
    dtype = max((np.dtype(x.dtype) for x in inputs if _float(x)), key=lambda d: d.itemsize,
                default=F32)
    dtype = next((np.dtype(x.dtype) for x in inputs if _float(x)), dtype)
    vtol, gtol = TOLERANCE[dtype]
    outs_f = jax.jit(fused.apply)(fused.params, *inputs)
    outs_p = jax.jit(plain.apply)(plain.params, *inputs)
    for i, (a, b) in enumerate(zip(outs_f, outs_p)):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        _close(a, b, vtol, f"output {i}")
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(np.shape(o)).astype(np.float32 if o.dtype != jnp.float64
                                                      else np.float64) for o in outs_p]
    gf = _grads(fused, fused.params, inputs, weights)
    gp = _grads(plain, plain.params, inputs, weights)
    flat_f, flat_p = jax.tree.leaves(gf), jax.tree.leaves(gp)
    assert len(flat_f) == len(flat_p) and flat_f
    for i, (a, b) in enumerate(zip(flat_f, flat_p)):
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        _close(a, b, gtol, f"gradient {i}")
    return fused


def check_finite_differences(model, inputs, patterns, *, seed=0, directions=3, h=1e-6):
    """The fused float64 graph's gradients match central finite differences of its outputs."""
    with x64_enabled_scope():
        graph = JaxGraph(model, check=False)
        assert [p for p, _ in graph.fusions] == list(patterns)
        inputs = [jnp.asarray(x) for x in inputs]
        rng = np.random.default_rng(seed)
        outs = graph.apply(graph.params, *inputs)
        weights = [rng.standard_normal(np.shape(o)) for o in outs]
        fn = jax.jit(_scalar_of(graph, weights))
        grads = _grads(graph, graph.params, inputs, weights)
        params = {k: jnp.asarray(v) for k, v in graph.params.items()}
        wrt = [i for i, x in enumerate(inputs) if _float(x)]
        for _ in range(directions):
            dp = {k: rng.standard_normal(np.shape(v)) for k, v in params.items()}
            dx = {i: rng.standard_normal(np.shape(inputs[i])) for i in wrt}

            def at(t):
                p = {k: v + t * dp[k] for k, v in params.items()}
                xs = [x + t * dx[i] if i in dx else x for i, x in enumerate(inputs)]
                return float(fn(p, *xs))

            numeric = (at(h) - at(-h)) / (2 * h)
            analytic = sum(float(jnp.sum(grads[0][k] * dp[k])) for k in params)
            analytic += sum(float(jnp.sum(g * dx[i])) for g, i in zip(grads[1], wrt))
            assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), (numeric, analytic)
            # Forward mode gives the same directional derivative, and forward over
            # reverse (a Hessian-vector product) the op-by-op graph's.
            forward = float(_directional(fn, params, inputs, dp, dx))
            assert abs(forward - analytic) <= 1e-9 * max(1.0, abs(analytic)), (forward, analytic)
            hvp = _hvp(graph, weights, params, inputs, dp, dx)
            plain = JaxGraph(model, check=False, fuse=False)
            want = _hvp(plain, weights, params, inputs, dp, dx)
            for a, b in zip(jax.tree.leaves(hvp), jax.tree.leaves(want)):
                _close(a, b, 1e-8, "Hessian-vector product")


def _directional(fn, params, inputs, dp, dx):
    """d/dt fn(params + t dp, inputs + t dx) at 0, by forward mode (dx: float inputs by index)."""
    float_in = [i for i, x in enumerate(inputs) if _float(x)]

    def on_floats(params, floats):
        full = list(inputs)
        for i, v in zip(float_in, floats):
            full[i] = v
        return fn(params, *full)

    _, out = jax.jvp(on_floats, (params, tuple(inputs[i] for i in float_in)),
                     ({k: jnp.asarray(v) for k, v in dp.items()},
                      tuple(jnp.asarray(dx[i]) for i in float_in)))
    return out


def _hvp(graph, weights, params, inputs, dp, dx):
    """The Hessian of the weighted output sum times (dp, dx), forward over reverse."""
    fn = _scalar_of(graph, weights)
    float_in = [i for i, x in enumerate(inputs) if _float(x)]

    def grad_of(params, floats):
        def scalar(params, floats):
            full = list(inputs)
            for i, v in zip(float_in, floats):
                full[i] = v
            return fn(params, *full)
        return jax.grad(scalar, argnums=(0, 1))(params, floats)

    return jax.jvp(grad_of, (params, tuple(inputs[i] for i in float_in)),
                   ({k: jnp.asarray(v) for k, v in dp.items()},
                    tuple(jnp.asarray(dx[i]) for i in float_in)))[1]


def rand(rng, shape, dtype=F32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# --------------------------------------------------------------------------- subgraphs


def layer_norm_torch(b, x, scale, bias, axes=(-1,), eps=1e-5, opset=17, square="Pow"):
    """LayerNorm as torch.onnx writes it below opset 17."""
    mean = b.reduce("ReduceMean", x, axes, opset)
    d = b.op("Sub", x, mean)
    sq = b.op("Pow", d, b.const(2.0)) if square == "Pow" else b.op("Mul", d, d)
    var = b.reduce("ReduceMean", sq, axes, opset)
    std = b.op("Sqrt", b.op("Add", var, b.const(eps)))
    n = b.op("Div", d, std)
    if scale is not None:
        n = b.op("Mul", n, scale)
    return n if bias is None else b.op("Add", n, bias)


def layer_norm_keras(b, x, scale, bias, axes=(-1,), eps=1e-3, opset=17):
    """LayerNorm as tf2onnx writes Keras': squared difference, Reciprocal, scale folded in."""
    mean = b.reduce("ReduceMean", x, axes, opset)
    d = b.op("Sub", x, mean)
    var = b.reduce("ReduceMean", b.op("Mul", d, d), axes, opset)
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", b.const(eps), var)))
    n = b.op("Mul", d, b.op("Mul", inv, scale))
    return b.op("Add", bias, n)


def gelu_erf(b, x, order=0):
    """Gelu with Erf in one of three exporter orders."""
    if order == 0:  # torch: x * 0.5 * (1 + erf(x / sqrt 2)) as ((x * 0.5) * (erf + 1))
        e = b.op("Erf", b.op("Div", x, b.const(np.sqrt(2.0))))
        return b.op("Mul", b.op("Mul", x, b.const(0.5)), b.op("Add", e, b.const(1.0)))
    e = b.op("Erf", b.op("Mul", x, b.const(1 / np.sqrt(2.0))))
    u = b.op("Add", b.const(1.0), e)
    if order == 1:  # (x * u) * 0.5
        return b.op("Mul", b.op("Mul", x, u), b.const(0.5))
    return b.op("Mul", x, b.op("Mul", b.const(0.5), u))  # x * (0.5 * u)


def gelu_tanh(b, x, cube="Pow"):
    """Gelu's tanh approximation as GPT-2's exports write it."""
    x3 = b.op("Pow", x, b.const(3.0)) if cube == "Pow" else b.op("Mul", x, b.op("Mul", x, x))
    inner = b.op("Add", x, b.op("Mul", b.const(0.044715), x3))
    t = b.op("Tanh", b.op("Mul", b.const(np.sqrt(2 / np.pi)), inner))
    return b.op("Mul", b.op("Mul", b.const(0.5), x), b.op("Add", b.const(1.0), t))


def attention(b, q, kh, v, mask, dh, scale_op="Div", transpose=True):
    """softmax(Q K^T / sqrt(d) + mask) V with K given as [.., s, d] (transposed here)."""
    kt = b.op("Transpose", kh, perm=[0, 1, 3, 2]) if transpose else kh
    s = b.op("MatMul", q, kt)
    if scale_op == "Div":
        s = b.op("Div", s, b.const(np.sqrt(dh)))
    elif scale_op == "Mul":
        s = b.op("Mul", s, b.const(1 / np.sqrt(dh)))
    if mask is not None:
        s = b.op("Add", s, mask)
    return b.op("MatMul", b.op("Softmax", s, axis=-1), v)


def transformer(rng, *, blocks=2, batch=2, seq=8, d=16, heads=2, vocab=11, dtype=F32,
                with_loss=True, opset=17):
    """A pre-LN transformer written out op by op: LN, attention, Erf-Gelu MLP, residuals."""
    b = Builder(dtype)
    dh = d // heads
    x = b.input("x", [batch, seq, d])
    mask = b.input("mask", [1, 1, seq, seq])
    scale = 1 / np.sqrt(d)

    def w(name, *shape):
        return b.init(name, rng.standard_normal(shape) * (scale if len(shape) > 1 else 0.1))

    def heads_of(t):
        r = b.op("Reshape", t, b.const([batch, seq, heads, dh], np.int64))
        return b.op("Transpose", r, perm=[0, 2, 1, 3])

    for i in range(blocks):
        h = layer_norm_torch(b, x, w(f"ln1_{i}.w", d), w(f"ln1_{i}.b", d), opset=opset)
        q, k, v = (heads_of(b.op("Add", b.op("MatMul", h, w(f"{n}{i}.w", d, d)),
                                 w(f"{n}{i}.b", d))) for n in "qkv")
        o = attention(b, q, k, v, mask, dh)
        o = b.op("Reshape", b.op("Transpose", o, perm=[0, 2, 1, 3]),
                 b.const([batch, seq, d], np.int64))
        x = b.op("Add", x, b.op("Add", b.op("MatMul", o, w(f"o{i}.w", d, d)), w(f"o{i}.b", d)))
        h = layer_norm_torch(b, x, w(f"ln2_{i}.w", d), w(f"ln2_{i}.b", d), opset=opset)
        f = gelu_erf(b, b.op("Add", b.op("MatMul", h, w(f"f1_{i}.w", d, 4 * d)),
                             w(f"f1_{i}.b", 4 * d)))
        x = b.op("Add", x, b.op("Add", b.op("MatMul", f, w(f"f2_{i}.w", 4 * d, d)),
                                w(f"f2_{i}.b", d)))
    h = layer_norm_torch(b, x, w("lnf.w", d), w("lnf.b", d), opset=opset)
    logits = b.op("MatMul", h, w("head.w", d, vocab))
    if not with_loss:
        return b.model([logits], opset=opset)
    scores = b.op("Transpose", logits, perm=[0, 2, 1])
    b.input("labels", [batch, seq], np.int64)
    loss = b.op("SoftmaxCrossEntropyLoss", scores, "labels", reduction="mean")
    return b.model([loss], opset=opset)


def transformer_inputs(rng, *, batch=2, seq=8, d=16, vocab=11, dtype=F32, with_loss=True):
    causal = np.triu(np.full((seq, seq), -1e4), 1).reshape(1, 1, seq, seq).astype(dtype)
    inputs = [rand(rng, (batch, seq, d), dtype), causal]
    if with_loss:
        inputs.append(rng.integers(0, vocab, (batch, seq)).astype(np.int64))
    return inputs
