"""Resize, Upsample and ImageDecoder (ops/image.py) against ONNX's reference evaluator;
ImageDecoder also against the pixels encoded losslessly.
"""

from __future__ import annotations

import io
import sys

import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from hypothesis import strategies as st

from jaxort.errors import OpError, StaticValueError
from jaxort.testing import NodeCase

from ._harness import (
    OLD_REFERENCE, OpCase, check, node, require_opset, run_jax, table_tests, tensor_grad_inputs,
    tensor_gradient_test
)
from ._strategies import i64, values

COVERED_OPS = {
    "ImageDecoder", "Resize", "Upsample",
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


def _pil():
    """Pillow's Image module; the ImageDecoder tests skip without it (jaxort[image])."""
    return pytest.importorskip("PIL.Image", reason="ImageDecoder decodes with Pillow "
                               "(pip install 'jaxort[image]')")


# Formats Pillow writes; JPEG and lossy WebP decode to other pixels than were encoded.
_FORMATS = {"PNG": {}, "BMP": {}, "TIFF": {}, "PPM": {}, "JPEG": {"quality": 90},
            "WEBP": {"quality": 80}}


def _encode(pixels: np.ndarray, fmt: str) -> np.ndarray:
    buf = io.BytesIO()
    _pil().fromarray(pixels).save(buf, format=fmt, **_FORMATS[fmt])
    return np.frombuffer(buf.getvalue(), np.uint8).copy()


@st.composite
def s_image_decoder(draw):
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    pixels = values(draw, (h, w, 3), np.uint8, 0, 255)
    fmt = draw(st.sampled_from(sorted(_FORMATS)))
    attrs = {"pixel_format": draw(st.sampled_from(["RGB", "BGR", "Grayscale"]))}
    return node("ImageDecoder", [("encoded", _encode(pixels, fmt), True)], attrs, opset=20)


CASES = [
    OpCase("ImageDecoder", s_image_decoder(), scale=0, min_opset=20, max_examples=12),
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


# --------------------------------------------------------------------------- ImageDecoder


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF", "PPM"])
def test_image_decoder_lossless_formats_give_back_the_pixels(fmt):
    require_opset("ImageDecoder", 20)
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    encoded = _encode(pixels, fmt)
    for pixel_format, expected in (("RGB", pixels), ("BGR", pixels[:, :, ::-1])):
        (got,) = run_jax(NodeCase("ImageDecoder", (encoded,), {"pixel_format": pixel_format},
                                  20, initializers=(0,)))
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, expected)


def test_image_decoder_gives_three_channels_for_a_gray_image():
    # The spec's RGB output is [H, W, 3] whatever the file holds (the reference passes a
    # gray image through as [H, W]).
    require_opset("ImageDecoder", 20)
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    buf = io.BytesIO()
    _pil().fromarray(gray, mode="L").save(buf, format="PNG")
    encoded = np.frombuffer(buf.getvalue(), np.uint8).copy()
    (rgb,) = run_jax(NodeCase("ImageDecoder", (encoded,), {"pixel_format": "RGB"}, 20,
                              initializers=(0,)))
    np.testing.assert_array_equal(rgb, np.repeat(gray[:, :, None], 3, axis=2))
    (g,) = run_jax(NodeCase("ImageDecoder", (encoded,), {"pixel_format": "Grayscale"}, 20,
                            initializers=(0,)))
    np.testing.assert_array_equal(g, gray[:, :, None])


def test_image_decoder_errors():
    require_opset("ImageDecoder", 20)
    encoded = _encode(np.zeros((2, 2, 3), np.uint8), "PNG")
    with pytest.raises(StaticValueError, match=r"ImageDecoder.*'encoded_stream'.*shape depends"):
        run_jax(NodeCase("ImageDecoder", (encoded,), {"pixel_format": "RGB"}, 20))
    with pytest.raises(OpError, match=r"ImageDecoder.*cannot decode"):
        run_jax(NodeCase("ImageDecoder", (encoded[:8],), {"pixel_format": "RGB"}, 20,
                         initializers=(0,)))


def test_image_decoder_without_pillow_names_the_extra(monkeypatch):
    require_opset("ImageDecoder", 20)
    encoded = _encode(np.zeros((2, 2, 3), np.uint8), "PNG")
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # import PIL.Image now fails
    with pytest.raises(OpError, match=r"Pillow.*pip install 'jaxort\[image\]'"):
        run_jax(NodeCase("ImageDecoder", (encoded,), {"pixel_format": "RGB"}, 20,
                         initializers=(0,)))
