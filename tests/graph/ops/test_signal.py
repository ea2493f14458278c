"""Signal ops (ops/signal.py: DFT, STFT, windows, MelWeightMatrix) against ONNX's reference.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from onnx import TensorProto

from ._harness import F32, F64, OpCase, example, table_tests

SIGNAL_OPS = ("DFT", "STFT", "HannWindow", "HammingWindow", "BlackmanWindow",
              "MelWeightMatrix")
COVERED_OPS = set(SIGNAL_OPS)


@st.composite
def dft_example(draw):
    dtype = draw(st.sampled_from([F32, F64]))
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(2, 6), min_size=rank, max_size=rank)))
    complex_in = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape + (2 if complex_in else 1,)).astype(dtype)
    axis = draw(st.integers(0, rank - 1))
    inverse = int(complex_in and draw(st.booleans()))
    onesided = int(not inverse and not complex_in and draw(st.booleans()))
    length = draw(st.sampled_from([None, shape[axis], shape[axis] + 2]))
    dft_length = None if length is None else np.asarray(length, np.int64)
    if draw(st.booleans()):
        return example("DFT", [x, dft_length, np.asarray(axis, np.int64)],
                       {"inverse": inverse, "onesided": onesided}, opset=20,
                       constants=(1, 2))
    return example("DFT", [x, dft_length], {"axis": axis, "inverse": inverse,
                                            "onesided": onesided}, opset=17, constants=(1,))


@st.composite
def stft_example(draw):
    dtype = draw(st.sampled_from([F32, F64]))
    length = draw(st.integers(8, 24))
    frame = draw(st.integers(2, 8))
    step = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((draw(st.integers(1, 2)), length, 1)).astype(dtype)
    window = np.hanning(frame).astype(dtype) if draw(st.booleans()) else None
    frame_length = np.asarray(frame, np.int64)
    return example("STFT", [x, np.asarray(step, np.int64), window, frame_length],
                   {"onesided": draw(st.integers(0, 1))}, opset=17, constants=(1, 3))


@st.composite
def window_example(draw, op):
    size = np.asarray(draw(st.integers(2, 12)), np.int64)  # size 1: the reference divides 0/0
    attrs = {"periodic": draw(st.integers(0, 1)),
             "output_datatype": draw(st.sampled_from([TensorProto.FLOAT, TensorProto.DOUBLE]))}
    return example(op, [size], attrs, opset=17, constants=(0,))


@st.composite
def mel_example(draw):
    inputs = [np.asarray(draw(st.integers(1, 8)), np.int64),
              np.asarray(draw(st.sampled_from([16, 32, 64])), np.int64),
              np.asarray(draw(st.sampled_from([8000, 16000])), np.int64),
              np.asarray(draw(st.sampled_from([0.0, 50.0])), np.float32),
              np.asarray(draw(st.sampled_from([3000.0, 4000.0])), np.float32)]
    return example("MelWeightMatrix", inputs, opset=17, constants=(0, 1, 2, 3, 4))


CASES = (
    [OpCase("DFT", dft_example(), 10.0), OpCase("STFT", stft_example(), 10.0),
     OpCase("MelWeightMatrix", mel_example())]
    + [OpCase(op, window_example(op)) for op in ("HannWindow", "HammingWindow", "BlackmanWindow")]
)


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS, equal_nan=True)
