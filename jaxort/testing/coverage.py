"""What the model strategies reached: ops, opsets, dtypes and attribute values.

:class:`Coverage` tallies models; ``python -m jaxort.testing.coverage`` draws
models from :func:`jaxort.testing.onnx_models`, checks each against ONNX's
reference evaluator (``--check``), and prints the tally::

    python -m jaxort.testing.coverage --examples 300 --check
    python -m jaxort.testing.coverage --minutes 5 --check     # the long profile

A failure is shrunk by hypothesis to a minimal model, saved (see
:func:`jaxort.testing.save_failure`) and listed; a timed run goes on drawing
after it.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from typing import Optional

import onnx
from onnx import helper

from jaxort.graph import default_opset, numpy_dtype

__all__ = ["Coverage", "main"]


def _attr_value(attr: onnx.AttributeProto) -> str:
    value = helper.get_attribute_value(attr)
    if isinstance(value, (onnx.GraphProto, onnx.TensorProto)) or attr.type == onnx.AttributeProto.GRAPHS:
        return type(value).__name__
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, float):
        value = float(f"{value:.4g}")
    return repr(value)


class Coverage:
    """Counts of the ops, opsets, dtypes and attribute values seen in models.

    Example:
      >>> from jaxort.testing import node_model
      >>> import numpy as np
      >>> cov = Coverage()
      >>> cov.add(node_model("Relu", [np.zeros(2, np.float32)], opset=18))
      >>> cov.ops["Relu"], cov.opsets[18]
      (1, 1)
    """

    def __init__(self):
        self.models = 0
        self.ops = collections.Counter()
        self.opsets = collections.Counter()
        self.op_opsets = collections.Counter()
        self.dtypes = collections.Counter()
        self.op_dtypes = collections.Counter()
        self.attributes = collections.Counter()
        self.defaults = collections.Counter()
        self.failures: list = []

    def add(self, model: onnx.ModelProto) -> None:
        """Counts one model (subgraphs included)."""
        self.models += 1
        opset = default_opset(model)
        self.opsets[opset] += 1
        types = {}
        for vi in list(model.graph.input) + list(model.graph.output):
            types[vi.name] = vi.type.tensor_type.elem_type
        for t in model.graph.initializer:
            types[t.name] = t.data_type
        # numpy_dtype: bfloat16 and float8 whatever the installed onnx.
        for elem in set(types.values()):
            self.dtypes[numpy_dtype(elem).name if elem else "?"] += 1
        floats = [e for e in types.values() if e not in (onnx.TensorProto.BOOL, onnx.TensorProto.INT64)]
        main_dtype = numpy_dtype(floats[0]).name if floats else "?"
        self._graph(model.graph, opset, main_dtype)

    def _graph(self, graph: onnx.GraphProto, opset: int, dtype: str) -> None:
        for node in graph.node:
            self.ops[node.op_type] += 1
            self.op_opsets[(node.op_type, opset)] += 1
            self.op_dtypes[(node.op_type, dtype)] += 1
            if not node.attribute:
                self.defaults[node.op_type] += 1
            for attr in node.attribute:
                self.attributes[(node.op_type, attr.name, _attr_value(attr))] += 1
                if attr.type == onnx.AttributeProto.GRAPH:
                    self._graph(attr.g, opset, dtype)

    def report(self, ops_known: Optional[list] = None) -> str:
        """The tally as text: per op its count, opsets, dtypes and attribute values."""
        lines = [f"{self.models} models, {sum(self.ops.values())} nodes, {len(self.ops)} op types",
                 "opsets: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.opsets.items())),
                 "dtypes: " + ", ".join(f"{k}: {v}" for k, v in self.dtypes.most_common())]
        if ops_known is not None:
            missing = sorted(set(ops_known) - set(self.ops))
            lines.append("ops never drawn: " + (", ".join(missing) or "none"))
        lines.append("")
        lines.append(f"{'op':24} {'n':>5}  opsets / dtypes / attributes (value: count)")
        for op, n in sorted(self.ops.items()):
            opsets = ",".join(str(o) for (p, o) in sorted(self.op_opsets) if p == op)
            dts = ",".join(d for (p, d) in sorted(self.op_dtypes) if p == op)
            attrs = collections.defaultdict(list)
            for (p, a, v), c in sorted(self.attributes.items()):
                if p == op:
                    attrs[a].append(f"{v}: {c}")
            attr_text = "; ".join(f"{a}={{{', '.join(vs)}}}" for a, vs in attrs.items())
            if self.defaults[op]:
                attr_text = f"all defaults: {self.defaults[op]}" + ("; " + attr_text if attr_text else "")
            lines.append(f"{op:24} {n:5d}  [{opsets}] [{dts}] {attr_text}")
        if self.failures:
            lines.append("")
            lines.append(f"{len(self.failures)} failures (minimal models):")
            lines.extend(f"  {f}" for f in self.failures)
        return "\n".join(lines)


def _run(cov: Coverage, examples: int, check: bool, max_nodes: int, derandomize: bool) -> bool:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from jaxort.testing.checks import assert_matches_reference
    from jaxort.testing.models import model_inputs, onnx_models
    from jaxort.testing.profiles import CI, FUZZ

    seen = []

    @settings(CI if derandomize else FUZZ, max_examples=examples, deadline=None)
    @given(st.data())
    def run(data):
        model = data.draw(onnx_models(max_nodes=max_nodes))
        inputs = data.draw(model_inputs(model))
        seen.append(model)
        if check:
            assert_matches_reference(model, inputs)

    try:
        run()
        ok = True
    except Exception as err:  # any failure: a mismatch or an error, shrunk by hypothesis
        lines = str(err).splitlines() or [type(err).__name__]
        saved = next((ln for ln in lines if "model saved to" in ln), "")
        cov.failures.append(f"{type(err).__name__}: {lines[0][:200]} {saved}")
        ok = False
    # shrinking replays examples; count each distinct model once
    distinct = {m.SerializeToString(): m for m in seen}
    for m in distinct.values():
        cov.add(m)
    return ok


def main(argv=None) -> int:
    """The command line; returns 1 when a check failed."""
    parser = argparse.ArgumentParser(prog="python -m jaxort.testing.coverage", description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=200, help="examples per round (default 200)")
    parser.add_argument("--minutes", type=float, default=0.0,
                        help="draw fresh rounds until this many minutes have passed")
    parser.add_argument("--check", action="store_true", help="compare each model with ONNX's reference")
    parser.add_argument("--max-nodes", type=int, default=6)
    args = parser.parse_args(argv)

    from jaxort.testing.models import OP_FAMILIES

    cov = Coverage()
    end = time.monotonic() + args.minutes * 60
    ok = _run(cov, args.examples, args.check, args.max_nodes, derandomize=not args.minutes)
    while time.monotonic() < end:
        ok = _run(cov, args.examples, args.check, args.max_nodes, derandomize=False) and ok
    print(cov.report([op for family in OP_FAMILIES.values() for op in family]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
