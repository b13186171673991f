"""Scaled-dot-product attention: every fused variant torch dispatches to, forward and backward.

Shapes (after moving heads first): q [b, h_q, s_q, d], k [b, h_kv, s_k, d], v [b, h_kv, s_k, d_v]
with h_q a multiple of h_kv (GQA/MQA: each query head still meets s_k keys).

Forward MACs = pairs * (d + d_v): scores q @ k^T, then probs @ v.
Backward MACs = pairs * (3 d + 2 d_v): the fused kernels recompute q @ k^T, then
grad_probs = grad_out @ v^T, grad_v = probs^T @ grad_out, grad_q = grad_s @ k,
grad_k = grad_s^T @ q. The recomputation (q @ k^T and its softmax) is hardware work only: the
model's backward is the other four contractions, as SDPA's math decomposition runs them, so it
joins the masked pairs in ``masked_flops`` / ``masked_macs`` (``recomputed_rates``).
``pairs`` is b * h_q * s_q * s_k: the kernels' hardware figure (dense). With ``is_causal``
the pairs above torch's top-left-aligned causal diagonal are masked: their share is the
``Cost``'s ``masked_flops`` / ``masked_macs`` (model flops count only the unmasked pairs).
Non-MAC flops per pair: the scale, the softmax and (backward) its gradient, from ELEMENT_COSTS;
an additive mask/bias adds one flop per pair. A mask tensor's masked pairs are tensor values:
the engine counts them (``engine.masks``), at the per-pair rate these formulas imply.
"""

from __future__ import annotations

from ._registry import Cost, namespace, register_formula
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met


def attention_pairs(b: int, h: int, s_q: int, s_k: int, causal, bottom_right: bool = False
                    ) -> int:
    """(query, key) pairs that are computed; causal means the top-left-aligned tril mask (row i
    keeps keys 0..i), or with ``bottom_right`` the mask aligned to the last key (row i keeps keys
    0..i + s_k - s_q: ``custom_mask_type`` 2 of the memory-efficient kernel)."""
    if not causal:
        return b * h * s_q * s_k
    # row i keeps min(max(i + c, 0), s_k) keys, i = 0 .. s_q - 1
    c = 1 + (s_k - s_q if bottom_right else 0)
    lo, hi = c, c + s_q - 1
    first, last = max(lo, 1), min(hi, s_k)  # rows keeping 1 .. s_k - 1 (or s_k) keys
    rising = (first + last) * (last - first + 1) // 2 if last >= first else 0
    full = max(0, hi - max(lo, s_k + 1) + 1) * s_k  # rows past the last key keep them all
    return b * h * (rising + full)


def pairs_cost(pairs: int, useful: int, macs_per_pair: int, flops_per_pair: int) -> Cost:
    """The ``Cost`` of ``pairs`` (query, key) pairs computed, ``useful`` of them unmasked:
    ``flops_per_pair`` counts the pair's non-MAC flops (its MACs are added twice)."""
    rate = 2 * macs_per_pair + flops_per_pair
    masked = pairs - useful
    return Cost(pairs * rate, pairs * macs_per_pair, masked_flops=masked * rate,
                masked_macs=masked * macs_per_pair)


def _pairs(q, k, causal) -> tuple[int, int]:
    """(pairs computed, pairs unmasked) of a call: ``causal`` is the call's is_causal, or the
    memory-efficient kernel's ``custom_mask_type`` (1 top-left, 2 bottom-right); the kernels
    compute the masked pairs too (see the module's docstring)."""
    b, h, s_q = q[0], q[1], q[2]
    s_k = k[-2]
    return attention_pairs(b, h, s_q, s_k, False), attention_pairs(
        b, h, s_q, s_k, bool(causal), bottom_right=causal == 2)


def attention_forward_cost(q, k, v, *, causal, masked: bool) -> Cost:
    d, d_v = q[-1], v[-1]
    pairs, useful = _pairs(q, k, causal)
    per_pair = ELEMENT_COSTS["attention_scale"] + ELEMENT_COSTS["softmax"] + int(masked)
    return pairs_cost(pairs, useful, d + d_v, per_pair)


def recomputed_rates(q, masked: bool) -> tuple[int, int]:
    """(flops, MACs) per (query, key) pair that a fused backward spends recomputing the
    forward's probabilities: the scores ``q·kᵀ`` (d MACs), their softmax from the saved
    log-sum-exp and, with a mask, the mask added again. Hardware work the model does not
    need (the model's backward reads the forward's probabilities, as SDPA's math
    decomposition does): part of the call's ``masked_flops`` / ``masked_macs``."""
    d = q[-1]
    return 2 * d + ELEMENT_COSTS["softmax"] + int(masked), d


def attention_backward_cost(q, k, v, *, causal, masked: bool) -> Cost:
    """Every pair's backward as the fused kernels run it (recomputation included: the
    hardware figure); the masked pairs' whole share and the unmasked pairs' recomputation
    (``recomputed_rates``) are the hardware-only part (``masked_flops`` / ``masked_macs``)."""
    d, d_v = q[-1], v[-1]
    pairs, useful = _pairs(q, k, causal)
    per_pair = (
        ELEMENT_COSTS["attention_scale"]
        + ELEMENT_COSTS["softmax"]
        + ELEMENT_COSTS["softmax_backward"]
        + int(masked)
    )
    cost = pairs_cost(pairs, useful, 3 * d + 2 * d_v, per_pair)
    again_flops, again_macs = recomputed_rates(q, masked)
    return cost._replace(masked_flops=cost.masked_flops + useful * again_flops,
                         masked_macs=cost.masked_macs + useful * again_macs)


def _kernel_layout(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, int_values=None,
                   positions=(3, 4)) -> list:
    """``[(count, q, k, v), ...]``: the _flash/_efficient_attention_* kernels' q, k, v as
    [b, h, s, d], ``count`` times each.

    Dense inputs are [b, s, h, d]: one entry. Packed (varlen) inputs are [total, h, d] (the
    efficient kernel adds a leading 1) with ``cum_seq`` the cumulative sequence lengths:
    sequence ``i`` meets only its own keys, ``Σ s_q,i · s_k,i`` pairs per head. With the
    lengths' values (``int_values``, at ``positions``: the engine reads them on the CPU) each
    sequence is priced as it is; without them (on an accelerator the host would wait for the
    device), at the bound ``min(max_k · total_q, max_q · total_k)`` pairs, which needs no
    values and is exact for equal lengths (never above ``batch · max_q · max_k``)."""
    if cum_seq_q is None:
        return [(1,) + tuple((t[0], t[2], t[1], t[3]) for t in (q, k, v))]
    q, k, v = (t[1:] if len(t) == 4 else t for t in (q, k, v))
    bounds_q, bounds_k = (int_values[i] if int_values and i < len(int_values) else None
                          for i in positions)
    if bounds_q is not None and bounds_k is not None:
        grouped: dict = {}
        for a, b, c, d in zip(bounds_q, bounds_q[1:], bounds_k, bounds_k[1:]):
            grouped[(b - a, d - c)] = grouped.get((b - a, d - c), 0) + 1
        return [(count, (1, q[1], s_q, q[2]), (1, k[1], s_k, k[2]), (1, v[1], s_k, v[2]))
                for (s_q, s_k), count in grouped.items()]
    if max_k * q[0] <= max_q * k[0]:  # every query meets at most max_k keys
        s_q, s_k = q[0], max_k
    else:  # every key meets at most max_q queries
        s_q, s_k = max_q, k[0]
    return [(1, (1, q[1], s_q, q[2]), (1, k[1], s_k, k[2]), (1, v[1], s_k, v[2]))]


def _summed(cost, layout, **kw) -> Cost:
    """``cost`` of each ``(count, q, k, v)`` in ``layout``, times its count, summed (the
    masked pairs' share too)."""
    total = [(count, cost(q, k, v, **kw)) for count, q, k, v in layout]
    return Cost(sum(n * c.flops for n, c in total), sum(n * c.macs for n, c in total),
                masked_flops=sum(n * c.masked_flops for n, c in total),
                masked_macs=sum(n * c.masked_macs for n, c in total))


# ---- forward -------------------------------------------------------------------------------


@register_formula([aten._scaled_dot_product_flash_attention_for_cpu])
def sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, out_shape, attn_mask=None,
                   scale=None) -> Cost:
    return attention_forward_cost(q, k, v, causal=is_causal, masked=attn_mask is not None)


@register_formula([aten._scaled_dot_product_flash_attention])
def sdpa_flash(q, k, v, dropout_p=0.0, is_causal=False, *args, out_shape, **kw) -> Cost:
    if not isinstance(is_causal, bool):  # .quantized: three descale tensors precede dropout_p
        is_causal = args[2] if len(args) > 2 else kw.get("is_causal", False)
    return attention_forward_cost(q, k, v, causal=is_causal, masked=False)


@register_formula([aten._scaled_dot_product_efficient_attention,
                   aten._scaled_dot_product_cudnn_attention])
def sdpa_with_bias(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                   *args, out_shape, **kw) -> Cost:
    return attention_forward_cost(q, k, v, causal=is_causal, masked=attn_bias is not None)


@register_formula([aten._scaled_dot_product_fused_attention_overrideable,
                   aten.scaled_dot_product_attention, aten._scaled_dot_product_attention_math])
def sdpa_generic(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *args, out_shape,
                 **kw) -> Cost:
    # the composite entry points reach the mode only under inference_mode
    return attention_forward_cost(q, k, v, causal=is_causal, masked=attn_mask is not None)


@register_formula(aten._flash_attention_forward)
def flash_attention_forward(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                            *args, out_shape, int_values=None, **kw) -> Cost:
    layout = _kernel_layout(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, int_values, (3, 4))
    return _summed(attention_forward_cost, layout, causal=is_causal, masked=False)


@register_formula(aten._efficient_attention_forward)
def efficient_attention_forward(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, dropout_p, custom_mask_type, *args, out_shape,
                                int_values=None, **kw) -> Cost:
    layout = _kernel_layout(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            int_values, (4, 5))
    return _summed(attention_forward_cost, layout, causal=custom_mask_type,
                   masked=bias is not None)


# ---- backward ------------------------------------------------------------------------------


@register_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def sdpa_flash_cpu_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *,
                            out_shape, attn_mask=None, scale=None) -> Cost:
    return attention_backward_cost(q, k, v, causal=is_causal, masked=attn_mask is not None)


@register_formula(aten._scaled_dot_product_flash_attention_backward)
def sdpa_flash_backward(grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                        dropout_p, is_causal, *args, out_shape, **kw) -> Cost:
    return attention_backward_cost(q, k, v, causal=is_causal, masked=False)


@register_formula(aten._scaled_dot_product_efficient_attention_backward)
def sdpa_efficient_backward(grad_out, q, k, v, attn_bias, out, logsumexp, philox_seed,
                            philox_offset, dropout_p, grad_input_mask, is_causal=False, *,
                            out_shape, **kw) -> Cost:
    return attention_backward_cost(q, k, v, causal=is_causal, masked=attn_bias is not None)


@register_formula(aten._scaled_dot_product_cudnn_attention_backward)
def sdpa_cudnn_backward(grad_out, q, k, v, out, logsumexp, philox_seed, philox_offset,
                        attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *,
                        out_shape, **kw) -> Cost:
    return attention_backward_cost(q, k, v, causal=is_causal, masked=attn_bias is not None)


@register_formula(aten._scaled_dot_product_fused_attention_overrideable_backward)
def sdpa_overrideable_backward(grad_out, q, k, v, attn_bias, grad_input_mask, out, logsumexp,
                               cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *args,
                               out_shape, **kw) -> Cost:
    return attention_backward_cost(q, k, v, causal=is_causal, masked=attn_bias is not None)


@register_formula(aten._flash_attention_backward)
def flash_attention_backward(grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                             max_k, dropout_p, is_causal, *args, out_shape,
                             int_values=None, **kw) -> Cost:
    layout = _kernel_layout(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, int_values, (6, 7))
    return _summed(attention_backward_cost, layout, causal=is_causal, masked=False)


@register_formula(aten._efficient_attention_backward)
def efficient_attention_backward(grad_out, q, k, v, bias, out, cu_seqlens_q, cu_seqlens_k,
                                 max_seqlen_q, max_seqlen_k, logsumexp, dropout_p, philox_seed,
                                 philox_offset, custom_mask_type, *args, out_shape,
                                 int_values=None, **kw) -> Cost:
    layout = _kernel_layout(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            int_values, (6, 7))
    return _summed(attention_backward_cost, layout, causal=custom_mask_type,
                   masked=bias is not None)


# The formulas whose masked share is the causal diagonal alone (``is_causal``, a
# ``custom_mask_type``: shapes, never a mask's values): what the counter's deprecated
# ``attention="causal"`` takes their kernels to skip exactly (``engine.counting.records``).
CAUSAL_DIAGONAL_FORMULAS = frozenset((
    sdpa_flash_cpu, sdpa_flash, sdpa_with_bias, sdpa_generic, flash_attention_forward,
    efficient_attention_forward, sdpa_flash_cpu_backward, sdpa_flash_backward,
    sdpa_efficient_backward, sdpa_cudnn_backward, sdpa_overrideable_backward,
    flash_attention_backward, efficient_attention_backward))
