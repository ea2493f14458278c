"""Every registered op is covered by an op test table and registered at a real schema version."""

import importlib.util
import pathlib
import sys

import onnx
import pytest

import jaxort.graph.ops  # noqa: F401  (fills the registry before collection)
from jaxort.graph import registered

_HERE = pathlib.Path(__file__).parent


def _covered_ops() -> set:
    covered = set()
    for path in sorted(_HERE.glob("test_*.py")):
        if path.name == "test_coverage.py":
            continue
        spec = importlib.util.spec_from_file_location(f"_coverage_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
        covered |= set(getattr(module, "COVERED_OPS", ()))
    return covered


def test_every_registered_op_has_a_test_entry():
    covered = _covered_ops()
    missing = sorted({h.op_type for h in registered()} - covered)
    assert not missing, f"registered ops with no entry in any COVERED_OPS table: {missing}"


@pytest.mark.parametrize("handler", [h for h in registered() if h.domain == ""],
                         ids=lambda h: f"{h.op_type}-{h.since}")
def test_since_is_a_real_schema_version(handler):
    if handler.since > onnx.defs.onnx_opset_version():
        pytest.skip(f"opset {handler.since} is newer than the installed onnx knows")
    try:
        schema = onnx.defs.get_schema(handler.op_type, handler.since, "")
    except onnx.defs.SchemaError:
        pytest.fail(f"{handler.op_type} has no schema at or before opset {handler.since}")
    assert schema.since_version == handler.since, (
        f"{handler.op_type} registered since {handler.since}, but the schema in force at "
        f"that opset starts at {schema.since_version}")
