"""Attention written as plain ops, followed from op to op: transformers' eager attention and
SDPA's math decomposition, forward and backward.

A softmax over scores a contraction just made, whose input has masked entries, charges the
masked entries' share of the contraction, the softmax and the contraction that consumes the
probabilities; backward follows the masked-zero probabilities and gradients by storage
(``PAIRED``). SDPA's math decomposition is priced as the fused kernels are (its own
element-wise work beyond theirs is hardware only). The per-thread state between ops is
``masks.eager``'s; masks without values are ``masks.shadows``'.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

import torch
from torch import Tensor

from dispatch_flops.engine.masks.eager import EAGER
from dispatch_flops.engine.masks.fake_runs import FAKE_RUNS
from dispatch_flops.engine.masks.shadows import (
    MASKING,
    RECIPES,
    UNVALUED,
    InputCount,
)
from dispatch_flops.engine.masks.tally import (
    BELOW_AUTOGRAD,
    MASKED_AT_MOST,
    NO_DISPATCH,
    TALLY,
    Tally,
    by_op,
    give_tally,
    has_values,
)
from dispatch_flops.engine.torch_private import FakeTensor as _FAKE
from dispatch_flops.engine.torch_private import disable_current_modes as _disable_current_modes
from dispatch_flops.formulas import ELEMENT_COSTS

_PARAMETER = torch.nn.Parameter
_STRIDED = torch.strided

# -- attention written as plain ops -------------------------------------------------------
# ``softmax(q @ k^T * scale + mask) @ v`` (transformers' eager attention, SDPA's math
# fallback): a softmax over the last dim whose input has masked entries (as an additive mask
# leaves them), right after a contraction that produced as many scores: the masked entries'
# share of that contraction (d MACs each), of the softmax (its per-element cost), and of the
# contraction that next consumes the probabilities (d_v MACs each). The state is per thread
# (``masks.eager``): a contraction's last record, and the masked probabilities waiting
# for their consumer.
#
# Backward (autograd of the same ops: SDPA's math decomposition in training) follows the
# masked entries by storage: the probabilities autograd saved (the softmax output, its casts
# and dropout product) and the scores' gradient the softmax backward makes are zero where the
# forward masked, so each backward contraction that reads one of them (``grad_v = pᵀ·g``,
# ``grad_q = g_s·k``, ``grad_kᵀ = qᵀ·g_s``) spends its masked entries' share on nothing, as
# does the softmax backward and the contraction that made its incoming gradient
# (``g_p = g·vᵀ``). These storages are kept process-wide (``PAIRED``: autograd may run the
# backward on another thread), a bounded number, each with its numel: a storage freed and
# reused by a tensor of another size never matches.
PAIRED: dict = {}  # storage pointer -> (the storage's weakref, numel, masked count)
PAIRED_PURGE = 1024  # past this many, entries of freed tensors are dropped
PAIRED_LOCK = threading.Lock()  # dropout's noise (``masks.dropout._NOISE``) takes it too
# The numels of ``PAIRED``'s entries (and dropout's ``_NOISE_NUMELS``, of its noise's), freed
# ones' too until a purge: an entry matches only a tensor of its numel, so a tensor whose numel
# is not here is none of them, found without reading its storage (the common case: a mul of
# activations, of a scalar). Added to before the entry itself and rebuilt only from the entries
# a purge keeps, under the lock: a superset of the live entries' numels at every moment, for
# every thread.
PAIRED_NUMELS: set = set()


def note_paired(t: Tensor, masked, forward: bool = True, math: Optional[tuple] = None) -> None:
    """Note ``t`` (zero where ``masked`` entries were masked) for the backward's contractions:
    only where autograd will run a backward that reads it (a training forward), and only while
    its storage lives (a weak reference: freed memory reused by another tensor never
    matches; autograd saves an output as another tensor on the same storage). ``math``: the
    probabilities of SDPA's math decomposition, what its backward's element-wise work needs
    (``_math_backward_extra``)."""
    global PAIRED_NUMELS
    if forward and not torch.is_grad_enabled():
        return
    n = t.numel()
    with PAIRED_LOCK:
        if len(PAIRED) >= PAIRED_PURGE:
            purge(PAIRED)
            PAIRED_NUMELS = {e[1] for e in PAIRED.values()}
        storage = t.untyped_storage()
        was = PAIRED.get(storage._cdata)
        if math is None and was is not None and was[0]() is storage and was[1] == n:
            math = was[3]  # the probabilities noted again by their consumer: still math's
        PAIRED_NUMELS.add(n)
        PAIRED[storage._cdata] = (weakref.ref(storage), n, masked, math)


def purge(entries: dict) -> None:
    """Drop ``entries`` of freed storages, then the oldest while there are too many."""
    for ptr in [p for p, e in entries.items() if e[0]() is None]:
        del entries[ptr]
    while len(entries) >= 4 * PAIRED_PURGE:
        del entries[next(iter(entries))]


def _paired_entry(t) -> Optional[tuple]:
    """``t``'s entry in ``PAIRED`` (weakref, numel, masked count, math) if its storage holds
    masked-zero pairs of its size, else None."""
    if not PAIRED or not _traced(t) or t.numel() not in PAIRED_NUMELS:
        return None
    found = PAIRED.get(t.untyped_storage()._cdata)
    if found is None or found[1] != t.numel() or found[0]() is None:
        return None
    return found


def paired_count(t) -> object:
    """The masked count of ``t`` if its storage holds masked-zero pairs of its size, else None."""
    found = _paired_entry(t)
    return None if found is None else found[2]


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


def charge(rec, rate: tuple, masked, factor: int = 1) -> None:
    """Add ``masked`` units to ``rec``'s tally (made at ``rate`` when it has none);
    ``factor``: units per entry of a per-run count (``InputCount``), known at each run only."""
    found = rec[TALLY] if len(rec) > TALLY else None
    if found is None:
        found = give_tally(rec, Tally(*rate))
    if masked.__class__ is InputCount:  # known at each run of a compiled graph only
        if FAKE_RUNS:
            fake_run = FAKE_RUNS[-1]
            fake_run.tallies.append(_RunCharge(found, masked, fake_run.backward, factor))
        return
    found.add(masked)


def _traced(t) -> bool:
    """Whether ``t``'s storage can be followed: a strided tensor with values, or without
    values (meta, fake)."""
    # a plain tensor or a parameter has values or is meta: either is followed; classes by
    # identity first (isinstance of a parameter is a Python __instancecheck__)
    cls = t.__class__
    if not (cls is Tensor or cls is _PARAMETER or isinstance(t, _PARAMETER) or
            FAKE_RUNS and isinstance(t, _FAKE)):
        return False
    return t.layout is _STRIDED


def _storage(t: Tensor) -> int:
    """The identity of ``t``'s storage (a meta tensor's too: its data pointer is 0)."""
    return t.untyped_storage()._cdata


def _bmm_tally(rec, args, kwargs, out) -> None:
    a, b = args[0], args[1]
    eager = EAGER  # one global load; its attributes are this thread's
    if not _traced(a) or a.dim() != 3:
        eager.scores = None
        return
    shape, n = a.shape, a.numel()
    probs = eager.probs
    if probs is not None and n == probs[1] and _storage(a) in probs[0]:
        eager.probs = None
        d_v = b.shape[-1]
        charge(rec, (2 * d_v, d_v), probs[2])
        note_paired(a, probs[2])  # saved for backward, where grad_v = pᵀ·g reads it
    elif PAIRED and n in PAIRED_NUMELS and (masked := paired_count(a)) is not None:
        charge(rec, (2 * b.shape[-1], b.shape[-1]), masked)  # pᵀ·g, g_s·k: a's rows, b's columns
    elif PAIRED and (masked := paired_count(b)) is not None:  # qᵀ·g_s
        charge(rec, (2 * shape[-2], shape[-2]), masked)
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
    for made in EAGER.recent:
        if made[1] == grad.numel() and made[2] == grad.shape[-1]:
            charge(made[0], (2 * made[3], made[3]), masked)
            d_v = made[3]  # g_p = g·vᵀ contracts over d_v
            break
    EAGER.recent = []
    # the record's hardware-only flops, one a unit (its math share is flops, not pairs)
    if masked.__class__ is InputCount:  # a compiled graph's mask passed in: at each run
        per_entry = ELEMENT_COSTS["softmax_backward"]
        if math is not None:  # the constant part now (re-added at each run), the rest per entry
            charge(rec, (1, 0), _math_backward_extra(math, d_v))
            per_entry += ELEMENT_COSTS["attention_scale"]
        charge(rec, (1, 0), masked, per_entry)
    else:
        extra = 0 if math is None else _math_backward_extra(math, d_v)
        charge(rec, (1, 0), masked * ELEMENT_COSTS["softmax_backward"] + extra)
    note_paired(out, masked, forward=False)


def _softmax_tally(rec, args, kwargs, out, math: bool = False) -> None:
    """A softmax over scores a contraction just made: its masked entries (and the
    contractions' share of them); ``math``: ``_safe_softmax``, SDPA's math decomposition,
    whose element-wise work is priced as the fused kernels' (``_math_forward_extra``)."""
    x, dim = args[0], args[1]
    scores, EAGER.scores = EAGER.scores, None
    causal, EAGER.tril = EAGER.tril, None
    if scores is None or x.dim() < 2 or dim not in (-1, x.dim() - 1):
        return
    if scores[1] != x.numel() or scores[2] != x.shape[-1] or not x.dtype.is_floating_point:
        return
    known = x if has_values(x) else MASKING.get(x)
    if known is None and FAKE_RUNS and (recipe := RECIPES.get(x)) is not None:
        per_run = InputCount(recipe)  # scores plus a mask made from the graph's inputs
        charge(scores[0], (2 * scores[3], scores[3]), per_run)
        if math:
            causal = causal is not None and tuple(causal) == tuple(x.shape[-2:])
            _math_forward(rec, x, out, scores[3], per_run, causal)
        else:
            charge(rec, (ELEMENT_COSTS["softmax"], 0), per_run)
            note_paired(out, per_run)
        EAGER.probs = ((_storage(out),), out.numel(), per_run)
        return
    masked: Any = None  # an int, or (off the CPU) a 0-d device tensor
    if known is None:
        if UNVALUED.get(x) is not None:  # scores plus a mask nobody knows
            charge(rec, (1, 0), 0)
            rec[TALLY].unvalued += 1
    else:
        with NO_DISPATCH(), BELOW_AUTOGRAD():
            masked = torch.count_nonzero(known <= MASKED_AT_MOST)  # cheaper than a bool sum
            if masked.is_cpu:  # read now: the figures below are ints, not tensor ops
                masked = int(masked)
    if math:
        causal = causal is not None and tuple(causal) == tuple(x.shape[-2:])
        _math_forward(rec, x, out, scores[3], 0 if masked is None else masked, causal)
    if masked is None or masked.__class__ is int and not masked:
        return
    charge(scores[0], (2 * scores[3], scores[3]), masked)
    if not math:
        charge(rec, (1, 0), masked * ELEMENT_COSTS["softmax"])
    EAGER.probs = ((_storage(out),), out.numel(), masked)
    if not math:
        note_paired(out, masked)  # the softmax backward reads it


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
            charge(rec, (1, 0), scale + n * ELEMENT_COSTS["add"] +
                    s_q * s_k * ELEMENT_COSTS["where"])
        else:
            charge(rec, (1, 0), scale)
            per_entry += ELEMENT_COSTS["add"]
        charge(rec, (1, 0), masked, per_entry)
        if torch.is_grad_enabled():  # the backward adds attention_scale per entry itself
            note_paired(out, masked, math=(scale, heads * s_k if _grouped(x) else 0, d))
        return
    kept = n - masked
    # the q and k multiplies, less the model's scale per kept pair (the same figure backward)
    scale = heads * (s_q + s_k) * d * ELEMENT_COSTS["mul"] - kept * ELEMENT_COSTS[
        "attention_scale"]
    if causal:  # the add of the mask it built: all of it; the build, where over s_q·s_k
        mask = n * ELEMENT_COSTS["add"] + s_q * s_k * ELEMENT_COSTS["where"]
    else:  # an attn_mask's add over the masked entries (the kernels charge 1 a kept pair)
        mask = masked * ELEMENT_COSTS["add"]
    charge(rec, (1, 0), masked * ELEMENT_COSTS["softmax"] + scale + mask)
    # the softmax backward reads the probabilities: its record takes the backward's share
    if torch.is_grad_enabled():
        note_paired(out, masked, math=(scale, heads * s_k if _grouped(x) else 0, d))


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
        EAGER.tril = out.shape


def follow_probs(rec, args, kwargs, out) -> None:
    """A cast, dropout or dropout-mask product of masked probabilities (SDPA's math
    decomposition multiplies them by its own dropout mask): their consumer may read its
    output."""
    probs = EAGER.probs
    result = out[0] if out.__class__ is tuple else out
    if probs is None:
        # backward: g_s cast to a half dtype (an argument paired has the result's numel: a
        # result of no paired numel has no such argument)
        if PAIRED and isinstance(result, Tensor) and result.numel() in PAIRED_NUMELS:
            for a in args[:2]:
                masked = paired_count(a)
                if masked is not None and a.numel() == result.numel():
                    note_paired(result, masked, forward=False)
                    return
        return
    if not isinstance(result, Tensor) or result.numel() != probs[1]:
        return
    for a in args[:2]:
        if isinstance(a, Tensor) and _traced(a) and a.numel() == probs[1] and \
                _storage(a) in probs[0]:
            EAGER.probs = (probs[0] + (_storage(result),), probs[1], probs[2])
            return


# the ops of attention written as plain ops, and their tallies
TALLIES = by_op((("bmm", "default", _bmm_tally),
                 ("_softmax", "default", _softmax_tally),
                 ("_safe_softmax", "default", _math_softmax_tally),
                 ("tril", "default", _tril_tally),
                 ("_softmax_backward_data", "default", _softmax_backward_tally),
                 ("_to_copy", "default", follow_probs),
                 ("native_dropout", "default", follow_probs)))
