"""Normalisations (layer, batch, group, instance, RMS) and softmax / log-softmax, forward and
backward, and their composite entry points.

Per-element costs come from ``costs.ELEMENT_COSTS``; none of this is multiply-accumulate,
so MACs are 0.
"""

from __future__ import annotations

from ._registry import Cost, namespace, register_formula
from ._shapes import numel
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met


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
        flops += n * ELEMENT_COSTS["norm_backward_weight"]  # sum over rows of grad_out * x_hat
    if output_mask[2] and bias is not None:
        flops += n * ELEMENT_COSTS["norm_backward_bias"]  # sum over rows of grad_out
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


# ---- batch, group, instance and RMS norm -------------------------------------------------------


def _affine(weight, bias) -> int:
    return ((weight is not None) + (bias is not None)) * ELEMENT_COSTS["norm_affine"]


def norm_forward_cost(n: int, training: bool, weight, bias) -> int:
    """Statistics from the batch (training) or given (eval), then the affine part, per element.
    The per-row/channel finishing work (divides, eps, rsqrt, running-stat updates) is O(rows)
    and not counted, as for layer norm."""
    per = ELEMENT_COSTS["layer_norm" if training else "batch_norm_eval"]
    return n * (per + _affine(weight, bias))


def norm_backward_cost(n: int, training: bool, mask, has_weight: bool, has_bias: bool) -> int:
    flops = 0
    if mask[0]:
        key = "layer_norm_backward_input" if training else "batch_norm_eval_backward_input"
        flops += n * ELEMENT_COSTS[key]
    if mask[1] and has_weight:
        flops += n * ELEMENT_COSTS["norm_backward_weight"]
    if mask[2] and has_bias:
        flops += n * ELEMENT_COSTS["norm_backward_bias"]
    return flops


@register_formula([aten.native_batch_norm, aten._native_batch_norm_legit_functional,
                   aten.cudnn_batch_norm, aten.miopen_batch_norm])
def batch_norm(x, weight, bias, running_mean, running_var, training, *args, out_shape,
               **kw) -> Cost:
    return Cost(norm_forward_cost(numel(x), training, weight, bias))


@register_formula(aten._native_batch_norm_legit)
def batch_norm_legit(x, weight, bias, *args, out_shape, **kw) -> Cost:
    # (x, w, b, running_mean, running_var, training, ...) or .no_stats (x, w, b, training, ...)
    training = args[2] if len(args) > 2 and isinstance(args[2], bool) else args[0]
    return Cost(norm_forward_cost(numel(x), training, weight, bias))


@register_formula(aten._native_batch_norm_legit_no_training)
def batch_norm_no_training(x, weight, bias, *args, out_shape, **kw) -> Cost:
    return Cost(norm_forward_cost(numel(x), False, weight, bias))


@register_formula(aten._batch_norm_with_update)
def batch_norm_with_update(x, weight, bias, *args, out_shape, **kw) -> Cost:
    return Cost(norm_forward_cost(numel(x), True, weight, bias))


@register_formula(aten._batch_norm_no_update)
def batch_norm_no_update(x, weight, bias, running_mean, *args, out_shape, **kw) -> Cost:
    # without running statistics, the batch's own are computed
    return Cost(norm_forward_cost(numel(x), running_mean is None, weight, bias))


@register_formula(aten.native_batch_norm_backward)
def batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd,
                        train, eps, output_mask, *, out_shape, **kw) -> Cost:
    return Cost(norm_backward_cost(numel(x), train, output_mask, weight is not None, True))


@register_formula(aten.batch_norm_backward)
def batch_norm_backward_update(grad_out, x, weight, running_mean, running_var, save_mean,
                               save_var, update, eps, output_mask, *args, out_shape,
                               **kw) -> Cost:
    return Cost(norm_backward_cost(numel(x), update, output_mask, weight is not None, True))


@register_formula([aten.cudnn_batch_norm_backward, aten.miopen_batch_norm_backward])
def batch_norm_backward_vendor(x, grad_out, weight, *args, out_shape, **kw) -> Cost:
    # the vendor kernels compute all three gradients, from batch statistics
    return Cost(norm_backward_cost(numel(x), True, (True, True, True), weight is not None, True))


@register_formula(aten.native_group_norm)
def group_norm(x, weight, bias, *args, out_shape, **kw) -> Cost:
    return Cost(norm_forward_cost(numel(x), True, weight, bias))


@register_formula(aten.native_group_norm_backward)
def group_norm_backward(grad_out, x, mean, rstd, weight, n, c, hxw, group, output_mask, *,
                        out_shape, **kw) -> Cost:
    return Cost(norm_backward_cost(numel(x), True, output_mask, weight is not None, True))


@register_formula(aten._fused_rms_norm)
def fused_rms_norm(x, normalized_shape, weight=None, eps=None, *, out_shape, **kw) -> Cost:
    return Cost(numel(x) * (ELEMENT_COSTS["rms_norm"] + _affine(weight, None)))


@register_formula(aten._fused_rms_norm_backward)
def fused_rms_norm_backward(grad_out, x, normalized_shape, rstd, weight, output_mask, *,
                            out_shape, **kw) -> Cost:
    n = numel(x)
    flops = n * ELEMENT_COSTS["rms_norm_backward_input"] if output_mask[0] else 0
    if output_mask[1] and weight is not None:
        flops += n * ELEMENT_COSTS["norm_backward_weight"]
    return Cost(flops)


# ---- composite entry points: they reach the mode undecomposed under inference_mode ------------
# Each prices exactly what its no_grad decomposition's ops are priced at.


@register_formula(aten.layer_norm)
def layer_norm_composite(x, normalized_shape, weight=None, bias=None, *args, out_shape,
                         **kw) -> Cost:
    return layer_norm(x, normalized_shape, weight, bias, None, out_shape=out_shape)


@register_formula(aten.group_norm)
def group_norm_composite(x, num_groups, weight=None, bias=None, *args, out_shape, **kw) -> Cost:
    return group_norm(x, weight, bias, out_shape=out_shape)


@register_formula(aten.batch_norm)
def batch_norm_composite(x, weight, bias, running_mean, running_var, training, *args,
                         out_shape, **kw) -> Cost:
    return batch_norm(x, weight, bias, running_mean, running_var, training, out_shape=out_shape)


@register_formula(aten.instance_norm)
def instance_norm_composite(x, weight, bias, running_mean, running_var, use_input_stats, *args,
                            out_shape, **kw) -> Cost:
    # the decomposition: batch norm over [1, n * c, ...] (weights repeated, a copy), then,
    # with running statistics, each updated with the mean over the batch of [n, c] values
    flops = norm_forward_cost(numel(x), use_input_stats, weight, bias)
    if use_input_stats and running_mean is not None:
        rows, channels = x[0] * x[1], x[1]
        flops += 2 * (rows * ELEMENT_COSTS["mean"] + channels)
    return Cost(flops)


@register_formula(aten.rms_norm)
def rms_norm_composite(x, normalized_shape, weight=None, eps=None, *, out_shape, **kw) -> Cost:
    # x.pow(2) (n), .mean(-1) (n + rows), + eps (rows), rsqrt (rows), x * r (n), * weight (n)
    n = numel(x)
    rows = n // numel(normalized_shape) if numel(normalized_shape) else 0
    flops = (n * ELEMENT_COSTS["pow"] + n * ELEMENT_COSTS["mean"] + rows
             + rows * (ELEMENT_COSTS["add"] + ELEMENT_COSTS["rsqrt"]) + n * ELEMENT_COSTS["mul"])
    if weight is not None:
        flops += n * ELEMENT_COSTS["mul"]
    return Cost(flops)


@register_formula(aten.softmax)
def softmax_composite(x, dim, *args, out_shape, **kw) -> Cost:
    return softmax(x, dim, out_shape=out_shape)


@register_formula(aten.log_softmax)
def log_softmax_composite(x, dim, *args, out_shape, **kw) -> Cost:
    return log_softmax(x, dim, False, out_shape=out_shape)


# Weight normalisation (wav2vec2, HuBERT: torch.nn.utils.weight_norm's fused kernel):
# w = g * v / ||v||, the norm over every dim of v but `dim`; v: E elements, g and the norms: G
@register_formula(aten._weight_norm_interface)
def weight_norm(v, g, dim=0, *, out_shape, **kw) -> Cost:
    e, n = numel(v), numel(g)
    # the norms: square and sum per element of v, a sqrt per norm; g / norm per norm; then
    # times v per element
    return Cost(e * ELEMENT_COSTS["norm_2"] + n * (ELEMENT_COSTS["sqrt"] + ELEMENT_COSTS["div"])
                + e * ELEMENT_COSTS["mul"])


@register_formula(aten._weight_norm_interface_backward)
def weight_norm_backward(grad_w, v, g, norms, dim, *, out_shape, **kw) -> Cost:
    e, n = numel(v), numel(g)
    # a = sum(grad_w * v) per norm (2 per element of v); grad_g = a / norm, g / norm and
    # grad_g / norm (3 per norm); grad_v = (g / norm) * (grad_w - v * (grad_g / norm)) (3 per
    # element of v)
    return Cost(5 * e + 3 * n)
