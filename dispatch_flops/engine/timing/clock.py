"""Latency: CUDA events for CUDA ops, ``time.perf_counter_ns`` for the rest.

The dispatch mode asks its runner to run an op (``run``) and gets back the op's output and a
token, then hands the token to ``add`` with the op record (see ``records``): ``add`` counts the
call and its time. ``Timer`` is the host clock alone, for processes without CUDA: the CPU hot
path. ``CudaTimer`` decides per op: an op with any CUDA tensor, or a ``device=`` naming CUDA (a
factory, a host-to-device copy), is a CUDA op on that device; any other op is timed by the host
clock. A CUDA op is bracketed by two events recorded on the current stream of *its* device,
taken from a per-device pool before the start record, so that nothing but the op sits between
the two records. Ops that launch no kernel (views) get no time.

Event pairs wait in one queue per stream. Every ``FOLD_EVERY`` pairs on a stream, the
completed ones at its front (``Event.query()``, which never waits) are folded into the records
and their events go back to the pool: a counter kept open for a whole run holds a bounded number
of events, and nothing inside the block synchronizes. ``resolve()``, when results are read,
synchronizes each device that still has pending events and folds the rest; a pair leaves its
queue only once its time is added, so a failed read can be read again.

Module spans and the block's wall time are ``mark``s: the host clock and one event per CUDA
device the timer has used, on that device's current stream; the block's end mark is recorded on
every stream the timer used, so that work on side streams falls inside the wall.

Inside CUDA graph capture no event is recorded (captured events cannot be queried): captured
ops are counted per replay (``engine.graphs.cuda_graphs``), with no time per op: a graph's replays
bypass dispatch (``timing="kernels"`` times them by their kernels).
"""

from __future__ import annotations

import threading
import warnings
from collections import deque
from time import perf_counter_ns
from typing import Any

import torch
from torch import Tensor

from dispatch_flops.engine.counting.skip import SKIP_FRAMES
from dispatch_flops.engine.torch_private import TorchDispatchMode
from dispatch_flops.engine.torch_private import cuda_current_stream as _cuda_current_stream

FOLD_EVERY = 64  # pairs queued on a stream between two looks at which have completed


class _Nothing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


_dispatch_warm = False


def warm_dispatch() -> None:
    """Where torch wraps our dispatch mode's ``__torch_dispatch__`` (see
    ``CountingMode._should_skip_dynamo``), its first call in a process imports
    ``torch._dynamo`` (about a second on a CPU). Pay that once, before any clock starts, not
    inside the first op's and module's latency."""
    global _dispatch_warm

    if not _dispatch_warm and SKIP_FRAMES is None:  # CountingMode._should_skip_dynamo
        with _Nothing():
            torch.empty(0)
    _dispatch_warm = True


class Timer:
    """Times ops and module spans with the host clock (``perf_counter_ns``); ``resolve()``
    has nothing to do. The runner of processes without CUDA: nothing but two clock reads and
    two additions per op."""

    cuda = False  # whether times may land after the block (events resolved later)
    # what ``run`` hands out: kernel ranges (``kineto.KernelTimer``) or times; a nested
    # counter can take its op times from a clock below only when both are of one kind
    kernel_tokens = False
    measures_idle = False  # ``idle_of`` reads the device's idle time inside module calls
    tracing = False  # keeps a timeline (``engine.timing.trace``)

    def __init__(self) -> None:
        warm_dispatch()

    def run(self, resolved, args, kwargs):
        """``(out, (start ns, end ns))``: the op's output and when it started and ended.
        ``resolved``: the mode's ``calls.Resolved`` for the op."""
        func = resolved.run
        start = perf_counter_ns()
        out = func(*args, **kwargs) if kwargs else func(*args)
        return out, (start, perf_counter_ns())

    def add(self, counts: list, index: int, token) -> None:
        """Count a call into the op record ``counts`` and add its time (``run``'s token) to
        ``counts[index]``."""
        counts[0] += 1  # CALLS (see records)
        counts[index] += token[1] - token[0]

    # -- module spans -----------------------------------------------------------------------
    def mark(self, block_end: bool = False):
        """A point in time for a module boundary (``block_end``: the block's end)."""
        return perf_counter_ns()

    def span(self, counts: list, index: int, start, end) -> None:
        """Add a module call's time, from two ``mark`` points (each used once), to
        ``counts[index]``."""
        counts[index] += end - start

    def resolve(self) -> None:
        """Land every pending time in its counts (nothing pends on the host clock)."""

    # -- what a timer knows beyond times (each timer says what it has: none here) ----------
    def close(self) -> None:
        """Stop recording without a block end (the block failed to begin)."""

    def facts(self) -> dict:
        """``RunFacts.kernels`` of this block (``resolve`` first): none measured."""
        return {}

    def idle_of(self, frame) -> int:
        """ns the device sat idle inside ``frame``'s module calls (``measures_idle``)."""
        return 0

    def outside_rows(self, frames, root: tuple) -> tuple:
        """Profile rows for the kernels no op launched (``kineto.KernelTimer``'s): none."""
        return ()

    def graph_replay(self, nodes: dict):
        """A CUDA graph replay's range to run in, for timers that time kernels: None."""
        return None

    def replayed(self, records) -> None:
        """A CUDA graph replay added to ``records`` (``engine.graphs.cuda_graphs``): a timer that
        learns or estimates kernel times per record notes them."""


def cuda_index(t: Tensor) -> int:
    """The CUDA device index of ``t``, -1 when it is not on CUDA (the tests' fake CUDA
    replaces this one function to make CPU tensors look like CUDA ones)."""
    return t.get_device() if t.is_cuda else -1


def op_device(args, kwargs) -> int:
    """The CUDA device an op runs on, -1 for none: a ``device=`` naming CUDA (a factory, a
    host-to-device copy), else the first CUDA tensor among the arguments (one list deep) and
    keyword arguments (a device-to-host copy runs on its source's device)."""
    if kwargs:
        device = kwargs.get("device")
        if device is not None:
            device = torch.device(device)
            if device.type == "cuda":
                return device.index if device.index is not None else \
                    torch.cuda.current_device()
        args = (*args, *kwargs.values())
    for a in args:
        if isinstance(a, Tensor):
            index = cuda_index(a)
            if index >= 0:
                return index
        elif (a.__class__ is list or a.__class__ is tuple) and a:
            for x in a:
                if isinstance(x, Tensor):
                    index = cuda_index(x)
                    if index >= 0:
                        return index
    return -1


class _Stream:
    """One CUDA stream's queue of recorded event pairs, oldest first, and its device's pool
    of free events."""

    __slots__ = ("stream", "device", "pool", "pending", "since_fold")

    def __init__(self, stream, device: int, pool: list) -> None:
        self.stream = stream
        self.device = device
        self.pool = pool
        self.pending: deque = deque()
        self.since_fold = 0


class _Pair:
    """One CUDA op's events; its ns once folded. ``targets``: the (counts, index) its time is
    added to (more than one when counters are nested); ``anchor``: a tracing timer's (host
    ns, event) on the device, to place it on the host clock (``at``)."""

    __slots__ = ("start", "end", "stream", "ns", "targets", "anchor", "at")

    def __init__(self, start, end, stream: _Stream) -> None:
        self.start = start
        self.end = end
        self.stream = stream
        self.ns = None
        self.targets = None
        self.anchor = None
        self.at = None


class _Mark:
    """A module boundary: host ns, and ``(stream, event)`` per CUDA device in use; ``at``:
    where it sits on the host clock, worked out when its span is folded (traces)."""

    __slots__ = ("ns", "events", "block_end", "at")

    def __init__(self, ns: int, events: list, block_end: bool) -> None:
        self.ns = ns
        self.events = events
        self.block_end = block_end
        self.at = ns


class _CudaState:
    """Process-wide: every stream's queue (keyed by ``torch._C._cuda_getCurrentStream``'s
    answer) and each device's event pool, shared by all timers so that nested counters can
    share an op's pair; one lock for what device threads may do at once."""

    def __init__(self) -> None:
        self.streams: dict = {}
        self.pools: dict[int, list] = {}
        self.lock = threading.RLock()


_STATE = _CudaState()

_CAPTURE_WARNING = (
    "dispatch_flops: ops captured into a CUDA graph are counted at each replay, not at "
    "capture; with timing=True replays are not timed per op (the block's wall time includes "
    "them): timing=\"kernels\" times them by their kernels")


def _event(pool: list):
    try:
        return pool.pop()
    except IndexError:
        return torch.cuda.Event(enable_timing=True)


def _ns(start, end) -> int:
    return round(start.elapsed_time(end) * 1e6)  # ms -> ns


class CudaTimer(Timer):
    """Times each CUDA op with two pooled CUDA events on its own device's current stream, and
    every other op with the host clock (see the module's docstring)."""

    cuda = True

    def __init__(self, devices=()) -> None:
        super().__init__()
        self._streams: dict = {}  # stream key -> _Stream: the streams this timer recorded on
        self._anchors: dict[int, tuple] = {}  # device -> (host ns, event): first on each device
        self._spans: deque = deque()  # (counts, index, start mark, end mark), oldest first
        self.tracing = False  # traces set it: fold works out where marks and pairs sit
        self.captured = 0  # ops seen inside CUDA graph capture (counted, not timed)
        for device in devices:
            self._stream_of(device)

    def _stream_of(self, device: int) -> _Stream:
        """The calling thread's current stream on ``device``: one C call and a dict lookup
        (``torch.cuda.current_stream`` builds a Stream in Python: microseconds)."""
        key = _cuda_current_stream(device)
        stream = self._streams.get(key)
        if stream is None:
            state = _STATE
            with state.lock:
                stream = state.streams.get(key)
                if stream is None:
                    pool = state.pools.setdefault(device, [])
                    stream = state.streams[key] = _Stream(
                        torch.cuda.current_stream(device), device, pool)
            self._streams[key] = stream
            if device not in self._anchors:
                anchor = torch.cuda.Event(enable_timing=True)
                self._anchors[device] = (perf_counter_ns(), anchor)
                anchor.record(stream.stream)
        return stream

    def _capturing(self) -> bool:
        if not torch.cuda.is_current_stream_capturing():
            return False
        if not self.captured:
            warnings.warn(_CAPTURE_WARNING, stacklevel=4)
        self.captured += 1
        return True

    def run(self, resolved, args, kwargs):
        """``(out, token)``: the host clock's ``(start ns, end ns)`` for an op on no CUDA
        device, a ``_Pair`` of recorded events for a CUDA op, None for a CUDA op that launches
        no kernel or runs under graph capture."""
        func = resolved.run
        device = op_device(args, kwargs)
        if device < 0:
            start = perf_counter_ns()
            out = func(*args, **kwargs) if kwargs else func(*args)
            return out, (start, perf_counter_ns())
        if resolved.view or self._capturing():
            return (func(*args, **kwargs) if kwargs else func(*args)), None
        stream = self._stream_of(device)
        pool, on = stream.pool, stream.stream
        start, end = _event(pool), _event(pool)
        start.record(on)
        out = func(*args, **kwargs) if kwargs else func(*args)
        end.record(on)
        pair = _Pair(start, end, stream)
        stream.pending.append(pair)
        return out, pair

    def add(self, counts: list, index: int, token) -> None:
        with _STATE.lock:  # device threads may count into one record at once
            counts[0] += 1  # CALLS (see records)
            if token is None:
                return
            if token.__class__ is tuple:
                counts[index] += token[1] - token[0]
                return
            if token.ns is not None:  # folded already
                counts[index] += token.ns
                return
            if token.targets is None:
                token.targets = [(counts, index)]
            else:
                token.targets.append((counts, index))
            stream = token.stream
            stream.since_fold += 1
            if stream.since_fold >= FOLD_EVERY:
                stream.since_fold = 0
                _fold(stream)

    # -- module spans -----------------------------------------------------------------------
    def mark(self, block_end: bool = False):
        ns = perf_counter_ns()
        if not self._anchors or torch.cuda.is_current_stream_capturing():
            return _Mark(ns, [], block_end)
        events = []
        for device in list(self._anchors):
            stream = self._stream_of(device)
            event = _event(stream.pool)
            event.record(stream.stream)
            events.append((stream, event))
            if block_end:  # the wall ends when every stream used has done its work
                for other in list(self._streams.values()):
                    if other.device == device and other is not stream:
                        event = _event(other.pool)
                        event.record(other.stream)
                        events.append((other, event))
        return _Mark(ns, events, block_end)

    def span(self, counts: list, index: int, start, end) -> None:
        with _STATE.lock:
            self._spans.append((counts, index, start, end))
            if len(self._spans) >= FOLD_EVERY:
                self._fold_spans()

    def _span_ns(self, start: _Mark, end: _Mark) -> int:
        """A span's ns: on the device whose events say it took longest, from its start mark's
        event (the block's end: else the timer's first event on the device); the host clock's
        where the marks share no device."""
        starts = {stream.device: event for stream, event in start.events}
        longest = None
        for stream, event in end.events:
            first = starts.get(stream.device)
            if first is None and end.block_end:
                first = self._anchors[stream.device][1]
            if first is not None:
                ns = _ns(first, event)
                if longest is None or ns > longest:
                    longest = ns
        return end.ns - start.ns if longest is None else longest

    def _place(self, mark: _Mark) -> int:
        for stream, event in mark.events:
            at, anchor = self._anchors[stream.device]
            return at + _ns(anchor, event)
        return mark.ns

    def _fold_spans(self) -> None:
        """Add the completed spans at the front of the queue (each mark is used once: its
        events go back to the pool)."""
        spans = self._spans
        while spans:
            counts, index, start, end = spans[0]
            if not all(event.query() for _, event in (*start.events, *end.events)):
                return
            ns = self._span_ns(start, end)  # may raise: the span stays queued
            if self.tracing:
                start_at, end_at = self._place(start), self._place(end)
                start.at, end.at = start_at, end_at
            spans.popleft()
            counts[index] += ns
            for mark in (start, end):
                for stream, event in mark.events:
                    stream.pool.append(event)
                mark.events = []

    def anchor(self, device: int) -> tuple:
        """(host ns, event): this timer's first event on ``device``."""
        return self._anchors[device]

    def resolve(self) -> None:
        """Synchronize every device with pending events, then fold them all."""
        state = _STATE
        with state.lock:
            devices = {s.device for s in state.streams.values() if s.pending}
            for _, _, start, end in self._spans:
                devices.update(stream.device for stream, _ in (*start.events, *end.events))
        for device in sorted(devices):
            torch.cuda.synchronize(device)
        with state.lock:
            for stream in list(state.streams.values()):
                _fold(stream)
            self._fold_spans()


def _fold(stream: _Stream) -> None:
    """Add the completed pairs at the front of ``stream``'s queue to their targets and give
    their events back to the pool. A pair leaves the queue only after its time is worked out:
    if ``elapsed_time`` raises, nothing was added and the next fold tries it again."""
    pending, pool = stream.pending, stream.pool
    while pending:
        pair = pending[0]
        if not pair.end.query():
            return
        ns = _ns(pair.start, pair.end)
        at = None
        if pair.anchor is not None:
            at = pair.anchor[0] + _ns(pair.anchor[1], pair.start)
        pending.popleft()
        pair.ns, pair.at = ns, at
        if pair.targets is not None:
            for counts, index in pair.targets:
                counts[index] += ns
            pair.targets = None
        pool.append(pair.start)
        pool.append(pair.end)
        pair.start = pair.end = pair.anchor = None


# -- nested counters ---------------------------------------------------------------------------

_relayed = threading.local()  # .token: the token of the op the bottom counting mode just ran


class Relay:
    """The runner of the bottom counting mode on the dispatch stack while a timed counter is
    nested above it: it times each op (with ``clock``, a timer of its own) and leaves the token
    where the modes above read it (``Relayed``), so that their op times are the op's alone,
    not the counting work of the modes below. ``runner``: the mode's own (None, a timer)."""

    def __init__(self, runner, clock: Timer, mode: Any = None) -> None:
        self.runner = runner
        self._clock = clock
        self.mode = mode  # the counting mode whose runner this relay took the place of

    @property
    def clock(self):
        """What times the op: the runner it wraps (which ``unwrap_runner`` may replace, as a
        capture's annotation ends), else its own clock."""
        return self.runner if self.runner is not None else self._clock

    def run(self, resolved, args, kwargs):
        out, token = self.clock.run(resolved, args, kwargs)
        _relayed.token = token
        return out, token

    def add(self, counts: list, index: int, token) -> None:
        if self.runner is None:
            counts[0] += 1  # CALLS: the mode was not timing
        else:
            self.runner.add(counts, index, token)


class Relayed:
    """The runner of a timed counter nested above another counter: runs the op without a
    clock of its own and takes the bottom mode's token (``Relay``)."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer

    def run(self, resolved, args, kwargs):
        relayed = _relayed
        relayed.token = None
        func = resolved.run
        out = func(*args, **kwargs) if kwargs else func(*args)
        return out, relayed.token

    def add(self, counts: list, index: int, token) -> None:
        if token is None:  # the op never reached the mode below
            counts[0] += 1
        else:
            self.timer.add(counts, index, token)
