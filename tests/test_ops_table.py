"""docs/ops.md is the registry's table as ``make ops-table`` writes it."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ops_table_is_current(load_tool):
    text = load_tool("make_ops_table").render()
    assert "| Add | 1, 7 |" in text and "## com.microsoft" in text
    assert (ROOT / "docs" / "ops.md").read_text(encoding="utf-8") == text, "docs/ops.md is stale: run make ops-table"
