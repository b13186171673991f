"""torch.utils.flop_counter.FlopCounterMode's reading API, on a Profile: ``get_total_flops``,
``get_flop_counts`` and ``get_table`` answer as torch's do, with this package's counts.
(``FlopCounterMode`` itself, torch's constructor, is in ``_torch_mode``.)"""

from __future__ import annotations

from typing import Optional

import torch

from ._results import ROOT


def _packet(operator: str):
    """``"aten.mm"`` -> ``torch.ops.aten.mm``: the key torch's counter uses."""
    namespace, _, name = operator.partition(".")
    return getattr(getattr(torch.ops, namespace), name)


class TorchCompat:
    """Mixin of a class with ``total``, ``by_module()``, ``table()``, ``root_label`` and
    ``has_model``."""

    def get_total_flops(self) -> int:
        """Every flop counted, all phases (torch's ``FlopCounterMode.get_total_flops``)."""
        return self.total.flops

    def get_flop_counts(self) -> dict:
        """``{module: {op packet: flops}}`` as torch's ``FlopCounterMode`` keys them:
        ``"Global"`` for the whole run, the model's class name for the root, then
        ``"<class>.<module name>"``; inclusive, all phases, ops with flops only."""
        out = {}
        for name, m in self.by_module().items():
            counts = {_packet(op): s.flops for op, s in m.by_operator.items() if s.flops}
            if name == ROOT:
                out["Global"] = counts
                if not self.has_model:
                    continue
            if counts:
                out[self.root_label + ("." + name if name else "")] = counts
        out.setdefault("Global", {})
        return out

    def get_table(self, depth: Optional[int] = None) -> str:
        """The module table, ``depth`` counted as torch's ``get_table`` counts it (1: the
        model, 2: its children; None: 2). ``table(depth)`` counts from 0 for the model."""
        return self.table(max((2 if depth is None else depth) - 1, 0))
