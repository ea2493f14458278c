"""Values computed on the host before a compiled call: ops whose output shape depends on values.

NonZero and NonMaxSuppression return as many indices as their input values
select, and no compiled XLA program has an output shape that depends on
values. When such an op reads a value known only at run time (a mask
computed from token ids, scores computed from an image), the graph can still
be compiled: the op and the nodes it depends on (its *prefix*) run first, on
concrete values, and the op's outputs enter the compiled program as inputs,
whose shapes are then known. A new count of selected indices is a new input
shape, so it compiles once more; the same count reuses the compiled program.

Only ops whose outputs are all integer indices are taken this way: nothing
differentiable leaves the compiled program, so gradients are those of the
whole graph. The prefix runs as a compiled program of its own, before the
step: it is cheap when it reads integer inputs (token ids, masks), and costs
a second forward pass of whatever it needs otherwise.

Layer: graph.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from jaxort.graph._prepare import _reads

__all__ = ["HOST_OPS", "HostPlan", "host_plan"]

#: (domain, op type) of the ops whose outputs are computed on the host when
#: their inputs are known only at run time.
HOST_OPS = frozenset({("", "NonZero"), ("", "NonMaxSuppression")})

# Ops whose outputs depend on their inputs' shapes only, which a compiled
# program knows: they end a run-time dependency.
_SHAPE_ONLY = frozenset({("", "Shape"), ("", "Size")})


class HostPlan(NamedTuple):
    """What a graph computes on the host.

    Attributes:
      nodes: the host ops (nodes of :data:`HOST_OPS` reading run-time values).
      prefix: the nodes the host ops need, the host ops among them, in graph order.
      names: the host ops' outputs (the values the compiled program takes).
      params: the parameters the prefix reads.
      feeds: the values the host ops read.
      nested: a host op reads another's outputs (through the prefix): the
        prefix then runs op by op rather than as a compiled program.
    """

    nodes: tuple
    prefix: tuple
    names: tuple
    params: frozenset
    feeds: tuple
    nested: bool = False


def host_plan(nodes: Sequence, runtime: Sequence[str], params: Sequence[str]) -> HostPlan:
    """Finds the host ops of a node list and the prefix they need.

    Args:
      nodes: the prepared nodes, in graph order.
      runtime: the names whose values are known only at run time under
        ``jit`` (positional inputs and parameters).
      params: the parameter names (a subset of ``runtime``).

    Returns:
      The :class:`HostPlan`; empty when no host op reads a run-time value.
    """
    dynamic = set(runtime)
    hosts = []
    for node in nodes:
        key = (node.domain, node.op_type)
        reads = _reads(node)
        if key in HOST_OPS and reads & dynamic:
            hosts.append(node)
        if key not in _SHAPE_ONLY and reads & dynamic:
            dynamic.update(o for o in node.outputs if o)
    if not hosts:
        return HostPlan((), (), (), frozenset(), ())
    feeds = tuple(dict.fromkeys(n for node in hosts for n in node.inputs if n))
    needed = set(feeds)
    chosen = {id(node) for node in hosts}
    for node in reversed(nodes):
        if id(node) in chosen or needed.intersection(node.outputs):
            chosen.add(id(node))
            needed |= _reads(node)
    prefix = tuple(node for node in nodes if id(node) in chosen)
    names = tuple(o for node in hosts for o in node.outputs if o)
    made = {o for node in hosts for o in node.outputs if o}
    nested = any(made & _reads(node) for node in prefix)
    return HostPlan(tuple(hosts), prefix, names, frozenset(needed & set(params)), feeds, nested)
