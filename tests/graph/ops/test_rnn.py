"""RNN, GRU and LSTM (ops/rnn.py) against ONNX's reference evaluator, and the
sequence_lens and clip forms the reference ignores.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from jaxort.testing import run_jaxort

from ._harness import Example, ONNX_OPSET, OLD_REFERENCE, OpCase, check, table_tests
from ._strategies import arr, floats, rand

# Opset 22 (which adds bfloat16) where the installed onnx has it, else its
# newest: the float32 semantics are the same since 14 (the layout attribute).
OPSET = min(22, ONNX_OPSET)

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
        return Example(tuple(inputs), attrs, OPSET,
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
    ex = Example((x, w, r, b, lens), attrs, OPSET, n_out=n_out)
    outs = run_jaxort(ex.node(op))
    for i, n in enumerate(lens):
        sub = Example((x[:n, i:i + 1], w, r, b), attrs, OPSET, n_out=n_out)
        ref = run_jaxort(sub.node(op))
        np.testing.assert_allclose(outs[0][:n, :, i:i + 1], ref[0], rtol=1e-5, atol=1e-6)
        assert np.all(outs[0][n:, :, i] == 0)
        for o, e in zip(outs[1:], ref[1:]):
            np.testing.assert_allclose(o[:, i:i + 1], e, rtol=1e-5, atol=1e-6)


def test_rnn_clip_bounds_the_activation_input():
    x = np.full((1, 1, 1), 3.0, np.float32)
    w, r = np.ones((1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32)
    ex = Example((x, w, r), dict(hidden_size=1, clip=0.5), OPSET, n_out=2)
    y, _ = run_jaxort(ex.node("RNN"))
    np.testing.assert_allclose(y.reshape(-1), np.tanh([0.5]), rtol=1e-6)


# --------------------------------------------------------------------------- unrolled forward passes


def _recurrent_inputs(op, seq, batch=2, inp=3, hid=4, nd=1):
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    x = rand(seq, batch, inp)
    w, r = rand(nd, gates * hid, inp, seed=1) * .5, rand(nd, gates * hid, hid, seed=2) * .5
    b = rand(nd, 2 * gates * hid, seed=3) * .3
    return [v.astype(np.float32) for v in (x, w, r, b)]


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_short_recurrences_match_the_reference_unrolled(op):
    """Up to _UNROLL_STEPS steps the forward pass is unrolled: same outputs as ONNX's reference."""
    from jaxort.graph.ops import rnn

    for seq in (2, 12, rnn._UNROLL_STEPS, rnn._UNROLL_STEPS + 1):
        attrs = dict(hidden_size=4, direction="bidirectional" if not OLD_REFERENCE else "forward")
        if op == "GRU":
            attrs["linear_before_reset"] = 1
        ex = Example(tuple(_recurrent_inputs(op, seq, nd=2 if not OLD_REFERENCE else 1)), attrs, OPSET,
                     n_out=2)
        check(ex.node(op), scale=10)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_short_recurrences_run_unrolled_and_differentiate_as_loops(op):
    """Not differentiated, up to _UNROLL_STEPS steps compile without a loop; differentiated, as one
    loop forward and one backward (the unrolled backward pass is the slow one)."""
    import jax
    import jax.numpy as jnp

    from jaxort.graph.ops import rnn

    fn = {"RNN": rnn.rnn, "GRU": rnn.gru, "LSTM": rnn.lstm}[op]
    extra = {"LSTM": dict(input_forget=0), "GRU": dict(linear_before_reset=1)}.get(op, {})

    def loops(f, *args):
        return jax.jit(f).lower(*args).as_text().count("stablehlo.while")

    for seq, forward_loops in ((8, 0), (rnn._UNROLL_STEPS, 0), (rnn._UNROLL_STEPS + 1, 1)):
        x, w, r, b = (jnp.asarray(v) for v in _recurrent_inputs(op, seq))

        def loss(w):
            y = fn(x, w, r, b, activation_alpha=None, activation_beta=None, activations=None,
                   clip=None, direction="forward", hidden_size=4, **extra)[0]
            return jnp.sum(y * y)

        assert loops(loss, w) == forward_loops, seq
        assert loops(jax.grad(loss), w) == 2, seq


def test_unrolled_lstm_derivatives_to_second_order_match_finite_differences():
    """The unrolled forward's derivative rule: forward and reverse, to second order (float64),
    with sequence lengths; and vmap of the gradient over weights equals one gradient each."""
    import jax
    from jax.test_util import check_grads

    from jaxort.graph import x64_enabled_scope
    from jaxort.graph.ops import rnn

    with x64_enabled_scope():
        x, w, r, b = (np.asarray(v, np.float64) for v in _recurrent_inputs("LSTM", 5))
        lens = np.array([3, 5], np.int32)

        def loss(x, w, r):
            y, h, c = rnn.lstm(x, w, r, b, lens, activation_alpha=None, activation_beta=None,
                               activations=None, clip=None, direction="forward", hidden_size=4,
                               input_forget=0)
            return (y ** 2).sum() + (h * c).sum()

        check_grads(loss, (x, w, r), order=2, modes=["fwd", "rev"], eps=1e-4, atol=1e-6, rtol=1e-5)
        ws = np.stack([w, 1.5 * w])
        batched = jax.vmap(jax.grad(loss, argnums=1), in_axes=(None, 0, None))(x, ws, r)
        for k in range(2):
            np.testing.assert_allclose(batched[k], jax.grad(loss, argnums=1)(x, ws[k], r), rtol=1e-12)
