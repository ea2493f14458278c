"""The builders behind :func:`jaxort.testing.models.onnx_models`, one per op, and their table.

A builder takes the :class:`_Builder` of the model being drawn, draws its
operands (values already in the model, fresh graph inputs or initializers)
and attributes, and appends its node; :data:`OP_FAMILIES` names each
builder's op and first opset, and :func:`_finish` makes the model.

Imports hypothesis, numpy and onnx only (no JAX).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper

from jaxort.graph import tensor_from_numpy
from jaxort.testing.strategies import _TINY, _elem_type, _make_model, st


@dataclasses.dataclass
class _Value:
    name: str
    shape: tuple
    dtype: np.dtype


class _Builder:
    """The model under construction: nodes, graph inputs, initializers, values."""

    def __init__(self, draw, dtype: np.dtype, opset: int):
        self.draw, self.dtype, self.opset = draw, dtype, opset
        self.nodes, self.inputs, self.inits = [], [], []
        self.pool: list[_Value] = []  # float values nodes may read
        self.read: set = set()
        self.count = 0
        self.rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def fresh(self, shape, dtype=None) -> _Value:
        v = _Value(self.name("x"), tuple(shape), np.dtype(dtype or self.dtype))
        self.inputs.append(v)
        if v.dtype == self.dtype:
            self.pool.append(v)
        return v

    def const(self, value, prefix: str = "c") -> str:
        name = self.name(prefix)
        value = np.asarray(value)
        self.inits.append(tensor_from_numpy(value, name))
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, np.int64), "k")

    def weight(self, shape, scale=1.0, positive=False) -> str:
        w = self.rng.normal(0.0, scale, shape)
        if positive:
            w = np.abs(w) + 0.5
        w = np.where(np.abs(w) < _TINY[self.dtype], 0.0, w)
        return self.const(w.astype(self.dtype), "w")

    def pick(self, ok=lambda v: True) -> Optional[_Value]:
        """A value from the pool, the newest first (so shrinking makes chains)."""
        candidates = [v for v in reversed(self.pool) if ok(v)]
        if not candidates:
            return None
        return candidates[self.draw(st.integers(0, len(candidates) - 1))]

    def pick_or_fresh(self, ok, shape) -> _Value:
        v = self.pick(ok)
        return v if v is not None else self.fresh(shape)

    def shape(self, min_dims=1, max_dims=4, min_side=1, max_side=4) -> tuple:
        return tuple(self.draw(st.lists(st.integers(min_side, max_side), min_size=min_dims,
                                        max_size=max_dims)))

    def node(self, op: str, inputs: Sequence[str], shape, dtype=None, **attrs) -> _Value:
        out = _Value(self.name("v"), tuple(int(d) for d in shape), np.dtype(dtype or self.dtype))
        self.nodes.append(helper.make_node(op, list(inputs), [out.name],
                                           name=f"{op.lower()}_{len(self.nodes)}", **attrs))
        self.read.update(i for i in inputs if i)
        if out.dtype == self.dtype:
            self.pool.append(out)
        return out

    def maybe(self, value) -> Any:
        """``value`` or None (the attribute's default); shrinks to None."""
        return value if self.draw(st.booleans()) else None


def _attrs(**kwargs) -> dict:
    return {k: v for k, v in kwargs.items() if v is not None}


def _any_value(b: _Builder) -> _Value:
    return b.pick_or_fresh(lambda v: True, b.shape())


def _broadcast_partner(b: _Builder, v: _Value) -> str:
    """A second operand that broadcasts with ``v``: a value, a graph input or an initializer."""
    shape = v.shape
    other = b.pick(lambda u: u is not v and _broadcasts(u.shape, shape))
    kind = b.draw(st.integers(0, 2))
    if kind == 0 and other is not None:
        return other.name
    # a suffix of v's shape, some dimensions set to 1
    k = b.draw(st.integers(0, len(shape)))
    sub = tuple(1 if b.draw(st.booleans()) else d for d in shape[len(shape) - k:])
    return b.fresh(sub).name if kind == 1 else b.weight(sub)


def _broadcasts(a, out) -> bool:
    try:
        return np.broadcast_shapes(a, out) == tuple(out)
    except ValueError:
        return False


# --- elementwise


def _unary(op, fresh=False, out_dtype=None, min_dims=0):
    def build(b: _Builder):
        if fresh:
            v = b.fresh(b.shape(min_dims=min_dims))
        else:
            v = b.pick_or_fresh(lambda u: len(u.shape) >= min_dims, b.shape(min_dims=max(min_dims, 1)))
        return b.node(op, [v.name], v.shape, out_dtype)
    return build


def _binary(op, fresh_right=False):
    def build(b: _Builder):
        v = _any_value(b)
        if fresh_right:
            other = b.fresh(v.shape[len(v.shape) - b.draw(st.integers(0, len(v.shape))):]).name
            names = [v.name, other]
        else:
            names = [v.name, _broadcast_partner(b, v)]
            if b.draw(st.booleans()):
                names.reverse()
        return b.node(op, names, np.broadcast_shapes(*(_shape_of(b, n) for n in names)))
    return build


def _pow(b: _Builder):
    base = b.fresh(b.shape(min_dims=0))
    exponent = b.fresh(base.shape[len(base.shape) - b.draw(st.integers(0, len(base.shape))):])
    return b.node("Pow", [base.name, exponent.name], base.shape)


def _shape_of(b: _Builder, name: str) -> tuple:
    for v in b.pool + b.inputs:
        if v.name == name:
            return v.shape
    for t in b.inits:
        if t.name == name:
            return tuple(t.dims)
    raise KeyError(name)


def _compare_where(b: _Builder):
    # Greater/Less on fresh inputs, then Where picks between two values.
    v = _any_value(b)
    a, c = b.fresh(v.shape), b.fresh(v.shape)
    cond = b.node(b.draw(st.sampled_from(["Greater", "Less"])), [a.name, c.name], v.shape, np.bool_)
    other = _broadcast_partner(b, v)
    return b.node("Where", [cond.name, v.name, other], v.shape)


def _where(b: _Builder):
    v = _any_value(b)
    k = b.draw(st.integers(0, len(v.shape)))
    cond = b.fresh(v.shape[len(v.shape) - k:], np.bool_)
    return b.node("Where", [cond.name, v.name, _broadcast_partner(b, v)], v.shape)


# --- activations


def _activation(op, **attr_strategies):
    def build(b: _Builder):
        v = _any_value(b)
        attrs = {k: b.maybe(b.draw(s)) for k, s in attr_strategies.items()}
        return b.node(op, [v.name], v.shape, **_attrs(**attrs))
    return build


_alpha = st.sampled_from([0.1, 0.5, 2.0])


def _prelu(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 1, b.shape())
    slope = (v.shape[-1],) if b.draw(st.booleans()) else (1,)
    return b.node("PRelu", [v.name, b.weight(slope, 0.5)], v.shape)


def _clip(b: _Builder):
    v = _any_value(b)
    lo = b.maybe(b.const(np.asarray(-0.5, b.dtype)))
    hi = b.maybe(b.const(np.asarray(0.75, b.dtype)))
    names = [v.name, lo or "", hi or ""]
    while names[-1] == "":
        names.pop()
    return b.node("Clip", names, v.shape)


def _softmax(op):
    def build(b: _Builder):
        v = b.pick_or_fresh(lambda u: len(u.shape) >= 1, b.shape())
        axis = b.maybe(b.draw(st.integers(-len(v.shape), len(v.shape) - 1)))
        return b.node(op, [v.name], v.shape, **_attrs(axis=axis))
    return build


# --- matmul


def _matmul(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 1, b.shape())
    n = b.draw(st.integers(1, 4))
    k = v.shape[-1]
    w = b.weight((k, n), 1.0 / math.sqrt(k))
    return b.node("MatMul", [v.name, w], v.shape[:-1] + (n,))


def _gemm(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) == 2, b.shape(2, 2))
    trans_a, trans_b = b.maybe(1), b.maybe(1)
    m, k = v.shape[::-1] if trans_a else v.shape
    n = b.draw(st.integers(1, 4))
    w = b.weight((n, k) if trans_b else (k, n), 1.0 / math.sqrt(k))
    names = [v.name, w]
    if b.draw(st.booleans()):
        names.append(b.weight(b.draw(st.sampled_from([(n,), (1, n), (m, n), (1,)])), 0.5))
    alpha = b.maybe(b.draw(st.sampled_from([0.5, 2.0])))
    beta = b.maybe(b.draw(st.sampled_from([0.5, 2.0]))) if len(names) == 3 else None
    return b.node("Gemm", names, (m, n), **_attrs(transA=trans_a, transB=trans_b, alpha=alpha,
                                                  beta=beta))


# --- reductions


def _reduce(op, fresh=False):
    def build(b: _Builder):
        v = b.fresh(b.shape()) if fresh else b.pick_or_fresh(lambda u: len(u.shape) >= 1, b.shape())
        r = len(v.shape)
        axes = b.maybe(sorted(b.draw(st.sets(st.integers(0, r - 1), min_size=1))))
        keepdims = b.maybe(0)
        names, attrs = [v.name], {}
        if axes is not None:
            written = [a - r if b.draw(st.booleans()) else a for a in axes]
            if b.opset >= 18 or (op == "ReduceSum" and b.opset >= 13):
                names.append(b.ints(written))
            else:
                attrs["axes"] = written
        reduced = set(range(r)) if axes is None else set(axes)
        shape = tuple(1 if i in reduced else d for i, d in enumerate(v.shape)) if keepdims is None \
            else tuple(d for i, d in enumerate(v.shape) if i not in reduced)
        return b.node(op, names, shape, **_attrs(keepdims=keepdims), **attrs)
    return build


# --- shape


def _reshape(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 1, b.shape())
    total = int(np.prod(v.shape))
    options = [[total], [-1], list(v.shape[::-1]), [v.shape[0], -1], [0, -1]]
    target = b.draw(st.sampled_from(options))
    shape = np.empty(v.shape).reshape([v.shape[i] if d == 0 else d
                                       for i, d in enumerate(target)]).shape
    return b.node("Reshape", [v.name, b.ints(target)], shape)


def _transpose(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 2, b.shape(2))
    perm = b.maybe(b.draw(st.permutations(range(len(v.shape)))))
    order = perm if perm is not None else list(range(len(v.shape)))[::-1]
    return b.node("Transpose", [v.name], tuple(v.shape[i] for i in order),
                  **_attrs(perm=None if perm is None else list(perm)))


def _concat(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 1, b.shape())
    r = len(v.shape)
    axis = b.draw(st.integers(-r, r - 1))
    ax = axis % r
    others = []
    for _ in range(b.draw(st.integers(1, 2))):
        same = b.pick(lambda u: u is not v and len(u.shape) == r and all(
            d == e for i, (d, e) in enumerate(zip(u.shape, v.shape)) if i != ax))
        if same is not None and b.draw(st.booleans()):
            others.append(same)
        else:
            shape = list(v.shape)
            shape[ax] = b.draw(st.integers(1, 3))
            others.append(b.fresh(shape))
    shape = list(v.shape)
    shape[ax] += sum(o.shape[ax] for o in others)
    return b.node("Concat", [v.name] + [o.name for o in others], shape, axis=axis)


def _slice(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 1 and max(u.shape) >= 2, b.shape(min_side=2))
    r = len(v.shape)
    axes = sorted(b.draw(st.sets(st.integers(0, r - 1), min_size=1)))
    starts, ends, steps, index = [], [], [], [slice(None)] * r
    for a in axes:
        d = v.shape[a]
        step = b.draw(st.sampled_from([1, 2, -1]))
        if step > 0:
            s = b.draw(st.integers(0, d - 1))
            e = b.draw(st.integers(s + 1, d))
            e = np.iinfo(np.int64).max if e == d and b.draw(st.booleans()) else e
        else:
            s = b.draw(st.integers(0, d - 1))
            e = b.draw(st.integers(-1, s - 1))
            e = -d - 1 if e == -1 else e  # -1 would mean the last element
        s = s - d if b.draw(st.booleans()) else s
        starts.append(s), ends.append(e), steps.append(step)
        index[a] = slice(s, None if e == np.iinfo(np.int64).max else e, step)
    shape = np.empty(v.shape)[tuple(index)].shape
    names = [v.name, b.ints(starts), b.ints(ends)]
    if axes != list(range(len(axes))) or steps != [1] * len(steps) or b.draw(st.booleans()):
        names.append(b.ints(axes))
        if steps != [1] * len(steps) or b.draw(st.booleans()):
            names.append(b.ints(steps))
    return b.node("Slice", names, shape)


def _unsqueeze(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) <= 3, b.shape(max_dims=3))
    r = len(v.shape) + 1
    axis = b.draw(st.integers(-r, r - 1))
    shape = list(v.shape)
    shape.insert(axis % r, 1)
    return b.node("Unsqueeze", [v.name, b.ints([axis])], shape)


def _squeeze(b: _Builder):
    v = b.pick(lambda u: 1 in u.shape)
    if v is None:
        v = b.fresh(b.shape(max_dims=3) + (1,))
    ones = [i for i, d in enumerate(v.shape) if d == 1]
    axes = b.maybe(sorted(b.draw(st.sets(st.sampled_from(ones), min_size=1))))
    gone = set(ones if axes is None else axes)
    names = [v.name] + ([] if axes is None else [b.ints(axes)])
    return b.node("Squeeze", names, [d for i, d in enumerate(v.shape) if i not in gone])


def _flatten(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 1, b.shape())
    r = len(v.shape)
    axis = b.maybe(b.draw(st.integers(-r, r)))
    a = 1 if axis is None else axis + r if axis < 0 else axis
    return b.node("Flatten", [v.name], (int(np.prod(v.shape[:a])), int(np.prod(v.shape[a:]))),
                  **_attrs(axis=axis))


def _expand(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) <= 3, b.shape(max_dims=3))
    target = [b.draw(st.integers(1, 3)) if d == 1 else d for d in v.shape]
    if b.draw(st.booleans()):
        target.insert(0, b.draw(st.integers(1, 3)))
    return b.node("Expand", [v.name, b.ints(target)], np.broadcast_shapes(v.shape, tuple(target)))


def _tile(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 1, b.shape())
    reps = [b.draw(st.integers(1, 2)) for _ in v.shape]
    return b.node("Tile", [v.name, b.ints(reps)], [d * k for d, k in zip(v.shape, reps)])


# --- normalization

_eps = st.sampled_from([1e-3, 1e-2])


def _spread(b: _Builder, v: _Value, normalized) -> _Value:
    """``v`` plus a ramp over its ``normalized`` (trailing) axes: a helper Add before a normalization.

    An instance of equal values (a constant input, Floor's plateaus, an
    Expand) has a variance of zero, where the normalized value is the bias
    and float rounding of the mean is multiplied by 1/sqrt(epsilon), up to
    316: ONNX's reference evaluator is then 3.5e-5 off in float32. The ramp
    (0 to 1) keeps every instance's standard deviation near 0.3.
    """
    n = int(np.prod(normalized))
    if n < 2:
        return v
    ramp = np.linspace(0.0, 1.0, n).reshape(normalized).astype(b.dtype)
    return b.node("Add", [v.name, b.const(ramp, "w")], v.shape)


def _layer_norm(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 1, b.shape())
    r = len(v.shape)
    axis = b.maybe(b.draw(st.integers(-r, r - 1)))
    normalized = v.shape[(axis if axis is not None else -1) % r:]
    v = _spread(b, v, normalized)
    names = [v.name, b.weight(normalized, 0.5)]
    if b.draw(st.booleans()):
        names.append(b.weight(normalized, 0.5))
    return b.node("LayerNormalization", names, v.shape,
                  **_attrs(axis=axis, epsilon=b.maybe(b.draw(_eps))))


def _batch_norm(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 2, b.shape(2))
    c = (v.shape[1],)
    names = [v.name, b.weight(c, 0.5), b.weight(c, 0.5), b.weight(c, 0.5),
             b.weight(c, 0.5, positive=True)]
    return b.node("BatchNormalization", names, v.shape, **_attrs(epsilon=b.maybe(b.draw(_eps))))


def _instance_norm(b: _Builder):
    v = b.pick_or_fresh(lambda u: len(u.shape) >= 3 and int(np.prod(u.shape[2:])) >= 2,
                        b.shape(3, 4, min_side=2))
    c = (v.shape[1],)
    v = _spread(b, v, v.shape[2:])
    return b.node("InstanceNormalization", [v.name, b.weight(c, 0.5), b.weight(c, 0.5)], v.shape,
                  **_attrs(epsilon=b.maybe(b.draw(_eps))))


# --- convolution and pooling


def _image(b: _Builder, ranks=(3, 4)) -> _Value:
    return b.pick_or_fresh(lambda u: len(u.shape) in ranks and min(u.shape[2:]) >= 2,
                           (b.draw(st.integers(1, 2)), b.draw(st.integers(1, 3)))
                           + tuple(b.draw(st.integers(3, 5)) for _ in range(2)))


def _window(b: _Builder, spatial, dilation=True, same_pads=False, unpadded_1d_unit_steps=False):
    kernel = [b.draw(st.integers(1, min(3, s))) for s in spatial]
    strides = b.maybe([b.draw(st.integers(1, 2)) for _ in spatial])
    pads = b.maybe([b.draw(st.integers(0, k - 1)) for k in kernel] * 2)
    if same_pads and pads is not None:
        # ONNX's reference pooling (onnx 1.23) reads pads of different sizes
        # per axis in the wrong order (a 3x3 input, kernel 3x3, pads
        # [0, 1, 0, 1] gives it 2x2, not 1x3): pools pad every axis alike.
        pads = [min(pads)] * len(pads)
    dil = None
    if dilation:
        dil = b.maybe([1 if (k - 1) * 2 + 1 > s else b.draw(st.integers(1, 2))
                       for k, s in zip(kernel, spatial)])
    st_, pd, dl = strides or [1] * len(spatial), pads or [0] * 2 * len(spatial), dil or [1] * len(spatial)
    if unpadded_1d_unit_steps and len(spatial) == 1 and st_ == dl == [1]:
        # ONNX's reference MaxPool (onnx 1.16-1.23) raises IndexError on a
        # padded 1-D input with unit strides and dilations (its shared pooling
        # path): such pools get no pads.
        pads, pd = None, [0, 0]
    n = len(spatial)
    out = [(s + pd[i] + pd[i + n] - dl[i] * (kernel[i] - 1) - 1) // st_[i] + 1
           for i, s in enumerate(spatial)]
    return kernel, strides, pads, dil, out


def _conv(b: _Builder):
    v = _image(b)
    n, c, spatial = v.shape[0], v.shape[1], v.shape[2:]
    group = b.draw(st.sampled_from([g for g in (1, 2, 3) if c % g == 0]))
    m = group * b.draw(st.integers(1, 2))
    kernel, strides, pads, dil, out = _window(b, spatial)
    w = b.weight((m, c // group) + tuple(kernel), 1.0 / math.sqrt(c // group * int(np.prod(kernel))))
    names = [v.name, w] + ([b.weight((m,), 0.5)] if b.draw(st.booleans()) else [])
    return b.node("Conv", names, (n, m) + tuple(out),
                  **_attrs(kernel_shape=b.maybe(kernel), strides=strides, pads=pads, dilations=dil,
                           group=group if group > 1 else None))


def _pool(op):
    def build(b: _Builder):
        v = _image(b)
        kernel, strides, pads, dil, out = _window(b, v.shape[2:], dilation=op == "MaxPool",
                                                  same_pads=True,
                                                  unpadded_1d_unit_steps=op == "MaxPool")
        extra = {"count_include_pad": b.maybe(1)} if op == "AveragePool" else {}
        return b.node(op, [v.name], v.shape[:2] + tuple(out),
                      **_attrs(kernel_shape=kernel, strides=strides, pads=pads, dilations=dil, **extra))
    return build


def _global_pool(op):
    def build(b: _Builder):
        # ONNX's reference GlobalMaxPool (onnx 1.23) drops the channel axis
        # of a 3-D input, so it gets 4-D ones.
        v = _image(b, (3, 4) if op == "GlobalAveragePool" else (4,))
        return b.node(op, [v.name], v.shape[:2] + (1,) * (len(v.shape) - 2))
    return build


# --- control flow

_BRANCH_OPS = ("Relu", "Neg", "Tanh", "Sigmoid", "Abs")


def _if(b: _Builder):
    v = _any_value(b)
    cond = b.fresh((), np.bool_)
    elem = _elem_type(b.dtype)

    def branch(tag):
        op = b.draw(st.sampled_from(_BRANCH_OPS))
        out = b.name(f"{tag}_")
        return helper.make_graph([helper.make_node(op, [v.name], [out])], f"{tag}_branch", [],
                                 [helper.make_tensor_value_info(out, elem, list(v.shape))])

    out = b.node("If", [cond.name], v.shape, then_branch=branch("then"),
                 else_branch=branch("else"))
    b.read.add(v.name)  # the branches read it from the outer scope
    return out


def _loop(b: _Builder):
    v = _any_value(b)
    trips = b.const(np.asarray(b.draw(st.integers(1, 3)), np.int64), "k")
    elem, shape = _elem_type(b.dtype), list(v.shape)
    op = b.draw(st.sampled_from(("Tanh", "Sin", "Sigmoid")))
    i, c_in, x_in = b.name("i"), b.name("cond"), b.name("carried")
    c_out, x_out = b.name("cond"), b.name("carried")
    body = helper.make_graph(
        [helper.make_node("Identity", [c_in], [c_out]), helper.make_node(op, [x_in], [x_out])],
        "loop_body",
        [helper.make_tensor_value_info(i, TensorProto.INT64, []),
         helper.make_tensor_value_info(c_in, TensorProto.BOOL, []),
         helper.make_tensor_value_info(x_in, elem, shape)],
        [helper.make_tensor_value_info(c_out, TensorProto.BOOL, []),
         helper.make_tensor_value_info(x_out, elem, shape)])
    # The loop condition is given, not left out: ONNX's reference evaluator
    # (onnx 1.23) runs no iteration when the optional cond input is absent.
    cond = b.const(np.asarray(True), "k")
    return b.node("Loop", [trips, cond, v.name], v.shape, body=body)


# --------------------------------------------------------------------------- the op table

# family -> op type -> (builder, first opset). Within a family the first op
# is the one shrinking moves to.
OP_FAMILIES = {
    "elementwise": {
        "Add": (_binary("Add"), 7), "Sub": (_binary("Sub"), 7), "Mul": (_binary("Mul"), 7),
        "Div": (_binary("Div", fresh_right=True), 7), "Max": (_binary("Max"), 8),
        "Min": (_binary("Min"), 8), "Pow": (_pow, 7),
        "Neg": (_unary("Neg"), 6), "Abs": (_unary("Abs"), 6), "Identity": (_unary("Identity"), 1),
        "Exp": (_unary("Exp", True), 6), "Log": (_unary("Log", True), 6),
        "Sqrt": (_unary("Sqrt", True), 6), "Reciprocal": (_unary("Reciprocal", True), 6),
        "Sin": (_unary("Sin"), 7), "Cos": (_unary("Cos"), 7), "Erf": (_unary("Erf"), 9),
        "Floor": (_unary("Floor", True), 6), "Ceil": (_unary("Ceil", True), 6),
        "Round": (_unary("Round", True), 11), "Sign": (_unary("Sign", True), 9),
    },
    "activation": {
        "Relu": (_unary("Relu"), 6), "Tanh": (_unary("Tanh"), 6), "Sigmoid": (_unary("Sigmoid"), 6),
        "LeakyRelu": (_activation("LeakyRelu", alpha=_alpha), 6),
        "Elu": (_activation("Elu", alpha=_alpha), 6),
        "Selu": (_activation("Selu", alpha=st.sampled_from([1.5]), gamma=st.sampled_from([1.2])), 6),
        "Celu": (_activation("Celu", alpha=_alpha), 12),
        "HardSigmoid": (_activation("HardSigmoid", alpha=st.sampled_from([0.25]),
                                    beta=st.sampled_from([0.4])), 6),
        "HardSwish": (_unary("HardSwish"), 14),
        # ONNX's reference evaluator returns a numpy scalar, a TypeError, from a 0-d
        # Softsign (and, in onnx 1.16, Softplus and Mish, which it computes with Softplus).
        "Softplus": (_unary("Softplus", min_dims=1), 1),
        "Softsign": (_unary("Softsign", min_dims=1), 1), "Mish": (_unary("Mish", min_dims=1), 18),
        "Gelu": (_activation("Gelu", approximate=st.sampled_from(["tanh"])), 20),
        "PRelu": (_prelu, 9), "Clip": (_clip, 13),
        "Softmax": (_softmax("Softmax"), 13), "LogSoftmax": (_softmax("LogSoftmax"), 13),
    },
    "matmul": {"MatMul": (_matmul, 9), "Gemm": (_gemm, 11)},
    "reduction": {
        "ReduceSum": (_reduce("ReduceSum"), 13), "ReduceMean": (_reduce("ReduceMean"), 13),
        "ReduceMax": (_reduce("ReduceMax"), 13), "ReduceMin": (_reduce("ReduceMin"), 13),
        "ReduceProd": (_reduce("ReduceProd", True), 13),
        "ReduceSumSquare": (_reduce("ReduceSumSquare"), 13),
        "ReduceLogSumExp": (_reduce("ReduceLogSumExp"), 13),
        "ReduceLogSum": (_reduce("ReduceLogSum", True), 13),
    },
    "shape": {
        "Reshape": (_reshape, 13), "Transpose": (_transpose, 13), "Concat": (_concat, 13),
        "Slice": (_slice, 13), "Unsqueeze": (_unsqueeze, 13), "Squeeze": (_squeeze, 13),
        "Flatten": (_flatten, 13), "Expand": (_expand, 13), "Tile": (_tile, 13),
    },
    "normalization": {
        "LayerNormalization": (_layer_norm, 17), "BatchNormalization": (_batch_norm, 15),
        "InstanceNormalization": (_instance_norm, 6),
    },
    "convolution": {
        "Conv": (_conv, 11), "MaxPool": (_pool("MaxPool"), 12),
        "AveragePool": (_pool("AveragePool"), 11),
        "GlobalAveragePool": (_global_pool("GlobalAveragePool"), 1),
        "GlobalMaxPool": (_global_pool("GlobalMaxPool"), 1),
    },
    "control": {"Where": (_where, 16), "Greater": (_compare_where, 13), "If": (_if, 13),
                "Loop": (_loop, 13)},
}

# Ops a builder writes besides the one it is named for.
_HELPER_OPS = {"Greater": ("Less", "Where"), "If": _BRANCH_OPS, "Loop": ("Tanh", "Sin", "Sigmoid"),
               "LayerNormalization": ("Add",), "InstanceNormalization": ("Add",)}


def _finish(b: _Builder) -> onnx.ModelProto:
    produced = [o for n in b.nodes for o in n.output]
    values = {v.name: v for v in b.pool}
    values.update({o.name: o for o in _all_outputs(b)})
    outputs = [values[o] for o in produced if o not in b.read]
    used_inputs = [v for v in b.inputs if v.name in b.read]
    if not used_inputs:  # every model has a graph input
        used_inputs = [b.inputs[0]]
        outputs = outputs or [b.inputs[0]]
    graph = helper.make_graph(
        b.nodes, "random_graph",
        [helper.make_tensor_value_info(v.name, _elem_type(v.dtype), list(v.shape))
         for v in used_inputs],
        [helper.make_tensor_value_info(v.name, _elem_type(v.dtype), list(v.shape))
         for v in outputs],
        b.inits)
    return _make_model(graph, {"": b.opset})


def _all_outputs(b: _Builder):
    # non-float outputs (the bool of a comparison) are not in the pool
    for n in b.nodes:
        if n.op_type in ("Greater", "Less"):
            yield _Value(n.output[0], (), np.dtype(np.bool_))
