"""The gradient graph of a training model, for ONNX Runtime to run.

jaxort trains with ``jax.grad`` and never runs a gradient graph. ONNX Runtime
does: its ``Module`` runs training_model.onnx, and a trainable parameter's
gradient reaches it only through the ``com.microsoft::InPlaceAccumulatorV2``
node that writes ``<param>_grad.accumulation.buffer`` (its output
``<param>_grad.accumulation.out`` is a bool flag). :func:`add_gradient_graph`
appends that part to a forward + loss model: reverse-mode differentiation
node by node, then one accumulator per parameter, as ORT's gradient builder
ends its graph.

Each node's rule writes what ORT's gradient builder writes for the op where
that is one of ORT's gradient kernels (ConvGrad, BatchNormalizationGrad,
LayerNormalizationGrad, SoftmaxGrad_13, FusedMatMul, GatherGrad, ReluGrad,
SigmoidGrad, TanhGrad, QuickGeluGrad, SoftmaxCrossEntropyLossGrad, Scale,
LSTMGrad, GRUGrad, ...; ``x * Sigmoid(x)`` is first fused into QuickGelu, as
ORT fuses it), and standard ONNX ops otherwise. With the same kernels ORT computes
the same float32 gradients as on its own artifacts, bit for bit on the
corpus's convolutional networks; docs/gradient-graph.md shows why that
matters and why the rules are per node rather than JAX's backward pass
converted to ONNX (a jaxpr of ``jax.grad`` has XLA primitives with no ONNX
op, recomputes the forward pass, and rounds as XLA does). jaxort's graph
executor runs all of these kernels, so the graphs can be checked without ORT.

The rules cover the ops of MLPs, CNNs, transformers, LSTMs, GRUs and ORT's
losses (see :data:`RULES` and :data:`MS_RULES`); any other op on the path
from a trainable parameter to the loss is a
:class:`jaxort.errors.TrainingError` naming the node and op, raised before
any file is written.

Part of the training layer: it uses onnx only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, helper

from jaxort.errors import TrainingError
from jaxort.graph._model import numpy_dtype, tensor_from_numpy, tensor_to_numpy
from jaxort.graph.ops._common import auto_pads

__all__ = ["MS_RULES", "RULES", "add_gradient_graph", "gradient_name", "to_batch_norm_internal"]

# The lowest default-domain opset the rules are written for (ReduceSum and
# Unsqueeze take axes as an input from 13); MaxPool's needs 16 (ScatterElements
# reduces from 16).
MIN_OPSET = 13
_MS_DOMAIN = "com.microsoft"


def gradient_name(param: str) -> str:
    """The value holding a parameter's gradient, as ORT names it (``<param>_grad``)."""
    return f"{param}_grad"


class _Emitter:
    """Appends gradient nodes and constants to a graph, with unique names."""

    def __init__(self, model: onnx.ModelProto, shapes: dict, opset: int):
        self.model = model
        self.shapes = shapes
        self.opset = opset
        self.nodes: list = []
        self.count = 0
        taken = {v for n in model.graph.node for v in n.output}
        taken.update(i.name for i in model.graph.input)
        taken.update(t.name for t in model.graph.initializer)
        self._taken = taken
        self._constants: Optional[dict] = None

    def name(self, hint: str) -> str:
        while True:
            self.count += 1
            name = f"jaxort_grad/{hint}_{self.count}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, domain: str = "", **attrs):
        if op_type == "Transpose" and list(attrs.get("perm", [0, 1])) == list(range(len(attrs.get("perm", [])))):
            # No identity transposes: with one (perm [0, 1]) before a ScatterND, ORT 1.19.2's
            # training session ran the ScatterND on transposed updates; without it, it trains.
            return inputs[0]
        outs = [self.name(op_type) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.name(f"{op_type}_node"),
                                           domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, elem_type: int) -> str:
        # A Constant node, not an initializer: the training model's initializers stay
        # the forward model's constants, as in ORT's files.
        return self.op("Constant", [], value=tensor_from_numpy(np.asarray(value, dtype=numpy_dtype(elem_type))))

    def static(self, name: str) -> Optional[np.ndarray]:
        """The value of an initializer or a Constant node's output, else None (indexed once)."""
        if self._constants is None:
            self._constants = _constant_sources(self.model.graph)
        return _static(self._constants.get(name))

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(list(values), np.int64), TensorProto.INT64)

    def elem_type(self, value: str) -> int:
        return self.shapes[value][0]

    def dims(self, value: str) -> Optional[list]:
        return self.shapes.get(value, (0, None))[1]


def _shapes(model: onnx.ModelProto) -> dict:
    """name -> (elem_type, dims or None); a dim is an int, a dim_param string, or None."""
    # onnx's shape inference does not know BatchNormInternal; its output 0 has the shape
    # of a BatchNormalization's.
    # Nor LSTMTraining and GRUTraining; their first outputs are an LSTM's and a GRU's.
    # Nor QuickGelu, elementwise.
    plain = onnx.ModelProto()
    plain.CopyFrom(model)
    for node in plain.graph.node:
        if node.op_type == "BatchNormInternal" and node.domain == _MS_DOMAIN:
            node.op_type, node.domain = "BatchNormalization", ""
            del node.output[1:]
            kept = [a for a in node.attribute if a.name in ("epsilon", "momentum")]
            del node.attribute[:]
            node.attribute.extend(kept)
        elif node.op_type == "QuickGelu" and node.domain == _MS_DOMAIN:  # elementwise
            node.op_type, node.domain = "Sigmoid", ""
            del node.attribute[:]
        elif node.op_type in _RNN_PLAIN and node.domain == _MS_DOMAIN:
            plain_op = _RNN_PLAIN[node.op_type]
            node.op_type, node.domain = plain_op, ""
            del node.output[_RNN_STATES[plain_op]:]
    inferred = onnx.shape_inference.infer_shapes(plain, strict_mode=False)
    out = {}
    infos = [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]
    for vi in infos:
        t = vi.type.tensor_type
        dims = None
        if t.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        out[vi.name] = (t.elem_type, dims)
    for init in inferred.graph.initializer:
        out[init.name] = (init.data_type, list(init.dims))
    return out


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _constant_sources(graph: onnx.GraphProto) -> dict:
    """Value name -> the initializer or Constant node that holds it (read with :func:`_static`)."""
    sources = {t.name: t for t in graph.initializer}
    sources.update({n.output[0]: n for n in graph.node if n.op_type == "Constant"})
    return sources


def _static(source) -> Optional[np.ndarray]:
    """The value of an initializer or of a Constant node (None for anything else)."""
    if isinstance(source, onnx.TensorProto):
        return tensor_to_numpy(source)
    if isinstance(source, onnx.NodeProto):
        value = _attrs(source).get("value")
        return None if value is None else tensor_to_numpy(value)
    return None


def _error(node: onnx.NodeProto, why: str) -> TrainingError:
    return TrainingError(f"cannot write the gradient graph ONNX Runtime needs: node {node.name!r} "
                         f"({node.domain or 'ai.onnx'}::{node.op_type}) {why}")


# --------------------------------------------------------------------------- helpers of the rules


def _unbroadcast(em: _Emitter, node, dy: str, x: str, y: str) -> str:
    """``dy`` summed over the axes along which ``x`` was broadcast to ``y``'s shape."""
    sx, sy = em.dims(x), em.dims(y)
    if sx is None or sy is None:
        raise _error(node, f"has an input {x!r} or output {y!r} of unknown rank")
    if sx == sy:
        return dy
    lead = len(sy) - len(sx)
    axes = list(range(lead))
    for i, dx_ in enumerate(sx):
        dy_ = sy[lead + i]
        if dx_ == dy_:
            continue
        if dx_ == 1:
            axes.append(lead + i)
        elif isinstance(dx_, int) and isinstance(dy_, int):
            raise _error(node, f"broadcasts input {x!r} of shape {sx} to {sy}")
        else:  # a dimension of unknown size: which axes broadcast is decided at run time
            return _unbroadcast_at_run_time(em, dy, x, y, lead)
    if not axes:
        return dy
    reduced = em.op("ReduceSum", [dy, em.ints(axes)], keepdims=1)
    return em.op("Reshape", [reduced, em.op("Shape", [x])]) if lead else reduced


def _unbroadcast_at_run_time(em: _Emitter, dy: str, x: str, y: str, lead: int) -> str:
    # Sum over the axes where x (its shape padded with leading ones) is 1 and y is not.
    one = em.ints([1])
    shape_x = em.op("Shape", [x])
    if lead:
        shape_x = em.op("Concat", [em.ints([1] * lead), shape_x], axis=0)
    shape_y = em.op("Shape", [y])
    broadcast = em.op("And", [em.op("Equal", [shape_x, one]), em.op("Not", [em.op("Equal", [shape_y, one])])])
    axes = em.op("Reshape", [em.op("NonZero", [broadcast]), em.ints([-1])])
    reduced = em.op("ReduceSum", [dy, axes], keepdims=1, noop_with_empty_axes=1)
    return em.op("Reshape", [reduced, em.op("Shape", [x])])


def _filled(em: _Emitter, value: float, like: str, shape: Optional[str] = None) -> str:
    """A tensor of ``value`` in ``like``'s dtype, of ``like``'s shape or the 1-D shape tensor ``shape``."""
    fill = tensor_from_numpy(np.full(1, value, numpy_dtype(em.elem_type(like))))
    return em.op("ConstantOfShape", [shape or em.op("Shape", [like])], value=fill)


def _scalar(em: _Emitter, value: float, like: str) -> str:
    return em.const(value, em.elem_type(like))


# --------------------------------------------------------------------------- the rules
#
# A rule gets the emitter, the node, the gradients of its outputs (None where an
# output does not reach the loss) and which inputs need a gradient; it returns
# one gradient (or None) per input.


def _add(em, node, dys, needs):
    a, b = node.input
    return [_unbroadcast(em, node, dys[0], a, node.output[0]) if needs[0] else None,
            _unbroadcast(em, node, dys[0], b, node.output[0]) if needs[1] else None]


def _sub(em, node, dys, needs):
    a, b = node.input
    return [_unbroadcast(em, node, dys[0], a, node.output[0]) if needs[0] else None,
            _unbroadcast(em, node, em.op("Neg", [dys[0]]), b, node.output[0]) if needs[1] else None]


def _mul(em, node, dys, needs):
    a, b = node.input
    y = node.output[0]
    return [_unbroadcast(em, node, em.op("Mul", [dys[0], b]), a, y) if needs[0] else None,
            _unbroadcast(em, node, em.op("Mul", [dys[0], a]), b, y) if needs[1] else None]


def _div(em, node, dys, needs):
    a, b = node.input
    y = node.output[0]
    da = _unbroadcast(em, node, em.op("Div", [dys[0], b]), a, y) if needs[0] else None
    db = None
    if needs[1]:
        db = _unbroadcast(em, node, em.op("Neg", [em.op("Div", [em.op("Mul", [dys[0], y]), b])]), b, y)
    return [da, db]


def _sum(em, node, dys, needs):
    return [_unbroadcast(em, node, dys[0], x, node.output[0]) if need else None
            for x, need in zip(node.input, needs)]


def _elementwise(fn: Callable) -> Callable:
    """A rule for a one-input elementwise op: ``fn(em, x, y, dy) -> dx``."""

    def rule(em, node, dys, needs):
        return [fn(em, node.input[0], node.output[0], dys[0])]

    return rule


def _output_kernel(op_type: str) -> Callable:
    """A rule writing ORT's ``op_type``(dY, Y), Y the node's output: ReluGrad, SigmoidGrad, TanhGrad."""

    def rule(em, node, dys, needs):
        out = em.name(op_type)
        _ms_node(em, op_type, [dys[0], node.output[0]], [out])
        return [out]

    return rule


def _ms_node(em: _Emitter, op_type: str, inputs: Sequence[str], outputs: Sequence[str], attrs=()) -> None:
    """Appends one com.microsoft node (ORT's gradient kernels), with the given attributes."""
    node = helper.make_node(op_type, list(inputs), list(outputs), name=em.name(f"{op_type}_node"),
                            domain=_MS_DOMAIN)
    node.attribute.extend(attrs)
    em.nodes.append(node)


def _leaky_relu(em, node, dys, needs):
    """ORT's LeakyReluGrad(dY, Y): dY where Y > 0, else alpha * dY (alpha at 0, as ORT)."""
    out = em.name("LeakyReluGrad")
    alpha = float(_attrs(node).get("alpha", 0.01))
    _ms_node(em, "LeakyReluGrad", [dys[0], node.output[0]], [out], [helper.make_attribute("alpha", alpha)])
    return [out]


def _clip(em, node, dys, needs):
    """dY where min <= X <= max (bounds included, as ORT's Clip gradient), else 0."""
    if any(needs[1:]):
        raise _error(node, "has a bound that depends on a trainable parameter")
    x = node.input[0]
    inputs = list(node.input) + ["", ""]  # Clip-11+ (the rules need opset 13): "" is an absent bound
    bounds = [inputs[1] or None, inputs[2] or None]
    masks = [em.op(op, [x, bound]) for op, bound in zip(("GreaterOrEqual", "LessOrEqual"), bounds)
             if bound is not None]
    if not masks:
        return [dys[0]]
    mask = masks[0] if len(masks) == 1 else em.op("And", masks)
    return [em.op("Mul", [dys[0], em.op("Cast", [mask], to=em.elem_type(x))])] + [None] * (len(node.input) - 1)


def _pow(em, node, dys, needs):
    x, e = node.input
    if needs[1]:
        raise _error(node, "has an exponent that depends on a trainable parameter")
    exponent = em.static(e)
    if exponent is None or exponent.size != 1:
        raise _error(node, f"has an exponent {e!r} that is not a constant scalar")
    k = float(exponent.reshape(()))
    if k == 2.0:
        factor = em.op("Mul", [_scalar(em, 2.0, x), x])
    else:
        factor = em.op("Mul", [_scalar(em, k, x), em.op("Pow", [x, _scalar(em, k - 1.0, x)])])
    return [em.op("Mul", [dys[0], factor]), None]


def _like_input(em, node, dys, needs):
    """Reshape-like ops (Flatten, Reshape, Squeeze, Unsqueeze): dx is dy in x's shape."""
    dx = em.op("Reshape", [dys[0], em.op("Shape", [node.input[0]])])
    return [dx] + [None] * (len(node.input) - 1)


def _slice(em, node, dys, needs):
    # dx is dy padded with zeros back to x's shape: static starts, ends, axes, steps of 1
    # (as exporters slice parameters, e.g. PyTorch reordering an LSTM's gates).
    dims = em.dims(node.input[0])
    given = [em.static(i) if i else None for i in list(node.input[1:]) + [""] * (5 - len(node.input))]
    starts, ends, axes, steps = given
    if dims is None or any(not isinstance(d, int) for d in dims):
        raise _error(node, "has an input of unknown shape")
    if starts is None or ends is None or (node.input[3:4] and node.input[3] and axes is None) or \
            (node.input[4:5] and node.input[4] and steps is None):
        raise _error(node, "has starts, ends, axes or steps that are not constants")
    axes = range(len(starts)) if axes is None else [int(a) % len(dims) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(k) for k in steps]
    if any(k != 1 for k in steps):
        raise _error(node, f"has steps {steps}; only steps of 1 have a gradient rule")
    begin, after = [0] * len(dims), [0] * len(dims)
    for axis, start, end in zip(axes, starts, ends):
        dim = dims[axis]
        start = min(max(int(start) + dim if start < 0 else int(start), 0), dim)
        end = min(max(int(end) + dim if end < 0 else int(end), 0), dim)
        begin[axis], after[axis] = start, dim - max(start, end)
    return [em.op("Pad", [dys[0], em.ints(begin + after)])] + [None] * (len(node.input) - 1)


def _expand(em, node, dys, needs):
    return [_unbroadcast(em, node, dys[0], node.input[0], node.output[0]), None]


def _transpose(em, node, dys, needs):
    dims = em.dims(node.input[0])
    perm = _attrs(node).get("perm")
    if perm is None:
        if dims is None:
            raise _error(node, "has an input of unknown rank")
        perm = list(reversed(range(len(dims))))
    inverse = list(np.argsort(perm))
    return [em.op("Transpose", [dys[0]], perm=[int(i) for i in inverse])]


def _cast(em, node, dys, needs):
    return [em.op("Cast", [dys[0]], to=em.elem_type(node.input[0]))]


def _reduce(mean: bool) -> Callable:
    def rule(em, node, dys, needs):
        x, y = node.input[0], node.output[0]
        attrs = _attrs(node)
        keepdims = attrs.get("keepdims", 1)
        axes = attrs.get("axes")
        if len(node.input) > 1 and node.input[1]:
            static = em.static(node.input[1])
            if static is None:
                raise _error(node, "has axes that are not constant")
            axes = [int(a) for a in static.reshape(-1)]
        dims = em.dims(x)
        if dims is None:
            raise _error(node, "has an input of unknown rank")
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [dys[0]] + [None] * (len(node.input) - 1)
            axes = list(range(len(dims)))
        axes = sorted(int(a) % len(dims) for a in axes)
        dy = dys[0]
        if not keepdims:
            dy = em.op("Unsqueeze", [dy, em.ints(axes)])
        if mean:  # as ORT's builder: dY scaled down by the (int64) count, then spread
            count = em.op("Div", [em.op("Size", [x]), em.op("Size", [y])])
            scaled = em.name("Scale")
            _ms_node(em, "Scale", [dy, count], [scaled], [helper.make_attribute("scale_down", 1)])
            dy = scaled
        return [em.op("Expand", [dy, em.op("Shape", [x])])] + [None] * (len(node.input) - 1)

    return rule


def _matmul(em, node, dys, needs):
    # As ORT's builder: Gemm for 2-D operands; else FusedMatMul with a transposed operand,
    # summed over the batch dimensions an operand was broadcast along, and a 2-D B's
    # gradient as one Gemm of A and dY made 2-D.
    a, b = node.input
    dy = dys[0]
    sa, sb, sy = em.dims(a), em.dims(b), em.dims(node.output[0])
    if sa is None or sb is None or sy is None or len(sa) < 2 or len(sb) < 2:
        raise _error(node, "has a 1-D or unknown-rank input")
    if len(sa) == 2 and len(sb) == 2:
        return [em.op("Gemm", [dy, b], beta=0.0, transB=1) if needs[0] else None,
                em.op("Gemm", [a, dy], beta=0.0, transA=1) if needs[1] else None]

    def batch_sum(full, x, sx):
        # Sum over the batch dimensions x was broadcast along (decided at run time
        # unless x's batch dimensions are statically the output's).
        lead = len(sy) - len(sx)
        if lead == 0 and sx[:-2] == sy[:-2]:
            return full
        return _unbroadcast_at_run_time(em, full, x, full, lead)

    da = db = None
    if needs[0]:
        da = batch_sum(em.op("FusedMatMul", [dy, b], domain=_MS_DOMAIN, transB=1), a, sa)
    if needs[1]:
        if len(sb) == 2:
            # a: [..., m, k] -> [M, k]; dy: [..., m, n] -> [M, n]; db = a^T dy.
            a2 = em.op("Reshape", [a, em.op("Concat", [em.ints([-1]), _last_dim(em, a)], axis=0)])
            dy2 = em.op("Reshape", [dy, em.op("Concat", [em.ints([-1]), _last_dim(em, dy)], axis=0)])
            db = em.op("Gemm", [a2, dy2], transA=1)
        else:
            db = batch_sum(em.op("FusedMatMul", [a, dy], domain=_MS_DOMAIN, transA=1), b, sb)
    return [da, db]


def _last_dim(em, x):
    return em.op("Slice", [em.op("Shape", [x]), em.ints([-1]), em.ints([np.iinfo(np.int64).max])])


def _gemm(em, node, dys, needs):
    a, b = node.input[:2]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    attrs = _attrs(node)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    ta, tb = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    dy = dys[0]
    out = [None] * len(node.input)
    if needs[0]:
        if ta:
            out[0] = em.op("Gemm", [b, dy], alpha=alpha, transA=tb, transB=1)
        else:
            out[0] = em.op("Gemm", [dy, b], alpha=alpha, transA=0, transB=1 - tb)
    if needs[1]:
        if tb:
            out[1] = em.op("Gemm", [dy, a], alpha=alpha, transA=1, transB=ta)
        else:
            out[1] = em.op("Gemm", [a, dy], alpha=alpha, transA=1 - ta, transB=0)
    if c is not None and needs[2]:
        dc = dy if beta == 1.0 else em.op("Mul", [dy, _scalar(em, beta, node.output[0])])
        out[2] = _unbroadcast(em, node, dc, c, node.output[0])
    return out


def _second_output(em: _Emitter, node, dys, what: str) -> str:
    """The node's optional second output (log_prob, Indices, mask), which its rule reads.

    The forward node gains it when it has none, as ORT's gradient builder adds it.
    It must not itself lead to the loss.
    """
    if len(dys) > 1 and dys[1] is not None:
        raise _error(node, f"has its {what} output on the path to the loss")
    if len(node.output) > 1 and node.output[1]:
        return node.output[1]
    name = em.name(what)
    del node.output[1:]
    node.output.append(name)
    return name


def _softmax_cross_entropy(em, node, dys, needs):
    if len(node.input) > 2 and node.input[2] and needs[2]:
        raise _error(node, "has class weights that depend on a trainable parameter")
    reduction = _attrs(node).get("reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("mean", "sum", "none"):
        raise _error(node, f"has an unknown reduction {reduction!r}")
    log_prob = _second_output(em, node, dys, "log_prob")
    out = em.name("SoftmaxCrossEntropyLossGrad")
    _ms_node(em, "SoftmaxCrossEntropyLossGrad", [dys[0], log_prob, *node.input[1:]], [out], node.attribute)
    return [out] + [None] * (len(node.input) - 1)


def _conv(em, node, dys, needs):
    # ConvGrad(dY, X, W) -> dX, dW, dB, with the Conv's attributes; "" where no gradient is needed.
    outs = [em.name("ConvGrad") if need else "" for need in needs]
    attrs = list(node.attribute)
    auto_pad = _attrs(node).get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # ORT 1.19.2's ConvGrad gets both gradients wrong with auto_pad SAME_* (as ORT's own
        # builder writes it; test_ort_conv_grad_is_wrong_with_auto_pad), so the pads are written out.
        attrs = [a for a in attrs if a.name not in ("auto_pad", "pads")]
        attrs.append(helper.make_attribute("pads", _same_pads(em, node, auto_pad)))
    _ms_node(em, "ConvGrad", [dys[0], node.input[0], node.input[1]], outs, attrs)
    return [o or None for o in outs]


def _same_pads(em, node, auto_pad: str) -> list:
    """The explicit pads (begins, then ends) of a Conv with auto_pad SAME_UPPER or SAME_LOWER."""
    sx, sw = em.dims(node.input[0]), em.dims(node.input[1])
    if not (sx and sw and all(isinstance(d, int) and d > 0 for d in sx[2:] + sw[2:])):
        raise _error(node, f"uses auto_pad={auto_pad} without static input and weight spatial shapes")
    n = len(sx) - 2
    attrs = _attrs(node)
    kernel = list(attrs.get("kernel_shape", sw[2:]))
    strides, dilations = list(attrs.get("strides", [1] * n)), list(attrs.get("dilations", [1] * n))
    effective = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    pairs = auto_pads(list(sx[2:]), effective, strides, auto_pad, None)
    return [lo for lo, _ in pairs] + [hi for _, hi in pairs]


def _max_pool(em, node, dys, needs):
    x = node.input[0]
    attrs = _attrs(node)
    if em.opset < 16:
        raise _error(node, f"needs opset 16 or newer for its gradient (the model has {em.opset})")
    if attrs.get("storage_order", 0) != 0:
        raise _error(node, "uses storage_order=1")
    indices = _second_output(em, node, dys, "Indices")
    flat = em.ints([-1])
    size = em.op("Reshape", [em.op("Size", [x]), flat])
    zeros = _filled(em, 0.0, x, shape=size)
    scattered = em.op("ScatterElements", [zeros, em.op("Reshape", [indices, flat]),
                                          em.op("Reshape", [dys[0], flat])], axis=0, reduction="add")
    return [em.op("Reshape", [scattered, em.op("Shape", [x])])]


def _dropout(em, node, dys, needs):
    # y = x * mask / (1 - ratio) when training_mode is true, else y = x. Without a
    # training_mode input Dropout is the identity, and so is its gradient (ORT's
    # DropoutGrad scales it by 1 / (1 - ratio) all the same).
    training = node.input[2] if len(node.input) > 2 and node.input[2] else None
    out = [None] * len(node.input)
    if training is None:
        out[0] = dys[0]
        return out
    mask = _second_output(em, node, dys, "mask")
    x = node.input[0]
    t = em.elem_type(x)
    ratio = node.input[1] if len(node.input) > 1 and node.input[1] else em.const(0.5, t)
    ratio = em.op("Cast", [ratio], to=t)
    scale = em.op("Div", [em.op("Cast", [mask], to=t), em.op("Sub", [_scalar(em, 1.0, x), ratio])])
    out[0] = em.op("Where", [training, em.op("Mul", [dys[0], scale]), dys[0]])
    return out


def _identity(em, node, dys, needs):
    return [dys[0]]


def _axis(em, node, default: int) -> int:
    dims = em.dims(node.input[0])
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    return int(_attrs(node).get("axis", default)) % len(dims)


def _softmax(em, node, dys, needs):
    # SoftmaxGrad_13(dY, Y): Y * (dY - sum(dY * Y, axis)); LogSoftmaxGrad_13 for LogSoftmax.
    if em.opset < 13:
        raise _error(node, f"is a {node.op_type} of opset < 13 (the 2-D coerced form)")
    _axis(em, node, -1)  # the input's rank must be known
    out = em.name(f"{node.op_type}Grad_13")
    _ms_node(em, f"{node.op_type}Grad_13", [dys[0], node.output[0]], [out], node.attribute)
    return [out]


def _erf(em, x, y, dy):
    # d erf(x) = 2 / sqrt(pi) * exp(-x^2)
    gauss = em.op("Exp", [em.op("Neg", [em.op("Mul", [x, x])])])
    return em.op("Mul", [dy, em.op("Mul", [_scalar(em, 2.0 / np.sqrt(np.pi), x), gauss])])


def _gather(em, node, dys, needs):
    # GatherGrad(Shape(data), indices, dY): dY added where Gather read, repeated indices summed.
    out = em.name("GatherGrad")
    _ms_node(em, "GatherGrad", [em.op("Shape", [node.input[0]]), node.input[1], dys[0]], [out], node.attribute)
    return [out, None]


def _concat(em, node, dys, needs):
    dims = em.dims(node.output[0])
    if dims is None:
        raise _error(node, "has an output of unknown rank")
    axis = int(_attrs(node)["axis"]) % len(dims)
    shapes = [em.op("Shape", [x]) for x in node.input]
    sizes = em.op("Concat", [em.op("Gather", [s, em.ints([axis])]) for s in shapes], axis=0)
    parts = em.op("Split", [dys[0], sizes], n_out=len(node.input), axis=axis)
    parts = [parts] if isinstance(parts, str) else parts
    return [part if need else None for part, need in zip(parts, needs)]


def _split(em, node, dys, needs):
    # dx: the outputs' gradients joined again, zeros where an output does not reach the loss.
    dims = em.dims(node.input[0])
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    axis = int(_attrs(node).get("axis", 0)) % len(dims)
    parts = []
    for out, dy in zip(node.output, dys):
        if dy is None:
            dy = _filled(em, 0.0, node.input[0], shape=em.op("Shape", [out]))
        parts.append(dy)
    return [em.op("Concat", parts, axis=axis)] + [None] * (len(node.input) - 1)


def _global_average_pool(em, node, dys, needs):
    # dY / (the pooled size), spread over X's shape: ORT's Scale, then Expand.
    x, y = node.input[0], node.output[0]
    t = em.elem_type(x)
    dims = em.dims(x)
    if dims is not None and all(isinstance(d, int) and d > 0 for d in dims[2:]):
        count = em.const(np.prod(dims[2:], dtype=np.int64), t)
    else:
        count = em.op("Div", [em.op("Cast", [em.op("Size", [x])], to=t), em.op("Cast", [em.op("Size", [y])], to=t)])
    scaled = em.name("Scale")
    _ms_node(em, "Scale", [dys[0], count], [scaled], [helper.make_attribute("scale_down", 1)])
    return [em.op("Expand", [scaled, em.op("Shape", [x])])]


def _layer_normalization(em, node, dys, needs):
    # LayerNormalizationGrad(dY, X, scale, Mean, InvStdDev) -> dX, dScale, dBias, the forward
    # node gaining its Mean and InvStdDev outputs where it has none, as ORT's builder does.
    if any(d is not None for d in dys[1:]):
        raise _error(node, "has its Mean or InvStdDev output on the path to the loss")
    x, scale = node.input[:2]
    dims = em.dims(x)
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    axis = int(_attrs(node).get("axis", -1)) % len(dims)
    for i, param in enumerate(node.input[1:3], 1):
        if param and needs[i] and em.dims(param) != dims[axis:]:
            raise _error(node, f"has a {'scale' if i == 1 else 'bias'} of shape {em.dims(param)}, "
                               f"not the normalized shape {dims[axis:]}")
    outputs = list(node.output) + [""] * (3 - len(node.output))
    outputs = [o or em.name(what) for o, what in zip(outputs, ("Y", "Mean", "InvStdDev"))]
    del node.output[:]
    node.output.extend(outputs)
    outs = [em.name("LayerNormalizationGrad") for _ in range(3)]
    _ms_node(em, "LayerNormalizationGrad", [dys[0], x, scale, *outputs[1:3]], outs, node.attribute)
    return [o if need else None for o, need in zip(outs, needs)]


def _batch_norm_internal(em, node, dys, needs):
    # BatchNormalizationGrad(dY, X, scale, saved mean, saved inverse std) -> dX, dScale, dB.
    if any(d is not None for d in dys[1:]):
        raise _error(node, "has a statistics output on the path to the loss")
    if len(node.output) < 5:
        raise _error(node, "lacks its saved mean and inverse std outputs")
    outs = [em.name("BatchNormalizationGrad") for _ in range(3)]
    eps = helper.make_attribute("epsilon", float(_attrs(node).get("epsilon", 1e-5)))
    _ms_node(em, "BatchNormalizationGrad", [dys[0], *node.input[:2], *node.output[3:5]], outs, [eps])
    return [o if need else None for o, need in zip(outs, needs)] + [None] * (len(node.input) - 3)


def _quick_gelu(em, node, dys, needs):
    out = em.name("QuickGeluGrad")
    _ms_node(em, "QuickGeluGrad", [dys[0], node.input[0]], [out], [a for a in node.attribute if a.name == "alpha"])
    return [out]


# LSTM and GRU: ORT's training forms and gradient ops. An unrolled backward pass in
# standard ops would be a node group per time step, fixed to one sequence length; ORT's
# LSTMGrad and GRUGrad kernels are in every ORT build, so the rules write what ORT's
# gradient builder writes: the forward node becomes LSTMTraining / GRUTraining (the same
# math, with the all-hidden states, all-cell states and gate values as extra outputs)
# and one LSTMGrad / GRUGrad node reads them.

_RNN_TRAINING = {"LSTM": "LSTMTraining", "GRU": "GRUTraining"}
_RNN_PLAIN = {v: k for k, v in _RNN_TRAINING.items()}
_RNN_STATES = {"LSTM": 3, "GRU": 2}  # Y, Y_h (, Y_c): the outputs of the standard op
_RNN_SAVED = {"LSTM": ("all_cell_states", "iofc"), "GRU": ("zrh",)}
_RNN_ACTIVATIONS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}


def _rnn_unsupported(em: _Emitter, node, plain_op: str) -> Optional[str]:
    """Why ORT 1.19.2 cannot train this LSTM or GRU with its gradient op, or None."""
    attrs = _attrs(node)
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    names = [a.decode().lower() if isinstance(a, bytes) else a.lower() for a in attrs.get("activations", [])]
    why = None
    if direction != "forward":
        why = f"runs in direction {direction!r}"
    elif names and names != _RNN_ACTIVATIONS[plain_op]:
        why = f"has activations {names}, not the default {_RNN_ACTIVATIONS[plain_op]}"
    elif "clip" in attrs:
        why = "clips its cell inputs"
    elif int(attrs.get("input_forget", 0)):
        why = "couples its input and forget gates (input_forget=1)"
    elif int(attrs.get("layout", 0)):
        why = "has layout=1 (batch first)"
    elif len(node.input) > 4 and node.input[4]:
        why = "takes sequence_lens"
    elif em.shapes.get(node.input[0], (0,))[0] not in (TensorProto.FLOAT, TensorProto.UNDEFINED):
        why = "is not float32"
    if why is not None:
        return (f"{why}, and ONNX Runtime's {plain_op}Grad kernel only runs the forward, float32, "
                f"default-activation, unclipped form without sequence_lens")
    if plain_op == "LSTM" and len(node.input) > 7 and node.input[7]:
        # Measured in tests/training/test_gradient_graph.py: every gradient off by ~10%.
        return ("has peephole weights, with which ONNX Runtime 1.19.2's LSTMGrad computes wrong "
                "gradients (its forward is right)")
    return None


def _recurrent(plain_op: str) -> Callable:
    def rule(em, node, dys, needs):
        # ORT's LSTMGrad reads X, W, R, sequence_lens, initial_h, initial_c (not B or P);
        # GRUGrad reads X, W, R, B, sequence_lens, initial_h. Both then read the saved
        # values and the gradients of Y and Y_h (and Y_c), and write the gradients of the
        # inputs but sequence_lens, in input order. The kernels always write dW and dR.
        n_states = _RNN_STATES[plain_op]
        if any(d is not None for d in dys[n_states:]):
            raise _error(node, "has its saved cell states or gate values on the path to the loss")
        why = _rnn_unsupported(em, node, plain_op)
        if why is not None:
            raise _error(node, why)
        if node.domain in ("", "ai.onnx"):
            outputs = list(node.output)[:n_states] + [""] * (n_states - len(node.output))
            outputs[0] = outputs[0] or em.name("all_hidden_states")
            outputs += [em.name(what) for what in _RNN_SAVED[plain_op]]
            del node.output[:]
            node.output.extend(outputs)
            kept = [a for a in node.attribute if a.name != "layout"]
            del node.attribute[:]
            node.attribute.extend(kept)
            node.op_type, node.domain = _RNN_TRAINING[plain_op], _MS_DOMAIN
        elif len(node.output) < n_states + len(_RNN_SAVED[plain_op]) or not node.output[0]:
            raise _error(node, f"lacks the all-hidden-states or saved outputs {plain_op}Grad reads")
        ins = list(node.input) + [""] * 7  # absent optional inputs read as ""
        if plain_op == "LSTM":
            reads = [ins[i] for i in (0, 1, 2, 4, 5, 6)] + [node.output[0], *node.output[3:5]]
        else:
            reads = ins[:6] + [node.output[0], node.output[2]]
        reads += [d or "" for d in dys[:n_states]]
        writes = []
        out = [None] * len(node.input)
        for i, x in enumerate(node.input):
            if i == 4:
                continue
            name = ""
            if x and (needs[i] or i in (1, 2)):
                name = em.name(f"{plain_op}Grad")
                if needs[i]:
                    out[i] = name
            writes.append(name)
        grad = helper.make_node(f"{plain_op}Grad", reads, writes, name=em.name(f"{plain_op}Grad_node"),
                                domain=_MS_DOMAIN)
        grad.attribute.extend(node.attribute)
        em.nodes.append(grad)
        return out
    return rule


#: com.microsoft op type -> rule: the training forms generate_artifacts writes.
MS_RULES: dict = {"BatchNormInternal": _batch_norm_internal, "QuickGelu": _quick_gelu,
                  "LSTMTraining": _recurrent("LSTM"), "GRUTraining": _recurrent("GRU")}


def to_batch_norm_internal(model: onnx.ModelProto) -> None:
    """Rewrites BatchNormalization nodes as ORT's BatchNormInternal, in place.

    As ORT's generate_artifacts does: a training step normalizes with the
    batch statistics, updates the running mean and variance (ORT writes them
    back into the frozen parameters), and saves the batch mean and inverse std
    for the backward pass (outputs 3 and 4).
    """
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = _attrs(node)
        # Inference form (one output) or training form (with the running statistics,
        # as PyTorch exports in training mode): both train with batch statistics.
        base = node.output[0]
        outputs = list(node.output) + [""] * (3 - len(node.output))
        outputs = [o or f"{base}_{what}" for o, what in zip(outputs, ("", "running_mean", "running_var"))]
        del node.output[:]
        node.output.extend(outputs + [f"{base}_saved_mean", f"{base}_saved_inv_std"])
        node.op_type, node.domain = "BatchNormInternal", _MS_DOMAIN
        del node.attribute[:]
        node.attribute.extend([helper.make_attribute("epsilon", float(attrs.get("epsilon", 1e-5))),
                               helper.make_attribute("momentum", float(attrs.get("momentum", 0.9))),
                               helper.make_attribute("training_mode", 1)])
    if any(n.domain == _MS_DOMAIN for n in model.graph.node) and not any(
            imp.domain == _MS_DOMAIN for imp in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))


def _fuse_quick_gelu(model: onnx.ModelProto) -> None:
    """Rewrites ``x * Sigmoid(x)`` and ``x * Sigmoid(alpha * x)`` as com.microsoft QuickGelu, in place.

    As ORT's generate_artifacts does before it builds the gradient graph (its
    QuickGeluFusion), so that the gradient is its one QuickGeluGrad kernel. The
    intermediate values must have no other reader and not be graph outputs.
    """
    graph = model.graph
    readers: dict = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    producer = {o: node for node in graph.node for o in node.output}
    constants = _constant_sources(graph)

    def private(name: str) -> bool:
        return readers.get(name, 0) == 1 and name not in outputs

    def default(node) -> bool:
        return node is not None and node.domain in ("", "ai.onnx")

    dropped: set = set()
    for mul in graph.node:
        if mul.op_type != "Mul" or not default(mul) or len(mul.input) != 2:
            continue
        a, b = mul.input
        for x, s in ((a, b), (b, a)):
            sigmoid = producer.get(s)
            if not (default(sigmoid) and sigmoid.op_type == "Sigmoid" and private(s)):
                continue
            alpha, fused = 1.0, [sigmoid]
            if sigmoid.input[0] != x:  # x * Sigmoid(alpha * x)
                scaled = producer.get(sigmoid.input[0])
                if not (default(scaled) and scaled.op_type == "Mul" and private(sigmoid.input[0])):
                    continue
                p, q = scaled.input
                value = _static(constants.get(q if p == x else p)) if x in (p, q) else None
                if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.floating):
                    continue
                alpha = float(value.reshape(()))
                fused.append(scaled)
            dropped.update(id(n) for n in fused)
            mul.op_type, mul.domain = "QuickGelu", _MS_DOMAIN
            del mul.input[:]
            mul.input.append(x)
            mul.attribute.extend([helper.make_attribute("alpha", alpha)])
            break
    if dropped:
        kept = [n for n in graph.node if id(n) not in dropped]
        del graph.node[:]
        graph.node.extend(kept)
        if not any(imp.domain == _MS_DOMAIN for imp in model.opset_import):
            model.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))


#: op type -> rule, for default-domain nodes on the path from a parameter to the loss.
RULES: dict = {
    "Add": _add, "Sub": _sub, "Mul": _mul, "Div": _div, "Sum": _sum,
    "Neg": _elementwise(lambda em, x, y, dy: em.op("Neg", [dy])),
    "Abs": _elementwise(lambda em, x, y, dy: em.op("Mul", [dy, em.op("Sign", [x])])),
    "Exp": _elementwise(lambda em, x, y, dy: em.op("Mul", [dy, y])),
    "Log": _elementwise(lambda em, x, y, dy: em.op("Div", [dy, x])),
    "Sqrt": _elementwise(lambda em, x, y, dy: em.op("Div", [dy, em.op("Mul", [_scalar(em, 2.0, y), y])])),
    "Reciprocal": _elementwise(lambda em, x, y, dy: em.op("Neg", [em.op("Mul", [dy, em.op("Mul", [y, y])])])),
    "Relu": _output_kernel("ReluGrad"), "Sigmoid": _output_kernel("SigmoidGrad"),
    "LeakyRelu": _leaky_relu, "Clip": _clip,
    "Tanh": _output_kernel("TanhGrad"),
    "Pow": _pow, "Identity": _identity, "Cast": _cast, "Dropout": _dropout,
    "Flatten": _like_input, "Reshape": _like_input, "Squeeze": _like_input, "Unsqueeze": _like_input,
    "Expand": _expand, "Transpose": _transpose, "Slice": _slice,
    "ReduceSum": _reduce(mean=False), "ReduceMean": _reduce(mean=True),
    "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "MaxPool": _max_pool,
    "SoftmaxCrossEntropyLoss": _softmax_cross_entropy,
    "Softmax": _softmax, "LogSoftmax": _softmax, "Erf": _elementwise(_erf),
    "Gather": _gather, "Concat": _concat, "Split": _split,
    "GlobalAveragePool": _global_average_pool, "LayerNormalization": _layer_normalization,
    "LSTM": _recurrent("LSTM"), "GRU": _recurrent("GRU"),
}


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def _captured(node: onnx.NodeProto) -> set:
    """The outer values the node's subgraphs (If, Loop, Scan bodies) read, recursively."""
    names: set = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                names.update(inner.input)
                names |= _captured(inner)
    return names


def add_gradient_graph(model: onnx.ModelProto, loss: str, trainable: Sequence[str]) -> None:
    """Appends the gradient graph and ORT's accumulators to a training model, in place.

    Args:
      model: forward + loss, parameters as graph inputs, with
        ``<param>_grad.accumulation.buffer`` and ``lazy_reset_grad`` inputs
        (what :func:`jaxort.training.artifacts.build_training_model` makes).
        Nodes are in topological order, as ONNX requires.
      loss: the loss value (a graph output).
      trainable: the trainable parameters, in graph input order.

    Afterwards ``<param>_grad`` holds d loss / d param, and each
    ``InPlaceAccumulatorV2(<param>_grad.accumulation.buffer, <param>_grad,
    lazy_reset_grad)`` writes the buffer and outputs
    ``<param>_grad.accumulation.out``, appended to the graph outputs in
    ``trainable`` order. Forward nodes whose rule needs an optional output
    (SoftmaxCrossEntropyLoss's log_prob, MaxPool's Indices, LayerNormalization's
    Mean and InvStdDev) gain it, and ``x * Sigmoid(x)`` becomes com.microsoft
    QuickGelu, as in ORT's training models.

    Raises:
      TrainingError: a node on the path from a trainable parameter to the
        loss has no rule (or a form its rule does not cover), naming the node
        and op; or the model's opset is below 13. The model is then unchanged.
    """
    opset = _default_opset(model)
    if opset < MIN_OPSET:
        raise TrainingError(f"cannot write the gradient graph ONNX Runtime needs: the model has opset "
                            f"{opset}, and the gradient rules need opset {MIN_OPSET} or newer")
    work = onnx.ModelProto()
    work.CopyFrom(model)
    _fuse_quick_gelu(work)
    em = _Emitter(work, _shapes(work), opset)
    forward = list(work.graph.node)

    # Values that depend on a trainable parameter through floating-point tensors.
    depends = set(trainable)
    captures = {id(node): _captured(node) for node in forward}
    for node in forward:
        if any(i in depends for i in node.input) or captures[id(node)] & depends:
            depends.update(o for o in node.output if o and em.shapes.get(o, (0,))[0] in _FLOAT_TYPES)
    grads: dict = {}

    def total(name: str) -> Optional[str]:
        parts = grads.get(name)
        if not parts:
            return None
        if len(parts) > 1:
            grads[name] = [em.op("Sum", parts)]
        return grads[name][0]

    seed = _filled(em, 1.0, loss)
    grads[loss] = [seed]
    for node in reversed(forward):
        dys = [total(o) if o else None for o in node.output]
        if all(d is None for d in dys):
            continue
        needs = [bool(i) and i in depends for i in node.input]
        if captures[id(node)] & depends:
            raise _error(node, "reads a value that depends on a trainable parameter inside its subgraph; "
                               "control flow has no gradient rule in jaxort yet")
        if not any(needs):
            continue
        rule = (RULES if node.domain in ("", "ai.onnx") else MS_RULES if node.domain == _MS_DOMAIN
                else {}).get(node.op_type)
        if rule is None:
            raise _error(node, "has no gradient rule in jaxort yet; ONNX Runtime would train the file "
                               "with zero gradients, so none is written (jaxort's own artifacts still "
                               "train in jaxort: generate_artifacts(..., gradient_graph=False))")
        dxs = rule(em, node, dys, needs)
        for x, dx, need in zip(node.input, dxs, needs):
            if need and dx is not None:
                grads.setdefault(x, []).append(dx)

    g = work.graph
    outputs = []
    for p in trainable:
        grad = total(p)
        if grad is None:
            grad = _filled(em, 0.0, p)
        em.nodes.append(helper.make_node("Identity", [grad], [gradient_name(p)], name=em.name("grad_of")))
        out = f"{p}_grad.accumulation.out"
        em.nodes.append(helper.make_node(
            "InPlaceAccumulatorV2", [f"{p}_grad.accumulation.buffer", gradient_name(p), "lazy_reset_grad"],
            [out], name=f"GradientAccumulator{len(outputs) + 1}", domain=_MS_DOMAIN))
        outputs.append(helper.make_tensor_value_info(out, TensorProto.BOOL, [1]))
    g.node.extend(em.nodes)
    g.output.extend(outputs)
    if not any(imp.domain == _MS_DOMAIN for imp in work.opset_import):
        work.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))
    model.CopyFrom(work)


_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})
