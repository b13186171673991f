"""ptflops' ``get_model_complexity_info`` (flops-counter.pytorch 0.7), counted by this
package's engine, so a script switches by changing the import:

>>> from dispatch_flops.compat.ptflops import get_model_complexity_info
>>> macs, params = get_model_complexity_info(model, (3, 224, 224), print_per_layer_stat=False)
('4.12 GMac', '25.56 M')

ptflops' unit is kept: MACs of one sample ("GMac"), counted as its default (``"pytorch"``)
backend counts: contractions with their bias adds (a convolution or linear layer with a bias
adds one per output), one per element for activations (ReLU, ELU, LeakyReLU, ReLU6, PReLU,
GELU, SiLU), softmax, pooling (per input element) and upsampling (per output element), norms
one an element (two with an affine; layer norms one), and nothing for other elementwise ops.
Contractions are this package's MACs, found in every op the model runs, where ptflops sees its
module types and the functionals it patches (attention kernels and einsums are 0 there).
``backend="aten"`` counts as ptflops' aten backend: the decomposed ops, matrix products and
convolutions with their bias, where ``ignore_modules`` and ``custom_modules_hooks`` take aten
op packets. docs/migrating.md lists the differences.
"""

from __future__ import annotations

import functools
import math
import sys
import traceback
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, TextIO, Tuple, Union

import torch
from torch import nn

from dispatch_flops.compat._conventions import (
    ModuleRules,
    PeerRegistry,
    annotated_repr,
    numel,
    run_forward,
)

aten = torch.ops.aten


class FLOPS_BACKEND(Enum):  # noqa: N801 (ptflops' name)
    PYTORCH = "pytorch"
    ATEN = "aten"


def _convolution(x, weight, bias, stride, padding, dilation, transposed, *args, out_shape) -> int:
    # weight [c_out, c_in / g, *k] (transposed: [c_in, c_out / g, *k]): every output element
    # (transposed: input element) takes weight[1] x k MACs; a bias adds one per output
    per_position = weight[1] * math.prod(weight[2:])
    positions = numel(x) if transposed else numel(out_shape)
    return positions * per_position + (numel(out_shape) if bias is not None else 0)


def _conv(x, weight, bias=None, *args, out_shape, **kwargs) -> int:
    return _convolution(x, weight, bias, None, None, None, False, out_shape=out_shape)


def _conv_transpose(x, weight, bias=None, *args, out_shape, **kwargs) -> int:
    return _convolution(x, weight, bias, None, None, None, True, out_shape=out_shape)


def _linear(x, weight, bias=None, *, out_shape) -> int:
    return numel(x) * weight[0] + (numel(out_shape) if bias is not None else 0)


def _addmm(bias, a, b, *args, out_shape, beta=1, **kwargs) -> int:
    beta = args[0] if args else beta
    return numel(a) * b[-1] + (numel(bias) if beta != 0 else 0)


def _aten_addmm(bias, a, b, *args, out_shape, **kwargs) -> int:
    # ptflops' aten backend: a bias add per output element, whatever beta (the pytorch
    # backend's ``torch.addmm`` hook adds the bias tensor's elements when beta != 0)
    return numel(a) * b[-1] + numel(out_shape)


def _output_elements(*args, out_shape, **kwargs) -> int:
    return numel(out_shape[0] if isinstance(out_shape, tuple) and not isinstance(
        out_shape, torch.Size) else out_shape)


def _input_elements(x, *args, out_shape, **kwargs) -> int:
    return numel(x)


def _norm(weight_index: Optional[int]):
    """One an element, two with an affine (``weight_index``: where the weight is; None: one
    whatever the affine, ptflops' layer norm)."""

    def norm(x, *args, out_shape, **kwargs) -> int:
        if weight_index is None:
            return numel(x)
        rest = list(args) + [None] * weight_index
        weight = kwargs.get("weight", rest[weight_index - 1])
        return numel(x) * (2 if weight is not None else 1)

    return norm


def _ops(names) -> list:
    return [getattr(aten, n) for n in names if hasattr(aten, n)]


_ACTIVATIONS = ("relu", "relu_", "prelu", "elu", "elu_", "leaky_relu", "leaky_relu_", "relu6",
                "hardtanh", "hardtanh_", "gelu", "silu", "silu_", "softmax")
_POOLS = ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
          "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
          "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d")
_UPSAMPLES = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
              "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
              "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
              "upsample_bicubic2d", "upsample_trilinear3d")


def _pytorch_conventions() -> PeerRegistry:
    """ptflops' pytorch-backend figures, on composites (as under ``inference_mode``)."""
    registry = PeerRegistry()
    registry.figure(_ops(("conv1d", "conv2d", "conv3d")), _conv)
    registry.figure(_ops(("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")),
                    _conv_transpose)
    registry.figure(_ops(("convolution", "_convolution")), _convolution)
    registry.figure(aten.linear, _linear)
    registry.figure(_ops(("addmm", "baddbmm")), _addmm)
    registry.figure(_ops(_ACTIVATIONS) + _ops(_UPSAMPLES), _output_elements)
    registry.figure(_ops(_POOLS), _input_elements)
    registry.figure(_ops(("batch_norm", "instance_norm")), _norm(1))
    registry.figure(aten.group_norm, _norm(2))
    registry.figure(aten.layer_norm, _norm(None))
    return registry


_PYTORCH_CONVENTIONS = functools.lru_cache(maxsize=1)(_pytorch_conventions)


def _aten_conventions(ignored: list, hooks: dict) -> PeerRegistry:
    """ptflops' aten-backend figures: products and convolutions with their bias; ``ignored``
    packets count 0, ``hooks`` (packet -> hook(inputs, outputs)) are called on meta
    stand-ins of the call's tensors."""
    registry = PeerRegistry()
    registry.figure(_ops(("convolution", "_convolution")), _convolution)
    registry.figure(aten.addmm, _aten_addmm)
    for packet, hook in hooks.items():
        registry.figure(_packet(packet, "custom_modules_hooks"), _hooked(hook))
    for packet in ignored:
        registry.figure(_packet(packet, "ignore_modules"), lambda *a, out_shape, **k: 0)
    return registry


def _packet(op, where: str):
    if not isinstance(op, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        raise TypeError(f"{where} of the aten backend take aten ops (torch.ops.aten.mm), got "
                        f"{op!r}")
    return op


def _meta(value: Any) -> Any:
    if isinstance(value, torch.Size):
        return torch.empty(value, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v) for v in value)
    return value


def _hooked(hook: Callable):
    def custom(*args, out_shape, **kwargs) -> float:
        outputs = out_shape if isinstance(out_shape, tuple) and not isinstance(
            out_shape, torch.Size) else (out_shape,)
        return float(hook(list(_meta(list(args))), list(_meta(list(outputs)))))

    return custom


_MODULE_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                 nn.ConvTranspose3d, nn.ReLU, nn.PReLU, nn.ELU, nn.LeakyReLU, nn.ReLU6, nn.GELU,
                 nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d,
                 nn.AvgPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
                 nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
                 nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.InstanceNorm1d,
                 nn.InstanceNorm2d, nn.InstanceNorm3d, nn.GroupNorm, nn.LayerNorm, nn.Linear,
                 nn.Upsample, nn.RNN, nn.GRU, nn.LSTM, nn.RNNCell, nn.LSTMCell, nn.GRUCell,
                 nn.MultiheadAttention)


def flops_to_string(flops: float, units: Optional[str] = None, precision: int = 2) -> str:
    """ptflops' MACs string: ``'4.12 GMac'`` (``units``: GMac, MMac, KMac, else Mac)."""
    scales = {"GMac": 1e9, "MMac": 1e6, "KMac": 1e3}
    if units is None:
        for unit, scale in scales.items():
            if flops // scale > 0:
                return f"{round(flops / scale, precision)} {unit}"
        return f"{flops} Mac"
    if units in scales:
        return f"{round(flops / scales[units], precision)} {units}"
    return f"{flops} Mac"


def params_to_string(params_num: float, units: Optional[str] = None, precision: int = 2) -> str:
    """ptflops' parameters string: ``'25.56 M'``, ``'1.2 k'``, or the number."""
    if units is None:
        if params_num // 1e6 > 0:
            return f"{round(params_num / 1e6, precision)} M"
        if params_num // 1e3 > 0:
            return f"{round(params_num / 1e3, precision)} k"
        return str(params_num)
    scales = {"M": 1e6, "K": 1e3, "B": 1e9}
    if units in scales:
        return f"{round(params_num / scales[units], precision)} {units}"
    return str(params_num)


def _batch_size(batch: Any) -> int:
    """ptflops' batch: the first positional input's length, 1 for keyword inputs."""
    if isinstance(batch, dict) or not hasattr(batch, "__len__") or len(batch) == 0:
        return 1
    return len(batch)


def get_model_complexity_info(
    model: nn.Module,
    input_res: Tuple[int, ...],
    print_per_layer_stat: bool = True,
    as_strings: bool = True,
    input_constructor: Optional[Callable[[Tuple], Any]] = None,
    ost: Optional[TextIO] = None,
    verbose: bool = False,
    ignore_modules: Optional[List[Any]] = None,
    custom_modules_hooks: Optional[Dict[Any, Any]] = None,
    backend: Union[str, FLOPS_BACKEND] = FLOPS_BACKEND.PYTORCH,
    flops_units: Optional[str] = None,
    param_units: Optional[str] = None,
    output_precision: int = 2,
    backend_specific_config: Optional[Dict] = None,
) -> Tuple[Union[str, int, None], Union[str, int, None]]:
    """ptflops' ``get_model_complexity_info``: MACs and parameters of ``model`` on one input
    of ``(1, *input_res)`` (or ``input_constructor(input_res)``: a tensor, or a dict of
    keyword arguments), per sample (``backend="aten"``: the call's, as ptflops'); strings
    (``'4.12 GMac'``, ``'25.56 M'``) with ``as_strings``, else ints; ``(None, None)`` when
    the model fails (the error printed).

    >>> macs, params = get_model_complexity_info(net, (3, 224, 224), as_strings=False,
    ...                                          print_per_layer_stat=False)

    ``ignore_modules`` (module classes; aten ops with ``backend="aten"``) count 0,
    ``ost`` is the stream of the per-layer printout (default: ``sys.stdout``),
    ``custom_modules_hooks`` take ptflops' hooks (``module.__flops__ += ...``; aten:
    ``hook(inputs, outputs)``), ``backend_specific_config={"count_functional": False}``
    counts only what runs inside ptflops' module types.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if type(input_res) is not tuple or not input_res:
        raise ValueError(f"input_res must be a non-empty tuple (the input's shape without the "
                         f"batch), got {input_res!r}")
    try:
        backend = FLOPS_BACKEND(backend)
    except ValueError:
        raise ValueError(f"backend must be one of {[b.value for b in FLOPS_BACKEND]}, got "
                         f"{backend!r}") from None
    ignore = list(ignore_modules or [])
    hooks = dict(custom_modules_hooks or {})
    config = dict(backend_specific_config or {})
    if input_constructor is not None:
        batch = input_constructor(input_res)
    else:
        parameter = next(model.parameters(), None)
        batch = torch.ones((1, *input_res), dtype=parameter.dtype if parameter is not None
                           else None, device=parameter.device if parameter is not None else None)

    def call() -> None:
        if isinstance(batch, dict):
            model(**batch)
        else:
            model(batch)

    try:
        if backend is FLOPS_BACKEND.ATEN:
            counter = run_forward(model, call, _aten_conventions(ignore, hooks), inputs=batch,
                                  inference=False)
            rules = None
            macs = float(sum(r.stats.macs for r in counter.records()))
        else:
            rules = ModuleRules(model, hooks, "__flops__")
            counter = run_forward(model, call, _PYTORCH_CONVENTIONS(), inputs=batch, rules=rules)
            macs = _pytorch_macs(model, counter, rules, tuple(ignore),
                                 bool(config.get("count_functional", True)))
    except Exception as error:  # ptflops' contract: report it, return (None, None)
        print(f"Flops estimation was not finished successfully because of the following "
              f"exception: \n{type(error)}: {error}")
        traceback.print_exc()
        return None, None
    # the pytorch backend's figure is per sample (its batch counter); the aten backend's is
    # the whole call's, as ptflops' ``get_flops_aten`` returns it
    samples = _batch_size(batch) if backend is FLOPS_BACKEND.PYTORCH else 1
    macs_per_sample = int(macs / samples)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if print_per_layer_stat:
        print(_model_text(model, counter, rules, macs_per_sample, params, samples, flops_units,
                          param_units, output_precision), file=ost or sys.stdout)
    if as_strings:
        return (flops_to_string(macs_per_sample, units=flops_units, precision=output_precision),
                params_to_string(params, units=param_units, precision=output_precision))
    return macs_per_sample, params


def _pytorch_macs(model: nn.Module, counter, rules: ModuleRules, ignored: tuple,
                  count_functional: bool, inside: str = "") -> float:
    """The pytorch backend's figure (of module ``inside``): records outside modules of the
    ``ignored`` classes, only those inside ptflops' module types unless ``count_functional``,
    plus the custom hooks' figures."""
    modules = dict(model.named_modules())
    counted = 0.0
    for record in counter.records():
        if inside not in record.stack or rules.covers(record.stack):
            continue
        owner = modules.get(record.module)
        if ignored and isinstance(owner, ignored):
            continue
        if not count_functional and not any(
                isinstance(modules.get(name), _MODULE_TYPES) for name in record.stack):
            continue
        counted += record.stats.macs
    return counted + rules.ruled(inside)


def _model_text(model, counter, rules, total: int, params: int, samples: int,
                flops_units, param_units, precision: int) -> str:
    """ptflops' per-layer printout: ``str(model)`` with each module's parameters, MACs and
    shares."""
    total = max(total, 1)
    params_total = max(params, 1)

    def module_macs(name: str) -> float:
        figure = (rules.figure(counter, name) if rules is not None else float(sum(
            r.stats.macs for r in counter.records() if name in r.stack)))
        return figure / samples

    def items(module: nn.Module, name: str) -> list:
        own = sum(p.numel() for p in module.parameters() if p.requires_grad)
        macs = module_macs(name)
        return [params_to_string(own, units=param_units, precision=precision),
                f"{own / params_total:.3%} Params",
                flops_to_string(macs, units=flops_units, precision=precision),
                f"{macs / total:.3%} MACs"]

    return annotated_repr(model, items)


__all__ = ["FLOPS_BACKEND", "flops_to_string", "get_model_complexity_info", "params_to_string"]
