"""Random sampling and dropout.

Drawing random bits is the generator's integer work, priced by ``ELEMENT_COSTS["random_draw"]``
(0 by default: we count the arithmetic done with the draws). ``bernoulli`` compares each draw
with p; dropout compares, masks and rescales. Dropout's work is hardware work, not the
model's: a model has the same model flops in ``train()`` and ``eval()`` (docs/conventions.md,
"Hardware and model flops"), so every dropout formula returns its flops as ``masked_flops``
too, the hardware-only share (the CPU's decomposition, ``bernoulli_`` and the products with
its noise, is recognised by the engine: ``engine.masks.dropout``).
"""

from __future__ import annotations

from ._registry import Cost, namespace, register_formula
from ._shapes import first_numel, numel
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met


def _ops(names: str) -> list:
    return aten.present(names.split())


def hardware_only(flops: int) -> Cost:
    """Dropout's flops, all of them outside model flops."""
    return Cost(flops, masked_flops=flops)


@register_formula(_ops("""
    rand randn randint randperm rand_like randn_like randint_like normal normal_ uniform_
    exponential_ geometric_ cauchy_ log_normal_ random_ multinomial poisson _standard_gamma
    _sample_dirichlet binomial
"""))
def random_draw(*args, out_shape, **kw) -> Cost:
    return Cost(first_numel(out_shape) * ELEMENT_COSTS["random_draw"])


@register_formula(_ops("bernoulli bernoulli_"))
def bernoulli(x, *args, out_shape, **kw) -> Cost:
    per_element = ELEMENT_COSTS["random_draw"] + ELEMENT_COSTS["bernoulli"]
    return Cost(first_numel(out_shape) * per_element)


@register_formula(aten.native_dropout)
def native_dropout(x, p, train, *, out_shape, **kw) -> Cost:
    # train=False (or None in eval) returns the input and an all-true mask
    per_element = ELEMENT_COSTS["random_draw"] + ELEMENT_COSTS["dropout"]
    return hardware_only(numel(x) * per_element if train else 0)


@register_formula(_ops("native_dropout_backward _masked_scale"))
def dropout_backward(grad_out, mask, scale, *, out_shape, **kw) -> Cost:
    return hardware_only(numel(grad_out) * ELEMENT_COSTS["dropout_backward"])


@register_formula(_ops("_fused_dropout"))
def fused_dropout(x, p, *args, out_shape, **kw) -> Cost:
    return hardware_only(numel(x) * (ELEMENT_COSTS["random_draw"] + ELEMENT_COSTS["dropout"]))


# composite entry points (inference_mode); priced as their decomposition: bernoulli_ on a
# noise tensor, scale it, multiply the input by it


def _noise_elements(x, feature: bool) -> int:
    # feature dropouts draw one value per (batch, channel) and broadcast it
    return (x[0] * x[1] if len(x) > 1 else 1) if feature else numel(x)


def scaled_dropout(feature: bool):
    def formula(x, p, train, *, out_shape, **kw) -> Cost:
        # the noise: bernoulli, divided by 1 - p; then the input times the noise
        if not (train and p > 0):
            return Cost(0)
        per_noise = (ELEMENT_COSTS["random_draw"] + ELEMENT_COSTS["bernoulli"]
                     + ELEMENT_COSTS["div"])
        return hardware_only(_noise_elements(x, feature) * per_noise
                             + numel(x) * ELEMENT_COSTS["mul"])

    return formula


def alpha_dropout(feature: bool):
    def formula(x, p, train, *, out_shape, **kw) -> Cost:
        # the noise: bernoulli, then - 1, * a, + b, * alpha' (4); then x * noise + the affine
        # term (2)
        if not (train and p > 0):
            return Cost(0)
        per_noise = ELEMENT_COSTS["random_draw"] + ELEMENT_COSTS["bernoulli"] + 4
        return hardware_only(_noise_elements(x, feature) * per_noise + 2 * numel(x))

    return formula


register_formula(_ops("feature_dropout feature_dropout_"))(scaled_dropout(feature=True))
register_formula(_ops("alpha_dropout alpha_dropout_"))(alpha_dropout(feature=False))
register_formula(_ops("feature_alpha_dropout feature_alpha_dropout_"))(alpha_dropout(feature=True))
register_formula(_ops("dropout dropout_"))(scaled_dropout(feature=False))
