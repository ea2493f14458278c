"""Builds the notebooks in this folder from their sources in ``src/``.

A source is a Python script in the "percent" format: ``# %%`` starts a code
cell, ``# %% [markdown]`` a markdown cell whose lines start with ``# ``. The
script runs as is (``python notebooks/src/01_quickstart.py``), diffs cleanly,
and this builder turns it into ``notebooks/<name>.ipynb`` (nbformat 4.5, no
outputs, deterministic cell ids) with the standard library only::

    python notebooks/build.py            # rewrite every notebook
    python notebooks/build.py --check    # exit 1 if a notebook is stale

``tests/test_notebooks.py`` fails when a notebook differs from its source.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
SOURCES = HERE / "src"

_METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


def _split_cells(text: str) -> list:
    """Returns ``[(cell_type, lines)]`` of a percent-format script."""
    cells = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            kind = "markdown" if "[markdown]" in line else "code"
            cells.append((kind, []))
        elif cells:
            cells[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"text before the first '# %%' marker: {line!r}")
    return cells


def _markdown_line(line: str) -> str:
    if line.strip() in ("", "#"):
        return ""
    if not line.startswith("# "):
        raise ValueError(f"markdown cell line does not start with '# ': {line!r}")
    return line[2:]


def _source(lines: list) -> list:
    # Jupyter stores a cell's source as lines that keep their newline, the
    # last one without.
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return [line + "\n" for line in lines[:-1]] + lines[-1:]


def build(source: pathlib.Path) -> dict:
    """The notebook (a JSON-ready dict) for one percent-format source file."""
    cells = []
    for i, (kind, lines) in enumerate(_split_cells(source.read_text(encoding="utf-8"))):
        if kind == "markdown":
            lines = [_markdown_line(line) for line in lines]
        cell = {"cell_type": kind, "id": f"{source.stem}-{i}", "metadata": {},
                "source": _source(lines)}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    return {"cells": cells, "metadata": _METADATA, "nbformat": 4, "nbformat_minor": 5}


def render(notebook: dict) -> str:
    """The notebook's file text, formatted as Jupyter writes it."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    """Writes (or with ``--check`` compares) every notebook; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale notebooks")
    args = parser.parse_args(argv)
    stale = []
    for source in sorted(SOURCES.glob("*.py")):
        target = HERE / f"{source.stem}.ipynb"
        text = render(build(source))
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale notebooks (run python notebooks/build.py): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
