"""Checking one ONNX node (or a small model) run through jaxort against ONNX's reference.

The pieces an op test needs, one implementation each: build a one-node model
(:class:`NodeCase`, :func:`node_model`), run it through ONNX's
``ReferenceEvaluator`` (:func:`run_reference`) and through jaxort
(:func:`run_jaxort`: jitted, strict dtype promotion, 64-bit types enabled), and
compare the outputs (:func:`assert_outputs_match`) with one per-dtype tolerance
table (:data:`TOLERANCES`), scaled per op where its math needs more room::

    import numpy as np
    from jaxort.testing import NodeCase, check_node

    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    check_node(NodeCase("Softmax", (x,), {"axis": -1}), scale=10)

A failed comparison names the output and says how far apart the values are
and where (max absolute and relative error, the worst element's index and
both values there).

This module imports numpy, onnx and ml_dtypes; JAX and jaxort's graph layer
load when :func:`run_jaxort` runs, so building and comparing also serve
suites that test other runtimes. It must not import hypothesis.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from jaxort.dtypes import to_onnx_type
from jaxort.graph import tensor_from_numpy

__all__ = [
    "NodeCase",
    "TOLERANCES",
    "assert_outputs_match",
    "check_node",
    "default_tolerance",
    "node_model",
    "run_jaxort",
    "run_reference",
]

# (rtol, atol) per float dtype for an op computed in the dtype of its
# reference: a few units in the last place. An op whose math accumulates
# (matmul, convolution, normalization, transcendental chains) scales both by a
# factor stated where it is tested; exact types (integers, bools, strings)
# compare equal.
TOLERANCES = {
    np.dtype(np.float16): (1e-3, 1e-3),
    np.dtype(ml_dtypes.bfloat16): (1.6e-2, 1.6e-2),
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float64): (1e-10, 1e-12),
}


def default_tolerance(dtype) -> tuple:
    """``(rtol, atol)`` for comparing values of ``dtype`` (zeros for exact types).

    Example:
      >>> default_tolerance(np.float32)
      (1e-05, 1e-06)
    """
    return TOLERANCES.get(np.dtype(dtype), (0.0, 0.0))


# --------------------------------------------------------------------------- models


def _tensor(name: str, value: np.ndarray) -> onnx.TensorProto:
    # tensor_from_numpy keeps ml_dtypes' types (bfloat16, float8, 4-bit) on
    # every onnx version; numpy_helper.from_array does not before onnx 1.17.
    if value.dtype.kind in "OUS":
        return helper.make_tensor(name, onnx.TensorProto.STRING, value.shape,
                                  [str(v).encode() for v in value.reshape(-1)])
    return tensor_from_numpy(value, name)


def node_model(
    op_type: str,
    inputs: Sequence,
    attributes: Optional[Mapping] = None,
    *,
    opset: Optional[int] = None,
    n_outputs: int = 1,
    initializers: Sequence[int] = (),
    domain: str = "",
) -> onnx.ModelProto:
    """A model of one node: inputs ``in0, in1, ...``, outputs ``out0, out1, ...``.

    Args:
      op_type: the node's op type.
      inputs: one numpy array per input in schema order; None is an absent
        optional input (left out when trailing, else named ``""``).
      attributes: the node's attributes, name -> value.
      opset: the opset of ``domain`` (and of the default domain); default the
        newest the installed onnx knows.
      n_outputs: how many outputs the node has.
      initializers: indices of inputs stored as initializers rather than
        graph inputs, so that jaxort sees them as static values at trace time.
      domain: the op's domain.

    Returns:
      An ``onnx.ModelProto`` whose graph inputs are the non-initializer
      inputs, in order, with their dtypes and shapes.

    Example:
      >>> m = node_model("Add", [np.ones(2, np.float32), np.ones(2, np.float32)])
      >>> [i.name for i in m.graph.input], [o.name for o in m.graph.output]
      (['in0', 'in1'], ['out0'])
    """
    values = [None if x is None else np.asarray(x) for x in inputs]
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(values)]
    while names and not names[-1]:
        names.pop()
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **dict(attributes or {}))
    static = set(initializers)
    graph_inputs, inits = [], []
    for i, (name, x) in enumerate(zip(names, values)):
        if not name:
            continue
        if i in static:
            inits.append(_tensor(name, x))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                name, to_onnx_type(x.dtype), list(x.shape)))
    graph = helper.make_graph([node], op_type.lower(), graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    version = onnx.defs.onnx_opset_version() if opset is None else opset
    imports = [helper.make_opsetid("", version)]
    if domain:
        imports.append(helper.make_opsetid(domain, version))
    return helper.make_model(graph, opset_imports=imports)


@dataclasses.dataclass(frozen=True, eq=False)
class NodeCase:
    """One node and its inputs: what an op test draws or writes out.

    Attributes:
      op_type: the node's op type.
      inputs: one array per input in schema order, None for an absent
        optional input.
      attributes: the node's attributes.
      opset: the opset; default the newest the installed onnx knows.
      n_outputs: how many outputs the node has.
      initializers: indices of inputs stored as initializers (static at
        trace time).
      domain: the op's domain.

    Example:
      >>> case = NodeCase("Reshape", (np.zeros((2, 3)), np.array([3, 2])), initializers=(1,))
      >>> sorted(case.feeds), len(case.args)
      (['in0'], 1)
    """

    op_type: str
    inputs: tuple = ()
    attributes: Mapping = dataclasses.field(default_factory=dict)
    opset: Optional[int] = None
    n_outputs: int = 1
    initializers: tuple = ()
    domain: str = ""

    def model(self) -> onnx.ModelProto:
        """The one-node model (see :func:`node_model`)."""
        return node_model(self.op_type, self.inputs, self.attributes, opset=self.opset,
                          n_outputs=self.n_outputs, initializers=self.initializers,
                          domain=self.domain)

    @property
    def args(self) -> list:
        """The graph inputs' values, in graph input order."""
        return [np.asarray(x) for i, x in enumerate(self.inputs)
                if x is not None and i not in self.initializers]

    @property
    def feeds(self) -> dict:
        """Graph input name -> value, as ``ReferenceEvaluator.run`` takes them."""
        return {f"in{i}": np.asarray(x) for i, x in enumerate(self.inputs)
                if x is not None and i not in self.initializers}


def _model_and_feeds(model, inputs) -> tuple:
    """(ModelProto, graph input name -> value) from a case or a model and its inputs."""
    if isinstance(model, NodeCase):
        return model.model(), model.feeds if inputs is None else inputs
    if hasattr(model, "model") and hasattr(model, "feeds"):  # strategies.ModelCase
        return model.model, model.feeds if inputs is None else inputs
    if isinstance(inputs, Mapping):
        return model, dict(inputs)
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    args = list(inputs or ())
    if len(args) != len(names):
        raise AssertionError(f"{len(args)} inputs given for graph inputs {names}")
    return model, dict(zip(names, args))


def _as_outputs(values) -> list:
    """Numpy arrays; sequences stay lists, absent optionals stay None."""
    out = []
    for v in values:
        if v is None or isinstance(v, list):
            out.append(v if v is None else _as_outputs(v))
        else:
            out.append(np.asarray(v))
    return out


# --------------------------------------------------------------------------- running


def run_reference(model, inputs: Union[Sequence, Mapping, None] = None) -> list:
    """Runs ONNX's ``ReferenceEvaluator`` on a case or a model and its inputs.

    Args:
      model: a :class:`NodeCase`, a ``strategies.ModelCase``, or an
        ``onnx.ModelProto``.
      inputs: graph input name -> value, or values in graph input order;
        default a case's own inputs.

    Returns:
      One entry per graph output: a numpy array, a list for a sequence, None
      for an empty optional.
    """
    from onnx.reference import ReferenceEvaluator

    proto, feeds = _model_and_feeds(model, inputs)
    return _as_outputs(ReferenceEvaluator(proto, new_ops=[_float64_erf()]).run(None, feeds))


@functools.lru_cache(maxsize=None)
def _float64_erf():
    """ONNX's reference Erf, except that float64 inputs are computed in float64.

    onnx's own (``onnx.reference.ops.op_erf``) evaluates ``math.erf`` through
    ``np.vectorize(..., otypes=["f"])``: in float32 whatever the input type, so
    its float64 results are off by up to ~3e-8, where jaxort's are exact.
    """
    import math

    from onnx.reference.ops.op_erf import Erf

    class Erf64(Erf):
        op_domain = ""

        def _run(self, x):
            if np.asarray(x).dtype == np.float64:
                return (np.vectorize(math.erf, otypes=[np.float64])(x),)
            return super()._run(x)

    Erf64.__name__ = "Erf"
    return Erf64


def run_jaxort(
    model,
    inputs: Union[Sequence, Mapping, None] = None,
    *,
    jit: bool = True,
    rng: Any = None,
    params: Optional[Sequence[str]] = (),
    strict_dtypes: bool = True,
    enable_x64: bool = True,
) -> list:
    """Traces a case or a model with :class:`jaxort.graph.JaxGraph` and runs it.

    Args:
      model: a :class:`NodeCase`, a ``strategies.ModelCase``, or an
        ``onnx.ModelProto``.
      inputs: graph input name -> value, or values in graph input order;
        default a case's own inputs.
      jit: run ``jax.jit(apply)``; False runs op by op, where static inputs
        fold with numpy (and string tensors work).
      rng: a PRNG key for random ops.
      params: initializer names that become traced parameters; the default
        ``()`` keeps every initializer static, as an op test wants; None
        takes ``JaxGraph``'s default (the float initializers).
      strict_dtypes: run under ``jax.numpy_dtype_promotion("strict")`` so a
        silent upcast fails.
      enable_x64: run with 64-bit types, so int64 and float64 keep their
        width; float32 graphs still compute in float32.

    Returns:
      One entry per graph output: a numpy array, a list for a sequence, None
      for an empty optional.
    """
    import jax

    from jaxort.graph import JaxGraph, x64_enabled_scope

    proto, feeds = _model_and_feeds(model, inputs)
    graph = JaxGraph(proto, check=False, params=None if params is None else list(params))
    args = [feeds[n] for n in graph.input_names]
    with contextlib.ExitStack() as stack:
        if enable_x64:
            stack.enter_context(x64_enabled_scope())
        if strict_dtypes:
            stack.enter_context(jax.numpy_dtype_promotion("strict"))
        fn = jax.jit(graph.apply) if jit else graph.apply
        return _as_outputs(fn(graph.params, *args, rng=rng))


# --------------------------------------------------------------------------- comparing


def _tolerance(dtype: np.dtype, scale, overrides: Mapping) -> tuple:
    for key, tol in overrides.items():
        if np.dtype(key) == dtype:
            return tol
    rtol, atol = TOLERANCES[dtype]
    if isinstance(scale, Mapping):
        scale = next((s for k, s in scale.items() if np.dtype(k) == dtype), 1.0)
    return rtol * scale, atol * scale


def _value_diff(where: str, got: np.ndarray, expected: np.ndarray, rtol: float, atol: float,
                equal_nan: bool) -> None:
    g, e = got.astype(np.float64), expected.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=equal_nan)
        if close.all():
            return
        err = np.abs(g - e)
        rel = err / np.abs(e)
        excess = np.where(close, -np.inf, np.nan_to_num(err - atol - rtol * np.abs(e),
                                                        nan=np.inf))
    worst = np.unravel_index(int(np.argmax(excess)), e.shape) if e.ndim else ()
    bad = ~close
    raise AssertionError(
        f"{where}: {int(bad.sum())} of {e.size} values differ beyond rtol={rtol:.3g}, "
        f"atol={atol:.3g}; max abs error {np.nanmax(np.where(bad, err, 0)):.6g}, "
        f"max rel error {np.nanmax(np.where(bad, rel, 0)):.6g}; worst at index "
        f"{tuple(int(i) for i in worst)}: got {g[worst]!r}, expected {e[worst]!r}\n"
        f"got:      {np.array2string(got, threshold=40, precision=6)}\n"
        f"expected: {np.array2string(expected, threshold=40, precision=6)}")


def _compare(where, got, expected, scale, overrides, bits, equal_nan) -> None:
    if isinstance(expected, list):
        assert isinstance(got, list), f"{where}: expected a sequence, got {type(got).__name__}"
        assert len(got) == len(expected), (
            f"{where}: sequence of {len(got)} tensors, expected {len(expected)}")
        for i, (g, e) in enumerate(zip(got, expected)):
            _compare(f"{where}[{i}]", g, e, scale, overrides, bits, equal_nan)
        return
    if expected is None:
        assert got is None, f"{where}: expected an empty optional, got {type(got).__name__}"
        return
    g, e = np.asarray(got), np.asarray(expected)
    if e.dtype.kind in "US":  # ONNX string tensors are numpy object arrays
        e = e.astype(object)
    assert g.dtype == e.dtype, f"{where}: dtype {g.dtype} != expected {e.dtype}"
    assert g.shape == e.shape, f"{where}: shape {g.shape} != expected {e.shape}"
    if bits:
        assert g.tobytes() == e.tobytes(), f"{where}: bits differ"
    elif e.dtype in TOLERANCES:
        rtol, atol = _tolerance(e.dtype, scale, overrides)
        _value_diff(where, g, e, rtol, atol, equal_nan)
    elif e.dtype.kind == "V":  # float8, float4, int4 (ml_dtypes): compare as float
        _value_diff(where, g.astype(np.float32), e.astype(np.float32), 0.0, 0.0, True)
    else:
        np.testing.assert_array_equal(g, e, err_msg=where)


def assert_outputs_match(
    got: Sequence,
    expected: Sequence,
    *,
    scale: Union[float, Mapping] = 1.0,
    tolerances: Optional[Mapping] = None,
    names: Optional[Sequence[str]] = None,
    bits: bool = False,
    equal_nan: bool = True,
) -> None:
    """Asserts two output lists agree: count, then per output dtype, shape and values.

    Floats compare within :data:`TOLERANCES` (in float64); integers, bools
    and strings compare equal; float8/int4 types compare as float32, exactly;
    sequences compare element by element and empty optionals must both be None.

    Args:
      got: the outputs under test (numpy arrays, lists for sequences, None).
      expected: the reference outputs, in the same order.
      scale: a factor on both ``rtol`` and ``atol`` of every float dtype, or a
        mapping dtype -> factor (unlisted dtypes keep 1).
      tolerances: dtype -> ``(rtol, atol)`` used as is instead of the table,
        e.g. for a reference that computes float64 inputs in float32.
      names: output names for messages; default ``output 0``, ``output 1``, ...
      bits: compare the raw bytes instead of values (bit casts).
      equal_nan: NaN equals NaN.

    Raises:
      AssertionError: a difference; the message names the output and, for
        values, gives the max absolute and relative error and the worst
        element's index and values.

    Example:
      >>> assert_outputs_match([np.float32([1.0])], [np.float32([1.000001])])
    """
    assert len(got) == len(expected), (
        f"{len(got)} outputs, the reference gave {len(expected)}")
    wheres = ([f"output {n!r}" for n in names] if names is not None
              else [f"output {i}" for i in range(len(expected))])
    for where, g, e in zip(wheres, got, expected):
        _compare(where, g, e, scale, tolerances or {}, bits, equal_nan)


def check_node(case: NodeCase, *, scale: Union[float, Mapping] = 1.0, jit: bool = True,
               **compare) -> list:
    """Runs a case through jaxort and the reference evaluator and asserts they match.

    Args:
      case: the node and its inputs.
      scale: tolerance factor (see :func:`assert_outputs_match`).
      jit: run jaxort under ``jax.jit``.
      **compare: further keywords of :func:`assert_outputs_match`.

    Returns:
      jaxort's outputs.
    """
    expected = run_reference(case)
    got = run_jaxort(case, jit=jit)
    assert_outputs_match(got, expected, scale=scale, **compare)
    return got
