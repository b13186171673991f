"""A paper table: several models (or configurations) counted at given inputs, forward or a
training step, in one table of parameters, MACs, FLOPs and model FLOPs, as Markdown or LaTeX,
with the unit convention in the header and a footnote saying which column the field's tools
report.

>>> table = paper_table({"ResNet-50": (resnet50(), torch.randn(1, 3, 224, 224)),
...                      "ViT-B/16": (vit_b_16(), torch.randn(1, 3, 224, 224))})
>>> print(table.to_markdown()); print(table.to_latex())

Units: 1 MAC (a multiply-accumulate of a contraction: matrix products, convolutions,
attention) = 2 FLOPs. "MACs" is the figure fvcore (``FlopCountAnalysis.total()``, its
"flops"), thop (``profile``), ptflops ("GMac") and torchvision's weight metadata ("GFLOPS")
report; calflops and DeepSpeed report 2 x MACs as FLOPs. "FLOPs" here is every op's arithmetic
(2 x MACs plus norms, softmax, activations, bias adds); "Model FLOPs" leaves out attention
pairs a mask made useless (docs/conventions.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

from dispatch_flops.counter import FlopCounter
from dispatch_flops.views import paper_table as paper_text
from dispatch_flops.workflows.untouched import Untouched

STEPS = ("forward", "train")


@dataclass(frozen=True)
class PaperRow:
    """One model's figures: ``params`` (every parameter, shared ones once), ``macs``,
    ``flops`` and ``model_flops`` of the step counted, at ``inputs`` (the input shapes)."""

    name: str
    inputs: str
    params: int
    macs: int
    flops: int
    model_flops: int


@dataclass(frozen=True)
class PaperTable:
    """Rows of ``paper_table``: ``to_markdown()`` / ``to_latex()`` lay them out
    (``views.paper_table``), figures in ``scale`` units (``"G"``: giga; parameters in millions)
    with ``precision`` decimals.

    >>> table = paper_table({"tiny": (model, x)})
    >>> table.rows[0].macs, print(table.to_markdown())
    """

    rows: tuple
    step: str  # "forward" or "train" (forward and backward)

    def to_markdown(self, scale: str = "G", precision: int = 2) -> str:
        """A Markdown (GitHub) table: a units line, the table, the footnote."""
        return paper_text.paper_markdown(self, scale, precision)

    def to_latex(self, scale: str = "G", precision: int = 2, caption: Optional[str] = None,
                 label: Optional[str] = None) -> str:
        """A LaTeX ``table`` (booktabs rules): the units in the caption, the footnote under
        the tabular."""
        return paper_text.paper_latex(self, scale, precision, caption, label)

    def __str__(self) -> str:
        return paper_text.paper_markdown(self)


def _shapes(inputs: Any) -> str:
    """The input shapes as a paper writes them: ``1×3×224×224``."""
    if isinstance(inputs, torch.Tensor):
        return "×".join(str(n) for n in inputs.shape) or "scalar"
    if isinstance(inputs, Mapping):
        return ", ".join(f"{k}: {_shapes(v)}" for k, v in inputs.items()
                         if isinstance(v, (torch.Tensor, Mapping, tuple, list)))
    if isinstance(inputs, (tuple, list)):
        return ", ".join(_shapes(v) for v in inputs if isinstance(v, (torch.Tensor, Mapping,
                                                                       tuple, list)))
    return type(inputs).__name__


def _loss(output: Any) -> Optional[torch.Tensor]:
    """The sum of the output's floating-point tensors that require grad (tuples, dicts and
    transformers' outputs walked): what a training step's backward runs from."""
    if isinstance(output, torch.Tensor):
        return output.sum() if output.is_floating_point() and output.requires_grad else None
    values = (output.values() if isinstance(output, Mapping) else output
              if isinstance(output, (tuple, list)) else ())
    parts = [p for p in (_loss(v) for v in values) if p is not None]
    return sum(parts[1:], parts[0]) if parts else None


def _count(model: nn.Module, inputs: Any, step: str) -> FlopCounter:
    args, kwargs = ((), dict(inputs)) if isinstance(inputs, Mapping) else (
        (tuple(inputs), {}) if isinstance(inputs, (tuple, list)) else ((inputs,), {}))
    # the step's gradients, BatchNorm's statistics, dropout's draws are not the user's
    with Untouched(model, (args, kwargs)):
        if step == "forward":
            model.eval()
            with torch.no_grad(), FlopCounter(model) as counter:
                model(*args, **kwargs)
        else:
            model.train()
            with FlopCounter(model) as counter:
                loss = _loss(model(*args, **kwargs))
                if loss is None:
                    raise ValueError(f"a training step needs an output with a floating-point "
                                     f"tensor that requires grad; {type(model).__name__}'s has "
                                     f"none")
                loss.backward()
    return counter


def paper_table(models: Mapping[str, Sequence], *, step: str = "forward") -> PaperTable:
    """Count each ``name: (model, inputs)`` (inputs: a tensor, a tuple of positional
    arguments or a dict of keyword arguments) once: ``step="forward"`` in eval mode without
    grad, ``"train"`` forward and backward of the outputs' sum in train mode. The model is
    given back as it was found (``workflows.untouched``: gradients, BatchNorm's statistics,
    the RNG dropout drew from, train flags, hooks). Meta-device models and inputs count from
    shapes alone.

    >>> paper_table({"small": (small, x), "large": (large, x)}, step="train").to_latex()
    """
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    if not isinstance(models, Mapping) or not models:
        raise ValueError("models must be a non-empty dict {name: (model, inputs)}")
    rows = []
    for name, entry in models.items():
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2
                and isinstance(entry[0], nn.Module)):
            raise ValueError(f"models[{name!r}] must be (nn.Module, inputs), got {entry!r:.80}")
        model, inputs = entry
        counter = _count(model, inputs, step)
        total = counter.total
        rows.append(PaperRow(str(name), _shapes(inputs), sum(p.numel() for p in model.parameters()),
                             total.macs, total.flops, total.model_flops))
    return PaperTable(tuple(rows), step)


__all__ = ["PaperRow", "PaperTable", "STEPS", "paper_table"]
