"""torch.nn's fused inference fast paths: ``_native_multi_head_attention`` (MultiheadAttention
in eval) and ``_transformer_encoder_layer_fwd`` (TransformerEncoderLayer in eval).

Each is priced as the sum of the pieces it fuses, with the same formulas the pieces have
when they run apart: projections as matmuls with a bias add, attention as in ``attention``
(dense, scale + softmax per pair, one flop per pair for a mask), layer norms as in ``norms``,
residual adds and the activation as pointwise ops.
"""

from __future__ import annotations

from ._registry import Cost, namespace, register_formula
from .attention import attention_forward_cost
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met


def _linear(rows: int, n_in: int, n_out: int, bias: bool) -> tuple[int, int]:
    """(flops, macs) of [rows, n_in] @ [n_in, n_out] (+ bias)."""
    macs = rows * n_in * n_out
    return 2 * macs + (rows * n_out if bias else 0), macs


def multi_head_attention_cost(q, k, v, embed_dim: int, num_heads: int, masked: bool,
                              need_weights: bool, average_weights: bool) -> Cost:
    # q: [b, l, e], k and v: [b, s, e]; qkv_weight [3e, e], proj_weight [e, e]
    b, l, e = q[0], q[-2], embed_dim
    s = k[-2]
    d = e // num_heads
    flops = macs = 0
    for rows in (b * l, b * s, b * s):  # the q, k and v projections, each with its bias
        f, m = _linear(rows, e, e, True)
        flops, macs = flops + f, macs + m
    attention = attention_forward_cost((b, num_heads, l, d), (b, num_heads, s, d),
                                       (b, num_heads, s, d), causal=False, masked=masked)
    f, m = _linear(b * l, e, e, True)  # the output projection
    flops += attention.flops + f
    macs += attention.macs + m
    if need_weights and average_weights:
        flops += b * num_heads * l * s + b * l * s  # sum over heads, divide by their count
    return Cost(flops, macs)


@register_formula(aten._native_multi_head_attention)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                                proj_weight, proj_bias, mask=None, need_weights=True,
                                average_attn_weights=True, mask_type=None, *, out_shape,
                                **kw) -> Cost:
    return multi_head_attention_cost(query, key, value, embed_dim, num_head, mask is not None,
                                     need_weights, average_attn_weights)


@register_formula(aten._transformer_encoder_layer_fwd)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                  proj_bias, use_gelu, norm_first, eps, norm_weight_1,
                                  norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                                  ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None, *, out_shape, **kw) -> Cost:
    # src: [b, l, e]; ffn_weight_1: [f, e]
    tokens = src[0] * src[1] if len(src) == 3 else src[0]
    n = tokens * embed_dim
    attention = multi_head_attention_cost(src, src, src, embed_dim, num_heads, mask is not None,
                                          need_weights=False, average_weights=False)
    hidden = ffn_weight_1[0]
    up_flops, up_macs = _linear(tokens, embed_dim, hidden, True)
    down_flops, down_macs = _linear(tokens, hidden, embed_dim, True)
    activation = ELEMENT_COSTS["gelu" if use_gelu else "relu"] * tokens * hidden
    norms = 2 * n * (ELEMENT_COSTS["layer_norm"] + 2 * ELEMENT_COSTS["norm_affine"])
    residuals = 2 * n * ELEMENT_COSTS["add"]
    return Cost(attention.flops + up_flops + down_flops + activation + norms + residuals,
                attention.macs + up_macs + down_macs)
