"""A record's masked attention pairs (``Tally``): the values no formula sees.

A formula prices an attention call from shapes: every (query, key) pair the kernel computes
(the hardware figure). Which of those pairs a mask makes useless is a tensor's values: a
boolean or additive ``attn_mask`` given to SDPA, a FlexAttention ``BlockMask`` and its
``mask_mod``. For the ops that take one (``masks.op_tallies``) the mode hands each call to
a *tally*, which counts the call's masked pairs (and, for a block-sparse kernel, the pairs it
skipped) into the record's ``Tally`` (``rec[TALLY]``). On a CUDA tensor the counts stay on the
device (a tensor added to, never read per call: no host sync); they are read once, when the
counter's results are captured (``Tally.read``, ``read_all``). Fake and meta tensors have no
values: their calls keep the formula's figures (docs/conventions.md, "Hardware and model
flops"), except masks built from shapes alone (``masks.shadows``); a call whose mask has no
values is counted (``Tally.unvalued``), so the result can say its masked pairs were not
subtracted (``RunFacts.unvalued_masks``).

A masked pair costs what the formula charges a pair (``rates``): ``masked_flops`` /
``masked_macs`` of the record grow by masked pairs x the rate; skipped pairs come off
``flops`` / ``macs`` (a kernel that never computed them). How a mask's entries are counted
(``masked_entries``, ``masked_in``) is here too: every tally counts them the same way.
"""

from __future__ import annotations

from itertools import count
from typing import Optional

import torch
from torch import Tensor

from dispatch_flops.engine.torch_private import disable_current_modes as _disable_current_modes
from dispatch_flops.formulas import ELEMENT_COSTS
from dispatch_flops.formulas.attention import recomputed_rates

TALLY = 3  # a record's fourth slot, present on the records of ops that read masks
_PARAMETER = torch.nn.Parameter


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
NO_DISPATCH = torch._C._DisableTorchDispatch
BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd


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


def by_op(rows) -> dict:
    """``{op overload: tally}`` of ``rows`` of (aten op name, overload name, tally), for the
    ops this build of torch has (``masks.op_tallies`` gathers the tables)."""
    aten = torch.ops.aten
    found: dict = {}
    for name, overload, tally in rows:
        packet = getattr(aten, name, None)
        op = getattr(packet, overload, None) if packet is not None else None
        if op is not None:
            found[op] = tally
    return found
