"""Every op jaxort registers that a gradient can flow through has a gradient rule or a stated
reason, and docs/gradient-coverage.md is the table ``make gradient-table`` writes."""

from __future__ import annotations

import pathlib

from onnx import defs

from jaxort.testing import DIFFERENTIABLE_OPS
from jaxort.training.artifacts.gradient import RULES
from jaxort.training.artifacts.gradient.coverage import (CONTROL_FLOW, FUNCTION_BODY, ORT_1_19_2_BUILDERS,
                                                         WITHOUT_RULE, float_ops)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_op_through_which_a_gradient_flows_has_a_rule_or_a_reason():
    ops = float_ops()
    assert {"Add", "Conv", "Resize", "LSTM", "GroupNormalization"} <= set(ops)
    covered = set(RULES) | set(WITHOUT_RULE) | FUNCTION_BODY | CONTROL_FLOW
    missing = sorted(op for op in ops if op not in covered)
    assert not missing, f"ops without a gradient rule or a reason in coverage.WITHOUT_RULE: {missing}"
    # jaxort.testing's differentiable ops (whose gradients its random graphs check) too.
    assert not sorted(op for op in DIFFERENTIABLE_OPS if op not in covered)


def test_the_tables_are_consistent():
    assert not set(WITHOUT_RULE) & set(RULES), "an op in WITHOUT_RULE has a rule now: drop it from the list"
    assert not (FUNCTION_BODY | CONTROL_FLOW) & (set(RULES) | set(WITHOUT_RULE))
    for op in FUNCTION_BODY:  # each has a body in the installed onnx (newest version)
        schema = defs.get_schema(op)
        assert schema.has_function or schema.has_context_dependent_function, op
    assert all(reason.strip() for reason in WITHOUT_RULE.values())
    # ORT's builders are for ONNX ops, every one of which jaxort has a rule for (BatchNormalization's
    # through ORT's BatchNormInternal form, as ORT's own).
    for op in ORT_1_19_2_BUILDERS:
        defs.get_schema(op)
    assert sorted(ORT_1_19_2_BUILDERS - set(RULES)) == ["BatchNormalization"]


def test_the_coverage_table_is_current(load_tool):
    text = load_tool("make_gradient_table").render()
    assert "| Resize | `resize.py` | yes |" in text and "| Loop | - | - |" in text
    assert (ROOT / "docs" / "gradient-coverage.md").read_text(encoding="utf-8") == text, \
        "docs/gradient-coverage.md is stale: run make gradient-table"
