"""Hypothesis strategies for random multi-op ONNX models and inputs that fit them.

:func:`onnx_models` draws valid models: chains and DAGs over elementwise,
matmul/gemm, reduction, shape, activation, normalization, convolution/pooling
and control-flow ops, with shapes and broadcasting worked out as the model is
built. :func:`model_inputs` draws inputs for any model (in graph input order),
inside each consuming op's domain (:data:`INPUT_DOMAINS`: Log gets positive
values, Div a divisor away from zero). :func:`tensors` draws one array::

    from hypothesis import given
    from jaxort.testing import assert_matches_reference, model_inputs, onnx_models

    @given(st.data())
    def test_random_graphs(data):
        model = data.draw(onnx_models(max_nodes=4))
        assert_matches_reference(model, data.draw(model_inputs(model)))

Shrinking works on the drawn structure: fewer nodes, the first op of the
family table, default (omitted) attributes, smaller shapes; so a failure
shrinks to a model of the few nodes it needs.

Ops whose input domain is restricted (poles, overflow) or whose output jumps
(Floor, comparisons) read a fresh graph input rather than an intermediate
value, so the ranges :func:`model_inputs` draws hold where they are used and
float rounding upstream never flips a step. Every value no node reads is a
graph output. The models stay inside what the installed onnx's reference
evaluator computes (no 0-d Softsign, Softplus or Mish; no float16
HardSigmoid or HardSwish before onnx 1.19), so a failure of
:func:`assert_matches_reference` on them is jaxort's.

Imports hypothesis, numpy and onnx only (no JAX).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np
import onnx
from hypothesis import assume
from onnx import helper

from jaxort.graph import numpy_dtype
from jaxort.testing._builders import _HELPER_OPS, OP_FAMILIES, _Builder, _finish
from jaxort.testing.strategies import FLOAT_DTYPES, _TINY, _elem_type, arrays, st

__all__ = [
    "DIFFERENTIABLE_OPS",
    "INPUT_DOMAINS",
    "OPSETS",
    "OP_FAMILIES",
    "model_inputs",
    "onnx_models",
    "tensors",
]

# Opsets onnx_models draws by default, first the one it shrinks to.
OPSETS = tuple(v for v in (17, 13, 18, 20, 21) if v <= onnx.defs.onnx_opset_version())
# ONNX's reference evaluator before onnx 1.19 returns float32 from float16
# HardSigmoid (and HardSwish, built on it): the models leave those out there.
_FLOAT32_HARD_SIGMOID = tuple(int(p) for p in onnx.__version__.split(".")[:2]) < (1, 19)


@dataclasses.dataclass(frozen=True)
class Domain:
    """A value range for an op's input: ``[low, high]``, at least ``min_magnitude`` from zero."""

    low: float = -2.0
    high: float = 2.0
    min_magnitude: float = 0.0


_DEFAULT = Domain()

# (op type, input index) -> the range model_inputs draws for a graph input it
# reads. Inputs read by several ops get the intersection.
INPUT_DOMAINS = {
    ("Log", 0): Domain(0.1, 4.0),
    ("Sqrt", 0): Domain(0.05, 4.0),
    ("Reciprocal", 0): Domain(-4.0, 4.0, 0.25),
    ("Div", 1): Domain(-4.0, 4.0, 0.25),
    ("Pow", 0): Domain(0.2, 3.0),
    ("Pow", 1): Domain(-2.0, 2.0),
    ("Exp", 0): Domain(-3.0, 3.0),
    ("ReduceProd", 0): Domain(0.5, 1.5),
    ("ReduceLogSum", 0): Domain(0.1, 4.0),
    ("Floor", 0): Domain(-4.0, 4.0),
    ("Ceil", 0): Domain(-4.0, 4.0),
    ("Round", 0): Domain(-4.0, 4.0),
    ("Sign", 0): Domain(-2.0, 2.0),
    ("Greater", 0): Domain(-2.0, 2.0),
    ("Less", 0): Domain(-2.0, 2.0),
}

# Ops whose gradient is defined almost everywhere on their drawn domains and
# which jax.grad differentiates (the gradient strategies draw these).
DIFFERENTIABLE_OPS = (
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow",
    "Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos",
    "Erf", "Softplus", "Softsign", "Identity",
    "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Gelu", "Mish", "PRelu",
    "Clip", "Softmax", "LogSoftmax",
    "MatMul", "Gemm",
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
    "ReduceLogSumExp", "ReduceLogSum",
    "Reshape", "Transpose", "Concat", "Slice", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Tile",
    "LayerNormalization", "BatchNormalization", "InstanceNormalization",
    "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "Where", "If", "Loop",
)

# op type -> (builder, first opset), every family's.
_OPS = {op: spec for family in OP_FAMILIES.values() for op, spec in family.items()}


_FLOAT_TYPE_STRS = frozenset(f"tensor({t})" for t in ("float", "float16", "double", "bfloat16"))


def _supports(op: str, opset: int, dtype: np.dtype) -> bool:
    """Whether ``op``'s schema at ``opset`` (and its helpers') takes ``dtype`` as its first input
    and as every input that takes floats (the builders feed those the model's dtype: Pow's
    exponent could not be bfloat16 before Pow-15), and the installed reference evaluator
    computes ``op`` in it."""
    if dtype == np.dtype(np.float32):
        return True
    if _FLOAT32_HARD_SIGMOID and dtype == np.dtype(np.float16) and op in ("HardSigmoid", "HardSwish"):
        return False
    type_str = f"tensor({helper.tensor_dtype_to_string(_elem_type(dtype)).split('.')[-1].lower()})"
    for name in (op,) + _HELPER_OPS.get(op, ()):
        schema = onnx.defs.get_schema(name, opset)
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

        def takes(i: int) -> set:
            return allowed.get(schema.inputs[i].type_str, {schema.inputs[i].type_str})
        if type_str not in takes(1 if name == "Where" else 0):
            return False
        if any(takes(i) & _FLOAT_TYPE_STRS and type_str not in takes(i) for i in range(len(schema.inputs))):
            return False
    return True


def _resolve_ops(ops) -> list:
    if ops is None:
        return list(_OPS)
    if isinstance(ops, str):
        ops = [ops]
    out = []
    for name in ops:
        if name in OP_FAMILIES:
            out.extend(OP_FAMILIES[name])
        elif name in _OPS:
            out.append(name)
        else:
            raise ValueError(f"onnx_models knows no op or family {name!r}; families: "
                             f"{sorted(OP_FAMILIES)}, ops: {sorted(_OPS)}")
    return list(dict.fromkeys(out))


def _draw_value(draw, value, default):
    if value is None:
        value = default
    if isinstance(value, st.SearchStrategy):
        return draw(value)
    if isinstance(value, (list, tuple)):
        return draw(st.sampled_from(list(value)))
    return value


@st.composite
def onnx_models(
    draw,
    ops: Any = None,
    max_nodes: int = 6,
    dtypes: Any = None,
    opset: Any = None,
    *,
    min_nodes: int = 1,
) -> onnx.ModelProto:
    """Random valid ONNX models over the given ops, with typed inputs and outputs.

    Each drawn op reads the newest value that fits it (so graphs are chains
    at their core), or an earlier one (so they branch into DAGs), or a fresh
    graph input; weights are initializers drawn from a seed. Attributes are
    drawn or left at their defaults; binary ops broadcast. Values no node
    reads are the graph outputs.

    Args:
      ops: op types and/or family names of :data:`OP_FAMILIES`
        (``"elementwise"``, ``"activation"``, ``"matmul"``, ``"reduction"``,
        ``"shape"``, ``"normalization"``, ``"convolution"``, ``"control"``);
        default every op. Ops newer than the drawn opset are left out.
      max_nodes: most ops drawn (a drawn op may add one helper node, e.g. the
        comparison before a Where, or the Add of a ramp that keeps a
        normalization's instances from being constant).
      dtypes: float dtype of the model's values, a sequence to draw from or a
        strategy; default float32, float64, float16 and bfloat16 (where onnx
        knows it).
      opset: the default domain's opset, a sequence or a strategy; default
        :data:`OPSETS`.
      min_nodes: fewest ops drawn.

    Returns:
      A strategy of ``onnx.ModelProto`` that passes ``onnx.checker`` with
      full shape inference; draw inputs for it with :func:`model_inputs`.

    Example:
      >>> m = onnx_models(ops=["matmul", "Relu"], max_nodes=3).example()   # doctest: +SKIP
      >>> [n.op_type for n in m.graph.node]                                # doctest: +SKIP
      ['Gemm', 'Relu']
    """
    wanted = _resolve_ops(ops)

    def fitting(dt, version):
        return [op for op in wanted if _OPS[op][1] <= version and _supports(op, version, dt)]

    dts = [dtypes] if isinstance(dtypes, (str, np.dtype, type)) else dtypes
    versions = [opset] if isinstance(opset, int) else opset
    if not isinstance(dts, st.SearchStrategy) and not isinstance(versions, st.SearchStrategy):
        # draw only (dtype, opset) pairs some wanted op exists for
        pairs = [(np.dtype(d), int(v)) for d in (dts or FLOAT_DTYPES) for v in (versions or OPSETS)
                 if fitting(np.dtype(d), int(v))]
        if not pairs:
            raise ValueError(f"none of the ops {ops!r} exists for dtypes {dts} at opsets {versions}")
        dtype, version = draw(st.sampled_from(pairs))
    else:
        dtype = np.dtype(_draw_value(draw, dtypes, FLOAT_DTYPES))
        version = int(_draw_value(draw, opset, OPSETS))
        assume(fitting(dtype, version))
    choices = fitting(dtype, version)
    b = _Builder(draw, dtype, version)
    b.fresh(b.shape())
    for _ in range(draw(st.integers(min_nodes, max_nodes))):
        _OPS[draw(st.sampled_from(choices))][0](b)
    return _finish(b)


# --------------------------------------------------------------------------- inputs


def _domain_of(model: onnx.ModelProto, name: str) -> Domain:
    lo, hi, mag = -math.inf, math.inf, 0.0
    found = False
    for node in _all_nodes(model.graph):
        for i, x in enumerate(node.input):
            d = INPUT_DOMAINS.get((node.op_type, i))
            if x == name and d is not None:
                found = True
                lo, hi, mag = max(lo, d.low), min(hi, d.high), max(mag, d.min_magnitude)
    return Domain(lo, hi, mag) if found else _DEFAULT


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _all_nodes(g)


def _tensor_spec(vi: onnx.ValueInfoProto, dims: Optional[dict]) -> tuple:
    t = vi.type.tensor_type
    dtype = numpy_dtype(t.elem_type)
    shape = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            shape.append(int(d.dim_value))
        else:
            shape.append((dims or {}).get(d.dim_param, 2))
    return np.dtype(dtype), tuple(shape)


@st.composite
def model_inputs(draw, model: onnx.ModelProto, *, seeded: bool = False,
                 dims: Optional[dict] = None) -> list:
    """Inputs for ``model``: one array per graph input that is not an initializer, in order.

    Each input's values lie in the domain of the ops that read it
    (:data:`INPUT_DOMAINS`; [-2, 2] for the rest). Symbolic dimensions take
    their size from ``dims`` (default 2).

    Args:
      model: any ``onnx.ModelProto`` with typed graph inputs.
      seeded: draw the values from a seeded generator (uniform in the
        domain) rather than element by element: no repeated values or exact
        zeros, which a gradient check wants away from kinks and ties.
      dims: symbolic dimension name -> size.

    Returns:
      A strategy of ``list[numpy.ndarray]``, accepted as is by the checkers.
    """
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1))) if seeded else None
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dtype, shape = _tensor_spec(vi, dims)
        d = _domain_of(model, vi.name)
        if rng is not None and dtype.kind != "b":
            x = rng.uniform(d.low, d.high, shape)
            if d.min_magnitude:
                x = np.where(x < 0, np.minimum(x, -d.min_magnitude), np.maximum(x, d.min_magnitude))
            if dtype.kind in "iu":
                x = np.round(x)
            elif dtype in _TINY:
                x = np.where(np.abs(x) < _TINY[dtype], 0.0, x)
            out.append(x.astype(dtype))
        elif rng is not None:
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(draw(tensors(dtype, shape, min_value=d.low, max_value=d.high,
                                    min_magnitude=d.min_magnitude)))
    return out


def tensors(dtype: Any = np.float32, shape: Any = None, **bounds) -> st.SearchStrategy:
    """Finite numpy arrays of ``dtype`` and ``shape`` (see :func:`jaxort.testing.strategies.arrays`).

    Args:
      dtype: a dtype, a name, or a strategy of them.
      shape: a shape, or a strategy of them; default small shapes.
      **bounds: ``min_value``, ``max_value``, ``min_magnitude``.

    Returns:
      A strategy of ``numpy.ndarray``.

    Example:
      >>> tensors("float16", (2, 3)).example().dtype                 # doctest: +SKIP
      dtype('float16')
    """
    return arrays(dtype, shape, **bounds)
