"""The text table. Reads finished results only; never touches the dispatch mode.

Columns are declared once in ``COLUMNS``: a key (what ``table(columns=...)`` names), a
header and its abbreviation, a priority (the lower, the longer it stays when the table must
narrow; columns of one priority go together),
when it applies to a run, and how a row's cell reads. A new column is one more entry. The
table fits ``width`` characters (``COLUMNS``, else the terminal's; 100 when output is not a
terminal): first the headers are abbreviated, then the columns of highest priority number
dropped (Type first), the module names shortened last. The notes under it are those that
apply to the columns shown, wrapped to the same width.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from tabulate import tabulate

from dispatch_flops.results.format import duration, human
from dispatch_flops.results.rows import KERNEL_ROW_PREFIX
from dispatch_flops.results.stats import (
    BACKWARD,
    COMMUNICATION,
    ESTIMATED,
    EXACT,
    FORWARD,
    MODEL_PHASES,
    NO_ARITHMETIC,
    OPTIMIZER,
    OTHER,
    PHASES,
    RECOMPUTE,
    ROOT,
    UNSUPPORTED,
    depth_of,
)
from dispatch_flops.views.escape import cell, printable, safe_lines

DEFAULT_WIDTH = 100  # when the output is not a terminal
GROUPS = (None, "type")  # table(group=...): a row per module, or per module class
NEVER_CALLED = "-"  # the Calls cell of a container never called itself (ModuleList)
IN_GRAPH = "in graph"  # the time cells of a module run inside a compiled graph: it has none

_PHASE_HEADERS: dict[str, tuple[str, str]] = {
    FORWARD: ("Fwd FLOPs", "Fwd"), BACKWARD: ("Bwd FLOPs", "Bwd"),
    OPTIMIZER: ("Opt FLOPs", "Opt"), RECOMPUTE: ("Recompute FLOPs", "Recomp"),
    OTHER: ("Other FLOPs", "Other")}


def _percent(part: float, whole) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


@dataclass
class _Run:
    """What every cell may read: the run, its views, and the figures shared by rows."""

    profile: object
    modules: dict
    per_phase: dict  # phase -> by_module(phase), for the phases shown
    types: dict
    total: int
    root_time: Optional[float]
    spread: dict  # name -> {figure: (min, mean, max) over ranks}, with ranks=True; else {}
    in_graphs: frozenset = frozenset()  # modules run inside a compiled graph (no own time)
    model_phases: dict = field(default_factory=dict)  # MODEL_PHASES: phase -> by_module
    by_type: bool = False  # rows are module classes (group="type")


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    short: str
    priority: int
    cell: Callable  # (run, name, ModuleStats) -> str
    applies: Callable = lambda run: True  # (run) -> bool


def _calls(run, name, m) -> str:
    # a container never called itself (ModuleList) holds its children's figures
    return NEVER_CALLED if not m.calls and name != ROOT and run.profile.has_model else str(m.calls)


def _phase_column(phase: str, priority: int) -> Column:
    header, short = _PHASE_HEADERS.get(phase, (f"{phase.title()} FLOPs", phase.title()))
    return Column(phase, header, short, priority,
                  lambda run, name, m: human(run.per_phase[phase][name].flops
                                             if name in run.per_phase[phase] else 0),
                  lambda run: phase in run.per_phase)


def _model_flops(run, name: str) -> int:
    # the footer's figure, per module: forward + backward only (a loss after the model, phase
    # other, is hardware work the model does not need), so the root's cell is model_flops()
    return sum(run.model_phases[p][name].inclusive.model_flops
               for p in MODEL_PHASES if name in run.model_phases[p])


def _latency(m) -> float:
    return m.latency_s or 0.0


def _timed(cell: Callable) -> Callable:
    """A time cell, or ``IN_GRAPH`` for a module whose forward ran inside a compiled graph
    (fused kernels: it has no time of its own, and a zero would be a wrong figure)."""
    def timed_cell(run, name, m):
        return IN_GRAPH if name in run.in_graphs else cell(run, name, m)
    return timed_cell


# Priorities: the module's own figures (FLOPs, its share, its time) stay; with ranks=True the
# per-rank spread the reader asked for comes next; Type (the class name, mostly what the
# module's name says) is the first to go, then the least needed figures.
COLUMNS: tuple = (
    Column("module", "Module", "Module", 0, lambda run, name, m: name),  # laid out apart
    Column("type", "Type", "Type", 16, lambda run, name, m: cell(run.types.get(name, "")),
           lambda run: not run.by_type),
    Column("calls", "Calls", "Calls", 7, _calls),
    Column("params", "Params", "Params", 9, lambda run, name, m: human(m.params)),
    Column("macs", "MACs", "MACs", 10, lambda run, name, m: human(m.macs)),
    Column("flops", "FLOPs", "FLOPs", 1, lambda run, name, m: human(m.flops)),
    # masked attention pairs were computed: the flops the model needed (docs/conventions.md)
    Column("model_flops", "Model FLOPs", "Model", 6,
           lambda run, name, m: human(_model_flops(run, name)),
           lambda run: run.profile.total.masked_flops > 0),
    _phase_column(FORWARD, 11),
    _phase_column(BACKWARD, 11),
    _phase_column(OPTIMIZER, 14),
    _phase_column(RECOMPUTE, 14),
    _phase_column(OTHER, 14),
    # a class's own flops (group="type"): they sum to the total, its inclusive ones overlap
    Column("own_flops", "Own FLOPs", "Own", 1, lambda run, name, m: human(m.exclusive.flops),
           lambda run: run.by_type),
    Column("percent", "% FLOPs", "%FLOPs", 2, lambda run, name, m: _percent(m.flops, run.total)),
    Column("read", "Read", "Read", 12, lambda run, name, m: human(m.bytes_read, "B")),
    Column("written", "Written", "Wrote", 12, lambda run, name, m: human(m.bytes_written, "B")),
    Column("saved", "Saved", "Saved", 13, lambda run, name, m: human(m.saved_bytes or 0, "B"),
           lambda run: run.profile.saved_activations),
    # collectives ran: the bytes this rank put on the wire (docs/conventions.md)
    Column("comm", "Comm", "Comm", 7, lambda run, name, m: human(m.comm_bytes, "B"),
           lambda run: run.profile.total.comm_bytes > 0),
    # and their sizes S (NCCL-tests' algorithm bytes), first to go when the table narrows
    Column("comm_alg", "Comm S", "CommS", 15, lambda run, name, m: human(m.comm_alg_bytes, "B"),
           lambda run: run.profile.total.comm_alg_bytes > 0),
    Column("flops_min", "FLOPs min", "Fmin", 3,
           lambda run, name, m: human(run.spread[name]["flops"][0]), lambda run: run.spread),
    Column("flops_max", "FLOPs max", "Fmax", 3,
           lambda run, name, m: human(run.spread[name]["flops"][2]), lambda run: run.spread),
    Column("comm_min", "Comm min", "Cmin", 8,
           lambda run, name, m: human(run.spread[name]["comm_bytes"][0], "B"),
           lambda run: run.spread and run.profile.total.comm_bytes > 0),
    Column("comm_max", "Comm max", "Cmax", 8,
           lambda run, name, m: human(run.spread[name]["comm_bytes"][2], "B"),
           lambda run: run.spread and run.profile.total.comm_bytes > 0),
    Column("latency", "Latency", "Time", 4, _timed(lambda run, name, m: duration(_latency(m))),
           lambda run: run.profile.timing),
    Column("percent_time", "% Time", "%Time", 6,
           _timed(lambda run, name, m: _percent(_latency(m), run.root_time)),
           lambda run: run.profile.timing),
    Column("achieved", "FLOPS", "FLOP/s", 15,
           _timed(lambda run, name, m: human(m.flops / _latency(m), "FLOPS")
                  if _latency(m) else "-"),
           lambda run: run.profile.timing),
    Column("latency_min", "Latency min", "Tmin", 5,
           lambda run, name, m: duration(run.spread[name]["latency_s"][0]),
           lambda run: run.spread and run.profile.timing),
    Column("latency_max", "Latency max", "Tmax", 5,
           lambda run, name, m: duration(run.spread[name]["latency_s"][2]),
           lambda run: run.spread and run.profile.timing),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)


def terminal_width() -> int:
    """The width to fit: ``COLUMNS`` when it is set (``COLUMNS=80 python ... | less`` too),
    else the terminal's; ``DEFAULT_WIDTH`` when stdout is not a terminal."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isascii() and columns.isdigit() and int(columns) > 0:  # not "²": int() refuses
        return max(40, int(columns))
    try:
        if not sys.stdout.isatty():
            return DEFAULT_WIDTH
    except (AttributeError, ValueError):  # replaced or closed stdout
        return DEFAULT_WIDTH
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def check_width(width) -> int:
    """The width to fit: ``width`` when given (an int >= 40), else ``terminal_width()``."""
    if width is None:
        return terminal_width()
    if not isinstance(width, int) or isinstance(width, bool) or width < 40:
        raise ValueError(f"width must be an int >= 40 (characters), got {width!r}")
    return width


# a figure and its unit ("4.17 G", "12.3 %", "151.60 µs"): one word while wrapping
_FIGURE = re.compile(r"(\d) (?=[A-Za-zµ%])")
_JOINED = "\u00a0"  # no-break space: textwrap never breaks at it


def wrapped(line: str, width: int, indent: str = "  ") -> list:
    """``line`` wrapped to ``width`` (later lines indented), never between a figure and its
    unit."""
    joined = _FIGURE.sub(lambda m: m.group(1) + _JOINED, line)
    return [part.replace(_JOINED, " ") for part in textwrap.wrap(
        joined, width, subsequent_indent=indent, break_on_hyphens=False)] or [""]


def _shown_phases(by_phase) -> list:
    # a column per phase once more than forward ran
    if not any(by_phase[p].calls for p in PHASES if p != FORWARD):
        return []
    return [p for p in PHASES if by_phase[p].calls]


def _labels(names: list, root_label: str, limit: Optional[int]) -> dict:
    """Each row's label: the root's class name, then each module indented by depth and named
    from the nearest row above it in the tree ("blocks.0" then "attn", not
    "blocks.0.attn"); a label longer than ``limit`` keeps its head and tail around "…"."""
    labels = {}
    shown = set(names)
    for name in names:
        if name == ROOT:  # the model's class name: as long as a class name can be
            labels[name] = _shortened(cell(root_label), limit)
            continue
        parts = name.split(".")
        relative = name
        for cut in range(len(parts) - 1, 0, -1):
            if ".".join(parts[:cut]) in shown:
                relative = ".".join(parts[cut:])
                break
        labels[name] = _shortened("· " * (depth_of(name) - 1) + cell(relative), limit)
    return labels


def _shortened(label: str, limit: Optional[int]) -> str:
    """``label``, or its head and tail around "…" when it is longer than ``limit``."""
    if limit is not None and len(label) > limit:
        keep = limit - 1
        label = label[: keep - keep // 2] + "…" + label[len(label) - keep // 2:]
    return label


def _render(header_row: list, rows: list) -> str:
    align = ("left",) + ("right",) * (len(header_row) - 1)
    return tabulate(rows, headers=header_row, disable_numparse=True, colalign=align)


def module_table(counter, depth: int = 2, *, columns: Optional[Sequence[str]] = None,
                 width: Optional[int] = None, ops: int = 0, ranks: bool = False,
                 group: Optional[str] = None) -> str:
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an int >= 0 (0 shows the root only), got {depth!r}")
    if not isinstance(ops, int) or isinstance(ops, bool) or ops < 0:
        raise ValueError(f"ops must be an int >= 0 (top ops listed under each module), "
                         f"got {ops!r}")
    fit = check_width(width)
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, got {group!r}")
    if group == "type" and ranks:
        raise ValueError("table(group='type') has no per-rank columns: ranks=False")
    # group="type": a row per module class, its figures from by_type()
    of = counter.by_type if group == "type" else counter.by_module
    modules = of()
    by_phase = counter.by_phase()
    shown_phases = _shown_phases(by_phase)
    run = _Run(counter, modules, {p: of(phase=p) for p in shown_phases},
               counter.module_types(), counter.total.flops,
               modules[ROOT].latency_s if counter.timing and ROOT in modules else None,
               counter.imbalance() if ranks else {}, frozenset(counter.in_graphs),
               {p: of(phase=p) for p in MODEL_PHASES}, group == "type")
    available = [c for c in COLUMNS if c.applies(run)]
    # columns the reader picked are all kept: the table fits by shortening names only
    chosen = available if columns is None else _chosen(columns, available, run)
    names = list(modules) if group == "type" else \
        [n for n in counter.module_names() if depth_of(n) <= depth and n in modules]
    table, shown = _fitted(run, names, chosen, fit, ops, droppable=columns is None)
    footer = _footer(counter, by_phase, names, modules, {c.key for c in shown})
    # prose lines wrap at the same width; names reach the notes too (ops, errors): nothing in
    # them acts on the terminal
    return safe_lines("\n".join([table] + [part for line in footer
                                           for part in wrapped(printable(line), fit)]))


def _chosen(columns, available: list, run) -> list:
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise ValueError(f"columns must be a list of column names from {COLUMN_KEYS}, "
                         f"got {columns!r}")
    by_key = {c.key: c for c in available}
    chosen = [COLUMNS[0]]
    for key in columns:
        if key == "module":
            continue
        if key not in COLUMN_KEYS:
            raise ValueError(f"unknown column {key!r}; columns are {COLUMN_KEYS}")
        if key not in by_key:
            raise ValueError(f"column {key!r} does not apply to this run (no timing, saved "
                             f"activations or such phase); this run has "
                             f"{tuple(by_key)}")
        chosen.append(by_key[key])
    return chosen


def _fitted(run, names: list, chosen: list, width: int, ops: int, droppable: bool = True
            ) -> tuple[str, list]:
    """The table of ``chosen`` columns narrowed to ``width``, and the columns it kept:
    headers abbreviated, op rows' names cut by what is too wide, never below the modules'
    (a long op name must not cost the figures), then (``droppable``) columns dropped, then
    every name shortened."""
    limit = None
    short = False
    chosen = list(chosen)
    while True:
        text = _table(run, names, chosen, short, limit, ops, ops_only=True)
        if _widest(text) <= width:
            return text, chosen
        if not short:
            short = True
            continue
        if ops and limit is None:  # op names cut by the excess only, not below the modules'
            floor = max([12] + [len(label) for label in _labels(
                names, run.profile.root_label, None).values()])
            labels = [row[0] for row in _rows(run, names, chosen, None, ops, ops_only=True)]
            limit = max(floor, max(map(len, labels)) - (_widest(text) - width))
            continue
        dropping = [c.priority for c in chosen if c.priority > 2] if droppable else []
        if dropping:  # columns of one priority go together (forward and backward)
            chosen = [c for c in chosen if c.priority != max(dropping)]
            continue
        # only the module and the essential columns left: shorten the module (and op) names
        # by the excess (never below 12 characters)
        labels = [row[0] for row in _rows(run, names, chosen, limit, ops, ops_only=True)]
        limit = max(12, max(map(len, labels)) - (_widest(text) - width))
        return _table(run, names, chosen, short, limit, ops), chosen


def _widest(text: str) -> int:
    return max(map(len, text.splitlines()), default=0)


def _table(run, names: list, chosen: list, short: bool, limit: Optional[int],
           ops: int, ops_only: bool = False) -> str:
    header_row = [c.short if short else c.header for c in chosen]
    if run.by_type:
        header_row[0] = "Class"
    return _render(header_row, _rows(run, names, chosen, limit, ops, ops_only))


def _rows(run, names: list, chosen: list, limit: Optional[int], ops: int,
          ops_only: bool = False) -> list:
    """The rows; names longer than ``limit`` shortened (``ops_only``: op rows' only)."""
    labels = _labels(names, run.profile.root_label, None if ops_only else limit)
    rows = []
    for name in names:
        m = run.modules[name]
        rows.append([labels[name]] + [c.cell(run, name, m) for c in chosen[1:]])
        if ops:
            for row in _op_rows(run, name, m, chosen, ops):
                rows.append([_shortened(row[0], limit)] + row[1:])
    return rows


def _op_rows(run, name: str, m, chosen: list, ops: int) -> list:
    """The module's ``ops`` operators with the most flops (inclusive), under its row, as
    torch's table lists them: flops, MACs, their share and bytes; other cells blank."""
    indent = "· " * depth_of(name) + "↳ "  # tabulate strips leading spaces
    top = sorted(m.by_operator.items(), key=lambda item: (-item[1].flops, item[0]))[:ops]
    per_op = {"flops": lambda s: human(s.flops), "macs": lambda s: human(s.macs),
              "percent": lambda s: _percent(s.flops, run.total),
              "read": lambda s: human(s.bytes_read, "B"),
              "written": lambda s: human(s.bytes_written, "B")}
    return [[indent + printable(op)] + [per_op[c.key](stats) if c.key in per_op else ""
                             for c in chosen[1:]]
            for op, stats in top if stats.flops]


def _kernel_lines(counter, modules: dict) -> list:
    """Kernel timing's notes: the host-bound idle inside the outermost timed module (the
    device waiting on the host, charged to no op), and what the join found."""
    kernel_time = getattr(counter, "kernel_time", None)
    if kernel_time is None:
        return []
    lines = []
    idle = {n: m for n, m in modules.items() if m.idle_s is not None}
    if idle:
        name = min(idle, key=depth_of)  # the outermost module timed (the model)
        module = idle[name]
        span = counter.to_profile().module_facts.spans.get(name, 0) / 1e9
        label = counter.root_label if name == ROOT else name
        # spans are summed over every block, idle over the recorded ones only
        share = f" ({100.0 * module.idle_s / span:.0f} % of its span)" \
            if span and not kernel_time.reused_steps else \
            f" on the {kernel_time.measured_steps} recorded block(s)"
        lines.append(f"Idle (host-bound): {duration(module.idle_s)} inside {label}'s forward"
                     f"{share}: the device waiting on the host, charged to no op")
    lines.append(_kernel_time_line(kernel_time))
    return lines


def _kernel_time_line(kernel_time) -> str:
    """A ``KernelTime`` in one line."""
    line = (f"Kernel time: {duration(kernel_time.device_s)} recorded on "
            f"{kernel_time.measured_steps} block{'s' if kernel_time.measured_steps != 1 else ''}"
            f", {100.0 * kernel_time.attributed_share:.1f} % given to ops")
    if kernel_time.outside_s:
        line += f", {duration(kernel_time.outside_s)} launched outside aten ops"
    lost = kernel_time.dropped + kernel_time.unlinked
    if lost:
        line += f"; {lost} record{'s' if lost != 1 else ''} with no host launch found"
    if kernel_time.reused_steps:
        n = kernel_time.reused_steps
        line += f"; {n} block{'s' if n != 1 else ''} reused each op's time"
        if kernel_time.drifts:
            line += f" ({kernel_time.drifts} drifted and were measured again)"
    return line


def _footer(counter, by_phase, names: list, modules: dict, shown: set) -> list:
    """The notes that apply to the table as printed: a column's note only with its column,
    the model / hardware flops only where they differ."""
    lines = [coverage_line(counter.coverage())]
    if "own_flops" in shown:
        lines.append("By module class: FLOPs inclusive (a class inside another counts in "
                     "both, so they overlap); Own FLOPs, the ops its modules ran directly, sum "
                     "to the total")
    if counter.ranks:
        lines.append(f"Gathered from {len(counter.ranks)} ranks: counts summed over ranks")
    if getattr(counter, "steps", 1) > 1:  # a FlopCounter is one step
        lines.append(f"Merged from {counter.steps} steps: counts and times summed "
                     "(per_step() gives the mean step)")
    if "calls" in shown and counter.has_model and \
            any(not modules[n].calls for n in names if n != ROOT):
        lines.append(f"Calls {NEVER_CALLED}: a container never called itself (ModuleList); "
                     "its figures are its children's")
    if human(counter.hardware_flops()) != human(counter.model_flops()):
        passes = "forward + backward" if by_phase[BACKWARD].calls else "forward"
        lines.append(f"Model flops ({passes}): {human(counter.model_flops())}, "
                     f"hardware flops (all executed): {human(counter.hardware_flops())}")
    # the hardware-only share: dropout's (its ops' masked share: no mask tally charges them),
    # then masked pairs and a fused backward's recomputed q·kᵀ
    dropout = sum(stats.masked_flops for op, stats in counter.by_operator().items()
                  if op in DROPOUT_OPS)
    if counter.total.masked_flops - dropout:
        lines.append(f"Masked + recomputed attention work: "
                     f"{human(counter.total.masked_flops - dropout)} flops (FLOPs count them; "
                     "model flops and MFU do not)")
    if dropout:
        lines.append(f"Dropout (random mask, scale): {human(dropout)} flops (hardware work: "
                     "model flops leave it out, as in eval())")
    if OTHER in shown:
        lines.append("Other: ops run while none of the model's modules ran (a loss after the "
                     "model, gradient clipping) and their backward")
    graph_runs = counter.graph_runs
    if graph_runs:
        runs = sum(r for r, _, _ in graph_runs.values())
        line = f"Compiled graphs (torch.compile): {runs} run{'s' if runs != 1 else ''}"
        if counter.timing:
            forward = sum(f for _, f, _ in graph_runs.values())
            backward = sum(b for _, _, b in graph_runs.values())
            line += (f", timed whole: forward {duration(forward)}, backward "
                     f"{duration(backward)}, in the time of the module that ran them")
            if any(n in names for n in counter.in_graphs):
                line += (f"; Time {IN_GRAPH}: the module ran inside a compiled graph, whose "
                         "fused kernels have no per-module time (its counts are exact)")
        lines.append(line)
    if counter.timing:
        top = counter.top_ops_by_time(5)
        listed = ", ".join(f"{op} {duration(stats.latency_s or 0.0)}" for op, stats in top)
        lines.append(f"Top ops by time: {listed}")
        lines += _kernel_lines(counter, modules)
    estimated = counter.estimated_ops()
    if estimated:
        lines.append(f"Estimated ops (flops from the op's tag family): {_listed(estimated)}")
    outside = {op: stats for op, stats in counter.by_operator().items()
               if op.startswith(KERNEL_ROW_PREFIX)}
    if outside:
        n = len(outside)
        line = f"{n} kernel{'s' if n != 1 else ''} launched outside aten ops"
        total_s = counter.total.latency_s
        if total_s:
            share = sum(s.latency_s or 0.0 for s in outside.values()) / total_s
            line += f": {100.0 * share:.0f} % of GPU time"
        lines.append(line + f" (flops unknown; rows {KERNEL_ROW_PREFIX}<name>)")
    unsupported = counter.unsupported_ops()
    if unsupported:
        lines.append(f"Unsupported ops (bytes counted, flops unknown): {_listed(unsupported)}")
    else:
        lines.append("Unsupported ops: none")
    for error in counter.run.pricing_errors:
        lines.append(f"Not priced (its calls reported unsupported): {error}")
    unvalued = counter.run.unvalued_masks
    if unvalued:
        lines.append(f"Model flops keep every pair of {unvalued} attention call"
                     f"{'s' if unvalued != 1 else ''} whose mask has no values (meta or fake "
                     "tensors): padding not subtracted (docs/meta.md)")
    return lines


# the operators whose hardware-only share is dropout's (formulas/random.py; the engine's
# masks.dropout)
DROPOUT_OPS = frozenset(f"aten.{name}" for name in (
    "bernoulli_", "div_", "mul", "native_dropout", "native_dropout_backward", "_fused_dropout",
    "_masked_scale", "dropout", "dropout_", "feature_dropout", "feature_dropout_",
    "alpha_dropout", "alpha_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_"))


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
        + ")"
        # estimated and unsupported only when some op was (the footer lists them by name)
        + "".join(f", {label} {pair(lambda by, c=category: coverage.share(c, by))}"
                  for label, category in (("estimated", ESTIMATED),
                                          ("unsupported", UNSUPPORTED))
                  if coverage.calls.get(category))
    )
