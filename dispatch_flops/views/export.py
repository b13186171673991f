"""Exports of a Profile: CSV, a pandas DataFrame and a Chrome trace (JSON is the Profile's
own: ``Profile.to_json``/``from_json``).

Everything here is built from the Profile's plain data (``records()``, ``by_module()``) or,
for the trace, from the timeline it keeps (``Profile.trace``); nothing is counted or
formatted twice. Every file is written whole or not at all (a temporary file, then renamed).

>>> with FlopCounter(model, trace=True) as fc:
...     model(x).sum().backward()
>>> fc.to_json("run.json"); fc.to_csv("run.csv"); fc.to_chrome_trace("trace.json")
>>> Profile.from_json("run.json").table(depth=3)
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict

from dispatch_flops.results.schema import PathLike, write_text
from dispatch_flops.results.stats import (
    COUNTS,
    FORWARD,
    PHASES,
    PRICED,
    ROOT,
    Stats,
    depth_of,
)
from dispatch_flops.results.timeline import BLOCK, MODULE, OP, TraceEvent

_STATS = COUNTS + ("latency_s",)
# to_csv / to_dataframe: one row per module x phase x operator. The unprefixed counts are
# the module's inclusive ones (its children's ops too); exclusive_* only the ops it ran
# directly, so exclusive_* columns sum to the run's totals over all rows.
COLUMNS = (("module", "depth", "phase", "operator", "category") + _STATS
           + tuple(f"exclusive_{s}" for s in _STATS))


def _profile_of(run):
    """A Profile, or a counter's: every export takes either."""
    to_profile = getattr(run, "to_profile", None)
    return run if to_profile is None else to_profile()


# -- rows: CSV and pandas -------------------------------------------------------------------
def rows(profile) -> list[dict]:
    """One dict per module x phase x operator, keys ``COLUMNS``, in tree order."""
    profile = _profile_of(profile)
    own: dict[tuple, Stats] = defaultdict(Stats)
    categories: dict[str, set] = defaultdict(set)
    for r in profile.records():
        own[(r.module, r.phase, r.operator)] += r.stats
        categories[r.operator].add(r.category)
    phases = [p for p in PHASES if p in {phase for _, phase, _ in own}]
    out = []
    for phase in phases:
        for name, module in profile.by_module(phase=phase).items():
            for op, stats in module.by_operator.items():
                exclusive = own.get((name, phase, op), Stats())
                row = {"module": name, "depth": depth_of(name), "phase": str(phase),
                       "operator": op, "category": "|".join(sorted(categories[op]))}
                row.update({s: getattr(stats, s) for s in _STATS})
                row.update({f"exclusive_{s}": getattr(exclusive, s) for s in _STATS})
                out.append(row)
    return out


# A cell a spreadsheet reads as a formula (OWASP's CSV injection: one that starts with one of
# these) is written after a single quote, which spreadsheets show as text; a module named
# "=cmd|' /C calc'!A0" would otherwise run when the file is opened. Numbers stay numbers.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def spreadsheet_safe(cell):
    """``cell``, or, for a text a spreadsheet would read as a formula, the text after a
    single quote (a number, or a text that is one, is left as it is)."""
    if isinstance(cell, str) and cell.startswith(_FORMULA_STARTS) and \
            not _NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def write_csv(profile, path: PathLike) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
    writer.writeheader()
    # None (no timing) is written as an empty cell; names as spreadsheets read them safely
    writer.writerows({k: spreadsheet_safe(v) for k, v in row.items()} for row in rows(profile))
    write_text(path, buffer.getvalue())


def dataframe(profile):
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("to_dataframe needs pandas: pip install pandas (or, from a clone, "
                          "pip install -e '.[pandas]'; or write fc.to_csv(path))") from None
    return pd.DataFrame(rows(profile), columns=list(COLUMNS))


# -- Chrome trace ---------------------------------------------------------------------------
_PID = 1
_BLOCK_TID = 0
_COUNTS = PRICED


def _us(ns: int) -> float:
    return ns / 1000  # the format's unit; exact to the ns in the JSON text (see docs)


def _synthesized_modules(ops: list[TraceEvent]) -> list[TraceEvent]:
    """Module slices for a track without module hooks (backward, optimizer, recompute):
    at each depth, a run of consecutive ops under the same module is one slice, from the
    first op's start to the last op's end. Runs at depth d+1 split runs at depth d, so the
    slices nest."""
    out = []
    depth = max((len(e.stack) for e in ops), default=0)
    for level in range(depth):
        run: list[TraceEvent] = []
        for event in ops + [None]:
            key = event.stack[:level + 1] if event is not None and len(event.stack) > level \
                else None
            if run and key != run[0].stack[:level + 1]:
                first, last = run[0], run[-1]
                out.append(TraceEvent(MODULE, first.stack[level], first.phase,
                                      first.stack[:level + 1], first.start_ns, last.end_ns))
                run = []
            if event is not None and key is not None:
                run.append(event)
    return out


def chrome_trace(profile) -> dict:
    """The run's timeline as a Trace Event Format object (``{"traceEvents": [...]}``): one
    track per phase with its module and op slices ("X" events; ts/dur in µs), and a track
    with the whole block. Forward module slices are the hooks' call spans; other phases'
    are made from runs of consecutive ops (``args.synthesized``)."""
    profile = _profile_of(profile)
    if profile.trace is None:
        raise ValueError("no timeline was kept: count with FlopCounter(model, trace=True) "
                         "(or dispatch_flops.measure(..., trace=True))")
    events, dropped = profile.trace
    ops = [e for e in events if e.kind == OP]
    phases = [p for p in PHASES if p == FORWARD or any(e.phase == p for e in ops)]
    tid = {phase: i + 1 for i, phase in enumerate(phases)}
    tracks: dict[int, list[TraceEvent]] = defaultdict(list)
    for e in events:
        tracks[_BLOCK_TID if e.kind == BLOCK else tid[e.phase]].append(e)
    synthesized: set[int] = set()
    for phase in phases:
        if phase != FORWARD:
            made = _synthesized_modules([e for e in ops if e.phase == phase])
            synthesized.update(id(e) for e in made)
            tracks[tid[phase]].extend(made)
    label = profile.root_label
    out = [{"name": "process_name", "ph": "M", "pid": _PID, "tid": 0,
            "args": {"name": f"dispatch_flops: {label}"}}]
    for name, t in [("step", _BLOCK_TID)] + list(tid.items()):
        out.append({"name": "thread_name", "ph": "M", "pid": _PID, "tid": t,
                    "args": {"name": name}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": _PID, "tid": t,
                    "args": {"sort_index": t}})
    for t, track in sorted(tracks.items()):
        track.sort(key=lambda e: (e.start_ns, -e.end_ns, e.kind != MODULE))
        open_slices: list[tuple[TraceEvent, dict]] = []  # enclosing slices, outermost first
        for e in track:
            while open_slices and open_slices[-1][0].end_ns < e.end_ns:
                open_slices.pop()  # sorted by start: what ends before e ends cannot hold it
            args: dict = {}
            if e.kind == OP:
                args = {"module": e.stack[-1] if e.stack else ROOT, "overload": e.overload,
                        "category": e.category}
                args.update({c: getattr(e, c) for c in _COUNTS})
                for _, enclosing in open_slices:  # a module call's counts: its ops'
                    enclosing["ops"] += 1
                    for c in _COUNTS:
                        enclosing[c] += getattr(e, c)
            elif e.kind == BLOCK:  # on its own track: every op of the run
                args = {"ops": len(ops), **{c: sum(getattr(o, c) for o in ops) for c in _COUNTS}}
            else:
                args = {"ops": 0, **dict.fromkeys(_COUNTS, 0)}
                if e.kind == MODULE:
                    args["module"] = e.name
                    if id(e) in synthesized:
                        args["synthesized"] = "from the module's consecutive ops"
            name = label if e.kind == MODULE and e.name == ROOT else e.name
            out.append({"name": name, "cat": e.kind, "ph": "X", "ts": _us(e.start_ns),
                        "dur": _us(e.end_ns - e.start_ns), "pid": _PID, "tid": t,
                        "args": args})
            if e.kind != OP:
                open_slices.append((e, args))
    return {
        "traceEvents": out,
        "displayTimeUnit": "ns",
        "otherData": {"generator": "dispatch_flops", "model": label,
                      "dropped_events": dropped},
    }


def write_chrome_trace(profile, path: PathLike) -> None:
    write_text(path, json.dumps(chrome_trace(profile)))
