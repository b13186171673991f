"""Pointwise ops: unary, binary and ternary, with broadcasting, in-place, out= and _foreach_.

Cost = ``ELEMENT_COSTS[key]`` flops per element of the (broadcast) output, read from the table
at call time; never MACs. One factory call per op registers the op, its in-place twin (``add``
→ ``add_``) and its ``_foreach_`` twins (``_foreach_add``, ``_foreach_add_``), which price
every tensor of their list alike. Complex operands count real flops: ``complex_<key>`` from
the table where the complex cost is not simply twice the real one.
"""

from __future__ import annotations

from math import prod

import torch

from ._registry import Cost, namespace, register_formula
from ._shapes import first_numel, is_complex, list_numel, numel
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met


def unit_cost(key: str, dtypes) -> int:
    """Flops per element for ``key``, in real flops when an operand is complex."""
    if dtypes is not None and is_complex(dtypes):
        cost = ELEMENT_COSTS.get("complex_" + key)
        return cost if cost is not None else ELEMENT_COSTS["complex_factor"] * ELEMENT_COSTS[key]
    return ELEMENT_COSTS[key]


def _not_one(value) -> bool:
    # a scale of exactly 1 is skipped by the kernels; a list or tensor of scales is applied
    return not (isinstance(value, (int, float)) and value == 1)


def _elements(args, out_shape) -> int:
    if out_shape.__class__ is torch.Size:  # the common case: one output tensor
        return prod(out_shape)
    for a in args:  # a _foreach_ op: every tensor of its first list is an output
        if isinstance(a, list):
            return list_numel(a)
    return first_numel(out_shape)  # ops returning a tuple (log_sigmoid_forward): the first


def per_element(key: str, *, scale: tuple | None = None, variant: tuple | None = None):
    """A formula: ``ELEMENT_COSTS[key]`` per output element.

    ``scale=(name, position)``: one more flop per element when that argument (a kwarg, or the
    positional argument at ``position``) is given and is not 1 (``add``'s ``alpha``).
    ``variant=(name, value, other_key)``: ``other_key`` instead when that kwarg equals value
    (``gelu``'s ``approximate="tanh"``)."""

    def formula(*args, out_shape, dtypes=None, **kwargs) -> Cost:
        cost_key = key
        if variant is not None and kwargs.get(variant[0]) == variant[1]:
            cost_key = variant[2]
        per = unit_cost(cost_key, dtypes)
        if scale is not None:
            name, position = scale
            value = kwargs.get(name, args[position] if len(args) > position else 1)
            per += _not_one(value)
        return Cost(_elements(args, out_shape) * per)

    formula.__name__ = f"per_element_{key}"
    return formula


def _twins(name: str) -> list:
    names = (name, name + "_", "_foreach_" + name, "_foreach_" + name + "_")
    return aten.present(names)


def pointwise(name: str, key: str | None = None, **options) -> None:
    """Register ``aten.<name>`` and its in-place and ``_foreach_`` twins at one cost."""
    register_formula(_twins(name))(per_element(key or name, **options))


# ---- unary ------------------------------------------------------------------------------------
for _name in """
    abs neg reciprocal square sign sgn floor ceil round trunc frac exp exp2 expm1 log log2 log10
    log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh erf erfc erfinv
    lgamma digamma i0 sinc logit isnan isinf isfinite isposinf isneginf signbit logical_not
    bitwise_not relu relu6 hardtanh hardsigmoid hardswish hardshrink softshrink silu mish selu
    celu elu softplus sigmoid leaky_relu threshold nan_to_num deg2rad rad2deg
""".split():
    pointwise(_name)

# ---- binary (broadcasting) --------------------------------------------------------------------
for _name in """
    mul eq ne lt le gt ge maximum minimum fmax fmin fmod remainder copysign heaviside ldexp
    hypot nextafter atan2 pow float_power logical_and logical_or logical_xor bitwise_and
    bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift __lshift__ __rshift__
    __and__ __or__ __xor__ gcd lcm floor_divide xlogy logaddexp logaddexp2 masked_fill where
""".split():
    pointwise(_name)
for _name in ("add", "sub", "rsub"):
    pointwise(_name, scale=("alpha", 2))
pointwise("true_divide", "div")
pointwise("clamp_min", "clamp_bound")
pointwise("clamp_max", "clamp_bound")

# ---- ternary ----------------------------------------------------------------------------------
pointwise("addcmul", scale=("value", 3))
pointwise("addcdiv", scale=("value", 3))
pointwise("lerp")

# ---- backward of activations (same shape as the gradient) -------------------------------------
for _name in """
    threshold_backward hardtanh_backward leaky_relu_backward sigmoid_backward tanh_backward
    silu_backward elu_backward softplus_backward mish_backward hardswish_backward
    hardsigmoid_backward logit_backward log_sigmoid_backward
""".split():
    pointwise(_name)
pointwise("gelu", variant=("approximate", "tanh", "gelu_tanh"))
pointwise("gelu_backward", variant=("approximate", "tanh", "gelu_tanh_backward"))
register_formula(aten.log_sigmoid_forward)(per_element("log_sigmoid"))
register_formula(aten._prelu_kernel)(per_element("prelu"))
register_formula(aten._prelu_kernel_backward)(per_element("prelu_backward"))
# glu halves its input: priced per output element; its backward per grad_output element
register_formula(aten.glu)(per_element("glu"))


@register_formula(aten.glu_backward)
def glu_backward(grad_out, x, dim, *, out_shape, **kw) -> Cost:
    return Cost(numel(grad_out) * ELEMENT_COSTS["glu_backward"])


# ---- ops whose cost depends on their arguments -------------------------------------------------


@register_formula(_twins("div"))
def div(*args, out_shape, dtypes=None, **kwargs) -> Cost:
    # a rounding mode ("floor", "trunc") rounds once more
    per = unit_cost("div", dtypes) + (kwargs.get("rounding_mode") is not None)
    return Cost(_elements(args, out_shape) * per)


@register_formula(_twins("clamp") + _twins("clip"))
def clamp(x, min=None, max=None, *, out_shape, **kwargs) -> Cost:
    # one comparison per bound given
    bounds = (min is not None) + (max is not None)
    return Cost(_elements([x], out_shape) * bounds * ELEMENT_COSTS["clamp_bound"])


@register_formula(_twins("conj_physical"))
def conj_physical(x, *, out_shape, dtypes=None, **kwargs) -> Cost:
    # negates the imaginary part of a complex tensor; a copy for a real one
    return Cost(_elements([x], out_shape) if dtypes is not None and is_complex(dtypes) else 0)


@register_formula(aten.angle)
def angle(x, *, out_shape, dtypes=None, **kwargs) -> Cost:
    # atan2(imag, real) for complex; a sign test (0 or pi) for real
    return Cost(_elements([x], out_shape))


# max/min with a second tensor are the binary maximum/minimum; the packets are reductions
register_formula([aten.max.other, aten.max.out, aten.min.other, aten.min.out], override=True)(
    per_element("maximum"))


@register_formula(aten._amp_foreach_non_finite_check_and_unscale_)
def amp_unscale(grads, found_inf, inv_scale, *, out_shape, **kwargs) -> Cost:
    # per gradient element: a finiteness test (1) and the unscaling multiply (1)
    return Cost(2 * list_numel(grads))


@register_formula(aten._amp_update_scale_)
def amp_update_scale(*args, out_shape, **kwargs) -> Cost:
    # a handful of scalar operations: compare, select, multiply, increment
    return Cost(4)


# ---- composites (inference_mode), priced as their decomposition -------------------------------
register_formula(aten.log_sigmoid)(per_element("log_sigmoid"))  # -> log_sigmoid_forward


@register_formula(aten.outer)
def outer(a, b, *, out_shape, **kwargs) -> Cost:
    # a.view(-1, 1) * b: one multiply per output element
    return Cost(numel(out_shape) * ELEMENT_COSTS["mul"])


@register_formula(aten.diff)
def diff(x, n=1, dim=-1, prepend=None, append=None, *, out_shape, **kwargs) -> Cost:
    # n rounds of subtracting neighbours, each one element shorter along dim
    length = x[dim] if len(x) else 1
    length += (prepend[dim] if prepend is not None and len(prepend) else 0)
    length += (append[dim] if append is not None and len(append) else 0)
    others = numel(x) // x[dim] if len(x) and x[dim] else 0
    return Cost(sum(others * max(length - k, 0) for k in range(1, n + 1)) * ELEMENT_COSTS["sub"])


@register_formula(aten.cosine_similarity)
def cosine_similarity(x1, x2, dim=1, eps=1e-8, *, out_shape, **kwargs) -> Cost:
    # two norms (square + accumulate per element, sqrt per row), clamped (per row), each input
    # divided by its norm, multiplied and summed over dim
    n = numel(torch.broadcast_shapes(x1, x2))
    rows = numel(out_shape)
    return Cost(n * (2 * ELEMENT_COSTS["norm_2"] + 2 * ELEMENT_COSTS["div"] + ELEMENT_COSTS["mul"]
                     + ELEMENT_COSTS["reduce"]) + 4 * rows)
