"""Gradient of If: the gradients of the outer values its branches read, by an If of gradients.

Where an If node's branches read values that depend on a trainable parameter,
the gradient graph gets an If on the same condition whose branches are each
branch's forward nodes (run again: their values are not visible outside it)
followed by that branch's gradient, written by the same rules, with the
outer gradients of the If's outputs as seeds. Each branch outputs the
gradient of every such outer value (zeros where the branch does not read
it). ORT 1.19.2 has no gradient builder for If.

Loop and Scan, whose gradient needs every iteration's values, have none.

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx
from onnx import helper

from jaxort.training.artifacts.gradient._common import _attrs, _captured, _error, _filled, _without_dead_nodes


def _branch_copy(em, node: onnx.NodeProto, branch: onnx.GraphProto) -> onnx.ModelProto:
    """The branch as a model of its own: its values renamed apart from the forward's (one
    namespace for the whole model), the outer values it reads as inputs."""
    if any(_captured(inner) for inner in branch.node):
        raise _error(node, "has control flow nested in a branch on the path to the loss; the If rule takes "
                           "branches without subgraphs")
    names: dict = {}
    for inner in branch.node:
        for o in inner.output:
            if o:
                names[o] = em.name(f"{node.name or 'If'}/{o.rsplit('/', 1)[-1]}")
    nodes = []
    for inner in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = em.name(f"{inner.op_type}_node")
        copy.input[:] = [names.get(i, i) for i in inner.input]
        copy.output[:] = [names.get(o, o) for o in inner.output]
        nodes.append(copy)
    produced = {o for n in nodes for o in n.output}
    read = sorted({i for n in nodes for i in n.input if i and i not in produced}
                  | {o.name for o in branch.output if o.name not in names})
    inputs = []
    for name in read:
        elem_type, dims = em.shapes.get(name, (0, None))
        inputs.append(helper.make_tensor_value_info(name, elem_type, dims))
    outputs = [helper.make_tensor_value_info(names.get(o.name, o.name), o.type.tensor_type.elem_type, None)
               for o in branch.output]
    graph = helper.make_graph(nodes, branch.name or "branch", inputs, outputs,
                              [init for init in branch.initializer])
    model = helper.make_model(graph, opset_imports=list(em.model.opset_import))
    model.ir_version = em.model.ir_version
    return model


def if_gradient(em, node: onnx.NodeProto, dys: Sequence, outer: Sequence[str], depends: set,
                backward: Callable) -> list:
    """The gradients of ``outer`` (outer values the branches read that depend on a trainable
    parameter), from an If on the node's condition; ``backward(em, model, seeds, depends)``
    differentiates a branch copy, returning its emitter and ``total``."""
    attrs = _attrs(node)
    branches = {}
    for key in ("then_branch", "else_branch"):
        model = _branch_copy(em, node, attrs[key])
        seeds = {out.name: dy for out, dy in zip(model.graph.output, dys) if dy is not None}
        child, total = backward(em, model, seeds, depends)
        results = []
        for name in outer:
            grad = total(name)
            if grad is None:
                grad = _filled(child, 0.0, name)
            results.append(child.op("Identity", [grad]))
        kept = _without_dead_nodes(list(model.graph.node) + child.nodes,
                                   helper.make_graph([], "outputs", [], [helper.make_empty_tensor_value_info(r)
                                                                         for r in results]))
        branches[key] = helper.make_graph(
            kept, f"{key}_gradient", [],
            [helper.make_tensor_value_info(r, em.elem_type(name), None) for r, name in zip(results, outer)],
            list(model.graph.initializer))
    grads = em.op("If", [node.input[0]], n_out=len(outer), then_branch=branches["then_branch"],
                  else_branch=branches["else_branch"])
    return [grads] if len(outer) == 1 else list(grads)
