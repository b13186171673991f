"""FlexAttention (``torch.nn.attention.flex_attention``), counted whole.

``flex_attention`` and ``flex_attention_backward`` are higher-order operators: they reach a
dispatch mode as themselves, not as aten ops, and a mode without a rule for them made the
user's call raise (pytorch#134385). ``install`` registers a rule for each on the counting
modes: it runs the operator (the counting mode off, so its inner ops are not counted twice)
and counts the call as one record, ``higher_order.flex_attention`` (or ``..._backward``),
in the running frame and phase.

What is counted (docs/conventions.md, "Hardware and model flops"):

* **Eager** (the operator runs ``math_attention``, dense): the hardware figure is SDPA's
  dense formula with a mask (every (query, key) pair: the contractions, the scale, the
  mask's select, the softmax; backward its gradient too). The model figure leaves out the
  pairs ``mask_mod`` masks, evaluated over the whole (b, h_q, q, kv) grid, on the device.
* **Compiled** (inductor's block-sparse kernel): the graph is priced once on fake tensors
  (``engine.graphs.compiled``); where the ``BlockMask``'s tensors are the graph's inputs, each run
  counts, from them, the pairs of the blocks the kernel skips (off the hardware figure) and
  the masked pairs inside the partial blocks it computes (the model figure).
* ``score_mod``'s own element-wise work per pair (a bias, a soft cap) is not priced: the
  per-pair figure is SDPA's (scale, mask select, softmax), whatever score_mod adds.

Counts stay on the device (``masks.tally.Tally``); the (b, h, kv) grid of a mask is
evaluated once per BlockMask (its tensors' identity and version) and kept (``_UNMASKED``).
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch import Tensor

from dispatch_flops.engine.counting.records import CALLS, Signature
from dispatch_flops.engine.masks.fake_runs import FAKE_RUNS  # the compiled graphs priced now
from dispatch_flops.engine.masks.tally import TALLY, Tally, give_tally, has_values, rates
from dispatch_flops.engine.torch_private import disable_current_modes as _disable_current_modes
from dispatch_flops.engine.torch_private import lookup
from dispatch_flops.formulas import Category, Cost
from dispatch_flops.formulas.attention import (
    attention_backward_cost,
    attention_forward_cost,
    recomputed_rates,
)

# the BlockMask tuple a flex operator takes (BlockMask.as_tuple()): where each part sits
Q_LEN, KV_LEN, KV_NUM_BLOCKS, KV_INDICES, FULL_KV_NUM_BLOCKS, FULL_KV_INDICES = range(6)
Q_BLOCK_SIZE, KV_BLOCK_SIZE, MASK_MOD = -3, -2, -1
_ROWS_PER_CHUNK = 1 << 22  # mask_mod evaluated over at most this many pairs at a time


class _HopName:
    """What reports name a higher-order operator by: ``higher_order.flex_attention``."""

    namespace = "higher_order"

    def __init__(self, name: str):
        self.name = f"higher_order.{name}"
        self.overloadpacket = self

    def __str__(self) -> str:
        return self.name


class HopResolution:
    """A flex operator as the records' layout reads an op's resolution: its name, its
    category (priced by a formula) and its price from shapes (``price``)."""

    kind = None

    def __init__(self, name: str, backward: bool):
        self.func = _HopName(name)
        self.category = Category.EXACT
        self.backward = backward

    def price(self, call) -> Cost:
        (q, k, v), _out_shape, _kwargs = call
        cost = attention_backward_cost if self.backward else attention_forward_cost
        return cost(q, k, v, causal=False, masked=True)


FORWARD = HopResolution("flex_attention", False)
BACKWARD = HopResolution("flex_attention_backward", True)


def _nbytes(values) -> int:
    return sum(t.nbytes for t in values if isinstance(t, Tensor))


def count(mode, resolution: HopResolution, q: Tensor, k: Tensor, v: Tensor, outs,
          block_mask: tuple, buffers: tuple) -> None:
    """Count one call of a flex operator into ``mode``'s running frame; its masked pairs
    (eager: dense, every pair computed) into the record's tally."""
    acc = mode.current_acc()
    if acc is None:
        return
    key = (id(resolution), q.shape, k.shape, v.shape, q.dtype)
    rec = acc.get(key)
    if rec is None:
        call: tuple = ((q.shape, k.shape, v.shape), None, {})
        signature = Signature(call, _nbytes((q, k, v)), _nbytes(outs),
                              str(q.dtype).replace("torch.", ""))
        mode.keep_resolution(id(resolution), resolution)
        rec = acc[key] = [0, 0, signature]
        mode.book(rec)
    rec[CALLS] += 1
    if not has_values(q):  # fake or meta: no values to read (engine.graphs.compiled counts runs)
        if FAKE_RUNS:
            FAKE_RUNS[-1].note(rec, resolution.backward, (q.shape, k.shape, v.shape),
                             block_mask, buffers)
        return
    with _disable_current_modes(), torch.no_grad():
        useful = unmasked_pairs(block_mask, buffers, q.shape[0], q.shape[1], q.shape[2],
                                k.shape[2], q.device, blocks=False)
        total = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
        tally_into(rec, q.shape, k.shape, v.shape, resolution.backward, total - useful)


class FakeRun:
    """A compiled graph being priced on fake tensors (``engine.graphs.compiled``): which of its
    inputs each fake tensor stands for, whether its backend runs flex block-sparse (inductor)
    or densely (eager, aot_eager: the operator's math), and the flex calls met."""

    def __init__(self, inputs: dict, block_sparse: bool):
        self.inputs = inputs  # id(fake input) -> its position among the graph's inputs
        self.block_sparse = block_sparse
        self.tallies: list = []  # RunTally, and masks.shadows' per-run tallies
        self.backward = False  # the fake run is in the graph's backward

    def note(self, rec, backward: bool, shapes: tuple, block_mask: tuple, buffers: tuple):
        """A flex call met while pricing: counted per run when its mask is made of the
        graph's inputs (a BlockMask made inside the graph: priced dense, as the formula)."""
        def where(x):
            if not isinstance(x, Tensor):
                return (x, None)
            return (None, self.inputs.get(id(x), -1))

        parts = [where(x) for x in block_mask]
        kept = [where(x) for x in buffers]
        if any(i == -1 for _, i in parts + kept):
            return
        self.tallies.append(RunTally(rec, backward, shapes, parts, kept, self.block_sparse))


class RunTally:
    """One flex call of a compiled graph, counted at each run from the graph's real inputs:
    its masked pairs and, block-sparse, the pairs its kernel skipped."""

    __slots__ = ("rec", "backward", "shapes", "parts", "buffers", "block_sparse")

    def __init__(self, rec, backward, shapes, parts, buffers, block_sparse):
        self.rec, self.backward, self.shapes = rec, backward, shapes
        self.parts, self.buffers, self.block_sparse = parts, buffers, block_sparse

    def __call__(self, args) -> None:
        def real(part):
            value, at = part
            return value if at is None else args[at]

        block_mask = tuple(real(p) for p in self.parts)
        buffers = tuple(real(p) for p in self.buffers)
        qs, ks, vs = self.shapes
        b, h, s_q, s_k = qs[0], qs[1], qs[2], ks[2]
        device = block_mask[KV_NUM_BLOCKS].device
        total = b * h * s_q * s_k
        with _disable_current_modes(), torch.no_grad():
            if self.block_sparse:
                computed = computed_pairs(block_mask, b, h, s_q, s_k, device)
                useful = unmasked_pairs(block_mask, buffers, b, h, s_q, s_k, device, True)
                tally_into(self.rec, qs, ks, vs, self.backward, computed - useful,
                           total - computed)
            else:
                useful = unmasked_pairs(block_mask, buffers, b, h, s_q, s_k, device, False)
                tally_into(self.rec, qs, ks, vs, self.backward, total - useful)


def tally_into(rec, qs, ks, vs, backward: bool, masked, skipped=0) -> None:
    if len(rec) <= TALLY:
        give_tally(rec, Tally(*rates(qs, ks, vs, backward, True),
                              again=recomputed_rates(qs, True) if backward else (0, 0)))
    rec[TALLY].add(masked, skipped)


# (id(kv_num_blocks), version, id(mask_mod), shape, blocks) -> (weakref, unmasked pairs)
_UNMASKED: dict = {}
_UNMASKED_KEPT = 64


def unmasked_pairs(block_mask: tuple, buffers: tuple, b: int, h: int, s_q: int, s_k: int,
                   device, blocks: bool):
    """Unmasked (query, key) pairs of a BlockMask over a (b, h, s_q, s_k) call: ``mask_mod``
    true, over every pair (``blocks`` False: what the dense path masks) or over the blocks
    the block-sparse kernel computes (partial blocks by ``mask_mod``, full blocks whole).
    A device tensor (or an int): never read here."""
    from torch.nn.attention.flex_attention import noop_mask

    mask_mod = block_mask[MASK_MOD]
    anchor = block_mask[KV_NUM_BLOCKS]
    # the tensors mask_mod reads (its buffers, those its closure and globals hold) by
    # version too: ids a user changes in place are a new mask
    key = (id(anchor), getattr(anchor, "_version", 0), id(mask_mod), b, h, s_q, s_k, blocks,
           tuple((id(x), getattr(x, "_version", 0)) for x in buffers), _captured(mask_mod))
    found = _UNMASKED.get(key)
    if found is not None and found[0]() is anchor:
        return found[1]
    if mask_mod is None or mask_mod is noop_mask:
        useful = b * h * s_q * s_k
        if blocks:
            useful = _block_pairs(block_mask, b, h, s_q, s_k, device, full_only=False)
    else:
        useful = _mask_mod_pairs(mask_mod, buffers, block_mask, b, h, s_q, s_k, device, blocks)
    if len(_UNMASKED) >= _UNMASKED_KEPT:
        _UNMASKED.clear()
    _UNMASKED[key] = (weakref.ref(anchor), useful)
    return useful


def _captured(fn) -> tuple:
    """``(id, version)`` of each tensor a function reads from its closure or globals."""
    found = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, Tensor):
            found.append((id(value), value._version))
    code, names = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    if code is not None and names is not None:
        for name in code.co_names:
            value = names.get(name)
            if isinstance(value, Tensor):
                found.append((id(value), value._version))
    return tuple(found)


def _block_grid(block_mask: tuple, b: int, h: int, full: bool):
    """The (b, h, q blocks, kv blocks) grid of the partial (or ``full``) blocks, 0/1,
    broadcast over the call's batch and heads."""
    num = block_mask[FULL_KV_NUM_BLOCKS if full else KV_NUM_BLOCKS]
    indices = block_mask[FULL_KV_INDICES if full else KV_INDICES]
    if num is None:
        return None
    n_kv = indices.shape[-1]
    # a block listed among the first num[b, h, i] indices of row i is computed
    listed = torch.arange(n_kv, device=num.device) < num[..., None]
    grid = torch.zeros(indices.shape[:-1] + (n_kv + 1,), dtype=torch.int32,
                       device=num.device)
    # unlisted slots scatter into a spare last column, cut off after
    target = torch.where(listed, indices.long(), n_kv)
    grid.scatter_(-1, target, 1)
    return grid[..., :n_kv].expand(b, h, -1, -1)


def _sizes(n_blocks: int, block: int, length: int, device):
    """Rows (or columns) in each block of a sequence of ``length``: the last may be short."""
    starts = torch.arange(n_blocks, device=device) * block
    return (torch.clamp(length - starts, min=0, max=block)).to(torch.int64)


def _block_pairs(block_mask: tuple, b: int, h: int, s_q: int, s_k: int, device,
                 full_only: bool):
    """Pairs in the blocks the kernel computes (partial and full), or in the full ones."""
    total = 0
    for full in ((True,) if full_only else (False, True)):
        grid = _block_grid(block_mask, b, h, full)
        if grid is None:
            continue
        rows = _sizes(grid.shape[-2], block_mask[Q_BLOCK_SIZE], s_q, grid.device)
        cols = _sizes(grid.shape[-1], block_mask[KV_BLOCK_SIZE], s_k, grid.device)
        total = total + (grid.to(torch.int64) * rows[:, None] * cols[None, :]).sum()
    return total


def computed_pairs(block_mask: tuple, b: int, h: int, s_q: int, s_k: int, device):
    """Pairs the block-sparse kernel computes: those of its partial and full blocks."""
    return _block_pairs(block_mask, b, h, s_q, s_k, device, full_only=False)


def _mask_mod_pairs(mask_mod, buffers: tuple, block_mask: tuple, b: int, h: int, s_q: int,
                    s_k: int, device, blocks: bool):
    """Pairs ``mask_mod`` lets through, over every pair or (``blocks``) over the partial
    blocks, plus every pair of the full blocks. Evaluated a chunk of query rows at a time."""
    _vmap_for_bhqkv = lookup("torch.nn.attention.flex_attention._vmap_for_bhqkv")
    TransformGetItemToIndex = lookup(
        "torch._dynamo._trace_wrapped_higher_order_op.TransformGetItemToIndex")
    if _vmap_for_bhqkv is None or TransformGetItemToIndex is None:  # renamed (warned)
        return _block_pairs(block_mask, b, h, s_q, s_k, device, full_only=False) if blocks \
            else b * h * s_q * s_k
    vmapped = _vmap_for_bhqkv(mask_mod, prefix=(), suffix=(None,) * len(buffers))
    partial = _block_grid(block_mask, b, h, False) if blocks else None
    full = _block_grid(block_mask, b, h, True) if blocks else None
    q_block, kv_block = block_mask[Q_BLOCK_SIZE], block_mask[KV_BLOCK_SIZE]
    bs = torch.arange(b, device=device)
    hs = torch.arange(h, device=device)
    ks = torch.arange(s_k, device=device)
    step = max(1, _ROWS_PER_CHUNK // max(1, b * h * s_k))
    if blocks:  # chunks of whole query blocks, so the block grid slices with them
        step = max(q_block, step // q_block * q_block)
    total = 0
    for start in range(0, s_q, step):
        stop = min(s_q, start + step)
        qs = torch.arange(start, stop, device=device)
        with TransformGetItemToIndex():
            allowed = vmapped(bs, hs, qs, ks, *buffers).expand(b, h, stop - start, s_k)
        if blocks:
            rows = slice(start // q_block, (stop + q_block - 1) // q_block)
            where = partial[:, :, rows] if partial is not None else None
            if where is None:
                continue
            # each block's 0/1 spread over its pairs
            spread = where.repeat_interleave(q_block, dim=2)[:, :, :stop - start]
            spread = spread.repeat_interleave(kv_block, dim=3)[..., :s_k]
            allowed = allowed & spread.bool()
        total = total + allowed.sum()
    if blocks and full is not None:
        total = total + _block_pairs(block_mask, b, h, s_q, s_k, device, full_only=True)
    return total


# -- the rules on the counting modes ----------------------------------------------------------
def _sees(mode) -> bool:
    """Whether the call is ``mode``'s to count (a guarded mode's block is running)."""
    tracker = mode.tracker
    return tracker is not None and (not mode.guarded or tracker.sees(sys._getframe()))


def _forward_rule(hop):
    def rule(mode, query, key, value, score_mod, block_mask, scale, kernel_options,
             score_mod_other_buffers=(), mask_mod_other_buffers=()):
        outs = hop(query, key, value, score_mod, block_mask, scale, kernel_options,
                   score_mod_other_buffers, mask_mod_other_buffers)
        if _sees(mode):
            count(mode, FORWARD, query, key, value, outs[:1], block_mask,
                  mask_mod_other_buffers)
        return outs
    return rule


def _backward_rule(hop):
    def rule(mode, query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph,
             joint_graph, block_mask, scale, kernel_options, score_mod_other_buffers=(),
             mask_mod_other_buffers=()):
        outs = hop(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph,
                   joint_graph, block_mask, scale, kernel_options, score_mod_other_buffers,
                   mask_mod_other_buffers)
        if _sees(mode):
            count(mode, BACKWARD, query, key, value, outs[:3], block_mask,
                  mask_mod_other_buffers)
        return outs
    return rule


_INSTALLED: list = []


def install(*mode_types) -> None:
    """Register the flex rules on ``mode_types`` (once each)."""
    flex_attention = lookup("torch._higher_order_ops.flex_attention.flex_attention")
    flex_attention_backward = lookup(
        "torch._higher_order_ops.flex_attention.flex_attention_backward")
    if flex_attention is None or flex_attention_backward is None:  # renamed (warned)
        return
    for mode_type in mode_types:
        if mode_type in _INSTALLED:
            continue
        flex_attention.py_impl(mode_type)(_forward_rule(flex_attention))
        flex_attention_backward.py_impl(mode_type)(_backward_rule(flex_attention_backward))
        _INSTALLED.append(mode_type)

