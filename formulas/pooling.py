"""Pooling (max, avg, adaptive; 1-3d) and its backward, interpolation and fold.

Pooling: one operation (comparison or add) per (output element, input element of its window)
pair that lies inside the input: padding is never read, so a padded border costs less. Average
pooling adds one divide per output element. The pairs are counted per spatial dim in closed
form, so the count is exact for any kernel, stride, padding, dilation and ceil_mode.

Backward: max pooling adds each gradient into its argmax (one add per grad element); average
pooling divides each gradient (one per grad element) and adds it to every window position.

Interpolation: a weighted sum of ``taps`` input elements per output element, counted as
``taps`` MACs (linear 2, bilinear 4, trilinear 8, bicubic 16), as a fixed-weight convolution
would be; the per-row weights are O(rows) and not counted. Nearest modes move data only
(declared in ``no_arithmetic``); their backward adds each gradient into its source.
Antialiased resize (``_upsample_{bilinear,bicubic}2d_aa``) is priced as torch's CPU kernel
runs it: two separable 1-D passes (a pass skipped where its size is unchanged), each output
reading the taps of its own, border-clipped window (``aa_tap_counts``); its backward spreads
each gradient over the 2-D window. CUDA's kernel is not separable (see docs/limits.md).
"""

from __future__ import annotations

import math
import struct
from typing import Optional

import torch

from ._registry import Cost, namespace, register_formula
from ._shapes import first_numel, numel

aten = namespace("aten")  # ops this torch lacks read as names, never met


def _ops(names: str) -> list:
    return aten.present(names.split())


def _per_dim(value, d: int, default=None) -> list:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return list(default) if default is not None else [1] * d
    if isinstance(value, int):
        return [value] * d
    value = list(value)
    return value * d if len(value) == 1 else value


def window_pairs_1d(size_in: int, size_out: int, kernel: int, stride: int, padding: int,
                    dilation: int) -> int:
    """(output, in-bounds input) pairs along one dim: for each kernel tap j, the outputs o
    with 0 <= o * stride - padding + j * dilation < size_in."""
    pairs = 0
    for j in range(kernel):
        offset = j * dilation - padding
        first = max(0, -(offset // stride))  # ceil(-offset / stride): first o reading >= 0
        last = min(size_out - 1, (size_in - 1 - offset) // stride)
        pairs += max(0, last - first + 1)
    return pairs


def pooling_pairs(x, out, kernel, stride, padding, dilation) -> int:
    """Pairs over all dims; x and out share the leading (batch, channel) dims."""
    d = len(kernel)
    lead = numel(x[: len(x) - d])
    pairs = lead
    for i in range(d):
        pairs *= window_pairs_1d(x[-d + i], out[-d + i], kernel[i], stride[i], padding[i],
                                 dilation[i])
    return pairs


def adaptive_pairs_1d(size_in: int, size_out: int) -> int:
    # window i covers [floor(i * in / out), ceil((i + 1) * in / out))
    return sum(-((-(i + 1) * size_in) // size_out) - (i * size_in) // size_out
               for i in range(size_out))


def adaptive_pairs(x, out, d: int) -> int:
    pairs = numel(x[: len(x) - d])
    for i in range(d):
        pairs *= adaptive_pairs_1d(x[-d + i], out[-d + i])
    return pairs


def _geometry(d, kernel_size, stride, padding, dilation=1):
    kernel = _per_dim(kernel_size, d)
    return (kernel, _per_dim(stride, d, default=kernel), _per_dim(padding, d),
            _per_dim(dilation, d))


def max_pool(d: int):
    def formula(x, kernel_size, stride=(), padding=0, dilation=1, *args, out_shape, **kw):
        # x: [*lead, *spatial(d)]; one comparison per in-bounds window element
        out = out_shape if isinstance(out_shape, torch.Size) else out_shape[0]
        return Cost(pooling_pairs(x, out, *_geometry(d, kernel_size, stride, padding, dilation)))

    return formula


def avg_pool(d: int):
    def formula(x, kernel_size, stride=(), padding=0, *args, out_shape, **kw):
        geometry = _geometry(d, kernel_size, stride, padding)
        return Cost(pooling_pairs(x, out_shape, *geometry) + numel(out_shape))

    return formula


def avg_pool_backward(d: int):
    def formula(grad_out, x, kernel_size, stride=(), padding=0, *args, out_shape, **kw):
        geometry = _geometry(d, kernel_size, stride, padding)
        return Cost(pooling_pairs(x, grad_out, *geometry) + numel(grad_out))

    return formula


def adaptive_avg_pool(d: int):
    def formula(x, output_size, *args, out_shape, **kw):
        return Cost(adaptive_pairs(x, out_shape, d) + numel(out_shape))

    return formula


def adaptive_max_pool(d: int):
    def formula(x, output_size, *args, out_shape, **kw):
        out = out_shape if isinstance(out_shape, torch.Size) else out_shape[0]
        return Cost(adaptive_pairs(x, out, d))

    return formula


def adaptive_avg_pool_backward(d: int):
    def formula(grad_out, x, *args, out_shape, **kw):
        return Cost(adaptive_pairs(x, grad_out, d) + numel(grad_out))

    return formula


def scatter_back(grad_out, *args, out_shape, **kw) -> Cost:
    """Backward that adds each gradient element into the input element it came from."""
    return Cost(numel(grad_out))


for _d in (1, 2, 3):
    register_formula(_ops(f"max_pool{_d}d_with_indices max_pool{_d}d mkldnn_max_pool{_d}d"
                          f" quantized_max_pool{_d}d"))(max_pool(_d))
    register_formula(_ops(f"avg_pool{_d}d"))(avg_pool(_d))
    register_formula(_ops(f"avg_pool{_d}d_backward"))(avg_pool_backward(_d))
    register_formula(_ops(f"max_pool{_d}d_with_indices_backward adaptive_max_pool{_d}d_backward"
                          f" fractional_max_pool{_d}d_backward"))(scatter_back)
    register_formula(_ops(f"adaptive_avg_pool{_d}d _adaptive_avg_pool{_d}d"))(
        adaptive_avg_pool(_d))
    register_formula(_ops(f"_adaptive_avg_pool{_d}d_backward"))(adaptive_avg_pool_backward(_d))
    register_formula(_ops(f"adaptive_max_pool{_d}d"))(adaptive_max_pool(_d))


def _fractional_max_pool(x, kernel_size, output_size, random_samples, *, out_shape, **kw):
    # each output compares a full kernel window (windows never overhang)
    return Cost(first_numel(out_shape) * numel(kernel_size))


register_formula(_ops("fractional_max_pool2d fractional_max_pool3d"))(_fractional_max_pool)


# ---- interpolation ----------------------------------------------------------------------------

TAPS = {"linear1d": 2, "bilinear2d": 4, "trilinear3d": 8, "bicubic2d": 16}
_AA_INTERP_SIZE = {"bilinear2d": 2, "bicubic2d": 4}  # the filter's width at scale 1


def interpolation(taps: int):
    def formula(x, *args, out_shape, **kw) -> Cost:
        macs = numel(out_shape) * taps
        return Cost(2 * macs, macs)

    return formula


def interpolation_backward(taps: int):
    def formula(grad_out, *args, out_shape, **kw) -> Cost:
        # each gradient element is spread over the same taps: one MAC per tap
        macs = numel(grad_out) * taps
        return Cost(2 * macs, macs)

    return formula


def _single(x: float) -> float:
    """``x`` rounded to float32, as the CPU kernel's float arithmetic holds it."""
    return struct.unpack("f", struct.pack("f", x))[0]


def aa_tap_counts(size_in: int, size_out: int, interp_size: int, align_corners: bool,
                  scale_given: Optional[float], single: bool) -> list:
    """Input taps of each output index along one dim of torch's CPU antialiased resize
    (``HelperInterpBase::_compute_indices_min_size_weights_aa``): the filter's support widens
    by the downscale factor and is clipped at the borders, so border outputs read fewer taps.
    ``single``: the kernel computes in float32 (float, half and bfloat16 tensors), else in
    float64; its rounding decides a tap where a window edge falls on a half-integer."""
    rounded = _single if single else float
    if align_corners:
        scale = rounded((size_in - 1) / (size_out - 1)) if size_out > 1 else 0.0
    elif scale_given is not None and scale_given > 0:
        scale = rounded(1.0 / scale_given)
    else:
        scale = rounded(size_in / size_out)
    support = rounded(interp_size * 0.5 * scale) if scale >= 1.0 else interp_size * 0.5
    widest = math.ceil(support) * 2 + 1
    counts = []
    for i in range(size_out):
        center = rounded(scale * (i + 0.5))
        low = max(int(rounded(center - support) + 0.5), 0)
        high = min(int(rounded(center + support) + 0.5), size_in)
        counts.append(min(max(high - low, 0), widest))
    return counts


def _aa_scales(args) -> list:
    """The scales given to the op (``scales_h``, ``scales_w``), None where not given."""
    scales = list(args[:2]) + [None] * (2 - len(args[:2]))
    return [s if isinstance(s, float) else None for s in scales]


def _single_precision(dtypes) -> bool:
    return not dtypes or dtypes[0] is not torch.float64


def interpolation_aa(interp_size: int):
    def formula(x, output_size, align_corners, *args, out_shape, dtypes=None, **kw) -> Cost:
        # torch's CPU kernel: two separable passes, the last (contiguous) dim first, each
        # skipped where the size is unchanged: [n, c, h_in, w_in] -> [n, c, h_in, w_out]
        # -> [n, c, h_out, w_out]; an output reads its own taps (a MAC each)
        planes, (h_in, w_in), (h_out, w_out) = x[0] * x[1], x[2:], out_shape[2:]
        scale_h, scale_w = _aa_scales(args)
        single = _single_precision(dtypes)
        macs = 0
        if w_out != w_in:
            macs += planes * h_in * sum(aa_tap_counts(w_in, w_out, interp_size, align_corners,
                                                      scale_w, single))
        if h_out != h_in:
            macs += planes * w_out * sum(aa_tap_counts(h_in, h_out, interp_size,
                                                       align_corners, scale_h, single))
        return Cost(2 * macs, macs)

    return formula


def interpolation_aa_backward(interp_size: int):
    def formula(grad_out, output_size, input_size, align_corners, *args, out_shape,
                dtypes=None, **kw) -> Cost:
        # not separable: each gradient element is spread over its whole 2-D window
        # (ysize x xsize taps, unchanged dims included), ``+= wx * wy * grad``: a MAC and a
        # multiply per tap
        planes, (h_in, w_in), (h_out, w_out) = grad_out[0] * grad_out[1], input_size[2:], \
            grad_out[2:]
        scale_h, scale_w = _aa_scales(args)
        single = _single_precision(dtypes)
        rows = sum(aa_tap_counts(h_in, h_out, interp_size, align_corners, scale_h, single))
        cols = sum(aa_tap_counts(w_in, w_out, interp_size, align_corners, scale_w, single))
        macs = planes * rows * cols
        return Cost(3 * macs, macs)

    return formula


for _mode, _taps in TAPS.items():
    register_formula(_ops(f"upsample_{_mode}"))(interpolation(_taps))
    register_formula(_ops(f"upsample_{_mode}_backward"))(interpolation_backward(_taps))
for _mode, _size in _AA_INTERP_SIZE.items():
    register_formula(_ops(f"_upsample_{_mode}_aa"))(interpolation_aa(_size))
    register_formula(_ops(f"_upsample_{_mode}_aa_backward"))(interpolation_aa_backward(_size))
for _d in (1, 2, 3):
    register_formula(_ops(f"upsample_nearest{_d}d_backward _upsample_nearest_exact{_d}d_backward"))(
        scatter_back)

_GRID_TAPS = {0: 4, 1: 0, 2: 16}  # interpolation_mode: bilinear, nearest, bicubic


@register_formula(aten.grid_sampler_2d)
def grid_sampler_2d(x, grid, interpolation_mode, *args, out_shape, **kw) -> Cost:
    # out: [n, c, h_out, w_out]; coordinate arithmetic per (n, h, w) is not counted
    macs = numel(out_shape) * _GRID_TAPS.get(interpolation_mode, 4)
    return Cost(2 * macs, macs)


@register_formula(aten.grid_sampler_3d)
def grid_sampler_3d(x, grid, interpolation_mode, *args, out_shape, **kw) -> Cost:
    macs = numel(out_shape) * (8 if interpolation_mode == 0 else 0)
    return Cost(2 * macs, macs)


@register_formula([aten.grid_sampler_2d_backward, aten.grid_sampler_3d_backward])
def grid_sampler_backward(grad_out, x, grid, interpolation_mode, padding_mode, align_corners,
                          output_mask, *, out_shape, **kw) -> Cost:
    # the input gradient spreads each gradient over the taps; the grid gradient revisits them
    taps = _GRID_TAPS.get(interpolation_mode, 4) if len(x) == 4 else 8 * (interpolation_mode == 0)
    macs = numel(grad_out) * taps * (int(output_mask[0]) + int(output_mask[1]))
    return Cost(2 * macs, macs)


# ---- fold / unfold ----------------------------------------------------------------------------


@register_formula(aten.col2im)
def col2im(columns, *args, out_shape, **kw) -> Cost:
    # fold: every column element is added into its image position
    return Cost(numel(columns))


@register_formula(aten.unfold_backward)
def unfold_backward(grad_in, input_sizes, dim, size, step, *, out_shape, **kw) -> Cost:
    # overlapping windows: every window gradient element is added back
    return Cost(numel(grad_in))
