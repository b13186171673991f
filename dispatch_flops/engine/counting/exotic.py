"""The slow path: calls with tensors the hot path cannot key (sparse, nested, symbolically
sized), keyed by what they really store and priced where a formula can price them; the
others counted as their op's unsupported twin, their bytes as well as they can be told.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dispatch_flops.engine.counting.calls import (
    EXOTIC,
    FORMULA,
    WRITE,
    compute_dtype,
    scalar_key,
    script_key,
)
from dispatch_flops.engine.counting.nested import nested_shapes, per_sequence
from dispatch_flops.engine.counting.records import Signature
from dispatch_flops.engine.torch_private import NestedTensor as _Jagged
from dispatch_flops.formulas import SparseInfo


class _Unpriced(Exception):
    """A call no formula can price: nested tensors, symbolic sizes without a size hint, a
    sparse argument to a formula that does not take ``layouts``."""


_SPARSE_LAYOUTS = {torch.sparse_coo: "sparse_coo", torch.sparse_csr: "sparse_csr",
                   torch.sparse_csc: "sparse_csc", torch.sparse_bsr: "sparse_bsr",
                   torch.sparse_bsc: "sparse_bsc"}


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


_SOME_FLOAT = 0.5  # stands for a float without a value (see _exotic_call)


def _hint(v):
    """A size or scalar as a plain number: a symbolic one (fake tensors under a ShapeEnv,
    dynamic shapes at compile time) by its hint; ``_Unpriced`` for one without a hint
    (unbacked)."""
    if isinstance(v, _SYMBOLIC):
        node = v.node
        if not node.has_hint():
            raise _Unpriced
        return node.hint
    return v


def _sparse_parts(t: Tensor) -> tuple:
    """(values, index tensors) of a sparse tensor: what it really stores. Its accessors are
    ops: they run below autograd (a view of a leaf that requires grad is autograd's work:
    done inside dispatch it can block, and it is not the user's) and out of sight of every
    dispatch mode (a counter below this one would count them as the user's)."""
    with torch._C._DisableTorchDispatch(), torch._C._AutoDispatchBelowAutograd():
        if t.layout is torch.sparse_coo:
            return t._values(), (t._indices(),)
        if t.layout in (torch.sparse_csr, torch.sparse_bsr):
            return t.values(), (t.crow_indices(), t.col_indices())
        return t.values(), (t.ccol_indices(), t.row_indices())


def _described(t: Tensor) -> tuple:
    """``(key, shape, bytes, SparseInfo or None)`` of a tensor the hot path cannot key: a
    sparse one (keyed and priced by what it stores: values and indices) or one with symbolic
    sizes (by their hints). ``_Unpriced`` for a nested tensor."""
    if t.is_nested:
        raise _Unpriced
    shape = torch.Size([_hint(s) for s in t.shape])
    layout = _SPARSE_LAYOUTS.get(t.layout)
    if layout is None:
        strides = tuple(_hint(s) for s in t.stride())
        elements = 1
        for size, stride in zip(shape, strides):
            if stride or not size:
                elements *= size
        return (shape, t.dtype, strides), shape, elements * t.element_size(), None
    values, indices = _sparse_parts(t)
    stored = values.numel()
    nbytes = values.nbytes + sum(i.nbytes for i in indices)
    return (shape, t.dtype, layout, stored), shape, nbytes, SparseInfo(layout, stored)


def _nested_bytes(t: Tensor) -> int:
    """Bytes a nested tensor holds, read from its metadata alone: ``values()`` is an op (a
    mode below would see it) that autograd records, and inside dispatch, on a leaf that
    requires grad, it blocks forever. A jagged one holds its values, offsets and lengths
    (plain tensors it keeps as attributes); a strided one (C++) answers ``nbytes`` from its
    sizes."""
    if isinstance(t, _Jagged):
        parts = (t._values, t._offsets, t._lengths)
        return sum(_loose_bytes(p) for p in parts if p is not None)
    return t.nbytes


def _loose_bytes(v) -> int:
    """Bytes of what ``v`` really holds, as well as they can be told (0 where not)."""
    if isinstance(v, Tensor):
        try:
            return _nested_bytes(v) if v.is_nested else _described(v)[2]
        except (_Unpriced, RuntimeError, AttributeError, TypeError):
            return 0
    if v.__class__ is list or v.__class__ is tuple:
        return sum(_loose_bytes(x) for x in v)
    return 0


def _exotic_call(resolved, key: int, args, kwargs, out) -> tuple:
    """``(signature key, Signature)`` of a call with sparse or symbolically sized tensors:
    tensors described by ``_described`` (sparse ones pass a ``SparseInfo`` per argument to a
    formula that takes ``layouts``). ``_Unpriced`` when no formula can price it."""

    def part(v):  # (key, formula's view, bytes, sparse info)
        if isinstance(v, Tensor):
            if v.is_nested:
                shapes = nested_shapes(v)
                if shapes is None:
                    raise _Unpriced
                return shapes, shapes, _nested_bytes(v), None
            return _described(v)
        if v.__class__ is list or v.__class__ is tuple:
            parts = [part(x) for x in v]
            return (tuple(p[0] for p in parts), [p[1] for p in parts],
                    sum(p[2] for p in parts), None)
        if isinstance(v, torch.ScriptObject):  # as the formula sees it on the hot path
            described = script_key(v)
            return described, described, 0, None
        if isinstance(v, torch.SymFloat) and not v.node.has_hint():
            # a float read from a tensor (``item()`` on fake tensors): a value formulas do not
            # tell apart, as eager's floats outside the few they do
            return scalar_key(_SOME_FLOAT), _SOME_FLOAT, 0, None
        v = _hint(v)
        return scalar_key(v), v, 0, None

    a = [part(x) for x in args]
    kw = {k: part(v) for k, v in kwargs.items()} if kwargs else {}
    o = part(out)
    if resolved.kind == FORMULA and not resolved.with_layouts and (
            any(p[3] for p in a) or any(p[3] for p in kw.values()) or o[3]):
        raise _Unpriced  # its formula would price the dense shapes
    read = 0
    if resolved.kind != WRITE:
        read = sum(p[2] for p in a) + sum(p[2] for k, p in kw.items()
                                           if k not in resolved.write_only)
    written = o[2]
    if out is None and resolved.mutated:
        written = sum(a[i][2] for i in resolved.mutated if i < len(a))
    call = None
    if resolved.kind == FORMULA:
        formula_kw = {k: p[1] for k, p in kw.items()}
        sparse = [p[3] for p in a]
        for keyword in resolved.keywords:
            formula_kw[keyword.name] = keyword.value(args, resolved, sparse)
        call = ([p[1] for p in a], o[1], formula_kw)
        try:  # nested tensors: one formula call per sequence (see engine.counting.nested)
            call = per_sequence(*call) or call
        except ValueError:
            raise _Unpriced from None
    sig = (key, EXOTIC, tuple(p[0] for p in a), tuple((k, p[0]) for k, p in kw.items()), o[0])
    return sig, Signature(call, read, written, resolved.dtype or compute_dtype(args))


def exotic_record(mode, key: int, resolved, acc: dict, args, kwargs, out) -> list:
    """The record of a call the hot path cannot key (see ``_exotic_call``), made in ``acc``
    and kept in ``mode``'s book; a call no formula can price goes to the op's unsupported
    twin (keyed ``-key``), its bytes counted as well as they can be."""
    try:
        sig, signature = _exotic_call(resolved, key, args, kwargs, out)
    except _Unpriced:
        if -key not in mode.resolved:
            mode.keep_resolution(-key, resolved.unpriced())
        read = _loose_bytes(list(args) + list((kwargs or {}).values()))
        written = _loose_bytes(out)
        sig, signature = (-key, EXOTIC, read, written), Signature(None, read, written)
    rec = acc.get(sig)
    if rec is None:
        rec = acc[sig] = [0, 0, signature]
        mode.book(rec)
    return rec
