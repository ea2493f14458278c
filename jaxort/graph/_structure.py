"""The structural check of a graph's node list, run before any pass walks it.

:func:`check_graph_structure` refuses what would make the passes over a node
list (slicing, fusion planning, tracing, the gradient-graph writer) loop,
drop nodes or read the wrong value: a cycle (a node reading its own output
included), a value made twice, an output listed twice by one node, a node
reading a value nothing makes, and nodes out of topological order. Models
loaded with ``check=False`` (ONNX Runtime training artifacts) reach the
passes without ``onnx.checker``, so every pass calls it first.

It runs in time linear in the size of the graph, without recursion over
nodes, so a chain of 100k nodes is checked like a short one. This module
imports ``jaxort.errors`` and ``jaxort.graph._prepare`` only.
"""

from __future__ import annotations

import onnx

from jaxort.errors import ModelError
from jaxort.graph._prepare import outer_reads

__all__ = ["check_graph_structure"]

_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
# A cycle longer than this is shown as its first and last nodes.
_SHOWN = 8


def check_graph_structure(graph: onnx.GraphProto | onnx.ModelProto) -> None:
    """Checks that a graph's nodes form a valid, topologically sorted dataflow graph.

    The subgraphs in the nodes' attributes (If branches, Loop and Scan bodies)
    are checked the same way, except that they may read values of the
    enclosing scopes: a name a subgraph does not make is not an error there.
    What a node's subgraphs read from its own graph counts as the node's
    input, so a branch reading its If's output is a cycle too.

    Args:
      graph: the graph, or a model (its main graph is checked).

    Raises:
      ModelError: naming the nodes (by name, or ``#index`` in the node list
        when unnamed, and op type) and values at fault, for a cycle (a node
        reading its own output is a cycle of one), a value made by two
        nodes or by a node and also a graph input or initializer, a node
        listing one output twice, a node of the main graph reading a value
        that is not a graph input, an initializer or the output of an
        earlier node, and a node reading a value a later node makes.

    Example:
      >>> from onnx import helper
      >>> loop = helper.make_graph(
      ...     [helper.make_node("Relu", ["y"], ["y"], name="r")], "g", [], [])
      >>> check_graph_structure(loop)
      Traceback (most recent call last):
      ...
      jaxort.errors.ModelError: node 'r' (Relu) reads its own output 'y' (a cycle of one node)
    """
    if isinstance(graph, onnx.ModelProto):
        graph = graph.graph
    stack = [(graph, "", True)]
    while stack:
        g, where, top = stack.pop()
        for node, k, attr in _check_one(g, where, top):
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            stack.extend((sub, f" in subgraph {attr.name!r} of node {_describe(node, k)}{where}", False)
                         for sub in subs)


def _label(node: onnx.NodeProto, index: int) -> str:
    return repr(node.name) if node.name else f"#{index}"


def _describe(node: onnx.NodeProto, index: int) -> str:
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
    return f"{_label(node, index)} ({op})"


def _check_one(graph: onnx.GraphProto, where: str, top: bool) -> list:
    """Checks one graph's own node list; returns its graph attributes as ``(node, index, attribute)``."""
    nodes = list(graph.node)
    inputs = {i.name for i in graph.input}
    initializers = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    producer: dict = {}
    # Each proto field is read once: on a big model, reading them is most of the cost.
    reads, outputs, graph_attrs = [], [], []
    for k, node in enumerate(nodes):
        reads.append(node.input)
        outs = [o for o in node.output if o]
        outputs.append(outs)
        for o in outs:
            j = producer.get(o)
            if j == k:
                raise ModelError(f"node {_describe(node, k)} lists output {o!r} twice{where}")
            if j is not None:
                raise ModelError(f"value {o!r} is made by two nodes, {_describe(nodes[j], j)} and "
                                 f"{_describe(node, k)}{where}")
            if o in inputs or o in initializers:
                what = "a graph input" if o in inputs else "an initializer"
                raise ModelError(f"value {o!r} is made by node {_describe(node, k)} and is also {what}{where}")
            producer[o] = k
        attrs = node.attribute
        if attrs:
            graph_attrs.extend((node, k, a) for a in attrs if a.type in _GRAPH_ATTRS)
    outer = {}  # node index -> what its subgraphs read from the scopes around them
    for node, k, _ in graph_attrs:
        if k not in outer:
            outer[k] = sorted(outer_reads(node))

    late = None  # the first read of a value a later node makes: (reader, value, maker)
    for k, names in enumerate(reads):
        names = list(names)
        reads[k] = names = names + outer[k] if k in outer else names
        direct = len(names) - len(outer.get(k, ()))
        for n, name in enumerate(names):
            if not name:
                continue
            how = "" if n < direct else " in a subgraph"
            j = producer.get(name)
            if j is None:
                if top and name not in inputs and name not in initializers:
                    raise ModelError(
                        f"node {_describe(nodes[k], k)} reads {name!r}{how}, which is not a graph input, an "
                        f"initializer or the output of an earlier node{where}")
            elif j == k:
                raise ModelError(f"node {_describe(nodes[k], k)} reads its own output {name!r}{how} "
                                 f"(a cycle of one node){where}")
            elif j > k and late is None:
                late = (k, name, j)
    if late is not None:
        # deps[k]: the nodes whose outputs node k reads, directly or from a subgraph.
        deps = [{producer[i] for i in names if i in producer} for names in reads]
        cycle = _find_cycle(deps)
        if cycle is not None:
            raise ModelError(_cycle_message(nodes, cycle, outputs, reads, where))
        k, name, j = late
        raise ModelError(f"node {_describe(nodes[k], k)} reads {name!r} before node {_describe(nodes[j], j)} "
                         f"makes it: ONNX needs the nodes in topological order{where}")
    return graph_attrs


def _find_cycle(deps: list) -> list | None:
    """One cycle of the graph whose node k reads the nodes ``deps[k]``, or None (Kahn's algorithm).

    Returns the cycle in dataflow order (each node is read by the next, and
    the last by the first), from its node first in the node list.
    """
    waiting = [len(d) for d in deps]
    readers: list = [[] for _ in deps]
    for k, d in enumerate(deps):
        for j in d:
            readers[j].append(k)
    ready = [k for k, n in enumerate(waiting) if n == 0]
    while ready:
        j = ready.pop()
        for k in readers[j]:
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.append(k)
    left = [k for k, n in enumerate(waiting) if n]
    if not left:
        return None
    # Every node left reads a node left: walking back from one must come round.
    seen: dict = {}
    path = []
    k = left[0]
    while k not in seen:
        seen[k] = len(path)
        path.append(k)
        k = next(j for j in deps[k] if waiting[j])
    cycle = path[seen[k]:]
    cycle.reverse()
    first = cycle.index(min(cycle))
    return cycle[first:] + cycle[:first]


def _cycle_message(nodes: list, cycle: list, outputs: list, reads: list, where: str) -> str:
    names = [_describe(nodes[k], k) for k in cycle] + [_label(nodes[cycle[0]], cycle[0])]
    values = []
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        values.append(repr(next(o for o in outputs[a] if o in reads[b])))
    if len(cycle) > _SHOWN:
        # The first five nodes and the last two, then the first again.
        gap = f"({len(cycle) - 7} more)"
        names = names[:5] + [gap] + names[-3:]
        values = values[:5] + [gap] + values[-2:]
    return (f"the graph has a cycle through nodes {' -> '.join(names)} (along values "
            f"{' -> '.join(values)}){where}")
