"""RNN, GRU and LSTM (ops/rnn.py) against ONNX's reference evaluator, and the
sequence_lens and clip forms the reference ignores.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.testing import run_jaxort

from ._harness import Example, OLD_REFERENCE, OpCase, table_tests
from ._strategies import arr, floats, rand

COVERED_OPS = {
    "GRU", "LSTM", "RNN",
}


def recurrent_case(op):
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]

    @st.composite
    def strat(draw):
        dt = floats(draw)
        seq, batch, inp, hid = (draw(st.integers(1, 3)) for _ in range(4))
        # onnx < 1.17's reference runs every direction forward (and raises for
        # bidirectional), mixes up batch and sequence for layout=1 and has no LSTM Y_c.
        direction = draw(st.sampled_from(["forward"] if OLD_REFERENCE
                                         else ["forward", "reverse", "bidirectional"]))
        nd = 2 if direction == "bidirectional" else 1
        layout = 0 if OLD_REFERENCE else int(draw(st.booleans()))
        x = arr(draw, dt, (batch, seq, inp) if layout else (seq, batch, inp))
        w = arr(draw, dt, (nd, gates * hid, inp))
        r = arr(draw, dt, (nd, gates * hid, hid))
        b = arr(draw, dt, (nd, 2 * gates * hid)) if draw(st.booleans()) else None
        hshape = (batch, nd, hid) if layout else (nd, batch, hid)
        h0 = arr(draw, dt, hshape) if draw(st.booleans()) else None
        # The reference ignores sequence_lens and clip: see test_recurrent_sequence_lens_and_clip.
        inputs = [x, w, r, b, None, h0]
        attrs = dict(hidden_size=hid, direction=direction, layout=layout)
        if op == "LSTM":
            inputs.append(arr(draw, dt, hshape) if draw(st.booleans()) else None)
            inputs.append(arr(draw, dt, (nd, 3 * hid)) if draw(st.booleans()) else None)
        if op == "GRU":
            attrs["linear_before_reset"] = int(draw(st.booleans()))
        return Example(tuple(inputs), attrs, 22,
                       n_out=3 if op == "LSTM" and not OLD_REFERENCE else 2)

    return strat()


CASES = [
    OpCase("RNN", recurrent_case("RNN"), scale=10),
    OpCase("GRU", recurrent_case("GRU"), scale=10),
    OpCase("LSTM", recurrent_case("LSTM"), scale=10),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- specific behaviour


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_sequence_lens(op, direction):
    """A batch row with sequence_lens L equals the op on its first L steps; Y is 0 after."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    nd = 2 if direction == "bidirectional" else 1
    seq, batch, inp, hid = 4, 2, 3, 2
    x = rand(seq, batch, inp).astype(np.float32)
    w, r = rand(nd, gates * hid, inp, seed=1), rand(nd, gates * hid, hid, seed=2)
    b = rand(nd, 2 * gates * hid, seed=3)
    w, r, b = (v.astype(np.float32) for v in (w, r, b))
    lens = np.array([2, 4], np.int32)
    attrs = dict(hidden_size=hid, direction=direction)
    n_out = 3 if op == "LSTM" else 2
    ex = Example((x, w, r, b, lens), attrs, 22, n_out=n_out)
    outs = run_jaxort(ex.node(op))
    for i, n in enumerate(lens):
        sub = Example((x[:n, i:i + 1], w, r, b), attrs, 22, n_out=n_out)
        ref = run_jaxort(sub.node(op))
        np.testing.assert_allclose(outs[0][:n, :, i:i + 1], ref[0], rtol=1e-5, atol=1e-6)
        assert np.all(outs[0][n:, :, i] == 0)
        for o, e in zip(outs[1:], ref[1:]):
            np.testing.assert_allclose(o[:, i:i + 1], e, rtol=1e-5, atol=1e-6)


def test_rnn_clip_bounds_the_activation_input():
    x = np.full((1, 1, 1), 3.0, np.float32)
    w, r = np.ones((1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32)
    ex = Example((x, w, r), dict(hidden_size=1, clip=0.5), 22, n_out=2)
    y, _ = run_jaxort(ex.node("RNN"))
    np.testing.assert_allclose(y.reshape(-1), np.tanh([0.5]), rtol=1e-6)
