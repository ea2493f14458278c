"""Round trips, and byte identity with the files ONNX Runtime Training 1.19.2 writes."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest

import jaxort.checkpoint as ckpt
from jaxort._fbs.Checkpoint import Checkpoint as FbsCheckpoint

from .conftest import AFTER, CASES, GOLDEN, ORT_FILES, assert_state_equal


def test_load_save_load_is_identical(golden_file, tmp_path):
    state = ckpt.load(golden_file)
    for include in (True, False):
        out = tmp_path / f"out_{include}"
        ckpt.save(state, out, include_optimizer_state=include)
        back = ckpt.load(out)
        expected = state if include else state.replace(optimizer_groups=())
        assert_state_equal(back, expected)
        assert ckpt.load_from_buffer(ckpt.to_bytes(state, include)) is not None
        assert out.read_bytes() == ckpt.to_bytes(state, include)


@pytest.mark.parametrize("case", CASES)
def test_to_bytes_reproduces_ort_bytes(case):
    """The state path: ORT's CheckpointState.save_checkpoint output, byte for byte."""
    with_opt = (GOLDEN / case / "ckpt_after_with_opt").read_bytes()
    no_opt = (GOLDEN / case / "ckpt_after_no_opt").read_bytes()
    state = ckpt.load_from_buffer(with_opt)
    assert ckpt.to_bytes(state, include_optimizer_state=True) == with_opt
    assert ckpt.to_bytes(state, include_optimizer_state=False) == no_opt


def _scrambled(mapping):
    return dict(reversed(list(mapping.items())))


@pytest.mark.parametrize("case", CASES)
def test_same_state_built_independently_gives_ort_bytes(case):
    """A state assembled from the run's arrays, in another order, writes ORT's exact file."""
    m_after = np.load(GOLDEN / case / "params_after.npz")
    loaded = ckpt.load(GOLDEN / case / "ckpt_after_with_opt")
    manifest_props = {"run_name": "golden-run", "best_metric": 0.125, "epoch": 6}
    (group,) = loaded.optimizer_groups
    state = ckpt.Checkpoint(
        trainable=_scrambled({n: np.array(m_after[n]) for n in loaded.trainable}),
        frozen=_scrambled({n: np.array(m_after[n]) for n in loaded.frozen}),
        optimizer_groups=(
            ckpt.OptimizerGroup(
                "group0",
                group.step,
                1e-3 if case != "cnn_bce" else 0.05,
                _scrambled({p: _scrambled({k: np.array(v) for k, v in ms.items()}) for p, ms in group.states.items()}),
            ),
        ),
        properties=manifest_props,
    )
    for kind, include in ((AFTER[0], True), (AFTER[1], False)):
        ours = ckpt.to_bytes(state, include_optimizer_state=include)
        theirs = (GOLDEN / case / kind).read_bytes()
        assert _structure(ours) == _structure(theirs)  # same tables, same tensor order
        assert ours == theirs


def _structure(buf: bytes) -> dict:
    """The tables of a checkpoint as read by the generated flatbuffers code."""
    c = FbsCheckpoint.GetRootAs(buf, 0)
    ms = c.ModuleState()

    def tensors(get, n):
        return [
            (get(i).Name(), get(i).DataType(), tuple(get(i).DimsAsNumpy().tolist() if get(i).DimsLength() else ()),
             get(i).RawDataLength(), get(i).ExternalDataOffset())
            for i in range(n)
        ]

    groups = []
    for g in range(c.OptimizerGroupsLength()):
        grp = c.OptimizerGroups(g)
        states = []
        for s in range(grp.OptimizerStatesLength()):
            st = grp.OptimizerStates(s)
            states.append((st.ParamName(), tensors(st.Momentums, st.MomentumsLength())))
        groups.append((grp.GroupName(), grp.Step(), grp.InitialLearningRate(), states))
    bag = c.PropertyBag()
    props = None
    if bag is not None:
        props = (
            [(bag.Ints(i).Name(), bag.Ints(i).Value()) for i in range(bag.IntsLength())],
            [(bag.Floats(i).Name(), bag.Floats(i).Value()) for i in range(bag.FloatsLength())],
            [(bag.Strings(i).Name(), bag.Strings(i).Value()) for i in range(bag.StringsLength())],
        )
    return {
        "version": c.Version(),
        "module": None
        if ms is None
        else (
            tensors(ms.RequiresGradParams, ms.RequiresGradParamsLength()),
            tensors(ms.FrozenParams, ms.FrozenParamsLength()),
            ms.IsNominalState(),
            ms.HasExternalData(),
        ),
        "groups": None if c.OptimizerGroupsIsNone() else groups,
        "properties": props,
    }


def _protos(tensors: dict) -> list:
    out = []
    for name, value in tensors.items():
        if isinstance(value, ckpt.NominalTensor):
            proto = onnx.TensorProto(name=name, data_type=ckpt_onnx_type(value.dtype))
        elif value.dtype == object:
            proto = onnx.helper.make_tensor(name, onnx.TensorProto.STRING, value.shape, [s.encode() for s in value.ravel()])
        else:
            proto = onnx.TensorProto(name=name, dims=value.shape, data_type=ckpt_onnx_type(value.dtype))
            proto.raw_data = value.tobytes()
        out.append(proto)
    return out


def ckpt_onnx_type(dtype) -> int:
    from jaxort.dtypes import to_onnx_type

    return to_onnx_type(dtype)


@pytest.mark.parametrize(
    "path",
    [GOLDEN / c / "checkpoint" for c in CASES]
    + [GOLDEN / "mlp_adamw" / "nominal_checkpoint"]
    + [ORT_FILES / f for f in ("dtypes_protos.ckpt", "strings_protos.ckpt", "nominal_protos.ckpt")],
    ids=lambda p: "/".join(p.parts[-2:]),
)
def test_save_tensors_reproduces_ort_bytes(path, tmp_path):
    """The TensorProto path (generate_artifacts' initial checkpoint), byte for byte."""
    state = ckpt.load(path)
    out = tmp_path / "ckpt"
    ckpt.save_tensors(_protos(state.trainable), _protos(state.frozen), out, nominal=state.is_nominal)
    assert _structure(out.read_bytes()) == _structure(path.read_bytes())
    assert out.read_bytes() == path.read_bytes()


def test_save_tensors_from_model_initializers(tmp_path):
    case = GOLDEN / "mlp_frozen"
    inits = {i.name: i for i in onnx.load(str(case / "model.onnx")).graph.initializer}
    ref = ckpt.load(case / "checkpoint")
    out = tmp_path / "ckpt"
    ckpt.save_tensors([inits[n] for n in ref.trainable], [inits[n] for n in ref.frozen], out)
    assert out.read_bytes() == (case / "checkpoint").read_bytes()


def test_save_tensors_typed_fields_and_nominal_dims(tmp_path):
    t = [
        onnx.helper.make_tensor("f", onnx.TensorProto.FLOAT, [2], [1.5, -2.0]),
        onnx.helper.make_tensor("h", onnx.TensorProto.FLOAT16, [2], [1.0, 2.0]),
        onnx.helper.make_tensor("i", onnx.TensorProto.INT64, [3], [1, -2, 3]),
        onnx.helper.make_tensor("u", onnx.TensorProto.UINT32, [1], [7]),
        onnx.helper.make_tensor("d", onnx.TensorProto.DOUBLE, [], [2.25]),
        onnx.helper.make_tensor("b", onnx.TensorProto.BOOL, [2], [True, False]),
    ]
    out = tmp_path / "typed"
    ckpt.save_tensors(t[:3], t[3:], out)
    s = ckpt.load(out)
    np.testing.assert_array_equal(s.trainable["f"], np.array([1.5, -2.0], np.float32), strict=True)
    np.testing.assert_array_equal(s.trainable["h"], np.array([1.0, 2.0], np.float16), strict=True)
    np.testing.assert_array_equal(s.trainable["i"], np.array([1, -2, 3], np.int64), strict=True)
    np.testing.assert_array_equal(s.frozen["u"], np.array([7], np.uint32), strict=True)
    np.testing.assert_array_equal(s.frozen["d"], np.array(2.25), strict=True)
    np.testing.assert_array_equal(s.frozen["b"], np.array([True, False]), strict=True)
    ckpt.save_tensors(t[:3], t[3:], out, nominal=True)
    n = ckpt.load(out)
    assert n.is_nominal and n.trainable["i"] == ckpt.NominalTensor((3,), np.dtype(np.int64))
    with pytest.raises(ckpt.CheckpointError, match="appears twice"):
        ckpt.save_tensors(t[:1], t[:1], out)
    bad = onnx.helper.make_tensor("bad", onnx.TensorProto.FLOAT, [1], [1.0])
    bad.dims[0] = 3
    with pytest.raises(ckpt.CheckpointError, match="'bad'.*4 data bytes"):
        ckpt.save_tensors([bad], [], out)


def test_arrays_are_zero_copy_views_and_aligned():
    buf = (ORT_FILES / "dtypes_protos.ckpt").read_bytes()
    base = np.frombuffer(buf, np.uint8)
    state = ckpt.load_from_buffer(buf)
    for name, value in state.parameters.items():
        assert value.flags.aligned and not value.flags.writeable, name
        aligned_in_file = value.size and value.dtype.alignment <= 4
        if aligned_in_file:
            assert np.shares_memory(value, base), name
    # ORT aligns byte vectors to 4: 8-byte types may sit misaligned and are copied.
    assert np.shares_memory(state.trainable["w.f32"], base)


def test_mmap_load_views_the_file(tmp_path):
    state = ckpt.load(GOLDEN / "mlp_adamw" / "ckpt_after_with_opt", mmap=True)
    w = state.trainable["fc1.weight"]
    assert not w.flags.writeable
    base = w
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    assert type(base).__name__ == "mmap"
    assert_state_equal(state, ckpt.load(GOLDEN / "mlp_adamw" / "ckpt_after_with_opt"))
    # Saving over the mapped file replaces it; the mapped arrays stay valid.
    path = tmp_path / "c"
    ckpt.save(state, path, include_optimizer_state=True)
    mapped = ckpt.load(path, mmap=True)
    ckpt.save(mapped.replace(properties={}), path)
    assert ckpt.load(path).properties == {}
    assert_state_equal(mapped, state)


def test_state_helpers():
    state = ckpt.load(GOLDEN / "mlp_frozen" / "ckpt_after_with_opt")
    assert list(state.parameters) == [*state.trainable, *state.frozen]
    new = state.replace(properties={"x": 1})
    assert new.properties == {"x": 1} and state.properties["epoch"] == 6
    with pytest.raises(KeyError):
        state.optimizer_group("nope")
    nominal = ckpt.NominalTensor((2, 3), np.dtype(np.float32))
    assert nominal.size == 6 and nominal.nbytes == 24


def test_bad_states_raise_checkpoint_error():
    w = np.zeros(2, np.float32)
    cases = [
        (ckpt.Checkpoint(trainable={"a": w}, frozen={"a": w}), "appears twice"),
        (ckpt.Checkpoint(trainable={1: w}), "not a str"),
        (ckpt.Checkpoint(trainable={"a": np.zeros(2, "datetime64[s]")}), "dtype"),
        (ckpt.Checkpoint(trainable={"a": ckpt.NominalTensor((2,), np.dtype("f4"))}), "NominalTensor"),
        (ckpt.Checkpoint(properties={"p": 2**63}), "int64"),
        (ckpt.Checkpoint(properties={"p": 1e39}), "float32"),
        (ckpt.Checkpoint(properties={"p": [1]}), "int, float or str"),
        (ckpt.Checkpoint(trainable={"\ud800": w}), "unicode"),
        (ckpt.Checkpoint(trainable={"s": np.array([1, "a"], dtype=object)}), "str or bytes"),
    ]
    for state, message in cases:
        with pytest.raises(ckpt.CheckpointError, match=message):
            ckpt.to_bytes(state)


def test_big_endian_and_strided_arrays_are_written_little_endian():
    a = np.arange(6, dtype=">f8").reshape(2, 3)
    state = ckpt.Checkpoint(trainable={"a": a, "t": a.T.astype("<i4")})
    back = ckpt.load_from_buffer(ckpt.to_bytes(state))
    np.testing.assert_array_equal(back.trainable["a"], a.astype("<f8"), strict=True)
    np.testing.assert_array_equal(back.trainable["t"], a.T.astype("<i4"), strict=True)


def test_property_edge_values_round_trip():
    props = {"neg_zero": -0.0, "nan": float("nan"), "zero": 0, "big": 2**63 - 1, "empty": "", "bool": True}
    back = ckpt.load_from_buffer(ckpt.to_bytes(ckpt.Checkpoint(properties=props))).properties
    assert np.signbit(back["neg_zero"]) and np.isnan(back["nan"])
    assert back["zero"] == 0 and back["big"] == 2**63 - 1 and back["empty"] == "" and back["bool"] == 1


def test_empty_state_round_trips():
    state = ckpt.Checkpoint()
    assert_state_equal(ckpt.load_from_buffer(ckpt.to_bytes(state)), state)


def test_pathlike_and_str_paths(tmp_path):
    state = ckpt.load(str(GOLDEN / "l1_gemm" / "checkpoint"))
    ckpt.save(state, str(tmp_path / "a"))
    ckpt.save(state, pathlib.PurePath(tmp_path / "b"))
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
