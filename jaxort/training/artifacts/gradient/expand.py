"""Ops with no rule of their own, expanded into the function body ONNX defines for them.

An op whose schema has a function body (Attention's is built for the node's
attributes and input types) is a composition of ops that do have rules. Where
such a node lies on the path from a trainable parameter to the loss and no rule
is written for its op, :func:`expand_functions` replaces it in the training
model by its body, so that the rules differentiate the body. The forward
values are the same (the spec defines the op by that body); ORT's kernels never
see the op, so ONNX Runtime trains the file wherever it reads the body's ops
and the model's opset.

Part of the training layer: it uses onnx, the graph layer and the rules' shared helpers only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import onnx
from onnx import defs, helper

from jaxort.graph import normalize_domain
from jaxort.training.artifacts.gradient._common import _fresh_names

# Ops whose outputs carry no gradient (integers of the input's shape).
_SHAPE_OPS = frozenset({"Shape", "Size"})

# Bodies that expand into further bodies stop after this many rounds (none nests this deep).
_MAX_ROUNDS = 4


def _body(node: onnx.NodeProto, opset: int, types: Callable) -> Optional[onnx.FunctionProto]:
    """The function body of a default-domain node at the model's opset, or None."""
    try:
        schema = defs.get_schema(node.op_type, opset, "")
    except defs.SchemaError:
        return None
    proto = onnx.FunctionProto()
    if schema.has_context_dependent_function:
        input_types = [types(name).SerializeToString() for name in node.input]
        try:
            proto.ParseFromString(schema.get_context_dependent_function_with_opset_version(
                opset, node.SerializeToString(), input_types))
        except Exception:  # noqa: BLE001 - onnx raises its C++ errors untyped; no body then
            return None
    elif schema.has_function:
        proto = schema.function_body
    # A body with subgraphs (Range's Loop) is no help: no rule differentiates control flow.
    if not proto.node or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                             for n in proto.node for a in n.attribute):
        return None
    return proto


def _attribute_values(node: onnx.NodeProto, opset: int) -> dict:
    """The node's attributes by name, with the schema's defaults for those it does not set."""
    values = {a.name: a for a in node.attribute}
    schema = defs.get_schema(node.op_type, opset, "")
    for name, attr in schema.attributes.items():
        if name not in values and attr.default_value.type != onnx.AttributeProto.UNDEFINED:
            values[name] = attr.default_value
    return values


def _inline(node: onnx.NodeProto, body: onnx.FunctionProto, opset: int, fresh: Callable) -> list:
    """The body's nodes with its formal inputs, outputs and attributes bound to the node's."""
    names = {formal: actual for formal, actual in zip(body.input, node.input)}
    names.update({formal: "" for formal in body.input[len(node.input):]})
    names.update({formal: actual or fresh(formal)
                  for formal, actual in zip(body.output, node.output)})
    attrs = _attribute_values(node, opset)
    prefix = node.name or node.op_type

    def bound(name: str) -> str:
        if name not in names:
            names[name] = fresh(f"{prefix}/{name}")
        return names[name]

    out = []
    for inner in body.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = fresh(f"{prefix}/{inner.name or inner.op_type}")
        copy.input[:] = [bound(i) if i else "" for i in inner.input]
        copy.output[:] = [bound(o) if o else "" for o in inner.output]
        kept = []
        for attr in copy.attribute:
            if not attr.ref_attr_name:
                kept.append(attr)
            elif attr.ref_attr_name in attrs:
                value = onnx.AttributeProto()
                value.CopyFrom(attrs[attr.ref_attr_name])
                value.name = attr.name
                kept.append(value)
        del copy.attribute[:]
        copy.attribute.extend(kept)
        out.append(copy)
    return out


def expand_functions(model: onnx.ModelProto, trainable: Sequence[str], has_rule: Callable,
                     shapes: Callable, opset: int) -> list:
    """Replaces, in place, each rule-less default-domain node with a function body that a
    trainable parameter reaches by its body, until none is left; returns the op types expanded.

    Args:
      model: the training model (forward + loss); its nodes stay in topological order.
      trainable: the trainable parameters.
      has_rule: whether an op type (default domain) has a gradient rule.
      shapes: model -> {value name: (elem_type, dims or None)}, the types bodies built
        for the node's input types are given (an unknown type where a value is missing).
      opset: the model's default-domain opset.
    """
    graph = model.graph
    fresh = _fresh_names(graph, "jaxort_expand")
    expanded: list = []
    for _ in range(_MAX_ROUNDS):
        depends = set(trainable)
        changed = False
        known: Optional[dict] = None

        def types(name: str) -> onnx.TypeProto:
            nonlocal known
            if known is None:
                known = shapes(model)
            if name not in known:
                return onnx.TypeProto()
            elem_type, dims = known[name]
            return helper.make_tensor_type_proto(elem_type, dims)

        nodes: list = []
        for node in graph.node:
            reached = any(i in depends for i in node.input)
            body = None
            if reached and normalize_domain(node.domain) == "" and not has_rule(node.op_type):
                body = _body(node, opset, types)
            if body is None:
                nodes.append(node)
            else:
                inlined = _inline(node, body, opset, fresh)
                nodes.extend(inlined)
                expanded.append(node.op_type)
                changed = True
            if reached and node.op_type not in _SHAPE_OPS:
                depends.update(o for o in node.output if o)
        if not changed:
            break
        del graph.node[:]
        graph.node.extend(nodes)
    return expanded
