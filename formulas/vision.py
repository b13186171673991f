"""torchvision's detection ops (``torchvision::nms``, ``roi_align`` and its backward), as its
CPU kernels (``torchvision/csrc/ops/cpu/``) compute them.

Named, not imported: the ops exist once torchvision is imported (``lazy=True``). What the
kernels do depends on values the formulas never see, so each says how it prices them:
``nms`` at its most (no box suppressed: every pair of boxes compared); ``roi_align`` exactly
for a given ``sampling_ratio`` (Faster / Mask R-CNN pass 2), and not at all for an adaptive
one (``sampling_ratio <= 0``: the grid is ceil(box size / bins), read from the boxes'
coordinates), which raises so the calls are reported unsupported, never priced as zero.
"""

from __future__ import annotations

from ._registry import Cost, register_formula

# nms, per box: its area, (x2 - x1) * (y2 - y1)
NMS_AREA = 3
# nms, per pair of boxes: the intersection's corners (4 max / min), its width and height
# (2 subtracts, 2 clamps at 0), its area (1), the IoU inter / (area_i + area_j - inter)
# (2 adds, a divide) and its test against the threshold (1)
NMS_PAIR = 13
# roi_align, per box: its corners scaled and shifted (8), its size (2), the size floored
# at 1 (2), the bin size (2)
ROI_BOX = 14
# roi_align, per (box, bin, sample): the sample's y and x (6 each), the bounds tests (4),
# the clamps at 0 (2), the neighbours' tests (2), the fractions ly, lx, hy, hx (4), the four
# bilinear weights (4)
ROI_SAMPLE = 28
# roi_align, per (box, channel, bin, sample): four weighted neighbours summed into the bin
# (4 multiplies, 4 adds); and per (box, channel, bin) the mean (a divide)
ROI_CHANNEL_SAMPLE = 8


def _log2_ceil(n: int) -> int:
    return (n - 1).bit_length() if n > 1 else 0


@register_formula("torchvision::nms", lazy=True)
def nms(dets, scores, iou_threshold, *, out_shape, **kw) -> Cost:
    # dets: [n, 4] (x1, y1, x2, y2), scores: [n]; the scores sorted, then each kept box
    # compared with every later one not suppressed yet: at most n (n - 1) / 2 pairs
    n = dets[0] if len(dets) else 0
    return Cost(n * NMS_AREA + n * _log2_ceil(n) + n * (n - 1) // 2 * NMS_PAIR)


def _samples(sampling_ratio: int) -> int:
    if sampling_ratio <= 0:
        raise ValueError("roi_align with an adaptive sampling_ratio (<= 0) samples a grid "
                         "sized by each box's coordinates, which a formula does not see; "
                         "pass sampling_ratio > 0 to have it priced")
    return sampling_ratio * sampling_ratio


@register_formula("torchvision::roi_align", lazy=True)
def roi_align(x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
              *, out_shape, **kw) -> Cost:
    # x: [n, c, h, w], rois: [k, 5] (batch index, x1, y1, x2, y2); out: [k, c, ph, pw]
    boxes, channels, bins = rois[0], x[1], pooled_height * pooled_width
    samples = _samples(sampling_ratio)
    return Cost(boxes * ROI_BOX + boxes * bins * samples * ROI_SAMPLE
                + boxes * channels * bins * (samples * ROI_CHANNEL_SAMPLE + 1))


@register_formula("torchvision::_roi_align_backward", lazy=True)
def roi_align_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size,
                       channels, height, width, sampling_ratio, aligned, *, out_shape,
                       **kw) -> Cost:
    # per (box, channel, bin): grad / count (1); per sample the weights again (the backward
    # kernel computes them per channel) and four weighted adds into the input's gradient
    boxes, bins = rois[0], pooled_height * pooled_width
    samples = _samples(sampling_ratio)
    return Cost(boxes * ROI_BOX + boxes * channels * bins
                * (1 + samples * (ROI_SAMPLE + ROI_CHANNEL_SAMPLE)))



