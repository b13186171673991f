"""Layer norm and softmax / log-softmax, forward and backward.

Per-element costs come from ``costs.ELEMENT_COSTS``; none of this is multiply-accumulate,
so MACs are 0.
"""

from __future__ import annotations

import torch

from ._registry import Cost, register_formula
from ._shapes import numel
from .costs import ELEMENT_COSTS

aten = torch.ops.aten


@register_formula(aten.native_layer_norm)
def layer_norm(x, normalized_shape, weight, bias, eps, *, out_shape, **kw) -> Cost:
    n = numel(x)
    affine = (weight is not None) + (bias is not None)
    return Cost(n * (ELEMENT_COSTS["layer_norm"] + affine * ELEMENT_COSTS["norm_affine"]))


@register_formula(aten.native_layer_norm_backward)
def layer_norm_backward(
    grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask, *, out_shape, **kw
) -> Cost:
    n = numel(x)
    flops = 0
    if output_mask[0]:
        flops += n * ELEMENT_COSTS["layer_norm_backward_input"]
    if output_mask[1] and weight is not None:
        flops += 2 * n  # sum over rows of grad_out * x_hat
    if output_mask[2] and bias is not None:
        flops += n  # sum over rows of grad_out
    return Cost(flops)


@register_formula([aten._softmax, aten._safe_softmax])
def softmax(x, dim, *args, out_shape, **kw) -> Cost:
    return Cost(numel(x) * ELEMENT_COSTS["softmax"])


@register_formula(aten._log_softmax)
def log_softmax(x, dim, half_to_float, *, out_shape, **kw) -> Cost:
    return Cost(numel(x) * ELEMENT_COSTS["log_softmax"])


@register_formula([aten._softmax_backward_data, aten._log_softmax_backward_data])
def softmax_backward(grad_out, out, dim, input_dtype, *, out_shape, **kw) -> Cost:
    return Cost(numel(grad_out) * ELEMENT_COSTS["softmax_backward"])
