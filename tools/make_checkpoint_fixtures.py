"""Writes the ONNX Runtime checkpoint fixtures under tests/fixtures/checkpoint/.

Run with an environment that has onnxruntime-training 1.19.2 and onnx 1.16
(see ORACLE.md); the test suite only reads the files this writes:

    python tools/make_checkpoint_fixtures.py [OUT_DIR]

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

This script imports onnxruntime and onnx; it is a development tool, never
imported by jaxort.
"""

from __future__ import annotations

import pathlib
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


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parents[1]
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "tests" / "fixtures" / "checkpoint")
