"""Object detection ops: NonMaxSuppression.

How many boxes NonMaxSuppression selects depends on the box and score values,
and no compiled form has a data-dependent output shape: the op runs with numpy
on values known at trace time (jaxort.backend evaluates such a model eagerly)
and raises a StaticValueError naming the input when one is traced.
"""

from __future__ import annotations

import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static

_DATA_DEPENDENT = "(NonMaxSuppression selects a number of boxes that depends on the values)"


def _optional_scalar(x, what):
    if x is None:
        return None
    value = np.asarray(static(x, f"input {what!r} {_DATA_DEPENDENT}")).reshape(-1)
    return value[0] if value.size else None


def _corners(boxes: np.ndarray, center_point_box: int):
    """(x_min, x_max, y_min, y_max) of each box, computed as ONNX's reference does."""
    if center_point_box == 0:  # [y1, x1, y2, x2], corners in either order
        x_min, x_max = np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3])
        y_min, y_max = np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2])
    elif center_point_box == 1:  # [x_center, y_center, width, height]
        half_w, half_h = boxes[:, 2] / 2, boxes[:, 3] / 2
        x_min, x_max = boxes[:, 0] - half_w, boxes[:, 0] + half_w
        y_min, y_max = boxes[:, 1] - half_h, boxes[:, 1] + half_h
    else:
        raise OpError(f"center_point_box must be 0 or 1, got {center_point_box}")
    return x_min, x_max, y_min, y_max


def _suppressed(corners, area, i: int, chosen: list, iou_threshold) -> bool:
    """Whether box ``i`` overlaps a chosen box by more than ``iou_threshold``.

    The arithmetic runs in the boxes' dtype in the reference's order, so that
    an IoU on the threshold compares the same way.
    """
    if not chosen:
        return False
    x_min, x_max, y_min, y_max = corners
    j = np.asarray(chosen)
    ix = np.minimum(x_max[i], x_max[j]) - np.maximum(x_min[i], x_min[j])
    iy = np.minimum(y_max[i], y_max[j]) - np.maximum(y_min[i], y_min[j])
    inter = ix * iy
    union = area[i] + area[j] - inter
    overlap = (ix > 0) & (iy > 0) & (inter > 0) & (area[i] > 0) & (area[j] > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / np.where(overlap, union, 1)
    return bool(np.any(overlap & (iou > iou_threshold)))


@register("NonMaxSuppression", since=10)
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box):
    """NonMaxSuppression-10+ (static inputs only: the output shape depends on the values)."""
    boxes = np.asarray(static(boxes, f"input 'boxes' {_DATA_DEPENDENT}"))
    scores = np.asarray(static(scores, f"input 'scores' {_DATA_DEPENDENT}"))
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise OpError(f"input 'boxes' must have shape [num_batches, spatial_dimension, 4], "
                      f"got {list(boxes.shape)}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise OpError(f"input 'scores' must have shape [{boxes.shape[0]}, num_classes, "
                      f"{boxes.shape[1]}] for boxes of shape {list(boxes.shape)}, got "
                      f"{list(scores.shape)}")
    limit = _optional_scalar(max_output_boxes_per_class, "max_output_boxes_per_class")
    limit = 0 if limit is None else max(int(limit), 0)
    iou = _optional_scalar(iou_threshold, "iou_threshold")
    iou = np.zeros((), boxes.dtype) if iou is None else iou
    min_score = _optional_scalar(score_threshold, "score_threshold")
    selected = []
    for b in range(boxes.shape[0]):
        corners = _corners(boxes[b], center_point_box)
        x_min, x_max, y_min, y_max = corners
        area = (x_max - x_min) * (y_max - y_min)
        for c in range(scores.shape[1]):
            s = scores[b, c]
            # Highest score first; equal scores keep the lower box index first.
            order = np.argsort(-s, kind="stable")
            if min_score is not None:
                order = order[s[order] > min_score]
            chosen = []
            for i in order:
                if len(chosen) >= limit:
                    break
                if not _suppressed(corners, area, int(i), chosen, iou):
                    chosen.append(int(i))
            selected.extend((b, c, i) for i in chosen)
    return np.asarray(selected, np.int64).reshape(-1, 3)
