"""Small shape helpers shared by the formula modules."""

from __future__ import annotations

from math import prod
from typing import NamedTuple, Sequence

import torch


class SparseInfo(NamedTuple):
    """What a sparse tensor argument stores, for formulas that take ``layouts`` (see the
    formula contract): its layout (``"sparse_coo"``, ``"sparse_csr"``, ``"sparse_csc"``,
    ``"sparse_bsr"``, ``"sparse_bsc"``) and ``nnz``, the scalar values it stores (a BSR
    block of 2 x 3 is 6)."""

    layout: str
    nnz: int


class PackedWeight(NamedTuple):
    """A quantised op's packed weights (``LinearPackedParamsBase``, ``Conv2dPackedParamsBase``,
    ...), as a formula sees the TorchScript object: its weight's shape, whether it has a
    bias, and for a convolution its stride, padding, dilation, groups and whether it is
    transposed (empty or 1 for a linear)."""

    kind: str  # the TorchScript class's name
    weight: tuple
    bias: bool
    stride: tuple = ()
    padding: tuple = ()
    dilation: tuple = ()
    groups: int = 1
    transposed: bool = False


def numel(shape: Sequence[int]) -> int:
    return prod(shape)


def first_numel(out_shape) -> int:
    """Elements of an op's (first) output: ops returning a tuple report their first tensor."""
    if isinstance(out_shape, torch.Size):
        return prod(out_shape)
    if isinstance(out_shape, (list, tuple)) and out_shape and isinstance(out_shape[0], torch.Size):
        return prod(out_shape[0])
    return 0


def list_numel(shapes) -> int:
    """Elements of a tensor list (``Tensor[]`` arguments arrive as lists of shapes)."""
    return sum(prod(s) for s in shapes if isinstance(s, torch.Size))


def is_complex(dtypes) -> bool:
    """Whether any tensor argument is complex (``dtypes`` as the formula contract gives it)."""
    for d in dtypes:
        if isinstance(d, list):
            if any(x is not None and x.is_complex for x in d):
                return True
        elif d is not None and d.is_complex:
            return True
    return False


def dims(dim, ndim: int) -> list[int]:
    """A reduction's ``dim`` argument as a list of non-negative dims (None or [] = all)."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return [d % ndim if ndim else 0 for d in dim]
