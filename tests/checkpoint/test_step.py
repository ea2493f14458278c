"""An optimizer group's step: 0 .. 2**63 - 2 (ORT feeds step + 1 to its kernel as int64),
checked at load and at save; large steps round-trip exactly."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import jaxort.checkpoint as ckpt

MARK = 0x0123456789ABCDEF  # a valid step whose 8 bytes are easy to find


def with_step(step: int) -> ckpt.Checkpoint:
    group = ckpt.OptimizerGroup("group0", step, 0.001, {"w": {"momentum0": np.ones(2, np.float32)}})
    return ckpt.Checkpoint(trainable={"w": np.zeros(2, np.float32)}, optimizer_groups=(group,))


def file_with_step(step: int) -> bytes:
    data = ckpt.to_bytes(with_step(MARK), include_optimizer_state=True)
    assert data.count(struct.pack("<q", MARK)) == 1
    return data.replace(struct.pack("<q", MARK), struct.pack("<q", step))


@pytest.mark.parametrize(
    "step, message",
    [
        (-1, r"step -1 is negative"),
        (-5, r"step -5 is negative"),
        (-(2**63), r"step -9223372036854775808 is negative"),
        (2**63 - 1, r"step 9223372036854775807 is beyond 9223372036854775806, the largest step whose next step "
                    r"ONNX Runtime's optimizer kernel can take"),
    ],
)
def test_load_rejects_steps_ort_cannot_take(step, message):
    with pytest.raises(ckpt.CheckpointError, match=r"optimizer_groups\[0\] 'group0': " + message):
        ckpt.load_from_buffer(file_with_step(step))


@pytest.mark.parametrize(
    "step, message",
    [
        (-1, r"step -1 is negative"),
        (-(2**31), r"step -2147483648 is negative"),
        (2**63 - 1, r"step 9223372036854775807 is beyond 9223372036854775806"),
        (2**64, r"step 18446744073709551616 is beyond 9223372036854775806"),
        (True, r"step True is not an int"),
        (1.5, r"step 1\.5 is not an int"),
        ("3", r"step '3' is not an int"),
    ],
)
def test_save_rejects_steps_ort_cannot_take(tmp_path, step, message):
    with pytest.raises(ckpt.CheckpointError, match=r"optimizer group 'group0': " + message):
        ckpt.save(with_step(step), tmp_path / "c", include_optimizer_state=True)
    assert list(tmp_path.iterdir()) == []
    # Without the optimizer state the group is not written, so nothing is checked.
    ckpt.save(with_step(step), tmp_path / "c")


@pytest.mark.parametrize("step", [0, 1, 2**31 - 1, 2**31, 2**32 + 7, 2**62, 2**63 - 2, np.int64(2**40)])
def test_legitimate_steps_round_trip_exactly(tmp_path, step):
    back = ckpt.load_from_buffer(file_with_step(int(step)))
    assert back.optimizer_group().step == int(step) and type(back.optimizer_group().step) is int
    ckpt.save(back, tmp_path / "c", include_optimizer_state=True, external_data_threshold=0)
    again = ckpt.load(tmp_path / "c")
    assert again.optimizer_group().step == int(step)
    if step:  # 0 is the field's default, which a writer does not store
        assert ckpt.to_bytes(with_step(step), include_optimizer_state=True) == file_with_step(int(step))
