"""Attention and RotaryEmbedding (opset 23)."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from jaxort.errors import OpError
from jaxort.graph import register


def _neg_inf_where(allowed, dtype):
    return jnp.where(allowed, jnp.zeros((), dtype), jnp.full((), -jnp.inf, dtype))


def _window_bias(q_len, kv_len, offset, dtype, *, causal, left=-1, right=-1):
    """Additive (q, kv) bias, or (batch, 1, q, kv) for a per-batch offset."""
    i = jnp.arange(q_len, dtype=jnp.int32).reshape(q_len, 1)
    j = jnp.arange(kv_len, dtype=jnp.int32).reshape(1, kv_len)
    if jnp.ndim(offset) > 0:
        i = i + jnp.reshape(offset, (-1, 1, 1))
    else:
        i = i + offset
    diff = i - j
    allowed = jnp.ones(diff.shape, bool)
    if causal:
        allowed = allowed & (diff >= 0)
    if left >= 0:
        allowed = allowed & (diff <= left)
    if right >= 0:
        allowed = allowed & (-diff <= right)
    bias = _neg_inf_where(allowed, dtype)
    return bias[:, None] if bias.ndim == 3 else bias


def _bf16_round(a):
    return lax.reduce_precision(a, exponent_bits=8, mantissa_bits=7)


def _sequential_sum(e, rnd):
    """Sum over the last axis left to right, rounding after each addition."""
    cols = jnp.moveaxis(e, -1, 0)
    acc, _ = lax.scan(lambda acc, col: (rnd(acc + col), None), cols[0], cols[1:])
    return acc[..., None]


def _split_heads(x, heads):
    b, s, h = x.shape
    return jnp.transpose(x.reshape(b, s, heads, h // heads), (0, 2, 1, 3))


def _attention(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, *, scale, is_causal,
               q_num_heads, kv_num_heads, softmax_precision, softcap, qk_matmul_output_mode,
               left_window_size=-1, right_window_size=-1):
    rank3 = q.ndim == 3
    if rank3:
        if not q_num_heads or not kv_num_heads:
            raise OpError("3-D inputs need q_num_heads and kv_num_heads")
        q = _split_heads(q, q_num_heads)
        k = _split_heads(k, kv_num_heads)
        v = _split_heads(v, kv_num_heads)
    dt = q.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[3])
    # The spec scales Q and K by sqrt(scale) each, in the input type.
    sq = jnp.asarray(math.sqrt(scale), dt)
    if past_key is not None:
        k = jnp.concatenate([past_key, k], axis=2)
    if past_value is not None:
        v = jnp.concatenate([past_value, v], axis=2)
    present_key, present_value = k, v
    q_len, kv_len = q.shape[2], k.shape[2]

    if attn_mask is not None and attn_mask.shape[-1] < kv_len:
        pad = [(0, 0)] * (attn_mask.ndim - 1) + [(0, kv_len - attn_mask.shape[-1])]
        attn_mask = jnp.pad(attn_mask, pad,
                            constant_values=False if attn_mask.dtype == jnp.bool_ else -jnp.inf)
    if attn_mask is not None:
        bias = (_neg_inf_where(attn_mask, dt) if attn_mask.dtype == jnp.bool_
                else attn_mask.astype(dt))
    else:
        bias = jnp.zeros((q_len, kv_len), dt)
    if past_key is None and nonpad_kv_seqlen is not None:
        offset = jnp.reshape(nonpad_kv_seqlen, (-1,)).astype(jnp.int32) - q_len
    else:
        offset = past_key.shape[2] if past_key is not None else 0
    if is_causal:
        bias = bias + _window_bias(q_len, kv_len, offset, dt, causal=True)
    left = -1 if left_window_size is None else left_window_size
    right = -1 if right_window_size is None else right_window_size
    if left >= 0 or right >= 0:
        bias = bias + _window_bias(q_len, kv_len, offset, dt, causal=False, left=left, right=right)
    if nonpad_kv_seqlen is not None:
        keep = (jnp.arange(kv_len, dtype=jnp.int32)[None, :]
                < jnp.reshape(nonpad_kv_seqlen, (-1, 1)).astype(jnp.int32))
        bias = bias + _neg_inf_where(keep, dt)[:, None, None, :]

    hq, hk = q.shape[1], k.shape[1]
    if hq != hk and hq % hk == 0:
        k = jnp.repeat(k, hq // hk, axis=1)
        v = jnp.repeat(v, hq // hk, axis=1)
    # bfloat16: ONNX's reference (numpy + ml_dtypes) rounds to bfloat16 after every op and
    # sums the softmax denominator sequentially; XLA would keep float32 in between, which
    # differs by an ulp. Emulate it: float32 compute with explicit rounding.
    exact = dt == jnp.bfloat16
    rnd = _bf16_round if exact else (lambda a: a)
    if exact:
        q, k, v, bias, sq = (a.astype(jnp.float32) for a in (q, k, v, bias, sq))
    qk = rnd(jnp.matmul(rnd(q * sq), jnp.swapaxes(rnd(k * sq), -1, -2)))
    if softcap is not None and softcap > 0:
        qk = rnd(rnd(jnp.tanh(rnd(qk / softcap))) * softcap)
    logits = rnd(qk + bias)
    qk_out = logits if qk_matmul_output_mode == 2 else qk
    sm_rnd = rnd
    if softmax_precision is not None:
        from jaxort.dtypes import to_numpy_dtype

        sm_dtype = to_numpy_dtype(softmax_precision)
        if sm_dtype != dt:
            logits = logits.astype(sm_dtype)
            sm_rnd = lambda a: a  # noqa: E731
    m = jnp.max(logits, axis=-1, keepdims=True)
    m = jnp.where(jnp.isneginf(m), jnp.zeros((), m.dtype), lax.stop_gradient(m))
    e = sm_rnd(jnp.exp(sm_rnd(logits - m)))
    s = _sequential_sum(e, rnd) if sm_rnd is rnd and exact else jnp.sum(e, -1, keepdims=True)
    p = sm_rnd(e / jnp.where(s == 0, jnp.ones((), s.dtype), s))
    masked_row = jnp.isneginf(jnp.max(bias, axis=-1, keepdims=True))
    p = jnp.where(masked_row, jnp.zeros((), p.dtype), p)
    if qk_matmul_output_mode == 3:
        qk_out = p
    p = rnd(p.astype(v.dtype))
    y = rnd(jnp.matmul(p, v)).astype(dt)
    if rank3:
        y = jnp.transpose(y, (0, 2, 1, 3))
        y = y.reshape(y.shape[0], y.shape[1], -1)
    return y, present_key, present_value, qk_out.astype(dt)


@register("Attention", since=23)
def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal, kv_num_heads, q_num_heads, qk_matmul_output_mode, scale, softcap,
              softmax_precision, left_window_size=None, right_window_size=None):
    """Attention-23+ (nonpad_kv_seqlen from 24, sliding windows from 25)."""
    return _attention(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, scale=scale,
                      is_causal=is_causal, q_num_heads=q_num_heads, kv_num_heads=kv_num_heads,
                      softmax_precision=softmax_precision, softcap=softcap,
                      qk_matmul_output_mode=qk_matmul_output_mode,
                      left_window_size=left_window_size, right_window_size=right_window_size)


@register("RotaryEmbedding", since=23)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved, num_heads,
                     rotary_embedding_dim):
    """RotaryEmbedding-23."""
    shape = x.shape
    if x.ndim == 4:
        x = jnp.transpose(x, (0, 2, 1, 3))  # (batch, seq, heads, head)
    else:
        if not num_heads:
            raise OpError("3-D input needs num_heads")
        x = x.reshape(shape[0], shape[1], num_heads, shape[2] // num_heads)
    dim = rotary_embedding_dim or x.shape[3]
    rot, rest = x[..., :dim], x[..., dim:]
    if position_ids is not None:
        cos_cache = jnp.take(cos_cache, position_ids, axis=0)
        sin_cache = jnp.take(sin_cache, position_ids, axis=0)
    cos = cos_cache[:, :, None, :].astype(x.dtype)
    sin = sin_cache[:, :, None, :].astype(x.dtype)
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :dim // 2], rot[..., dim // 2:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rot = jnp.stack([real, imag], axis=-1).reshape(rot.shape)
    else:
        rot = jnp.concatenate([real, imag], axis=-1)
    out = jnp.concatenate([rot, rest], axis=-1)
    if len(shape) == 3:
        return out.reshape(shape)
    return jnp.transpose(out, (0, 2, 1, 3))
