"""Writes docs/ops.md, the supported-ops table, from jaxort's op registry.

    python tools/make_ops_table.py            # rewrite docs/ops.md
    python tools/make_ops_table.py --check    # exit 1 if docs/ops.md is stale

One row per (domain, op type): the opset versions whose handlers are
registered (dispatch picks the newest ``since`` <= the model's opset).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "ops.md"


def render() -> str:
    """The text of docs/ops.md for the registry of the installed jaxort."""
    import jaxort.graph.ops  # noqa: F401  (fills the registry)
    from jaxort.graph import registered

    rows: dict = {}
    for handler in registered():
        rows.setdefault((handler.domain or "ai.onnx", handler.op_type), []).append(handler.since)
    by_domain: dict = {}
    for (domain, op_type), sinces in rows.items():
        by_domain.setdefault(domain, []).append((op_type, sinces))
    lines = ["# Supported ops", "",
             "Generated from `jaxort.graph.registered()` by `make ops-table`; do not edit by hand.",
             "A handler registered `since` N serves every opset from N until the next listed version.",
             "`jaxort inspect MODEL.onnx` reports a model's ops against this registry at its opset.", "",
             f"{len(rows)} op types, {sum(len(s) for s in rows.values())} handlers.", ""]
    for domain in sorted(by_domain, key=lambda d: (d != "ai.onnx", d)):
        ops = sorted(by_domain[domain])
        lines += [f"## {domain} ({len(ops)} op types)", "", "| op type | since |", "|---|---|"]
        lines += [f"| {op} | {', '.join(str(s) for s in sinces)} |" for op, sinces in ops]
        lines.append("")
    return "\n".join(lines)


def write_or_check(argv, description: str, target: pathlib.Path, render, make_target: str) -> int:
    """A generated doc's command line: writes ``render()`` to ``target``, or with ``--check``
    returns 1 (saying so) when the file differs from it; returns the exit status."""
    parser = argparse.ArgumentParser(description=description)
    name = target.relative_to(ROOT)
    parser.add_argument("--check", action="store_true", help=f"only report whether {name} is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            print(f"{name} is stale: run make {make_target}")
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    return 0


def main(argv=None) -> int:
    """Writes (or with ``--check`` compares) docs/ops.md; returns the exit status."""
    return write_or_check(argv, __doc__.splitlines()[0], TARGET, render, "ops-table")


if __name__ == "__main__":
    sys.exit(main())
