"""GridSample, AffineGrid and RoiAlign (ops/sampling.py) against ONNX's reference evaluator.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ._harness import Example, F32, I64, ONNX_OPSET, OpCase, table_tests
from ._strategies import arr, floats

COVERED_OPS = {
    "AffineGrid", "GridSample", "RoiAlign",
}


@st.composite
def grid_sample_case(draw):
    dt = F32  # the reference denormalizes coordinates in float32
    nd = draw(st.sampled_from([2, 2, 3]))
    x = arr(draw, dt, (1, draw(st.integers(1, 2))) + tuple(draw(st.integers(2, 4))
                                                          for _ in range(nd)))
    grid = arr(draw, dt, (1,) + tuple(draw(st.integers(1, 3)) for _ in range(nd)) + (nd,),
               -1.3, 1.3)
    modes = ["linear", "nearest"] + (["cubic"] if nd == 2 else [])
    attrs = dict(mode=draw(st.sampled_from(modes)),
                 padding_mode=draw(st.sampled_from(["zeros", "border", "reflection"])),
                 align_corners=int(draw(st.booleans())))
    # Opset 20 brought N-d grids and these mode names; 22 only adds types.
    return Example((x, grid), attrs, min(22, ONNX_OPSET))


@st.composite
def affine_grid_case(draw):
    dt = F32  # the reference returns float32 for float64 theta
    nd = draw(st.sampled_from([2, 3]))
    n = draw(st.integers(1, 2))
    size = np.array([n, 1] + [draw(st.integers(1, 4)) for _ in range(nd)], np.int64)
    theta = arr(draw, dt, (n, nd, nd + 1))
    return Example((theta, size), dict(align_corners=int(draw(st.booleans()))), 20,
                   static=(1,))


@st.composite
def roi_align_case(draw):
    dt = floats(draw)
    x = arr(draw, dt, (2, draw(st.integers(1, 2)), 5, 6))
    r = draw(st.integers(1, 3))
    lo = arr(draw, dt, (r, 2), -1, 3)
    rois = np.concatenate([lo, lo + arr(draw, dt, (r, 2), 0.5, 4)], axis=1)
    idx = arr(draw, I64, (r,), 0, 1)
    attrs = dict(output_height=draw(st.integers(1, 3)), output_width=draw(st.integers(1, 3)),
                 sampling_ratio=draw(st.integers(1, 2)), spatial_scale=0.9,
                 mode=draw(st.sampled_from(["avg", "max"])),
                 coordinate_transformation_mode=draw(st.sampled_from(
                     ["half_pixel", "output_half_pixel"])))
    return Example((x, rois, idx), attrs, 16)


CASES = [
    OpCase("GridSample", grid_sample_case(), scale=100, min_opset=20),
    OpCase("AffineGrid", affine_grid_case(), scale=10),
    OpCase("RoiAlign", roi_align_case(), scale=100),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)
