"""The text table. Reads finished results only; never touches the dispatch mode."""

from __future__ import annotations

from tabulate import tabulate

from ._format import duration, human
from ._results import BACKWARD, FORWARD, ROOT


def _percent(part: float, whole) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def module_table(counter, depth: int = 2) -> str:
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an int >= 0 (0 shows the root only), got {depth!r}")
    modules = counter.by_module()
    forward = counter.by_module(phase=FORWARD)
    backward = counter.by_module(phase=BACKWARD)
    has_backward = counter.by_phase()[BACKWARD].calls > 0
    total = counter.total.flops
    headers = ["Module", "Calls", "Params", "MACs", "FLOPs", "% FLOPs", "Read", "Written"]
    if has_backward:
        headers[5:5] = ["Fwd FLOPs", "Bwd FLOPs"]
    timed = counter.timing
    root_time = modules[ROOT].latency_s if timed and ROOT in modules else None
    if timed:
        headers += ["Latency", "% Time", "FLOPS"]
    rows = []
    for name in counter.module_names():
        level = 0 if name == ROOT else name.count(".") + 1
        if level > depth or name not in modules:
            continue
        m = modules[name]
        # tabulate strips leading spaces, so depth shows as leading dots
        label = counter.root_label if name == ROOT else "· " * (level - 1) + name
        row = [label, m.calls, human(m.params), human(m.macs), human(m.flops),
               _percent(m.flops, total), human(m.bytes_read, "B"), human(m.bytes_written, "B")]
        if has_backward:
            row[5:5] = [human(forward[name].flops if name in forward else 0),
                        human(backward[name].flops if name in backward else 0)]
        if timed:
            latency = m.latency_s or 0.0
            row += [duration(latency), _percent(latency, root_time),
                    human(m.flops / latency, "FLOPS") if latency else "-"]
        rows.append(row)
    align = ("left",) + ("right",) * (len(headers) - 1)
    lines = [tabulate(rows, headers=headers, disable_numparse=True, colalign=align)]
    if timed:
        top = counter.top_ops_by_time(5)
        listed = ", ".join(f"{op} {duration(stats.latency_s or 0.0)}" for op, stats in top)
        lines.append(f"Top ops by time: {listed}")
    unsupported = counter.unsupported_ops()
    if unsupported:
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(unsupported.items()))
        lines.append(f"Unsupported ops (bytes counted, flops unknown): {listed}")
    else:
        lines.append("Unsupported ops: none")
    return "\n".join(lines)
