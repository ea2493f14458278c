"""Reductions, ArgMax/ArgMin, losses, signal and random ops against ONNX's reference evaluator.

One table, ``CASES``: an entry per op with a hypothesis strategy that draws a
one-node model and its inputs, and a tolerance scale. Each entry runs jitted,
under strict dtype promotion with 64-bit types enabled, so output dtypes must
match the reference exactly. Differentiable ops get finite-difference gradient
checks in float64 (``GRAD_CASES``); the training losses are also compared with
ONNX Runtime. Random ops are checked for shapes, ranges and determinism.
"""


import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from jaxort.errors import OpError
from jaxort.graph import JaxGraph, x64_enabled_scope

REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
SIGNAL_OPS = ("DFT", "STFT", "HannWindow", "HammingWindow", "BlackmanWindow",
              "MelWeightMatrix")
RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Bernoulli", "Multinomial")
COVERED_OPS = {*REDUCE_OPS, "ArgMax", "ArgMin", "SoftmaxCrossEntropyLoss",
               "NegativeLogLikelihoodLoss", *SIGNAL_OPS, *RANDOM_OPS}

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I32, I64 = np.dtype(np.int32), np.dtype(np.int64)
# (rtol, atol) per dtype for tol=1; an entry's ``tol`` scales both.
TOL = {F16: (5e-3, 5e-3), F32: (1e-5, 1e-6), F64: (1e-10, 1e-12)}
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
LATEST = onnx.defs.onnx_opset_version()


# --------------------------------------------------------------------------- helpers


def make_model(op, inputs, attrs=None, *, opset=LATEST, n_out=1, constants=()):
    """One-node model. ``inputs`` holds arrays or None (absent); indices in
    ``constants`` become initializers (static values) instead of graph inputs."""
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    graph_inputs, inits = [], []
    for i, (n, x) in enumerate(zip(names, inputs)):
        if not n:
            continue
        if i in constants:
            inits.append(numpy_helper.from_array(np.asarray(x), n))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape)))
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@dataclasses.dataclass
class Example:
    model: onnx.ModelProto
    inputs: list  # every input, None for absent ones
    constants: tuple = ()

    @property
    def feeds(self):
        return {f"in{i}": x for i, x in enumerate(self.inputs)
                if x is not None and i not in self.constants}

    @property
    def args(self):
        return [x for i, x in enumerate(self.inputs) if x is not None and i not in self.constants]


def example(op, inputs, attrs=None, *, opset=LATEST, n_out=1, constants=()):
    return Example(make_model(op, inputs, attrs, opset=opset, n_out=n_out,
                              constants=constants), list(inputs), tuple(constants))


def run_reference(ex):
    return [np.asarray(o) for o in ReferenceEvaluator(ex.model).run(None, ex.feeds)]


def run_jaxort(ex, rng=None, *, jit=True):
    g = JaxGraph(ex.model, check=False, params=[])
    with x64_enabled_scope(), jax.numpy_dtype_promotion("strict"):
        fn = jax.jit(g.apply) if jit else g.apply
        outs = fn(g.params, *ex.args, rng=rng)
        return [np.asarray(o) for o in outs]


def assert_matches(got, expected, tol=1.0):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype, f"dtype {g.dtype} != expected {e.dtype}"
        assert g.shape == e.shape, f"shape {g.shape} != expected {e.shape}"
        if e.dtype in TOL:
            rtol, atol = TOL[e.dtype]
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64),
                                       rtol=rtol * tol, atol=atol * tol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, e)


def _values(rng, shape, dtype, *, positive=False):
    if np.dtype(dtype).kind in "iu":
        lo = 1 if positive else -4
        return rng.integers(lo, 5, size=shape).astype(dtype)
    x = rng.standard_normal(shape)
    if positive:
        x = np.abs(x) + 0.1
    return x.astype(dtype)


# --------------------------------------------------------------------------- strategies

# op -> (dtypes, positive values, allows empty reductions)
_REDUCE = {
    "ReduceSum": ((F32, F64, F16, I32, I64), False, True),
    "ReduceMean": ((F32, F64, F16, I32), False, False),
    "ReduceMax": ((F32, F64, F16, I32, I64), False, True),
    "ReduceMin": ((F32, F64, F16, I32, I64), False, True),
    "ReduceProd": ((F32, F64, I32), False, True),
    "ReduceL1": ((F32, F64, F16, I32), False, True),
    "ReduceL2": ((F32, F64, F16), False, True),
    "ReduceLogSum": ((F32, F64), True, True),
    "ReduceLogSumExp": ((F32, F64, F16), False, True),
    "ReduceSumSquare": ((F32, F64, F16, I64), False, True),
}


@st.composite
def reduce_example(draw, op):
    dtypes, positive, empty_ok = _REDUCE[op]
    dtype = draw(st.sampled_from(dtypes))
    # ONNX's reference ReduceLogSumExp-1 fails on 0-d inputs.
    rank = draw(st.integers(1 if op == "ReduceLogSumExp" else 0, 4))
    shape = tuple(draw(st.lists(st.integers(0 if empty_ok else 1, 4), min_size=rank,
                                max_size=rank)))
    seed = draw(st.integers(0, 2**16))
    x = _values(np.random.default_rng(seed), shape, dtype, positive=positive)
    axes = draw(st.lists(st.integers(0, max(rank - 1, 0)), unique=True, max_size=rank))
    axes = [a - rank if draw(st.booleans()) else a for a in axes] if rank else []
    keepdims = draw(st.integers(0, 1))
    input_since = 13 if op == "ReduceSum" else 18
    new_form = draw(st.booleans())
    if not new_form:
        attrs = {"keepdims": keepdims}
        if axes:
            attrs["axes"] = axes
        return example(op, [x], attrs, opset=draw(st.sampled_from([11, input_since - 1])))
    attrs = {"keepdims": keepdims, "noop_with_empty_axes": draw(st.integers(0, 1))}
    opset = LATEST if dtype.kind == "f" else 20
    if not axes and draw(st.booleans()):
        return example(op, [x], attrs, opset=opset)
    return example(op, [x, np.asarray(axes, np.int64)], attrs, opset=opset, constants=(1,))


@st.composite
def arg_example(draw, op):
    dtype = draw(st.sampled_from([F32, F64, F16, I32]))
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.integers(-2, 3, size=shape).astype(dtype)  # small range: ties exercise select_last
    attrs = {"axis": draw(st.integers(-rank, rank - 1)), "keepdims": draw(st.integers(0, 1)),
             "select_last_index": draw(st.integers(0, 1))}
    return example(op, [x], attrs, opset=13)


@st.composite
def loss_parts(draw):
    dtype = draw(st.sampled_from([F32, F64]))
    n, c = draw(st.integers(1, 3)), draw(st.integers(2, 5))
    extra = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((n, c) + extra).astype(dtype)
    labels = rng.integers(0, c, size=(n,) + extra).astype(draw(st.sampled_from([I32, I64])))
    weight = rng.uniform(0.2, 2.0, size=(c,)).astype(dtype) if draw(st.booleans()) else None
    attrs = {"reduction": draw(st.sampled_from(["none", "sum", "mean"]))}
    if draw(st.booleans()):
        ii = draw(st.sampled_from([0, 1, -1, -100]))
        attrs["ignore_index"] = ii
        if ii < 0 and labels.size > 1:
            labels.reshape(-1)[0] = ii
    return x, labels, weight, attrs


@st.composite
def sce_example(draw):
    x, labels, weight, attrs = draw(loss_parts())
    n_out = draw(st.integers(1, 2))
    return example("SoftmaxCrossEntropyLoss", [x, labels, weight], attrs, opset=13, n_out=n_out)


@st.composite
def nll_example(draw):
    x, labels, weight, attrs = draw(loss_parts())
    return example("NegativeLogLikelihoodLoss", [x, labels, weight], attrs, opset=13)


@st.composite
def dft_example(draw):
    dtype = draw(st.sampled_from([F32, F64]))
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(2, 6), min_size=rank, max_size=rank)))
    complex_in = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape + (2 if complex_in else 1,)).astype(dtype)
    axis = draw(st.integers(0, rank - 1))
    inverse = int(complex_in and draw(st.booleans()))
    onesided = int(not inverse and not complex_in and draw(st.booleans()))
    length = draw(st.sampled_from([None, shape[axis], shape[axis] + 2]))
    dft_length = None if length is None else np.asarray(length, np.int64)
    if draw(st.booleans()):
        return example("DFT", [x, dft_length, np.asarray(axis, np.int64)],
                       {"inverse": inverse, "onesided": onesided}, opset=20,
                       constants=(1, 2))
    return example("DFT", [x, dft_length], {"axis": axis, "inverse": inverse,
                                            "onesided": onesided}, opset=17, constants=(1,))


@st.composite
def stft_example(draw):
    dtype = draw(st.sampled_from([F32, F64]))
    length = draw(st.integers(8, 24))
    frame = draw(st.integers(2, 8))
    step = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((draw(st.integers(1, 2)), length, 1)).astype(dtype)
    window = np.hanning(frame).astype(dtype) if draw(st.booleans()) else None
    frame_length = np.asarray(frame, np.int64)
    return example("STFT", [x, np.asarray(step, np.int64), window, frame_length],
                   {"onesided": draw(st.integers(0, 1))}, opset=17, constants=(1, 3))


@st.composite
def window_example(draw, op):
    size = np.asarray(draw(st.integers(2, 12)), np.int64)  # size 1: the reference divides 0/0
    attrs = {"periodic": draw(st.integers(0, 1)),
             "output_datatype": draw(st.sampled_from([TensorProto.FLOAT, TensorProto.DOUBLE]))}
    return example(op, [size], attrs, opset=17, constants=(0,))


@st.composite
def mel_example(draw):
    inputs = [np.asarray(draw(st.integers(1, 8)), np.int64),
              np.asarray(draw(st.sampled_from([16, 32, 64])), np.int64),
              np.asarray(draw(st.sampled_from([8000, 16000])), np.int64),
              np.asarray(draw(st.sampled_from([0.0, 50.0])), np.float32),
              np.asarray(draw(st.sampled_from([3000.0, 4000.0])), np.float32)]
    return example("MelWeightMatrix", inputs, opset=17, constants=(0, 1, 2, 3, 4))


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    strategy: Callable[[], st.SearchStrategy]
    tol: float = 1.0


CASES = (
    [Case(op, lambda op=op: reduce_example(op)) for op in REDUCE_OPS]
    + [Case("ArgMax", lambda: arg_example("ArgMax")), Case("ArgMin", lambda: arg_example("ArgMin")),
       Case("SoftmaxCrossEntropyLoss", sce_example, 2.0),
       Case("NegativeLogLikelihoodLoss", nll_example),
       Case("DFT", dft_example, 10.0), Case("STFT", stft_example, 10.0),
       Case("MelWeightMatrix", mel_example)]
    + [Case(op, lambda op=op: window_example(op)) for op in
       ("HannWindow", "HammingWindow", "BlackmanWindow")]
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.op)
def test_matches_reference(case):
    @SETTINGS
    @given(case.strategy())
    def check(ex):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # log(0), empty means
            expected = run_reference(ex)
        assert_matches(run_jaxort(ex), expected, case.tol)

    check()


# --------------------------------------------------------------------------- gradients


def _grad_check(ex, x_index=0, atol=1e-5, rtol=1e-5):
    """check_grads of output 0 (summed with fixed weights) w.r.t. input ``x_index``."""
    g = JaxGraph(ex.model, check=False, params=[])
    args = ex.args
    with x64_enabled_scope():
        def f(x):
            a = list(args)
            a[x_index] = x
            out = g.apply(g.params, *a)[0]
            w = jnp.cos(jnp.arange(out.size, dtype=out.dtype)).reshape(out.shape)
            return jnp.sum(out * w)

        check_grads(jax.jit(f), (jnp.asarray(args[x_index]),), order=1, modes=["rev"], eps=1e-6,
                    atol=atol, rtol=rtol)


_GRAD_X = np.random.default_rng(0).standard_normal((3, 4, 5))  # classes on axis 1
GRAD_CASES = {
    "ReduceSum": example("ReduceSum", [_GRAD_X, np.asarray([1], np.int64)], {"keepdims": 0},
                         constants=(1,)),
    "ReduceMean": example("ReduceMean", [_GRAD_X, np.asarray([0, 2], np.int64)],
                          constants=(1,)),
    "ReduceMax": example("ReduceMax", [_GRAD_X, np.asarray([-1], np.int64)], constants=(1,)),
    "ReduceMin": example("ReduceMin", [_GRAD_X], {"keepdims": 0}),
    "ReduceProd": example("ReduceProd", [_GRAD_X, np.asarray([2], np.int64)], constants=(1,)),
    "ReduceL1": example("ReduceL1", [_GRAD_X, np.asarray([1], np.int64)], constants=(1,)),
    "ReduceL2": example("ReduceL2", [_GRAD_X, np.asarray([1], np.int64)], constants=(1,)),
    "ReduceLogSum": example("ReduceLogSum", [np.abs(_GRAD_X) + 0.5, np.asarray([1], np.int64)],
                            constants=(1,)),
    "ReduceLogSumExp": example("ReduceLogSumExp", [_GRAD_X * 10, np.asarray([0, 1], np.int64)],
                               constants=(1,)),
    "ReduceSumSquare": example("ReduceSumSquare", [_GRAD_X], {"keepdims": 1}),
    "SoftmaxCrossEntropyLoss": example(
        "SoftmaxCrossEntropyLoss",
        [_GRAD_X, np.asarray([[0, 3, 1, 2, 0], [1, 1, 2, 3, 0], [3, 2, 1, 0, 0]], np.int64),
         np.asarray([0.5, 1.0, 2.0, 1.5])], {"reduction": "mean", "ignore_index": 2},
        opset=13),
    "NegativeLogLikelihoodLoss": example(
        "NegativeLogLikelihoodLoss",
        [_GRAD_X, np.asarray([[0, 3, 1, 2, 0], [1, 1, 2, 3, 0], [3, 2, 1, 0, 0]], np.int64),
         np.asarray([0.5, 1.0, 2.0, 1.5])], {"reduction": "mean"}, opset=13),
    "SoftmaxCrossEntropyLoss-sum": example(
        "SoftmaxCrossEntropyLoss",
        [_GRAD_X[:, :, 0], np.asarray([0, 3, 1], np.int64)], {"reduction": "sum"}, opset=13),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradient_matches_finite_differences(name):
    _grad_check(GRAD_CASES[name])


def test_loss_gradient_flows_to_weights():
    ex = GRAD_CASES["NegativeLogLikelihoodLoss"]
    _grad_check(ex, x_index=2)


# --------------------------------------------------------------------------- ONNX Runtime


def _ort_run(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("form", ["plain", "weights_ignore", "nd"])
def test_softmax_cross_entropy_matches_onnxruntime(form):
    rng = np.random.default_rng(7)
    if form == "nd":
        x = rng.standard_normal((4, 6, 3, 2)).astype(np.float32)
        y = rng.integers(0, 6, size=(4, 3, 2)).astype(np.int64)
    else:
        x = (rng.standard_normal((16, 10)) * 3).astype(np.float32)
        y = rng.integers(0, 10, size=(16,)).astype(np.int64)
    inputs = [x, y]
    attrs = {"reduction": "mean"}
    if form == "weights_ignore":
        inputs.append(rng.uniform(0.5, 2, size=(10,)).astype(np.float32))
        attrs["ignore_index"] = 3
    ex = example("SoftmaxCrossEntropyLoss", inputs, attrs, opset=17, n_out=2)
    expected = _ort_run(ex.model, ex.feeds)
    got = run_jaxort(ex)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_reduce_mean_loss_matches_onnxruntime():
    x = np.random.default_rng(3).standard_normal((32, 5)).astype(np.float32) ** 2
    ex = example("ReduceMean", [x], {"keepdims": 0}, opset=17)
    (expected,) = _ort_run(ex.model, ex.feeds)
    (got,) = run_jaxort(ex)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


# --------------------------------------------------------------------------- specific behaviour


def test_empty_set_reductions_give_identities():
    x = np.zeros((2, 0, 3), np.float32)
    axes = np.asarray([1], np.int64)
    expected = {"ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceSum": 0.0, "ReduceProd": 1.0,
                "ReduceLogSumExp": -np.inf, "ReduceLogSum": -np.inf}
    for op, value in expected.items():
        (got,) = run_jaxort(example(op, [x, axes], {"keepdims": 1}, constants=(1,)))
        assert got.shape == (2, 1, 3) and got.dtype == np.float32
        np.testing.assert_array_equal(got, np.full((2, 1, 3), value, np.float32))
    (got,) = run_jaxort(example("ReduceMax", [np.zeros((0, 2), np.int32)], {"keepdims": 0}))
    np.testing.assert_array_equal(got, np.zeros((), np.int32) + np.iinfo(np.int32).min)


def test_noop_with_empty_axes_returns_input():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,) = run_jaxort(example("ReduceSum", [x, np.zeros((0,), np.int64)],
                                {"noop_with_empty_axes": 1}, constants=(1,)))
    np.testing.assert_array_equal(got, x)


def test_float32_reductions_stay_float32_without_x64():
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    for op in REDUCE_OPS:
        ex = example(op, [np.abs(x) + 0.1, np.asarray([1], np.int64)], constants=(1,))
        g = JaxGraph(ex.model, check=False, params=[])
        with jax.numpy_dtype_promotion("strict"):
            (out,) = jax.jit(g.apply)(g.params, *ex.args)
        assert out.dtype == np.float32, op


def test_traced_axes_input_names_the_node():
    x = np.ones((2, 3), np.float32)
    ex = example("ReduceSum", [x, np.asarray([1], np.int64)])
    g = JaxGraph(ex.model, check=False, params=[])
    with pytest.raises(OpError, match=r"ReduceSum .*input 'axes' must be known at trace time"):
        jax.jit(g.apply)(g.params, *ex.args)


def test_argmax_returns_int64_with_x64():
    x = np.asarray([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], np.float32)
    (got,) = run_jaxort(example("ArgMax", [x], {"axis": 1, "select_last_index": 1}))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [[2], [2]])


# --------------------------------------------------------------------------- random ops


def _random_model(op, attrs, x=None):
    inputs = [] if x is None else [x]
    return example(op, inputs, attrs, opset=17)


def test_random_ops_draw_from_the_key_with_the_right_shapes_and_ranges():
    key = jax.random.key(0)
    x = np.full((200, 50), 0.3, np.float32)

    def draw(op, attrs, x=None):
        return run_jaxort(_random_model(op, attrs, x), key, jit=False)[0]

    u = draw("RandomUniformLike", {"low": -2.0, "high": 3.0}, x)
    assert u.shape == x.shape and u.dtype == np.float32
    assert u.min() >= -2.0 and u.max() < 3.0 and abs(u.mean() - 0.5) < 0.1
    n = draw("RandomNormalLike", {"mean": 1.0, "scale": 2.0, "dtype": TensorProto.DOUBLE}, x)
    assert n.dtype == np.float64 and abs(n.mean() - 1.0) < 0.1 and abs(n.std() - 2.0) < 0.1
    n2 = draw("RandomNormal", {"shape": [3, 4]})
    assert n2.shape == (3, 4) and n2.dtype == np.float32
    u2 = draw("RandomUniform", {"shape": [5], "dtype": TensorProto.FLOAT16})
    assert u2.shape == (5,) and u2.dtype == np.float16 and (u2 >= 0).all() and (u2 <= 1).all()
    b = draw("Bernoulli", {}, x)
    assert b.dtype == np.float32 and set(np.unique(b)) <= {0.0, 1.0}
    assert abs(b.mean() - 0.3) < 0.05
    b2 = draw("Bernoulli", {"dtype": TensorProto.INT64}, np.asarray([0.0, 1.0, 0.0, 1.0]))
    np.testing.assert_array_equal(b2, [0, 1, 0, 1])
    logits = np.log(np.asarray([[1e-9, 1.0, 1e-9], [1e-9, 1e-9, 1.0]], np.float32))
    m = draw("Multinomial", {"sample_size": 4}, logits)
    assert m.dtype == np.int32
    np.testing.assert_array_equal(m, [[1] * 4, [2] * 4])


def test_random_ops_need_a_key_or_a_seed():
    ex = _random_model("RandomNormal", {"shape": [2]})
    g = JaxGraph(ex.model, check=False, params=[])
    with pytest.raises(OpError, match="RandomNormal.*needs a PRNG key"):
        g.apply(g.params)
    seeded = _random_model("RandomNormal", {"shape": [2], "seed": 5.0})
    first, second = run_jaxort(seeded)[0], run_jaxort(seeded)[0]
    np.testing.assert_array_equal(first, second)
    a = run_jaxort(ex, jax.random.key(1))[0]
    b = run_jaxort(ex, jax.random.key(2))[0]
    assert not np.array_equal(a, b)
