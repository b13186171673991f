"""FFTs, in real flops, by the convention FFTW's benchmarks report: a complex transform of
length N costs 5 N log2 N, a real-input (or real-output) one half that, 2.5 N log2 N, whatever
algorithm runs (for sizes that are not powers of two this is a nominal count). A transform
over several dims sums its per-dim passes: 5 * numel * sum(log2 N_d). A normalisation
(``normalization`` != 0) scales every output element: 2 flops per complex, 1 per real one.
"""

from __future__ import annotations

import math

from ._registry import Cost, namespace, register_formula
from ._shapes import numel

aten = namespace("aten")  # ops this torch lacks read as names, never met


def _passes(shape, dim) -> float:
    return sum(math.log2(shape[d]) for d in dim if shape[d] > 0)


@register_formula(aten._fft_c2c)
def fft_c2c(x, dim, normalization, forward, *, out_shape, **kw) -> Cost:
    n = numel(x)
    return Cost(round(5 * n * _passes(x, dim)) + (2 * n if normalization else 0))


@register_formula(aten._fft_r2c)
def fft_r2c(x, dim, normalization, onesided, *, out_shape, **kw) -> Cost:
    return Cost(round(2.5 * numel(x) * _passes(x, dim))
                + (2 * numel(out_shape) if normalization else 0))


@register_formula(aten._fft_c2r)
def fft_c2r(x, dim, normalization, last_dim_size, *, out_shape, **kw) -> Cost:
    n = numel(out_shape)
    return Cost(round(2.5 * n * _passes(out_shape, dim)) + (n if normalization else 0))
