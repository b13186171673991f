"""torch's ``FlopCounterMode.get_table`` layout of torch's figure (``results.torch_figures``):
``ProfileViews.get_table`` prints it."""

from __future__ import annotations

from typing import Optional

from dispatch_flops.results.stats import depth_of
from dispatch_flops.results.torch_figures import TORCH_GLOBAL
from dispatch_flops.views.escape import printable

_SUFFIXES = ("", "K", "M", "B", "T")  # torch's table units


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
    total = sum(flop_counts.get(TORCH_GLOBAL, {}).values())
    suffix = _suffix(total)
    subsumed = False

    def rows_of(name: str, level: int) -> list:
        nonlocal subsumed
        counts = flop_counts.get(name, {})
        flops = sum(counts.values())
        subsumed |= flops >= total
        pad = " " * level
        rows = [[pad + printable(name), _with_suffix(flops, suffix), _percent(flops, total)]]
        rows += [[pad + " - " + printable(str(op)), _with_suffix(v, suffix), _percent(v, total)]
                 for op, v in counts.items()]
        return rows

    rows = []
    for name in sorted(flop_counts):
        # torch's names: never the root's ""
        if name != TORCH_GLOBAL and depth_of(name) <= depth:
            rows += rows_of(name, depth_of(name) - 1)
    if TORCH_GLOBAL in flop_counts and not subsumed:
        for row in rows:
            row[0] = " " + row[0]
        rows = rows_of(TORCH_GLOBAL, 0) + rows
    if not rows:
        rows = [[TORCH_GLOBAL, "0", "0%"]]
    header = ["Module", "FLOP", "% Total"]
    # tabulate's "simple" format pads a header by 2 at least
    widths = [max(max(len(r[i]) for r in rows), len(header[i]) + 2) for i in range(3)]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
