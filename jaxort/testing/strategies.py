"""Hypothesis strategies that generate ONNX models and inputs, and a reference check.

For test suites that check ONNX graphs run through jaxort (or anything else)
against a reference. The strategies draw dtypes, shapes, finite arrays, one-node
models with matching inputs, and small random multi-node graphs with
initializers; :func:`assert_matches_reference` runs a model through jaxort
(jitted) and through ONNX's reference evaluator and compares every output's
dtype, shape and values::

    from hypothesis import given, settings
    from jaxort.testing import strategies as js

    @settings(max_examples=20, deadline=None)
    @given(js.mlp_models())
    def test_mlp(case):
        js.assert_matches_reference(case)

This module needs hypothesis, a test extra of jaxort rather than a runtime
dependency (``pip install 'jaxort[test]'`` or ``pip install hypothesis``).
It imports only hypothesis, numpy, ml_dtypes and onnx; JAX and jaxort's graph layer are
imported when :func:`assert_matches_reference` runs, so the strategies also
serve suites that test other ONNX runtimes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional, Union

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from jaxort.testing.harness import TOLERANCES, default_tolerance

try:
    import hypothesis.extra.numpy as hnp
    from hypothesis import strategies as st
except ImportError as _err:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "jaxort.testing.strategies needs hypothesis, a test extra of jaxort: "
        "pip install 'jaxort[test]' (or pip install hypothesis)"
    ) from _err

__all__ = [
    "BINARY_OPS",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "ModelCase",
    "TOLERANCES",
    "UINT_DTYPES",
    "UNARY_OPS",
    "arrays",
    "assert_matches_reference",
    "broadcastable_shapes",
    "default_tolerance",
    "dtypes",
    "elementwise_graphs",
    "mlp_models",
    "node_models",
    "shapes",
]

# bfloat16 comes from ml_dtypes (a jaxort dependency); onnx < 1.17 maps
# BFLOAT16 to uint16, so it cannot be asked.
_BF16 = np.dtype(ml_dtypes.bfloat16)


def _onnx_knows_bfloat16() -> bool:
    try:
        helper.np_dtype_to_tensor_dtype(_BF16)
    except (KeyError, TypeError):
        return False
    return True


# Each tuple is ordered so hypothesis shrinks toward the most common dtype.
# bfloat16 is drawn only where onnx's helpers and reference evaluator know it
# (onnx >= 1.17).
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)) + (
    (_BF16,) if _onnx_knows_bfloat16() else ())
INT_DTYPES = tuple(np.dtype(t) for t in (np.int32, np.int64, np.int8, np.int16))
UINT_DTYPES = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
_BOOL = np.dtype(np.bool_)
_KINDS = {"f": FLOAT_DTYPES, "i": INT_DTYPES, "u": UINT_DTYPES, "b": (_BOOL,)}

# Smallest normal number per float dtype: smaller magnitudes are drawn as zero,
# because XLA on CPU flushes subnormals to zero and numpy does not.
_TINY = {
    np.dtype(np.float16): 2.0 ** -14,
    _BF16: 2.0 ** -126,
    np.dtype(np.float32): 2.0 ** -126,
    np.dtype(np.float64): 2.0 ** -1022,
}

# Default value ranges: small enough that a few multiplications stay far from
# overflow in float16, large enough to cross the kinks and saturations of the
# usual activations.
_FLOAT_RANGE = (-4.0, 4.0)
_INT_RANGE = (-100, 100)

# Ops :func:`elementwise_graphs` draws by default. They accept every float
# dtype and keep finite inputs finite; Div, Log, Sqrt, Pow and Exp are left out
# because chained they hit poles or overflow.
UNARY_OPS = ("Relu", "Tanh", "Sigmoid", "Neg", "Abs")
BINARY_OPS = ("Add", "Sub", "Mul", "Max", "Min")


def _elem_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _default_opset() -> int:
    return onnx.defs.onnx_opset_version()


def _make_model(graph: onnx.GraphProto, opsets: Mapping[str, int]) -> onnx.ModelProto:
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    model = helper.make_model(graph, opset_imports=imports, producer_name="jaxort.testing")
    # The lowest IR version that holds these opsets, so older runtimes
    # (ONNX Runtime, other backends under test) read the model too.
    model.ir_version = helper.find_min_ir_version_for(imports)
    return model


def _draw(draw, value):
    """Draws ``value`` if it is a strategy, else returns it as is."""
    return draw(value) if isinstance(value, st.SearchStrategy) else value


# --------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True, eq=False)
class ModelCase:
    """A generated ONNX model and inputs for it.

    Attributes:
      model: the ``onnx.ModelProto``.
      inputs: one numpy array per graph input that is not an initializer, in
        graph input order.

    Example:
      >>> case = node_models("Relu").example()            # doctest: +SKIP
      >>> sorted(case.feeds)                              # doctest: +SKIP
      ['x0']
    """

    model: onnx.ModelProto
    inputs: tuple

    @property
    def input_names(self) -> list:
        """Names of the graph inputs that ``inputs`` feed, in order."""
        inits = {t.name for t in self.model.graph.initializer}
        return [i.name for i in self.model.graph.input if i.name not in inits]

    @property
    def output_names(self) -> list:
        """Names of the graph outputs."""
        return [o.name for o in self.model.graph.output]

    @property
    def feeds(self) -> dict:
        """Graph input name -> array, as ``InferenceSession.run`` and ``ReferenceEvaluator.run`` take."""
        return dict(zip(self.input_names, self.inputs))

    def __repr__(self) -> str:
        # Hypothesis prints falsifying examples with repr; a proto's text form
        # buries the inputs, so show the ops, the initializer shapes and the
        # input values instead.
        g = self.model.graph
        ops = [n.op_type for n in g.node]
        inits = {t.name: list(t.dims) for t in g.initializer}
        ins = ", ".join(
            f"{n}: {np.asarray(x).dtype}{list(np.shape(x))} "
            f"{np.array2string(np.asarray(x), threshold=64, precision=6, separator=', ')}"
            for n, x in self.feeds.items())
        opset = {i.domain or "ai.onnx": i.version for i in self.model.opset_import}
        return f"ModelCase(ops={ops}, opset={opset}, initializers={inits}, inputs={{{ins}}})"


# --------------------------------------------------------------------------- dtypes, shapes, arrays


def dtypes(kinds: str = "f", *, exclude: Sequence = ()) -> st.SearchStrategy:
    """Numpy dtypes of the given kinds.

    Args:
      kinds: characters naming the kinds: ``f`` float (float32, float64,
        float16, bfloat16), ``i`` signed int (int8 to int64), ``u`` unsigned
        int (uint8 to uint64), ``b`` bool. Shrinks toward the first kind's
        commonest dtype (float32, int32, uint8, bool).
      exclude: dtypes to leave out, e.g. ``["bfloat16"]`` for a runtime
        without it.

    Returns:
      A strategy of ``numpy.dtype``.

    Raises:
      ValueError: an unknown kind, or nothing left after ``exclude``.

    Example:
      >>> dtypes("fi", exclude=[np.float16]).example() in FLOAT_DTYPES + INT_DTYPES   # doctest: +SKIP
      True
    """
    unknown = set(kinds) - set(_KINDS)
    if unknown:
        raise ValueError(f"unknown dtype kinds {sorted(unknown)}; use some of 'f', 'i', 'u', 'b'")
    skip = {np.dtype(d) for d in exclude}
    choices = [d for k in dict.fromkeys(kinds) for d in _KINDS[k] if d not in skip]
    if not choices:
        raise ValueError(f"no dtypes of kinds {kinds!r} remain after excluding {sorted(map(str, skip))}")
    return st.sampled_from(choices)


def shapes(*, min_dims: int = 0, max_dims: int = 3, min_side: int = 1,
           max_side: int = 4) -> st.SearchStrategy:
    """Array shapes (tuples of ints), small by default so examples run fast.

    Args:
      min_dims: fewest dimensions (0 gives scalars).
      max_dims: most dimensions.
      min_side: smallest size of a dimension (0 allows empty arrays).
      max_side: largest size of a dimension.

    Returns:
      A strategy of ``tuple[int, ...]``.

    Example:
      >>> shapes(min_dims=2, max_dims=2).example()                  # doctest: +SKIP
      (3, 1)
    """
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                            max_side=max_side)


def broadcastable_shapes(num_shapes: int = 2, *, base_shape: Sequence[int] = (),
                         min_dims: int = 0, max_dims: int = 3, min_side: int = 1,
                         max_side: int = 4) -> st.SearchStrategy:
    """Tuples of shapes that broadcast together (numpy and ONNX multidirectional rules).

    Args:
      num_shapes: how many shapes each example holds.
      base_shape: a shape the result of broadcasting them all must be
        compatible with (``()`` for any).
      min_dims: fewest dimensions of each shape.
      max_dims: most dimensions of each shape.
      min_side: smallest size of a dimension.
      max_side: largest size of a dimension.

    Returns:
      A strategy of ``tuple[tuple[int, ...], ...]`` with ``num_shapes`` entries;
      ``numpy.broadcast_shapes(*shapes)`` succeeds on each.

    Example:
      >>> a, b = broadcastable_shapes().example()                   # doctest: +SKIP
      >>> np.broadcast_shapes(a, b)                                 # doctest: +SKIP
      (2, 3)
    """
    return hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, base_shape=tuple(base_shape), min_dims=min_dims,
        max_dims=max_dims, min_side=min_side, max_side=max_side,
    ).map(lambda r: tuple(r.input_shapes))


def _value_range(dt: np.dtype, min_value, max_value) -> tuple:
    if dt.kind == "f" or dt == _BF16:
        lo, hi = _FLOAT_RANGE
        return (lo if min_value is None else float(min_value),
                hi if max_value is None else float(max_value))
    info = np.iinfo(dt)
    lo, hi = _INT_RANGE
    lo = max(lo, int(info.min)) if min_value is None else int(min_value)
    hi = min(hi, int(info.max)) if max_value is None else int(max_value)
    return max(lo, int(info.min)), min(hi, int(info.max))


@st.composite
def arrays(draw, dtype: Any = np.float32, shape: Any = None, *,
           min_value: Optional[float] = None, max_value: Optional[float] = None,
           min_magnitude: float = 0.0) -> np.ndarray:
    """Finite numpy arrays with values in a per-dtype range.

    Floats are drawn in float64 within ``[min_value, max_value]`` and rounded
    to ``dtype`` (float16 and bfloat16 included); magnitudes below the dtype's
    smallest normal number become zero, since XLA on CPU flushes subnormals
    and numpy does not. Never NaN or infinity.

    Args:
      dtype: a numpy dtype (or name), or a strategy of them.
      shape: a shape tuple, or a strategy of them; default :func:`shapes`.
      min_value: smallest value; default -4 for floats, max(-100, dtype min)
        for integers.
      max_value: largest value; default 4 for floats, min(100, dtype max) for
        integers. Bool arrays ignore the range.
      min_magnitude: every value is at least this far from zero (a value
        drawn closer moves out to ``+-min_magnitude``, zero to
        ``+min_magnitude``); for inputs of Div, Reciprocal and the like.

    Returns:
      A strategy of ``numpy.ndarray`` with exactly ``dtype`` and ``shape``.

    Raises:
      ValueError: a dtype other than float, integer or bool, or an empty range.

    Example:
      >>> x = arrays(np.int8, (2, 3)).example()                      # doctest: +SKIP
      >>> x.dtype, x.shape, bool(np.all(np.abs(x) <= 100))          # doctest: +SKIP
      (dtype('int8'), (2, 3), True)
    """
    dt = np.dtype(_draw(draw, dtype))
    shp = tuple(draw(shapes()) if shape is None else _draw(draw, shape))
    if dt == _BOOL:
        return draw(hnp.arrays(_BOOL, shp))
    if dt.kind not in "iu" and dt not in _TINY:
        raise ValueError(f"arrays() draws float, integer and bool dtypes, not {dt}")
    lo, hi = _value_range(dt, min_value, max_value)
    if lo > hi:
        raise ValueError(f"empty value range [{lo}, {hi}] for {dt}")
    if dt.kind in "iu":
        x = draw(hnp.arrays(dt, shp, elements=st.integers(lo, hi)))
        if min_magnitude > 0:
            m = int(np.ceil(min_magnitude))
            wide = x.astype(np.int64)  # -m does not fit unsigned types
            x = np.where(wide < 0, np.minimum(wide, -m), np.maximum(wide, m)).astype(dt)
        return x
    x = draw(hnp.arrays(np.float64, shp, elements=st.floats(
        lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False)))
    if min_magnitude > 0:
        x = np.where(x < 0, np.minimum(x, -min_magnitude), np.maximum(x, min_magnitude))
    x = np.where(np.abs(x) < _TINY[dt], 0.0, x)
    return x.astype(dt)


# --------------------------------------------------------------------------- one-node models


def _per_input(value, n: int, what: str) -> list:
    """Expands a dtype/shape argument into one entry per input."""
    if isinstance(value, (list, tuple)) and not (what == "shape" and _is_shape(value)):
        if len(value) != n:
            raise ValueError(f"{len(value)} input {what}s given for {n} inputs")
        return list(value)
    return [value] * n


def _is_shape(value) -> bool:
    return isinstance(value, tuple) and all(isinstance(d, (int, np.integer)) for d in value)


def _resolve_attributes(draw, attributes, inputs) -> dict:
    if attributes is None:
        return {}
    if callable(attributes) and not isinstance(attributes, st.SearchStrategy):
        attributes = attributes(inputs)
    attributes = _draw(draw, attributes)
    return {k: _draw(draw, v) for k, v in dict(attributes).items()}


@st.composite
def node_models(
    draw,
    op_type: str,
    *,
    n_inputs: int = 1,
    input_dtypes: Any = None,
    input_shapes: Any = None,
    broadcast: bool = False,
    inputs: Optional[st.SearchStrategy] = None,
    attributes: Union[None, Mapping, st.SearchStrategy, Callable] = None,
    n_outputs: int = 1,
    opset: Optional[int] = None,
    domain: str = "",
    min_value: Optional[float] = None,
    max_value: Optional[float] = None,
    min_magnitude: float = 0.0,
) -> ModelCase:
    """One-node ONNX models with matching inputs.

    The node reads graph inputs ``x0, x1, ...`` and writes graph outputs
    ``y0, y1, ...``. Output types come from ONNX shape inference where it
    succeeds, so checkers and runtimes see typed outputs.

    Args:
      op_type: the node's op type.
      n_inputs: how many inputs to draw (ignored with ``inputs``).
      input_dtypes: one dtype or dtype strategy shared by all inputs (a
        strategy is drawn once, so elementwise ops get matching types), or a
        sequence with one dtype or strategy per input, where one strategy
        object listed for several inputs is drawn once for them (Where:
        ``[np.bool_, t, t]``). Default float32.
      input_shapes: one shape or shape strategy shared by all inputs, a
        sequence with one per input, or a strategy of a tuple of shapes.
        Default :func:`shapes`, one shape for all (or mutually broadcastable
        shapes with ``broadcast``).
      broadcast: draw mutually broadcastable shapes (for Add, Where, ...)
        when ``input_shapes`` is not given.
      inputs: a strategy of a tuple of arrays to use instead of drawing from
        the dtypes and shapes (for ops whose inputs constrain each other,
        like Gather's indices). A None entry is an absent optional input.
      attributes: the node's attributes: a dict name -> value or strategy; a
        strategy of such a dict; or a callable taking the drawn input tuple and
        returning either (for attributes that depend on the inputs, like an
        axis within the rank).
      n_outputs: how many outputs the node has.
      opset: the opset of ``domain``; default the newest that onnx knows.
      domain: the op's domain (its opset is imported beside the default
        domain's).
      min_value: passed to :func:`arrays` for drawn inputs.
      max_value: passed to :func:`arrays` for drawn inputs.
      min_magnitude: passed to :func:`arrays` for drawn inputs.

    Returns:
      A strategy of :class:`ModelCase`.

    Example:
      >>> softmax = node_models(
      ...     "Softmax", input_shapes=shapes(min_dims=1),
      ...     attributes=lambda xs: {"axis": st.integers(-xs[0].ndim, xs[0].ndim - 1)})
      >>> case = softmax.example()                                  # doctest: +SKIP
      >>> assert_matches_reference(case)                            # doctest: +SKIP
    """
    if inputs is not None:
        xs = tuple(None if x is None else np.asarray(x) for x in draw(inputs))
    else:
        if input_shapes is None:
            shps = draw(broadcastable_shapes(n_inputs)) if broadcast else [draw(shapes())] * n_inputs
        elif isinstance(input_shapes, st.SearchStrategy):
            drawn = draw(input_shapes)
            shps = [drawn] * n_inputs if _is_shape(drawn) else list(drawn)
        else:
            shps = [_draw(draw, s) for s in _per_input(input_shapes, n_inputs, "shape")]
        if input_dtypes is None or isinstance(input_dtypes, st.SearchStrategy):
            dts = [draw(input_dtypes) if input_dtypes is not None else np.float32] * n_inputs
        else:
            # A strategy listed for several inputs is drawn once for all of them.
            drawn_once = {}
            dts = []
            for d in _per_input(input_dtypes, n_inputs, "dtype"):
                if isinstance(d, st.SearchStrategy):
                    if id(d) not in drawn_once:
                        drawn_once[id(d)] = draw(d)
                    d = drawn_once[id(d)]
                dts.append(d)
        if len(shps) != n_inputs:
            raise ValueError(f"{len(shps)} input shapes drawn for {n_inputs} inputs")
        xs = tuple(draw(arrays(dt, tuple(s), min_value=min_value, max_value=max_value,
                               min_magnitude=min_magnitude)) for dt, s in zip(dts, shps))
    attrs = _resolve_attributes(draw, attributes, xs)

    names = [f"x{i}" if x is not None else "" for i, x in enumerate(xs)]
    while names and not names[-1]:
        names.pop()  # trailing absent optional inputs are omitted, not ""
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, name=f"{op_type.lower()}_0", domain=domain, **attrs)
    graph = helper.make_graph(
        [node], f"{op_type.lower()}_graph",
        [helper.make_tensor_value_info(n, _elem_type(x.dtype), list(np.shape(x)))
         for n, x in zip(names, xs) if n],
        [helper.make_empty_tensor_value_info(o) for o in outs])
    opsets = {"": opset or _default_opset()} if not domain else {
        "": _default_opset(), domain: opset or 1}
    model = _make_model(graph, opsets)
    _type_outputs(model)
    return ModelCase(model, tuple(x for x in xs if x is not None))


def _type_outputs(model: onnx.ModelProto) -> None:
    """Copies the types shape inference finds for the graph outputs into them."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an op without inference (or invalid on purpose) stays untyped
        return
    found = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for out in model.graph.output:
        vi = found.get(out.name)
        if vi is not None and vi.type.tensor_type.elem_type:
            out.type.CopyFrom(vi.type)


# --------------------------------------------------------------------------- multi-node graphs


def _seeded_rng(draw) -> np.random.Generator:
    # Weights come from a drawn seed, not element by element: shrinking a
    # weight matrix value by value is slow and rarely informative.
    return np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))


@st.composite
def mlp_models(
    draw,
    *,
    n_layers: tuple = (1, 3),
    widths: tuple = (1, 8),
    batch: tuple = (1, 4),
    activations: Sequence[str] = ("Relu", "Tanh", "Sigmoid"),
    linear_ops: Sequence[str] = ("MatMul", "Gemm"),
    dtype: Any = np.float32,
    bias: Union[bool, st.SearchStrategy] = True,
    dynamic_batch: bool = True,
    final_activation: Union[bool, st.SearchStrategy] = st.booleans(),
    opset: int = 17,
) -> ModelCase:
    """Random MLPs: chains of linear layers and activations, weights as initializers.

    Layer ``i`` is ``MatMul(h, fc{i}.weight)`` then ``Add(fc{i}.bias)``, or one
    ``Gemm`` (with ``transB`` drawn, the weight stored transposed), then an
    activation drawn from ``activations`` (after the last layer only with
    ``final_activation``). Weights are normal with standard deviation
    1/sqrt(fan_in); the input ``x`` is [batch, width0], the output ``y``
    [batch, width_last].

    Args:
      n_layers: (min, max) number of linear layers.
      widths: (min, max) width of every layer, input and output included.
      batch: (min, max) batch size of the drawn input.
      activations: op types to draw activations from (one-input, shape
        preserving: Relu, Tanh, Sigmoid, Softsign, Elu, ...).
      linear_ops: ``"MatMul"`` (MatMul + Add) and/or ``"Gemm"``.
      dtype: float dtype of the input and weights, or a strategy of one.
      bias: add a bias to each layer (or a strategy of bools, drawn once).
      dynamic_batch: declare the batch dimension as ``"batch"`` instead of
        its drawn size, as exporters with dynamic axes do.
      final_activation: put an activation after the last layer too (a bool
        or a strategy drawn once).
      opset: the default domain's opset; 17 (IR 8) loads in every ONNX
        Runtime since 1.13.

    Returns:
      A strategy of :class:`ModelCase` with one input ``x`` and output ``y``.

    Example:
      >>> case = mlp_models(n_layers=(2, 2), activations=["Relu"]).example()   # doctest: +SKIP
      >>> [n.op_type for n in case.model.graph.node]                           # doctest: +SKIP
      ['MatMul', 'Add', 'Relu', 'Gemm']
    """
    dt = np.dtype(_draw(draw, dtype))
    layers = draw(st.integers(*n_layers))
    dims = [draw(st.integers(*widths)) for _ in range(layers + 1)]
    n = draw(st.integers(*batch))
    use_bias = _draw(draw, bias)
    last_act = _draw(draw, final_activation)
    rng = _seeded_rng(draw)

    nodes, inits = [], []
    h = "x"
    for i in range(layers):
        fan_in, fan_out = dims[i], dims[i + 1]
        w = rng.normal(0.0, 1.0 / np.sqrt(fan_in), (fan_in, fan_out))
        b = rng.normal(0.0, 0.1, (fan_out,))
        op = draw(st.sampled_from(list(linear_ops)))
        out = f"fc{i}.out"
        if op == "Gemm":
            trans_b = draw(st.booleans())
            inits.append(numpy_helper.from_array((w.T if trans_b else w).astype(dt), f"fc{i}.weight"))
            ins = [h, f"fc{i}.weight"]
            if use_bias:
                inits.append(numpy_helper.from_array(b.astype(dt), f"fc{i}.bias"))
                ins.append(f"fc{i}.bias")
            nodes.append(helper.make_node("Gemm", ins, [out], name=f"fc{i}_gemm", transB=int(trans_b)))
        elif op == "MatMul":
            inits.append(numpy_helper.from_array(w.astype(dt), f"fc{i}.weight"))
            mm = f"fc{i}.mm" if use_bias else out
            nodes.append(helper.make_node("MatMul", [h, f"fc{i}.weight"], [mm], name=f"fc{i}_matmul"))
            if use_bias:
                inits.append(numpy_helper.from_array(b.astype(dt), f"fc{i}.bias"))
                nodes.append(helper.make_node("Add", [mm, f"fc{i}.bias"], [out], name=f"fc{i}_add"))
        else:
            raise ValueError(f"linear_ops holds {op!r}; use 'MatMul' and/or 'Gemm'")
        h = out
        if i < layers - 1 or last_act:
            act = draw(st.sampled_from(list(activations)))
            nodes.append(helper.make_node(act, [h], [f"act{i}.out"], name=f"act{i}"))
            h = f"act{i}.out"
    nodes[-1].output[0] = "y"

    batch_dim = "batch" if dynamic_batch else n
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", _elem_type(dt), [batch_dim, dims[0]])],
        [helper.make_tensor_value_info("y", _elem_type(dt), [batch_dim, dims[-1]])],
        inits)
    x = draw(arrays(dt, (n, dims[0])))
    return ModelCase(_make_model(graph, {"": opset}), (x,))


@st.composite
def elementwise_graphs(
    draw,
    *,
    n_nodes: tuple = (1, 6),
    n_inputs: tuple = (1, 3),
    n_initializers: tuple = (0, 2),
    unary_ops: Sequence[str] = UNARY_OPS,
    binary_ops: Sequence[str] = BINARY_OPS,
    dtype: Any = np.float32,
    max_dims: int = 3,
    max_side: int = 4,
    dynamic_shapes: bool = False,
    min_value: float = -1.0,
    max_value: float = 1.0,
    opset: int = 17,
) -> ModelCase:
    """Random DAGs of elementwise ops over broadcastable inputs and initializers.

    Each node's first operand is the previous node's output (so the graph is a
    chain at its core, as deep as ``n_nodes``); a binary op's second operand is
    any earlier value: a graph input, an initializer or an intermediate. The
    graph outputs are the last value and, sometimes, one intermediate value
    (which exercises outputs that other nodes also read).

    Args:
      n_nodes: (min, max) number of op nodes.
      n_inputs: (min, max) number of graph inputs ``x0, x1, ...``.
      n_initializers: (min, max) number of initializers ``c0, c1, ...``.
      unary_ops: one-input op types to draw (with the dtype in their schema).
      binary_ops: two-input broadcasting op types to draw.
      dtype: dtype of every input and initializer, or a strategy of one. Make
        sure the ops accept it (the defaults accept every float dtype).
      max_dims: most dimensions of an input.
      max_side: largest size of a dimension.
      dynamic_shapes: declare input and output dimensions symbolic
        (``x0_d0, x0_d1, ...``).
      min_value: smallest drawn input or initializer value.
      max_value: largest drawn input or initializer value; the defaults
        keep chains of Mul far from overflow.
      opset: the default domain's opset.

    Returns:
      A strategy of :class:`ModelCase`.

    Example:
      >>> case = elementwise_graphs(dtype=dtypes("f")).example()     # doctest: +SKIP
      >>> assert_matches_reference(case)                              # doctest: +SKIP
    """
    if n_nodes[0] < 1 or n_inputs[0] < 1:
        raise ValueError("elementwise_graphs needs at least one node and one input")
    dt = np.dtype(_draw(draw, dtype))
    k = draw(st.integers(*n_inputs))
    c = draw(st.integers(*n_initializers))
    shps = draw(broadcastable_shapes(k + c, max_dims=max_dims, max_side=max_side))
    values = [arrays(dt, s, min_value=min_value, max_value=max_value) for s in shps]
    xs = tuple(draw(v) for v in values[:k])
    consts = [draw(v) for v in values[k:]]

    pool = [(f"x{i}", s) for i, s in enumerate(shps[:k])]
    pool += [(f"c{i}", s) for i, s in enumerate(shps[k:])]
    ops = [(op, 1) for op in unary_ops] + [(op, 2) for op in binary_ops]
    if not ops:
        raise ValueError("elementwise_graphs needs at least one unary or binary op")
    nodes = []
    prev = pool[draw(st.integers(0, len(pool) - 1))]
    for i in range(draw(st.integers(*n_nodes))):
        op, arity = draw(st.sampled_from(ops))
        operands = [prev]
        if arity == 2:
            operands.append(pool[draw(st.integers(0, len(pool) - 1))])
            if draw(st.booleans()):
                operands.reverse()  # the chained value is not always the left operand
        out = (f"v{i}", np.broadcast_shapes(*(s for _, s in operands)))
        nodes.append(helper.make_node(op, [n for n, _ in operands], [out[0]], name=f"{op.lower()}_{i}"))
        pool.append(out)
        prev = out

    outputs = [prev]
    intermediates = pool[k + c:-1]
    if intermediates and draw(st.booleans()):
        outputs.append(intermediates[draw(st.integers(0, len(intermediates) - 1))])

    def dims(name, shape):
        return [f"{name}_d{j}" for j in range(len(shape))] if dynamic_shapes else list(shape)

    elem = _elem_type(dt)
    graph = helper.make_graph(
        nodes, "elementwise",
        [helper.make_tensor_value_info(n, elem, dims(n, s)) for n, s in pool[:k]],
        [helper.make_tensor_value_info(n, elem, dims(n, s)) for n, s in outputs],
        [numpy_helper.from_array(v, f"c{i}") for i, v in enumerate(consts)])
    return ModelCase(_make_model(graph, {"": opset}), xs)


# --------------------------------------------------------------------------- reference check


def assert_matches_reference(
    model: Union[onnx.ModelProto, ModelCase],
    inputs: Union[Sequence, Mapping, None] = None,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    **kwargs,
) -> tuple:
    """:func:`jaxort.testing.assert_matches_reference` with ONNX's reference evaluator.

    Kept here, with its first four parameters in this order, for code that
    imports it from the strategies module; the keywords (``scale``, ``jit``,
    ``enable_x64``, ``reference``) are those of the checker.
    """
    from jaxort.testing.checks import assert_matches_reference as check

    return check(model, inputs, rtol=rtol, atol=atol, **kwargs)
