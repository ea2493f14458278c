"""Test-only glue of the op tests: capability probes of the installed onnx, the
hypothesis settings, the op table entry and its property check, gradient checks.

The reusable part (one-node models, running the reference evaluator and
jaxort, the per-dtype tolerance table and the comparison) is public, in
``jaxort.testing``. Every ``test_<module>.py`` here tests the ops that
``jaxort/graph/ops/<module>.py`` registers and lists them in ``COVERED_OPS``.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from onnx import TensorProto, helper, numpy_helper

from jaxort.graph import JaxGraph, x64_enabled_scope
from jaxort.testing import NodeCase, assert_outputs_match, run_jaxort, run_reference

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))

F16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
I8, U8, I32, I64 = (np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64))
BOOL = np.dtype(np.bool_)
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min

# --------------------------------------------------------------------------- the installed onnx

# Its newest opset, and whether its reference evaluator predates the fixes of
# onnx 1.17 (Conv auto_pad, grouped ConvTranspose, RNN directions and layout=1,
# Scatter reductions, OneHot out-of-range indices, TopK ties, Unique under
# numpy 2, Resize's empty roi and integer saturation), where the strategies
# draw only the forms it computes correctly.
ONNX_OPSET = onnx.defs.onnx_opset_version()
OLD_REFERENCE = tuple(int(p) for p in onnx.__version__.split(".")[:2]) < (1, 17)


def _onnx_maps(dtype) -> bool:
    """Whether this onnx's helper (and so its reference evaluator) knows an ml_dtypes dtype.

    onnx < 1.17 predates its ml_dtypes support: it maps BFLOAT16 to uint16, has its
    own numpy dtypes for float8/int4, and no float4/int2/float8e8m0 at all.
    """
    try:
        helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return False
    return True


HAS_BF16 = _onnx_maps(ml_dtypes.bfloat16)
HAS_FLOAT8 = _onnx_maps(ml_dtypes.float8_e4m3fn)
HAS_INT4 = _onnx_maps(ml_dtypes.int4)
HAS_FLOAT8E8M0 = hasattr(TensorProto, "FLOAT8E8M0") and _onnx_maps(ml_dtypes.float8_e8m0fnu)


def require_opset(op: str, opset: int):
    """Skip when the installed onnx predates ``op``'s opset-``opset`` schema and reference."""
    if ONNX_OPSET < opset:
        pytest.skip(f"{op} needs ai.onnx opset {opset}; onnx {onnx.__version__} "
                    f"stops at opset {ONNX_OPSET} (no schema, no reference)")


def require_dtypes(flag: bool, what: str):
    if not flag:
        pytest.skip(f"onnx {onnx.__version__} does not map ml_dtypes {what} "
                    "(its helper/reference evaluator predate ml_dtypes support)")


def elem_type(dtype) -> int:
    dt = np.dtype(dtype)
    if dt.kind in "OUS":
        return TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(dt)


# --------------------------------------------------------------------------- drawn cases


@dataclasses.dataclass(frozen=True)
class Example:
    """What a strategy draws for an op it does not name: inputs (None = absent
    optional), attributes, opset, outputs used; ``static``: indices of inputs
    stored as initializers (trace-time constants)."""

    inputs: tuple
    attrs: dict
    opset: Optional[int] = None
    n_out: int = 1
    static: tuple = ()

    def node(self, op: str) -> NodeCase:
        return NodeCase(op, tuple(self.inputs), self.attrs, self.opset, self.n_out, self.static)


def example(op, inputs, attrs=None, *, opset=None, n_out=1, constants=()) -> NodeCase:
    """A case from positional inputs; ``constants`` are initializer indices."""
    return NodeCase(op, tuple(inputs), attrs or {}, opset, n_out, tuple(constants))


def node(op, inputs, attrs=None, *, opset=18, n_out=1) -> NodeCase:
    """A case from ``(name, value, static)`` triples (the name documents the input)."""
    return NodeCase(op, tuple(v for _, v, _ in inputs), attrs or {}, opset, n_out,
                    tuple(i for i, (_, v, s) in enumerate(inputs) if s and v is not None))


def has_strings(case: NodeCase) -> bool:
    """String tensors never cross a jit boundary: such cases run op by op."""
    return (any(x is not None and np.asarray(x).dtype == object for x in case.inputs)
            or any("string" in k for k in case.attributes))


# --------------------------------------------------------------------------- the op table


@dataclasses.dataclass(frozen=True)
class OpCase:
    """One op (or op form) in a module's table: what to draw, how close it must be.

    ``scale`` multiplies jaxort.testing's per-dtype tolerances (0: exact);
    ``tolerances`` replaces them for a dtype whose reference computes in a
    lower precision; ``reference`` computes expected outputs where ONNX's
    evaluator lacks a form; ``folded`` checks the op-by-op path (static numpy
    inputs) on that many first examples; ``static_only`` checks only that path.
    """

    op: str
    strategy: st.SearchStrategy
    scale: float = 1.0
    id: str = ""
    reference: Optional[Callable[[NodeCase], list]] = None
    min_opset: int = 1
    bits: bool = False
    tolerances: Optional[dict] = None
    folded: int = 0
    static_only: bool = False
    max_examples: int = 10

    @property
    def name(self) -> str:
        return self.id or self.op


def check_op_case(case: OpCase, *, equal_nan: bool = False):
    """The property: every drawn case matches the reference, jitted (and folded)."""
    require_opset(case.op, case.min_opset)
    seen = [0]
    compare = dict(scale=case.scale, tolerances=case.tolerances, bits=case.bits,
                   equal_nan=equal_nan)

    @settings(SETTINGS, max_examples=case.max_examples)
    @given(case.strategy)
    def check(drawn):
        ex = drawn if isinstance(drawn, NodeCase) else drawn.node(case.op)
        assume((ex.opset or 1) <= ONNX_OPSET)  # a form the installed onnx has no schema or reference for
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # log(0), empty means
            expected = (case.reference or run_reference)(ex)[:ex.n_outputs]
        eager = case.static_only or has_strings(ex)
        if not eager:
            assert_outputs_match(run_jaxort(ex)[:ex.n_outputs], expected, **compare)
        # The folded path dispatches op by op, compiling each primitive for each
        # new shape: check it on the first few examples only.
        seen[0] += 1
        if eager or seen[0] <= case.folded:
            assert_outputs_match(run_jaxort(ex, jit=False)[:ex.n_outputs], expected, **compare)

    check()


def assert_table_covers(cases, covered_ops):
    assert {c.op for c in cases} == set(covered_ops)


# --------------------------------------------------------------------------- gradients


def check_gradient(case: NodeCase, wrt=(0,), *, eps, atol, rtol, weighted=False, jit=False):
    """check_grads (reverse mode, float64) of output 0 w.r.t. the inputs at ``wrt``.

    ``weighted``: differentiate the sum of output 0 times fixed cos weights
    instead of the output itself.
    """
    require_opset(case.op_type, case.opset or 1)
    static = set(case.initializers)
    positions = [i for i, x in enumerate(case.inputs) if x is not None and i not in static]
    g = JaxGraph(case.model(), check=False, params=[])
    args = case.args
    slots = [positions.index(i) for i in wrt]

    def f(*xs):
        a = list(args)
        for k, x in zip(slots, xs):
            a[k] = x
        out = g.apply(g.params, *a)[0]
        if not weighted:
            return out
        w = jnp.cos(jnp.arange(out.size, dtype=out.dtype)).reshape(out.shape)
        return jnp.sum(out * w)

    with x64_enabled_scope():
        xs = tuple(jnp.asarray(args[k]) for k in slots)
        check_grads(jax.jit(f) if jit else f, xs, order=1, modes=["rev"], eps=eps, atol=atol,
                    rtol=rtol)


# --------------------------------------------------------------------------- multi-node models


def tensor(name, elem, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def seq_info(name, elem=TensorProto.FLOAT):
    return helper.make_value_info(
        name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None)))


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name))


@dataclasses.dataclass
class GraphExample:
    """A small model and its feeds; ``expected`` for forms ONNX's reference lacks."""

    model: onnx.ModelProto
    feeds: dict  # graph input name -> value, in graph input order
    expected: Optional[list] = None

    def reference(self):
        return self.expected if self.expected is not None else run_reference(self.model,
                                                                              self.feeds)

    def run(self, *, jit=True):
        return run_jaxort(self.model, self.feeds, jit=jit)


def build(nodes, feeds, outputs, *, opset=17, initializers=None) -> GraphExample:
    """A model whose graph inputs are ``feeds`` (name -> array) and outputs ``outputs``."""
    inputs = [tensor(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                     list(np.shape(v))) for n, v in feeds.items()]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return GraphExample(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]),
                        dict(feeds))


def check_graph_example(ex: GraphExample):
    assert_outputs_match(ex.run(), ex.reference(), equal_nan=False)


def normal(draw, shape, dtype=F32):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return (rng.standard_normal(shape) * 0.5).astype(dtype)


# --------------------------------------------------------------------------- short forms


def run1(op, inputs, attrs=None, opset=None, jit=True):
    """Output 0 of ``op`` on ``inputs`` (all graph inputs)."""
    return run_jaxort(NodeCase(op, tuple(inputs), attrs or {}, opset), jit=jit)[0]


def run_jax(case: NodeCase, jit: bool = True) -> list:
    """jaxort's outputs, jitted unless the case holds strings."""
    return run_jaxort(case, jit=jit and not has_strings(case))


def check(case: NodeCase, scale: float = 0.0):
    """``case`` matches the reference; ``scale`` 0 (the default) means exactly."""
    assert_outputs_match(run_jax(case), run_reference(case), scale=scale, equal_nan=False)


def run_onnxruntime(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001  onnxruntime raises its own NotImplemented
        if type(e).__name__ != "NotImplemented":
            raise
        pytest.skip(f"onnxruntime {ort.__version__} has no kernel for this model: {e}")
    return sess.run(None, feeds)


# --------------------------------------------------------------------------- test factories
# A module's tests over its tables come from these, so every module runs the same checks.


def table_tests(cases, covered_ops, *, equal_nan=False):
    """``test_matches_reference`` (one per table entry) and ``test_table_covers_every_op``."""

    @pytest.mark.parametrize("case", cases, ids=lambda c: c.name)
    def test_matches_reference(case):
        check_op_case(case, equal_nan=equal_nan)

    def test_table_covers_every_op():
        assert_table_covers(cases, covered_ops)

    return test_matches_reference, test_table_covers_every_op


def folded_case(op, strategy, **kw) -> OpCase:
    """An elementwise entry: its first two examples also run op by op (folded with numpy)."""
    return OpCase(op, strategy, folded=2, **kw)


def elementwise_gradient_test(grad_cases):
    """Finite differences (eps 1e-4, tolerance 1e-5) for ``(op, attrs, make inputs)`` rows."""

    @pytest.mark.parametrize("op,attrs,make", grad_cases,
                             ids=[f"{c[0]}-{i}" for i, c in enumerate(grad_cases)])
    def test_gradient_matches_finite_differences(op, attrs, make):
        if op == "Swish":
            require_opset(op, 24)
        inputs = make()
        wrt = [0] if op == "Clip" else [i for i, x in enumerate(inputs) if x.dtype == F64]
        check_gradient(NodeCase(op, inputs, attrs), wrt, eps=1e-4, atol=1e-5, rtol=1e-5)

    return test_gradient_matches_finite_differences


def nn_gradient_test(grad_cases):
    """Finite differences (eps 1e-5, tolerance 1e-6) for ``(op, make inputs, attrs, opset)`` rows."""

    @pytest.mark.parametrize("op,make,attrs,opset", grad_cases,
                             ids=[f"{c[0]}-{i}" for i, c in enumerate(grad_cases)])
    def test_gradient_matches_finite_differences(op, make, attrs, opset):
        inputs = make()
        wrt = [0, 1, 2] if op == "BatchNormalization" else list(range(len(inputs)))
        check_gradient(Example(tuple(inputs), attrs, opset).node(op), wrt, eps=1e-5, atol=1e-6,
                       rtol=1e-6)

    return test_gradient_matches_finite_differences


def tensor_gradient_test(grad_case, ops):
    """Finite differences (eps 1e-3, tolerance 1e-6); ``grad_case(op) -> (case, wrt)``."""

    @pytest.mark.parametrize("op", ops)
    def test_gradient_finite_differences(op):
        case, wrt = grad_case(op)
        check_gradient(case, wrt, eps=1e-3, atol=1e-6, rtol=1e-6)

    return test_gradient_finite_differences


def tensor_grad_inputs():
    """The float64 inputs of the tensor-family gradient cases (and their generator)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float64)
    x4 = rng.standard_normal((1, 2, 3, 4)).astype(np.float64)
    return rng, x, x4


# Finite differences of a weighted sum of output 0 (eps 1e-6, tolerance 1e-5), jitted.
weighted_gradient = functools.partial(check_gradient, eps=1e-6, atol=1e-5, rtol=1e-5,
                                      weighted=True, jit=True)


def named_gradient_test(grad_cases):
    """``test_gradient_matches_finite_differences`` over a dict name -> case (w.r.t. input 0)."""

    @pytest.mark.parametrize("name", sorted(grad_cases))
    def test_gradient_matches_finite_differences(name):
        weighted_gradient(grad_cases[name], (0,))

    return test_gradient_matches_finite_differences


# The inputs of the reduction and loss gradient cases (classes on axis 1).
GRAD_X = np.random.default_rng(0).standard_normal((3, 4, 5))


@dataclasses.dataclass(frozen=True)
class GraphCase:
    """A table entry that draws whole models (:class:`GraphExample`): control flow, sequences."""

    name: str
    strategy: Callable[[], st.SearchStrategy]


def graph_table_tests(cases):
    """``test_matches_reference``, one per :class:`GraphCase`."""

    @pytest.mark.parametrize("case", cases, ids=lambda c: c.name)
    def test_matches_reference(case):
        @SETTINGS
        @given(case.strategy())
        def check(ex):
            check_graph_example(ex)

        check()

    return test_matches_reference
