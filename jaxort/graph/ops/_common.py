"""Helpers shared by several op modules: dtype rules, axes and indices, conv geometry.

A helper lives here once a second op module needs it, so each rule has one
name and one definition. The leading underscore keeps this module out of op
discovery (``jaxort/graph/ops/__init__.py`` imports only public modules); it
registers no op and imports nothing from the op modules.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxort.errors import OpError
from jaxort.graph.numerics import at_least_float32, auto_pads, fence, has_tangent, on_cpu_else, sum_tangents  # noqa: F401


def is_inexact(dtype) -> bool:
    """True for floating-point and complex dtypes (bfloat16 and float8 included)."""
    return jnp.issubdtype(np.dtype(dtype), jnp.inexact)


def is_floating(dtype) -> bool:
    """True for real floating-point dtypes (bfloat16 and float8 included), not complex."""
    return jnp.issubdtype(np.dtype(dtype), jnp.floating)


def is_integer(dtype) -> bool:
    """True for signed and unsigned integer dtypes; bool is not an integer here."""
    dtype = np.dtype(dtype)
    return jnp.issubdtype(dtype, jnp.integer) and dtype != np.bool_


def canonical_dtype(dtype) -> np.dtype:
    """The dtype JAX computes ``dtype`` in: int64/float64 become 32-bit unless x64 is on."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def lowest_value(dtype) -> np.ndarray:
    """The smallest value of ``dtype`` (-inf for floats, False for bool), 0-d.

    The identity of max: the init of max-pooling windows, the padding value
    they never pick, and ReduceMax over an empty set.
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(False)
    if is_integer(dtype):
        return np.array(np.iinfo(dtype).min, dtype)
    return np.array(-np.inf, dtype)


def highest_value(dtype) -> np.ndarray:
    """The largest value of ``dtype`` (+inf for floats, True for bool), 0-d: min's identity."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(True)
    if is_integer(dtype):
        return np.array(np.iinfo(dtype).max, dtype)
    return np.array(np.inf, dtype)


# ---------------------------------------- elementwise (arithmetic, activation, logic, cast)


def dtype_of(x) -> np.dtype:
    return np.dtype(x.dtype)


def is_string(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "OUS"


# Piecewise-linear ops at their kinks --------------------------------------------
#
# Where an op has no derivative (Relu at 0, Clip at a bound, Abs at 0) any
# value between the one-sided slopes is a valid subgradient, and JAX's
# choices (half of each side at ties of max/min, 1 for |x| at 0) differ from
# ONNX Runtime's gradient kernels, which are PyTorch's: ReluGrad passes dY
# where X > 0, LeakyReluGrad scales by alpha where X <= 0, Clip passes dY on
# the closed interval [min, max], and Abs's gradient is dY * Sign(X). These
# helpers compute the same values as jnp's and take ORT's subgradients, so a
# step through ORT's artifacts gives ORT's numbers even where a value sits
# exactly on a kink (a zero-bias layer on zero inputs, a clipped value
# clipped again).


def relu(x):
    """``max(x, 0)``; its derivative at 0 is 0, as ORT's ReluGrad (and PyTorch): ``jax.nn.relu``'s rule."""
    return jax.nn.relu(x)


def leaky_relu(x, alpha):
    """``x`` where ``x > 0``, else ``alpha * x``; the slope at 0 is ``alpha``, as ORT's LeakyReluGrad."""
    return jnp.where(x > 0, x, x * alpha)


def clip(x, lo=None, hi=None):
    """``min(max(x, lo), hi)`` (``hi`` where ``lo > hi``); either bound may be None.

    The derivative is 1 on the closed interval ``[lo, hi]``, bounds included
    (ORT's Clip gradient, PyTorch's clamp), 0 outside it.
    """
    x = y = jnp.asarray(x)
    if lo is not None:
        y = jnp.maximum(y, lo)
    if hi is not None:
        y = jnp.minimum(y, hi)
    if not is_inexact(x.dtype):
        return y
    inside = None
    if lo is not None:
        inside = x >= lo
    if hi is not None:
        inside = x <= hi if inside is None else inside & (x <= hi)
    if inside is None:
        return y
    # Values are y's (x itself wherever the select takes x); the x branch
    # carries the derivative 1 at the bounds, y's the bounds' derivatives.
    return jnp.where(inside, x, y)


@jax.custom_jvp
def _abs(x):
    return jnp.abs(x)


_abs.defjvps(lambda t, y, x: t * jnp.sign(x).astype(t.dtype))


def abs_(x):
    """``|x|``; its derivative at 0 is 0 (``sign(x)``), as ORT's Abs gradient (and PyTorch)."""
    return _abs(x) if is_floating(x.dtype) else jnp.abs(x)


def legacy_broadcast(a, b, broadcast, axis):
    """Opset < 7 broadcasting: ``b`` aligns with ``a`` starting at ``axis``."""
    if not broadcast or b.ndim == a.ndim:
        return b
    if axis is None:
        axis = a.ndim - b.ndim
    if axis < 0:
        axis += a.ndim
    shape = (1,) * axis + tuple(b.shape) + (1,) * (a.ndim - axis - b.ndim)
    return jnp.reshape(b, shape) if not isinstance(b, np.ndarray) else b.reshape(shape)


def via_float(fn, x):
    """Applies a float function to an integer tensor (schema allows ints), casting back."""
    dt = dtype_of(x)
    if is_inexact(dt):
        return fn(x)
    work = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    return fn(jnp.asarray(x).astype(work)).astype(dt)


# ---------------------------------------- axes and indices (shape, layout, indexing, scatter)


def array_module(*xs):
    """numpy when every given value is static (numpy or None), else jax.numpy."""
    if all(x is None or isinstance(x, (np.ndarray, np.generic)) for x in xs):
        return np
    return jnp


def normalize_axis(axis, rank: int, what: str = "axis") -> int:
    """Normalizes a possibly negative axis into [0, rank)."""
    a = int(axis)
    if not -rank <= a < rank:
        raise OpError(f"{what} {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def normalize_axes(axes, rank: int, what: str = "axes") -> list[int]:
    out = [normalize_axis(a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise OpError(f"{what} {list(axes)} has duplicates")
    return out


def wrap_negative_indices(indices, size):
    """Maps negative indices into [0, size): ``i + size`` where ``i < 0``.

    ``size`` may be an int or a numpy array broadcasting against ``indices``.
    """
    if isinstance(size, np.ndarray):
        size = size.astype(indices.dtype)
    if isinstance(indices, np.ndarray):
        return np.where(indices < 0, indices + size, indices)
    return jnp.where(indices < 0, indices + size, indices)


def check_indices_in_range(indices, size, what="indices"):
    """Raises for static indices outside [-size, size) (traced ones cannot be checked)."""
    if isinstance(indices, np.ndarray) and indices.size:
        lo, hi = np.min(indices), np.max(indices)
        if np.any((indices < -np.asarray(size)) | (indices >= np.asarray(size))):
            raise OpError(
                f"{what} out of range (min {lo}, max {hi}) for a "
                f"dimension of size {size}")


def int_prod(xs) -> int:
    return int(math.prod(int(v) for v in xs))


def nd_index(data_shape, indices, batch_dims):
    """For GatherND/ScatterND: the advanced-index tuple into data reshaped to (B, ...)."""
    k = indices.shape[-1]
    if batch_dims + k > len(data_shape):
        raise OpError(f"indices' last dimension {k} plus batch_dims "
                      f"{batch_dims} exceeds data rank {len(data_shape)}")
    dims = np.array(data_shape[batch_dims:batch_dims + k], dtype=np.int64)
    check_indices_in_range(indices, dims)
    idx = wrap_negative_indices(indices, dims)
    nb = int_prod(data_shape[:batch_dims])
    xp = array_module(idx)
    idx = xp.reshape(idx, (nb,) + tuple(indices.shape[batch_dims:]))
    bidx = np.arange(nb).reshape((nb,) + (1,) * (idx.ndim - 2))
    return (bidx,) + tuple(idx[..., j] for j in range(k)), nb


# ---------------------------------------- conv and pool geometry, quantized products, batch norm


def channel_shape(x):
    """Shape (1, C, 1, ..., 1) for broadcasting a per-channel vector onto ``x``."""
    return (1, -1) + (1,) * (x.ndim - 2)


def spatial_attrs(x, w_spatial, kernel_shape, strides, dilations):
    n = x.ndim - 2
    kernel = list(kernel_shape) if kernel_shape is not None else list(w_spatial)
    strides = list(strides) if strides is not None else [1] * n
    dilations = list(dilations) if dilations is not None else [1] * n
    if len(kernel) != n or len(strides) != n or len(dilations) != n:
        raise OpError(
            f"input has {n} spatial dims (shape {list(x.shape)}) but "
            f"kernel_shape={kernel}, strides={strides}, dilations={dilations}")
    return kernel, strides, dilations


def tap_slice(offs, strides, dilations, out) -> tuple:
    """The strided slice kernel tap ``offs`` reads of the padded spatial axes.

    Along each spatial axis, the padded input at ``offs * dilation + m *
    stride`` for output positions ``m < out``.
    """
    return tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, m, s in zip(offs, dilations, out, strides))


def tap_slices(kernel, strides, dilations, out):
    """For each kernel tap in row-major order: its offsets and the strided slice it reads (:func:`tap_slice`)."""
    for offs in itertools.product(*[range(k) for k in kernel]):
        yield offs, tap_slice(offs, strides, dilations, out)


def stacked_taps(x, kernel, strides, dilations, out, spatial, axis):
    """The strided slice of ``x`` under every kernel tap, stacked at ``axis`` as one axis per kernel dimension.

    ``x``'s spatial axes start at ``spatial``; the result has the kernel's
    axes (row-major taps) at ``axis`` (counted in the result), followed by
    the remaining axes of the slices. The taps are stacked one kernel axis
    at a time: XLA's CPU compiler fuses a concatenation of at most 8
    operands with the slices it reads into one loop and leaves larger ones
    as a copy per slice plus one concatenation. Stacked this way, a 7x7
    kernel is one loop instead of 50 (ResNet-18's stem forward: 273 ->
    105 us on one core), a 3x3 one instead of 10.
    """
    lead = (slice(None),) * spatial

    def stack(offs):
        if len(offs) == len(kernel):
            return x[lead + tap_slice(offs, strides, dilations, out)]
        return jnp.stack([stack(offs + (k,)) for k in range(kernel[len(offs)])], axis=axis)

    return stack(())


# Windows of at most this many taps take the tap forms of Conv and MaxPool on CPU.
MAX_TAPS = 64


def requantize(y, scale, zero_point, dtype):
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    q = jnp.round(y / scale) + jnp.asarray(zero_point).astype(y.dtype)
    return jnp.clip(q, info.min, info.max).astype(dtype)


def per_axis(v, ndim, axis):
    v = jnp.asarray(v)
    if v.ndim == 1 and v.shape[0] > 1:
        shape = [1] * ndim
        shape[axis] = -1
        return v.reshape(shape)
    return v


def batch_norm_inference(x, scale, b, mean, var, epsilon):
    cd = at_least_float32(x.dtype)
    shape = channel_shape(x)
    inv = lax.rsqrt(jnp.reshape(var, shape).astype(cd) + epsilon)
    y = (x.astype(cd) - jnp.reshape(mean, shape).astype(cd)) * inv
    y = y * jnp.reshape(scale, shape).astype(cd) + jnp.reshape(b, shape).astype(cd)
    return y.astype(x.dtype)


def _batch_norm_forward(x, scale, b, epsilon):
    """Training-mode batch normalization: ``(y, mean, var, xhat, inv)``, statistics in float32 or wider.

    The same operations as :func:`batch_norm_inference` with the batch's
    statistics (ORT's numbers): two-pass mean and biased variance over every
    axis but the channels.
    """
    cd = at_least_float32(x.dtype)
    shape = channel_shape(x)
    axes = (0,) + tuple(range(2, x.ndim))
    xc = x.astype(cd)
    mean = jnp.mean(xc, axis=axes)
    d = xc - jnp.reshape(mean, shape)
    var = jnp.mean(jnp.square(d), axis=axes)
    inv = lax.rsqrt(jnp.reshape(var, shape) + epsilon)
    xhat = d * inv
    y = xhat * jnp.reshape(scale, shape).astype(cd) + jnp.reshape(b, shape).astype(cd)
    return y.astype(x.dtype), mean, var, xhat, inv


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def batch_norm_train(x, scale, b, epsilon):
    """Training-mode batch normalization: ``(y, batch mean, batch variance)``.

    Differentiated by its own rule (:func:`_batch_norm_train_jvp`): XLA
    compiles the backward pass of the written-out formula to four reductions
    over ``x``'s size, the transpose of this rule to two, the per-channel
    sums of the output gradient ``g`` and of ``g * xhat``, which are the
    bias and scale gradients too (ResNet-18 at widths 3-24, batch 8:
    85 -> 45 reduction loops a train step). Forward mode, second
    derivatives and ``vmap`` work as for any JAX function.
    """
    return _batch_norm_forward(x, scale, b, epsilon)[:3]


def _batch_norm_train_jvp(epsilon, primals, tangents):
    x, scale, b = primals
    dx, dscale, db = tangents
    y, mean, var, xhat, inv = _batch_norm_forward(x, scale, b, epsilon)
    cd = xhat.dtype
    shape = channel_shape(x)
    axes = (0,) + tuple(range(2, x.ndim))
    # Every per-channel term multiplies xhat (or is added) with the tangent
    # on the left, so the transposes of the dx, scale and bias terms share
    # the same two reductions, sum(g * xhat) and sum(g), and XLA computes
    # each once.
    parts = []
    dmean = dvar = None
    if has_tangent(dx):
        dxc = dx.astype(cd)
        c = jnp.reshape(scale, shape).astype(cd) * inv
        mdx = jnp.mean(dxc, axis=axes, keepdims=True)
        mdxh = jnp.mean(dxc * xhat, axis=axes, keepdims=True)
        # d xhat = inv * (dx - mean(dx) - xhat * mean(dx * xhat))
        parts += [c * dxc, -(mdx * c), -(mdxh * c) * xhat]
        dmean = jnp.reshape(mdx, mean.shape)
        # var = mean(d * d), d = xhat / inv: d var = 2 mean(d * dx) = 2 mean(xhat * dx) / inv
        dvar = jnp.reshape(2.0 * mdxh / inv, var.shape)
    if has_tangent(dscale):
        parts.append(jnp.reshape(dscale, shape).astype(cd) * xhat)
    if has_tangent(db):
        parts.append(jnp.reshape(db, shape).astype(cd))
    dy = sum_tangents(parts, xhat.shape, y.dtype)
    return (y, mean, var), (dy, jnp.zeros_like(mean) if dmean is None else dmean,
                            jnp.zeros_like(var) if dvar is None else dvar)


batch_norm_train.defjvp(_batch_norm_train_jvp, symbolic_zeros=True)


def batch_norm(x, scale, b, mean, var, *, epsilon, momentum, training, ctx):
    """Returns (Y, running_mean, running_var, saved_mean, saved_var)."""
    if training or ctx.training:
        y, bm, bv = batch_norm_train(x, scale, b, float(epsilon))
        run_mean = (mean * momentum + bm.astype(mean.dtype) * (1 - momentum)).astype(mean.dtype)
        run_var = (var * momentum + bv.astype(var.dtype) * (1 - momentum)).astype(var.dtype)
        if ctx.training:
            # In a jaxort training step the running statistics are written back
            # into the state (frozen parameters), like ORT Training 1.19.2's
            # BatchNormInternal, whether the node is in inference or training form.
            ctx.update_state(3, lax.stop_gradient(run_mean))
            ctx.update_state(4, lax.stop_gradient(run_var))
        return (y, run_mean, run_var, bm.astype(x.dtype), bv.astype(x.dtype))
    y = batch_norm_inference(x, scale, b, mean, var, epsilon)
    return (y, mean, var, mean, var)


def gather_hw(img, idx):
    """img (B, C, H*W), idx (B, ...) -> (B, C, ...)."""
    b, c = img.shape[:2]
    flat = idx.reshape(b, 1, -1)
    return jnp.take_along_axis(img, flat, axis=2).reshape((b, c) + idx.shape[1:])
