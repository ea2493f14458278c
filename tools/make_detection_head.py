"""Writes tests/fixtures/detection_head/: a tiny detection head whose outputs have data-dependent shapes.

Run in the corpus' export environment (torch 2.13.0 CPU, onnx 1.16.2; numpy < 2.3), from the
repository root::

    python tools/make_detection_head.py [output_dir]

The model (fixed seed, random initialisation, nothing downloaded), on a 1x3x16x16 image:

- backbone: Conv2d(3 -> 8, 3x3, stride 2) + ReLU, Conv2d(8 -> 8, 3x3, stride 2) + ReLU (4x4 cells);
- head: a 1x1 Conv2d(8 -> 5) giving, per cell, a score logit and 4 box deltas; the score row's
  weights are scaled by 10 and its bias set to -0.5 so scores spread over (0, 1) instead of
  sitting at 0.5 as they do at random initialisation;
- decoding: a box of side ``8 * exp(delta)`` around the cell's centre (shifted by the deltas),
  ``(x1, y1, x2, y2)``, 16 boxes and sigmoid scores;
- selection as detection post-processing does it: ``keep = scores > 0.5`` (a boolean mask),
  ``boxes[keep]`` and ``scores[keep]`` (exported as NonZero and GatherND), then non-maximum
  suppression of the kept boxes at IoU 0.3, which exports as ONNX NonMaxSuppression.

torchvision.ops.nms cannot run in that environment (the torchvision 0.28.0 wheel's C++ ops do
not load beside torch 2.13.0+cpu: ``operator torchvision::nms does not exist``), so the script
defines the same operator, ``detection_head::nms`` (greedy NMS: highest score first, a box is
dropped when its IoU with a kept box is > the threshold; indices in decreasing score order),
with a Python kernel, and exports it with the symbolic torchvision registers for
``torchvision::nms`` (torchvision/ops/_register_onnx_ops.py: Unsqueeze, Cast,
NonMaxSuppression with max_output_boxes_per_class = int64 max, Gather of column 2, Squeeze).

Export: legacy ``torch.onnx.export(..., dynamo=False, opset_version=17)`` in eval mode, input
``image``, outputs ``boxes`` [K, 4], ``scores`` [K] and ``keep_indices`` [M] (int64, indices
into ``boxes``, M <= K).

Files:

- ``model.onnx``;
- ``inputs.npz``: ``image_0`` .. ``image_3``, each float32 [1, 3, 16, 16], chosen (the first
  candidates of a fixed sequence of seeded images) so that their numbers of kept boxes K all
  differ, one of them 0, and, for each, no score is within 1e-3 of 0.5, no two kept boxes have
  an IoU within 1e-3 of 0.3 and no two kept scores are within 1e-4 (so float rounding cannot
  change which boxes are kept, suppressed or their order);
- ``expected.npz``: PyTorch's float32 outputs, ``boxes_<i>``, ``scores_<i>``,
  ``keep_indices_<i>``;
- ``README.md``.

The script then checks that onnxruntime, when importable, runs ``model.onnx`` to PyTorch's
outputs on every image (atol 1e-5, indices equal).
"""

import io
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "detection_head"
SCORE_THRESHOLD = 0.5
IOU_THRESHOLD = 0.3
SCORE_MARGIN = 1e-3
IOU_MARGIN = 1e-3
SCORE_GAP = 1e-4
N_IMAGES = 4
SCALES = (1.0, 2.0, 4.0)  # candidate k is randn(seed k) * SCALES[k % 3]


def _register_nms():
    """``detection_head::nms``: torchvision.ops.nms's semantics, a Python kernel, torchvision's ONNX symbolic."""
    import torch
    from torch.onnx import symbolic_opset11 as opset11
    from torch.onnx.symbolic_helper import parse_args

    @torch.library.custom_op("detection_head::nms", mutates_args=())
    def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
        iou = _iou(boxes, boxes)
        keep = []
        for i in torch.argsort(scores, descending=True).tolist():
            if all(float(iou[i, j]) <= iou_threshold for j in keep):
                keep.append(i)
        return torch.tensor(keep, dtype=torch.int64)

    @parse_args("v", "v", "f")
    def symbolic(g, boxes, scores, iou_threshold):
        # torchvision/ops/_register_onnx_ops.py, symbolic_multi_label_nms
        boxes = opset11.unsqueeze(g, boxes, 0)
        scores = opset11.unsqueeze(g, opset11.unsqueeze(g, scores, 0), 0)
        max_output_per_class = g.op("Constant", value_t=torch.tensor([sys.maxsize], dtype=torch.long))
        iou_threshold = g.op("Constant", value_t=torch.tensor([iou_threshold], dtype=torch.float))
        nms_out = g.op(
            "NonMaxSuppression",
            g.op("Cast", boxes, to_i=torch.onnx.TensorProtoDataType.FLOAT),
            g.op("Cast", scores, to_i=torch.onnx.TensorProtoDataType.FLOAT),
            max_output_per_class,
            iou_threshold,
        )
        return opset11.squeeze(
            g, opset11.select(g, nms_out, 1, g.op("Constant", value_t=torch.tensor([2], dtype=torch.long))), 1)

    torch.onnx.register_custom_op_symbolic("detection_head::nms", symbolic, 11)
    return nms


def _iou(a, b):
    import torch

    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def _model(nms):
    import torch
    from torch import nn

    class DetectionHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                                          nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU())
            self.head = nn.Conv2d(8, 5, 1)
            with torch.no_grad():
                self.head.weight[0] *= 10.0
                self.head.bias[0] = -0.5
                self.head.weight[1:] *= 3.0
            # Cell centres of the 4x4 grid in image pixels (stride 4), x then y.
            ys, xs = torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij")
            self.register_buffer("centres", torch.stack([xs, ys], -1).reshape(-1, 2) * 4.0 + 2.0)

        def forward(self, image):
            out = self.head(self.backbone(image))             # [1, 5, 4, 4]
            out = out.permute(0, 2, 3, 1).reshape(-1, 5)     # [16, 5], one row a cell
            scores = torch.sigmoid(out[:, 0])
            centre = self.centres + out[:, 1:3]
            size = 8.0 * torch.exp(out[:, 3:5])
            boxes = torch.cat([centre - size / 2, centre + size / 2], 1)
            keep = scores > SCORE_THRESHOLD
            boxes, scores = boxes[keep], scores[keep]
            return boxes, scores, nms(boxes, scores, IOU_THRESHOLD)

    torch.manual_seed(0)
    return DetectionHead().eval()


def _margins(boxes, all_scores, kept_scores):
    """(score distance from the threshold, IoU distance from the threshold, smallest gap between kept scores)."""
    score = float(np.abs(all_scores - SCORE_THRESHOLD).min())
    k = len(kept_scores)
    iou, gap = np.inf, np.inf
    if k > 1:
        import torch

        ious = _iou(torch.from_numpy(boxes), torch.from_numpy(boxes)).numpy()
        iou = float(np.abs(ious[np.triu_indices(k, 1)] - IOU_THRESHOLD).min())
        s = np.sort(kept_scores)
        gap = float(np.diff(s).min())
    return score, iou, gap


def main(argv):
    import onnx
    import torch

    out = pathlib.Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    nms = _register_nms()
    model = _model(nms)

    def all_scores(image):
        feats = model.head(model.backbone(image))
        return torch.sigmoid(feats[0, 0]).flatten().numpy()

    images, expected, chosen = {}, {}, []
    with torch.no_grad():
        for k in range(1000):
            g = torch.Generator().manual_seed(k)
            image = torch.randn(1, 3, 16, 16, generator=g) * SCALES[k % len(SCALES)]
            boxes, scores, keep = (t.numpy() for t in model(image))
            counts = {c for c, _, _ in chosen}
            if len(boxes) in counts:
                continue
            margins = _margins(boxes, all_scores(image), scores)
            if margins[0] < SCORE_MARGIN or margins[1] < IOU_MARGIN or margins[2] < SCORE_GAP:
                continue
            i = len(chosen)
            chosen.append((len(boxes), len(keep), k))
            images[f"image_{i}"] = image.numpy()
            expected.update({f"boxes_{i}": boxes, f"scores_{i}": scores, f"keep_indices_{i}": keep})
            print(f"image_{i}: candidate {k} (scale {SCALES[k % len(SCALES)]}), {len(boxes)} boxes kept, "
                  f"{len(keep)} after NMS, margins: score {margins[0]:.2e}, IoU {margins[1]:.2e}, "
                  f"score gap {margins[2]:.2e}")
            if len(chosen) == N_IMAGES:
                break
    counts = [c for c, _, _ in chosen]
    assert len(chosen) == N_IMAGES and 0 in counts, chosen
    assert any(m < c for c, m, _ in chosen), "NMS suppresses nothing on any image"

    buffer = io.BytesIO()
    example = torch.from_numpy(images[f"image_{counts.index(max(counts))}"])
    torch.onnx.export(model, (example,), buffer, dynamo=False, opset_version=17, input_names=["image"],
                      output_names=["boxes", "scores", "keep_indices"],
                      dynamic_axes={"boxes": {0: "kept"}, "scores": {0: "kept"}, "keep_indices": {0: "selected"}})
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert "NonZero" in ops and "NonMaxSuppression" in ops, ops
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(out / "model.onnx"))
    np.savez_compressed(out / "inputs.npz", **images)
    np.savez_compressed(out / "expected.npz", **expected)
    print("op types:", " ".join(ops))

    checked = None
    try:
        import onnxruntime
    except ImportError:
        print("onnxruntime not importable: not checked")
    else:
        session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
        for i in range(N_IMAGES):
            got = dict(zip(["boxes", "scores", "keep_indices"], session.run(None, {"image": images[f"image_{i}"]})))
            for name, value in got.items():
                want = expected[f"{name}_{i}"]
                assert value.shape == want.shape and value.dtype == want.dtype, (i, name, value.shape, want.shape)
                assert np.allclose(value, want, rtol=0, atol=1e-5), (i, name, np.abs(value - want).max())
        checked = onnxruntime.__version__
        print(f"onnxruntime {checked} gives PyTorch's outputs on every image (atol 1e-5)")
    _readme(out, chosen, ops, torch.__version__, onnx.__version__, checked)
    return 0


def _readme(out, chosen, ops, torch_version, onnx_version, ort_version):
    rows = "\n".join(f"| `image_{i}` | {c} | {m} |" for i, (c, m, _) in enumerate(chosen))
    nodes = ", ".join(sorted(set(ops)))
    ort = (f"onnxruntime {ort_version} runs `model.onnx` to these outputs on every image\n"
           "(atol 1e-5, the indices equal)." if ort_version else "onnxruntime was not run on it.")
    (out / "README.md").write_text(f"""# Detection head: data-dependent output shapes

An inference fixture: a tiny detection head whose outputs' lengths depend on the
image's values, as in detection post-processing. Written by
`tools/make_detection_head.py` (`python tools/make_detection_head.py`, with torch
{torch_version}, onnx {onnx_version}; legacy `torch.onnx.export(..., dynamo=False,
opset_version=17)` in eval mode, random initialisation with a fixed seed, nothing
downloaded). The script's docstring gives the model in full.

- Backbone: Conv2d(3 -> 8, 3x3, stride 2) + ReLU, Conv2d(8 -> 8, 3x3, stride 2) + ReLU;
  a 1x1 Conv2d head gives each of the 4x4 cells a score (sigmoid) and a box
  (`x1, y1, x2, y2`, decoded around the cell's centre with Exp).
- Selection: `keep = scores > 0.5`, `boxes[keep]`, `scores[keep]` (NonZero, then
  GatherND), then non-maximum suppression of the kept boxes at IoU 0.3 (ONNX
  NonMaxSuppression, as torchvision exports `torchvision.ops.nms`; torchvision's C++
  ops do not load beside torch's CPU build here, so the script defines the same
  operator with a Python kernel and torchvision's ONNX symbolic).
- Input `image` float32 [1, 3, 16, 16]; outputs `boxes` float32 [K, 4], `scores`
  float32 [K] and `keep_indices` int64 [M], indices into `boxes` in decreasing
  score order.

Files: `model.onnx`; `inputs.npz` (`image_0` .. `image_3`); `expected.npz`
(PyTorch's float32 outputs: `boxes_<i>`, `scores_<i>`, `keep_indices_<i>`).

The number of kept boxes differs between the images (one keeps none), so a
runtime sees a new output shape on each:

| image | K (boxes, scores) | M (keep_indices) |
|---|---|---|
{rows}

No score is within 1e-3 of 0.5, no two kept boxes have an IoU within 1e-3 of 0.3
and no two kept scores are within 1e-4 of each other, so float rounding cannot
change which boxes are kept or suppressed or their order.

{ort}

Op types in `model.onnx`: {nodes}.
""")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
