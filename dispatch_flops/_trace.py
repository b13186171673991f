"""A timeline of the run, for ``FlopCounter(model, trace=True)``: every op's and module
call's start and end, not only their summed time.

``TracingTimer`` is a ``Timer`` that also notes, for each op, the accumulator it was counted
into (the ``[calls, flops, macs, read, written, ns, entry]`` list the dispatch mode hands to
``add``) and, for each module call, the frame's span list. The dispatch mode and the hooks
are the same as with plain timing; what an event means (op, module, phase, signature) is
worked out only when the trace is read, by finding which frame and phase each noted list
belongs to. Formulas are priced then too, once per signature, as ``records()`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter_ns
from typing import Optional
import torch

from ._results import FORWARD
from ._timing import Timer

TRACE_LIMIT = 200_000  # events kept per counter (op calls + module calls); later ones dropped

OP = "op"  # one op call
MODULE = "module"  # one forward call of a module, hook to hook
BLOCK = "block"  # the whole ``with`` block


class TracingTimer(Timer):
    """Times like ``Timer`` and keeps ``(counts, start, end, flops, macs, read, written)`` per
    op call (the counts list's running totals at that moment, to tell this call's share)
    and ``(counts, start, end)`` per span, up to ``limit`` events."""

    def __init__(self, limit: Optional[int] = None) -> None:
        super().__init__()
        self.limit = TRACE_LIMIT if limit is None else limit
        self.events: list[tuple] = []
        self.dropped = 0
        self.origin_ns = perf_counter_ns()
        self.origin_event = self._event() if self.cuda else None

    def add(self, counts: list, index: int, token) -> None:
        super().add(counts, index, token)
        if len(self.events) < self.limit:
            start, end = token
            self.events.append((counts, start, end, counts[1], counts[2], counts[3], counts[4]))
        else:
            self.dropped += 1

    def span(self, counts: list, index: int, start, end) -> None:
        super().span(counts, index, start, end)
        if len(self.events) < self.limit:
            self.events.append((counts, start, end))
        else:
            self.dropped += 1

    def ns(self, point) -> int:
        """A time point (ns or a recorded CUDA event) as ns since this timer was made. CPU
        and CUDA points share the origin but not the clock: on a CUDA run, ops on CPU tensors
        are placed by the host's clock."""
        if point.__class__ is int:
            return point - self.origin_ns
        return round(self.origin_event.elapsed_time(point) * 1e6)  # ms -> ns


@dataclass(frozen=True)
class TraceEvent:
    """One slice of the timeline. ``start_ns``/``end_ns`` count from the counter's entry.
    Op events carry that one call's counts; module and block events carry zeros (the trace
    writer sums the ops inside them)."""

    kind: str  # OP, MODULE or BLOCK
    name: str  # operator packet ("aten.mm"), module name, or the root label for a block
    phase: str
    stack: tuple  # running module stack, root first
    start_ns: int
    end_ns: int
    overload: str = ""
    category: str = ""
    flops: int = 0
    macs: int = 0
    bytes_read: int = 0
    bytes_written: int = 0


def trace_events(counter) -> tuple[list[TraceEvent], int]:
    """``(events in time order, events dropped past the limit)`` of a finished counter that
    ran with ``trace=True``."""
    timer = counter._timer
    if not isinstance(timer, TracingTimer):
        raise ValueError("no timeline was kept: count with FlopCounter(model, trace=True) "
                         "(or dispatch_flops.profile(..., trace=True))")
    if counter._active:
        raise ValueError("the trace is read after the with block")
    from .counter import _CATEGORY_NAME

    timer.resolve()
    if timer.cuda:
        torch.cuda.synchronize()
    mode, tracker = counter._mode, counter._tracker
    owner: dict[int, tuple] = {}  # id of a counts list -> (frame, phase, key)
    for frame in tracker.frames():
        owner[id(frame.span)] = (frame, FORWARD, None)
        for phase, acc in frame.accumulators():
            for key, counts in acc.items():
                owner[id(counts)] = (frame, phase, key)
    costs: dict[tuple, object] = {}
    seen: dict[int, tuple] = {}  # running totals of each counts list at its last event
    names: dict[int, tuple] = {}  # op key -> (operator, overload, category)
    events = []
    for event in timer.events:
        counts, start, end = event[0], timer.ns(event[1]), timer.ns(event[2])
        found = owner.get(id(counts))
        if found is None:  # the block's own span
            events.append(TraceEvent(BLOCK, counter.root_label, FORWARD, (), start, end))
            continue
        frame, phase, key = found
        if len(event) == 3:
            events.append(TraceEvent(MODULE, frame.name, FORWARD, frame.stack, start, end))
            continue
        totals = event[3:]
        before = seen.get(id(counts), (0, 0, 0, 0))
        seen[id(counts)] = totals
        flops, macs, read, written = (now - then for now, then in zip(totals, before))
        op_key = key
        entry = counts[6]
        if entry is not None:  # counted by signature: priced here, once per signature; the
            # record keeps no running flops or bytes, each call moves its entry's
            cost = costs.get(key)
            if cost is None:
                cost = costs[key] = mode.cost(key[0], entry)
            flops, macs, op_key = cost.flops, cost.macs, key[0]
            read, written = entry[1], entry[2]
        named = names.get(op_key)
        if named is None:
            func = mode.op(op_key)
            named = names[op_key] = (str(func.overloadpacket), str(func),
                                     _CATEGORY_NAME[mode.category(op_key)])
        events.append(TraceEvent(OP, named[0], phase, frame.stack, start, end, named[1],
                                 named[2], flops, macs, read, written))
    events.sort(key=lambda e: (e.start_ns, -e.end_ns))
    return events, timer.dropped
