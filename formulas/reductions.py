"""Reductions (sum, mean, var/std, norms, amax/argmax, logsumexp), cumulative ops, sorting and
selection.

A reduction of ``n`` input elements into ``m`` outputs costs ``ELEMENT_COSTS[key]`` per input
element (the accumulator starts at the identity and meets every element: n operations, not
n - m) plus the finishing work per output (mean's divide, std's sqrt), stated next to each op.
Never MACs: nothing is multiplied into an accumulator but the element itself.
"""

from __future__ import annotations

import math

import torch

from ._registry import Cost, namespace, register_formula
from ._shapes import first_numel, list_numel, numel
from .costs import ELEMENT_COSTS
from .pointwise import unit_cost

aten = namespace("aten")  # ops this torch lacks read as names, never met


def _ops(names: str) -> list:
    return aten.present(names.split())


def reduction(key: str, per_output: int = 0):
    """A formula: ``ELEMENT_COSTS[key]`` per input element + ``per_output`` per output element."""

    def formula(x, *args, out_shape, dtypes=None, **kwargs) -> Cost:
        return Cost(numel(x) * unit_cost(key, dtypes) + per_output * first_numel(out_shape))

    formula.__name__ = f"reduction_{key}"
    return formula


# sum, prod, extremes, logic: one operation per input element
register_formula(_ops("sum prod amax amin argmax argmin max min any all _foreach_max"))(
    reduction("reduce"))
register_formula(_ops("mean"))(reduction("mean", per_output=1))  # + one divide per output
register_formula(_ops("nansum"))(reduction("nansum"))
register_formula(_ops("nanmean"))(reduction("nansum", per_output=1))
register_formula(_ops("count_nonzero"))(reduction("count_nonzero"))
# var: two divides per output (the mean's and the variance's); std adds a sqrt
register_formula(_ops("var var_mean"))(reduction("var", per_output=2))
register_formula(_ops("std std_mean"))(reduction("var", per_output=3))
# logsumexp: a log and the add-back of the max per output
register_formula(_ops("logsumexp"))(reduction("logsumexp", per_output=2))
register_formula(_ops("cumsum cumprod cummax cummin _cummax_helper _cummin_helper"))(
    reduction("cumulative"))
register_formula(_ops("logcumsumexp"))(reduction("logcumsumexp"))


@register_formula(aten.aminmax)
def aminmax(x, *args, out_shape, **kwargs) -> Cost:
    # two comparisons per element: one for the min, one for the max
    return Cost(2 * numel(x) * ELEMENT_COSTS["reduce"])


def _norm_key(p) -> tuple[str, int]:
    """Per-element cost key and per-output finishing flops of a p-norm."""
    if p is None or p == 2:
        return "norm_2", 1  # sqrt per output
    if p == 1:
        return "norm_1", 0
    if p in (math.inf, -math.inf):
        return "norm_inf", 0
    if p == 0:
        return "norm_0", 0
    return "norm_p", 1  # the 1/p power per output


@register_formula(aten.linalg_vector_norm)
def linalg_vector_norm(x, ord=2, *args, out_shape, **kwargs) -> Cost:
    key, finish = _norm_key(kwargs.get("ord", ord))
    return Cost(numel(x) * ELEMENT_COSTS[key] + finish * first_numel(out_shape))


@register_formula(aten.norm)
def norm(x, p=2, *args, out_shape, **kwargs) -> Cost:
    key, finish = _norm_key(kwargs.get("p", p))
    return Cost(numel(x) * ELEMENT_COSTS[key] + finish * first_numel(out_shape))


@register_formula(aten._foreach_norm)
def foreach_norm(tensors, ord=2, *args, out_shape, **kwargs) -> Cost:
    key, finish = _norm_key(ord)
    return Cost(list_numel(tensors) * ELEMENT_COSTS[key] + finish * len(tensors))


@register_formula(aten.histc)
def histc(x, bins=100, min=0, max=0, *, out_shape, **kwargs) -> Cost:
    # min == max: the range is the data's, found first with a min and a max pass
    range_pass = 2 if min == max else 0
    return Cost(numel(x) * (ELEMENT_COSTS["histogram"] + range_pass))


@register_formula(aten.bincount)
def bincount(x, weights=None, minlength=0, *, out_shape, **kwargs) -> Cost:
    # one increment (or weighted add) per element
    return Cost(numel(x))


# ---- ordering ------------------------------------------------------------------------------


def _log2_ceil(n: int) -> int:
    return (n - 1).bit_length() if n > 1 else 0


def _row_length(x, dim: int) -> int:
    return x[dim] if len(x) else 1


@register_formula(_ops("sort argsort"))
def sort(x, *args, out_shape, **kwargs) -> Cost:
    # sort(self, dim=-1, descending=False); sort.stable(self, *, stable, dim=-1, descending)
    n = _row_length(x, kwargs.get("dim", args[0] if args else -1))
    return Cost(numel(x) * _log2_ceil(n) * ELEMENT_COSTS["comparison"])


@register_formula(aten.msort)
def msort(x, *, out_shape, **kwargs) -> Cost:
    return Cost(numel(x) * _log2_ceil(_row_length(x, 0)) * ELEMENT_COSTS["comparison"])


@register_formula(aten.topk)
def topk(x, k, dim=-1, *args, out_shape, **kwargs) -> Cost:
    # a k-heap: each element costs at most ceil(log2(k + 1)) comparisons
    return Cost(numel(x) * _log2_ceil(k + 1) * ELEMENT_COSTS["comparison"])


@register_formula(_ops("kthvalue median nanmedian mode"))
def selection(x, *args, out_shape, **kwargs) -> Cost:
    return Cost(numel(x) * ELEMENT_COSTS["selection"])


@register_formula(_ops("_unique2 unique_dim unique_consecutive _unique unique_dim_consecutive"))
def unique(x, *args, out_shape, **kwargs) -> Cost:
    # sort-based: a sort of all elements, then one comparison per element
    n = numel(x)
    return Cost(n * (_log2_ceil(n) + 1) * ELEMENT_COSTS["comparison"])


@register_formula(aten.searchsorted)
def searchsorted(sorted_sequence, queries, *args, out_shape, **kwargs) -> Cost:
    # binary search: ceil(log2(n + 1)) comparisons per query in a sorted row of n
    n = sorted_sequence[-1] if len(sorted_sequence) else 1
    return Cost(first_numel(out_shape) * _log2_ceil(n + 1) * ELEMENT_COSTS["comparison"])


@register_formula(aten.bucketize)
def bucketize(queries, boundaries, *args, out_shape, **kwargs) -> Cost:
    n = boundaries[-1] if len(boundaries) else 1
    return Cost(first_numel(out_shape) * _log2_ceil(n + 1) * ELEMENT_COSTS["comparison"])


# torch's switch (aten/src/ATen/native/TensorCompare.cpp, isin_Tensor_Tensor_out): a test
# set smaller than 10 * E^0.145 is searched element by element, a larger one by sorting
def isin_sorts(elements: int, tests: int) -> bool:
    return tests >= 10.0 * float(elements) ** 0.145


@register_formula(aten.isin)
def isin(elements, test_elements, *args, out_shape, **kwargs) -> Cost:
    # isin.Tensor_Tensor(elements, test_elements); .Tensor_Scalar and .Scalar_Tensor give a
    # number for one side: a set (or a query) of one
    e = numel(elements) if isinstance(elements, torch.Size) else 1
    t = numel(test_elements) if isinstance(test_elements, torch.Size) else 1
    if isinstance(elements, torch.Size) and isinstance(test_elements, torch.Size) and \
            isin_sorts(e, t):
        # a sort of both sets together, then each sorted neighbour compared once
        n = e + t
        return Cost(n * _log2_ceil(n) * ELEMENT_COSTS["comparison"] + (n - 1))
    # element by element: a comparison and an or per (element, test element) pair
    return Cost(e * t * (ELEMENT_COSTS["eq"] + ELEMENT_COSTS["logical_or"]))
