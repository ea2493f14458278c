"""The pattern registry and the matching pass.

A pattern is a matcher over the prepared node list plus a handler. The matcher
gets a read-only :class:`GraphView` and one anchor node (a node whose op type
the pattern names) and returns a :class:`Match`: the nodes it replaces, the
group's external inputs (positional handler inputs, "" for an absent optional
one), the outputs the handler returns, and the handler's keyword attributes.

:func:`plan` runs every registered matcher once over the node list of one
graph (after slicing, before handler lookup) and returns the list with each
accepted group in place of its nodes. It never mutates a proto. A match is
refused, and its nodes run op by op, when a value made inside the group is
used outside it or is a requested output, when the group reads a value it
does not name as an input, or when a value leaves the group and comes back
(fusing would make a cycle).

This module imports nothing from the tracer (``jaxort.graph._trace``) or the
op modules.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from jaxort.errors import ModelError
from jaxort.graph import normalize_domain, tensor_to_numpy

__all__ = ["Match", "Pattern", "Group", "GraphView", "register_pattern", "registered_patterns",
           "plan"]


@dataclasses.dataclass(frozen=True)
class Match:
    """What a matcher found.

    Attributes:
      nodes: the NodeProtos the group replaces.
      inputs: the group's external inputs, in the handler's positional order
        ("" for an absent optional input).
      outputs: the values the handler returns, in order ("" for one nobody reads).
      attrs: keyword arguments of the handler (static Python values).
    """

    nodes: tuple
    inputs: tuple
    outputs: tuple
    attrs: Mapping = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A registered pattern.

    Attributes:
      name: the pattern's name (unique), e.g. ``"layer_norm"``.
      anchors: op types (default domain unless given as ``"domain::Op"``) the
        matcher is tried on.
      match: ``match(view, node) -> Match | None``.
      handler: ``handler(*inputs, **attrs) -> output or tuple of outputs``.
      priority: higher runs first; a node claimed by one group is never claimed
        by another (attention before softmax, softmax + loss before softmax).
    """

    name: str
    anchors: tuple
    match: Callable
    handler: Callable
    priority: int


@dataclasses.dataclass(frozen=True)
class Group:
    """An accepted match, in the node list :func:`plan` returns.

    Attributes:
      pattern: the pattern.
      match: what its matcher returned.
      position: index of the group's last node in the node list given to plan.
    """

    pattern: Pattern
    match: Match
    position: int

    @property
    def node_names(self) -> tuple:
        return tuple(n.name for n in self.match.nodes)


_PATTERNS: dict[str, Pattern] = {}


def register_pattern(name: str, *, anchors: Sequence[str], handler: Callable, priority: int = 0):
    """Registers a matcher (the decorated function) for the pattern ``name``.

    Args:
      name: unique pattern name.
      anchors: op types the matcher starts from.
      handler: the function the group runs as (inputs positional, attributes
        keyword-only, like an op handler).
      priority: patterns with a higher priority claim nodes first.

    Raises:
      ValueError: if ``name`` is registered twice.
    """

    def decorator(fn):
        if name in _PATTERNS:
            raise ValueError(f"pattern {name!r} is registered twice "
                             f"({_PATTERNS[name].match.__module__} and {fn.__module__})")
        _PATTERNS[name] = Pattern(name, tuple(anchors), fn, handler, int(priority))
        return fn

    return decorator


def registered_patterns() -> list[Pattern]:
    """Every registered pattern, in the order :func:`plan` tries them."""
    return sorted(_PATTERNS.values(), key=lambda p: (-p.priority, p.name))


def _split_anchor(anchor: str) -> tuple:
    if "::" in anchor:
        domain, op = anchor.split("::")
        return (domain, op)
    return ("", anchor)


def _constant_value(node: onnx.NodeProto):
    """The value of a Constant node, or None for a form that is not a tensor."""
    for a in node.attribute:
        if a.name == "value":
            return tensor_to_numpy(a.t)
        if a.name in ("value_float", "value_floats", "value_int", "value_ints"):
            return np.asarray(helper.get_attribute_value(a))
    return None


class GraphView:
    """A read-only view of one graph's node list, for matchers.

    Args:
      nodes: the NodeProtos in topological order.
      opsets: domain -> opset version ("" for the default domain).
      constants: name -> numpy value of the initializers that stay trace-time
        constants. Parameters are not constants: a matcher must not bake in a
        value the caller may change.
      protected: names that must stay visible (the requested outputs).
      outer_reads: ``outer_reads(node) -> set`` of names a node's subgraphs
        read from this graph (they count as uses).
    """

    def __init__(self, nodes: Sequence, opsets: Mapping, constants: Mapping, protected,
                 outer_reads: Callable):
        self.nodes = list(nodes)
        self.opsets = dict(opsets)
        self.protected = frozenset(protected)
        self._constants = constants
        self._producer = {}
        self._consumers: dict[str, list] = {}
        self.position = {}
        self._reads = {}
        for i, node in enumerate(self.nodes):
            self.position[id(node)] = i
            reads = tuple(dict.fromkeys([x for x in node.input if x] + sorted(outer_reads(node))))
            self._reads[id(node)] = reads
            for name in reads:
                self._consumers.setdefault(name, []).append(node)
            for o in node.output:
                if o:
                    self._producer[o] = node

    def opset(self, domain: str = "") -> int:
        """The model's opset for ``domain`` (0 when it does not import it)."""
        return self.opsets.get(domain, 0)

    def producer(self, name: str):
        """The node that makes ``name``, or None (graph inputs, initializers)."""
        return self._producer.get(name) if name else None

    def consumers(self, name: str) -> list:
        """The nodes that read ``name`` (directly or from a subgraph)."""
        return list(self._consumers.get(name, ()))

    def sole_consumer(self, name: str, op_type: str | None = None):
        """The one node reading ``name`` (of ``op_type`` when given), or None.

        None also when ``name`` is a requested output: the group would hide it.
        """
        users = self._consumers.get(name, ())
        if len(users) != 1 or name in self.protected:
            return None
        node = users[0]
        if op_type is not None and not is_op(node, op_type):
            return None
        return node

    def constant(self, name: str):
        """The static value of ``name`` (a constant initializer or Constant node), or None."""
        if not name:
            return None
        if name in self._constants:
            return np.asarray(self._constants[name])
        node = self._producer.get(name)
        if node is not None and is_op(node, "Constant"):
            return _constant_value(node)
        return None

    def scalar(self, name: str):
        """The static value of ``name`` as a float when it has one element, else None."""
        value = self.constant(name)
        # bfloat16 and the float8 types are numpy kind "V".
        if value is None or value.size != 1 or value.dtype.kind not in "fiuV":
            return None
        return float(value.reshape(-1)[0])

    def attr(self, node, name: str, default=None):
        """The attribute ``name`` of ``node`` as a Python value, or ``default``."""
        for a in node.attribute:
            if a.name == name:
                value = helper.get_attribute_value(a)
                return value.decode() if isinstance(value, bytes) else value
        return default

    def reduce_axes(self, node):
        """``(axes, keepdims)`` of a Reduce* node, axes a tuple (None: all) or None if traced.

        Since ReduceSum-13 and the other reductions' version 18, axes are an input.
        """
        keepdims = int(self.attr(node, "keepdims", 1))
        since = 13 if node.op_type == "ReduceSum" else 18
        if self.opset() >= since:
            if len(node.input) < 2 or not node.input[1]:
                if int(self.attr(node, "noop_with_empty_axes", 0)):
                    return None
                return (None, keepdims)
            axes = self.constant(node.input[1])
            if axes is None:
                return None
            return (tuple(int(a) for a in axes.reshape(-1)), keepdims)
        axes = self.attr(node, "axes")
        return (None if axes is None else tuple(int(a) for a in axes), keepdims)

    def other_input(self, node, name: str):
        """The other input of a binary node one of whose inputs is ``name``, or None."""
        if len(node.input) != 2 or name not in node.input:
            return None
        a, b = node.input
        return b if a == name else a


def is_op(node, op_type: str, domain: str = "") -> bool:
    """True when ``node`` is ``domain::op_type``."""
    return node is not None and node.op_type == op_type and normalize_domain(node.domain) == domain


def _refusal(view: GraphView, m: Match, claimed: set) -> str | None:
    """Why ``m`` cannot be applied, or None when it can."""
    ids = {id(n) for n in m.nodes}
    if len(ids) != len(m.nodes) or ids & claimed:
        return "a node is claimed twice"
    made = {o for n in m.nodes for o in n.output if o}
    outputs = {o for o in m.outputs if o}
    if not outputs <= made:
        return "an output is not made by the group"
    for name in made - outputs:
        if name in view.protected:
            return f"{name!r} is a requested output"
        if any(id(c) not in ids for c in view.consumers(name)):
            return f"{name!r} is used outside the group"
    inputs = {i for i in m.inputs if i}
    if inputs & made:
        return "an input is made inside the group"
    for n in m.nodes:
        for i in n.input:
            if i and i not in made and i not in inputs and view.constant(i) is None:
                return f"the group reads {i!r} without naming it"
    # A value leaving the group must not come back into it.
    positions = sorted(view.position[i] for i in ids)
    first, last = positions[0], positions[-1]
    reached = set(outputs)
    for node in view.nodes[first + 1:last]:
        if id(node) in ids:
            continue
        if any(i in reached for i in node.input):
            reached.update(o for o in node.output if o)
    if any(i in reached for n in m.nodes for i in n.input):
        return "a value leaves the group and comes back"
    return None


def plan(nodes: Sequence, opsets: Mapping, constants: Mapping, protected,
         outer_reads: Callable) -> list:
    """Returns ``nodes`` with each accepted group as one :class:`Group` item.

    The caller imports ``jaxort.graph.patterns`` first (it fills the registry).
    The list stays topologically ordered: each group sits at its last node, and
    the nodes between a group's first and last node that read its outputs move
    after it.

    Args:
      nodes: the sliced graph's NodeProtos, topologically ordered.
      opsets: domain -> opset version.
      constants: the initializers that stay static, name -> value.
      protected: the requested outputs.
      outer_reads: names a node's subgraphs read (counted as uses).

    Returns:
      A list of ``(position, item)``: ``position`` is the index in ``nodes``
      (of the group's last node for a Group), ``item`` a NodeProto or Group.
    """
    view = GraphView(nodes, opsets, constants, protected, outer_reads)
    claimed: set = set()
    groups = []
    for pattern in registered_patterns():
        anchors = {_split_anchor(a) for a in pattern.anchors}
        for node in view.nodes:
            if id(node) in claimed or (normalize_domain(node.domain), node.op_type) not in anchors:
                continue
            try:
                m = pattern.match(view, node)
            except (TypeError, ValueError, OverflowError, IndexError, KeyError):
                # A malformed attribute (a list, inf, NaN where an int belongs) is
                # not a match: the nodes run op by op, whose handlers name the error.
                m = None
            if m is None or _refusal(view, m, claimed) is not None:
                continue
            claimed.update(id(n) for n in m.nodes)
            last = max(view.position[id(n)] for n in m.nodes)
            groups.append(Group(pattern, m, last))
    if not groups:
        return list(enumerate(view.nodes))
    return _order(view, groups)


def _order(view: GraphView, groups: list) -> list:
    """Topological order of the plain nodes and the groups (stable, Kahn's algorithm)."""
    member = {}
    for g in groups:
        for n in g.match.nodes:
            member[id(n)] = g
    items = []
    for i, node in enumerate(view.nodes):
        g = member.get(id(node))
        if g is None:
            items.append((i, node))
        elif g.position == i:
            items.append((i, g))
    made_by = {}
    for k, (_, item) in enumerate(items):
        for o in _item_outputs(item):
            made_by[o] = k
    deps = []
    for _, item in items:
        deps.append({made_by[i] for i in _item_inputs(item, view) if i in made_by} - {len(deps)})
    done, out = set(), []
    pending = list(range(len(items)))
    while pending:
        rest = []
        for k in pending:
            if deps[k] <= done:
                done.add(k)
                out.append(items[k])
            else:
                rest.append(k)
        if len(rest) == len(pending):
            # check_graph_structure refuses cyclic graphs before planning; this
            # keeps a caller that skipped it from looping forever.
            names = [n.name for _, item in (items[k] for k in rest)
                     for n in (item.match.nodes if isinstance(item, Group) else (item,))]
            raise ModelError(f"the fusion plan cannot order nodes {names[:8]}: the graph has a cycle")
        pending = rest
    return out


def _item_outputs(item) -> list:
    if isinstance(item, Group):
        return [o for o in item.match.outputs if o]
    return [o for o in item.output if o]


def _item_inputs(item, view: GraphView) -> list:
    if isinstance(item, Group):
        return [i for n in item.match.nodes for i in view._reads[id(n)]]
    return list(view._reads[id(item)])
