"""Every registered op is tested, in the test file of the module that registers it,
and registered at a real schema version.

``tests/graph/ops/test_<module>.py`` tests the ops ``jaxort/graph/ops/<module>.py``
registers and lists them in its ``COVERED_OPS``.
"""

import importlib.util
import pathlib
import sys
from collections import defaultdict

import onnx
import pytest

import jaxort.graph.ops  # noqa: F401  (fills the registry before collection)
from jaxort.graph import registered

_HERE = pathlib.Path(__file__).parent
_OPS_DIR = pathlib.Path(jaxort.graph.ops.__file__).parent


def _ops_by_module() -> dict:
    """Op module name (``reduce``) -> the op types it registers."""
    ops = defaultdict(set)
    for h in registered():
        ops[h.fn.__module__.rsplit(".", 1)[-1]].add(h.op_type)
    return dict(ops)


def _test_module(stem: str):
    """The test module ``stem`` of this folder, imported under its package name."""
    name = f"{__package__}.{stem}" if __package__ else stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _HERE / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
    return sys.modules[name]


def _covered(module: str) -> set:
    path = _HERE / f"test_{module}.py"
    return set(getattr(_test_module(path.stem), "COVERED_OPS", ())) if path.exists() else set()


OPS_BY_MODULE = _ops_by_module()


def test_every_op_module_registers_ops_and_is_found():
    # A module of graph/ops that registers nothing is either private or a mistake.
    public = {p.stem for p in _OPS_DIR.glob("*.py") if not p.stem.startswith("_")}
    assert public == set(OPS_BY_MODULE), (
        f"op modules registering nothing: {sorted(public - set(OPS_BY_MODULE))}")


@pytest.mark.parametrize("module", sorted(OPS_BY_MODULE))
def test_every_op_module_has_its_test_file(module):
    assert (_HERE / f"test_{module}.py").exists(), (
        f"jaxort/graph/ops/{module}.py registers ops but tests/graph/ops/test_{module}.py "
        "does not exist")


@pytest.mark.parametrize("module", sorted(OPS_BY_MODULE))
def test_each_op_entry_lives_in_the_test_file_of_its_module(module):
    covered = _covered(module)
    missing = sorted(OPS_BY_MODULE[module] - covered)
    assert not missing, (
        f"ops registered in jaxort/graph/ops/{module}.py with no entry in the COVERED_OPS "
        f"of tests/graph/ops/test_{module}.py: {missing}")
    others = sorted(covered - OPS_BY_MODULE[module])
    assert not others, (
        f"tests/graph/ops/test_{module}.py lists ops that {module}.py does not register: {others}")


def test_every_registered_op_has_a_test_entry():
    covered = set().union(*(_covered(m) for m in OPS_BY_MODULE))
    missing = sorted({h.op_type for h in registered()} - covered)
    assert not missing, f"registered ops with no entry in any COVERED_OPS table: {missing}"


# ONNX Runtime registers a few schemas of its own in the default domain
# (onnxruntime/core/graph/contrib_ops/contrib_defs.cc, ORT 1.19.2:
# SetDomain(kOnnxDomain)); onnx knows none of them at these versions.
ORT_DEFAULT_DOMAIN_SCHEMAS = {
    ("LayerNormalization", 1), ("SimplifiedLayerNormalization", 1), ("SparseSoftmaxCrossEntropy", 9),
}


@pytest.mark.parametrize("op_type, since", sorted(ORT_DEFAULT_DOMAIN_SCHEMAS))
def test_ort_default_domain_schemas_are_registered_and_unknown_to_onnx(op_type, since):
    assert any(h.op_type == op_type and h.since == since and h.domain == "" for h in registered())
    try:
        schema = onnx.defs.get_schema(op_type, since, "")
    except onnx.defs.SchemaError:
        return
    assert schema.since_version != since, f"onnx itself defines {op_type}-{since}; drop it from the list"


@pytest.mark.parametrize("handler", [h for h in registered() if h.domain == ""
                                     and (h.op_type, h.since) not in ORT_DEFAULT_DOMAIN_SCHEMAS],
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
