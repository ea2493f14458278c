"""External data: ORT's side file (<checkpoint>.data), written past a size threshold."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import jaxort.checkpoint as ckpt
from jaxort.checkpoint._files import TRAILER_SIZE

from .conftest import GOLDEN, ORT_FILES, assert_state_equal


def test_naming_and_default_threshold():
    assert ckpt.external_data_path("dir/model.ckpt") == "dir/model.ckpt.data"
    assert ckpt.external_data_path(ORT_FILES / "x") == str(ORT_FILES / "x") + ".data"
    assert ckpt.DEFAULT_EXTERNAL_DATA_THRESHOLD == 1800 * 1024**2


@pytest.mark.parametrize("mmap", [False, True])
def test_small_threshold_writes_side_file_and_reloads_exactly(tmp_path, mmap):
    state = ckpt.load(GOLDEN / "mlp_frozen" / "ckpt_after_with_opt")
    state = state.replace(frozen={**state.frozen, "d": np.arange(5.0), "i": np.arange(3, dtype=np.int8)})
    path = tmp_path / "ckpt"
    ckpt.save(state, path, include_optimizer_state=True, external_data_threshold=1024)
    side = tmp_path / "ckpt.data"
    assert side.exists()
    back = ckpt.load(path, mmap=mmap)
    assert back.has_external_data and not state.has_external_data
    assert_state_equal(back, state)
    for value in back.parameters.values():
        assert value.flags.aligned
    # All tensor bytes left the checkpoint: it is smaller than the data alone.
    param_bytes = sum(v.nbytes for v in state.parameters.values())
    assert path.stat().st_size < param_bytes <= side.stat().st_size
    # float64 data is 8-aligned in the side file, like ORT's.
    assert back.frozen["d"].flags.aligned
    # Below the threshold nothing moves out.
    ckpt.save(state, tmp_path / "inline")
    assert not (tmp_path / "inline.data").exists()
    assert not ckpt.load(tmp_path / "inline").has_external_data


def test_save_tensors_keeps_small_tensors_inline(tmp_path):
    from onnx import numpy_helper

    big = numpy_helper.from_array(np.arange(16, dtype=np.float32), "big")  # 64 bytes
    small = numpy_helper.from_array(np.arange(15, dtype=np.float32), "small")
    path = tmp_path / "c"
    ckpt.save_tensors([big, small], [], path, external_data_threshold=1)
    state = ckpt.load(path)
    assert state.has_external_data
    # Only "big", as ORT does, then the 32-byte record pairing the files.
    assert (tmp_path / "c.data").stat().st_size == 64 + TRAILER_SIZE
    np.testing.assert_array_equal(state.trainable["small"], np.arange(15, dtype=np.float32))


def test_missing_or_short_side_file(tmp_path):
    state = ckpt.Checkpoint(trainable={"w": np.arange(32, dtype=np.float32)})
    path = tmp_path / "c"
    ckpt.save(state, path, external_data_threshold=0)
    with pytest.raises(ckpt.CheckpointError, match="cannot reach"):
        ckpt.load_from_buffer(path.read_bytes())
    with open(tmp_path / "c.data", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ckpt.CheckpointError, match=r"do not belong together: the checkpoint was saved with data of "
                       r"save [0-9a-f]{12} \(160 bytes\), the file holds no jaxort record \(100 bytes\)"):
        ckpt.load(path)
    # A side file without jaxort's record (as ONNX Runtime writes it) is checked by its size only.
    path.write_bytes(path.read_bytes()[:-TRAILER_SIZE])
    with pytest.raises(ckpt.CheckpointError, match=r"'w'.*\[0, 128\) lies past the end of the external data file \(100 bytes\)"):
        ckpt.load(path)
    os.remove(tmp_path / "c.data")
    with pytest.raises(ckpt.CheckpointError, match=r"external data file .*c\.data.* does not exist"):
        ckpt.load(path)


def _sparse_side_file(path, size, pieces):
    """Writes a sparse file of ``size`` bytes with some known bytes at offsets."""
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, array in pieces:
            f.seek(offset)
            f.write(array.tobytes())


@pytest.mark.parametrize(
    "name, offsets, size",
    [
        # Offsets read from the files ONNX Runtime wrote (tools/make_checkpoint_fixtures.py --external).
        ("ext_protos.ckpt", {"i8": 0, "big1": 68, "d9": 1073741896, "big2": 1073741968, "u8": 1912602768}, 1912602833),
        ("ext_state.ckpt", {"big1": 0, "d9": 1073741824, "i8": 1073741896, "big2": 1073741964, "f3": 1912602764, "u8": 1912602776}, 1912602841),
    ],
)
def test_ort_external_data_files(tmp_path, name, offsets, size):
    path = tmp_path / "ckpt"
    shutil.copy(ORT_FILES / name, path)
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.load(path)
    values = {
        "i8": np.arange(67, dtype=np.int8),
        "d9": np.arange(9, dtype=np.float64),
        "u8": np.arange(65, dtype=np.uint8),
        "f3": np.arange(3, dtype=np.float32),
        "big1": np.full(8, 1.5, np.float32),
        "big2": np.full(8, -2.0, np.float32),
    }
    _sparse_side_file(str(path) + ".data", size, [(offsets[n], values[n]) for n in offsets])
    state = ckpt.load(path, mmap=True)
    assert state.has_external_data
    assert list(state.trainable) == (["i8", "big1", "d9"] if name == "ext_protos.ckpt" else ["big1", "d9", "i8"])
    for n in ("i8", "d9", "u8", "f3"):
        np.testing.assert_array_equal(state.parameters[n], values[n], strict=True)
    assert state.parameters["big1"].shape == (256, 1024, 1024)
    np.testing.assert_array_equal(state.parameters["big1"].reshape(-1)[:8], values["big1"])
    np.testing.assert_array_equal(state.parameters["big2"].reshape(-1)[:8], values["big2"])
