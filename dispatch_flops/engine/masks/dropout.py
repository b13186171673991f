"""Dropout's noise, as the CPU decomposes it, followed from its draw to its products.

Dropout is hardware work (docs/conventions.md): the noise's draw, its scaling and each product
with it are charged whole to their records' hardware-only share. ``mul.Tensor`` is also the
math path's (a product of masked probabilities): ``_mul_tally`` serves both in one pass.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch import Tensor

from dispatch_flops.engine.masks import math_path
from dispatch_flops.engine.masks.eager import EAGER
from dispatch_flops.engine.masks.math_path import (
    PAIRED,
    PAIRED_LOCK,
    PAIRED_PURGE,
    charge,
    follow_probs,
    note_paired,
    paired_count,
    purge,
)
from dispatch_flops.engine.masks.tally import by_op
from dispatch_flops.formulas import ELEMENT_COSTS

_PARAMETER = torch.nn.Parameter
_STRIDED = torch.strided

# -- dropout, as the CPU decomposes it -------------------------------------------------------
# ``noise = empty_like(x).bernoulli_(1 - p).div_(1 - p); x * noise`` (``F.dropout`` on the CPU,
# SDPA's math decomposition), and in backward ``grad * noise`` (autograd saved the noise: the
# same storage). Dropout is hardware work (docs/conventions.md): each of these ops' flops is
# charged whole to the record's hardware-only share. The noise's storage is noted weakly, as
# the masked probabilities are (``PAIRED``), with its numel.
_NOISE: dict = {}  # storage pointer -> (the storage's weakref, numel)
_NOISE_NUMELS: set = set()  # their numels, kept as ``math_path.PAIRED_NUMELS`` is


def _noise_drawn(cost: int) -> Callable:
    """A draw (``bernoulli_``, ``bernoulli``, ``rand``, ``uniform_``): its result is noise,
    its ``cost`` an element hardware only."""
    rate = (cost, 0)

    def tally(rec, args, kwargs, out) -> None:
        noise = out[0] if out.__class__ is tuple else out
        if not _noisy(noise):
            return
        if cost:
            charge(rec, rate, noise.numel())
        _note(noise)

    return tally


def _note(noise) -> None:
    """Note ``noise``'s storage weakly, with its numel."""
    global _NOISE_NUMELS
    n = noise.numel()
    with PAIRED_LOCK:
        if len(_NOISE) >= PAIRED_PURGE:
            purge(_NOISE)
            _NOISE_NUMELS = {e[1] for e in _NOISE.values()}
        storage = noise.untyped_storage()
        _NOISE_NUMELS.add(n)
        _NOISE[storage._cdata] = (weakref.ref(storage), n)


def _noisy(t) -> bool:
    """A tensor whose storage can be followed: strided, values or not (a composite's
    decomposition is counted on fake tensors: their storages are followed too)."""
    # is_nested first: a jagged tensor answers ``layout`` through dispatch, where a mode below
    # the counter would see a ``prim.layout`` the user never ran (is_nested is read in C)
    return (t.__class__ is Tensor or isinstance(t, Tensor)) and not t.is_nested and \
        t.layout is _STRIDED


def _is_noise(t) -> bool:
    # no storage read for a tensor of no noise's size
    if not _noisy(t) or t.numel() not in _NOISE_NUMELS:
        return False
    found = _NOISE.get(t.untyped_storage()._cdata)
    return found is not None and found[1] == t.numel() and found[0]() is not None


def _number(a) -> bool:
    """A number, or a tensor holding one (Python's scalars reach aten as 0-d tensors)."""
    return not isinstance(a, Tensor) or a.dim() == 0


def _noise_used(cost: str, product: bool = True, noise_at: tuple = (0, 1)) -> Callable:
    """An op on noise, whatever a layer spells it with (``noise / (1 - p)`` in place or not,
    ``keep + rand``, ``floor_``, ``rand < p``, ``x * noise``, ``x.masked_fill(drop, 0)``,
    ``grad * noise``): dropout's, hardware only. Its result is noise too where the op's other
    operands are numbers or noise (a scale, a shift, a comparison of the noise); where one is
    data (``product``) the result is the data, dropped out."""
    rate = (ELEMENT_COSTS[cost], 0)

    def tally(rec, args, kwargs, out) -> None:
        if not _NOISE:
            return
        found = [i for i in noise_at if i < len(args) and _is_noise(args[i])]
        if not found:
            return
        result = out[0] if out.__class__ is tuple else out
        alone = all(_number(a) or _is_noise(a) for i, a in enumerate(args[:2])
                    if i not in found)
        if not alone and not product:  # data + noise: no dropout
            return
        charge(rec, rate, result.numel())
        if alone:
            _note_derived(result)
        elif PAIRED and isinstance(result, Tensor):  # masked probabilities, dropped out: still
            for i, a in enumerate(args[:2]):  # masked where they were (as ``_mul_tally``)
                if i not in found and isinstance(a, Tensor) and a.numel() == result.numel() \
                        and (masked := paired_count(a)) is not None:
                    note_paired(result, masked, forward=False)
                    break

    return tally


def _note_derived(result) -> None:
    if _noisy(result) and not _is_noise(result):  # in place: noted already
        _note(result)


_mul_noise = _noise_used("mul")
_MUL_RATE = (ELEMENT_COSTS["mul"], 0)


def _mul_tally(rec, args, kwargs, out) -> None:
    """``mul.Tensor``, the commonest op a tally sees: ``follow_probs`` and dropout's
    ``x * noise`` (``_noise_used``) in one pass over the arguments, each one's numel read once
    and its storage only where that numel is a paired tensor's or a noise's."""
    if EAGER.probs is not None:  # right after a masked softmax: its products followed
        follow_probs(rec, args, kwargs, out)
        if _NOISE:
            _mul_noise(rec, args, kwargs, out)
        return
    if not PAIRED and not _NOISE:
        return
    result = out[0] if out.__class__ is tuple else out
    paired = None  # the masked count of an argument paired with the result's numel
    noise = False
    size = -1  # the result's numel, read once an argument needs it
    for a in args[:2]:
        cls = a.__class__
        if cls is not Tensor and cls is not _PARAMETER:  # a subclass: as the two tallies do
            if not isinstance(a, Tensor):  # a number: neither
                continue
            if paired is None and PAIRED and isinstance(result, Tensor):
                masked = paired_count(a)
                if masked is not None and a.numel() == result.numel():
                    paired = masked
            if bool(_NOISE) and _is_noise(a):
                noise = True
            continue
        n = a.numel()
        # the math path's numels read where they live (its purge rebinds them)
        if n not in math_path.PAIRED_NUMELS and n not in _NOISE_NUMELS or \
                a.layout is not _STRIDED:
            continue
        key = a.untyped_storage()._cdata
        if paired is None and (found := PAIRED.get(key)) is not None:
            if size < 0:
                size = result.numel()
            # backward: g_s cast to a half dtype
            if n == size and found[1] == n and found[0]() is not None:
                paired = found[2]
        if not noise and (found := _NOISE.get(key)) is not None:
            noise = found[1] == n and found[0]() is not None and not a.is_nested
    if paired is not None:
        note_paired(result, paired, forward=False)
    if noise:
        charge(rec, _MUL_RATE, result.numel())
        # ``noise * scale``: noise still (``x * noise``: the data, dropped out)
        if all(_number(a) or _is_noise(a) for a in args[:2]):
            _note_derived(result)


# dropout's ops, and their tallies (``mul`` the math path's too). Noise is what a draw made,
# and what ops on it and numbers alone made from it (``_noise_used``); every op with noise as
# an operand is dropout's, however a layer spells dropout (``nn.Dropout``, in place,
# torchvision's stochastic depth, timm's drop-path old and new, a mask drawn and filled).
_DRAW = ELEMENT_COSTS["random_draw"]
_BERNOULLI = _DRAW + ELEMENT_COSTS["bernoulli"]
_SCALED = ("Tensor", "Scalar")
TALLIES = by_op((("mul", "Tensor", _mul_tally),
                 ("bernoulli_", "float", _noise_drawn(_BERNOULLI)),
                 ("bernoulli_", "Tensor", _noise_drawn(_BERNOULLI)),
                 ("bernoulli", "default", _noise_drawn(_BERNOULLI)),
                 ("bernoulli", "p", _noise_drawn(_BERNOULLI)),
                 ("rand", "default", _noise_drawn(_DRAW)),
                 ("rand_like", "default", _noise_drawn(_DRAW)),
                 ("uniform_", "default", _noise_drawn(_DRAW)),
                 ("mul_", "Tensor", _noise_used("mul")),
                 ("mul", "Scalar", _noise_used("mul")),
                 ("mul_", "Scalar", _noise_used("mul")),
                 *((op, overload, _noise_used("div"))
                   for op in ("div", "div_") for overload in _SCALED),
                 # a shift of the noise (``keep + rand``): noise; data + noise is no dropout
                 *((op, overload, _noise_used("add", product=False))
                   for op in ("add", "add_") for overload in _SCALED),
                 ("bitwise_not", "default", _noise_used("bitwise_not", product=False)),
                 ("logical_not", "default", _noise_used("logical_not", product=False)),
                 ("floor", "default", _noise_used("floor", product=False)),
                 ("floor_", "default", _noise_used("floor", product=False)),
                 *((op, overload, _noise_used(op, product=False))
                   for op in ("lt", "le", "gt", "ge") for overload in ("Scalar",)),
                 ("masked_fill", "Scalar", _noise_used("masked_fill", noise_at=(1,))),
                 ("masked_fill", "Tensor", _noise_used("masked_fill", noise_at=(1,))),
                 ("where", "self", _noise_used("where", noise_at=(0,)))))
