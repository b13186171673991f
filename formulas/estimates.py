"""Family estimates for ops with no formula, chosen by the tags torch gives them.

Used only when an op has neither a formula nor a no-arithmetic declaration; every count they
make is reported as ``estimated``. Only families whose cost is sound from the tag alone:

* ``torch.Tag.pointwise``: one flop per output element (a pointwise op does at least one
  operation per element it writes; special functions do more, so this is a lower bound);
* ``torch.Tag.reduction``: one flop per input element (every element meets the accumulator).
"""

from __future__ import annotations

import torch

from ._registry import REGISTRY, Cost
from ._shapes import first_numel, list_numel, numel


def pointwise_estimate(*args, out_shape, **kwargs) -> Cost:
    lists = [a for a in args if isinstance(a, list)]
    if lists:  # a _foreach_ op: every tensor of its first list is an output
        return Cost(list_numel(lists[0]))
    return Cost(first_numel(out_shape))


def reduction_estimate(*args, out_shape, **kwargs) -> Cost:
    first = next((a for a in args if isinstance(a, (torch.Size, list))), None)
    if isinstance(first, list):
        return Cost(list_numel(first))
    return Cost(numel(first) if first is not None else 0)


REGISTRY.estimate(torch.Tag.pointwise, pointwise_estimate)
if hasattr(torch.Tag, "reduction"):  # torch 2.8 has no reduction tag: no estimate by it
    REGISTRY.estimate(torch.Tag.reduction, reduction_estimate)
