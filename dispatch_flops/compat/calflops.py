"""calflops' ``calculate_flops`` (calculate-flops.pytorch), counted by this package's engine,
so a script switches by changing the import:

>>> from dispatch_flops.compat.calflops import calculate_flops
>>> flops, macs, params = calculate_flops(model, input_shape=(1, 3, 224, 224))
('8.18 GFLOPS', '4.09 GMACs', '25.56 M')

calflops' units are kept: FLOPs are 2 x MACs, MACs the multiply-accumulates of the
contractions (the figure DeepSpeed's profiler, which calflops derives from, reports; as in
this package's DeepSpeed drop-in), here of every contraction kernel the model runs (attention
products, einsums, grouped MoE matmuls included). With ``include_backPropagation=True`` the
backward of the outputs' sum is run and measured, not estimated as ``compute_bp_factor`` x
forward (the factor is accepted, unused). Parameters are the trainable ones ("Total Training
Params").
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from dispatch_flops.compat._conventions import annotated_repr, run_forward
from dispatch_flops.counter import FlopCounter

FORWARD_MODES = ("forward", "generate")
_SCALES = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "m": 1e-3, "u": 1e-6}


def number_to_string(num: float, units: Optional[str] = None, precision: int = 2) -> str:
    """calflops' number style: ``'4.09 G'`` (``units`` T, G, M, K, m, u; None: the largest
    that keeps the value >= 1)."""
    if units is None:
        units = next((u for u, s in _SCALES.items() if num >= s), "u")
        if num == 0 or 1 <= num < 1e3:
            units = ""
    magnitude = _SCALES.get(units, 1)
    return f"{round(num / magnitude, precision):g} {units}"


def flops_to_string(flops: float, units: Optional[str] = None, precision: int = 2) -> str:
    return f"{number_to_string(flops, units=units, precision=precision)}FLOPS"


def macs_to_string(macs: float, units: Optional[str] = None, precision: int = 2) -> str:
    return f"{number_to_string(macs, units=units, precision=precision)}MACs"


def params_to_string(params_num: float, units: Optional[str] = None, precision: int = 2) -> str:
    """calflops' parameters string (billions as ``B``)."""
    units = units.replace("B", "G") if units else units
    return number_to_string(params_num, units=units, precision=precision).replace(
        "G", "B").strip()


def generate_transformer_input(model_tokenizer, input_shape, device) -> dict:
    """calflops' transformers input: per row the tokenizer's encoding of an empty text, padded
    to ``input_shape[1]`` (``(1, 128)`` when None) with its pad token (attention mask 0)."""
    batch, length = tuple(input_shape) if input_shape is not None else (1, 128)
    columns: dict = {}
    for _ in range(batch):
        encoded = model_tokenizer("", add_special_tokens=True)
        pad = length - len(encoded["input_ids"])
        for key, values in encoded.items():
            values = list(values)
            if key == "input_ids":
                values += [model_tokenizer.pad_token_id or 0] * pad
            elif key == "attention_mask":
                values += [0] * pad
            elif key in ("token_type_ids", "position_ids"):
                values += [0] * pad if key == "token_type_ids" else list(
                    range(len(values), length))
            else:
                continue
            columns.setdefault(key, []).append(values)
    return {key: torch.tensor(rows, device=device) for key, rows in columns.items()}


def _outputs_sum(output: Any) -> Optional[torch.Tensor]:
    """The sum of every floating-point tensor in a model's output (tensors, tuples, dicts,
    transformers' ModelOutput): what backward runs from."""
    if isinstance(output, torch.Tensor):
        return output.float().sum() if output.is_floating_point() and output.requires_grad \
            else None
    values = output.values() if isinstance(output, dict) else output if isinstance(
        output, (tuple, list)) else ()
    total = None
    for value in values:
        part = _outputs_sum(value)
        if part is not None:
            total = part if total is None else total + part
    return total


def calculate_flops(model: nn.Module, input_shape=None, transformer_tokenizer=None, args=(),
                    kwargs=None, forward_mode: str = "forward",
                    include_backPropagation: bool = False,  # noqa: N803 (calflops' name)
                    compute_bp_factor: float = 2.0, print_results: bool = True,
                    print_detailed: bool = True, output_as_string: bool = True,
                    output_precision: int = 2, output_unit: Optional[str] = None,
                    ignore_modules=None, is_sparse: bool = False):
    """calflops' ``calculate_flops``: ``(flops, macs, params)`` of one forward (or, with
    ``include_backPropagation``, forward and measured backward) in eval mode; strings
    (``'8.18 GFLOPS'``, ``'4.09 GMACs'``, ``'25.56 M'``) with ``output_as_string``.

    >>> flops, macs, params = calculate_flops(model, input_shape=(1, 3, 224, 224))
    >>> calculate_flops(llm, kwargs={"input_ids": ids}, output_as_string=False)

    ``input_shape`` builds one tensor of ones (the model's parameter dtype and device), or,
    with ``transformer_tokenizer``, the tokenizer's padded inputs of ``(batch, length)``.
    ``forward_mode="generate"`` profiles ``model.generate``. ``ignore_modules`` only hides
    modules from the printout (their work stays in their parent, as in calflops);
    ``is_sparse`` scales each module's own MACs by its trainable parameters' nonzero share.
    The model is given back as it was found: train flags, gradients, buffers, hooks, RNG.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if forward_mode not in FORWARD_MODES:
        raise ValueError(f"forward_mode must be one of {FORWARD_MODES}, got {forward_mode!r}")
    for kind in ignore_modules or ():
        if not (isinstance(kind, type) and issubclass(kind, nn.Module)):
            raise TypeError(f"ignore_modules takes nn.Module classes, got {kind!r}")
    args = list(args)
    kwargs = dict(kwargs or {})
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else None
    if input_shape is not None:
        if args or kwargs:
            raise ValueError("give input_shape or args / kwargs, not both")
        if not isinstance(input_shape, tuple) or not input_shape:
            raise ValueError(f"input_shape must be a non-empty tuple, got {input_shape!r}")
        if transformer_tokenizer is not None:
            kwargs = generate_transformer_input(transformer_tokenizer, input_shape, device)
        else:
            dtype = parameter.dtype if parameter is not None else None
            args = [torch.ones(input_shape, dtype=dtype, device=device)]
    elif transformer_tokenizer is not None and not args and not kwargs:
        kwargs = generate_transformer_input(transformer_tokenizer, None, device)
    if not args and not kwargs:
        raise ValueError("give the model's inputs: input_shape, args or kwargs")
    run: Any = model if forward_mode == "forward" else model.generate

    def call() -> None:
        output = run(*args, **kwargs)
        if include_backPropagation:
            loss = _outputs_sum(output)
            if loss is None:
                raise ValueError("include_backPropagation needs an output with a "
                                 "floating-point tensor that requires grad")
            loss.backward()

    # the model and the inputs given back as found: gradients (backward's are not the
    # user's), buffers, flags, RNG (compat._conventions.run_forward)
    counter = run_forward(model, call, None, inputs=(args, kwargs), inference=False,
                          grad=include_backPropagation)
    macs = _sparse_macs(model, counter) if is_sparse else counter.total.macs
    flops = 2 * macs
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if print_results:
        detail = _detailed(model, counter, macs, params, tuple(ignore_modules or ()),
                           output_precision) if print_detailed else None
        print(_summary(flops, macs, params, include_backPropagation, output_unit,
                       output_precision, compute_bp_factor, detail))
    if output_as_string:
        return (flops_to_string(flops, units=output_unit, precision=output_precision),
                macs_to_string(macs, units=output_unit, precision=output_precision),
                params_to_string(params, units=output_unit, precision=output_precision))
    return flops, macs, params


def _sparse_macs(model: nn.Module, counter: FlopCounter) -> float:
    """calflops' ``is_sparse``: each module's own MACs times the nonzero share of the
    trainable parameters under it."""
    modules = dict(model.named_modules())
    total = 0.0
    for name, stats in counter.by_module().items():
        trainable = [p for p in modules[name].parameters() if p.requires_grad] \
            if name in modules else []
        count = sum(p.numel() for p in trainable)
        share = sum(int(p.count_nonzero()) for p in trainable) / count if count else 1.0
        total += stats.exclusive.macs * share
    return total


def _summary(flops: float, macs: float, params: int, backward: bool, units, precision,
             factor: float = 2.0, detail: Optional[str] = None) -> str:
    line = "{:<70}  {:<8}"
    what = "fwd+bwd" if backward else "fwd"
    # without the backward run, calflops' own estimate: fwd x (1 + compute_bp_factor)
    estimated = [] if backward else [
        line.format("fwd+bwd MACs: ", macs_to_string(macs * (1 + factor), units=units,
                                                     precision=precision)),
        line.format("fwd+bwd FLOPs: ", flops_to_string(flops * (1 + factor), units=units,
                                                       precision=precision))]
    return "\n".join([
        "",
        "------------------------------------- Calculate Flops Results "
        "-------------------------------------",
        "Notations:",
        "number of parameters (Params), number of multiply-accumulate operations(MACs),",
        "number of floating-point operations (FLOPs), floating-point operations per second "
        "(FLOPS),",
        "fwd FLOPs (model forward propagation FLOPs), bwd FLOPs (model backward propagation "
        "FLOPs),",
        "counted by dispatch_flops: FLOPs = 2 x MACs; with include_backPropagation the "
        "backward is measured,",
        f"else fwd+bwd is calflops' estimate, {factor:.2f} x the forward for the backward.",
        "",
        line.format("Total Training Params: ", params_to_string(params)),
        line.format(f"{what} MACs: ", macs_to_string(macs, units=units, precision=precision)),
        line.format(f"{what} FLOPs: ", flops_to_string(flops, units=units, precision=precision)),
        *estimated,
        *([detail] if detail else []),
        "---------------------------------------------------------------------------------------"
        "------------",
    ])


def _detailed(model: nn.Module, counter: FlopCounter, total_macs: float, total_params: int,
              ignored: tuple, precision: int) -> str:
    """calflops' "Detailed Calculated FLOPs Results": ``str(model)`` with each module's
    trainable parameters, MACs and FLOPs (its children's included) and their shares; modules
    of the ``ignored`` classes printed as torch prints them."""
    stats = counter.by_module()
    total_flops = 2 * total_macs

    def share(value: float, total: float) -> str:
        return f"{round(100 * value / total, precision) if total else 0:g}%"

    def items(module: nn.Module, name: str) -> list:
        if isinstance(module, ignored):
            return []
        own = sum(p.numel() for p in module.parameters() if p.requires_grad)
        macs = stats[name].macs if name in stats else 0
        return [f"{params_to_string(own)} = {share(own, total_params)} Params",
                f"{macs_to_string(macs)} = {share(macs, total_macs)} MACs",
                f"{flops_to_string(2 * macs)} = {share(2 * macs, total_flops)} FLOPs"]

    return "\n".join([
        "",
        "-------------------------------- Detailed Calculated FLOPs Results "
        "--------------------------------",
        "Each module caculated is listed after its name in the following order: ",
        "params, percentage of total params, MACs, percentage of total MACs, FLOPS, "
        "percentage of total FLOPs",
        "",
        "Note: 1. A module can have torch.nn.module or torch.nn.functional to compute logits "
        "(e.g. CrossEntropyLoss). ",
        " They are not counted as submodules in calflops and not to be printed out. However "
        "they make up the difference between a parent's MACs and the sum of its submodules'.",
        "2. Number of floating-point operations is a theoretical estimation, thus FLOPS "
        "computed using that could be larger than the maximum system throughput.",
        "",
        annotated_repr(model, items),
    ])


__all__ = ["calculate_flops", "flops_to_string", "generate_transformer_input",
           "macs_to_string", "number_to_string", "params_to_string"]
