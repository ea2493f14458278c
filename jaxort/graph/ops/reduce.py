"""Reductions (ReduceSum, ReduceMean, ..., ReduceLogSumExp) and ArgMax/ArgMin.

Axes are an attribute before ReduceSum-13 / the others' opset 18 and an input
from then on; an axes input must be static (it decides the output shape).
Reducing over an empty set gives the reduction's identity (0 for sums, 1 for
products, -inf for max and log-sums) like ONNX's reference implementation.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static_ints
from jaxort.graph.ops._common import canonical_dtype, highest_value, is_integer, lowest_value


def _normalize_axes(data, axes, noop_with_empty_axes):
    """Returns the sorted non-negative axes to reduce; () reduces over no axis."""
    rank = jnp.ndim(data)
    if axes is None or len(axes) == 0:
        # noop_with_empty_axes reduces over the empty set of axes: the reduction
        # step is the identity, but composite reductions still take their other
        # steps (ReduceLogSum gives log(x), ReduceSumSquare x * x, ReduceL2 |x|).
        return () if noop_with_empty_axes else tuple(range(rank))
    out = []
    for a in axes:
        a = int(a)
        if not -rank <= a < max(rank, 1):
            raise OpError(f"axis {a} is out of range for rank {rank}")
        out.append(a % max(rank, 1))
    if len(set(out)) != len(out):
        raise OpError(f"axes {list(axes)} repeat an axis")
    return tuple(sorted(out))


def _axes_input(axes):
    return None if axes is None else static_ints(axes, "input 'axes'")


def _reduce(data, axes, keepdims, noop_with_empty_axes, fn, empty_value=None):
    """Applies ``fn(x, axes, keepdims)`` over the normalized axes.

    ``empty_value(dtype)`` gives the identity when a reduced dimension has size 0
    (for reductions such as max whose XLA lowering has no identity).
    """
    ax = _normalize_axes(data, axes, noop_with_empty_axes)
    keep = bool(keepdims)
    shape = jnp.shape(data)
    if empty_value is not None and any(shape[a] == 0 for a in ax):
        out_shape = tuple(
            (1 if keep else None) if i in ax else d for i, d in enumerate(shape))
        out_shape = tuple(d for d in out_shape if d is not None)
        return jnp.full(out_shape, empty_value(data.dtype), dtype=data.dtype)
    return fn(data, ax, keep)


def _sum(x, ax, keep):
    return jnp.sum(x, axis=ax, keepdims=keep, dtype=x.dtype)


def _mean(x, ax, keep):
    if is_integer(x.dtype):
        n = int(np.prod([x.shape[a] for a in ax]))
        # numpy (the ONNX reference) divides and truncates toward zero.
        return jax.lax.div(_sum(x, ax, keep), jnp.asarray(max(n, 1), x.dtype))
    return jnp.mean(x, axis=ax, keepdims=keep, dtype=x.dtype)


def _max(x, ax, keep):
    return jnp.max(x, axis=ax, keepdims=keep)


def _min(x, ax, keep):
    return jnp.min(x, axis=ax, keepdims=keep)


def _prod(x, ax, keep):
    return jnp.prod(x, axis=ax, keepdims=keep, dtype=x.dtype)


def _l1(x, ax, keep):
    return _sum(jnp.abs(x), ax, keep)


def _float_of(dtype):
    return canonical_dtype(np.float64) if is_integer(dtype) else np.dtype(dtype)


def _l2(x, ax, keep):
    xf = x.astype(_float_of(x.dtype))
    return jnp.sqrt(_sum(xf * xf, ax, keep)).astype(x.dtype)


def _sum_square(x, ax, keep):
    return _sum(x * x, ax, keep)


def _log_sum(x, ax, keep):
    xf = x.astype(_float_of(x.dtype))
    return jnp.log(_sum(xf, ax, keep)).astype(x.dtype)


def _log_sum_exp(x, ax, keep):
    xf = x.astype(_float_of(x.dtype))
    m = jax.lax.stop_gradient(jnp.max(xf, axis=ax, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, jnp.zeros((), xf.dtype))
    out = jnp.log(_sum(jnp.exp(xf - m), ax, True)) + m
    if not keep:
        out = jnp.squeeze(out, axis=ax)
    return out.astype(x.dtype)


def _neg_inf(dtype):
    return -np.inf


# ---- ReduceSum: axes input from opset 13 ----

@register("ReduceSum", since=1)
def reduce_sum_1(data, *, axes=None, keepdims):
    """ReduceSum-1/11 (axes attribute)."""
    return _reduce(data, axes, keepdims, 0, _sum)


@register("ReduceSum", since=13)
def reduce_sum(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceSum-13+ (axes input)."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _sum)


# ---- the others: axes input from opset 18 ----

@register("ReduceMean", since=1)
def reduce_mean_1(data, *, axes=None, keepdims):
    """ReduceMean-1/11/13 (axes attribute); integer means truncate like numpy."""
    return _reduce(data, axes, keepdims, 0, _mean)


@register("ReduceMean", since=18)
def reduce_mean(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceMean-18+ (axes input); integer means truncate like numpy."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _mean)


@register("ReduceMax", since=1)
def reduce_max_1(data, *, axes=None, keepdims):
    """ReduceMax-1/11/12/13 (axes attribute)."""
    return _reduce(data, axes, keepdims, 0, _max, lowest_value)


@register("ReduceMax", since=18)
def reduce_max(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceMax-18/20 (axes input; bool from 20)."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _max, lowest_value)


@register("ReduceMin", since=1)
def reduce_min_1(data, *, axes=None, keepdims):
    """ReduceMin-1/11/12/13 (axes attribute)."""
    return _reduce(data, axes, keepdims, 0, _min, highest_value)


@register("ReduceMin", since=18)
def reduce_min(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceMin-18/20 (axes input; bool from 20)."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _min, highest_value)


@register("ReduceProd", since=1)
def reduce_prod_1(data, *, axes=None, keepdims):
    """ReduceProd-1/11/13 (axes attribute)."""
    return _reduce(data, axes, keepdims, 0, _prod)


@register("ReduceProd", since=18)
def reduce_prod(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceProd-18+ (axes input)."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _prod)


@register("ReduceL1", since=1)
def reduce_l1_1(data, *, axes=None, keepdims):
    """ReduceL1-1/11/13 (axes attribute)."""
    return _reduce(data, axes, keepdims, 0, _l1)


@register("ReduceL1", since=18)
def reduce_l1(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceL1-18+ (axes input)."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _l1)


@register("ReduceL2", since=1)
def reduce_l2_1(data, *, axes=None, keepdims):
    """ReduceL2-1/11/13 (axes attribute)."""
    return _reduce(data, axes, keepdims, 0, _l2)


@register("ReduceL2", since=18)
def reduce_l2(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceL2-18+ (axes input)."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _l2)


@register("ReduceSumSquare", since=1)
def reduce_sum_square_1(data, *, axes=None, keepdims):
    """ReduceSumSquare-1/11/13 (axes attribute)."""
    return _reduce(data, axes, keepdims, 0, _sum_square)


@register("ReduceSumSquare", since=18)
def reduce_sum_square(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceSumSquare-18+ (axes input)."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _sum_square)


@register("ReduceLogSum", since=1)
def reduce_log_sum_1(data, *, axes=None, keepdims):
    """ReduceLogSum-1/11/13 (axes attribute)."""
    return _reduce(data, axes, keepdims, 0, _log_sum)


@register("ReduceLogSum", since=18)
def reduce_log_sum(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceLogSum-18/28 (axes input)."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _log_sum)


@register("ReduceLogSumExp", since=1)
def reduce_log_sum_exp_1(data, *, axes=None, keepdims):
    """ReduceLogSumExp-1/11/13 (axes attribute); max-shifted for stability."""
    return _reduce(data, axes, keepdims, 0, _log_sum_exp, _neg_inf)


@register("ReduceLogSumExp", since=18)
def reduce_log_sum_exp(data, axes=None, *, keepdims, noop_with_empty_axes):
    """ReduceLogSumExp-18/28 (axes input); max-shifted for stability."""
    return _reduce(data, _axes_input(axes), keepdims, noop_with_empty_axes, _log_sum_exp,
                   _neg_inf)


# ---- ArgMax / ArgMin ----

def _arg(data, axis, keepdims, select_last_index, fn):
    rank = jnp.ndim(data)
    if not -rank <= axis < max(rank, 1):
        raise OpError(f"axis {axis} is out of range for rank {rank}")
    axis = axis % max(rank, 1)
    index_dtype = canonical_dtype(np.int64)
    if select_last_index:
        n = data.shape[axis]
        idx = fn(jnp.flip(data, axis=axis), axis=axis, keepdims=bool(keepdims))
        return (n - 1 - idx).astype(index_dtype)
    return fn(data, axis=axis, keepdims=bool(keepdims)).astype(index_dtype)


@register("ArgMax", since=1)
def arg_max(data, *, axis, keepdims, select_last_index=None):
    """ArgMax-1/11/12/13 (select_last_index from 12); int64 output."""
    return _arg(data, axis, keepdims, select_last_index, jnp.argmax)


@register("ArgMin", since=1)
def arg_min(data, *, axis, keepdims, select_last_index=None):
    """ArgMin-1/11/12/13 (select_last_index from 12); int64 output."""
    return _arg(data, axis, keepdims, select_last_index, jnp.argmin)
