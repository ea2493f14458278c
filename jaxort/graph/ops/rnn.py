"""Recurrent ops: RNN, GRU, LSTM (one lax.scan per direction)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxort.errors import OpError
from jaxort.graph import register
from jaxort.graph.ops._common import leaky_relu, relu

# activation name -> (function of (x, alpha, beta), how many of alpha/beta it consumes, defaults)
_ACTIVATIONS = {
    "relu": (lambda x, a, b: relu(x), 0, ()),
    "tanh": (lambda x, a, b: jnp.tanh(x), 0, ()),
    "sigmoid": (lambda x, a, b: jax.nn.sigmoid(x), 0, ()),
    "affine": (lambda x, a, b: a * x + b, 2, (1.0, 0.0)),
    "leakyrelu": (lambda x, a, b: leaky_relu(x, a), 1, (0.01,)),
    "thresholdedrelu": (lambda x, a, b: jnp.where(x > a, x, 0), 1, (1.0,)),
    "scaledtanh": (lambda x, a, b: a * jnp.tanh(b * x), 2, (1.0, 1.0)),
    "hardsigmoid": (lambda x, a, b: jnp.clip(a * x + b, 0, 1), 2, (0.2, 0.5)),
    "elu": (lambda x, a, b: jnp.where(x >= 0, x, a * (jnp.exp(x) - 1)), 1, (1.0,)),
    "softsign": (lambda x, a, b: x / (1 + jnp.abs(x)), 0, ()),
    "softplus": (lambda x, a, b: jax.nn.softplus(x), 0, ()),
}


def activations_per_direction(names, alphas, betas, defaults, num_directions):
    """Per direction, the list of unary activation functions (ONNX's names, alphas and betas)."""
    names = list(names) if names else list(defaults) * num_directions
    alphas = list(alphas or [])
    betas = list(betas or [])
    fns = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise OpError(f"unsupported activation {name!r}")
        fn, n_params, dflt = _ACTIVATIONS[key]
        a = alphas.pop(0) if n_params >= 1 and alphas else (dflt[0] if n_params >= 1 else None)
        b = betas.pop(0) if n_params >= 2 and betas else (dflt[1] if n_params >= 2 else None)
        fns.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b).astype(x.dtype))
    per = len(defaults)
    if len(fns) == per and num_directions == 2:
        fns = fns * 2
    return [fns[i * per:(i + 1) * per] for i in range(num_directions)]


def prepare_sequences(x, initial_states, sequence_lens, layout, direction, hidden_size):
    """``x`` as (seq, batch, input), initial states (zeros when absent), the sequence mask, directions."""
    if layout:
        x = jnp.swapaxes(x, 0, 1)  # -> (seq, batch, input)
        initial_states = [None if s is None else jnp.swapaxes(s, 0, 1) for s in initial_states]
    num_dir = 2 if direction == "bidirectional" else 1
    seq, batch = x.shape[:2]
    states = [jnp.zeros((num_dir, batch, hidden_size), x.dtype) if s is None else s
              for s in initial_states]
    if sequence_lens is None:
        mask = None
    else:
        lens = jnp.asarray(sequence_lens).astype(jnp.int32).reshape(1, -1)
        mask = jnp.arange(seq, dtype=jnp.int32)[:, None] < lens  # (seq, batch)
    return x, states, mask, num_dir


# Recurrences of at most this many steps run unrolled when they are not
# differentiated (eval steps, inference): see _unrolled.
_UNROLL_STEPS = 32


def _run_direction(step, params, x, states, mask, reverse):
    """Runs ``step(params, carry, x_t) -> (carry, outputs_t)`` over time; masked steps keep the carry.

    ``outputs_t`` is an array or a tuple of arrays, each stacked over time on
    its own (with zeros at masked steps): a tuple rather than one
    concatenation, so that JAX drops the outputs nobody reads from the scan
    (ORT's LSTMTraining returns every gate, which only ORT's own gradient
    ops read) and the backward pass carries no cotangents for them.
    ``params`` holds the arrays ``step`` reads besides the carry and the
    input (weights, biases), so that ``step`` closes over none.
    """
    if 1 < x.shape[0] <= _UNROLL_STEPS:
        return _unrolled(step, reverse, params, x, tuple(states), mask)
    return _scan(step, reverse, 1, params, x, tuple(states), mask)


def _scan(step, reverse, unroll, params, x, states, mask):
    ts = jnp.arange(x.shape[0], dtype=jnp.int32)

    def body(carry, inp):
        xt, t = inp
        new, h = step(params, carry, xt)
        if mask is not None:
            m = mask[t][:, None]
            new = tuple(jnp.where(m, n, c) for n, c in zip(new, carry))
            h = jax.tree_util.tree_map(lambda v: jnp.where(m, v, jnp.zeros((), v.dtype)), h)
        return new, h

    return lax.scan(body, states, (x, ts), reverse=reverse, unroll=unroll)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _unrolled(step, reverse, params, x, states, mask):
    """:func:`_scan` fully unrolled, and differentiated as the rolled scan.

    Unrolled, a short recurrence's forward pass runs much faster on CPU (no
    loop, no per-step slicing of the inputs and outputs, fusion across
    steps): an eval step of W8 (an LSTM 64 -> 128 over 32 steps, batch 16)
    2.32 -> 1.50 ms, of W9 (the GRU) 2.34 -> 1.20 ms, one core; unrolling
    by 4 or 8 steps gains nothing, by 16 a quarter. Its derivatives are
    another matter: differentiated, the unrolled recurrence's backward pass is
    several times slower (XLA fuses the per-step gradients of the stacked
    outputs into large pad-and-add loops), so the derivative rule below
    differentiates the rolled scan: training is unchanged. The cost is
    compile time, which grows with the steps (W8's first eval step 0.3 -> 1.8 s),
    hence the bound _UNROLL_STEPS.
    """
    return _scan(step, reverse, True, params, x, states, mask)


@_unrolled.defjvp
def _unrolled_jvp(step, reverse, primals, tangents):
    return jax.jvp(functools.partial(_scan, step, reverse, 1), primals, tangents)


def _layout(layout, y, *finals):
    """(Y, Y_h, ...) in ONNX's layout: batch first when ``layout`` is 1."""
    if layout:
        y = jnp.transpose(y, (2, 0, 1, 3))
        finals = tuple(jnp.swapaxes(f, 0, 1) for f in finals)
    return (y, *finals)


def _peephole(gate, p, k, hs, c):
    """``gate + p[k * hs:(k + 1) * hs] * c``: LSTM's peephole term, none when ``p`` is absent."""
    return gate if p is None else gate + p[k * hs:(k + 1) * hs] * c


def _clip(v, clip):
    return v if clip is None else jnp.clip(v, -clip, clip)


def _directions(direction, num_dir):
    if direction == "reverse":
        return [True]
    return [False, True][:num_dir]


@register("RNN", since=1)
def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha,
        activation_beta, activations, clip, direction, hidden_size, layout=None,
        output_sequence=None):
    """RNN-1+ (layout from 14)."""
    x, (h0,), mask, num_dir = prepare_sequences(x, [initial_h], sequence_lens, layout, direction,
                                       hidden_size)
    acts = activations_per_direction(activations, activation_alpha, activation_beta, ["Tanh"], num_dir)
    ys, finals = [], []
    for d, reverse in enumerate(_directions(direction, num_dir)):
        wb = 0 if b is None else b[d, :hidden_size] + b[d, hidden_size:]
        xw = jnp.matmul(x, w[d].T) + wb
        f = acts[d][0]

        def step(rd, carry, xt, f=f):
            (h,) = carry
            h = f(_clip(xt + h @ rd.T, clip))
            return (h,), h

        carry, y = _run_direction(step, r[d], xw, [h0[d]], mask, reverse)
        ys.append(y)
        finals.append(carry)
    return _layout(layout, jnp.stack(ys, axis=1), jnp.stack([f[0] for f in finals]))


def gru_scan(x, w, r, b, h0, mask, acts, *, clip, direction, hidden_size, linear_before_reset,
             with_gates=False):
    """The GRU recurrence over a (seq, batch, input) ``x``, every direction.

    Returns ``(h_all, h_last, gates)``: [seq, num_directions, batch, hidden], [num_directions,
    batch, hidden], and with ``with_gates`` the activated gates z, r and the candidate h as
    [seq, num_directions, batch, 3 * hidden] (what ORT's GRUTraining returns), else None.
    """
    hs = hidden_size
    h_all, h_last, gates_all = [], [], []
    for d, reverse in enumerate(_directions(direction, len(acts))):
        wb = jnp.zeros((3 * hs,), x.dtype) if b is None else b[d, :3 * hs]
        rb = jnp.zeros((3 * hs,), x.dtype) if b is None else b[d, 3 * hs:]
        xw = jnp.matmul(x, w[d].T) + wb
        rd = r[d]
        f, g = acts[d]

        def step(params, carry, xt, f=f, g=g):
            rd, rb = params
            (h,) = carry
            xz, xr, xh = jnp.split(xt, 3, axis=-1)
            # One product for h's projections: all three with linear_before_reset,
            # else z's and r's (the candidate's reads r * h).
            if linear_before_reset:
                hz, hr, hh = jnp.split(h @ rd.T, 3, axis=-1)
            else:
                hz, hr = jnp.split(h @ rd[:2 * hs].T, 2, axis=-1)
            z = f(_clip(xz + hz + rb[:hs], clip))
            rt = f(_clip(xr + hr + rb[hs:2 * hs], clip))
            if linear_before_reset:
                hh = g(_clip(xh + rt * (hh + rb[2 * hs:]), clip))
            else:
                hh = g(_clip(xh + (rt * h) @ rd[2 * hs:].T + rb[2 * hs:], clip))
            h = (1 - z) * hh + z * h
            return (h,), ((h, z, rt, hh) if with_gates else h)

        (h,), ys = _run_direction(step, (rd, rb), xw, [h0[d]], mask, reverse)
        h_all.append(ys[0] if with_gates else ys)
        if with_gates:
            gates_all.append(jnp.concatenate(ys[1:], axis=-1))
        h_last.append(h)
    gates = jnp.stack(gates_all, axis=1) if with_gates else None
    return jnp.stack(h_all, axis=1), jnp.stack(h_last), gates


@register("GRU", since=1)
def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha, activation_beta,
        activations, clip, direction, hidden_size, layout=None, linear_before_reset=None,
        output_sequence=None):
    """GRU-1+ (linear_before_reset from 3, layout from 14)."""
    x, (h0,), mask, num_dir = prepare_sequences(x, [initial_h], sequence_lens, layout, direction,
                                       hidden_size)
    acts = activations_per_direction(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"],
                        num_dir)
    y, h, _ = gru_scan(x, w, r, b, h0, mask, acts, clip=clip, direction=direction,
                       hidden_size=hidden_size, linear_before_reset=linear_before_reset)
    return _layout(layout, y, h)


def lstm_scan(x, w, r, b, p, h0, c0, mask, acts, *, clip, direction, hidden_size, input_forget,
              with_gates=False):
    """The LSTM recurrence over a (seq, batch, input) ``x``, every direction.

    Returns ``(h_all, h_last, c_last, c_all, gates)``: [seq, num_directions, batch, hidden],
    [num_directions, batch, hidden] twice, and with ``with_gates`` the cell states and the
    activated gates i, o, f, c as [seq, num_directions, batch, hidden] and [..., 4 * hidden]
    (what ORT's LSTMTraining returns), else None and None.
    """
    hs = hidden_size
    h_all, h_last, c_last, c_all, gates_all = [], [], [], [], []
    for d, reverse in enumerate(_directions(direction, len(acts))):
        bias = 0 if b is None else b[d, :4 * hs] + b[d, 4 * hs:]
        xw = jnp.matmul(x, w[d].T) + bias
        rd = r[d]
        pd = None if p is None else p[d]
        f, g, hact = acts[d]

        def step(params, carry, xt, f=f, g=g, hact=hact):
            rd, pd = params
            h, c = carry
            gates = xt + h @ rd.T
            gi, go, gf, gc = jnp.split(gates, 4, axis=-1)
            i = f(_clip(_peephole(gi, pd, 0, hs, c), clip))
            if input_forget:
                fg = 1 - i
            else:
                fg = f(_clip(_peephole(gf, pd, 2, hs, c), clip))
            cc = g(_clip(gc, clip))
            c = fg * c + i * cc
            o = f(_clip(_peephole(go, pd, 1, hs, c), clip))
            h = o * hact(c)
            return (h, c), ((h, c, i, o, fg, cc) if with_gates else h)

        (h, c), ys = _run_direction(step, (rd, pd), xw, [h0[d], c0[d]], mask, reverse)
        h_all.append(ys[0] if with_gates else ys)
        if with_gates:
            c_all.append(ys[1])
            gates_all.append(jnp.concatenate(ys[2:], axis=-1))
        h_last.append(h)
        c_last.append(c)
    if not with_gates:
        return jnp.stack(h_all, axis=1), jnp.stack(h_last), jnp.stack(c_last), None, None
    return (jnp.stack(h_all, axis=1), jnp.stack(h_last), jnp.stack(c_last),
            jnp.stack(c_all, axis=1), jnp.stack(gates_all, axis=1))


@register("LSTM", since=1)
def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
         activation_alpha, activation_beta, activations, clip, direction, hidden_size,
         input_forget, layout=None, output_sequence=None):
    """LSTM-1+ (layout from 14; input_forget couples f = 1 - i)."""
    x, (h0, c0), mask, num_dir = prepare_sequences(x, [initial_h, initial_c], sequence_lens, layout,
                                          direction, hidden_size)
    acts = activations_per_direction(activations, activation_alpha, activation_beta,
                        ["Sigmoid", "Tanh", "Tanh"], num_dir)
    y, h, c, _, _ = lstm_scan(x, w, r, b, p, h0, c0, mask, acts, clip=clip, direction=direction,
                              hidden_size=hidden_size, input_forget=input_forget)
    return _layout(layout, y, h, c)
