"""Losses: nll (and cross-entropy through its aten pieces: log_softmax + nll), mse, l1,
smooth-l1, huber, binary cross-entropy (with and without logits), soft and multi margin, kl.

Each costs ``ELEMENT_COSTS[key]`` per input element, plus the reduction: ``reduction`` is 0
(none), 1 (mean: one add per element and a divide) or 2 (sum: one add per element).
"""

from __future__ import annotations

import torch

from ._registry import Cost, namespace, register_formula
from ._shapes import numel
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met

NONE, MEAN, SUM = 0, 1, 2


def reduced(n: int, reduction: int) -> int:
    """Flops of reducing n loss values: n adds, and a divide for the mean."""
    return 0 if reduction == NONE else n * ELEMENT_COSTS["reduce"] + (reduction == MEAN)


def elementwise_loss(key: str):
    def formula(x, target, reduction=MEAN, *args, out_shape, **kw) -> Cost:
        n = numel(x)
        return Cost(n * ELEMENT_COSTS[key] + reduced(n, reduction))

    formula.__name__ = f"loss_{key}"
    return formula


def elementwise_loss_backward(key: str):
    def formula(grad_out, x, *args, out_shape, **kw) -> Cost:
        return Cost(numel(x) * ELEMENT_COSTS[key])

    formula.__name__ = f"loss_{key}"
    return formula


register_formula(aten.mse_loss)(elementwise_loss("mse"))
register_formula(aten.mse_loss_backward)(elementwise_loss_backward("mse_backward"))
register_formula(aten.l1_loss)(elementwise_loss("l1"))  # composite: sub, abs, reduction
register_formula(aten.smooth_l1_loss)(elementwise_loss("smooth_l1"))
register_formula(aten.smooth_l1_loss_backward)(elementwise_loss_backward("smooth_l1_backward"))
register_formula(aten.huber_loss)(elementwise_loss("huber"))
register_formula(aten.huber_loss_backward)(elementwise_loss_backward("huber_backward"))
register_formula(aten.soft_margin_loss)(elementwise_loss("soft_margin"))
register_formula(aten.soft_margin_loss_backward)(elementwise_loss_backward("soft_margin_backward"))


@register_formula(aten.binary_cross_entropy)
def binary_cross_entropy(x, target, weight=None, reduction=MEAN, *, out_shape, **kw) -> Cost:
    n = numel(x)
    per = ELEMENT_COSTS["binary_cross_entropy"] + (weight is not None)
    return Cost(n * per + reduced(n, reduction))


@register_formula(aten.binary_cross_entropy_backward)
def binary_cross_entropy_backward(grad_out, x, target, weight=None, reduction=MEAN, *,
                                  out_shape, **kw) -> Cost:
    # the mean's 1/n scales each gradient once more
    per = (ELEMENT_COSTS["binary_cross_entropy_backward"] + (weight is not None)
           + (reduction == MEAN))
    return Cost(numel(x) * per)


@register_formula(aten.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=MEAN,
                                     *, out_shape, **kw) -> Cost:
    n = numel(x)
    per = (ELEMENT_COSTS["binary_cross_entropy_with_logits"] + (weight is not None)
           + 3 * (pos_weight is not None))
    return Cost(n * per + reduced(n, reduction))


@register_formula(aten.multi_margin_loss)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=MEAN, *, out_shape,
                      **kw) -> Cost:
    # x: [n, classes]: every (sample, class) pair; per-sample sums then the reduction
    n = numel(x)
    rows = numel(target)
    per = ELEMENT_COSTS["multi_margin"] + (weight is not None)
    return Cost(n * per + reduced(rows, reduction))


@register_formula(aten.multi_margin_loss_backward)
def multi_margin_loss_backward(grad_out, x, target, p=1, margin=1, weight=None, reduction=MEAN,
                               *, out_shape, **kw) -> Cost:
    return Cost(numel(x) * (ELEMENT_COSTS["multi_margin_backward"] + (weight is not None)))


@register_formula(aten.kl_div)
def kl_div(x, target, reduction=MEAN, log_target=False, *, out_shape, **kw) -> Cost:
    # the composite's decomposition: target * (log target - x) as xlogy(t, t) - t * x, or
    # exp(t) * (t - x) for a log target
    n = numel(x)
    per = (ELEMENT_COSTS["exp"] + ELEMENT_COSTS["sub"] + ELEMENT_COSTS["mul"] if log_target
           else ELEMENT_COSTS["xlogy"] + ELEMENT_COSTS["mul"] + ELEMENT_COSTS["sub"])
    return Cost(n * per + reduced(n, reduction))


# ---- nll and cross-entropy ---------------------------------------------------------------------


def nll_cost(samples: int, weight, reduction: int) -> int:
    # per sample: the ignore_index test and the negated pick (+ the class weight); the sum
    # and, for the mean, the total weight's sum and one divide
    per = ELEMENT_COSTS["nll"] + (weight is not None)
    if reduction != NONE:
        per += 1
    if reduction == MEAN:
        per += 1
    return samples * per + (reduction == MEAN)


@register_formula([aten.nll_loss_forward, aten.nll_loss2d_forward, aten.nll_loss,
                   aten.nll_loss_nd, aten.nll_loss2d])
def nll_loss(x, target, weight=None, reduction=MEAN, *args, out_shape, **kw) -> Cost:
    # x: [n, classes, *d] or [classes]; target: [n, *d] or []: one pick per target element
    return Cost(nll_cost(numel(target), weight, reduction))


@register_formula([aten.nll_loss_backward, aten.nll_loss2d_backward])
def nll_loss_backward(grad_out, x, target, weight, reduction, *args, out_shape, **kw) -> Cost:
    # per sample: ignore test (1), -g (1), the class weight (1), the mean's divide (1)
    per = ELEMENT_COSTS["nll"] + (weight is not None) + (reduction == MEAN)
    return Cost(numel(target) * per)


@register_formula(aten.cross_entropy_loss)
def cross_entropy_loss(x, target, weight=None, reduction=MEAN, ignore_index=-100,
                       label_smoothing=0.0, *, out_shape, **kw) -> Cost:
    """The composite (inference_mode), priced as its no_grad decomposition: log_softmax, then
    nll for class indices or a weighted sum for class probabilities; label smoothing adds the
    uniform term's sum and masking."""
    n = numel(x)
    flops = n * ELEMENT_COSTS["log_softmax"]
    if len(target) == len(x):  # class probabilities, same shape as the input
        samples = n // x[1] if len(x) > 1 else 1
        if label_smoothing > 0:
            flops += n * (ELEMENT_COSTS["mul"] + ELEMENT_COSTS["add"])  # t * (1 - s) + s / c
        flops += n * ELEMENT_COSTS["mul"] * (1 + (weight is not None))  # * log p (* weight)
        if reduction == NONE:
            return Cost(flops + n * ELEMENT_COSTS["reduce"] + samples * ELEMENT_COSTS["neg"])
        # sum over everything, negate, and divide by the batch for the mean
        return Cost(flops + n * ELEMENT_COSTS["reduce"] + ELEMENT_COSTS["neg"]
                    + (reduction == MEAN) * ELEMENT_COSTS["div"])
    samples = numel(target)
    flops += nll_cost(samples, weight, reduction)
    if label_smoothing > 0:
        if weight is not None:
            flops += n * ELEMENT_COSTS["mul"]  # log p * weight
        # sum over classes, negate, mask the ignored targets (eq, masked_fill)
        flops += n * ELEMENT_COSTS["reduce"] + samples * (
            ELEMENT_COSTS["neg"] + ELEMENT_COSTS["eq"] + ELEMENT_COSTS["masked_fill"])
        if reduction == MEAN and weight is not None:
            # the weights of the kept targets (masked_fill twice), two sums, a divide
            flops += samples * (2 * ELEMENT_COSTS["masked_fill"] + 2 * ELEMENT_COSTS["reduce"]) + 1
        elif reduction == MEAN:
            # the kept-target count (bitwise_not, sum), the sum, a divide
            flops += samples * (ELEMENT_COSTS["bitwise_not"] + 2 * ELEMENT_COSTS["reduce"]) + 1
        elif reduction == SUM:
            flops += samples * ELEMENT_COSTS["reduce"]
        # (1 - s) * nll + s / c * smooth: two multiplies and an add per loss value
        values = samples if reduction == NONE else 1
        flops += values * (2 * ELEMENT_COSTS["mul"] + ELEMENT_COSTS["add"])
    return Cost(flops)


# ---- composite losses that reach the mode only under inference_mode ----------------------------
# Each is priced as its no_grad decomposition's ops are, at the default options' op sequence.


@register_formula(aten.margin_ranking_loss)
def margin_ranking_loss(x1, x2, target, margin=0.0, reduction=MEAN, *, out_shape, **kw) -> Cost:
    # -target * (x1 - x2) + margin, clamped at 0: sub, neg, mul, add, clamp
    n = numel(torch.broadcast_shapes(x1, x2, target))
    return Cost(5 * n + reduced(n, reduction))


@register_formula(aten.hinge_embedding_loss)
def hinge_embedding_loss(x, target, margin=1.0, reduction=MEAN, *, out_shape, **kw) -> Cost:
    # margin - x clamped (2), two masks (ne) and selects (where) (4), their sum (1)
    n = numel(x)
    return Cost(7 * n + reduced(n, reduction))


@register_formula(aten.poisson_nll_loss)
def poisson_nll_loss(x, target, log_input=True, full=False, eps=1e-8, reduction=MEAN, *,
                     out_shape, **kw) -> Cost:
    # log input: exp(x) - target * x (3); else x - target * log(x + eps) (4); full adds the
    # Stirling term where target > 1: t log t - t + 0.5 log(2 pi t), masked (8)
    n = numel(x)
    per = (3 if log_input else 4) + (8 if full else 0)
    return Cost(per * n + reduced(n, reduction))


@register_formula(aten.cosine_embedding_loss)
def cosine_embedding_loss(x1, x2, target, margin=0.0, reduction=MEAN, *, out_shape,
                          **kw) -> Cost:
    # three row dot products (multiply + sum: 6 per element), then per row: two eps adds, a
    # multiply, a sqrt, a divide, 1 - cos (2), cos - margin clamped (2), two masks and selects
    # (4), their sum (1)
    n = numel(x1)
    rows = numel(target)
    return Cost(6 * n + 13 * rows + reduced(rows, reduction))


@register_formula(aten.triplet_margin_loss)
def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0, eps=1e-6, swap=False,
                        reduction=MEAN, *, out_shape, **kw) -> Cost:
    # each distance: subtract, add eps (2 per element), a p-norm over the last dim; then per
    # row: + margin, subtract, clamp (3); swap adds a third distance and a minimum
    n = numel(anchor)
    rows = n // anchor[-1] if len(anchor) else 1
    key = "norm_2" if p == 2 else ("norm_1" if p == 1 else "norm_p")
    distance = n * (2 + ELEMENT_COSTS[key]) + rows * (p != 1)
    distances = 3 if swap else 2
    return Cost(distances * distance + rows * (3 + swap) + reduced(rows, reduction))


# ---- CTC (aten/src/ATen/native/LossCTC.cpp, the CPU kernels; wav2vec2's training loss) ----
# One cell of the alpha (or beta) recursion: log(exp(a - m) + exp(b - m) + exp(c - m)) + m
# + log_prob, with m the largest of the (up to) three: 3 comparisons (two for the max, one
# for m = -inf), 3 subtracts, 3 exps, 2 adds, a log, 2 adds
CTC_CELL = 14
# the loss of a sequence: the log-add-exp of the last two cells (a max, a test for -inf, 2
# subtracts, 2 exps, an add, a log, an add) and its negation
CTC_LOSS = 10
# backward, per (time, extended label): alpha + beta (1) log-added into that label's
# gradient (a test for the first, then 8 as above)
CTC_GRADIENT_CELL = 10
# backward, per (time, class): (exp(lp) - exp(res + nll - lp)) * grad_out
CTC_GRADIENT_CLASS = 6


def _ctc_lengths(input_lengths, target_lengths, alpha, int_values, at: int):
    """Each sequence's (frames, labels): the lengths given as ints, read from small CPU
    tensors (``int_values``), else the padded sizes (a bound: ``log_alpha`` is
    [batch, frames, 2 * labels + 1])."""
    batch, frames, extended = alpha if len(alpha) == 3 else (1, *alpha)

    def values(given, position):
        if isinstance(given, (list, tuple)) and not isinstance(given, torch.Size):
            return list(given)
        read = int_values[position] if int_values and position < len(int_values) else None
        return list(read) if read is not None else None

    inputs, targets = values(input_lengths, at), values(target_lengths, at + 1)
    if inputs is None or len(inputs) != batch:
        inputs = [frames] * batch
    if targets is None or len(targets) != batch:
        targets = [(extended - 1) // 2] * batch
    return list(zip(inputs, targets)), batch


@register_formula(aten._ctc_loss)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, *args, out_shape,
             int_values=None, **kw) -> Cost:
    # log_probs: [T, N, C]; a sequence of t frames and l labels runs t - 1 steps of the
    # recursion over its 2l + 1 extended labels (blanks between and around the labels)
    lengths, batch = _ctc_lengths(input_lengths, target_lengths, out_shape[1], int_values, 2)
    cells = sum(max(t - 1, 0) * (2 * l + 1) for t, l in lengths)
    return Cost(cells * CTC_CELL + batch * CTC_LOSS)


@register_formula(aten._ctc_loss_backward)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, *args,
                      out_shape, int_values=None, **kw) -> Cost:
    # the beta recursion (as alpha's), then each (frame, extended label) log-added into its
    # class's gradient, then each (frame, class) of the gradient
    alpha = args[1]  # after the lengths: neg_log_likelihood, log_alpha, blank, zero_infinity
    lengths, batch = _ctc_lengths(input_lengths, target_lengths, alpha, int_values, 3)
    classes = log_probs[-1]
    flops = sum(max(t - 1, 0) * (2 * l + 1) * CTC_CELL + t * (2 * l + 1) * CTC_GRADIENT_CELL
                + t * classes * CTC_GRADIENT_CLASS for t, l in lengths)
    return Cost(flops + batch)  # + the zero_infinity test per sequence
