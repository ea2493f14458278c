"""Resize and Upsample (ops/image.py) against ONNX's reference evaluator.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from hypothesis import strategies as st

from ._harness import (
    OLD_REFERENCE, OpCase, check, node, run_jax, table_tests, tensor_grad_inputs,
    tensor_gradient_test
)
from ._strategies import i64, values

COVERED_OPS = {
    "Resize", "Upsample",
}


_CTM = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_crop_and_resize"]


@st.composite
def s_resize(draw):
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    dtype = np.float32 if mode != "nearest" else draw(st.sampled_from([np.float32,
                                                                        np.float64,
                                                                        np.uint8, np.int32]))
    x = values(draw, (1, draw(st.integers(1, 2)), draw(st.integers(1, 5)),
                      draw(st.integers(1, 5))), dtype)
    ctm = draw(st.sampled_from(_CTM))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(["round_prefer_floor", "round_prefer_ceil",
                                                      "floor", "ceil"]))
    elif draw(st.booleans()):
        attrs["antialias"] = 1
    if mode == "cubic":
        attrs["cubic_coeff_a"] = draw(st.sampled_from([-0.5, -0.75]))
        attrs["exclude_outside"] = draw(st.sampled_from([0, 1]))
    axes = [2, 3] if draw(st.booleans()) else None
    if axes is not None:
        attrs["axes"] = axes if draw(st.booleans()) else [3, 2]
        axes = attrs["axes"]
    n = 4 if axes is None else 2
    roi = None
    if ctm == "tf_crop_and_resize":
        lo = [draw(st.sampled_from([0.0, 0.2, -0.3])) for _ in range(n)]
        hi = [draw(st.sampled_from([1.0, 0.7, 1.2])) for _ in range(n)]
        roi = np.array(lo + hi, np.float32)
        attrs["extrapolation_value"] = draw(st.sampled_from([0.0, 7.5]))
    if draw(st.booleans()):
        sc = [draw(st.sampled_from([0.5, 0.6, 1.0, 1.5, 2.0, 2.5])) for _ in range(n)]
        if axes is None:
            sc[0] = sc[1] = 1.0
        inputs = [("x", x, False), ("r", roi, True), ("s", np.array(sc, np.float32), True)]
    else:
        dims = [x.shape[a] for a in (axes or range(4))]
        sz = [draw(st.integers(1, 8)) for _ in range(n)]
        if axes is None:
            sz[0], sz[1] = dims[0], dims[1]
            if ctm != "tf_crop_and_resize" and draw(st.booleans()):
                attrs["keep_aspect_ratio_policy"] = draw(st.sampled_from(["not_larger",
                                                                          "not_smaller"]))
                attrs["axes"] = [2, 3]
                sz = sz[2:]
                if roi is not None:
                    roi = np.concatenate([roi[2:4], roi[6:8]])
        inputs = [("x", x, False), ("r", roi, True), ("s", None, True),
                  ("z", i64(sz), True)]
    return node("Resize", inputs, attrs, opset=19)


@st.composite
def s_upsample(draw):
    x = values(draw, (1, 2, draw(st.integers(1, 4)), draw(st.integers(1, 4))),
               draw(st.sampled_from([np.float32, np.int64])))
    sc = np.array([1, 1, draw(st.integers(1, 3)), draw(st.integers(1, 3))], np.float32)
    return node("Upsample", [("x", x, False), ("s", sc, True)], {"mode": "nearest"}, opset=9)


CASES = [
    OpCase("Resize", s_resize(), scale=10, max_examples=8),
    OpCase("Upsample", s_upsample(), max_examples=8),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)


# --------------------------------------------------------------------------- gradients


def _grad_case(name):
    rng, x, x4 = tensor_grad_inputs()
    if name == "Resize":
        return node(name, [("x", x4, False), ("r", None, True),
                           ("s", np.array([1, 1, 1.7, 0.6], np.float32), True)],
                    {"mode": "linear", "antialias": 1}, opset=19), (0,)
    raise KeyError(name)

test_gradient_finite_differences = tensor_gradient_test(_grad_case, ['Resize'])


# --------------------------------------------------------------------------- examples


def test_resize_11_tf_half_pixel_for_nn():
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    (y,) = run_jax(node("Resize", [("x", x, False), ("r", np.array([], np.float32), True),
                                   ("s", np.array([1, 1, 1, 2], np.float32), True)],
                        {"mode": "nearest", "coordinate_transformation_mode":
                         "tf_half_pixel_for_nn"}, opset=11))
    assert y[0, 0, 0].tolist() == [0, 1, 1, 2, 2, 3, 3, 3]


def test_resize_modes_exhaustive():
    x = np.random.default_rng(0).standard_normal((1, 1, 4, 5)).astype(np.float32)
    for mode in ["nearest", "linear", "cubic"]:
        for ctm in _CTM[:-1]:
            for sc in ([1, 1, 0.6, 1.7], [1, 1, 2.0, 0.5]):
                attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
                case = node("Resize", [("x", x, False), ("r", None, True),
                                       ("s", np.array(sc, np.float32), True)], attrs, opset=19)
                check(case, 1)


def test_resize_antialias_downsample():
    x = np.random.default_rng(1).standard_normal((1, 1, 9, 7)).astype(np.float32)
    for mode in ["linear", "cubic"]:
        case = node("Resize", [("x", x, False), ("r", None, True),
                               ("s", np.array([1, 1, 0.4, 0.6], np.float32), True)],
                    {"mode": mode, "antialias": 1}, opset=18)
        check(case, 1)


def test_resize_11_and_13_forms():
    if OLD_REFERENCE:
        pytest.skip(f"onnx {onnx.__version__}'s reference Resize indexes the empty roi that "
                    "opset 11/13 use for 'no roi' (IndexError); fixed in onnx 1.17")
    x = np.random.default_rng(2).standard_normal((1, 1, 3, 4)).astype(np.float32)
    sizes = i64([1, 1, 5, 2])
    for opset in (11, 13):
        case = node("Resize", [("x", x, False), ("r", np.array([], np.float32), True),
                               ("s", np.array([], np.float32), True), ("z", sizes, True)],
                    {"mode": "linear"}, opset=opset)
        check(case, 1)


def test_resize_10_and_upsample_legacy_nearest():
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4)
    # Upsampling floors the source coordinate; downsampling takes its ceiling.
    up = node("Resize", [("x", x, False), ("s", np.array([1, 1, 2, 1.5], np.float32), True)],
              {"mode": "nearest"}, opset=10)
    (y,) = run_jax(up)
    assert y.shape == (1, 1, 4, 6)
    np.testing.assert_array_equal(y[0, 0, :, :], x[0, 0][[0, 0, 1, 1]][:, [0, 0, 1, 2, 2, 3]])
    down = node("Resize", [("x", x, False), ("s", np.array([1, 1, 1, 0.6], np.float32), True)],
                {"mode": "nearest"}, opset=10)
    np.testing.assert_array_equal(run_jax(down)[0], x[..., [0, 2]])
    lin = node("Upsample", [("x", x, False)], {"mode": "linear", "scales": [1.0, 1.0, 1.0, 2.0]},
               opset=7)
    np.testing.assert_allclose(run_jax(lin)[0][0, 0, 0],
                               [0, 0.5, 1, 1.5, 2, 2.5, 3, 3], rtol=1e-6)


def test_resize_integer_and_bfloat16_linear_saturate():
    x = np.array([[[[0, 255], [255, 0]]]], np.uint8)
    case = node("Resize", [("x", x, False), ("r", None, True),
                           ("s", np.array([1, 1, 1.5, 1.5], np.float32), True)],
                {"mode": "cubic"}, opset=19)
    if not OLD_REFERENCE:  # onnx < 1.17's reference wraps integer results, no saturation
        check(case)
    (y,) = run_jax(node("Resize", [("x", x.astype(jnp.bfloat16), False), ("r", None, True),
                                   ("s", np.array([1, 1, 2, 2], np.float32), True)],
                        {"mode": "linear"}, opset=19))
    assert y.dtype == jnp.bfloat16 and y.shape == (1, 1, 4, 4)
