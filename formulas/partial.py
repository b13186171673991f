"""Bytes of ops that touch only part of a tensor: partial writes and row gathers.

The engine's rule (every tensor input read, every output written) is right for most ops and
wrong for these by the size of a whole tensor: writing 10 rows into a 1024 x 1024 KV-cache
buffer with ``index_copy_`` would count 4 MB read and written instead of ~41 KB. Their
``Cost`` carries the bytes (see "Bytes" in ``_registry``):

* a partial write reads its source and indices, reads the destination only where it combines
  with it (an accumulating ``index_put_``, ``scatter_add_``), and writes the region it
  addresses;
* a gather (``embedding``) reads the table rows it looks up: ``min(lookups, rows)`` of them,
  since a row looked up twice is one row of the table (the unique-bytes rule every op follows);
  which rows are distinct is a tensor value, so this is an upper bound on the distinct rows.

Out-of-place twins (``index_copy``, ``index_put``, ``scatter``) read and write whole tensors
and keep the engine's rule. Shapes are counted dense (``numel * itemsize``).
"""

from __future__ import annotations

import torch

from ._registry import REGISTRY, Cost, Movement, namespace, register_formula
from ._shapes import numel
from .indexing import index_add, index_put, indexed_elements, scatter, scatter_reduce

aten = namespace("aten")  # ops this torch lacks read as names, never met


def _size(dtype) -> int:
    return dtype.itemsize if isinstance(dtype, torch.dtype) else 0


def _tensor_bytes(shape, dtype) -> int:
    """Dense bytes of one tensor argument (0 for a scalar or ``None``)."""
    return numel(shape) * _size(dtype) if isinstance(shape, torch.Size) else 0


def _list_bytes(shapes, dtypes) -> int:
    return sum(_tensor_bytes(s, d) for s, d in zip(shapes, dtypes or ()))


def copy(x, src, *args, out_shape, dtypes, **kw) -> Cost:
    # x: the destination (a slice of a buffer for slice assignment), written whole; its old
    # values are never read. src broadcasts to x.
    return Cost(0, bytes_read=_tensor_bytes(src, dtypes[1]),
                bytes_written=numel(x) * _size(dtypes[0]))


def index_copy_(x, dim, index, source, *, out_shape, dtypes, **kw) -> Cost:
    # x: [..., n, ...]; source: x's shape with len(index) at dim: the rows written
    return Cost(0, bytes_read=_tensor_bytes(index, dtypes[2]) + _tensor_bytes(source, dtypes[3]),
                bytes_written=numel(source) * _size(dtypes[0]))


REGISTRY.no_arithmetic([aten.copy, aten.copy_], Movement.COPY, bytes=copy)
REGISTRY.no_arithmetic([aten.index_copy_], Movement.COPY, bytes=index_copy_)


@register_formula([aten.index_put_, aten._index_put_impl_])
def index_put_(x, indices, values, accumulate=False, *args, out_shape, dtypes, **kw) -> Cost:
    # the region: the elements the indices address (a boolean mask: its size, an upper
    # bound); accumulate=True adds into it, so reads it too
    region = indexed_elements(x, indices, dtypes[1]) * _size(dtypes[0])
    read = _list_bytes(indices, dtypes[1]) + _tensor_bytes(values, dtypes[2])
    cost = index_put(x, indices, values, accumulate, out_shape=out_shape, dtypes=dtypes)
    return Cost(cost.flops, bytes_read=read + (region if accumulate else 0),
                bytes_written=region)


def _scatter_bytes(x, index, src, dtypes, reads_destination: bool) -> tuple[int, int]:
    # one destination element per index element; src is read where index reaches (src may
    # be larger than index) or is a scalar
    region = numel(index) * _size(dtypes[0])
    read = _tensor_bytes(index, dtypes[2])
    if isinstance(src, torch.Size):
        read += numel(index) * _size(dtypes[3])
    return read + (region if reads_destination else 0), region


@register_formula(aten.scatter_)
def scatter_(x, dim, index, src, *args, out_shape, dtypes, **kwargs) -> Cost:
    cost = scatter(x, dim, index, src, *args, out_shape=out_shape, **kwargs)
    read, written = _scatter_bytes(x, index, src, dtypes, reads_destination=cost.flops > 0)
    return Cost(cost.flops, bytes_read=read, bytes_written=written)


@register_formula(aten.scatter_add_)
def scatter_add_(x, dim, index, src, *, out_shape, dtypes, **kw) -> Cost:
    read, written = _scatter_bytes(x, index, src, dtypes, reads_destination=True)
    return Cost(numel(index), bytes_read=read, bytes_written=written)


@register_formula(aten.scatter_reduce_)
def scatter_reduce_(x, dim, index, src, reduce, *args, out_shape, dtypes, **kwargs) -> Cost:
    include_self = kwargs.get("include_self", args[0] if args else True)
    cost = scatter_reduce(x, dim, index, src, reduce, out_shape=out_shape)
    read, written = _scatter_bytes(x, index, src, dtypes, reads_destination=include_self)
    return Cost(cost.flops, bytes_read=read, bytes_written=written)


@register_formula(aten.index_add_)
def index_add_(x, dim, index, source, *args, out_shape, dtypes, **kwargs) -> Cost:
    # adds source into len(index) slices of x at dim: reads and writes that region
    region = numel(source) * _size(dtypes[0])
    read = _tensor_bytes(index, dtypes[2]) + _tensor_bytes(source, dtypes[3]) + region
    cost = index_add(x, dim, index, source, *args, out_shape=out_shape, **kwargs)
    return Cost(cost.flops, bytes_read=read, bytes_written=region)


def embedding(weight, indices, *args, out_shape, dtypes, **kw) -> Cost:
    # weight: [rows, d]; each lookup gathers one row; the output is written whole (engine)
    rows = min(numel(indices), weight[0])
    return Cost(0, bytes_read=rows * numel(weight[1:]) * _size(dtypes[0])
                + _tensor_bytes(indices, dtypes[1]))


REGISTRY.no_arithmetic([aten.embedding], Movement.COPY, bytes=embedding)
