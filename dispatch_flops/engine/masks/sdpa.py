"""SDPA's kernels, whose mask is an argument: each call's masked pairs into its record's tally.

The fused kernels (flash on the CPU, efficient, cuDNN, a backend's own) and the math entry
point take the mask as ``attn_mask`` (or ``attn_bias``) and a causal flag: the tally of each
reads them from the op's schema, counts the masked pairs the causal rule does not already
remove (``tally.masked_in``), and takes a meta mask's CPU values (``shadows.SHADOWS``) or, in
a compiled graph's fake run, a mask made from the graph's inputs (``shadows.InputMasks``,
counted at each run).
"""

from __future__ import annotations

from typing import Callable

import torch

from dispatch_flops.engine.masks.fake_runs import FAKE_RUNS
from dispatch_flops.engine.masks.shadows import RECIPES, SHADOWS, InputMasks
from dispatch_flops.engine.masks.tally import (
    BELOW_AUTOGRAD,
    NO_DISPATCH,
    TALLY,
    Tally,
    causal_keeps,
    give_tally,
    has_values,
    masked_in,
    rates,
)
from dispatch_flops.formulas.attention import recomputed_rates


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
            mask = SHADOWS.get(mask)  # a meta mask built from shapes
            if mask is None and FAKE_RUNS:  # made from a compiled graph's inputs
                recipe = RECIPES.get(found_mask)
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
            FAKE_RUNS[-1].tallies.append(InputMasks(found, recipe, total, qs[2], ks[-2],
                                                       causal, backward))
            return
        with NO_DISPATCH(), BELOW_AUTOGRAD():
            keeps = causal_keeps(qs[2], ks[-2], mask.device, causal == 2) if causal else None
            found.add(masked_in(mask, total, keeps))

    return tally


# SDPA's kernels: (op, backward, layout of q, k and v)
_KERNELS = (("_scaled_dot_product_flash_attention_for_cpu", False, "bhsd"),
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


def _tallies() -> dict:
    found: dict = {}
    for name, backward, layout in _KERNELS:
        op = getattr(getattr(torch.ops.aten, name, None), "default", None)
        if op is not None:
            found[op] = _sdpa_tally(op, backward, layout)
    return found


TALLIES = _tallies()  # each kernel's op, and its tally
