"""What the gradient rules share: the emitter that appends nodes, and helpers.

A rule gets the emitter, the node, the gradients of its outputs (None where an
output does not reach the loss) and which inputs need a gradient; it returns
one gradient (or None) per input.

Part of the training layer: it imports onnx, the graph layer and jaxort.errors only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, helper

from jaxort.errors import TrainingError
from jaxort.graph import normalize_domain, numpy_dtype, tensor_from_numpy, tensor_to_numpy

_MS_DOMAIN = "com.microsoft"


class _Emitter:
    """Appends gradient nodes and constants to a graph, with unique names."""

    def __init__(self, model: onnx.ModelProto, shapes: dict, opset: int):
        self.model = model
        self.shapes = shapes
        self.opset = opset
        self.nodes: list = []
        self.name = _fresh_names(model.graph, "jaxort_grad")  # hint -> a name the model does not use
        self._constants: Optional[dict] = None

    def child(self, model: onnx.ModelProto, shapes: dict) -> "_Emitter":
        """An emitter for a subgraph (``model`` wraps it): its own nodes, this one's names taken
        (one namespace for the whole model), its shapes and constants seen over this one's."""
        out = _Emitter.__new__(_Emitter)
        out.model, out.opset, out.nodes, out.name = model, self.opset, [], self.name
        out.shapes = {**self.shapes, **shapes}
        self.static("")  # index this graph's constants
        out._constants = {**self._constants, **_constant_sources(model.graph)}
        out._producers = {**self._producers, **{o: n for n in model.graph.node for o in n.output if o}}
        out._folded = {}
        return out

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
        """The value of an initializer, a Constant node's output, or a value small shape arithmetic
        computes from those (Concat of Unsqueezed constants, as exporters build Tile repeats and
        Reshape targets), else None (indexed once)."""
        if self._constants is None:
            self._constants = _constant_sources(self.model.graph)
            self._producers = {o: n for n in self.model.graph.node for o in n.output if o}
            self._folded: dict = {}
        value = _static(self._constants.get(name))
        if value is None and name in self._producers:
            value = self._fold(name, depth=0)
        return value

    def _fold(self, name: str, depth: int) -> Optional[np.ndarray]:
        # Only the ops of shape arithmetic, on small values, a few levels deep: folding is for
        # what a rule needs to know when it writes the graph, not for the model's arithmetic.
        if name in self._folded:
            return self._folded[name]
        value = _static(self._constants.get(name))
        node = self._producers.get(name)
        if value is None and node is not None and depth < _FOLD_DEPTH and node.op_type in _FOLDABLE \
                and normalize_domain(node.domain) == "" and not _captured(node):
            args = [self._fold(i, depth + 1) if i else None for i in node.input]
            if all(a is not None or not i for a, i in zip(args, node.input)) and \
                    all(a is None or a.size <= _FOLD_SIZE for a in args):
                value = _evaluate(node, args, self.opset)
        self._folded[name] = value
        return value

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(list(values), np.int64), TensorProto.INT64)

    def elem_type(self, value: str) -> int:
        return self.shapes[value][0]

    def dims(self, value: str) -> Optional[list]:
        return self.shapes.get(value, (0, None))[1]


# What Emitter.static folds: the ops exporters build constant shapes and repeats with.
_FOLDABLE = frozenset({"Concat", "Unsqueeze", "Squeeze", "Reshape", "Cast", "Identity", "Gather", "Slice",
                       "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Range", "ConstantOfShape", "Expand",
                       "Equal", "Where", "Min", "Max"})
_FOLD_DEPTH, _FOLD_SIZE = 16, 4096


def _evaluate(node: onnx.NodeProto, args: list, opset: int) -> Optional[np.ndarray]:
    """The node's first output on constant inputs, by ONNX's reference evaluator (None if it fails)."""
    from onnx.reference import ReferenceEvaluator

    names = [f"in{k}" if i else "" for k, i in enumerate(node.input)]
    inner = onnx.NodeProto()
    inner.CopyFrom(node)
    inner.input[:] = names
    inner.output[:] = ["out"] + [""] * (len(node.output) - 1)
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in zip(names, args) if n]
    model = helper.make_model(helper.make_graph([inner], "fold", inputs, [helper.make_empty_tensor_value_info("out")]),
                              opset_imports=[helper.make_opsetid("", opset)])
    try:
        return np.asarray(ReferenceEvaluator(model).run(None, {n: a for n, a in zip(names, args) if n})[0])
    except Exception:  # noqa: BLE001 - an op the evaluator cannot run here: not foldable
        return None


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(value) -> str:
    """A string attribute's value as text (onnx reads them as bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


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


def _axis(em, node, default: int) -> int:
    dims = em.dims(node.input[0])
    if dims is None:
        raise _error(node, "has an input of unknown rank")
    return int(_attrs(node).get("axis", default)) % len(dims)


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


def _without_dead_nodes(nodes: list, graph: onnx.GraphProto) -> list:
    """The gradient nodes that something reads (a rule may build a value it then does not use)."""
    read = {o.name for o in graph.output}
    for node in graph.node:
        read.update(node.input)
        read |= _captured(node)
    kept = []
    for node in reversed(nodes):  # readers come after what they read
        if node.op_type == "InPlaceAccumulatorV2" or any(o in read for o in node.output):
            kept.append(node)
            read.update(node.input)
            read |= _captured(node)
    return kept[::-1]


def _fresh_names(graph: onnx.GraphProto, prefix: str) -> Callable[[str], str]:
    """``fresh(hint)``: a new value or node name ``<prefix>/<hint>_<n>`` that the graph does not use."""
    taken = {v for n in graph.node for v in (*n.input, *n.output)}
    taken.update(i.name for i in graph.input)
    taken.update(t.name for t in graph.initializer)
    count = 0

    def fresh(hint: str) -> str:
        nonlocal count
        while True:
            count += 1
            name = f"{prefix}/{hint}_{count}"
            if name not in taken:
                taken.add(name)
                return name

    return fresh
