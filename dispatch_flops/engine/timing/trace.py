"""A timeline of the run, for ``FlopCounter(model, trace=True)``: every op's and module
call's start and end, not only their summed time.

``TracingTimer`` (``CudaTracingTimer``) is a ``Timer`` (``CudaTimer``) that also notes, for
each op, the op record it was counted into (see ``records``; the dispatch mode hands it to
``add``) and, for each module call, the frame's span list. The dispatch mode and the hooks
are the same as with plain timing; what an event means (op, module, phase, signature) is
worked out only when the trace is read, by finding which frame and phase each noted list
belongs to. Formulas are priced then too, once per signature, as ``records()`` does.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Optional

from typing_extensions import TypeGuard

from dispatch_flops.engine.counting.records import (
    SIGNATURE,
    PricingError,
    bytes_only,
)
from dispatch_flops.engine.timing.clock import CudaTimer, Timer
from dispatch_flops.results.stats import FORWARD, PHASES, PRICED
from dispatch_flops.results.timeline import BLOCK, MODULE, OP, TraceEvent

TRACE_LIMIT = 200_000  # events kept per counter (op calls + module calls); later ones dropped


class _Tracing(Timer):
    """Times like its timer and keeps ``(record, start, end)`` per op call and ``(span list,
    start, end)`` per module call, up to ``limit`` events. A CUDA op's
    start is its event pair (``end`` None): where it sits is worked out when the pair is
    folded, and its events go back to the pool; an op with no time (a view on CUDA, graph
    capture) is left out. Mixed in before the timer it traces (``Timer`` or ``CudaTimer``):
    ``super()`` is that timer."""

    tracing = True

    def _start_trace(self, limit: Optional[int]) -> None:
        self.limit = TRACE_LIMIT if limit is None else limit
        self.events: list[tuple] = []
        self.dropped = 0
        self.origin_ns = perf_counter_ns()

    def add(self, counts: list, index: int, token) -> None:
        if token is None:
            super().add(counts, index, token)
            return
        if len(self.events) < self.limit:
            if token.__class__ is tuple:
                start, end = token
            else:  # a CUDA pair: placed on the host clock from this timer's anchor event
                assert isinstance(self, CudaTimer)  # only a CUDA timer hands out pairs
                if token.anchor is None:
                    self._stream_of(token.stream.device)  # an anchor on its device
                    token.anchor = self.anchor(token.stream.device)
                start, end = token, None
            self.events.append((counts, start, end))
        else:
            self.dropped += 1
        super().add(counts, index, token)

    def span(self, counts: list, index: int, start, end) -> None:
        super().span(counts, index, start, end)
        if len(self.events) < self.limit:
            self.events.append((counts, start, end))
        else:
            self.dropped += 1

    def bounds(self, start, end) -> tuple[int, int]:
        """``(start ns, end ns)`` since this timer was made, of an op's or module call's two
        points (ns on the host clock, CUDA marks, or an op's CUDA pair with ``end`` None). CPU
        and CUDA points share the origin but not the clock: a CUDA point is placed from the
        timer's first event on its device, taken to run when the host recorded it."""
        origin = self.origin_ns
        if start.__class__ is int:
            return start - origin, end - origin
        if end is None:  # a folded pair
            return start.at - origin, start.at + start.ns - origin
        return start.at - origin, end.at - origin


class TracingTimer(_Tracing, Timer):
    """``Timer`` (the host clock) with a timeline (``_Tracing``)."""

    def __init__(self, limit: Optional[int] = None) -> None:
        super().__init__()
        self._start_trace(limit)


class CudaTracingTimer(_Tracing, CudaTimer):
    """``CudaTimer`` with a timeline (``_Tracing``)."""

    def __init__(self, devices=(), limit: Optional[int] = None) -> None:
        super().__init__(devices)
        self._start_trace(limit)


def is_tracing(timer: object) -> TypeGuard[_Tracing]:
    return isinstance(timer, _Tracing)


def trace_events(timer: _Tracing, ledger, resolutions: dict, label: str
                 ) -> tuple[list[TraceEvent], int]:
    """``(events in time order, events dropped past the limit)`` of a finished counter's
    ``timer``, counted into ``ledger`` with op ``resolutions``; ``label`` names the block."""
    timer.resolve()
    owner: dict[int, tuple] = {}  # id of a record or span list -> (frame, phase, key)
    for frame in ledger.frames:
        owner[id(frame.span)] = (frame, FORWARD, None)
        for phase, acc in zip(PHASES, frame.acc):
            for key, rec in acc.items():
                owner[id(rec)] = (frame, phase, key)
    names: dict[int, tuple] = {}  # op key -> (operator, overload, category)
    zero = (0,) * len(PRICED)
    events = []
    for event in timer.events:
        rec = event[0]
        if event[2] is None and event[1].at is None:  # a pair that could not be placed
            continue
        start, end = timer.bounds(event[1], event[2])
        found = owner.get(id(rec))
        if found is None:  # the block's own span
            events.append(TraceEvent(BLOCK, label, FORWARD, (), start, end))
            continue
        frame, phase, key = found
        if key is None:  # a module call's span list
            events.append(TraceEvent(MODULE, frame.name, FORWARD, frame.stack, start, end))
            continue
        op = key if key.__class__ is int else key[0]
        resolved = resolutions[op]
        unit = zero
        if rec[SIGNATURE] is not None:  # every call of a signature counts the same
            try:
                unit = rec[SIGNATURE].unit(resolved)
            except PricingError:  # reported unsupported in the Profile: flops unknown
                unit = bytes_only(rec[SIGNATURE])
        named = names.get(op)
        if named is None:
            func = resolved.func
            named = names[op] = (str(func.overloadpacket), str(func),
                                 str(resolved.category))
        events.append(TraceEvent(OP, named[0], phase, frame.stack, start, end, named[1],
                                 named[2], **dict(zip(PRICED, unit))))
    events.sort(key=lambda e: (e.start_ns, -e.end_ns))
    return events, timer.dropped
