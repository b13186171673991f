"""torch.utils.flop_counter.FlopCounterMode's reading API, on a Profile: ``get_total_flops``,
``get_flop_counts`` and ``get_table`` answer as torch's do, with torch's figure.

torch's figure is the field's flops figure: 2 × the MACs of the contraction ops (matmul,
convolution, attention products, ... see docs/conventions.md), not this package's all-ops
``Stats.flops``. (``FlopCounterMode`` itself, torch's constructor, is in ``_torch_mode``.)
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import torch

from dispatch_flops.results.stats import ROOT, depth_of

# torch's own string, not ours (``dispatch_flops.GLOBAL`` is "global"): torch's
# FlopCounterMode keys everything counted in the block, and names its table's first row,
# "Global", and code written against torch's counter reads ``flop_counts["Global"]``; the
# getters answer as torch's do, so they keep torch's spelling.
TORCH_GLOBAL = "Global"
GLOBAL = TORCH_GLOBAL  # the name this module's lines and compat.torch_mode's read it by
_SUFFIXES = ("", "K", "M", "B", "T")  # torch's table units


def packet(operator: str):
    """``"aten.mm"`` -> ``torch.ops.aten.mm``: the key torch's counter uses."""
    namespace, _, name = operator.partition(".")
    return getattr(getattr(torch.ops, namespace), name)


def torch_flop_counts(profile) -> dict:
    """``{module: {op packet: 2 × MACs}}`` keyed as torch's ``FlopCounterMode`` keys them:
    ``"Global"`` for the whole run; for modules called in the block, the model's class name
    for its root and ``"<class>.<module name>"`` (with no model, the names are torch's
    already: ``"<class>"``, ``"<class>.<child>"``). Inclusive, all phases, ops with MACs
    only. A ``defaultdict`` as torch's, so a module that ran nothing reads ``{}``."""
    out: dict = defaultdict(lambda: defaultdict(int))
    out[GLOBAL]  # present even when nothing was counted, as torch's after any block
    for name, m in profile.by_module().items():
        keys = []
        if name == ROOT:
            keys.append(GLOBAL)
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


def _with_suffix(number: int, suffix: str) -> str:
    if not suffix:  # "7200.000" is a number to tabulate: it prints it as "%g" does
        return f"{float(number):g}"
    return f"{number / 1000 ** _SUFFIXES.index(suffix):.3f}{suffix}"


def _suffix(number: int) -> str:
    # torch's choice: by the digit count, so 1.01B shows as 1010.000M
    return _SUFFIXES[max(0, min(len(_SUFFIXES) - 1, (len(str(number)) - 2) // 3))]


def _percent(part: int, whole: int) -> str:
    return f"{part / whole:.2%}" if whole else "0%"


def torch_table(flop_counts: dict, depth: Optional[int]) -> str:
    """torch's ``FlopCounterMode.get_table`` layout of ``flop_counts``: modules in sorted
    order to ``depth`` (``"Class"`` is 1, ``"Class.child"`` 2), each with its ops; a
    ``Global`` row first only when no module holds every flop; columns as tabulate's "simple"
    format aligns them (left, right, right), the indentation kept as torch asks tabulate to
    (tabulate 0.10 ignores that request and strips it)."""
    depth = 999999 if depth is None else depth
    total = sum(flop_counts.get(GLOBAL, {}).values())
    suffix = _suffix(total)
    subsumed = False

    def rows_of(name: str, level: int) -> list:
        nonlocal subsumed
        counts = flop_counts.get(name, {})
        flops = sum(counts.values())
        subsumed |= flops >= total
        pad = " " * level
        rows = [[pad + name, _with_suffix(flops, suffix), _percent(flops, total)]]
        rows += [[pad + " - " + str(op), _with_suffix(v, suffix), _percent(v, total)]
                 for op, v in counts.items()]
        return rows

    rows = []
    for name in sorted(flop_counts):
        if name != GLOBAL and depth_of(name) <= depth:  # torch's names: never the root's ""
            rows += rows_of(name, depth_of(name) - 1)
    if GLOBAL in flop_counts and not subsumed:
        for row in rows:
            row[0] = " " + row[0]
        rows = rows_of(GLOBAL, 0) + rows
    if not rows:
        rows = [[GLOBAL, "0", "0%"]]
    header = ["Module", "FLOP", "% Total"]
    # tabulate's "simple" format pads a header by 2 at least
    widths = [max(max(len(r[i]) for r in rows), len(header[i]) + 2) for i in range(3)]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


class TorchCompat:
    """Mixin of a class with ``by_module()``, ``total``, ``root_label`` and ``has_model``:
    torch's getters, with torch's figure (2 × MACs)."""

    def get_total_flops(self) -> int:
        """2 × MACs of everything counted, all phases (torch's
        ``FlopCounterMode.get_total_flops``; ``total.flops`` is this package's all-ops
        figure)."""
        return 2 * self.total.macs

    def get_flop_counts(self) -> dict:
        """``{module: {op packet: 2 × MACs}}`` as torch's ``FlopCounterMode`` keys them
        (``torch_flop_counts``), as plain dicts."""
        return {k: dict(v) for k, v in torch_flop_counts(self).items()}

    def get_table(self, depth: Optional[int] = None) -> str:
        """torch's ``get_table``: modules to ``depth`` (None: 2; the model is 1), torch's
        layout and figure. ``table(depth)`` is this package's table."""
        return torch_table(self.get_flop_counts(), 2 if depth is None else depth)
