"""The notebooks in notebooks/: each runs top to bottom and its own checks hold.

Every notebook is executed by a Jupyter kernel (nbclient, kernel
``python3``), in a temporary working directory, as a user would run it; the
notebooks assert their numbers against numpy, ONNX's reference evaluator
and ONNX Runtime's recorded runs, and the last code cell gathers the final
checks. A notebook that plots must show its figure. The notebooks are built
from percent-format sources in notebooks/src/ by notebooks/build.py, and
must not drift from them.
"""

from __future__ import annotations

import ast
import base64
import importlib.util
import json
import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

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


def _png_outputs(notebook) -> list:
    """The decoded image/png outputs of an executed notebook."""
    return [base64.b64decode(output["data"]["image/png"])
            for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.outputs if "image/png" in output.get("data", {})]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_its_checks_hold(path, tmp_path, tmp_path_factory):
    cells = _code_cells(path)
    assert cells, f"{path.name} has no code cells"
    for cell in cells:  # committed without outputs, so diffs show only code
        assert cell["outputs"] == [] and cell["execution_count"] is None
    sources = ["".join(c["source"]) for c in cells]
    assert _checks(sources[-1]) >= 3, f"the last code cell of {path.name} must assert its results"

    # The kernel's working directory: files a notebook writes outside its own
    # temporary directories land here. Hypothesis keeps its cache in
    # ./.hypothesis unless told otherwise; that cache is not the notebook's
    # doing. A failing cell raises CellExecutionError with its traceback.
    env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path_factory.mktemp("hypothesis"))}
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    assert list(tmp_path.iterdir()) == []
    if any("matplotlib" in source for source in sources):
        pngs = _png_outputs(notebook)
        assert pngs, f"{path.name} plots but shows no PNG"
        assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in pngs)


def test_notebooks_match_their_sources():
    builder = _load_builder()
    for source in sorted((NOTEBOOKS_DIR / "src").glob("*.py")):
        target = NOTEBOOKS_DIR / f"{source.stem}.ipynb"
        assert target.read_text(encoding="utf-8") == builder.render(builder.build(source)), (
            f"{target.name} is stale: run python notebooks/build.py")
