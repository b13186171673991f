"""Fused optimizer steps: ``_fused_adam_``, ``_fused_adamw_``, ``_fused_sgd_``, ``_fused_adagrad_``.

Priced per parameter element as the foreach/loop code spells the same step (the per-element
derivations are next to ``adam_step`` and ``sgd_step`` in ``costs.py``), so the three
implementations of one optimizer count the same. The ``_foreach_*`` ops the non-fused paths
use are ordinary pointwise ops (``pointwise.py``). The step counter's increment is a separate
``_foreach_add_`` in every path, so it is not part of these.
"""

from __future__ import annotations

from ._registry import Cost, namespace, register_formula
from ._shapes import list_numel
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met


def adam_cost(params, *, weight_decay, amsgrad, maximize, grad_scale, decoupled: bool) -> Cost:
    per = ELEMENT_COSTS["adam_step"]
    if weight_decay != 0:
        per += 1 if decoupled else 2  # param *= 1 - lr * wd, or grad += wd * param
    per += bool(amsgrad) + bool(maximize) + (grad_scale is not None)
    return Cost(list_numel(params) * per)


@register_formula(aten._fused_adam_)
def fused_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, out_shape,
               weight_decay, amsgrad, maximize, grad_scale=None, **kw) -> Cost:
    return adam_cost(params, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                     grad_scale=grad_scale, decoupled=False)


@register_formula(aten._fused_adamw_)
def fused_adamw(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, out_shape,
                weight_decay, amsgrad, maximize, grad_scale=None, **kw) -> Cost:
    return adam_cost(params, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                     grad_scale=grad_scale, decoupled=True)


@register_formula(aten._fused_sgd_)
def fused_sgd(params, grads, momentum_buffers, *, out_shape, weight_decay, momentum, dampening,
              nesterov, maximize, is_first_step, grad_scale=None, **kw) -> Cost:
    per = ELEMENT_COSTS["sgd_step"]  # param += -lr * grad
    if weight_decay != 0:
        per += 2  # grad + wd * param
    if momentum != 0:
        if not is_first_step:  # the first step copies the gradient into the buffer
            per += 2 + (dampening != 0)  # buf * momentum + (1 - dampening) * grad
        if nesterov:
            per += 2  # grad + momentum * buf
    per += bool(maximize) + (grad_scale is not None)
    return Cost(list_numel(params) * per)


@register_formula(aten._fused_adagrad_)
def fused_adagrad(params, grads, state_sums, state_steps, *, out_shape, weight_decay,
                  maximize, grad_scale=None, **kw) -> Cost:
    # state_sum.addcmul_(g, g) (2), std = sqrt + eps (2), param.addcdiv_(g, std, -clr) (3)
    per = 7 + (2 if weight_decay != 0 else 0) + bool(maximize) + (grad_scale is not None)
    return Cost(list_numel(params) * per)
