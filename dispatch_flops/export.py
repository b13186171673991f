"""Exports: JSON (and back), CSV, a pandas DataFrame and a Chrome trace.

Everything here is built from the counter's own plain data (``to_dict()``, ``records()``,
``by_module()``) or, for the trace, from its timeline (``_trace.trace_events``); nothing is
counted or formatted twice. ``FlopCounter.to_json``/``from_json``/``to_csv``/
``to_dataframe``/``to_chrome_trace`` call these.

>>> with FlopCounter(model, trace=True) as fc:
...     model(x).sum().backward()
>>> fc.to_json("run.json"); fc.to_csv("run.csv"); fc.to_chrome_trace("trace.json")
>>> FlopCounter.from_json("run.json").table(depth=3)
"""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from typing import Union

from ._results import FORWARD, PHASES, ROOT, Stats
from ._trace import BLOCK, MODULE, OP, TraceEvent, trace_events

PathLike = Union[str, "os.PathLike[str]"]

_STATS = ("calls", "flops", "macs", "bytes_read", "bytes_written", "latency_s")
# to_csv / to_dataframe: one row per module x phase x operator. The unprefixed counts are
# the module's inclusive ones (its children's ops too); exclusive_* only the ops it ran
# directly, so exclusive_* columns sum to the run's totals over all rows.
COLUMNS = (("module", "depth", "phase", "operator", "category") + _STATS
           + tuple(f"exclusive_{s}" for s in _STATS))


# -- JSON -----------------------------------------------------------------------------------
def write_json(counter, path: PathLike) -> None:
    with open(path, "w") as f:
        json.dump(counter.to_dict(), f, indent=1)
        f.write("\n")


def read_json(path: PathLike):
    """A ``LoadedFlopCounter`` from a file ``write_json`` wrote."""
    from ._stored import LoadedFlopCounter

    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{os.fspath(path)} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{os.fspath(path)} is not a dispatch_flops run: write one with "
                         "fc.to_json(path)")
    return LoadedFlopCounter(data, source=os.fspath(path))


# -- rows: CSV and pandas -------------------------------------------------------------------
def _depth(name: str) -> int:
    return 0 if name == ROOT else name.count(".") + 1


def rows(counter) -> list[dict]:
    """One dict per module x phase x operator, keys ``COLUMNS``, in tree order."""
    own: dict[tuple, Stats] = defaultdict(Stats)
    categories: dict[str, set] = defaultdict(set)
    for r in counter.records():
        own[(r.module, r.phase, r.operator)] += r.stats
        categories[r.operator].add(r.category)
    phases = [p for p in PHASES if p in {phase for _, phase, _ in own}]
    out = []
    for phase in phases:
        for name, module in counter.by_module(phase=phase).items():
            for op, stats in module.by_operator.items():
                exclusive = own.get((name, phase, op), Stats())
                row = {"module": name, "depth": _depth(name), "phase": phase, "operator": op,
                       "category": "|".join(sorted(categories[op]))}
                row.update({s: getattr(stats, s) for s in _STATS})
                row.update({f"exclusive_{s}": getattr(exclusive, s) for s in _STATS})
                out.append(row)
    return out


def write_csv(counter, path: PathLike) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows(counter))  # None (no timing) is written as an empty cell


def dataframe(counter):
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("to_dataframe needs pandas: pip install 'dispatch_flops[pandas]' "
                          "(or write fc.to_csv(path))") from None
    return pd.DataFrame(rows(counter), columns=list(COLUMNS))


# -- Chrome trace ---------------------------------------------------------------------------
_PID = 1
_BLOCK_TID = 0
_COUNTS = ("flops", "macs", "bytes_read", "bytes_written")


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
            if key is not None:
                run.append(event)
    return out


def chrome_trace(counter) -> dict:
    """The run's timeline as a Trace Event Format object (``{"traceEvents": [...]}``): one
    track per phase with its module and op slices ("X" events; ts/dur in µs), and a track
    with the whole block. Forward module slices are the hooks' call spans; other phases'
    are made from runs of consecutive ops (``args.synthesized``)."""
    events, dropped = trace_events(counter)
    ops = [e for e in events if e.kind == OP]
    phases = [p for p in PHASES if p == FORWARD or any(e.phase == p for e in ops)]
    tid = {phase: i + 1 for i, phase in enumerate(phases)}
    tracks: dict[int, list[TraceEvent]] = defaultdict(list)
    for e in events:
        tracks[_BLOCK_TID if e.kind == BLOCK else tid[e.phase]].append(e)
    synthesized = set()
    for phase in phases:
        if phase != FORWARD:
            made = _synthesized_modules([e for e in ops if e.phase == phase])
            synthesized.update(id(e) for e in made)
            tracks[tid[phase]].extend(made)
    label = counter.root_label
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


def write_chrome_trace(counter, path: PathLike) -> None:
    trace = chrome_trace(counter)
    with open(path, "w") as f:
        json.dump(trace, f)
