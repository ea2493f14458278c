"""ONNX Runtime Training ops of jaxort/graph/ops/microsoft_training.py.

Each op is checked against ONNX Runtime Training 1.19.2's own outputs, recorded by
tools/make_training_op_fixtures.py in tests/fixtures/training_ops/ (see its
README), against numpy written from ORT's CPU kernels, and for gradients
against float64 central finite differences of those numpy references. ORT
1.19.2 has no CPU kernel for BiasDropout, BitmaskDropout and
BitmaskBiasDropout, so their bitmask is checked against the packing of ORT's
CUDA kernel, written in numpy from its test (GetExpectedOutput).
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import helper

from jaxort.errors import OpError
from jaxort.graph import JaxGraph, x64_enabled_scope

MS = "com.microsoft"

COVERED_OPS = {
    "ConcatTraining", "SplitTraining", "ReduceSumTraining", "LSTMTraining", "GRUTraining", "LSTMGrad", "GRUGrad",
    "BitmaskDropout", "BiasDropout", "BitmaskBiasDropout", "SoftmaxCrossEntropyLossInternal",
    "NegativeLogLikelihoodLossInternal", "SoftmaxCrossEntropy", "SparseSoftmaxCrossEntropy",
    # Gradient ops (what generate_artifacts writes where ORT's gradient builder does; FusedMatMul
    # is in test_microsoft_fused.py): ORT's outputs in the fixtures; the graphs they make are checked against jax.grad in
    # tests/training/test_gradient_graph.py.
    "ConvGrad", "BatchNormalizationGrad", "ReluGrad", "LeakyReluGrad", "SigmoidGrad", "QuickGeluGrad", "SoftmaxCrossEntropyLossGrad", "Scale",
    "TanhGrad", "SoftmaxGrad_13", "LogSoftmaxGrad_13", "LayerNormalizationGrad", "GatherGrad", "SliceGrad",
    "GatherNDGrad",
}
_FIXTURES = pathlib.Path(__file__).parents[2] / "fixtures" / "training_ops"
_ORT = np.load(_FIXTURES / "ops.npz")
_CASES = json.loads((_FIXTURES / "cases.json").read_text())


# Integer inputs that decide output shapes: initializers, so they stay static under jit.
_SHAPE_INPUTS = ("split", "axes", "shape", "starts", "ends", "steps")


def _graph(op, inputs, outputs, attrs=None, *, domain=MS, opset=17, constants=_SHAPE_INPUTS):
    """A one-node model; ``inputs`` maps names to arrays (None: an absent optional input).

    Inputs named in ``constants`` become initializers (static values); the others
    are positional graph inputs, in order.
    """
    present = {k: v for k, v in inputs.items() if v is not None}
    node = helper.make_node(op, [k if inputs[k] is not None else "" for k in inputs], outputs,
                            domain=domain, **(attrs or {}))
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in present.items() if k not in constants],
        [onnx.ValueInfoProto(name=o) for o in outputs],
        [onnx.numpy_helper.from_array(present[k], k) for k in constants if k in present])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(MS, 1)])
    g = JaxGraph(model, params=[], check=False)
    args = [present[i.name] for i in g.inputs]
    return g, args


def _run(op, inputs, outputs, attrs=None, **kw):
    g, args = _graph(op, inputs, outputs, attrs, **kw)
    return [np.asarray(v) for v in g.apply(g.params, *args)]


def _case(name):
    m = _CASES[name]
    ins = {k: (_ORT[f"{name}/in/{k}"] if f"{name}/in/{k}" in _ORT else None) for k in m["inputs"]}
    return m, ins, [_ORT[f"{name}/out/{o}"] for o in m["outputs"]]


def _close(got, want, rtol=1e-5, atol=1e-6):
    # int64 values come back as JAX's canonical integer (int32 when 64-bit mode is off)
    assert got.dtype == jax.dtypes.canonicalize_dtype(want.dtype), (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# For reduction "none", ORT 1.19.2's CPU kernels return one number where the
# schema's shape inference (and jaxort) give the per-sample loss:
# SparseSoftmaxCrossEntropy the sum, SoftmaxCrossEntropy minus the sum.
_ORT_SUMS_NONE = {"softmax_cross_entropy_none": -1.0, "sparse_softmax_cross_entropy_none": 1.0}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_matches_onnxruntime_training(name):
    m, ins, want = _case(name)
    got = _run(m["op"], ins, m["outputs"], m["attributes"], domain=m["domain"], opset=m["opset"])
    assert len(got) >= len(want)
    for o, g, w in zip(m["outputs"], got, want):
        if name in _ORT_SUMS_NONE and o == "loss":
            assert w.shape == () and g.shape == ins["label"].shape[:ins["label"].ndim - (
                m["op"] == "SoftmaxCrossEntropy")]
            np.testing.assert_allclose(_ORT_SUMS_NONE[name] * g.sum(), w, rtol=1e-5)
        else:
            _close(g, w)


@pytest.mark.parametrize("name", ["concat_training", "split_training", "lstm_training",
                                  "gru_training_linear_before_reset", "sce_loss_internal",
                                  "nll_loss_internal", "sparse_softmax_cross_entropy"])
def test_jit_equals_eager(name):
    m, ins, _ = _case(name)
    g, args = _graph(m["op"], ins, m["outputs"], m["attributes"], domain=m["domain"],
                     opset=m["opset"])
    eager = g.apply(g.params, *args)
    jitted = jax.jit(g.apply)(g.params, *args)
    for e, j in zip(eager, jitted):
        np.testing.assert_allclose(np.asarray(j), np.asarray(e), rtol=1e-6, atol=1e-7)


# ---- numpy references, written from ORT's CPU kernels ----

def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _np_lstm(x, w, r, b=None, h0=None, c0=None, p=None):
    """ORT's LSTMTraining (forward, one direction): HAll, Ht, Ct, CAll, IOFC (activated)."""
    seq, batch, _ = x.shape
    hs = r.shape[-1]
    w, r = w[0], r[0]
    bias = np.zeros(4 * hs) if b is None else b[0, :4 * hs] + b[0, 4 * hs:]
    p = np.zeros(3 * hs) if p is None else p[0]
    h = np.zeros((batch, hs)) if h0 is None else h0[0]
    c = np.zeros((batch, hs)) if c0 is None else c0[0]
    hall, call, iofc = [], [], []
    for t in range(seq):
        z = x[t] @ w.T + h @ r.T + bias
        i = _sigmoid(z[:, :hs] + p[:hs] * c)
        f = _sigmoid(z[:, 2 * hs:3 * hs] + p[2 * hs:] * c)
        cc = np.tanh(z[:, 3 * hs:])
        c = f * c + i * cc
        o = _sigmoid(z[:, hs:2 * hs] + p[hs:2 * hs] * c)
        h = o * np.tanh(c)
        hall.append(h)
        call.append(c)
        iofc.append(np.concatenate([i, o, f, cc], -1))
    stack = lambda v: np.stack(v)[:, None]  # noqa: E731
    return stack(hall), h[None], c[None], stack(call), stack(iofc)


def _np_gru(x, w, r, b=None, h0=None, linear_before_reset=0):
    """ORT's GRUTraining (forward, one direction): HAll, Ht, ZRH (activated)."""
    seq, batch, _ = x.shape
    hs = r.shape[-1]
    w, r = w[0], r[0]
    wb = np.zeros(3 * hs) if b is None else b[0, :3 * hs]
    rb = np.zeros(3 * hs) if b is None else b[0, 3 * hs:]
    h = np.zeros((batch, hs)) if h0 is None else h0[0]
    hall, zrh = [], []
    for t in range(seq):
        xw = x[t] @ w.T + wb
        z = _sigmoid(xw[:, :hs] + h @ r[:hs].T + rb[:hs])
        rt = _sigmoid(xw[:, hs:2 * hs] + h @ r[hs:2 * hs].T + rb[hs:2 * hs])
        if linear_before_reset:
            hh = np.tanh(xw[:, 2 * hs:] + rt * (h @ r[2 * hs:].T + rb[2 * hs:]))
        else:
            hh = np.tanh(xw[:, 2 * hs:] + (rt * h) @ r[2 * hs:].T + rb[2 * hs:])
        h = (1 - z) * hh + z * h
        hall.append(h)
        zrh.append(np.concatenate([z, rt, hh], -1))
    return np.stack(hall)[:, None], h[None], np.stack(zrh)[:, None]


def _np_log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def _np_sce_loss(scores, labels, weights, ignore_index, reduction):
    """SoftmaxCrossEntropyLossInternal: classes on axis 1; mean divides by the kept weights."""
    lp = _np_log_softmax(scores, 1)
    picked = -np.take_along_axis(lp, np.clip(labels, 0, None)[:, None], 1)[:, 0]
    w = np.ones(labels.shape) if weights is None else weights[np.clip(labels, 0, None)]
    if ignore_index is not None:
        w = w * (labels != ignore_index)
    loss = picked * w
    if reduction == "none":
        return loss, lp
    return (loss.sum() if reduction == "sum" else loss.sum() / w.sum()), lp


def _np_pack(mask):
    """ORT's bitmask (its CUDA test's GetExpectedOutput): bit i % 32 of word i // 32."""
    flat = np.ravel(mask)
    words = np.zeros(-(-flat.size // 32), np.uint32)
    for i in np.flatnonzero(flat):
        words[i // 32] |= np.uint32(1 << (i % 32))
    return words


def test_lstm_training_matches_numpy():
    m, ins, _ = _case("lstm_training")
    got = _run(m["op"], ins, m["outputs"], m["attributes"])
    want = _np_lstm(*(ins[k].astype(np.float64) for k in ("x", "w", "r", "b")),
                    ins["initial_h"], ins["initial_c"], ins["p"])
    for g, w in zip(got, want):
        _close(g, w.astype(np.float32), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_training_matches_numpy(lbr):
    name = "gru_training_linear_before_reset" if lbr else "gru_training"
    m, ins, _ = _case(name)
    got = _run(m["op"], ins, m["outputs"], m["attributes"])
    h0 = ins.get("initial_h")
    want = _np_gru(*(ins[k].astype(np.float64) for k in ("x", "w", "r", "b")), h0,
                   linear_before_reset=lbr)
    for g, w in zip(got, want):
        _close(g, w.astype(np.float32), rtol=2e-5, atol=2e-6)


def test_concat_split_reduce_sum_training_match_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 1)).astype(
        np.float32)
    y, lengths = _run("ConcatTraining", {"a": a, "b": b}, ["y", "l"], {"axis": -1})
    _close(y, np.concatenate([a, b], -1))
    assert lengths.dtype == jax.dtypes.canonicalize_dtype(np.int64) and lengths.tolist() == [3, 1]
    x = rng.standard_normal((4, 6)).astype(np.float32)
    parts = _run("SplitTraining", {"x": x, "s": np.array([1, 5], np.int64)}, ["p", "q"],
                 {"axis": 1}, constants=("s",))
    for got, want in zip(parts, np.split(x, [1], axis=1)):
        _close(got, want)
    parts = _run("SplitTraining", {"x": x, "s": np.zeros(0, np.int64)}, ["p", "q"], {},
                 constants=("s",))  # axis defaults to 0
    for got, want in zip(parts, np.split(x, 2, axis=0)):
        _close(got, want)
    (s,) = _run("ReduceSumTraining", {"x": x, "ax": np.array([1], np.int64)}, ["y"],
                constants=("ax",))  # keepdims defaults to 1
    _close(s, x.sum(1, keepdims=True))


def test_split_training_refuses_uneven_empty_split():
    x = np.zeros((2, 7), np.float32)
    with pytest.raises(OpError, match="evenly"):
        _run("SplitTraining", {"x": x, "s": np.zeros(0, np.int64)}, ["p", "q", "r"],
             {"axis": 1}, constants=("s",))


def test_lstm_training_refuses_sequence_lens():
    m, ins, _ = _case("lstm_training")
    ins = dict(ins, sequence_lens=np.full(3, 5, np.int32))
    with pytest.raises(OpError, match="sequence_lens"):
        _run(m["op"], ins, m["outputs"], m["attributes"])


@pytest.mark.parametrize("weighted,ignore,reduction", [
    (True, 2, "mean"), (False, None, "sum"), (True, 0, "none")])
def test_loss_internal_ops_match_numpy(weighted, ignore, reduction):
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((7, 4)).astype(np.float32)
    labels = np.array([0, 2, 3, 2, 1, 0, 3], np.int64)
    weights = np.array([0.5, 1.0, 2.0, 1.5], np.float32) if weighted else None
    ii = None if ignore is None else np.array(ignore, np.int64)
    want_loss, want_lp = _np_sce_loss(scores.astype(np.float64), labels, weights, ignore,
                                      reduction)
    loss, lp = _run("SoftmaxCrossEntropyLossInternal",
                    {"s": scores, "l": labels, "w": weights, "i": ii}, ["y", "lp"],
                    {"reduction": reduction})
    _close(loss, np.float32(want_loss) if reduction != "none" else want_loss.astype(np.float32))
    _close(lp, want_lp.astype(np.float32))
    (nll,) = _run("NegativeLogLikelihoodLossInternal",
                  {"s": want_lp.astype(np.float32), "l": labels, "w": weights, "i": ii}, ["y"],
                  {"reduction": reduction})
    _close(nll, loss)


def test_old_softmax_cross_entropy_ops_match_numpy():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((3, 5, 4)).astype(np.float32)
    soft = rng.dirichlet(np.ones(4), (3, 5)).astype(np.float32)
    lp = _np_log_softmax(logits.astype(np.float64), -1)
    loss, got_lp = _run("SoftmaxCrossEntropy", {"x": logits, "t": soft}, ["y", "lp"])
    _close(loss, np.float32(-(soft * lp).sum(-1).mean()))
    _close(got_lp, lp.astype(np.float32))
    (none,) = _run("SoftmaxCrossEntropy", {"x": logits, "t": soft}, ["y"], {"reduction": "none"})
    _close(none, (-(soft * lp).sum(-1)).astype(np.float32))
    labels = rng.integers(0, 4, (3, 5))
    w = rng.random((3, 5)).astype(np.float32)
    picked = -np.take_along_axis(lp, labels[..., None], -1)[..., 0]
    loss, _ = _run("SparseSoftmaxCrossEntropy", {"x": logits, "t": labels, "w": w}, ["y", "lp"],
                   domain="", opset=12)
    _close(loss, np.float32((picked * w).sum() / w.sum()))
    (total,) = _run("SparseSoftmaxCrossEntropy", {"x": logits, "t": labels}, ["y"],
                    {"reduction": "sum"}, domain="", opset=12)
    _close(total, np.float32(picked.sum()))


# ---- the Dropout family ----

_DROPOUTS = {
    "BitmaskDropout": lambda x, b, r, ratio, tm: {"x": x, "ratio": ratio, "tm": tm},
    "BiasDropout": lambda x, b, r, ratio, tm: {"x": x, "b": b, "r": r, "ratio": ratio, "tm": tm},
    "BitmaskBiasDropout": lambda x, b, r, ratio, tm: {"x": x, "b": b, "r": r, "ratio": ratio,
                                                      "tm": tm},
}


def _dropout_inputs(op, n=1000, ratio=0.3, training_mode=True):
    rng = np.random.default_rng(5)
    x = rng.uniform(0.5, 1.5, (n // 10, 10)).astype(np.float32)
    b = rng.uniform(0.5, 1.0, 10).astype(np.float32)
    res = rng.standard_normal((n // 10, 10)).astype(np.float32)
    return x, b, res, _DROPOUTS[op](x, b, res, np.array(ratio, np.float32),
                                    np.array(training_mode))


def _dropout_run(op, inputs, *, training, seed=0, constants=("ratio", "tm")):
    # Outside a training step no key is given (as in an eval step): a key makes
    # a dropout with training_mode true draw there too, as ORT's kernels do.
    g, args = _graph(op, inputs, ["y", "mask"], {"seed": 42}, constants=constants)
    out = g.apply(g.params, *args, training=training,
                  rng=jax.random.key(seed) if training else None)
    return [np.asarray(v) for v in out]


@pytest.mark.parametrize("op", sorted(_DROPOUTS))
def test_dropout_training_mask_and_output_agree(op):
    ratio = 0.3
    x, b, res, inputs = _dropout_inputs(op, n=1000, ratio=ratio)
    y, mask = _dropout_run(op, inputs, training=True)
    pre = x + b if "Bias" in op else x
    residual = res if "Bias" in op else 0
    kept = (y - residual) != 0  # every input is > 0, so a kept element is never 0
    np.testing.assert_allclose(y, np.where(kept, pre / np.float32(1 - ratio), 0) + residual,
                               rtol=1e-6, atol=1e-6)
    if op.startswith("Bitmask"):
        assert mask.dtype == np.uint32 and mask.shape == (-(-x.size // 32),)
        np.testing.assert_array_equal(mask, _np_pack(kept))
    else:
        assert mask.dtype == np.bool_ and mask.shape == x.shape
        np.testing.assert_array_equal(mask, kept)
    # 1000 Bernoulli(0.7) draws: the kept fraction is within 5 sigma (0.072) of 0.7
    assert abs(kept.mean() - (1 - ratio)) < 0.073
    y2, _ = _dropout_run(op, inputs, training=True, seed=1)
    assert not np.array_equal(y, y2)


def test_dropout_statistics_over_many_elements():
    x, _, _, inputs = _dropout_inputs("BitmaskDropout", n=20000, ratio=0.8)
    y, mask = _dropout_run("BitmaskDropout", inputs, training=True)
    kept = y != 0
    assert abs(kept.mean() - 0.2) < 5 * np.sqrt(0.2 * 0.8 / kept.size)
    # the 1/(1-ratio) scale keeps the mean (5 standard errors)
    assert abs(y.mean() - x.mean()) < 5 * np.sqrt(y.var() / y.size)
    unpacked = (mask[np.arange(x.size) // 32] >> (np.arange(x.size) % 32).astype(np.uint32)) & 1
    np.testing.assert_array_equal(unpacked.astype(bool), kept.ravel())


def test_bitmask_padding_bits_are_zero_in_training():
    _, _, _, inputs = _dropout_inputs("BitmaskDropout", n=70, ratio=0.0001)
    y, mask = _dropout_run("BitmaskDropout", inputs, training=True)
    assert mask.shape == (3,)
    assert mask[2] >> 6 == 0  # 70 elements: bits 6..31 of the last word are padding


@pytest.mark.parametrize("op", sorted(_DROPOUTS))
@pytest.mark.parametrize("mode", ["training_mode_false", "ratio_zero", "eval_step",
                                  "no_training_mode"])
def test_dropout_identity_cases_exactly(op, mode):
    x, b, res, inputs = _dropout_inputs(op, n=70, ratio=0.0 if mode == "ratio_zero" else 0.5,
                                        training_mode=mode != "training_mode_false")
    if mode == "no_training_mode":
        inputs["tm"] = None
    y, mask = _dropout_run(op, inputs, training=mode != "eval_step",
                           constants=tuple(k for k in ("ratio", "tm") if inputs[k] is not None))
    want = (x + b + res) if "Bias" in op else x
    np.testing.assert_array_equal(y, want)
    if op.startswith("Bitmask"):
        # ORT's inference branch sets every bit, padding included
        np.testing.assert_array_equal(mask, np.full(3, 0xFFFFFFFF, np.uint32))
    else:
        assert mask.dtype == np.bool_ and mask.all()


def test_bitmask_dropout_traced_training_mode():
    x, _, _, inputs = _dropout_inputs("BitmaskDropout", n=70, ratio=0.5)
    g, _ = _graph("BitmaskDropout", inputs, ["y", "mask"], constants=("ratio",))
    step = jax.jit(lambda flag: g.apply(g.params, x, flag, training=True,
                                        rng=jax.random.key(0)))
    y_off, m_off = step(np.array(False))
    np.testing.assert_array_equal(np.asarray(y_off), x)
    np.testing.assert_array_equal(np.asarray(m_off), np.full(3, 0xFFFFFFFF, np.uint32))
    y_on, m_on = map(np.asarray, step(np.array(True)))
    np.testing.assert_array_equal(m_on, _np_pack(y_on != 0))
    assert 0 < (y_on != 0).mean() < 1


# ---- gradients against float64 central finite differences of the numpy references ----

def _fd_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[idx] = eps
        g[idx] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


def _jax_grads(op, inputs, outputs, attrs, wrt, cotangents, **kw):
    """Gradients of sum_k <cotangent_k, output_k> with respect to the inputs named in wrt."""
    with x64_enabled_scope():
        g, args = _graph(op, inputs, outputs, attrs, **kw)
        names = [i.name for i in g.inputs]

        def scalar(*diff):
            full = list(args)
            for n, v in zip(wrt, diff):
                full[names.index(n)] = v
            outs = g.apply(g.params, *full)
            return sum(jnp.sum(o * c) for o, c in zip(outs, cotangents) if c is not None)

        grads = jax.grad(scalar, argnums=tuple(range(len(wrt))))(*(inputs[n] for n in wrt))
        return [np.asarray(v) for v in grads]


def _rnn_weights(rng, seq, batch, inp, hs, gates):
    """X, W, R and B of a one-direction LSTM (4 gates) or GRU (3 gates), drawn in that order."""
    return {"x": rng.standard_normal((seq, batch, inp)), "w": rng.standard_normal((1, gates * hs, inp)) * .5,
            "r": rng.standard_normal((1, gates * hs, hs)) * .5, "b": rng.standard_normal((1, 2 * gates * hs)) * .3}


def _cotangents(shapes, seed=9):
    rng = np.random.default_rng(seed)
    return [None if s is None else rng.standard_normal(s) for s in shapes]


def _weighted_output_sum(fn, ins, order, cots):
    """name -> f(v): sum_k <cots[k], fn(...)[k]> with the input ``name`` replaced by v."""
    def loss(name):
        def f(v):
            outs = fn(*(v if k == name else ins[k] for k in order))
            return sum(np.sum(o * c) for o, c in zip(outs, cots))
        return f
    return loss


def test_lstm_training_gradients_match_finite_differences():
    rng = np.random.default_rng(11)
    seq, batch, inp, hs = 3, 2, 3, 2
    ins = {**_rnn_weights(rng, seq, batch, inp, hs, 4), "sl": None, "h0": rng.standard_normal((1, batch, hs)),
           "c0": rng.standard_normal((1, batch, hs)), "p": rng.standard_normal((1, 3 * hs)) * .3}
    shapes = [(seq, 1, batch, hs), (1, batch, hs), (1, batch, hs), (seq, 1, batch, hs),
              (seq, 1, batch, 4 * hs)]
    cots = _cotangents(shapes)
    wrt = ["x", "w", "r", "b", "h0", "c0", "p"]
    got = _jax_grads("LSTMTraining", ins, ["a", "b_", "c", "d", "e"], {"hidden_size": hs}, wrt,
                     cots)
    order = ["x", "w", "r", "b", "h0", "c0", "p"]

    loss = _weighted_output_sum(_np_lstm, ins, order, cots)

    for name, g in zip(wrt, got):
        np.testing.assert_allclose(g, _fd_grad(loss(name), ins[name]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_training_gradients_match_finite_differences(lbr):
    rng = np.random.default_rng(12)
    seq, batch, inp, hs = 3, 2, 3, 2
    ins = {**_rnn_weights(rng, seq, batch, inp, hs, 3), "sl": None, "h0": rng.standard_normal((1, batch, hs))}
    cots = _cotangents([(seq, 1, batch, hs), (1, batch, hs), (seq, 1, batch, 3 * hs)])
    wrt = ["x", "w", "r", "b", "h0"]
    got = _jax_grads("GRUTraining", ins, ["a", "b_", "c"],
                     {"hidden_size": hs, "linear_before_reset": lbr}, wrt, cots)

    loss = _weighted_output_sum(lambda *a: _np_gru(*a, lbr), ins, ["x", "w", "r", "b", "h0"], cots)

    for name, g in zip(wrt, got):
        np.testing.assert_allclose(g, _fd_grad(loss(name), ins[name]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("with_states", [False, True])
def test_lstm_grad_matches_finite_differences(with_states):
    # LSTMGrad from the saved values numpy's LSTM computes, against central differences of
    # the same numpy LSTM (cotangents on Y, Y_h and Y_c, as ORT's gradient builder feeds).
    rng = np.random.default_rng(13)
    seq, batch, inp, hs = 4, 2, 3, 2
    ins = {**_rnn_weights(rng, seq, batch, inp, hs, 4),
           "h0": rng.standard_normal((1, batch, hs)) if with_states else None,
           "c0": rng.standard_normal((1, batch, hs)) if with_states else None}
    order = ["x", "w", "r", "b", "h0", "c0"]
    hall, ht, ct, call, iofc = _np_lstm(*(ins[k] for k in order))
    cots = _cotangents([hall.shape, ht.shape, ct.shape], seed=14)
    feeds = {"x": ins["x"], "w": ins["w"], "r": ins["r"], "sl": None, "h0": ins["h0"], "c0": ins["c0"],
             "hall": hall, "call": call, "iofc": iofc, "dy": cots[0], "dyh": cots[1], "dyc": cots[2]}
    with x64_enabled_scope():
        got = _run("LSTMGrad", feeds, ["dx", "dw", "dr", "db", "dh0", "dc0", "dp"], {"hidden_size": hs})

    loss = _weighted_output_sum(_np_lstm, ins, order, cots)

    for name, g in zip(order, got):
        if ins[name] is not None:
            np.testing.assert_allclose(g, _fd_grad(loss(name), ins[name]), rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_grad_matches_finite_differences(lbr):
    rng = np.random.default_rng(15)
    seq, batch, inp, hs = 4, 2, 3, 2
    ins = {**_rnn_weights(rng, seq, batch, inp, hs, 3), "h0": rng.standard_normal((1, batch, hs))}
    hall, ht, zrh = _np_gru(ins["x"], ins["w"], ins["r"], ins["b"], ins["h0"], lbr)
    cots = _cotangents([hall.shape, ht.shape], seed=16)
    feeds = {"x": ins["x"], "w": ins["w"], "r": ins["r"], "b": ins["b"], "sl": None, "h0": ins["h0"],
             "hall": hall, "zrh": zrh, "dy": cots[0], "dyh": cots[1]}
    with x64_enabled_scope():
        got = _run("GRUGrad", feeds, ["dx", "dw", "dr", "db", "dh0"],
                   {"hidden_size": hs, "linear_before_reset": lbr})

    loss = _weighted_output_sum(lambda *a: _np_gru(*a, lbr), ins, ["x", "w", "r", "b", "h0"], cots)

    for name, g in zip(["x", "w", "r", "b", "h0"], got):
        np.testing.assert_allclose(g, _fd_grad(loss(name), ins[name]), rtol=1e-5, atol=1e-7, err_msg=name)


def test_loss_gradients_match_finite_differences():
    rng = np.random.default_rng(13)
    scores = rng.standard_normal((5, 4))
    labels = np.array([0, 2, 3, 2, 1])
    weights = np.array([0.5, 1.0, 2.0, 1.5])
    ii = np.array(2, np.int64)
    cots = _cotangents([(), (5, 4)])
    (got,) = _jax_grads("SoftmaxCrossEntropyLossInternal",
                        {"s": scores, "l": labels, "w": weights, "i": ii}, ["y", "lp"], {},
                        ["s"], cots)

    def sce(s):
        loss, lp = _np_sce_loss(s, labels, weights, 2, "mean")
        return loss * cots[0] + np.sum(lp * cots[1])
    np.testing.assert_allclose(got, _fd_grad(sce, scores), rtol=1e-6, atol=1e-8)

    lp0 = _np_log_softmax(scores, 1)
    (got,) = _jax_grads("NegativeLogLikelihoodLossInternal",
                        {"s": lp0, "l": labels, "w": weights, "i": ii}, ["y"],
                        {"reduction": "sum"}, ["s"], [np.array(1.3)])
    kept = labels != 2

    def nll_sum(v):
        return 1.3 * -np.sum(v[np.arange(5), labels] * weights[labels] * kept)
    np.testing.assert_allclose(got, _fd_grad(nll_sum, lp0), rtol=1e-6, atol=1e-8)

    soft = rng.dirichlet(np.ones(4), 5)
    (got,) = _jax_grads("SoftmaxCrossEntropy", {"s": scores, "t": soft}, ["y", "lp"], {}, ["s"],
                        cots)
    np.testing.assert_allclose(
        got, _fd_grad(lambda v: cots[0] * -(soft * _np_log_softmax(v, -1)).sum(-1).mean()
                      + np.sum(_np_log_softmax(v, -1) * cots[1]), scores), rtol=1e-6, atol=1e-8)

    w = rng.random(5)
    (got,) = _jax_grads("SparseSoftmaxCrossEntropy", {"s": scores, "t": labels, "w": w}, ["y"],
                        {}, ["s"], [np.array(0.7)], domain="", opset=12)

    def sparse(v):
        picked = -_np_log_softmax(v, -1)[np.arange(5), labels]
        return 0.7 * (picked * w).sum() / w.sum()
    np.testing.assert_allclose(got, _fd_grad(sparse, scores), rtol=1e-6, atol=1e-8)


def test_concat_reduce_sum_and_bias_dropout_gradients():
    rng = np.random.default_rng(14)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 2))
    cot = _cotangents([(2, 5)])
    ga, gb = _jax_grads("ConcatTraining", {"a": a, "b": b}, ["y"], {"axis": 1}, ["a", "b"], cot)
    np.testing.assert_allclose(ga, _fd_grad(lambda v: np.sum(np.concatenate([v, b], 1) * cot[0]), a),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, _fd_grad(lambda v: np.sum(np.concatenate([a, v], 1) * cot[0]), b),
                               rtol=1e-6, atol=1e-8)
    x = rng.standard_normal((3, 4))
    cot = _cotangents([(1, 4)])
    (gx,) = _jax_grads("ReduceSumTraining", {"x": x, "ax": np.array([0], np.int64)}, ["y"], {},
                       ["x"], cot, constants=("ax",))
    np.testing.assert_allclose(gx, _fd_grad(lambda v: np.sum(v.sum(0, keepdims=True) * cot[0]), x),
                               rtol=1e-6, atol=1e-8)
    bias, res = rng.standard_normal(4), rng.standard_normal((3, 4))
    cot = _cotangents([(3, 4)])
    gx, gb, gr = _jax_grads("BiasDropout", {"x": x, "b": bias, "r": res}, ["y"], {},
                            ["x", "b", "r"], cot)

    def bd(xv, bv, rv):
        return np.sum((xv + bv + rv) * cot[0])
    np.testing.assert_allclose(gx, _fd_grad(lambda v: bd(v, bias, res), x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, _fd_grad(lambda v: bd(x, v, res), bias), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gr, _fd_grad(lambda v: bd(x, bias, v), res), rtol=1e-6, atol=1e-8)


def test_dropout_training_gradient_is_mask_over_keep_probability():
    x, _, _, inputs = _dropout_inputs("BitmaskDropout", n=200, ratio=0.25)
    g, _ = _graph("BitmaskDropout", inputs, ["y", "mask"], constants=("ratio", "tm"))
    key = jax.random.key(3)
    y = np.asarray(g.apply(g.params, x, training=True, rng=key)[0])
    grad = jax.grad(lambda v: jnp.sum(g.apply(g.params, v, training=True, rng=key)[0]))(x)
    np.testing.assert_allclose(np.asarray(grad), np.where(y != 0, 1 / 0.75, 0), rtol=1e-6)


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_unread_training_outputs_cost_no_memory(cell):
    """LSTMTraining and GRUTraining return every gate, which only ORT's gradient ops read.

    jaxort differentiates the forward itself, so a train step reads only the
    hidden states: the compiled forward and gradient of such a loss must take
    no more temporary memory with the gate outputs than without them (the
    plain ONNX op), i.e. the unread outputs are dropped from the recurrence.
    """
    from jaxort.graph.ops import rnn

    seq, batch, inp, hs = 16, 4, 8, 32
    ins = _rnn_weights(np.random.default_rng(0), seq, batch, inp, hs, 4 if cell == "LSTM" else 3)
    x, w, r = (jnp.asarray(ins[k], jnp.float32) for k in ("x", "w", "r"))
    h0 = jnp.zeros((1, batch, hs), jnp.float32)
    defaults = ["Sigmoid", "Tanh", "Tanh"] if cell == "LSTM" else ["Sigmoid", "Tanh"]
    acts = rnn.activations_per_direction(None, None, None, defaults, 1)

    def loss(w, with_gates):
        if cell == "LSTM":
            y = rnn.lstm_scan(x, w, r, None, None, h0, h0, None, acts, clip=None, direction="forward",
                              hidden_size=hs, input_forget=0, with_gates=with_gates)[0]
        else:
            y = rnn.gru_scan(x, w, r, None, h0, None, acts, clip=None, direction="forward",
                             hidden_size=hs, linear_before_reset=1, with_gates=with_gates)[0]
        return jnp.sum(y * y)

    for fn in (loss, jax.grad(loss)):
        plain, training = (jax.jit(fn, static_argnums=1).lower(w, g).compile().memory_analysis()
                           for g in (False, True))
        assert training.temp_size_in_bytes <= plain.temp_size_in_bytes
    np.testing.assert_allclose(jax.grad(loss)(w, True), jax.grad(loss)(w, False), rtol=1e-6, atol=1e-7)
