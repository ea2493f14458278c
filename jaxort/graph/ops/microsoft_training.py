"""ONNX Runtime Training ops (com.microsoft, and SparseSoftmaxCrossEntropy of ai.onnx).

ONNX Runtime Training 1.19.2 writes these into training graphs: its pre-training
rewrites turn Concat, LSTM and GRU into ConcatTraining, LSTMTraining and
GRUTraining (extra outputs for their gradient builders), and its gradient
builders and older loss exporters use the others. docs/ort-training-ops.md says
which rewrite emits which op, and when.

ONNX does not ship these schemas, so each function gives the schema's attribute
defaults in its signature (from orttraining/core/graph/training_op_defs.cc of
ONNX Runtime 1.19.2) instead of the dispatcher filling them in. The handlers
reuse the standard ops' implementations; this module must not import the
training layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static_ints
from jaxort.graph.ops._common import at_least_float32, channel_shape
from jaxort.graph.ops.conv import conv
from jaxort.graph.ops.dropout import dropout
from jaxort.graph.ops.layout import concat_values, slice_index, split_values
from jaxort.graph.ops.loss import negative_log_likelihood_loss, softmax_cross_entropy_loss
from jaxort.graph.ops.reduce import reduce_sum
from jaxort.graph.ops.rnn import activations_per_direction, gru_scan, lstm_scan, prepare_sequences

MS = "com.microsoft"

# ---- ConcatTraining, SplitTraining, ReduceSumTraining ----


@register("ConcatTraining", since=1, domain=MS)
def concat_training(*inputs, axis):
    """com.microsoft::ConcatTraining-1: Concat plus each input's length along the axis (int64)."""
    present = [x for x in inputs if x is not None]
    if not present:
        raise OpError("ConcatTraining needs at least one input")
    a = axis + present[0].ndim if axis < 0 else axis
    lengths = np.array([x.shape[a] for x in present], dtype=np.int64)
    return concat_values(present, axis), lengths


@register("SplitTraining", since=1, domain=MS)
def split_training(input, split=None, *, axis=0, ctx):
    """com.microsoft::SplitTraining-1 (axis default 0; an empty split splits evenly)."""
    sizes = None if split is None else static_ints(split, "input 'split'")
    n = len(ctx.output_names)
    if not sizes:
        dim = input.shape[axis]
        if dim % n:
            # ORT's kernel refuses it (its shape inference would give the first outputs one more).
            raise OpError(f"an empty split cannot split dimension {dim} evenly into {n} outputs")
        sizes = [dim // n] * n
    return split_values(input, axis, sizes, n)


@register("ReduceSumTraining", since=1, domain=MS)
def reduce_sum_training(data, axes, *, keepdims=1, noop_with_empty_axes=0):
    """com.microsoft::ReduceSumTraining-1: ReduceSum-13 (axes input), schema defaults keepdims=1, noop=0."""
    return reduce_sum(data, axes, keepdims=keepdims, noop_with_empty_axes=noop_with_empty_axes)


# ---- LSTMTraining and GRUTraining ----


def _no_sequence_lens(sequence_lens, op):
    # ORT's kernels refuse them ("Varying sequence lengths is not supported yet").
    if sequence_lens is not None:
        raise OpError(f"{op} does not take sequence_lens (ONNX Runtime 1.19.2 refuses them too)")


@register("LSTMTraining", since=1, domain=MS)
def lstm_training(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
                  activation_alpha=None, activation_beta=None, activations=None, clip=None,
                  direction="forward", hidden_size, input_forget=0):
    """com.microsoft::LSTMTraining-1: LSTM (no layout) -> HAll, Ht, Ct, CAll and the iofc gates.

    The gates are stored after their activations, in ONNX's order (i, o, f, c), as
    ORT's LSTMGrad reads them: [seq, num_directions, batch, 4 * hidden_size].
    """
    _no_sequence_lens(sequence_lens, "LSTMTraining")
    x, (h0, c0), _, num_dir = prepare_sequences(x, [initial_h, initial_c], None, 0, direction,
                                                hidden_size)
    acts = activations_per_direction(activations, activation_alpha, activation_beta,
                                     ["Sigmoid", "Tanh", "Tanh"], num_dir)
    return lstm_scan(x, w, r, b, p, h0, c0, None, acts, clip=clip, direction=direction,
                     hidden_size=hidden_size, input_forget=input_forget, with_gates=True)


@register("GRUTraining", since=1, domain=MS)
def gru_training(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
                 activation_beta=None, activations=None, clip=None, direction="forward",
                 hidden_size, linear_before_reset=0):
    """com.microsoft::GRUTraining-1: GRU (no layout) -> HAll, Ht and the zrh gates.

    The gates are stored after their activations (z, r, then the candidate h), as
    ORT's GRUGrad reads them: [seq, num_directions, batch, 3 * hidden_size].
    """
    _no_sequence_lens(sequence_lens, "GRUTraining")
    x, (h0,), _, num_dir = prepare_sequences(x, [initial_h], None, 0, direction, hidden_size)
    acts = activations_per_direction(activations, activation_alpha, activation_beta,
                                     ["Sigmoid", "Tanh"], num_dir)
    return gru_scan(x, w, r, b, h0, None, acts, clip=clip, direction=direction,
                    hidden_size=hidden_size, linear_before_reset=linear_before_reset,
                    with_gates=True)


# ---- LSTMGrad and GRUGrad: back-propagation through time from the saved values ----


def _forward_rnn_only(op, direction, activations, clip):
    # ORT's kernels run only this form (and refuse the others at session creation).
    names = [a.decode() if isinstance(a, bytes) else a for a in (activations or [])]
    default = ["sigmoid", "tanh", "tanh"] if op == "LSTMGrad" else ["sigmoid", "tanh"]
    if direction != "forward" or (names and [a.lower() for a in names] != default) or clip is not None:
        raise OpError(f"{op} runs only the forward direction with the default activations and no clip "
                      f"(as ONNX Runtime 1.19.2's kernel); got direction={direction!r}, activations={names}, "
                      f"clip={clip}")


@register("LSTMGrad", since=1, domain=MS)
def lstm_grad(x, w, r, sequence_lens=None, initial_h=None, initial_c=None, all_hidden=None, all_cell=None,
              iofc=None, grad_all_hidden=None, grad_final_h=None, grad_final_c=None, *, activation_alpha=None,
              activation_beta=None, activations=None, clip=None, direction="forward", hidden_size,
              input_forget=0):
    """com.microsoft::LSTMGrad-1: the gradients of LSTMTraining from its saved states and gates.

    -> dX, dW, dR, dB, dH0, dC0, dP. Like ORT's kernel it is not given the peephole
    weights, so it differentiates an LSTM without them (dP is the gradient at P = 0;
    ONNX Runtime 1.19.2's own results with peepholes are wrong, see docs/migration.md).
    """
    _forward_rnn_only("LSTMGrad", direction, activations, clip)
    _no_sequence_lens(sequence_lens, "LSTMGrad")
    if input_forget:
        raise OpError("LSTMGrad does not take input_forget=1 (ONNX Runtime 1.19.2 refuses it too)")
    if all_hidden is None or all_cell is None or iofc is None:
        raise OpError("LSTMGrad needs the all-hidden states, all-cell states and iofc gates of LSTMTraining")
    hs = hidden_size
    zeros = jnp.zeros((x.shape[1], hs), x.dtype)
    h0 = zeros if initial_h is None else initial_h[0]
    c0 = zeros if initial_c is None else initial_c[0]
    hall, call, gates = all_hidden[:, 0], all_cell[:, 0], iofc[:, 0]
    h_prev = jnp.concatenate([h0[None], hall[:-1]])
    c_prev = jnp.concatenate([c0[None], call[:-1]])
    dh_all = jnp.zeros_like(hall) if grad_all_hidden is None else jnp.asarray(grad_all_hidden)[:, 0]
    dh_last = zeros if grad_final_h is None else grad_final_h[0]
    dc_last = zeros if grad_final_c is None else grad_final_c[0]
    rd = r[0]

    def step(carry, t):
        dh_next, dc_next = carry
        dh_own, c, cp, g = t
        dh = dh_own + dh_next  # the step's own gradient and the one through the recurrence
        i, o, f, cc = (g[:, k * hs:(k + 1) * hs] for k in range(4))
        tc = jnp.tanh(c)
        dc = dc_next + dh * o * (1 - tc * tc)
        da = jnp.concatenate([dc * cc * i * (1 - i), dh * tc * o * (1 - o), dc * cp * f * (1 - f),
                              dc * i * (1 - cc * cc)], axis=-1)
        return (da @ rd, dc * f), da

    dh_all = dh_all.at[-1].add(dh_last)
    (dh0, dc0), da = jax.lax.scan(step, (zeros, dc_last), (dh_all, call, c_prev, gates), reverse=True)
    dx = da @ w[0]
    dw = jnp.einsum("sbg,sbi->gi", da, x)[None]
    dr = jnp.einsum("sbg,sbh->gh", da, h_prev)[None]
    db = jnp.sum(da, axis=(0, 1))
    dp = jnp.concatenate([jnp.sum(da[..., :hs] * c_prev, axis=(0, 1)), jnp.sum(da[..., hs:2 * hs] * call, axis=(0, 1)),
                          jnp.sum(da[..., 2 * hs:3 * hs] * c_prev, axis=(0, 1))])
    return dx, dw, dr, jnp.concatenate([db, db])[None], dh0[None], dc0[None], dp[None]


@register("GRUGrad", since=1, domain=MS)
def gru_grad(x, w, r, b=None, sequence_lens=None, initial_h=None, all_hidden=None, zrh=None,
             grad_all_hidden=None, grad_final_h=None, *, activation_alpha=None, activation_beta=None,
             activations=None, clip=None, direction="forward", hidden_size, linear_before_reset=0):
    """com.microsoft::GRUGrad-1: the gradients of GRUTraining from its saved states and gates.

    -> dX, dW, dR, dB, dH0.
    """
    _forward_rnn_only("GRUGrad", direction, activations, clip)
    _no_sequence_lens(sequence_lens, "GRUGrad")
    if all_hidden is None or zrh is None:
        raise OpError("GRUGrad needs the all-hidden states and zrh gates of GRUTraining")
    hs = hidden_size
    zeros = jnp.zeros((x.shape[1], hs), x.dtype)
    h0 = zeros if initial_h is None else initial_h[0]
    hall, gates = all_hidden[:, 0], zrh[:, 0]
    h_prev = jnp.concatenate([h0[None], hall[:-1]])
    dh_all = jnp.zeros_like(hall) if grad_all_hidden is None else jnp.asarray(grad_all_hidden)[:, 0]
    dh_all = dh_all.at[-1].add(zeros if grad_final_h is None else grad_final_h[0])
    rd = r[0]
    rz_r, rh = rd[:2 * hs], rd[2 * hs:]
    rbh = jnp.zeros((hs,), x.dtype) if b is None else b[0, 5 * hs:]

    def step(dh_next, t):
        dh_own, hp, g = t
        dh = dh_own + dh_next
        z, rt, hh = g[:, :hs], g[:, hs:2 * hs], g[:, 2 * hs:]
        dah = dh * (1 - z) * (1 - hh * hh)
        daz = dh * (hp - hh) * z * (1 - z)
        dhp = dh * z
        if linear_before_reset:
            q = hp @ rh.T + rbh
            dq = dah * rt
            dr_gate = dah * q
            dhp = dhp + dq @ rh
            dq_rec = dq
        else:
            ds = dah @ rh
            dr_gate = ds * hp
            dhp = dhp + ds * rt
            dq_rec = dah
        dar = dr_gate * rt * (1 - rt)
        dzr = jnp.concatenate([daz, dar], axis=-1)
        return dhp + dzr @ rz_r, (jnp.concatenate([dzr, dah], axis=-1), dq_rec)

    dh0, (da, dq) = jax.lax.scan(step, zeros, (dh_all, h_prev, gates), reverse=True)
    dx = da @ w[0]
    dw = jnp.einsum("sbg,sbi->gi", da, x)[None]
    if linear_before_reset:
        dr_h = jnp.einsum("sbg,sbh->gh", dq, h_prev)
    else:
        rts = gates[..., hs:2 * hs]
        dr_h = jnp.einsum("sbg,sbh->gh", dq, rts * h_prev)
    dr = jnp.concatenate([jnp.einsum("sbg,sbh->gh", da[..., :2 * hs], h_prev), dr_h])[None]
    dwb = jnp.sum(da, axis=(0, 1))
    drb = jnp.concatenate([dwb[:2 * hs], jnp.sum(dq, axis=(0, 1))])
    return dx, dw, dr, jnp.concatenate([dwb, drb])[None], dh0[None]


# ---- the Dropout family ----

_BITS = 32  # ORT packs dropout masks into uint32 words (kNumBitsPerBitmaskElement)


def pack_bitmask(mask):
    """Packs a boolean mask as ORT's BitmaskDropout does: element i is bit i % 32 of word i // 32.

    Bits past the last element are 0.
    """
    flat = jnp.ravel(mask)
    n = flat.shape[0]
    words = -(-n // _BITS)
    bits = jnp.pad(flat.astype(jnp.uint32), (0, words * _BITS - n)).reshape(words, _BITS)
    shifts = jnp.arange(_BITS, dtype=jnp.uint32)
    return jnp.sum(bits << shifts, axis=1, dtype=jnp.uint32)


def _is_inference(ratio, training_mode, ctx) -> bool:
    """True when the dropout is the identity whatever the random stream (a static decision)."""
    if training_mode is None or not (ctx.training or ctx.has_rng):
        return True
    static_false = isinstance(training_mode, (np.ndarray, np.generic, bool)) and \
        not bool(np.asarray(training_mode))
    static_zero = isinstance(ratio, (np.ndarray, np.generic, float)) and \
        float(np.asarray(ratio)) == 0.0
    return static_false or static_zero


def _bitmask(data, ratio, training_mode, ctx):
    out, mask = dropout(data, ratio, training_mode, ctx=ctx)
    if _is_inference(ratio, training_mode, ctx):
        # ORT's inference branch sets every bit of every word, padding included.
        words = -(-int(np.prod(data.shape, dtype=np.int64)) // _BITS)
        return out, jnp.full((words,), 0xFFFFFFFF, jnp.uint32)
    packed = pack_bitmask(mask)
    if not isinstance(training_mode, (np.ndarray, np.generic, bool)):
        # A traced training_mode: false means ORT's inference branch.
        flag = jnp.asarray(training_mode).astype(jnp.bool_)
        packed = jnp.where(flag, packed, jnp.uint32(0xFFFFFFFF))
    return out, packed


def _biased(data, bias, residual):
    return data + bias, (lambda y: y if residual is None else y + residual)


@register("BitmaskDropout", since=1, domain=MS, foldable=False)
def bitmask_dropout(data, ratio=None, training_mode=None, *, seed=None, ctx):
    """com.microsoft::BitmaskDropout-1: Dropout-12 with the mask packed in uint32 words; seed ignored."""
    return _bitmask(data, ratio, training_mode, ctx)


@register("BiasDropout", since=1, domain=MS, foldable=False)
def bias_dropout(data, bias, residual=None, ratio=None, training_mode=None, *, seed=None, ctx):
    """com.microsoft::BiasDropout-1: Dropout(data + bias) + residual, boolean mask; seed ignored."""
    x, add_residual = _biased(data, bias, residual)
    out, mask = dropout(x, ratio, training_mode, ctx=ctx)
    return add_residual(out), mask


@register("BitmaskBiasDropout", since=1, domain=MS, foldable=False)
def bitmask_bias_dropout(data, bias, residual=None, ratio=None, training_mode=None, *, seed=None,
                         ctx):
    """com.microsoft::BitmaskBiasDropout-1: BiasDropout with the packed uint32 mask; seed ignored."""
    x, add_residual = _biased(data, bias, residual)
    out, mask = _bitmask(x, ratio, training_mode, ctx)
    return add_residual(out), mask


# ---- losses ----


def _ignore_index(ignore_index):
    """The ignore_index input (an int64 scalar) as the attribute value the standard ops take."""
    if ignore_index is None:
        return None
    if isinstance(ignore_index, (np.ndarray, np.generic, int)):
        return int(np.asarray(ignore_index).reshape(()))
    return jnp.reshape(ignore_index, ())


@register("SoftmaxCrossEntropyLossInternal", since=1, domain=MS)
def softmax_cross_entropy_loss_internal(scores, labels, weights=None, ignore_index=None, *,
                                        reduction="mean", output_type=None):
    """com.microsoft::SoftmaxCrossEntropyLoss with ignore_index as an input; output_type casts the loss."""
    loss, log_prob = softmax_cross_entropy_loss(scores, labels, weights, reduction=reduction,
                                                ignore_index=_ignore_index(ignore_index))
    if output_type is not None:
        from jaxort.dtypes import to_numpy_dtype

        loss = loss.astype(to_numpy_dtype(output_type))
    return loss, log_prob


@register("NegativeLogLikelihoodLossInternal", since=1, domain=MS)
def negative_log_likelihood_loss_internal(input, target, weight=None, ignore_index=None, *,
                                          reduction="mean"):
    """com.microsoft::NegativeLogLikelihoodLoss with ignore_index as an input."""
    return negative_log_likelihood_loss(input, target, weight, reduction=reduction,
                                        ignore_index=_ignore_index(ignore_index))


def _reduce_loss(per_sample, reduction, denominator):
    if reduction == "none":
        return per_sample
    if reduction == "sum":
        return jnp.sum(per_sample)
    if reduction == "mean":
        return jnp.sum(per_sample) / denominator
    raise OpError(f"unknown reduction {reduction!r}")


@register("SoftmaxCrossEntropy", since=1, domain=MS)
def softmax_cross_entropy(logits, label, *, reduction="mean"):
    """com.microsoft::SoftmaxCrossEntropy-1: soft labels, classes last; "none" is per sample.

    ORT 1.19.2's CPU kernel returns minus the summed loss for "none"; jaxort follows the schema.
    """
    dtype = np.dtype(logits.dtype)
    x = logits.astype(at_least_float32(dtype))
    log_prob = jax.nn.log_softmax(x, axis=-1)
    per_sample = -jnp.sum(label.astype(x.dtype) * log_prob, axis=-1)
    loss = _reduce_loss(per_sample, reduction, jnp.asarray(per_sample.size, x.dtype))
    return loss.astype(dtype), log_prob.astype(dtype)


@register("SparseSoftmaxCrossEntropy", since=9)
def sparse_softmax_cross_entropy(logits, label, weight=None, *, reduction="mean"):
    """SparseSoftmaxCrossEntropy-9 (ORT's, in the ai.onnx domain): classes on the last axis.

    With weights, "mean" divides by the sum of the weights, as ORT's kernel does. For
    "none" ORT 1.19.2's CPU kernel returns the summed loss; jaxort gives the per-sample
    loss the schema describes.
    """
    dtype = np.dtype(logits.dtype)
    x = logits.astype(at_least_float32(dtype))
    log_prob = jax.nn.log_softmax(x, axis=-1)
    if tuple(label.shape) != tuple(x.shape[:-1]):
        raise OpError(f"label shape {list(label.shape)} does not match logits shape "
                      f"{list(x.shape)} (expected {list(x.shape[:-1])})")
    picked = jnp.take_along_axis(log_prob, jnp.expand_dims(label.astype(jnp.int32), -1), axis=-1)
    per_sample = -jnp.squeeze(picked, -1)
    if weight is None:
        denominator = jnp.asarray(per_sample.size, x.dtype)
    else:
        w = weight.astype(x.dtype)
        per_sample = per_sample * w
        denominator = jnp.sum(w)
    loss = _reduce_loss(per_sample, reduction, denominator)
    return loss.astype(dtype), log_prob.astype(dtype)


# ---- the gradient ops of ORT's gradient builder that generate_artifacts also writes ----
#
# jaxort differentiates forward graphs with jax.grad and never needs these to train; it
# writes them into the training models it makes for ONNX Runtime (where ORT's gradient
# builder writes them, so that ORT computes bit for bit what it computes on its own
# artifacts), and runs them so those graphs can be checked anywhere.


@register("ConvGrad", since=1, domain=MS)
def conv_grad(dy, x, w, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
              strides=None):
    """com.microsoft::ConvGrad-1: (dY, X, W) -> dX, dW, dB of a Conv with these attributes."""
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                 strides=strides)
    y, vjp = jax.vjp(lambda x, w: conv(x, w, **attrs), x, w)
    if tuple(y.shape) != tuple(dy.shape):
        raise OpError(f"dY has shape {list(dy.shape)}, the Conv's output {list(y.shape)}")
    dx, dw = vjp(dy.astype(y.dtype))
    return dx, dw, jnp.sum(dy, axis=(0,) + tuple(range(2, dy.ndim)))


@register("BatchNormalizationGrad", since=1, domain=MS)
def batch_normalization_grad(dy, x, scale, mean, inv_std, *, epsilon=1e-5):
    """com.microsoft::BatchNormalizationGrad-1: gradients of training-mode batch normalization.

    From the batch mean and inverse std the forward saved (BatchNormInternal's
    outputs 3 and 4; ``epsilon`` is already in them): -> dX, dScale, dB.
    """
    axes = (0,) + tuple(range(2, x.ndim))
    shape = channel_shape(x)
    xhat = (x - jnp.reshape(mean, shape)) * jnp.reshape(inv_std, shape)
    # Summed per sample and channel, then over the batch, as ORT's kernel sums.
    dbias = jnp.sum(jnp.sum(dy, axis=axes[1:]), axis=0)
    dscale = jnp.sum(jnp.sum(dy * xhat, axis=axes[1:]), axis=0)
    inner = dy - jnp.mean(dy, axis=axes, keepdims=True) - xhat * jnp.mean(dy * xhat, axis=axes, keepdims=True)
    dx = jnp.reshape(scale * inv_std, shape) * inner
    return dx.astype(x.dtype), dscale.astype(scale.dtype), dbias.astype(scale.dtype)


@register("ReluGrad", since=1, domain=MS)
def relu_grad(dy, x):
    """com.microsoft::ReluGrad-1: dY where X > 0, else 0 (X the Relu's input or output)."""
    return jnp.where(x > 0, dy, jnp.zeros((), dy.dtype))


@register("LeakyReluGrad", since=1, domain=MS)
def leaky_relu_grad(dy, y, *, alpha=0.01):
    """com.microsoft::LeakyReluGrad-1: dY where Y > 0, else alpha * dY (Y the LeakyRelu's output)."""
    return jnp.where(y > 0, dy, dy * jnp.asarray(alpha, dy.dtype))


@register("TanhGrad", since=1, domain=MS)
def tanh_grad(dy, y):
    """com.microsoft::TanhGrad-1: dY * (1 - Y * Y), Y the Tanh's output."""
    return dy * (1 - y * y)


@register("SoftmaxGrad_13", since=1, domain=MS)
def softmax_grad_13(dy, y, *, axis=-1):
    """com.microsoft::SoftmaxGrad_13-1: Y * (dY - sum(dY * Y, axis)), Y a Softmax-13's output."""
    return y * (dy - jnp.sum(dy * y, axis=axis, keepdims=True))


@register("LogSoftmaxGrad_13", since=1, domain=MS)
def log_softmax_grad_13(dy, y, *, axis=-1):
    """com.microsoft::LogSoftmaxGrad_13-1: dY - exp(Y) * sum(dY, axis), Y a LogSoftmax-13's output."""
    return dy - jnp.exp(y) * jnp.sum(dy, axis=axis, keepdims=True)


@register("LayerNormalizationGrad", since=1, domain=MS)
def layer_normalization_grad(dy, x, scale, mean, inv_std_dev, *, axis=-1, epsilon=1e-5, stash_type=1):
    """com.microsoft::LayerNormalizationGrad-1: -> dX, dScale, dBias of LayerNormalization.

    From the Mean and InvStdDev the forward returned (``epsilon`` is already in them),
    over the axes from ``axis`` on.
    """
    a = axis % x.ndim
    inner, outer = tuple(range(a, x.ndim)), tuple(range(a))
    shape = x.shape[:a] + (1,) * (x.ndim - a)
    xhat = (x - jnp.reshape(mean, shape)) * jnp.reshape(inv_std_dev, shape)
    g = dy * scale
    dx = jnp.reshape(inv_std_dev, shape) * (g - jnp.mean(g, axis=inner, keepdims=True)
                                            - xhat * jnp.mean(g * xhat, axis=inner, keepdims=True))
    return dx.astype(x.dtype), jnp.sum(dy * xhat, axis=outer).astype(scale.dtype), jnp.sum(dy, axis=outer)


@register("GatherGrad", since=1, domain=MS)
def gather_grad(shape, indices, dy, *, axis=0):
    """com.microsoft::GatherGrad-1: dY added into zeros of ``shape`` where Gather read (repeats add)."""
    dims = static_ints(shape, "input 'shape'")
    a = axis % len(dims)
    index = jnp.asarray(indices).astype(jnp.int32)
    index = jnp.where(index < 0, index + dims[a], index)
    zeros = jnp.zeros(dims, dy.dtype)
    return zeros.at[(slice(None),) * a + (index,)].add(dy)


@register("GatherNDGrad", since=1, domain=MS)
def gather_nd_grad(shape, indices, dy, *, batch_dims=0):
    """com.microsoft::GatherNDGrad-1: dY added into zeros of ``shape`` where GatherND read (repeats add)."""
    dims = static_ints(shape, "input 'shape'")
    b, k = batch_dims, indices.shape[-1]
    index = jnp.asarray(indices).astype(jnp.int32)
    index = jnp.where(index < 0, index + np.asarray(dims[b:b + k], np.int32), index)
    lead = indices.shape[:-1]
    batch = tuple(np.arange(n).reshape((n,) + (1,) * (len(lead) - 1 - i)) for i, n in enumerate(lead[:b]))
    where = batch + tuple(index[..., j] for j in range(k))
    return jnp.zeros(dims, dy.dtype).at[where].add(dy)


@register("SliceGrad", since=1, domain=MS)
def slice_grad(dy, shape, starts, ends, axes=None, steps=None):
    """com.microsoft::SliceGrad-1: dY written into zeros of ``shape`` where Slice read."""
    dims = static_ints(shape, "input 'shape'")
    index = slice_index(dims, static_ints(starts, "input 'starts'"), static_ints(ends, "input 'ends'"),
                        None if axes is None else static_ints(axes, "input 'axes'"),
                        None if steps is None else static_ints(steps, "input 'steps'"))
    return jnp.zeros(dims, dy.dtype).at[index].set(dy)


@register("SigmoidGrad", since=1, domain=MS)
def sigmoid_grad(dy, y):
    """com.microsoft::SigmoidGrad-1: dY * Y * (1 - Y), Y the Sigmoid's output."""
    return dy * y * (1 - y)


@register("QuickGeluGrad", since=1, domain=MS)
def quick_gelu_grad(dy, x, *, alpha=1.702):
    """com.microsoft::QuickGeluGrad-1: dY times the derivative of X * Sigmoid(alpha * X)."""
    s = jax.nn.sigmoid(alpha * x)
    return dy * (s + alpha * x * s * (1 - s))


@register("SoftmaxCrossEntropyLossGrad", since=1, domain=MS)
def softmax_cross_entropy_loss_grad(dy, log_prob, label, weight=None, *, reduction="mean", ignore_index=None):
    """com.microsoft::SoftmaxCrossEntropyLossGrad-1: d loss / d logits from the forward's log_prob.

    The loss of a log-softmax output is a function of log_prob alone, so this is the
    derivative of the negative log-likelihood of ``log_prob`` through a log-softmax.
    """
    def loss(scores):
        return negative_log_likelihood_loss(jax.nn.log_softmax(scores, axis=1), label, weight,
                                            reduction=reduction, ignore_index=ignore_index)

    out, vjp = jax.vjp(loss, log_prob)
    if tuple(jnp.shape(dy)) != tuple(out.shape):
        raise OpError(f"dY has shape {list(jnp.shape(dy))}, the loss (reduction {reduction!r}) "
                      f"{list(out.shape)}")
    return vjp(jnp.asarray(dy, out.dtype))[0]


@register("Scale", since=1, domain=MS)
def scale(input, scale, *, scale_down=0):
    """com.microsoft::Scale-1: input times the scalar ``scale``, or divided by it (scale_down=1)."""
    if int(np.prod(jnp.shape(scale))) != 1:
        raise OpError(f"scale must hold one value, given shape {list(jnp.shape(scale))}")
    s = jnp.reshape(scale, ()).astype(input.dtype)
    return input * (1 / s if scale_down else s)
