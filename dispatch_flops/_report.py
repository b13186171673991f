"""The text table. Reads finished results only; never touches the dispatch mode."""

from __future__ import annotations

from tabulate import tabulate

from ._format import human
from ._results import BACKWARD, ESTIMATED, EXACT, FORWARD, NO_ARITHMETIC, ROOT, UNSUPPORTED


def _percent(part: int, whole: int) -> str:
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
        rows.append(row)
    align = ("left",) + ("right",) * (len(headers) - 1)
    lines = [tabulate(rows, headers=headers, disable_numparse=True, colalign=align),
             coverage_line(counter.coverage())]
    estimated = counter.estimated_ops()
    if estimated:
        lines.append(f"Estimated ops (flops from the op's tag family): {_listed(estimated)}")
    unsupported = counter.unsupported_ops()
    if unsupported:
        lines.append(f"Unsupported ops (bytes counted, flops unknown): {_listed(unsupported)}")
    else:
        lines.append("Unsupported ops: none")
    return "\n".join(lines)


def _listed(ops: dict) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(ops.items()))


def coverage_line(coverage) -> str:
    """One line: each category's share of calls / of bytes moved."""

    def pair(share) -> str:
        return " / ".join(f"{100.0 * share(by):.1f}%" for by in ("calls", "bytes"))

    return (
        f"Coverage (calls / bytes moved): priced exactly {pair(coverage.priced_exactly)} "
        f"(formula {pair(lambda by: coverage.share(EXACT, by))}, "
        f"no arithmetic {pair(lambda by: coverage.share(NO_ARITHMETIC, by))}), "
        f"estimated {pair(lambda by: coverage.share(ESTIMATED, by))}, "
        f"unsupported {pair(lambda by: coverage.share(UNSUPPORTED, by))}"
    )
