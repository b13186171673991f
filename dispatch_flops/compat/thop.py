"""thop's ``profile`` and ``clever_format`` (``pip install thop`` 0.1.1 and ultralytics-thop
2.x), counted by this package's engine, so a script switches by changing the import:

>>> from dispatch_flops.compat.thop import profile, clever_format
>>> macs, params = profile(model, inputs=(x,))
>>> clever_format([macs, params], "%.3f")
('4.134G', '25.557M')

thop's unit is kept: ``profile`` returns MACs (which papers often print as "FLOPs"), as
floats. Contractions (convolutions, linear layers, matrix products, attention) are this
package's MACs, found in every op the model runs, where thop sees only the module types it has
a rule for (a ``torch.matmul`` in a ``forward``, ``F.scaled_dot_product_attention`` or an
einsum are 0 there). Other ops are priced as thop prices their modules: a norm is 2 an element,
4 with an affine; softmax 3 an element less one a row; average pooling an add per input and a
divide per output; upsampling by mode (nearest 0, linear 5, bilinear 11, bicubic 259,
trilinear 31 an output); PReLU 1 an element; activations, max pooling, dropout and
embeddings 0.

Where the two thop distributions differ this follows ultralytics-thop 2.x (parameters are
every parameter of the model; transposed convolutions count their input positions;
``clever_format`` rounds 1000**k into the larger unit), except for ``custom_ops``: a rule
replaces what is counted inside its module, but a rule on the model's own class adds to its
children's counts (thop 0.1.1's behaviour; 2.x adds the children's counts to every rule's).
docs/migrating.md lists the differences.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Optional

import torch
from torch import nn

from dispatch_flops.compat._conventions import (
    ModuleRules,
    PeerRegistry,
    numel,
    parameters_of,
    run_forward,
)

aten = torch.ops.aten


def _norm(weight_index: int):
    """thop's norm: 2 an element, 4 with an affine (the weight argument given)."""

    def norm(x, *args, out_shape, **kwargs) -> int:
        rest = list(args) + [None] * weight_index
        weight = kwargs.get("weight", rest[weight_index - 1])
        return numel(x) * (4 if weight is not None else 2)

    return norm


def _softmax(x, dim, *args, out_shape, **kwargs) -> int:
    # thop: exp, add and divide per feature, one add fewer a row
    features = x[dim] if len(x) else 1
    rows = numel(x) // features if features else 0
    return rows * (3 * features - 1)


def _log_softmax(x, dim, *args, out_shape, **kwargs) -> int:
    features = x[dim] if len(x) else 1
    return _softmax(x, dim, out_shape=out_shape) + (numel(x) // features if features else 0)


def _window_sum(size: int, outputs: int, kernel: int, stride: int, padding: int,
                include_pad: bool) -> int:
    """Inputs summed over ``outputs`` windows along one dimension (padding counted as
    inputs when ``include_pad``)."""
    lower, upper = (-padding, size + padding) if include_pad else (0, size)
    return sum(max(min(i * stride - padding + kernel, upper) - max(i * stride - padding, lower), 0)
               for i in range(outputs))


def _avg_pool(dims: int):
    def avg_pool(x, kernel_size, stride=(), padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None, *, out_shape) -> int:
        def per_dim(value):
            value = list(value) if isinstance(value, (list, tuple)) else [value]
            return value * dims if len(value) == 1 else value

        kernel = per_dim(kernel_size)
        strides = per_dim(stride) if stride else kernel
        pads = per_dim(padding)
        windows = 1
        for size, outputs, k, s, p in zip(x[-dims:], out_shape[-dims:], kernel, strides, pads):
            windows *= _window_sum(size, outputs, k, s, p, count_include_pad)
        # one add per pooled input, one divide per output
        return math.prod(x[:-dims]) * windows + numel(out_shape)

    return avg_pool


def _adaptive_avg_pool(x, output_size, *, out_shape) -> int:
    windows = 1
    for size, outputs in zip(x, out_shape):
        windows *= outputs if size == outputs else sum(
            -(-(j + 1) * size // outputs) - j * size // outputs for j in range(outputs))
    return windows + numel(out_shape)


def _upsample(per_output: int):
    def upsample(*args, out_shape, **kwargs) -> int:
        return per_output * numel(out_shape)

    return upsample


def _prelu(x, *args, out_shape, **kwargs) -> int:
    return numel(x)


_UPSAMPLE = {"upsample_nearest1d": 0, "upsample_nearest2d": 0, "upsample_nearest3d": 0,
             "_upsample_nearest_exact1d": 0, "_upsample_nearest_exact2d": 0,
             "_upsample_nearest_exact3d": 0, "upsample_linear1d": 5, "upsample_bilinear2d": 11,
             "upsample_bicubic2d": 259, "upsample_trilinear3d": 31}


def conventions() -> PeerRegistry:
    """thop's figures for the ops it prices by convention (composites, as under
    ``inference_mode``)."""
    registry = PeerRegistry()
    registry.figure([aten.batch_norm, aten.instance_norm], _norm(1))
    registry.figure([aten.layer_norm, aten.group_norm], _norm(2))
    if hasattr(aten, "rms_norm"):
        registry.figure(aten.rms_norm, _norm(2))
    registry.figure(aten.softmax, _softmax)
    registry.figure(aten.log_softmax, _log_softmax)
    registry.figure(aten.avg_pool1d, _avg_pool(1))
    registry.figure(aten.avg_pool2d, _avg_pool(2))
    registry.figure(aten.avg_pool3d, _avg_pool(3))
    registry.figure([aten.adaptive_avg_pool1d, aten.adaptive_avg_pool2d,
                     aten.adaptive_avg_pool3d], _adaptive_avg_pool)
    for name, per_output in _UPSAMPLE.items():
        if hasattr(aten, name):
            registry.figure(getattr(aten, name), _upsample(per_output))
    registry.figure(aten.prelu, _prelu)
    return registry


_CONVENTIONS = functools.lru_cache(maxsize=1)(conventions)  # one registry, every call


def _call(model: nn.Module, inputs) -> None:
    if isinstance(inputs, dict):
        model(**inputs)
    else:
        model(*inputs)


def profile(model: nn.Module, inputs, custom_ops: Optional[dict] = None, verbose: bool = True,
            ret_layer_info: bool = False, report_missing: bool = False):
    """thop's ``profile``: ``(macs, params)`` floats of ``model(*inputs)`` in eval mode
    without grad (``(macs, params, layers)`` with ``ret_layer_info``, ``layers`` as thop's:
    ``{child: (macs, params, {grandchild: ...})}``).

    >>> macs, params = profile(model, inputs=(torch.randn(1, 3, 224, 224),))

    ``custom_ops={ModuleClass: rule}`` takes thop's rules, ``rule(module, inputs, output)``
    adding to ``module.total_ops``; a rule's figure replaces the count inside its module
    (a rule on the model's own class adds to its children's, as thop 0.1.1's).
    ``report_missing`` prints the ops the engine could not price. The model's train flags
    and hooks are restored.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(inputs, (tuple, list, dict)):
        raise TypeError(f"inputs must be a tuple of the model's arguments, e.g. (x,), got "
                        f"{type(inputs).__name__}")
    rules = ModuleRules(model, dict(custom_ops or {}), "total_ops",
                        start=lambda: torch.zeros(1, dtype=torch.float64), root_adds=True)
    if verbose:
        for kind in sorted({type(m) for m in model.modules() if rules.rule_of(m)}, key=str):
            rule = rules.rule_of(next(m for m in model.modules() if type(m) is kind))
            print(f"[INFO] Customize rule {getattr(rule, '__qualname__', rule)}() {kind}.")
    counter = run_forward(model, lambda: _call(model, inputs), _CONVENTIONS(), inputs=inputs,
                          rules=rules)
    if report_missing:
        for op in counter.unsupported_ops():
            print(f"[WARN] Cannot find rule for {op}. Treat it as zero Macs.")
    macs = rules.figure(counter)
    params = float(parameters_of(model))
    if not ret_layer_info:
        return macs, params
    return macs, params, _layers(model, "", counter, rules)


def _layers(module: nn.Module, name: str, counter, rules: ModuleRules) -> dict:
    layers = {}
    for child_name, child in module.named_children():
        full = name + ("." if name else "") + child_name
        layers[child_name] = (rules.figure(counter, full), float(parameters_of(child)),
                              _layers(child, full, counter, rules))
    return layers


def clever_format(nums, format: str = "%.2f"):
    """thop's number style: ``format`` of T, G, M or K (at 1000**k and above), else "B"
    (one string, or a tuple for several numbers)."""
    values = list(nums) if isinstance(nums, Iterable) else [nums]
    formatted = []
    for num in values:
        for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
            if abs(num) >= scale:
                formatted.append(format % (num / scale) + unit)
                break
        else:
            formatted.append(format % num + "B")
    return formatted[0] if len(formatted) == 1 else tuple(formatted)


__all__ = ["clever_format", "profile"]
