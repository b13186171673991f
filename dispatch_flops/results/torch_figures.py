"""torch's figure of a Profile: ``FlopCounterMode.get_flop_counts``'s ``{module: {op: flops}}``
(``ProfileViews.get_flop_counts``, ``get_total_flops``; ``views.torch_table`` lays it out).

torch's figure is the field's flops figure: 2 × the MACs of the contraction ops (matmul,
convolution, attention products, ... see docs/conventions.md), not this package's all-ops
``Stats.flops``. (``FlopCounterMode`` itself, torch's constructor, is in ``compat.torch_mode``.)
"""

from __future__ import annotations

from collections import defaultdict

import torch

from dispatch_flops.results.stats import ROOT

# torch's key for everything counted in the block: torch's own string, kept for code that reads
# get_flop_counts() as torch's; our root label without a model is stats.GLOBAL ("global")
TORCH_GLOBAL = "Global"


def packet(operator: str):
    """``"aten.mm"`` -> ``torch.ops.aten.mm``: the key torch's counter uses. An op this
    process does not have (a custom op in a file read elsewhere; any name a file holds) keys
    by its name instead: the figure is still the file's."""
    namespace, _, name = operator.partition(".")
    if namespace.startswith("__") or name.startswith("__"):  # never an op: an attribute
        return operator
    try:
        op = getattr(getattr(torch.ops, namespace), name)
    except Exception:  # torch raises AttributeError, or RuntimeError for some names
        return operator
    return op if isinstance(op, torch._ops.OpOverloadPacket) else operator


def torch_flop_counts(profile) -> dict:
    """``{module: {op packet: 2 × MACs}}`` keyed as torch's ``FlopCounterMode`` keys them:
    ``"Global"`` for the whole run; for modules called in the block, the model's class name
    for its root and ``"<class>.<module name>"`` (with no model, the names are torch's
    already: ``"<class>"``, ``"<class>.<child>"``). Inclusive, all phases, ops with MACs
    only. A ``defaultdict`` as torch's, so a module that ran nothing reads ``{}``."""
    out: dict = defaultdict(lambda: defaultdict(int))
    out[TORCH_GLOBAL]  # present even when nothing was counted, as torch's after any block
    for name, m in profile.by_module().items():
        keys = []
        if name == ROOT:
            keys.append(TORCH_GLOBAL)
        if m.calls:  # torch credits the modules running, never a container not called
            if profile.has_model:
                keys.append(profile.root_label + ("." + name if name else ""))
            elif name != ROOT:
                keys.append(name)
        for key in keys:
            counts = out[key]
            for op, s in m.by_operator.items():
                if s.macs:
                    counts[packet(op)] += 2 * s.macs
    return out
