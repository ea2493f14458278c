"""ONNX Runtime's fused inference ops that its training graph optimizer leaves on the loss path.

onnxruntime-training's ``generate_artifacts`` (1.19.2) optimizes the forward
model before it builds gradients: Gelu/Erf patterns become BiasGelu or
FastGelu, MatMul with Transpose/Scale becomes FusedMatMul, LayerNorm subgraphs
become LayerNormalization or SimplifiedLayerNormalization (both in the default
domain, from version 1: ORT's own schemas, not onnx's), and so on. jaxort runs
those nodes forward and differentiates them with JAX.

These schemas live in ONNX Runtime (contrib_defs.cc, bert_defs.cc), not in
onnx, so the dispatcher cannot fill attribute defaults from a schema: each
function states the schema's defaults as keyword defaults. Half-precision
inputs are computed in float32 and rounded once at the end, as ORT's CPU
kernels do. This module imports only the graph layer and its sibling op modules.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxort.errors import OpError
from jaxort.graph import register
from jaxort.graph.ops._common import at_least_float32, clip, int_prod, leaky_relu, normalize_axis, relu
from jaxort.graph.ops.conv import conv
from jaxort.graph.ops.matmul import gemm, matrix_product
from jaxort.graph.patterns.gelu import gelu as fused_gelu

MS = "com.microsoft"


def _wide(*xs):
    """``xs`` in the dtype ORT's CPU kernels compute in (float32 for half types)."""
    cd = at_least_float32(xs[0].dtype)
    return [None if x is None else jnp.asarray(x).astype(cd) for x in xs]


# ---------------------------------------------------------------------------------- Gelu family


@register("Gelu", since=1, domain=MS)
def gelu(x):
    """com.microsoft::Gelu-1 (erf form), with the fused Gelu rule's backward."""
    return fused_gelu(x)


@register("BiasGelu", since=1, domain=MS)
def bias_gelu(a, b):
    """com.microsoft::BiasGelu-1: Gelu(A + B), B broadcast on the last axis; the fused Gelu rule."""
    return fused_gelu(a, b)


@register("FastGelu", since=1, domain=MS)
def fast_gelu(x, bias=None):
    """com.microsoft::FastGelu-1: the tanh approximation of Gelu(X + bias); the fused Gelu rule."""
    return fused_gelu(x, bias, approximate="tanh")


@register("QuickGelu", since=1, domain=MS)
def quick_gelu(x, *, alpha=1.702):
    """com.microsoft::QuickGelu-1: X * Sigmoid(alpha * X)."""
    (xw,) = _wide(x)
    return (xw * jax.nn.sigmoid(alpha * xw)).astype(x.dtype)


# ---------------------------------------------------------------------------------- products


def _matmul_operand(x, trans, trans_batch):
    """Moves dim 0 behind the batch dims (trans_batch), then swaps the last two (trans).

    A 1-D operand is never transposed (numpy matmul semantics), and for a 2-D
    one trans_batch changes nothing, as in ORT's FusedMatMul shape rule.
    """
    r = x.ndim
    if r < 2:
        return x
    perm = list(range(1, r - 1)) + [0, r - 1] if trans_batch else list(range(r))
    if trans:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    return x if perm == list(range(r)) else jnp.transpose(x, perm)


def _fused_matmul(a, b, alpha, trans_a, trans_b, trans_batch_a, trans_batch_b):
    if (trans_batch_a or trans_batch_b) and not (a.ndim == b.ndim and a.ndim >= 3):
        # ORT's MatMulComputeHelper (1.19-1.32) refuses the other cases.
        raise OpError(f"transBatchA/transBatchB need inputs of one rank >= 3, got shapes "
                      f"{list(a.shape)} and {list(b.shape)}")
    aw, bw = _wide(a, b)
    y = matrix_product(_matmul_operand(aw, trans_a, trans_batch_a),
                       _matmul_operand(bw, trans_b, trans_batch_b))
    return (y * alpha if alpha != 1.0 else y).astype(a.dtype)


@register("FusedMatMul", since=1, domain=MS)
def fused_mat_mul(a, b, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    """com.microsoft::FusedMatMul-1: alpha * op(A) @ op(B)."""
    return _fused_matmul(a, b, alpha, transA, transB, transBatchA, transBatchB)


@register("TransposeMatMul", since=1, domain=MS)
def transpose_mat_mul(a, b, *, alpha=1.0, transA=0, transB=0):
    """com.microsoft::TransposeMatMul-1 (FusedMatMul's older name, no batch transposes)."""
    return _fused_matmul(a, b, alpha, transA, transB, 0, 0)


def _softplus(x):
    return jnp.logaddexp(x, jnp.zeros((), x.dtype))


def _elu(x, alpha):
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


# name -> (function of x and parameters, parameter names, their defaults). The
# defaults are the standard ops' (ORT 1.19's functors require the attributes).
_ACTIVATIONS = {
    "Relu": (relu, (), ()),
    "Sigmoid": (jax.nn.sigmoid, (), ()),
    "Tanh": (jnp.tanh, (), ()),
    "Softsign": (lambda x: x / (1 + jnp.abs(x)), (), ()),
    "Softplus": (_softplus, (), ()),
    "LeakyRelu": (leaky_relu, ("alpha",), (0.01,)),
    "HardSigmoid": (lambda x, a, b: jnp.clip(a * x + b, 0, 1), ("alpha", "beta"), (0.2, 0.5)),
    "Clip": (clip, ("min", "max"), (None, None)),
    "Elu": (_elu, ("alpha",), (1.0,)),
    "Celu": (lambda x, a: jnp.maximum(x, 0) + jnp.minimum(0, a * jnp.expm1(jnp.minimum(x, 0) / a)),
             ("alpha",), (1.0,)),
    "Selu": (lambda x, a, g: g * _elu(x, a), ("alpha", "gamma"),
             (1.67326319217681884765625, 1.05070102214813232421875)),
    "ThresholdedRelu": (lambda x, a: jnp.where(x > a, x, jnp.zeros((), x.dtype)), ("alpha",),
                        (1.0,)),
    "ParametricSoftplus": (lambda x, a, b: a * _softplus(b * x), ("alpha", "beta"),
                           (None, None)),
    "ScaledTanh": (lambda x, a, b: a * jnp.tanh(b * x), ("alpha", "beta"), (None, None)),
}

# FusedGemm takes ORT's elementwise functors (activations.cc), FusedConv MLAS's
# activation kinds (fused_activation.cc), whose parameters come as a list.
_GEMM_ACTIVATIONS = frozenset(_ACTIVATIONS) - {"Clip"}
_CONV_ACTIVATIONS = frozenset({"Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid"})


def _activate(y, activation, allowed, params):
    if not activation:
        return y
    if activation not in allowed:
        raise OpError(f"activation {activation!r} is not one ONNX Runtime fuses here "
                      f"(one of {sorted(allowed)})")
    fn, names, defaults = _ACTIVATIONS[activation]
    values = [d if params.get(n) is None else params[n] for n, d in zip(names, defaults)]
    missing = [n for n, v in zip(names, values) if v is None]
    if missing:
        raise OpError(f"activation {activation!r} needs its parameter(s) {missing}")
    return fn(y, *values)


@register("FusedGemm", since=1, domain=MS)
def fused_gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation=None,
               activation_alpha=None, activation_beta=None, activation_gamma=None):
    """com.microsoft::FusedGemm-1: Gemm, then the named activation."""
    aw, bw, cw = _wide(a, b, c)
    y = gemm(aw, bw, cw, alpha=alpha, beta=beta, transA=transA, transB=transB)
    params = {"alpha": activation_alpha, "beta": activation_beta, "gamma": activation_gamma}
    return _activate(y, activation, _GEMM_ACTIVATIONS, params).astype(a.dtype)


@register("FusedConv", since=1, domain=MS)
def fused_conv(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1,
               kernel_shape=None, pads=None, strides=None, activation=None,
               activation_params=None):
    """com.microsoft::FusedConv-1: activation(Conv(X, W, B) + Z)."""
    xw, ww, bw, zw = _wide(x, w, b, z)
    y = conv(xw, ww, bw, auto_pad=auto_pad, dilations=dilations, group=group,
             kernel_shape=kernel_shape, pads=pads, strides=strides)
    if zw is not None:
        if tuple(zw.shape) != tuple(y.shape):
            raise OpError(f"input 'Z' should have the output's shape {list(y.shape)}, "
                          f"got {list(zw.shape)}")
        y = y + zw
    params = {}
    if activation in _ACTIVATIONS:
        names = _ACTIVATIONS[activation][1]
        given = list(activation_params or [])
        if len(given) != len(names):
            raise OpError(f"activation {activation!r} takes {len(names)} activation_params, "
                          f"got {given}")
        params = dict(zip(names, given))
    return _activate(y, activation, _CONV_ACTIVATIONS, params).astype(x.dtype)


# ---------------------------------------------------------------------------------- sums


@register("ScaledSum", since=1, domain=MS)
def scaled_sum(input0, input1, input2=None, *, scale_0, scale_1, scale_2=1.0):
    """com.microsoft::ScaledSum-1: input0 * scale_0 + input1 * scale_1 (+ input2 * scale_2).

    Written by ORT's ScaledSumFusion (scaled additions, DeBERTa's attention);
    ORT has CUDA and ROCm kernels only, which take inputs of one shape and
    compute in float32 for half types.
    """
    given = [x for x in (input0, input1, input2) if x is not None]
    if any(x.shape != input0.shape for x in given):
        raise OpError(f"inputs of shapes {[list(x.shape) for x in given]}: ScaledSum takes inputs of one shape")
    wide = _wide(*given)
    y = wide[0] * scale_0 + wide[1] * scale_1
    if input2 is not None:
        y = y + wide[2] * scale_2
    return y.astype(input0.dtype)


# ---------------------------------------------------------------------------------- softmax


@register("BiasSoftmax", since=1, domain=MS)
def bias_softmax(data, bias, *, axis=1, is_inner_broadcast):
    """com.microsoft::BiasSoftmax-1: Softmax-1 (dims from axis on are one row) of data + bias.

    As in ORT's kernel, bias holds B rows of the softmax row size; with
    is_inner_broadcast each bias row serves consecutive data rows, otherwise
    the bias rows repeat cyclically.
    """
    axis = normalize_axis(axis, data.ndim)
    rows, size = int_prod(data.shape[:axis]), int_prod(data.shape[axis:])
    nb = int_prod(bias.shape) // size if size else 0
    if nb == 0 or nb * size != int_prod(bias.shape) or rows % nb:
        raise OpError(f"bias of shape {list(bias.shape)} does not broadcast onto data of shape "
                      f"{list(data.shape)} in rows of {size} from axis {axis}")
    xw, bw = _wide(data, bias)
    xw, bw = xw.reshape(rows, size), bw.reshape(nb, size)
    if is_inner_broadcast:
        s = xw.reshape(nb, rows // nb, size) + bw[:, None, :]
    else:
        s = xw.reshape(rows // nb, nb, size) + bw[None, :, :]
    return jax.nn.softmax(s, axis=-1).reshape(data.shape).astype(data.dtype)


# ---------------------------------------------------------------------------------- layer norms


def _layer_norm(x, scale, bias, axis, epsilon, simplified):
    """(Y, mean, inverse std) with the statistics in float32 (float64 for double inputs).

    ORT's kernels narrow the statistics of a double input to float; jaxort keeps
    them in float64, the precision a float64 model asks for.
    """
    axis = normalize_axis(axis, x.ndim)
    axes = tuple(range(axis, x.ndim))
    norm_shape = tuple(x.shape[axis:])
    xw, sw, bw = _wide(x, scale, bias)
    if simplified:
        mean = None
        var = jnp.mean(xw * xw, axis=axes, keepdims=True)
        centered = xw
    else:
        mean = jnp.mean(xw, axis=axes, keepdims=True)
        centered = xw - mean
        var = jnp.mean(centered * centered, axis=axes, keepdims=True)
    inv_std = lax.rsqrt(var + epsilon)
    y = centered * inv_std * sw.reshape(norm_shape)
    if bw is not None:
        y = y + bw.reshape(norm_shape)
    return y.astype(x.dtype), mean, inv_std


@register("LayerNormalization", since=1)
def layer_normalization_1(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """LayerNormalization-1 (ORT's schema under onnx's 17; float32 stats for any stash_type)."""
    # ORT's CPU kernel (1.32) reads only axis and epsilon for this schema.
    return _layer_norm(x, scale, b, axis, epsilon, simplified=False)


@register("SimplifiedLayerNormalization", since=1)
def simplified_layer_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """SimplifiedLayerNormalization-1 (ORT's RMS norm schema in the default domain)."""
    y, _, inv_std = _layer_norm(x, scale, None, axis, epsilon, simplified=True)
    return y, inv_std


def _skip_sum(x, skip, bias):
    """input + skip (+ bias) in the compute dtype; skip may drop the batch of a 3-D input."""
    xw, sw, bw = _wide(x, skip, bias)
    # ORT's skip_layer_norm_helper: skip has the input's shape, or, for a 3-D
    # input (batch, sequence, hidden), shape (1, sequence, hidden) or (sequence, hidden).
    allowed = [tuple(x.shape)] + ([(1,) + tuple(x.shape[1:]), tuple(x.shape[1:])]
                                  if x.ndim == 3 else [])
    if tuple(skip.shape) not in allowed:
        raise OpError(f"input 'skip' should have shape {' or '.join(map(str, allowed))}, "
                      f"got {tuple(skip.shape)}")
    s = xw + sw  # every allowed shape broadcasts numpy-style
    return s if bw is None else s + bw


@register("SkipLayerNormalization", since=1, domain=MS)
def skip_layer_normalization(x, skip, gamma, beta=None, bias=None, *, epsilon=1e-12):
    """com.microsoft::SkipLayerNormalization-1 (Y, mean, inv_std_var, input_skip_bias_sum)."""
    s = _skip_sum(x, skip, bias)
    y, mean, inv_std = _layer_norm(s, gamma, beta, -1, epsilon, simplified=False)
    return y.astype(x.dtype), mean, inv_std, s.astype(x.dtype)


@register("SkipSimplifiedLayerNormalization", since=1, domain=MS)
def skip_simplified_layer_normalization(x, skip, gamma, bias=None, *, epsilon=1e-12):
    """com.microsoft::SkipSimplifiedLayerNormalization-1 (mean output 0, as ORT writes it)."""
    s = _skip_sum(x, skip, bias)
    y, _, inv_std = _layer_norm(s, gamma, None, -1, epsilon, simplified=True)
    return y.astype(x.dtype), jnp.zeros_like(inv_std), inv_std, s.astype(x.dtype)
