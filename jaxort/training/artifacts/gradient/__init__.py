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

The rules live in one module per op family (``arithmetic``, ``unary``,
``activation``, ``layout``, ``reduce``, ``resize``, ``sampling``, ``matmul``,
``norm``, ``loss``, ``rnn``), each with
a ``RULES`` table (and ``MS_RULES`` for com.microsoft forms) that this
package merges; an op type in two tables is an error at import.

Before the rules run, a node with no rule whose op ONNX defines by a function
body is replaced by that body (``expand``), and reverse, bidirectional and
batch-first recurrences become forward ones (``rnn.split_directions``); an If
gets an If of its branches' gradients (``control``). Shapes come from ONNX's
shape inference, and from jaxort's tracer where it loses a rank
(``traced_shapes``). Gradient nodes nothing reads are dropped.

Part of the training layer: it uses onnx, and the graph layer (JAX) for the
shapes inference loses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Optional

import onnx
from onnx import TensorProto, helper

from jaxort.errors import TrainingError
from jaxort.graph import check_graph_structure, default_opset, normalize_domain
from jaxort.training.artifacts.gradient import (activation, arithmetic, control, layout, matmul, norm, reduce,
                                                resize, rnn, sampling, unary)
from jaxort.training.artifacts.gradient import loss as _loss
from jaxort.training.artifacts.gradient._common import (_MS_DOMAIN, _captured, _Emitter, _error, _filled,
                                                       _without_dead_nodes)
from jaxort.training.artifacts.gradient.activation import _fuse_quick_gelu
from jaxort.training.artifacts.gradient.expand import expand_functions
from jaxort.training.artifacts.gradient.norm import to_batch_norm_internal
from jaxort.training.artifacts.gradient.rnn import _RNN_PLAIN, _RNN_STATES, split_directions
from jaxort.training.artifacts.gradient.traced_shapes import traced_shapes
from jaxort.training.artifacts.read import GRAD_BUFFER_SUFFIX, GRAD_OUTPUT_SUFFIX, LAZY_RESET_GRAD

__all__ = ["MS_RULES", "RULES", "add_gradient_graph", "gradient_name", "to_batch_norm_internal"]

# The lowest default-domain opset the rules are written for (ReduceSum and
# Unsqueeze take axes as an input from 13); MaxPool's and Resize's need 16
# (ScatterElements reduces from 16).
MIN_OPSET = 13


def gradient_name(param: str) -> str:
    """The value holding a parameter's gradient, as ORT names it (``<param>_grad``)."""
    return f"{param}_grad"


def _merged(tables: Iterable[dict]) -> dict:
    """One op type -> rule table of the families' tables."""
    merged: dict = {}
    for table in tables:
        twice = sorted(merged.keys() & table.keys())
        if twice:
            raise ValueError(f"gradient rules for {twice} are registered twice")
        merged.update(table)
    return merged


_FAMILIES = (arithmetic, unary, activation, layout, reduce, resize, sampling, matmul, norm, _loss, rnn)

#: op type -> rule, for default-domain nodes on the path from a parameter to the loss.
RULES: dict = _merged(family.RULES for family in _FAMILIES)

#: com.microsoft op type -> rule: the training forms generate_artifacts writes.
MS_RULES: dict = _merged(getattr(family, "MS_RULES", {}) for family in _FAMILIES)


def _shapes(model: onnx.ModelProto) -> dict:
    """name -> (elem_type, dims or None); a dim is an int, a dim_param string, or None."""
    # onnx's shape inference does not know BatchNormInternal; its output 0 has the shape
    # of a BatchNormalization's.
    # Nor LSTMTraining and GRUTraining; their first outputs are an LSTM's and a GRU's.
    # Nor QuickGelu, elementwise; nor (from onnx itself) GroupNormalization and MeanVarianceNormalization.
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
        elif node.op_type in ("GroupNormalization", "MeanVarianceNormalization") and node.domain in ("", "ai.onnx"):
            # onnx infers no shape for these (function ops); their output has their input's.
            node.op_type = "Identity"
            del node.input[1:]
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
        if dims is not None or vi.name not in out:  # a graph output that is also an input may say less
            out[vi.name] = (t.elem_type, dims)
    for init in inferred.graph.initializer:
        out[init.name] = (init.data_type, list(init.dims))
    unknown = [o for node in model.graph.node for o in node.output if o and out.get(o, (0, None))[1] is None]
    if unknown:  # ranks inference lost behind shape arithmetic: jaxort's tracer folds it
        out.update(traced_shapes(model, unknown))
    return out


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
    QuickGelu, as in ORT's training models. A node with no rule whose op ONNX
    defines by a function body (Attention) is replaced by that body
    (:func:`~jaxort.training.artifacts.gradient.expand.expand_functions`), and
    a reverse, bidirectional or batch-first LSTM, GRU or RNN by forward ones
    (:func:`~jaxort.training.artifacts.gradient.rnn.split_directions`).

    Raises:
      TrainingError: a node on the path from a trainable parameter to the
        loss has no rule (or a form its rule does not cover), naming the node
        and op; or the model's opset is below 13. The model is then unchanged.
      ModelError: the graph has a cycle, a value made twice, a dangling read
        or nodes out of order (:func:`jaxort.graph.check_graph_structure`).
    """
    check_graph_structure(model.graph)
    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise TrainingError(f"cannot write the gradient graph ONNX Runtime needs: the model has opset "
                            f"{opset}, and the gradient rules need opset {MIN_OPSET} or newer")
    work = onnx.ModelProto()
    work.CopyFrom(model)
    _fuse_quick_gelu(work)
    expand_functions(work, trainable, RULES.__contains__, _shapes, opset)
    split_directions(work, trainable, opset)
    em = _Emitter(work, _shapes(work), opset)
    forward = list(work.graph.node)

    depends = _depending(forward, set(trainable), em.shapes)
    total = _backward(em, forward, {loss: _filled(em, 1.0, loss)}, depends)

    g = work.graph
    outputs = []
    for p in trainable:
        grad = total(p)
        if grad is None:
            grad = _filled(em, 0.0, p)
        em.nodes.append(helper.make_node("Identity", [grad], [gradient_name(p)], name=em.name("grad_of")))
        out = f"{p}{GRAD_OUTPUT_SUFFIX}"
        em.nodes.append(helper.make_node(
            "InPlaceAccumulatorV2", [f"{p}{GRAD_BUFFER_SUFFIX}", gradient_name(p), LAZY_RESET_GRAD],
            [out], name=f"GradientAccumulator{len(outputs) + 1}", domain=_MS_DOMAIN))
        outputs.append(helper.make_tensor_value_info(out, TensorProto.BOOL, [1]))
    g.node.extend(_without_dead_nodes(em.nodes, g))
    g.output.extend(outputs)
    if not any(imp.domain == _MS_DOMAIN for imp in work.opset_import):
        work.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))
    model.CopyFrom(work)


def _depending(nodes: Sequence, depends: set, shapes: dict) -> set:
    """``depends`` and the values of ``nodes`` that depend on one of them through floating-point
    tensors. A value whose type shape inference does not know (an output of an op onnx has no
    schema for) may be one: were it left out, the parameters behind it would get zero gradients."""
    depends = set(depends)
    for node in nodes:
        if any(i in depends for i in node.input) or _captured(node) & depends:
            depends.update(o for o in node.output
                           if o and shapes.get(o, (0,))[0] in _FLOAT_TYPES_OR_UNKNOWN)
    return depends


def _backward(em: _Emitter, nodes: Sequence, seeds: dict, depends: set) -> Callable:
    """Reverse-mode differentiation of ``nodes`` (in topological order) from ``seeds`` (value ->
    its gradient), rule by rule; returns ``total(value)``: the gradient of a value, or None
    where nothing reaches it."""
    grads: dict = {name: [grad] for name, grad in seeds.items()}

    def total(name: str) -> Optional[str]:
        parts = grads.get(name)
        if not parts:
            return None
        if len(parts) > 1:
            grads[name] = [em.op("Sum", parts)]
        return grads[name][0]

    for node in reversed(nodes):
        dys = [total(o) if o else None for o in node.output]
        if all(d is None for d in dys):
            continue
        needs = [bool(i) and i in depends for i in node.input]
        outer = sorted(_captured(node) & depends)
        if outer:
            if node.op_type != "If" or normalize_domain(node.domain) != "":
                raise _error(node, "reads a value that depends on a trainable parameter inside its subgraph; "
                                   "Loop and Scan have no gradient rule in jaxort (If has)")
            for name, grad in zip(outer, control.if_gradient(em, node, dys, outer, depends, _subgraph_backward)):
                grads.setdefault(name, []).append(grad)
        if not any(needs):
            continue
        rule = (RULES if normalize_domain(node.domain) == "" else MS_RULES if node.domain == _MS_DOMAIN
                else {}).get(node.op_type)
        if rule is None:
            raise _error(node, "has no gradient rule in jaxort yet; ONNX Runtime would train the file "
                               "with zero gradients, so none is written (jaxort's own artifacts still "
                               "train in jaxort: generate_artifacts(..., gradient_graph=False))")
        dxs = rule(em, node, dys, needs)
        for x, dx, need in zip(node.input, dxs, needs):
            if need and dx is not None:
                grads.setdefault(x, []).append(dx)
    return total


def _subgraph_backward(em: _Emitter, model: onnx.ModelProto, seeds: dict, depends: set):
    """:func:`_backward` over a subgraph that ``model`` wraps (its outer values as inputs), with
    a child emitter; returns (the emitter, total)."""
    child = em.child(model, _shapes(model))
    nodes = list(model.graph.node)
    return child, _backward(child, nodes, seeds, _depending(nodes, depends, child.shapes))


_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})
_FLOAT_TYPES_OR_UNKNOWN = _FLOAT_TYPES | {TensorProto.UNDEFINED}
