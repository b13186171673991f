"""The text table. Reads finished results only; never touches the dispatch mode."""

from __future__ import annotations

from tabulate import tabulate

from ._format import duration, human
from ._results import (BACKWARD, COMMUNICATION, ESTIMATED, EXACT, FORWARD, NO_ARITHMETIC,
                       OPTIMIZER, PHASES, MODEL_PHASES, RECOMPUTE, ROOT, UNSUPPORTED, depth_of)

_PHASE_HEADERS = {FORWARD: "Fwd FLOPs", BACKWARD: "Bwd FLOPs", OPTIMIZER: "Opt FLOPs",
                  RECOMPUTE: "Recompute FLOPs"}


def _percent(part: float, whole) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def module_table(counter, depth: int = 2, ranks: bool = False) -> str:
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an int >= 0 (0 shows the root only), got {depth!r}")
    modules = counter.by_module()
    by_phase = counter.by_phase()
    # a column per phase once more than forward ran
    shown = [p for p in PHASES if by_phase[p].calls] if any(
        by_phase[p].calls for p in PHASES if p != FORWARD) else []
    per_phase = {p: counter.by_module(phase=p) for p in shown}
    total = counter.total.flops
    headers = ["Module", "Calls", "Params", "MACs", "FLOPs", "% FLOPs", "Read", "Written"]
    headers[5:5] = [_PHASE_HEADERS.get(p, f"{p.title()} FLOPs") for p in shown]
    saved = counter.saved_activations
    if saved:
        headers.append("Saved")
    # collectives ran: the bytes this rank put on the wire (docs/conventions.md)
    comm = counter.total.comm_bytes > 0
    if comm:
        headers.append("Comm")
    spread = counter.imbalance() if ranks else {}
    if ranks:
        headers += ["FLOPs min", "FLOPs max"] + (["Comm min", "Comm max"] if comm else [])
    timed = counter.timing
    root_time = modules[ROOT].latency_s if timed and ROOT in modules else None
    if timed:
        headers += ["Latency", "% Time", "FLOPS"]
        if ranks:
            headers += ["Latency min", "Latency max"]
    rows = []
    for name in counter.module_names():
        level = depth_of(name)
        if level > depth or name not in modules:
            continue
        m = modules[name]
        # tabulate strips leading spaces, so depth shows as leading dots
        label = counter.root_label if name == ROOT else "· " * (level - 1) + name
        row = [label, m.calls, human(m.params), human(m.macs), human(m.flops),
               _percent(m.flops, total), human(m.bytes_read, "B"), human(m.bytes_written, "B")]
        row[5:5] = [human(per_phase[p][name].flops if name in per_phase[p] else 0)
                    for p in shown]
        if saved:
            row.append(human(m.saved_bytes or 0, "B"))
        if comm:
            row.append(human(m.comm_bytes, "B"))
        if ranks:
            low_high = spread[name]
            row += [human(low_high["flops"][0]), human(low_high["flops"][2])]
            if comm:
                row += [human(low_high["comm_bytes"][0], "B"),
                        human(low_high["comm_bytes"][2], "B")]
        if timed:
            latency = m.latency_s or 0.0
            row += [duration(latency), _percent(latency, root_time),
                    human(m.flops / latency, "FLOPS") if latency else "-"]
            if ranks:
                row += [duration(spread[name]["latency_s"][0]),
                        duration(spread[name]["latency_s"][2])]
        rows.append(row)
    align = ("left",) + ("right",) * (len(headers) - 1)
    lines = [tabulate(rows, headers=headers, disable_numparse=True, colalign=align),
             coverage_line(counter.coverage())]
    if counter.ranks:
        lines.append(f"Gathered from {len(counter.ranks)} ranks: counts summed over ranks")
    if any(by_phase[p].calls for p in PHASES if p not in MODEL_PHASES):
        lines.append(f"Model flops (forward + backward): {human(counter.model_flops())}, "
                     f"hardware flops (all executed): {human(counter.hardware_flops())}")
    if timed:
        top = counter.top_ops_by_time(5)
        listed = ", ".join(f"{op} {duration(stats.latency_s or 0.0)}" for op, stats in top)
        lines.append(f"Top ops by time: {listed}")
    estimated = counter.estimated_ops()
    if estimated:
        lines.append(f"Estimated ops (flops from the op's tag family): {_listed(estimated)}")
    unsupported = counter.unsupported_ops()
    if unsupported:
        lines.append(f"Unsupported ops (bytes counted, flops unknown): {_listed(unsupported)}")
    else:
        lines.append("Unsupported ops: none")
    for error in counter.run.pricing_errors:
        lines.append(f"Formula failed (its calls reported unsupported): {error}")
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
        f"no arithmetic {pair(lambda by: coverage.share(NO_ARITHMETIC, by))}"
        + (f", communication {pair(lambda by: coverage.share(COMMUNICATION, by))}"
           if coverage.calls.get(COMMUNICATION) else "")
        + f"), estimated {pair(lambda by: coverage.share(ESTIMATED, by))}, "
        f"unsupported {pair(lambda by: coverage.share(UNSUPPORTED, by))}"
    )
