"""Writes the ONNX Runtime checkpoint fixtures under tests/fixtures/checkpoint/.

Run with an environment that has onnxruntime-training 1.19.2 and onnx 1.16
(see ORACLE.md); the test suite only reads the files this writes:

    python tools/make_checkpoint_fixtures.py [--external] [OUT_DIR]

Files written (all by ONNX Runtime itself):

- ``dtypes_protos.ckpt``: ``onnxblock.save_checkpoint`` (the TensorProto
  path) with one tensor of every numeric dtype, a 0-d, an empty, a
  misaligned-for-float64 layout and unicode names.
- ``dtypes_state.ckpt``: the tensors whose dtypes ORT's ``CheckpointState``
  can hold (not float16, bfloat16 or string in 1.19.2), loaded into a
  ``CheckpointState`` and saved again (the state path, which sorts names),
  with int, float and string properties.
- ``strings_protos.ckpt``: a STRING tensor (string_data).
- ``nominal_protos.ckpt``: the first file's tensors as a nominal checkpoint.

With ``--external`` (about a minute, 4 GB of temporary disk and 8 GB of
memory): ORT only moves data to the external data file past 1800 MiB, so two
checkpoints of 1.9 GB are written in a temporary directory and only their
small flatbuffer parts are kept (the ``.data`` files are too large to
commit; tests rebuild them as sparse files from the known values):

- ``ext_protos.ckpt``: ``onnxblock.save_checkpoint`` of i8 [67] int8 arange,
  big1 [256,1024,1024] float32 1.5, d9 [9] float64 arange (trainable); f3 [3]
  float32 arange, big2 [200,1024,1024] float32 -2.0, u8 [65] uint8 arange
  (frozen).
- ``ext_state.ckpt``: that checkpoint loaded into a ``CheckpointState``,
  given the property ``p = 1``, and saved again.

This script imports onnxruntime and onnx; it is a development tool, never
imported by jaxort.
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxruntime.training import onnxblock
from onnxruntime.training.api import CheckpointState


def _raw_tensor(name: str, data_type: int, dims: list[int], raw: bytes) -> TensorProto:
    return helper.make_tensor(name, data_type, dims, vals=raw, raw=True)


def _dtype_tensors() -> tuple[list[TensorProto], list[TensorProto]]:
    rng = np.random.default_rng(1234)
    trainable = [
        numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "w.f32"),
        numpy_helper.from_array(rng.standard_normal(3), "x"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float16), "poids·f16"),
        # bfloat16: the upper halves of float32 values.
        _raw_tensor(
            "b.bf16",
            TensorProto.BFLOAT16,
            [4],
            (np.arange(4, dtype=np.float32) * 1.5).view(np.uint32).__rshift__(16).astype(np.uint16).tobytes(),
        ),
    ]
    frozen = [
        numpy_helper.from_array(np.array(3.25, dtype=np.float32), "s"),
        numpy_helper.from_array(np.zeros((0, 3), dtype=np.float32), "empty"),
        numpy_helper.from_array(np.arange(-3, 3, dtype=np.int8), "i8"),
        numpy_helper.from_array(np.arange(6, dtype=np.uint8).reshape(2, 3), "u8"),
        numpy_helper.from_array(np.array([-2, 7], dtype=np.int16), "i16"),
        numpy_helper.from_array(np.array([1, 65535], dtype=np.uint16), "u16"),
        numpy_helper.from_array(np.array([-(2**31), 2**31 - 1], dtype=np.int32), "i32"),
        numpy_helper.from_array(np.array([0, 2**32 - 1], dtype=np.uint32), "u32"),
        numpy_helper.from_array(np.array([-(2**63), 2**63 - 1], dtype=np.int64), "i64"),
        numpy_helper.from_array(np.array([0, 2**64 - 1], dtype=np.uint64), "u64"),
        numpy_helper.from_array(np.array([True, False, True]), "flags"),
        numpy_helper.from_array(np.array([1.5, -2.0], dtype=np.float64), "d64"),
        numpy_helper.from_array(np.array(7, dtype=np.int64), "scalar_i64"),
    ]
    return trainable, frozen


def main(out_dir: pathlib.Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    trainable, frozen = _dtype_tensors()

    protos_path = out_dir / "dtypes_protos.ckpt"
    onnxblock.save_checkpoint((trainable, frozen), protos_path)

    # ORT 1.19.2's CheckpointState cannot hold float16, bfloat16 or strings.
    state_dtypes = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.STRING}
    with tempfile.TemporaryDirectory() as tmp:
        subset = pathlib.Path(tmp) / "subset.ckpt"
        onnxblock.save_checkpoint(
            (
                [t for t in trainable if t.data_type not in state_dtypes],
                [t for t in frozen if t.data_type not in state_dtypes],
            ),
            subset,
        )
        state = CheckpointState.load_checkpoint(str(subset))
    state.properties["epoch"] = 3
    state.properties["alpha"] = 0.1
    state.properties["tag"] = "dtypes ✓"
    state.properties["beta"] = -2.5
    state.properties["count"] = -(2**40)
    CheckpointState.save_checkpoint(state, str(out_dir / "dtypes_state.ckpt"))

    strings = [
        helper.make_tensor("words", TensorProto.STRING, [2, 2], [b"a", b"", "é".encode(), b"xyz"]),
    ]
    onnxblock.save_checkpoint((strings, []), out_dir / "strings_protos.ckpt")

    onnxblock.save_checkpoint((trainable, frozen), out_dir / "nominal_protos.ckpt", nominal_checkpoint=True)
    print("wrote", sorted(p.name for p in out_dir.iterdir()))


def make_external(out_dir: pathlib.Path) -> None:
    f32 = np.float32
    trainable = [
        numpy_helper.from_array(np.arange(67, dtype=np.int8), "i8"),
        numpy_helper.from_array(np.full((256, 1024, 1024), 1.5, dtype=f32), "big1"),
        numpy_helper.from_array(np.arange(9, dtype=np.float64), "d9"),
    ]
    frozen = [
        numpy_helper.from_array(np.arange(3, dtype=f32), "f3"),
        numpy_helper.from_array(np.full((200, 1024, 1024), -2.0, dtype=f32), "big2"),
        numpy_helper.from_array(np.arange(65, dtype=np.uint8), "u8"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        protos = pathlib.Path(tmp) / "protos.ckpt"
        onnxblock.save_checkpoint((trainable, frozen), protos)
        del trainable, frozen
        state = CheckpointState.load_checkpoint(str(protos))
        state.properties["p"] = 1
        CheckpointState.save_checkpoint(state, str(pathlib.Path(tmp) / "state.ckpt"))
        shutil.copy(protos, out_dir / "ext_protos.ckpt")
        shutil.copy(pathlib.Path(tmp) / "state.ckpt", out_dir / "ext_state.ckpt")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--external"]
    root = pathlib.Path(__file__).resolve().parents[1]
    out = pathlib.Path(args[0]) if args else root / "tests" / "fixtures" / "checkpoint"
    main(out)
    if "--external" in sys.argv[1:]:
        make_external(out)
