"""Embedding, gather/scatter and index ops that do arithmetic: the accumulating ones.

Plain gathers and scatters (``embedding``, ``gather``, ``index``, ``index_select``,
``scatter`` without a reduce) only move data and are declared in ``no_arithmetic``. What is
priced here adds (or reduces) into its destination: one operation per source element.
"""

from __future__ import annotations

import torch

from ._registry import Cost, namespace, register_formula
from ._shapes import first_numel, numel

aten = namespace("aten")  # ops this torch lacks read as names, never met


def _twins(*names: str) -> list:
    return aten.present(n for name in names for n in (name, name + "_"))


def _out_of_place(*names: str) -> list:
    # the in-place twins write part of their destination: priced, bytes too, in partial.py
    return aten.present(names)


@register_formula(aten.embedding_dense_backward)
def embedding_dense_backward(grad_out, indices, num_weights, padding_idx, scale_grad_by_freq, *,
                             out_shape, **kw) -> Cost:
    # grad_out: [*indices, d]: each row is added into its weight row; scale_grad_by_freq
    # divides each by its index's count
    return Cost(numel(grad_out) * (1 + bool(scale_grad_by_freq)))


@register_formula([aten._embedding_bag, aten._embedding_bag_forward_only, aten.embedding_bag])
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, *args, out_shape, dtypes, **kw) -> Cost:
    # weight: [num, d]; each index's row is reduced (sum/mean: add, max: compare) into its bag;
    # per-sample weights multiply each row first; mean divides each bag's sum
    looked_up = numel(indices) * weight[-1]
    flops = looked_up * (1 + (per_sample_weights is not None))
    if mode == 1:
        flops += first_numel(out_shape)
    # reads the rows it looks up (at most the table: see partial.py), not the whole table
    rows_read = min(numel(indices), weight[0]) * weight[-1] * dtypes[0].itemsize
    read = rows_read + sum(numel(s) * d.itemsize for s, d in (
        (indices, dtypes[1]), (offsets, dtypes[2]), (per_sample_weights, dtypes[6]
                                                     if len(dtypes) > 6 else None))
        if isinstance(s, torch.Size) and d is not None)
    return Cost(flops, bytes_read=read)


@register_formula([aten._embedding_bag_backward, aten._embedding_bag_dense_backward,
                   aten._embedding_bag_sparse_backward])
def embedding_bag_backward(grad, indices, *args, out_shape, **kw) -> Cost:
    # grad: [bags, d]: each looked-up row receives its bag's gradient (an add)
    return Cost(numel(indices) * grad[-1])


@register_formula(_out_of_place("scatter"))
def scatter(x, dim, index, src, *args, out_shape, **kwargs) -> Cost:
    # scatter with reduce="add"/"multiply" combines each source element; without, a copy
    return Cost(numel(index) if kwargs.get("reduce", args[0] if args else None) else 0)


@register_formula(_out_of_place("scatter_add"))
def scatter_add(x, dim, index, src, *, out_shape, **kw) -> Cost:
    return Cost(numel(index))


@register_formula(_out_of_place("scatter_reduce"))
def scatter_reduce(x, dim, index, src, reduce, *args, out_shape, **kw) -> Cost:
    # one reduction per source element; mean divides each output element once
    return Cost(numel(index) + (first_numel(out_shape) if reduce == "mean" else 0))


@register_formula(_out_of_place("index_add"))
def index_add(x, dim, index, source, *args, out_shape, **kwargs) -> Cost:
    alpha = kwargs.get("alpha", args[0] if args else 1)
    return Cost(numel(source) * (1 + (alpha != 1)))


@register_formula(_twins("index_reduce"))
def index_reduce(x, dim, index, source, reduce, *args, out_shape, **kw) -> Cost:
    return Cost(numel(source) + (first_numel(out_shape) if reduce == "mean" else 0))


@register_formula(_twins("put"))
def put(x, index, source, accumulate=False, *, out_shape, **kw) -> Cost:
    return Cost(numel(source) if accumulate else 0)


def indexed_elements(x, indices, index_dtypes) -> int:
    """Elements that ``x[indices]`` selects. Integer indices broadcast together; a boolean
    mask selects as many elements as it has True values, a tensor value the formula never
    sees, so it is priced at the mask's size (an upper bound). A ``None`` keeps its dim."""
    shapes, kept, dim = [], 1, 0
    for i, shape in enumerate(indices):
        dtype = index_dtypes[i] if index_dtypes else None
        if shape is None:
            kept *= x[dim] if dim < len(x) else 1
            dim += 1
        elif dtype in (torch.bool, torch.uint8):
            shapes.append(torch.Size([numel(shape)]))
            dim += len(shape)
        else:
            shapes.append(shape)
            dim += 1
    kept *= numel(x[dim:])
    return (numel(torch.broadcast_shapes(*shapes)) if shapes else 1) * kept


@register_formula(_out_of_place("index_put", "_unsafe_index_put"))
def index_put(x, indices, values, accumulate=False, *args, out_shape, dtypes=None,
              **kw) -> Cost:
    # accumulate=True adds every value into its position; False only writes
    if not accumulate:
        return Cost(0)
    index_dtypes = dtypes[1] if dtypes is not None and len(dtypes) > 1 else None
    return Cost(max(numel(values), indexed_elements(x, indices, index_dtypes)))


@register_formula(aten._unsafe_masked_index_put_accumulate)
def masked_index_put_accumulate(x, mask, indices, values, *, out_shape, **kw) -> Cost:
    # what index_put(accumulate=True) decomposes to: every value is added in (masked ones add 0)
    return Cost(numel(values))


@register_formula(aten.nonzero)
def nonzero(x, *, out_shape, **kw) -> Cost:
    # one comparison with zero per element
    return Cost(numel(x))


# where(condition) alone is nonzero; where(cond, x, y) stays the pointwise select
register_formula([aten.where.default, aten.argwhere, aten.nonzero_static], override=True)(nonzero)


@register_formula([getattr(aten, f"{kind}_pad{d}d_backward")
                   for kind in ("reflection", "replication") for d in (1, 2, 3)])
def pad_backward(grad_out, x, padding, *, out_shape, **kw) -> Cost:
    # reflected and replicated borders read an input element more than once: their gradients
    # are added back, one add per gradient element
    return Cost(numel(grad_out))


@register_formula(aten.equal)
def equal(a, b, *, out_shape, **kw) -> Cost:
    # one comparison per element (at most: it stops at the first difference)
    return Cost(numel(a))
