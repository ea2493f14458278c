"""Gradient rules of MatMul, Gemm, Einsum, Conv, ConvTranspose, AffineGrid, Col2Im, DFT and STFT.

Part of the training layer: it imports onnx, the graph layer's pad helper and
the rules' shared helpers only.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from jaxort.graph.numerics import auto_pads
from jaxort.training.artifacts.gradient._common import (
    _MS_DOMAIN,
    _attrs,
    _error,
    _filled,
    _ms_node,
    _scalar,
    _text,
    _unbroadcast,
    _unbroadcast_at_run_time,
)


def _matmul(em, node, dys, needs):
    # As ORT's builder: Gemm for 2-D operands; else FusedMatMul with a transposed operand,
    # summed over the batch dimensions an operand was broadcast along, and a 2-D B's
    # gradient as one Gemm of A and dY made 2-D.
    a, b = node.input
    dy = dys[0]
    sa, sb, sy = em.dims(a), em.dims(b), em.dims(node.output[0])
    if sa is None or sb is None or sy is None or len(sa) < 2 or len(sb) < 2:
        raise _error(node, "has a 1-D or unknown-rank input")
    if len(sa) == 2 and len(sb) == 2:
        return [em.op("Gemm", [dy, b], beta=0.0, transB=1) if needs[0] else None,
                em.op("Gemm", [a, dy], beta=0.0, transA=1) if needs[1] else None]

    def batch_sum(full, x, sx):
        # Sum over the batch dimensions x was broadcast along (decided at run time
        # unless x's batch dimensions are statically the output's).
        lead = len(sy) - len(sx)
        if lead == 0 and sx[:-2] == sy[:-2]:
            return full
        return _unbroadcast_at_run_time(em, full, x, full, lead)

    da = db = None
    if needs[0]:
        da = batch_sum(em.op("FusedMatMul", [dy, b], domain=_MS_DOMAIN, transB=1), a, sa)
    if needs[1]:
        if len(sb) == 2:
            # a: [..., m, k] -> [M, k]; dy: [..., m, n] -> [M, n]; db = a^T dy.
            a2 = em.op("Reshape", [a, em.op("Concat", [em.ints([-1]), _last_dim(em, a)], axis=0)])
            dy2 = em.op("Reshape", [dy, em.op("Concat", [em.ints([-1]), _last_dim(em, dy)], axis=0)])
            db = em.op("Gemm", [a2, dy2], transA=1)
        else:
            db = batch_sum(em.op("FusedMatMul", [a, dy], domain=_MS_DOMAIN, transA=1), b, sb)
    return [da, db]


def _last_dim(em, x):
    return em.op("Slice", [em.op("Shape", [x]), em.ints([-1]), em.ints([np.iinfo(np.int64).max])])


def _gemm(em, node, dys, needs):
    a, b = node.input[:2]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    attrs = _attrs(node)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    ta, tb = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    dy = dys[0]
    out = [None] * len(node.input)
    if needs[0]:
        if ta:
            out[0] = em.op("Gemm", [b, dy], alpha=alpha, transA=tb, transB=1)
        else:
            out[0] = em.op("Gemm", [dy, b], alpha=alpha, transA=0, transB=1 - tb)
    if needs[1]:
        if tb:
            out[1] = em.op("Gemm", [dy, a], alpha=alpha, transA=1, transB=ta)
        else:
            out[1] = em.op("Gemm", [a, dy], alpha=alpha, transA=1 - ta, transB=0)
    if c is not None and needs[2]:
        dc = dy if beta == 1.0 else em.op("Mul", [dy, _scalar(em, beta, node.output[0])])
        out[2] = _unbroadcast(em, node, dc, c, node.output[0])
    return out


def _conv(em, node, dys, needs):
    # ConvGrad(dY, X, W) -> dX, dW, dB, with the Conv's attributes; "" where no gradient is needed.
    outs = [em.name("ConvGrad") if need else "" for need in needs]
    attrs = list(node.attribute)
    auto_pad = _attrs(node).get("auto_pad", b"NOTSET")
    auto_pad = _text(auto_pad)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # ORT 1.19.2's ConvGrad gets both gradients wrong with auto_pad SAME_* (as ORT's own
        # builder writes it; test_ort_conv_grad_is_wrong_with_auto_pad), so the pads are written out.
        attrs = [a for a in attrs if a.name not in ("auto_pad", "pads")]
        attrs.append(helper.make_attribute("pads", _same_pads(em, node, auto_pad)))
    _ms_node(em, "ConvGrad", [dys[0], node.input[0], node.input[1]], outs, attrs)
    return [o or None for o in outs]


def _conv_transpose(em, node, dys, needs):
    # ConvTranspose(X, W) is the adjoint in U of Conv(U, W) with the same attributes, so
    # dX = Conv(dY, W) and dW is that Conv's filter gradient with X as its output gradient:
    # ConvGrad(X, dY, W)'s second output. ORT 1.19.2 has no rule for ConvTranspose.
    attrs = _attrs(node)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    if auto_pad not in (b"NOTSET", "NOTSET") or "output_shape" in attrs:
        raise _error(node, "uses auto_pad or output_shape; the rule needs explicit pads")
    kept = [a for a in node.attribute if a.name in ("kernel_shape", "strides", "pads", "dilations", "group")]
    x, w = node.input[:2]
    dx = em.op("Conv", [dys[0], w], **{a.name: helper.get_attribute_value(a) for a in kept}) if needs[0] else None
    dw = None
    if needs[1]:
        dw = em.name("ConvGrad")
        _ms_node(em, "ConvGrad", [x, dys[0], w], ["", dw, ""], kept)
    db = None
    if len(needs) > 2 and needs[2]:
        dims = em.dims(node.output[0])
        if dims is None:
            raise _error(node, "has an output of unknown rank")
        db = em.op("ReduceSum", [dys[0], em.ints([0] + list(range(2, len(dims))))], keepdims=0)
    return [dx, dw] + ([db] if len(node.input) > 2 else [])


def _einsum(em, node, dys, needs):
    # Each operand's gradient is the Einsum of dY with the other operands, back to the
    # operand's subscripts: every letter of it must be in the output or another operand, once.
    equation = _attrs(node)["equation"]
    equation = _text(equation).replace(" ", "")
    if "->" not in equation or "." in equation:
        raise _error(node, f"has the equation {equation!r}; the rule needs an explicit output and no ellipsis")
    operands, out = equation.split("->")
    terms = operands.split(",")
    grads = []
    for i, (term, need) in enumerate(zip(terms, needs)):
        others = terms[:i] + terms[i + 1:]
        seen = set(out).union(*map(set, others))
        if need and (len(set(term)) != len(term) or not set(term) <= seen):
            raise _error(node, f"has operand {term!r} of {equation!r}: a letter repeated in it or summed in it "
                               "alone has no rule")
        inputs = [dys[0]] + [x for j, x in enumerate(node.input) if j != i]
        grads.append(em.op("Einsum", inputs, equation=",".join([out] + others) + "->" + term) if need else None)
    return grads


def _same_pads(em, node, auto_pad: str) -> list:
    """The explicit pads (begins, then ends) of a Conv with auto_pad SAME_UPPER or SAME_LOWER."""
    sx, sw = em.dims(node.input[0]), em.dims(node.input[1])
    if not (sx and sw and all(isinstance(d, int) and d > 0 for d in sx[2:] + sw[2:])):
        raise _error(node, f"uses auto_pad={auto_pad} without static input and weight spatial shapes")
    n = len(sx) - 2
    attrs = _attrs(node)
    kernel = list(attrs.get("kernel_shape", sw[2:]))
    strides, dilations = list(attrs.get("strides", [1] * n)), list(attrs.get("dilations", [1] * n))
    effective = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    pairs = auto_pads(list(sx[2:]), effective, strides, auto_pad, None)
    return [lo for lo, _ in pairs] + [hi for _, hi in pairs]


#: op type -> rule.
def _affine_grid(em, node, dys, needs):
    # Grid[n, p] = theta[n] @ (B[p], 1), B the base grid of every output point p (AffineGrid of
    # the identity): dTheta[n] = sum over p of dGrid[n, p]^T (B[p], 1). ORT 1.19.2 has no rule.
    theta, size = node.input
    dims = em.dims(theta)
    if dims is None or len(dims) != 3 or not isinstance(dims[1], int):
        raise _error(node, f"has a theta of shape {dims}, not [N, 2, 3] or [N, 3, 4]")
    k = dims[1]
    t = em.elem_type(theta)
    one_sample = em.op("Concat", [em.ints([1]), em.op("Slice", [size, em.ints([1]), em.ints([k + 2])])], axis=0)
    base = em.op("AffineGrid", [em.const(np.eye(k, k + 1)[None], t), one_sample],
                 align_corners=int(_attrs(node).get("align_corners", 0)))
    homogeneous = em.op("Pad", [base, em.ints([0] * (2 * k + 3) + [1]), em.const(1.0, t)])
    points = em.op("Reshape", [homogeneous, em.ints([-1, k + 1])])
    d_grid = em.op("Transpose", [em.op("Reshape", [dys[0], em.ints([0, -1, k])])], perm=[0, 2, 1])
    return [em.op("MatMul", [d_grid, points]), None]


def _col2im(em, node, dys, needs):
    # Col2Im adds each column back into its block of the image; its transpose reads the
    # blocks out again (im2col), a Conv whose one-hot kernel copies channel c at block offset
    # i into output channel c * prod(block) + i. ORT 1.19.2 has no rule.
    x, _, block = node.input
    dims = em.dims(x)
    block = em.static(block)
    if block is None:
        raise _error(node, "has a block_shape that is not constant")
    block = [int(b) for b in block.reshape(-1)]
    size = int(np.prod(block))
    if dims is None or not isinstance(dims[1], int) or dims[1] % size:
        raise _error(node, f"has an input of shape {dims}, not [N, C * {size}, L] with C known")
    channels = dims[1] // size
    kernel = np.zeros((channels, size, channels, size), np.float32)
    kernel[np.arange(channels)[:, None], np.arange(size)[None, :], np.arange(channels)[:, None],
           np.arange(size)[None, :]] = 1.0
    attrs = _attrs(node)
    n = len(block)
    conv = em.op("Conv", [dys[0], em.const(kernel.reshape(channels * size, channels, *block), em.elem_type(x))],
                 dilations=list(attrs.get("dilations", [1] * n)), pads=list(attrs.get("pads", [0] * 2 * n)),
                 strides=list(attrs.get("strides", [1] * n)))
    return [em.op("Reshape", [conv, em.op("Shape", [x])]), None, None]


def _dft(em, node, dys, needs):
    # A DFT is the linear map W (W[k, j] = exp(-2 pi i k j / n)); its adjoint on (real, imag)
    # pairs is conj(W) = n * the inverse DFT, and the inverse DFT's (conj(W) / n) is W / n: so
    # dX = n * IDFT(dY), or DFT(dY) / n, its real part for a real X. A one-sided DFT's bins
    # are the first n // 2 + 1: dY is zero-padded back to n first. ORT 1.19.2 has no rule.
    x = node.input[0]
    dims = em.dims(x)
    attrs = _attrs(node)
    if em.opset >= 20:
        axis = -2
        if len(node.input) > 2 and node.input[2]:
            static = em.static(node.input[2])
            if static is None:
                raise _error(node, "has an axis that is not constant")
            axis = int(static.reshape(-1)[0])
    else:
        axis = int(attrs.get("axis", 1))
    if dims is None or not isinstance(dims[-1], int):
        raise _error(node, "has an input of unknown rank or complex dimension")
    axis %= len(dims)
    n = dims[axis]
    if len(node.input) > 1 and node.input[1]:
        length = em.static(node.input[1])
        if length is None or not isinstance(n, int) or int(length.reshape(-1)[0]) != n:
            raise _error(node, "has a dft_length other than its input's length; the rule takes none")
    inverse, onesided = int(attrs.get("inverse", 0)), int(attrs.get("onesided", 0))
    if inverse and onesided:
        raise _error(node, "is a one-sided inverse DFT; the rule takes the others")
    if onesided and not isinstance(n, int):
        raise _error(node, "is one-sided over an axis of unknown length")
    count = em.op("Cast", [em.op("Gather", [em.op("Shape", [x]), em.ints([axis])])], to=em.elem_type(x))
    dx = _dft_adjoint(em, dys[0], axis, len(dims), count, n, inverse=bool(inverse), onesided=bool(onesided),
                      real=dims[-1] == 1)
    return [dx] + [None] * (len(node.input) - 1)


def _dft_adjoint(em, dy, axis: int, rank: int, count: str, n, *, inverse=False, onesided=False, real=False):
    """The adjoint of a DFT over ``axis`` (of ``n`` points, ``count`` as a tensor) applied to dY
    (``[..., 2]``): n * IDFT(dY), or DFT(dY) / n for an inverse DFT; one-sided bins zero-padded
    back to n first; the real part for a real input. DFT-20 takes the axis as an input."""
    if onesided:
        pads = [0] * (2 * rank)
        pads[rank + axis] = n - (n // 2 + 1)
        dy = em.op("Pad", [dy, em.ints(pads)])
    if em.opset >= 20:
        back = em.op("DFT", [dy, "", em.const(np.int64(axis), TensorProto.INT64)], inverse=int(not inverse))
    else:
        back = em.op("DFT", [dy], axis=axis, inverse=int(not inverse))
    dx = em.op("Div" if inverse else "Mul", [back, count])
    return em.op("Slice", [dx, em.ints([0]), em.ints([1]), em.ints([-1])]) if real else dx


def _stft(em, node, dys, needs):
    # Frames of the signal, times the window, then a DFT each: back through the DFT's adjoint
    # (n times the inverse DFT of dY, one-sided bins zero-padded back), times the window, and
    # each frame added back where it was read (a ScatterElements "add" at the frames' fixed
    # positions). Static frame step, frame length and signal length; a window as long as the
    # frame. ORT 1.19.2 has no rule.
    signal, step = node.input[:2]
    window = node.input[2] if len(node.input) > 2 else ""
    if len(node.input) > 2 and window and needs[2]:
        raise _error(node, "has a window that depends on a trainable parameter")
    dims = em.dims(signal)
    statics = [em.static(v) if v else None for v in (step, node.input[3] if len(node.input) > 3 else "")]
    window_dims = em.dims(window) if window else None
    if dims is None or not all(isinstance(d, int) for d in dims[1:]) or statics[0] is None:
        raise _error(node, "needs a constant frame_step and a signal of known length")
    step = int(statics[0].reshape(-1)[0])
    n = int(statics[1].reshape(-1)[0]) if statics[1] is not None else (
        window_dims[0] if window_dims and isinstance(window_dims[0], int) else None)
    if n is None or (window_dims is not None and window_dims[0] != n):
        raise _error(node, "needs a constant frame_length (or a window of known length) as long as its window")
    length, channels = dims[1], dims[2]
    frames = 1 + (length - n) // step
    back = _dft_adjoint(em, dys[0], 2, 4, em.const(float(n), em.elem_type(signal)), n,
                        onesided=bool(int(_attrs(node).get("onesided", 1))), real=channels == 1)  # [B, F, n, c]
    if window:
        back = em.op("Mul", [back, em.op("Reshape", [window, em.ints([1, 1, n, 1])])])
    updates = em.op("Reshape", [back, em.ints([0, frames * n, channels])])
    where = (np.arange(frames)[:, None] * step + np.arange(n)[None, :]).reshape(1, frames * n, 1)
    indices = em.op("Expand", [em.const(where, TensorProto.INT64), em.op("Shape", [updates])])
    return [em.op("ScatterElements", [_filled(em, 0.0, signal), indices, updates], axis=1, reduction="add")] + \
        [None] * (len(node.input) - 1)


def _det(em, node, dys, needs):
    # d det(A) / dA is A's cofactor matrix, C[i, j] = (-1)^(i + j) det(A without row i and
    # column j): exact where A is singular too (det * inv(A)^T is not defined there). The
    # minors are gathered with constant indices, so the matrices' size must be known.
    x = node.input[0]
    dims = em.dims(x)
    if dims is None or not isinstance(dims[-1], int):
        raise _error(node, "has matrices of unknown size")
    n, rank = dims[-1], len(dims)
    dy = em.op("Unsqueeze", [dys[0], em.ints([rank - 2, rank - 1])])
    if n == 1:
        return [em.op("Expand", [dy, em.op("Shape", [x])])]
    others = np.array([[j for j in range(n) if j != i] for i in range(n)], np.int64)
    index = em.const(others, TensorProto.INT64)
    rows = em.op("Gather", [x, index], axis=rank - 2)  # [..., i, n - 1, n]
    minors = em.op("Gather", [rows, index], axis=rank)  # [..., i, n - 1, j, n - 1]
    batch = list(range(rank - 2))
    minors = em.op("Transpose", [minors], perm=batch + [rank - 2, rank, rank - 1, rank + 1])
    signs = em.const((-1.0) ** np.add.outer(np.arange(n), np.arange(n)), em.elem_type(x))
    return [em.op("Mul", [em.op("Mul", [em.op("Det", [minors]), signs]), dy])]


RULES: dict = {"MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "ConvTranspose": _conv_transpose,
               "Einsum": _einsum, "AffineGrid": _affine_grid, "Col2Im": _col2im, "DFT": _dft, "STFT": _stft,
               "Det": _det}
