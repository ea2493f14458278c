"""The notebooks in notebooks/: each runs top to bottom and its own checks hold.

Every code cell of a notebook is executed in order in one namespace, as a
kernel would run them; the notebooks assert their numbers against numpy and
ONNX's reference evaluator, and the last code cell gathers the final checks.
The notebooks are built from percent-format sources in notebooks/src/ by
notebooks/build.py, and must not drift from them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pathlib

import pytest

NOTEBOOKS_DIR = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def _load_builder():
    spec = importlib.util.spec_from_file_location("notebook_build", NOTEBOOKS_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code_cells(path: pathlib.Path) -> list:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4
    return [c for c in notebook["cells"] if c["cell_type"] == "code"]


def _checks(source: str) -> int:
    """Counts assert statements and numpy.testing assert_* calls."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            count += 1
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            count += name.startswith("assert_")
    return count


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] == sorted(
        f"{p.stem}.ipynb" for p in (NOTEBOOKS_DIR / "src").glob("*.py"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_its_checks_hold(path, tmp_path, monkeypatch):
    cells = _code_cells(path)
    assert cells, f"{path.name} has no code cells"
    for cell in cells:  # committed without outputs, so diffs show only code
        assert cell["outputs"] == [] and cell["execution_count"] is None
    sources = ["".join(c["source"]) for c in cells]
    assert _checks(sources[-1]) >= 3, f"the last code cell of {path.name} must assert its results"

    # Files a notebook writes outside its own temporary directories land here.
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    for i, source in enumerate(sources):
        exec(compile(source, f"{path.name}[code cell {i}]", "exec"), namespace)
    assert list(tmp_path.iterdir()) == []


def test_notebooks_match_their_sources():
    builder = _load_builder()
    for source in sorted((NOTEBOOKS_DIR / "src").glob("*.py")):
        target = NOTEBOOKS_DIR / f"{source.stem}.ipynb"
        assert target.read_text(encoding="utf-8") == builder.render(builder.build(source)), (
            f"{target.name} is stale: run python notebooks/build.py")
