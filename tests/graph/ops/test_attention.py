"""Attention and RotaryEmbedding (ops/attention.py) against ONNX's reference evaluator.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

from ._harness import Example, F32, I64, OpCase, table_tests
from ._strategies import arr, floats

COVERED_OPS = {
    "Attention", "RotaryEmbedding",
}


@st.composite
def attention_case(draw):
    dt = F32  # the reference rounds sqrt(scale) to float32 (attributes are float32)
    b, hq, s, kv, d = (draw(st.integers(1, 3)) for _ in range(5))
    hk = draw(st.sampled_from([h for h in (1, hq) if hq % h == 0]))
    rank3 = draw(st.booleans())
    past = draw(st.booleans())
    if rank3:
        q, k, v = (arr(draw, dt, (b, s, hq * d)), arr(draw, dt, (b, kv, hk * d)),
                   arr(draw, dt, (b, kv, hk * d)))
        attrs = dict(q_num_heads=hq, kv_num_heads=hk)
    else:
        q, k, v = (arr(draw, dt, (b, hq, s, d)), arr(draw, dt, (b, hk, kv, d)),
                   arr(draw, dt, (b, hk, kv, d)))
        attrs = {}
    p = draw(st.integers(1, 2)) if past else 0
    pk = arr(draw, dt, (b, hk, p, d)) if past else None
    pv = arr(draw, dt, (b, hk, p, d)) if past else None
    mask_kind = draw(st.sampled_from([None, "bool", "float"]))
    mask = None
    if mask_kind == "bool":
        mask = draw(hnp.arrays(np.bool_, (s, kv + p)))
        mask[:, 0] = True
    elif mask_kind == "float":
        mask = arr(draw, dt, (s, kv + p))
    attrs["is_causal"] = int(draw(st.booleans()))
    if draw(st.booleans()):
        attrs["scale"] = 0.5
    if draw(st.booleans()):
        attrs["softcap"] = 2.0
    attrs["qk_matmul_output_mode"] = draw(st.sampled_from([0, 1, 2, 3]))
    return Example((q, k, v, mask, pk, pv), attrs, 23, n_out=4)


@st.composite
def rotary_case(draw):
    dt = floats(draw)
    b, s, h = (draw(st.integers(1, 3)) for _ in range(3))
    d = 2 * draw(st.integers(1, 3))
    rot = draw(st.sampled_from([0, d])) if d > 2 else 0
    half = (rot or d) // 2
    rank3 = draw(st.booleans())
    x = arr(draw, dt, (b, s, h * d) if rank3 else (b, h, s, d))
    attrs = dict(interleaved=int(draw(st.booleans())), rotary_embedding_dim=rot)
    if rank3:
        attrs["num_heads"] = h
    if draw(st.booleans()):
        cos, sin = arr(draw, dt, (s + 2, half)), arr(draw, dt, (s + 2, half))
        pos = arr(draw, I64, (b, s), 0, s + 1)
        return Example((x, cos, sin, pos), attrs, 23)
    return Example((x, arr(draw, dt, (b, s, half)), arr(draw, dt, (b, s, half))), attrs, 23)


CASES = [
    OpCase("Attention", attention_case(), scale=10, min_opset=23),
    OpCase("RotaryEmbedding", rotary_case(), scale=10, min_opset=23),
]


test_matches_reference, test_table_covers_every_op = table_tests(CASES, COVERED_OPS)
