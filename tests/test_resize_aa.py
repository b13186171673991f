"""Antialiased resize (``F.interpolate(..., antialias=True)``) priced as torch's CPU kernel
runs it: two separable passes, a pass skipped where a size is unchanged, each output reading
the taps of its own border-clipped window. Oracles: a naive loop over output indices (the
window's definition, PIL's), and the real kernel's weights, read by resizing one-hot inputs
(the taps with a nonzero weight)."""

import math

import pytest
import torch
import torch.nn.functional as F

from dispatch_flops import FlopCounter
from dispatch_flops.formulas.pooling import aa_tap_counts

INTERP = {"bilinear": 2, "bicubic": 4}


def naive_taps(size_in: int, size_out: int, interp_size: int) -> list:
    """Per output index, the input indices inside its filter's window: the window is
    ``interp_size / 2`` input pixels either side of the output's centre, widened by the
    downscale factor, rounded to pixel edges and clipped to the input."""
    scale = size_in / size_out
    half = interp_size / 2 * max(scale, 1.0)
    taps = []
    for i in range(size_out):
        centre = (i + 0.5) * scale
        first = max(math.floor(centre - half + 0.5), 0)
        last = min(math.floor(centre + half + 0.5), size_in)
        taps.append(sum(1 for _ in range(first, last)))
    return taps


def kernel_nonzero_taps(size_in: int, size_out: int, mode: str) -> list:
    """Per output index, the inputs the real kernel gives a nonzero weight: one-hot rows
    resized along the width alone (the height unchanged: one pass)."""
    eye = torch.eye(size_in, dtype=torch.float64).reshape(size_in, 1, 1, size_in)
    out = F.interpolate(eye, size=(1, size_out), mode=mode, antialias=True)
    return (out.reshape(size_in, size_out) != 0).sum(0).tolist()


@pytest.mark.parametrize("interp_size", [2, 4])
def test_tap_counts_are_the_naive_windows(interp_size):
    for size_in in range(1, 41):
        for size_out in range(1, 41):
            assert aa_tap_counts(size_in, size_out, interp_size, False, None, single=False) \
                == naive_taps(size_in, size_out, interp_size), (size_in, size_out)


@pytest.mark.parametrize("mode", sorted(INTERP))
def test_tap_counts_are_what_the_kernel_weights(mode):
    """Every tap the kernel weights is counted, and the counted taps are those (a tap of
    weight exactly 0 at a window's edge would be counted too: none in these sizes)."""
    for size_in, size_out in [(224, 64), (100, 37), (37, 80), (50, 91), (512, 224), (9, 4),
                              (7, 7), (13, 1)]:
        for single in (False, True):
            counted = aa_tap_counts(size_in, size_out, INTERP[mode], False, None, single)
            weighted = kernel_nonzero_taps(size_in, size_out, mode)
            assert all(w <= c for w, c in zip(weighted, counted))
            if size_in != size_out:
                assert counted == weighted, (size_in, size_out, single)


CASES = [((224, 224), (64, 64)), ((512, 384), (224, 224)), ((100, 100), (100, 37)),
         ((37, 50), (80, 91)), ((40, 30), (17, 30))]


@pytest.mark.parametrize("mode", sorted(INTERP))
@pytest.mark.parametrize("sizes", CASES, ids=str)
def test_a_counted_resize_is_two_separable_passes(mode, sizes):
    (h_in, w_in), (h_out, w_out) = sizes
    x = torch.randn(2, 3, h_in, w_in)
    with FlopCounter() as fc:
        F.interpolate(x, size=(h_out, w_out), mode=mode, antialias=True)
    # the width first, at the input's height; then the height, at the output's width
    width = 6 * h_in * sum(kernel_nonzero_taps(w_in, w_out, mode)) if w_out != w_in else 0
    height = 6 * w_out * sum(kernel_nonzero_taps(h_in, h_out, mode)) if h_out != h_in else 0
    assert fc.total.macs == width + height > 0
    assert fc.total.flops == 2 * fc.total.macs


def test_a_resize_to_the_same_size_is_a_copy():
    x = torch.randn(1, 2, 9, 9)
    with FlopCounter() as fc:
        F.interpolate(x, size=(9, 9), mode="bicubic", antialias=True)
    assert fc.total.macs == 0


@pytest.mark.parametrize("mode", sorted(INTERP))
def test_the_backward_spreads_each_gradient_over_its_2d_window(mode):
    x = torch.randn(1, 2, 30, 24, dtype=torch.float64, requires_grad=True)
    y = F.interpolate(x, size=(11, 24), mode=mode, antialias=True)
    with FlopCounter() as fc:
        y.backward(torch.ones_like(y))
    # unchanged dims are windows too in the backward (no pass is skipped)
    rows = sum(naive_taps(30, 11, INTERP[mode]))
    cols = sum(naive_taps(24, 24, INTERP[mode]))
    backward = fc.by_operator()[f"aten._upsample_{mode}2d_aa_backward"]
    assert backward.macs == 2 * rows * cols
    assert backward.flops == 3 * backward.macs
