"""Pairwise distances: cdist, pdist and the matmul form of the euclidean distance.

Direct form, per (pair, coordinate): subtract, |.| or square, accumulate (3), or with a
general p also a pow (4); per pair the final root (for p = 2 a sqrt, for a general p a pow).
The euclidean matmul form (``_euclidean_dist``, which cdist picks for p = 2 when a side has
more than 25 rows) is |x|^2 + |y|^2 - 2 x.y as one matmul over coordinates padded by two.
"""

from __future__ import annotations

import math

import torch

from ._registry import Cost, namespace, register_formula
from ._shapes import numel

aten = namespace("aten")  # ops this torch lacks read as names, never met


def _per_coordinate(p: float) -> tuple[int, int]:
    """(flops per pair and coordinate, flops per pair) of the direct p-norm distance."""
    if p in (1, 2, math.inf, 0):
        return 3, int(p == 2)
    return 4, 1


def _batch(x1, x2) -> int:
    """Batch elements of a pairwise distance: x1 [*b1, P, M] and x2 [*b2, R, M] broadcast
    their batch dims."""
    return numel(torch.broadcast_shapes(tuple(x1[:-2]), tuple(x2[:-2])))


def direct_cost(x1, x2, p: float) -> int:
    # x1: [*b, P, M], x2: [*b, R, M] (batch dims broadcast)
    pairs = _batch(x1, x2) * x1[-2] * x2[-2]
    per_coordinate, per_pair = _per_coordinate(p)
    return pairs * (x1[-1] * per_coordinate + per_pair)


def euclidean_cost(x1, x2) -> Cost:
    batch, p_rows, m = _batch(x1, x2), x1[-2], x1[-1]
    r_rows = x2[-2]
    macs = batch * p_rows * r_rows * (m + 2)
    norms = 2 * batch * (p_rows + r_rows) * m  # square and accumulate each row
    return Cost(2 * macs + norms + 2 * batch * p_rows * r_rows, macs)  # clamp and sqrt


@register_formula(aten._cdist_forward)
def cdist_forward(x1, x2, p, compute_mode=None, *, out_shape, **kw) -> Cost:
    return Cost(direct_cost(x1, x2, p))


@register_formula(aten._euclidean_dist)
def euclidean_dist(x1, x2, *, out_shape, **kw) -> Cost:
    return euclidean_cost(x1, x2)


@register_formula(aten.cdist)
def cdist(x1, x2, p=2.0, compute_mode=None, *, out_shape, **kw) -> Cost:
    # the composite (inference_mode) picks the matmul form as its decomposition would
    rows = max(x1[-2], x2[-2])
    if p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and rows > 25)):
        return euclidean_cost(x1, x2)
    return Cost(direct_cost(x1, x2, p))


@register_formula(aten._cdist_backward)
def cdist_backward(grad, x1, x2, p, dist, *, out_shape, **kw) -> Cost:
    # per (pair, coordinate): the difference, its scaled sign or ratio to the distance, times
    # the pair's gradient, accumulated into x1's gradient (4)
    return Cost(4 * _batch(x1, x2) * x1[-2] * x2[-2] * x1[-1])


@register_formula(aten._pdist_forward)
def pdist_forward(x, p=2.0, *, out_shape, **kw) -> Cost:
    # x: [n, m]: the n (n - 1) / 2 pairs of rows
    per_coordinate, per_pair = _per_coordinate(p)
    return Cost(numel(out_shape) * (x[-1] * per_coordinate + per_pair))


@register_formula(aten._pdist_backward)
def pdist_backward(grad, x, p, dist, *, out_shape, **kw) -> Cost:
    return Cost(4 * numel(dist) * x[-1])
