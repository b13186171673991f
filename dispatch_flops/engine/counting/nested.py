"""Nested tensors as the formulas see them: one dense shape per sequence.

A call on nested tensors (``torch.nested``: jagged or strided) is priced per sequence: each
nested argument (and output) becomes, for sequence ``i``, the dense shape of its ``i``-th
component with a batch of 1 (a jagged ``[B, j, D]`` tensor is ``[1, n_i, D]`` for sequence
``i``), dense arguments stay as they are (weights, biases), and the formula's costs are
summed over the sequences (sequences of the same shapes priced once, times their count). A
``Linear`` on a jagged batch costs its ``Σ n_i`` tokens, an attention ``Σ n_i²`` pairs, the
encoder fast path its per-sequence closed form: what the kernels run on the unpadded data.

Sizes are read from metadata, never from the data:

* a strided nested tensor keeps its sizes in a CPU tensor (``_nested_tensor_size()``): read;
* a jagged tensor's lengths are its offsets' differences (or its ``lengths``). When its cached
  min and max sequence lengths agree (``_maybe_min_seqlen``: the shapes of two empty
  tensors, no sync), every length is known without reading anything. Otherwise the offsets
  are read, once per offsets tensor (jagged tensors made from one another share it, so a
  whole forward over a batch reads them once; cached by identity and version). On a CPU that
  is a memory read; on an accelerator it is one device-to-host copy per batch, not per call.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from dispatch_flops.engine.torch_private import NestedTensor as Jagged


class NestedShapes(NamedTuple):
    """A nested tensor in a signature: its dtype and, per sequence, the dense shape of its
    component with a batch of 1."""

    dtype: torch.dtype
    components: tuple  # of tuples of ints, one per sequence


# offsets tensors already read: id -> (weak reference, version, lengths); bounded
_LENGTHS: dict = {}
_LENGTHS_KEPT = 64


def _read(t: Tensor) -> list:
    """The values of a small integer tensor, read below autograd and out of sight of every
    dispatch mode (a mode below the counter would count the read as the user's op)."""
    with torch._C._DisableTorchDispatch(), torch._C._AutoDispatchBelowAutograd():
        return t.tolist()


def tensor_values(t: Tensor) -> tuple:
    """The values of a small integer tensor (a jagged tensor's offsets or lengths, a varlen
    kernel's cumulative sequence lengths), read once per tensor (while its version is
    unchanged)."""
    key = id(t)
    found = _LENGTHS.get(key)
    if found is not None and found[0]() is t and found[1] == t._version:
        return found[2]
    values = tuple(_read(t))
    if len(_LENGTHS) >= _LENGTHS_KEPT:
        for k in [k for k, v in _LENGTHS.items() if v[0]() is None] or list(_LENGTHS)[:1]:
            _LENGTHS.pop(k, None)
    _LENGTHS[key] = (weakref.ref(t), t._version, values)
    return values


def jagged_lengths(t: Jagged) -> tuple:
    """Each sequence's length along the jagged dimension (see the module's docstring)."""
    if t._lengths is not None:
        return tensor_values(t._lengths)
    batch = t._offsets.shape[0] - 1
    low, high = t._maybe_min_seqlen, t._maybe_max_seqlen
    if low is not None and low == high:
        return (low,) * batch
    bounds = tensor_values(t._offsets)
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def nested_shapes(t: Tensor) -> Optional[NestedShapes]:
    """``t`` as per-sequence shapes, None for a nested tensor whose sizes cannot be read
    without its data (a jagged tensor under a fake or functional mode)."""
    try:
        if isinstance(t, Jagged):
            ragged = t._ragged_idx
            size = t._size
            fixed = [None if i == ragged else int(s) for i, s in enumerate(size)]
            components = tuple(
                tuple(1 if i == 0 else (n if i == ragged else fixed[i])
                      for i in range(len(size)))
                for n in jagged_lengths(t))
            return NestedShapes(t.dtype, components)
        with torch._C._DisableTorchDispatch(), torch._C._AutoDispatchBelowAutograd():
            sizes = t._nested_tensor_size().tolist()
        return NestedShapes(t.dtype, tuple((1,) + tuple(s) for s in sizes))
    except Exception:  # a fake, functional or symbolic nested tensor: its sizes are unknown
        return None


class PerSequence(tuple):
    """A nested call's formula calls: ``((count, (args, out_shape, kwargs)), ...)``, one per
    distinct per-sequence shapes, priced as the sum of ``count`` times each."""


def _one(view, i: int, batch: int, output: bool):
    if isinstance(view, NestedShapes):
        return torch.Size(view.components[i])
    if view.__class__ is list:
        return [_one(v, i, batch, output) for v in view]
    if output and isinstance(view, torch.Size) and len(view) and view[0] == batch:
        # a dense output of a nested call (a reduction over the jagged dim): [B, ...]
        return torch.Size((1,) + tuple(view[1:]))
    return view


def _nested_in(view, found: list) -> None:
    if isinstance(view, NestedShapes):
        found.append(len(view.components))
    elif view.__class__ is list:
        for v in view:
            _nested_in(v, found)


def per_sequence(args: list, out_shape, kwargs: dict) -> Optional[PerSequence]:
    """The formula calls of a call whose arguments (formula views: ``NestedShapes`` for
    nested tensors) hold nested tensors, one per sequence, grouped; None when none does.
    ``ValueError`` when the nested tensors disagree on the number of sequences."""
    batches: list = []
    for view in list(args) + list(kwargs.values()) + [out_shape]:
        _nested_in(view, batches)
    if not batches:
        return None
    batch = batches[0]
    if any(b != batch for b in batches):
        raise ValueError(f"nested tensors of {sorted(set(batches))} sequences in one call")
    grouped: dict = {}
    for i in range(batch):
        call = ([_one(a, i, batch, False) for a in args], _one(out_shape, i, batch, True),
                {k: _one(v, i, batch, False) for k, v in kwargs.items()})
        key = repr(call)  # shapes, numbers and names: their repr tells calls apart
        if key in grouped:
            grouped[key][0] += 1
        else:
            grouped[key] = [1, call]
    return PerSequence((count, call) for count, call in grouped.values())
