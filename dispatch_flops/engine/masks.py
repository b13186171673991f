"""Masked attention pairs read from tensors: the values no formula sees.

A formula prices an attention call from shapes: every (query, key) pair the kernel computes
(the hardware figure). Which of those pairs a mask makes useless is a tensor's values: a
boolean or additive ``attn_mask`` given to SDPA, a FlexAttention ``BlockMask`` and its
``mask_mod``. For the ops that take one (``TALLIES``) the mode hands each call to a *tally*,
which counts the call's masked pairs (and, for a block-sparse kernel, the pairs it skipped)
into the record's ``Tally`` (``rec[TALLY]``). On a CUDA tensor the counts stay on the device
(a tensor added to, never read per call: no host sync); they are read once, when the
counter's results are captured (``Tally.read``). Fake and meta tensors have no values: their
calls keep the formula's figures (docs/conventions.md, "Hardware and model flops"), except
meta masks built from shapes alone, whose values are computed on the CPU (``_SHADOWS``); a call
whose mask has no values is counted (``Tally.unvalued``), so the result can say its masked
pairs were not subtracted (``RunFacts.unvalued_masks``). In a compiled graph's pricing run a
mask made from the graph's inputs (a padding ``attention_mask`` passed in) is noted as the ops
that make it (``Recipe``), and counted at each run from the run's real inputs
(``InputMasks``, ``InputCount``).

A masked pair costs what the formula charges a pair (``rates``): ``masked_flops`` /
``masked_macs`` of the record grow by masked pairs x the rate; skipped pairs come off
``flops`` / ``macs`` (a kernel that never computed them).
"""

from __future__ import annotations

import threading
import weakref
from itertools import count
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from dispatch_flops.engine.active import PRICING
from dispatch_flops.engine.torch_private import FakeTensor as _FAKE
from dispatch_flops.engine.torch_private import disable_current_modes as _disable_current_modes
from dispatch_flops.formulas import ELEMENT_COSTS
from dispatch_flops.formulas.attention import recomputed_rates

TALLY = 3  # a record's fourth slot, present on the records of ops that read masks
_PARAMETER = torch.nn.Parameter
_STRIDED = torch.strided


class Tally:
    """A record's masked and skipped pairs, and what one pair costs (flops, MACs)."""

    __slots__ = ("masked", "skipped", "flops_rate", "macs_rate", "again", "unvalued")

    def __init__(self, flops_rate: int, macs_rate: int, again: tuple = (0, 0)):
        self.masked: object = 0  # an int, or a 0-d int64 tensor on the mask's device
        self.skipped: object = 0
        self.flops_rate = flops_rate
        self.macs_rate = macs_rate
        # (flops, MACs) a pair's backward recomputation, which the formula already counts
        # hardware-only for every pair (``recomputed_rates``): a skipped pair ran none of it
        self.again = again
        self.unvalued = 0  # calls whose mask had no values (meta, fake): nothing subtracted

    def add(self, masked, skipped=0) -> None:
        self.masked = _plus(self.masked, masked)
        if not (isinstance(skipped, int) and skipped == 0):
            self.skipped = _plus(self.skipped, skipped)

    def read(self) -> tuple[int, int]:
        """(masked pairs, skipped pairs) as ints (``read_all`` reads many at once)."""
        return _int(self.masked), _int(self.skipped)

    def reset(self) -> None:
        self.masked = self.skipped = 0
        self.unvalued = 0


# Moves each time a record anywhere is given a tally (``give_tally``, after the record holds
# it): a ledger's list of its records holding one (``records.Layout.tallies``) is kept until
# this moves, instead of looking at every record at each capture and reset (hundreds, with
# cold caches after a step: a tenth of a millisecond each time). ``next`` on a count is atomic.
TALLIES_MADE = 0
_TALLIES_MADE = count(1)


def give_tally(rec: list, tally: Tally) -> Tally:
    """Give ``rec`` its ``tally`` (its TALLY slot), and say so (``TALLIES_MADE``)."""
    global TALLIES_MADE
    rec.append(tally)
    TALLIES_MADE = next(_TALLIES_MADE)
    return tally


def read_all(tallies: list) -> list[tuple[int, int]]:
    """``Tally.read`` of each of ``tallies``, with one copy to the host per device (the
    one read of device counts, when a counter's results are captured)."""
    # read every step a logger reads (a training step holds dozens: dropout's noise charges):
    # counts kept on the CPU are ints, read as they are
    out = [(tally.masked, tally.skipped) for tally in tallies]
    if all(m.__class__ is int and k.__class__ is int for m, k in out):
        return out
    on_device: dict = {}  # device -> [(position, slot, tensor)]
    read = [[0, 0] for _ in tallies]
    for i, counts in enumerate(out):
        for slot, n in enumerate(counts):
            if isinstance(n, Tensor):
                on_device.setdefault(n.device, []).append((i, slot, n))
            else:
                read[i][slot] = int(n)
    with _disable_current_modes(), torch.no_grad():
        for parts in on_device.values():
            values = torch.stack([t.reshape(()) for _, _, t in parts]).tolist()
            for (i, slot, _), value in zip(parts, values):
                read[i][slot] = int(value)
    return [(masked, skipped) for masked, skipped in read]


def _plus(total, n):
    if isinstance(n, Tensor):
        if n.device.type == "cpu":
            return total + int(n)
        n = n.to(torch.int64)
        return n if isinstance(total, int) and total == 0 else total + n
    return total + n


def _int(n) -> int:
    return int(n.item()) if isinstance(n, Tensor) else int(n)


# ops on plain tensors that no mode (ours or one below) and no autograd sees: the count of a
# mask's values. Two C++ guards: popping and pushing back every mode on the stack
# (``disable_current_modes``) and ``no_grad`` cost more than the count's two ops
_NO_DISPATCH = torch._C._DisableTorchDispatch
_BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd


def has_values(t) -> bool:
    """Whether ``t`` holds values that can be read (a plain tensor, not fake, not meta)."""
    # classes by identity first: a parameter's isinstance is a Python __instancecheck__, and
    # is_meta a flag where device.type builds a device object
    cls = t.__class__
    if cls is Tensor or cls is _PARAMETER:
        return not t.is_meta
    return isinstance(t, _PARAMETER) and not t.is_meta


def rates(q, k, v, backward: bool, masked: bool) -> tuple[int, int]:
    """(flops, MACs) of one (query, key) pair that a mask's values mask, as
    ``formulas.attention`` prices a pair, less (backward) the recomputation the formula
    already counts hardware-only for every pair it takes as unmasked (``recomputed_rates``)."""
    d, d_v = q[-1], v[-1]
    per_pair = ELEMENT_COSTS["attention_scale"] + ELEMENT_COSTS["softmax"] + int(masked)
    macs = d + d_v
    if backward:
        per_pair += ELEMENT_COSTS["softmax_backward"]
        macs = 3 * d + 2 * d_v
        again_flops, again_macs = recomputed_rates(q, masked)
        return 2 * macs + per_pair - again_flops, macs - again_macs
    return 2 * macs + per_pair, macs


# An additive entry at most this is a masked pair, in every dtype: half fp16's lowest value.
# exp() of a score this far down is 0 in any float dtype; it takes in -inf, the finfo(dtype).min
# that transformers adds, and the finite -65504 that torch's cuDNN path puts where a boolean
# mask is False (``convert_boolean_attn_mask_cudnn``), so one mask counts the same on every
# kernel and in every dtype.
MASKED_AT_MOST = torch.finfo(torch.float16).min / 2


def masked_entries(mask: Tensor) -> Tensor:
    """Where ``mask`` masks: a boolean mask where False; an additive one where at most
    ``MASKED_AT_MOST`` (or -inf)."""
    if mask.dtype == torch.bool:
        return ~mask
    if mask.dtype.is_floating_point:
        return mask <= MASKED_AT_MOST
    return mask < 0  # an integer bias: any negative entry (never met from torch's callers)


def causal_keeps(s_q: int, s_k: int, device, bottom_right: bool = False) -> Tensor:
    """The (s_q, s_k) pairs a causal rule keeps: torch's top-left-aligned ``tril`` (SDPA's
    ``is_causal``), or aligned to the bottom right (``custom_mask_type`` 2)."""
    shift = s_k - s_q if bottom_right else 0
    return torch.ones(s_q, s_k, dtype=torch.bool, device=device).tril(shift)


def masked_in(mask: Tensor, total: int, causal: Optional[Tensor] = None):
    """Masked pairs of ``mask`` broadcast over ``total`` pairs (``masked_entries``). With
    ``causal`` (the pairs a causal rule keeps, whose complement the formula already counts
    masked), only the pairs that rule keeps and the mask removes: a pair masked twice is one
    masked pair."""
    if not mask.numel():
        return 0
    hit = masked_entries(mask)
    if causal is not None:
        hit = hit & causal  # broadcast over the mask's batch and heads
    return hit.sum() * (total // hit.numel())


def _argument(op, names: tuple) -> tuple:
    """(position, name) of the first of ``names`` in ``op``'s schema; (None, None) if none."""
    for i, a in enumerate(op._schema.arguments):
        if a.name in names:
            return (None if a.kwarg_only else i), a.name
    return None, None


def _read(args, kwargs, where: tuple, default=None):
    at, name = where
    if at is not None and len(args) > at:
        return args[at]
    return kwargs.get(name, default) if kwargs and name is not None else default


def _sdpa_tally(op, backward: bool, layout: str = "bhsd") -> Callable:
    """A tally for an SDPA op (``op``: its overload, whose schema names its query, mask and
    causal flag); ``layout`` "bshd" for the kernels that take [b, s, h, d]."""
    q_at = _argument(op, ("query", "q"))[0]
    mask_at = _argument(op, ("attn_mask", "attn_bias", "bias"))
    causal_at = _argument(op, ("is_causal", "custom_mask_type"))

    def tally(rec, args, kwargs, out) -> None:
        mask = _read(args, kwargs, mask_at)
        unvalued = False
        recipe = None
        if mask is not None and not has_values(mask):
            found_mask = mask
            mask = _SHADOWS.get(mask)  # a meta mask built from shapes
            if mask is None and PRICING:  # made from a compiled graph's inputs
                recipe = _RECIPES.get(found_mask)
            unvalued = mask is None and recipe is None
        if mask is None and not unvalued and recipe is None:
            return
        q, k, v = args[q_at], args[q_at + 1], args[q_at + 2]
        qs, ks, vs = q.shape, k.shape, v.shape
        if layout == "bshd":
            qs, ks = (qs[0], qs[2], qs[1], qs[3]), (ks[0], ks[2], ks[1], ks[3])
        if len(qs) != 4:
            return
        total = qs[0] * qs[1] * qs[2] * ks[-2]
        found = rec[TALLY] if len(rec) > TALLY else None
        if found is None:
            found = give_tally(rec, Tally(*rates(qs, ks, vs, backward, True),
                                          again=recomputed_rates(qs, True) if backward
                                          else (0, 0)))
        if unvalued:
            found.unvalued += 1
            return
        causal = _read(args, kwargs, causal_at, False)
        if recipe is not None:  # counted at each run, from the run's inputs
            PRICING[-1].tallies.append(InputMasks(found, recipe, total, qs[2], ks[-2],
                                                       causal, backward))
            return
        with _NO_DISPATCH(), _BELOW_AUTOGRAD():
            keeps = causal_keeps(qs[2], ks[-2], mask.device, causal == 2) if causal else None
            found.add(masked_in(mask, total, keeps))

    return tally


# -- attention written as plain ops -------------------------------------------------------
# ``softmax(q @ k^T * scale + mask) @ v`` (transformers' eager attention, SDPA's math
# fallback): a softmax over the last dim whose input has masked entries (as an additive mask
# leaves them), right after a contraction that produced as many scores: the masked entries'
# share of that contraction (d MACs each), of the softmax (its per-element cost), and of the
# contraction that next consumes the probabilities (d_v MACs each). The state is per thread:
# a contraction's last record, and the masked probabilities waiting for their consumer.
#
# Backward (autograd of the same ops: SDPA's math decomposition in training) follows the
# masked entries by storage: the probabilities autograd saved (the softmax output, its casts
# and dropout product) and the scores' gradient the softmax backward makes are zero where the
# forward masked, so each backward contraction that reads one of them (``grad_v = pᵀ·g``,
# ``grad_q = g_s·k``, ``grad_kᵀ = qᵀ·g_s``) spends its masked entries' share on nothing, as
# does the softmax backward and the contraction that made its incoming gradient
# (``g_p = g·vᵀ``). These storages are kept process-wide (``_PAIRED``: autograd may run the
# backward on another thread), a bounded number, each with its numel: a storage freed and
# reused by a tensor of another size never matches.
class _Eager(threading.local):
    def __init__(self):
        self.scores = None  # (record, numel, last dim, contraction dim) of the last bmm
        # (storage pointers, numel, masked count) of a masked softmax: its output's storage and
        # its casts' (math casts the float32 probabilities to the inputs' half dtype, and may
        # multiply either copy by the contraction that follows)
        self.probs = None
        self.recent: list = []  # the last few bmms' (record, numel, last dim, contraction)
        # the shape of the last boolean ``tril`` (SDPA's math decomposition builds its
        # ``is_causal`` mask with ``ones(s_q, s_k).tril()``), taken by the next softmax
        self.tril = None


_EAGER = _Eager()
_PAIRED: dict = {}  # storage pointer -> (the storage's weakref, numel, masked count)
_PAIRED_PURGE = 1024  # past this many, entries of freed tensors are dropped
_PAIRED_LOCK = threading.Lock()
# The numels of ``_PAIRED``'s and ``_NOISE``'s entries, freed ones' too until a purge: an entry
# matches only a tensor of its numel, so a tensor whose numel is not here is none of them, found
# without reading its storage (the common case: a mul of activations, of a scalar). Added to
# before the entry itself and rebuilt only from the entries a purge keeps, under the lock: a
# superset of the live entries' numels at every moment, for every thread.
_PAIRED_NUMELS: set = set()
_NOISE_NUMELS: set = set()


def _pair(t: Tensor, masked, forward: bool = True, math: Optional[tuple] = None) -> None:
    """Note ``t`` (zero where ``masked`` entries were masked) for the backward's contractions:
    only where autograd will run a backward that reads it (a training forward), and only while
    its storage lives (a weak reference: freed memory reused by another tensor never
    matches; autograd saves an output as another tensor on the same storage). ``math``: the
    probabilities of SDPA's math decomposition, what its backward's element-wise work needs
    (``_math_backward_extra``)."""
    global _PAIRED_NUMELS
    if forward and not torch.is_grad_enabled():
        return
    n = t.numel()
    with _PAIRED_LOCK:
        if len(_PAIRED) >= _PAIRED_PURGE:
            _purge(_PAIRED)
            _PAIRED_NUMELS = {e[1] for e in _PAIRED.values()}
        storage = t.untyped_storage()
        was = _PAIRED.get(storage._cdata)
        if math is None and was is not None and was[0]() is storage and was[1] == n:
            math = was[3]  # the probabilities noted again by their consumer: still math's
        _PAIRED_NUMELS.add(n)
        _PAIRED[storage._cdata] = (weakref.ref(storage), n, masked, math)


def _purge(entries: dict) -> None:
    """Drop ``entries`` of freed storages, then the oldest while there are too many."""
    for ptr in [p for p, e in entries.items() if e[0]() is None]:
        del entries[ptr]
    while len(entries) >= 4 * _PAIRED_PURGE:
        del entries[next(iter(entries))]


def _paired_entry(t) -> Optional[tuple]:
    """``t``'s entry in ``_PAIRED`` (weakref, numel, masked count, math) if its storage holds
    masked-zero pairs of its size, else None."""
    if not _PAIRED or not _traced(t) or t.numel() not in _PAIRED_NUMELS:
        return None
    found = _PAIRED.get(t.untyped_storage()._cdata)
    if found is None or found[1] != t.numel() or found[0]() is None:
        return None
    return found


def _paired(t) -> object:
    """The masked count of ``t`` if its storage holds masked-zero pairs of its size, else None."""
    found = _paired_entry(t)
    return None if found is None else found[2]


def _charge(rec, rate: tuple, masked, factor: int = 1) -> None:
    """Add ``masked`` units to ``rec``'s tally (made at ``rate`` when it has none);
    ``factor``: units per entry of a per-run count (``InputCount``), known at each run only."""
    found = rec[TALLY] if len(rec) > TALLY else None
    if found is None:
        found = give_tally(rec, Tally(*rate))
    if masked.__class__ is InputCount:  # known at each run of a compiled graph only
        if PRICING:
            pricing = PRICING[-1]
            pricing.tallies.append(_RunCharge(found, masked, pricing.backward, factor))
        return
    found.add(masked)


def _storage(t: Tensor) -> int:
    """The identity of ``t``'s storage (a meta tensor's too: its data pointer is 0)."""
    return t.untyped_storage()._cdata


def _bmm_tally(rec, args, kwargs, out) -> None:
    a, b = args[0], args[1]
    eager = _EAGER  # one global load; its attributes are this thread's
    if not _traced(a) or a.dim() != 3:
        eager.scores = None
        return
    shape, n = a.shape, a.numel()
    probs = eager.probs
    if probs is not None and n == probs[1] and _storage(a) in probs[0]:
        eager.probs = None
        d_v = b.shape[-1]
        _charge(rec, (2 * d_v, d_v), probs[2])
        _pair(a, probs[2])  # saved for backward, where grad_v = pᵀ·g reads it
    elif _PAIRED and n in _PAIRED_NUMELS and (masked := _paired(a)) is not None:
        _charge(rec, (2 * b.shape[-1], b.shape[-1]), masked)  # pᵀ·g, g_s·k: a's rows, b's columns
    elif _PAIRED and (masked := _paired(b)) is not None:  # qᵀ·g_s
        _charge(rec, (2 * shape[-2], shape[-2]), masked)
    made = out.shape
    eager.scores = scores = (rec, out.numel(), made[-1], shape[-1])
    eager.recent = [scores] + eager.recent[:2]


def _softmax_backward_tally(rec, args, kwargs, out) -> None:
    """The softmax backward of masked probabilities (``output``: the forward's, saved): its
    masked entries, the contraction that made its incoming gradient (``g_p = g·vᵀ``, one of
    the last few, of as many entries), and its output (``g_s``, zero where masked) for the
    contractions that read it."""
    grad, output = args[0], args[1]
    found = _paired_entry(output)
    if found is None:
        return
    masked, math = found[2], found[3]
    d_v = 0
    for made in _EAGER.recent:
        if made[1] == grad.numel() and made[2] == grad.shape[-1]:
            _charge(made[0], (2 * made[3], made[3]), masked)
            d_v = made[3]  # g_p = g·vᵀ contracts over d_v
            break
    _EAGER.recent = []
    # the record's hardware-only flops, one a unit (its math share is flops, not pairs)
    if masked.__class__ is InputCount:  # a compiled graph's mask passed in: at each run
        per_entry = ELEMENT_COSTS["softmax_backward"]
        if math is not None:  # the constant part now (re-added at each run), the rest per entry
            _charge(rec, (1, 0), _math_backward_extra(math, d_v))
            per_entry += ELEMENT_COSTS["attention_scale"]
        _charge(rec, (1, 0), masked, per_entry)
    else:
        extra = 0 if math is None else _math_backward_extra(math, d_v)
        _charge(rec, (1, 0), masked * ELEMENT_COSTS["softmax_backward"] + extra)
    _pair(out, masked, forward=False)


def _softmax_tally(rec, args, kwargs, out, math: bool = False) -> None:
    """A softmax over scores a contraction just made: its masked entries (and the
    contractions' share of them); ``math``: ``_safe_softmax``, SDPA's math decomposition,
    whose element-wise work is priced as the fused kernels' (``_math_forward_extra``)."""
    x, dim = args[0], args[1]
    scores, _EAGER.scores = _EAGER.scores, None
    causal, _EAGER.tril = _EAGER.tril, None
    if scores is None or x.dim() < 2 or dim not in (-1, x.dim() - 1):
        return
    if scores[1] != x.numel() or scores[2] != x.shape[-1] or not x.dtype.is_floating_point:
        return
    known = x if has_values(x) else _MASKING.get(x)
    if known is None and PRICING and (recipe := _RECIPES.get(x)) is not None:
        per_run = InputCount(recipe)  # scores plus a mask made from the graph's inputs
        _charge(scores[0], (2 * scores[3], scores[3]), per_run)
        if math:
            causal = causal is not None and tuple(causal) == tuple(x.shape[-2:])
            _math_forward(rec, x, out, scores[3], per_run, causal)
        else:
            _charge(rec, (ELEMENT_COSTS["softmax"], 0), per_run)
            _pair(out, per_run)
        _EAGER.probs = ((_storage(out),), out.numel(), per_run)
        return
    masked: Any = None  # an int, or (off the CPU) a 0-d device tensor
    if known is None:
        if _UNVALUED.get(x) is not None:  # scores plus a mask nobody knows
            _charge(rec, (1, 0), 0)
            rec[TALLY].unvalued += 1
    else:
        with _NO_DISPATCH(), _BELOW_AUTOGRAD():
            masked = torch.count_nonzero(known <= MASKED_AT_MOST)  # cheaper than a bool sum
            if masked.is_cpu:  # read now: the figures below are ints, not tensor ops
                masked = int(masked)
    if math:
        causal = causal is not None and tuple(causal) == tuple(x.shape[-2:])
        _math_forward(rec, x, out, scores[3], 0 if masked is None else masked, causal)
    if masked is None or masked.__class__ is int and not masked:
        return
    _charge(scores[0], (2 * scores[3], scores[3]), masked)
    if not math:
        _charge(rec, (1, 0), masked * ELEMENT_COSTS["softmax"])
    _EAGER.probs = ((_storage(out),), out.numel(), masked)
    if not math:
        _pair(out, masked)  # the softmax backward reads it


def _math_softmax_tally(rec, args, kwargs, out) -> None:
    _softmax_tally(rec, args, kwargs, out, math=True)


# -- SDPA's math decomposition, priced as the fused kernels -----------------------------------
# The math decomposition spells the attention's element-wise work its own way: it scales q and
# k by sqrt(scale) (s_q·d + s_k·d a head, and their gradients in backward), adds the mask to
# every score, masked ones too (the causal mask it builds with ``where`` over s_q·s_k), and
# sums k's and v's gradients over each group (GQA). The fused kernels' formula charges one
# scale a kept pair each way and, for an ``attn_mask``, one add a kept pair. Model flops are
# the model's (docs/conventions.md): the math path's own element-wise work less the fused
# kernels' per-pair figure is hardware only, charged to the softmax's record (forward) and the
# softmax backward's (backward), one flop a unit. It can be negative (no mask, s > 2d: the
# q, k scaling is cheaper than a scale a pair): hardware flops stay what ran.
def _math_forward(rec, x: Tensor, out: Tensor, d: int, masked, causal: bool) -> None:
    s_q, s_k = x.shape[-2], x.shape[-1]
    n = x.numel()
    heads = n // (s_q * s_k)
    if masked.__class__ is InputCount:  # known at each run: the part linear in it per entry
        scale = heads * (s_q + s_k) * d * ELEMENT_COSTS["mul"] - n * ELEMENT_COSTS[
            "attention_scale"]
        per_entry = ELEMENT_COSTS["softmax"] + ELEMENT_COSTS["attention_scale"]
        if causal:
            _charge(rec, (1, 0), scale + n * ELEMENT_COSTS["add"] +
                    s_q * s_k * ELEMENT_COSTS["where"])
        else:
            _charge(rec, (1, 0), scale)
            per_entry += ELEMENT_COSTS["add"]
        _charge(rec, (1, 0), masked, per_entry)
        if torch.is_grad_enabled():  # the backward adds attention_scale per entry itself
            _pair(out, masked, math=(scale, heads * s_k if _grouped(x) else 0, d))
        return
    kept = n - masked
    # the q and k multiplies, less the model's scale per kept pair (the same figure backward)
    scale = heads * (s_q + s_k) * d * ELEMENT_COSTS["mul"] - kept * ELEMENT_COSTS[
        "attention_scale"]
    if causal:  # the add of the mask it built: all of it; the build, where over s_q·s_k
        mask = n * ELEMENT_COSTS["add"] + s_q * s_k * ELEMENT_COSTS["where"]
    else:  # an attn_mask's add over the masked entries (the kernels charge 1 a kept pair)
        mask = masked * ELEMENT_COSTS["add"]
    _charge(rec, (1, 0), masked * ELEMENT_COSTS["softmax"] + scale + mask)
    # the softmax backward reads the probabilities: its record takes the backward's share
    if torch.is_grad_enabled():
        _pair(out, masked, math=(scale, heads * s_k if _grouped(x) else 0, d))


def _math_backward_extra(math: tuple, d_v: int) -> object:
    """The backward's element-wise work of SDPA's math decomposition less the fused kernels'
    per-pair figure: q's and k's gradients scaled (as the forward's, ``math[0]``) and, when
    k and v were expanded to the query heads (GQA), their gradients summed over each group
    (``heads·s_k·(d + d_v)``)."""
    scale, keys, d = math
    return scale + keys * (d + d_v) * ELEMENT_COSTS["reduce"]


# SDPA's math decomposition scales q, then expands k (and v) to the query heads
# (``repeat_interleave``: a view of the clone of an expanded unsqueeze), then scales k and
# transposes it. From the scores' ``bmm`` back, each side reaches its scale's mul through a
# view and an expand (and a clone where the operand was not contiguous); on the key side, the
# expansion follows. A model's own expansion (``repeat_interleave`` or transformers'
# ``repeat_kv``, which both paths run) was made before the call, so before the q scale's node
# (autograd numbers its nodes as it makes them).
_TO_SCALE = ("ViewBackward0", "UnsafeViewBackward0", "ExpandBackward0", "CloneBackward0")
_EXPANDED = ("TransposeBackward0", "ViewBackward0", "CloneBackward0", "ExpandBackward0",
             "UnsqueezeBackward0")


def _scale_node(node):
    """The scale's mul node reached from a ``bmm`` operand's node through views, expands
    and clones; None if another node comes first."""
    for _ in range(5):
        if node is None:
            return None
        name = type(node).__name__
        if name == "MulBackward1":
            return node
        if name not in _TO_SCALE:
            return None
        node = node.next_functions[0][0]
    return None


def _grouped(x: Tensor) -> bool:
    """Whether the scores ``x`` (a training forward's) are of a k that SDPA's math
    decomposition expanded to the query heads itself (GQA), read from autograd's graph."""
    node = x.grad_fn
    for _ in range(2):  # the view of the bmm's output (and the mask's add)
        if node is None or type(node).__name__ == "BmmBackward0":
            break
        node = node.next_functions[0][0]
    if node is None or type(node).__name__ != "BmmBackward0":
        return False
    q_scale = _scale_node(node.next_functions[0][0])
    k_scale = _scale_node(node.next_functions[1][0])
    if q_scale is None or k_scale is None:
        return False
    expanded = k_scale
    for name in _EXPANDED:
        expanded = expanded.next_functions[0][0]
        if expanded is None or type(expanded).__name__ != name:
            return False
    return expanded._sequence_nr() > q_scale._sequence_nr()


def _tril_tally(rec, args, kwargs, out) -> None:
    if out.dtype is torch.bool and out.dim() == 2:
        _EAGER.tril = out.shape


def _follow_probs(rec, args, kwargs, out) -> None:
    """A cast, dropout or dropout-mask product of masked probabilities (SDPA's math
    decomposition multiplies them by its own dropout mask): their consumer may read its
    output."""
    probs = _EAGER.probs
    result = out[0] if out.__class__ is tuple else out
    if probs is None:
        # backward: g_s cast to a half dtype (an argument paired has the result's numel: a
        # result of no paired numel has no such argument)
        if _PAIRED and isinstance(result, Tensor) and result.numel() in _PAIRED_NUMELS:
            for a in args[:2]:
                masked = _paired(a)
                if masked is not None and a.numel() == result.numel():
                    _pair(result, masked, forward=False)
                    return
        return
    if not isinstance(result, Tensor) or result.numel() != probs[1]:
        return
    for a in args[:2]:
        if isinstance(a, Tensor) and _traced(a) and a.numel() == probs[1] and \
                _storage(a) in probs[0]:
            _EAGER.probs = (probs[0] + (_storage(result),), probs[1], probs[2])
            return


# -- masks built from shapes on the meta device ----------------------------------------------
# A meta tensor has no values, but a mask built from shapes alone (SDPA's math decomposition
# makes its causal mask with ``ones(...).tril()`` and ``where``; transformers builds causal,
# sliding-window and padding masks from ``arange`` and comparisons) has the values it would
# have on any device. The ops below, met with meta outputs whose tensor inputs are all such
# masks (or plain values), are run again on the CPU: the result is the mask's *shadow*, kept
# while the meta tensor lives (a weak reference) and read where a mask's values are read. A
# scores tensor that adds such a mask to values nobody knows (``q·kᵀ + mask``) keeps the
# mask's shadow for its masked entries only (``_MASKING``): the scores are finite, so an
# entry is masked exactly where the mask masks.
class _Shadows:
    """Weak map from a meta tensor to a CPU tensor (its values, or for ``_MASKING`` where it
    is masked)."""

    def __init__(self):
        self.kept: dict = {}  # id(meta tensor) -> (weakref, CPU tensor)

    def get(self, t) -> Any:  # a Tensor (a Recipe in ``_RECIPES``), or None
        found = self.kept.get(id(t))
        return found[1] if found is not None and found[0]() is t else None

    def put(self, t: Tensor, value: Any) -> None:
        if len(self.kept) >= 4096:
            for key in [k for k, v in self.kept.items() if v[0]() is None]:
                del self.kept[key]
            while len(self.kept) >= 4096:
                del self.kept[next(iter(self.kept))]
        key = id(t)

        def dropped(ref, key=key) -> None:  # the meta tensor is gone: so are its values
            if self.kept.get(key, (None,))[0] is ref:
                del self.kept[key]
        self.kept[key] = (weakref.ref(t, dropped), value)


_SHADOWS = _Shadows()
_MASKING = _Shadows()
_UNVALUED = _Shadows()  # scores that a mask without values was added to
_NO_VALUES = torch.empty(0)  # their entry (a strong reference to the scores would keep them)
# elements (16 MB of float32): a larger mask is left without values, as any meta tensor, so
# that counting a full-size model on meta stays fast and small (a 70 B model's 4,096-token
# causal mask would be 16.7 M elements per layer)
SHADOW_MOST = 1 << 22
_SHADOWED = ("ones", "zeros", "full", "scalar_tensor", "arange", "new_ones", "new_zeros",
             "new_full", "tril", "triu", "where", "le", "lt", "ge", "gt", "eq", "ne",
             "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and",
             "logical_or", "logical_not", "masked_fill", "add", "sub", "mul", "neg",
             "view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "transpose",
             "permute", "slice", "select", "alias", "clone", "_to_copy", "index", "remainder",
             "floor_divide", "abs", "minimum", "maximum", "clamp")
_AS_VIEW = frozenset(("view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze",
                      "transpose", "permute", "slice", "select", "alias"))


# while a compiled graph's pricing run is on (engine.compiled, engine.active.PRICING), its
# fake tensors' masks built from shapes are followed as on meta (a composite priced whole on
# fake tensors keeps the masked share of the kernel its decomposition runs,
# docs/conventions.md: not followed there)


def _valueless(t: Tensor) -> bool:
    """Whether ``t`` is a meta tensor, or a fake one of a compiled graph's pricing run: no
    values, and masks built from shapes followed."""
    return t.is_meta or bool(PRICING) and isinstance(t, _FAKE)


def _traced(t) -> bool:
    """Whether ``t``'s storage can be followed: a strided tensor with values, or without
    values (meta, fake)."""
    # a plain tensor or a parameter has values or is meta: either is followed; classes by
    # identity first (isinstance of a parameter is a Python __instancecheck__)
    cls = t.__class__
    if not (cls is Tensor or cls is _PARAMETER or isinstance(t, _PARAMETER) or
            PRICING and isinstance(t, _FAKE)):
        return False
    return t.layout is _STRIDED


def _on_cpu(v, found: list):
    """``v`` with each meta tensor replaced by its shadow; ``found[0]`` False if one has none
    (and the meta tensors without one collected in ``found[1]``). In a compiled graph's
    pricing run, a fake tensor that is one of the graph's inputs, or made from them
    (``_RECIPES``), is replaced by its ``_Input`` or ``Recipe`` (``found[2]`` True)."""
    if isinstance(v, Tensor):
        if not _valueless(v):
            found[0] = found[0] and has_values(v) and v.device.type == "cpu"
            return v
        shadow = _SHADOWS.get(v)
        if shadow is None and PRICING:
            at = PRICING[-1].inputs.get(id(v))
            made = _Input(at) if at is not None else _RECIPES.get(v)
            if made is not None:
                found[2] = True
                return made
        if shadow is None:
            found[0] = False
            found[1].append(v)
        return shadow
    if isinstance(v, (list, tuple)):
        return type(v)(_on_cpu(x, found) for x in v)
    if isinstance(v, torch.device) and v.type == "meta":
        return torch.device("cpu")
    return v


def _shadow_tally(func, name: str) -> Callable:
    def tally(rec, args, kwargs, out) -> None:
        if not isinstance(out, Tensor) or not (out.__class__ is Tensor and out.is_meta or
                                               _valueless(out)) or \
                name not in _AS_VIEW and out.numel() > SHADOW_MOST:
            return
        found: list = [True, [], False]
        cpu_args = _on_cpu(args, found)
        cpu_kwargs = {k: _on_cpu(v, found) for k, v in (kwargs or {}).items()}
        if "device" in (kwargs or {}) or not any(isinstance(a, Tensor) for a in args):
            cpu_kwargs["device"] = torch.device("cpu")  # a factory
        if PRICING and (found[2] or name == "where"):
            if _recipe(func, name, args, cpu_args, cpu_kwargs, found, out):
                return
        if not found[0]:
            if name in ("add", "sub") and len(found[1]) == 1:
                _masking(args, found[1][0], out)
            elif name in ("add", "sub") and len(found[1]) == 2:
                _unvalued_scores(out)
            return
        try:
            with _disable_current_modes(), torch.no_grad():
                value = func(*cpu_args, **cpu_kwargs)
        except Exception:  # an argument this op takes only on meta: no shadow
            return
        if isinstance(value, Tensor) and value.shape == out.shape:
            _SHADOWS.put(out, value)

    return tally


# -- masks made from a compiled graph's inputs ------------------------------------------------
# A padding ``attention_mask`` passed into a compiled model is one of the graph's inputs: its
# fake tensor has no values while the graph is priced, and it changes from run to run. The
# shadowed ops above, met in a pricing run with such an input (or what was made from one)
# among their arguments, are noted as a *recipe* instead (``_RECIPES``): the op, its arguments
# with each input as its position (``_Input``), masks built from shapes as their CPU values,
# and a value nobody knows that a mask is added to or selected with (T5's position bias,
# ``where(mask, bias, min)``) as zeros (``_Finite``: finite, so an entry is masked exactly
# where the mask masks it, as ``_MASKING`` takes scores). An SDPA call whose mask has a recipe
# is counted at each run of the graph (``InputMasks``): the recipe evaluated on the run's
# real inputs, its masked pairs added.
class _Input:
    """The graph's input at position ``at``, in a recipe."""

    __slots__ = ("at",)

    def __init__(self, at: int):
        self.at = at


class _Finite:
    """A value nobody knows, finite (zeros), of ``shape`` and ``dtype``, in a recipe."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


def _inputs_of(v, into: set) -> set:
    if isinstance(v, _Input):
        into.add(v.at)
    elif isinstance(v, Recipe):
        into.update(v.inputs)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _inputs_of(x, into)
    return into


class Recipe:
    """How a tensor of a compiled graph is made from the graph's inputs: ``func`` over
    ``args`` and ``kwargs``, whose inputs, recipes and unknown values are ``_Input``,
    ``Recipe`` and ``_Finite``."""

    __slots__ = ("func", "args", "kwargs", "inputs")

    def __init__(self, func, args, kwargs):
        self.func, self.args, self.kwargs = func, args, kwargs
        found: set = set()
        _inputs_of(args, found)
        _inputs_of(tuple(kwargs.values()), found)
        self.inputs = tuple(sorted(found))

    def value(self, inputs, device, memo: dict) -> Tensor:
        """The tensor this makes from the graph's real ``inputs``, on ``device`` (``memo``:
        the recipes evaluated so far, by id)."""
        done = memo.get(id(self))
        if done is None:
            args = _evaluated(self.args, inputs, device, memo)
            kwargs = {k: device if k == "device" else _evaluated(v, inputs, device, memo)
                      for k, v in self.kwargs.items()}
            done = memo[id(self)] = self.func(*args, **kwargs)
        return done


def _evaluated(v, inputs, device, memo):
    if isinstance(v, _Input):
        return inputs[v.at]
    if isinstance(v, Recipe):
        return v.value(inputs, device, memo)
    if isinstance(v, _Finite):
        return torch.zeros((), dtype=v.dtype, device=device).expand(v.shape)
    if isinstance(v, Tensor):  # a mask built from shapes: its CPU values
        return v if v.device == device else v.to(device)
    if isinstance(v, (list, tuple)):
        return type(v)(_evaluated(x, inputs, device, memo) for x in v)
    return v


_RECIPES = _Shadows()  # fake tensor of a pricing run -> its Recipe
_FINITE_OPS = ("where", "add", "sub")  # where a value nobody knows may meet a mask


def _recipe(func, name: str, args, cpu_args, cpu_kwargs, found: list, out: Tensor) -> bool:
    """Note ``out``'s recipe (a pricing run's op over the graph's inputs, or selecting a value
    nobody knows with a mask built from shapes); whether one was noted."""
    unknown = found[1]
    if unknown:
        # only a float operand nobody knows, next to a mask: never a where's condition
        if name not in _FINITE_OPS or not (found[2] or name == "where") or \
                len(unknown) != 1 or not unknown[0].dtype.is_floating_point or \
                name == "where" and args[0] is unknown[0]:
            return False
        cpu_args = tuple(_Finite(a.shape, a.dtype) if a is unknown[0] else c
                         for a, c in zip(args, cpu_args))
    elif not found[2]:
        return False
    _RECIPES.put(out, Recipe(func, cpu_args, cpu_kwargs))
    return True


class _PerRun:
    """A count made from a compiled graph's real inputs at each run (``count``), kept while
    the inputs its recipe reads are the same tensors, unchanged (their versions)."""

    __slots__ = ("recipe", "last")

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.last: Optional[tuple] = None  # (key, weak references, count)

    def of(self, inputs):
        read = [inputs[i] for i in self.recipe.inputs]
        key = tuple((id(t), t._version) if isinstance(t, Tensor) else t for t in read)
        last = self.last
        if last is not None and last[0] == key and \
                all(ref is None or ref() is t for ref, t in zip(last[1], read)):
            return last[2]
        device = next((t.device for t in read if isinstance(t, Tensor)), torch.device("cpu"))
        with _disable_current_modes(), torch.no_grad():
            n = self.count(self.recipe.value(inputs, device, {}), device)
        self.last = (key, [weakref.ref(t) if isinstance(t, Tensor) else None for t in read],
                     n)
        return n

    def count(self, mask: Tensor, device):
        raise NotImplementedError


class InputCount(_PerRun):
    """The masked entries of scores plus a mask made from a compiled graph's inputs (the
    softmax of attention written as plain ops, SDPA's math decomposition), at each run."""

    __slots__ = ()

    def count(self, mask: Tensor, device):
        return masked_entries(mask).sum()


class _RunCharge:
    """``tally`` charged ``count``'s masked entries at each run (forward, or ``backward``)."""

    __slots__ = ("tally", "count", "backward", "factor")

    def __init__(self, tally: Tally, count: InputCount, backward: bool, factor: int = 1):
        self.tally, self.count, self.backward, self.factor = tally, count, backward, factor

    def __call__(self, inputs) -> None:
        # a compiled graph's run calls this with the counting modes on the stack: the count's
        # scaling and adding (a device tensor's add, a CPU one's item()) are not the user's ops
        with _disable_current_modes():
            counted = self.count.of(inputs)
            self.tally.add(counted * self.factor if self.factor != 1 else counted)


class InputMasks(_PerRun):
    """An SDPA call of a compiled graph whose mask is made from the graph's inputs (a
    ``Recipe``): at each run (forward, or ``backward``), its masked pairs counted from the
    run's real inputs into ``tally``; evaluated again only when an input the recipe reads
    is another tensor or was changed in place (its version)."""

    __slots__ = ("tally", "total", "s_q", "s_k", "causal", "backward")

    def __init__(self, tally: Tally, recipe: Recipe, total: int, s_q: int, s_k: int, causal,
                 backward: bool):
        super().__init__(recipe)
        self.tally, self.total = tally, total
        self.s_q, self.s_k, self.causal, self.backward = s_q, s_k, causal, backward

    def count(self, mask: Tensor, device):
        keeps = causal_keeps(self.s_q, self.s_k, device, self.causal == 2) \
            if self.causal else None
        return masked_in(mask, self.total, keeps)

    def __call__(self, inputs) -> None:
        with _disable_current_modes():  # as _RunCharge's: nothing here is the user's op
            self.tally.add(self.of(inputs))


def _masking(args, unknown: Tensor, out: Tensor) -> None:
    """``out = unknown ± mask``: masked where the mask is (finite scores)."""
    for a in args[:2]:
        if isinstance(a, Tensor) and a is not unknown:
            shadow = _SHADOWS.get(a) if _valueless(a) else (
                a if has_values(a) else None)
            if shadow is not None and shadow.dtype.is_floating_point:
                try:
                    _MASKING.put(out, shadow.expand(out.shape))
                except RuntimeError:
                    pass
            return


def _unvalued_scores(out: Tensor) -> None:
    """``out = scores ± mask``, neither with values, right after the contraction that made as
    many scores: attention over a mask nobody knows (a user's meta padding mask). The softmax
    that reads ``out`` counts the call as unvalued."""
    scores = _EAGER.scores
    if scores is not None and scores[1] == out.numel() and scores[2] == out.shape[-1]:
        _UNVALUED.put(out, _NO_VALUES)


# -- dropout, as the CPU decomposes it -------------------------------------------------------
# ``noise = empty_like(x).bernoulli_(1 - p).div_(1 - p); x * noise`` (``F.dropout`` on the CPU,
# SDPA's math decomposition), and in backward ``grad * noise`` (autograd saved the noise: the
# same storage). Dropout is hardware work (docs/conventions.md): each of these ops' flops is
# charged whole to the record's hardware-only share. The noise's storage is noted weakly, as
# the masked probabilities are (``_PAIRED``), with its numel.
_NOISE: dict = {}  # storage pointer -> (the storage's weakref, numel)


def _noise_drawn(rec, args, kwargs, out) -> None:
    noise = args[0]
    if not _noisy(noise):
        return
    global _NOISE_NUMELS
    n = noise.numel()
    _charge(rec, (ELEMENT_COSTS["random_draw"] + ELEMENT_COSTS["bernoulli"], 0), n)
    with _PAIRED_LOCK:
        if len(_NOISE) >= _PAIRED_PURGE:
            _purge(_NOISE)
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


def _noise_used(cost: str) -> Callable:
    """``noise / (1 - p)``, ``x * noise``, ``grad * noise``: dropout's, hardware only."""
    rate = (ELEMENT_COSTS[cost], 0)

    def tally(rec, args, kwargs, out) -> None:
        if _NOISE and (_is_noise(args[0]) or len(args) > 1 and _is_noise(args[1])):
            result = out[0] if isinstance(out, tuple) else out
            _charge(rec, rate, result.numel())

    return tally


_mul_noise = _noise_used("mul")
_MUL_RATE = (ELEMENT_COSTS["mul"], 0)


def _mul_tally(rec, args, kwargs, out) -> None:
    """``mul.Tensor``, the commonest op a tally sees: ``_follow_probs`` and dropout's
    ``x * noise`` (``_noise_used``) in one pass over the arguments, each one's numel read once
    and its storage only where that numel is a paired tensor's or a noise's."""
    if _EAGER.probs is not None:  # right after a masked softmax: its products followed
        _follow_probs(rec, args, kwargs, out)
        if _NOISE:
            _mul_noise(rec, args, kwargs, out)
        return
    if not _PAIRED and not _NOISE:
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
            if paired is None and _PAIRED and isinstance(result, Tensor):
                masked = _paired(a)
                if masked is not None and a.numel() == result.numel():
                    paired = masked
            noise = noise or bool(_NOISE) and _is_noise(a)
            continue
        n = a.numel()
        if n not in _PAIRED_NUMELS and n not in _NOISE_NUMELS or a.layout is not _STRIDED:
            continue
        key = a.untyped_storage()._cdata
        if paired is None and (found := _PAIRED.get(key)) is not None:
            if size < 0:
                size = result.numel()
            # backward: g_s cast to a half dtype
            if n == size and found[1] == n and found[0]() is not None:
                paired = found[2]
        if not noise and (found := _NOISE.get(key)) is not None:
            noise = found[1] == n and found[0]() is not None and not a.is_nested
    if paired is not None:
        _pair(result, paired, forward=False)
    if noise:
        _charge(rec, _MUL_RATE, result.numel())


def _tallies() -> tuple[dict, dict]:
    aten = torch.ops.aten
    found: dict = {}
    shadows: dict = {}

    def add(name: str, overload: str, tally: Callable) -> None:
        packet = getattr(aten, name, None)
        op = getattr(packet, overload, None) if packet is not None else None
        if op is not None:
            found[op] = tally

    sdpa = (("_scaled_dot_product_flash_attention_for_cpu", False, "bhsd"),
            ("_scaled_dot_product_flash_attention_for_cpu_backward", True, "bhsd"),
            ("_scaled_dot_product_efficient_attention", False, "bhsd"),
            ("_scaled_dot_product_efficient_attention_backward", True, "bhsd"),
            ("_scaled_dot_product_cudnn_attention", False, "bhsd"),
            ("_scaled_dot_product_cudnn_attention_backward", True, "bhsd"),
            ("_scaled_dot_product_fused_attention_overrideable", False, "bhsd"),
            ("_scaled_dot_product_fused_attention_overrideable_backward", True, "bhsd"),
            ("_scaled_dot_product_attention_math", False, "bhsd"),
            ("scaled_dot_product_attention", False, "bhsd"),
            ("_efficient_attention_forward", False, "bshd"),
            ("_efficient_attention_backward", True, "bshd"))
    for name, backward, layout in sdpa:
        op = getattr(getattr(aten, name, None), "default", None)
        if op is not None:
            found[op] = _sdpa_tally(op, backward, layout)
    add("bmm", "default", _bmm_tally)
    add("_softmax", "default", _softmax_tally)
    add("_safe_softmax", "default", _math_softmax_tally)
    add("tril", "default", _tril_tally)
    add("_softmax_backward_data", "default", _softmax_backward_tally)
    add("_to_copy", "default", _follow_probs)
    add("native_dropout", "default", _follow_probs)
    add("mul", "Tensor", _mul_tally)
    add("bernoulli_", "float", _noise_drawn)
    add("div_", "Scalar", _noise_used("div"))
    for name in _SHADOWED:
        packet = getattr(aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            if torch.Tag.inplace_view in op.tags or op._schema.name.endswith("_") or \
                    overload.startswith("out"):
                continue
            shadows[op] = _shadow_tally(op, name)
    return found, shadows


# a shadow tally is kept apart from the mask tallies: view, add, mul... are among the
# commonest ops, and it works only when their output is on meta (the mode asks that first)
TALLIES, SHADOW_TALLIES = _tallies()


def tally_of(func) -> Optional[Callable]:
    """The tally of ``func`` (an op overload), None for ops that read no mask."""
    return TALLIES.get(func)


def shadow_tally_of(func) -> Optional[Callable]:
    """The tally that keeps the CPU values of ``func``'s meta outputs built from shapes
    (``_SHADOWS``), None for ops that cannot build a mask; to be called only for a call
    whose output is a meta tensor."""
    return SHADOW_TALLIES.get(func)
