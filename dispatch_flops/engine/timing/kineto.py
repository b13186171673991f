"""Kernel timing on CUDA: ``FlopCounter(timing="kernels")`` gives each op the time of the
kernels it launched, recorded by Kineto (CUPTI), and joined by ``engine.timing.kernels``.

``KernelTimer`` is the counting mode's runner: it opens a ``df:op:<token>`` range around each
op it runs (``_RecordFunctionFast``: a RecordFunction, no dispatcher op, so no mode sees it),
marks module boundaries with ``df:mark:<id>`` instants, and records the block with a
``KinetoSession`` (Kineto with CPU and CUDA activities: the CPU half carries the ids the join
needs). The session stops when the block ends (its end mark: Kineto synchronizes the devices
then); ``resolve()`` joins and adds each op's kernel time to its record and each module call's
device span to its frame. Kernels no op launched become rows of their own (``outside_rows``).

Where Kineto cannot record (no Kineto or no CUPTI in this torch, or another profiler already
running: CUPTI takes one subscriber), ``kernel_timer`` says so once and falls back to CUDA
events at module boundaries only (``ModuleEventTimer``): ops get no time rather than an event
pair's, which times the stream, not the kernel.

Nothing here runs on a machine without a GPU but the parts the tests drive: the session with
CPU activity only, fed a synthetic GPU half (tests/kineto_traces.py). What is proven on real
GPUs: the join and the records' shape, on six traces recorded on H100, MI300X, A100 and B200
(tests/test_real_traces.py, docs/traces.md). What is not yet: this session itself, live on a
GPU (starting, stopping, its records' ids as our ranges and marks get them);
``benchmarks/gpu_check.py`` checks it there.
"""

from __future__ import annotations

import warnings
from contextlib import suppress
from time import perf_counter_ns
from typing import Callable, Optional
from weakref import WeakKeyDictionary, WeakSet

import torch

from dispatch_flops.engine.counting.records import CALLS, NS, SIGNATURE
from dispatch_flops.engine.timing.clock import CudaTimer, Timer, op_device
from dispatch_flops.engine.timing.kernels import (
    GRAPH_PREFIX,
    MARK_PREFIX,
    OP_PREFIX,
    KernelJoin,
    Sampler,
    from_kineto,
    join,
)
from dispatch_flops.engine.torch_private import lookup
from dispatch_flops.results.rows import KERNEL_ROW_PREFIX, ROW, RowKey
from dispatch_flops.results.stats import UNSUPPORTED, Phase

_RecordFunctionFast = lookup("torch._C._profiler._RecordFunctionFast")
# Kineto without torch.profiler's post-processing (a profile object only holds the config)
_KINETO_APIS = ("torch.autograd.profiler._prepare_profiler",
                "torch.autograd.profiler._enable_profiler",
                "torch.autograd.profiler._disable_profiler", "torch.autograd._profiler_enabled")


def _fast_range(name: str):
    return _RecordFunctionFast(name)


class KinetoSession:
    """Kineto recording CPU and (when ``cuda``) CUDA activities, without torch.profiler's
    post-processing: ``stop()`` gives ``(host events, device activities)``."""

    def __init__(self, cuda: bool = True) -> None:
        from torch.autograd.profiler import profile

        # a config holder only (never entered): its config() matches this torch's signature
        self._profile = profile(use_device="cuda" if cuda else None, use_cpu=True)
        self.cuda = cuda

    def start(self) -> None:
        p = self._profile
        lookup("torch.autograd.profiler._prepare_profiler")(p.config(), p.kineto_activities)
        try:
            lookup("torch.autograd.profiler._enable_profiler")(p.config(), p.kineto_activities)
        except BaseException:  # leave no half-started session to the user's profilers
            with suppress(Exception):
                if lookup("torch.autograd._profiler_enabled")():
                    lookup("torch.autograd.profiler._disable_profiler")()
            raise

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def stop(self) -> tuple:
        self.synchronize()  # every kernel of the block done before CUPTI flushes
        return from_kineto(lookup("torch.autograd.profiler._disable_profiler")().events())


class _Point:
    __slots__ = ("id", "ns", "block_end")

    def __init__(self, id: int, ns: int, block_end: bool) -> None:
        self.id, self.ns, self.block_end = id, ns, block_end


class KernelTimer(Timer):
    """Each op's time is the sum of the kernels it launched (see the module's docstring)."""

    cuda = True  # times land when results are read
    estimated = False  # EstimatingTimer's: op times reused from a sampled block
    kernel_tokens = True
    measures_idle = True

    def __init__(self, session=None, sampler: Optional[Sampler] = None) -> None:
        super().__init__()
        self.session = session if session is not None else KinetoSession()
        self.sampler = sampler  # learns each signature's kernel time from this block
        self._records: dict = {}  # id -> (counts, index): every record counted into
        self._targets: list = []  # token -> [(counts, index)] the op's time goes to
        self._spans: list = []  # (counts, index, start point, end point) per module call
        self._marks = 0
        self._replays: list = []  # per CUDA graph replay: {graph node tools id: op token}
        self._events: Optional[tuple] = None
        self.found: Optional[KernelJoin] = None
        self.failure: Optional[str] = None  # why this block got no kernel times
        self._idle: dict[int, int] = {}  # id of a span list -> idle ns inside its calls
        self._early = False  # read inside the block (said once)
        self.session.start()
        self._recording = True
        _RECORDING.add(self)

    def run(self, resolved, args, kwargs):
        func = resolved.run
        token = len(self._targets)
        self._targets.append(None)
        if not self._recording:  # after the block's end (results read inside it)
            return (func(*args, **kwargs) if kwargs else func(*args)), None
        with _fast_range(f"{OP_PREFIX}{token}"):
            out = func(*args, **kwargs) if kwargs else func(*args)
        return out, token

    def add(self, counts: list, index: int, token) -> None:
        counts[0] += 1  # CALLS (see records)
        self._records[id(counts)] = (counts, index)
        if token is None:
            return
        targets = self._targets[token]
        if targets is None:
            self._targets[token] = [(counts, index)]
        else:  # nested counters share the op
            targets.append((counts, index))

    def mark(self, block_end: bool = False):
        point = _Point(self._marks, perf_counter_ns(), block_end)
        self._marks += 1
        if self._recording:
            fast = _fast_range(f"{MARK_PREFIX}{point.id}")
            fast.__enter__()
            fast.__exit__(None, None, None)
            if block_end:  # the wall ends when the kernels do, before Kineto's own stop
                synchronize = getattr(self.session, "synchronize", None)
                if synchronize is not None:
                    synchronize()
                point.ns = perf_counter_ns()
                self._stop()
        return point

    def span(self, counts: list, index: int, start, end) -> None:
        self._spans.append((counts, index, start, end))

    def graph_replay(self, nodes: dict):
        """A CUDA graph replay (engine.graphs.cuda_graphs): ``nodes``, each graph node's (tools id)
        ``[(counts, index)]``, the records its kernels' time goes to. The range to replay in
        (None once the block's recording ended)."""
        ops = {}
        for tools_id, targets in nodes.items():
            ops[tools_id] = len(self._targets)
            self._targets.append(list(targets))
        self._replays.append(ops)
        if not self._recording:
            return None
        return _fast_range(f"{GRAPH_PREFIX}{len(self._replays) - 1}")

    def _stop(self) -> None:
        self._recording = False
        try:
            self._events = self.session.stop()
        except Exception as e:  # the live session, unproven on a GPU: costs times, not the step
            self._failed(e, "stopping")
            self._events = ((), ())

    def resolve(self) -> None:
        """Join the block's activities (once) and land every op's and module call's time.
        Inside the block (``resolve_times()``) nothing lands yet: Kineto hands its records
        over only when it stops, and stopping would leave the rest of the block untimed."""
        if self.found is not None:
            return
        if self._recording:
            if not self._early:
                self._early = True
                warnings.warn("dispatch_flops: kernel times land when the block ends; read "
                              "inside it, ops have no time yet (timing=\"events\" gives "
                              "times inside the block)", stacklevel=4)
            return
        assert self._events is not None
        host, device = self._events
        spans = [(i, start.id, end.id) for i, (_, _, start, end) in enumerate(self._spans)]
        try:
            found = join(host, device, spans, dict(enumerate(self._replays)))
        except Exception as e:
            self._failed(e, "joining")
            found = KernelJoin()
        for token, ns in found.op_ns.items():
            for counts, index in self._targets[token] or ():
                counts[index] += ns
        idle = self._idle
        for i, (counts, index, start, end) in enumerate(self._spans):
            if end.block_end:  # the block's wall: the host's, from entry to the last kernel
                counts[index] += end.ns - start.ns
            else:  # a module call: its kernels' span on the device, and the idle inside
                call = found.calls.get(i)
                if call is not None:
                    counts[index] += call.span_ns
                    idle[id(counts)] = idle.get(id(counts), 0) + call.idle_ns
        self.found = found
        if self.sampler is not None:
            self.sampler.learn(_by_signature(self._records.values(), with_ns=True))

    def close(self) -> None:
        """Stop recording without a block end (the block failed to begin)."""
        if self._recording:
            self._recording = False
            self._events = ((), ())
            with suppress(Exception):
                self.session.stop()

    def replayed(self, records) -> None:
        """A CUDA graph replay added to ``records``: a recorded block learns their kernel time
        per call, a block between samples gives them their estimate (``EstimatingTimer``'s)."""
        for rec in records:
            self._records[id(rec)] = (rec, NS)

    def idle_of(self, frame) -> int:
        """ns the device sat idle inside ``frame``'s module calls (``resolve`` first)."""
        return self._idle.get(id(frame.span), 0)

    def facts(self) -> dict:
        """``RunFacts.kernels`` of this block (``resolve`` first)."""
        found = self.found
        if found is None or self.failure is not None:
            return {}
        return {"device_ns": found.device_ns, "attributed_ns": found.attributed_ns,
                "outside_ns": found.outside_ns, "dropped": found.dropped,
                "unlinked": found.unlinked, "graph_replays": found.graph_replays,
                "measured_steps": 1}

    def _failed(self, error: Exception, doing: str) -> None:
        self.failure = f"{doing} Kineto failed ({type(error).__name__}: {error})"
        warnings.warn(f"dispatch_flops: kernel timing: {self.failure}; this block's ops and "
                      "module calls get no time", stacklevel=4)

    def outside_rows(self, frames, root: tuple) -> tuple:
        """Profile rows for the kernels no op launched: one per (module stack, phase, kernel
        name), operator ``kernel:<name>``, unsupported (flops unknown), with calls and ns.
        ``frames``: the ledger's (a module call's span list names its frame); ``root``: the
        stack of what ran outside every module call (the block's own span too). Kernels
        inside a span that is no frame's (a compiled graph's run) are that run's time
        already: no row."""
        self.resolve()
        assert self.found is not None
        stack_of = {id(frame.span): frame.stack for frame in frames}
        rows: dict = {}
        for row in self.found.outside:
            stack = root
            if row.call is not None and not self._spans[row.call][3].block_end:
                found = stack_of.get(id(self._spans[row.call][0]))
                if found is None:
                    continue
                stack = found
            key = RowKey(stack, Phase(row.phase), KERNEL_ROW_PREFIX + row.name, row.name,
                         UNSUPPORTED, None)
            calls, ns = rows.get(key, (0, 0))
            rows[key] = (calls + row.calls, ns + row.ns)
        width = len(ROW)
        return tuple((key, (calls,) + (0,) * (width - 2) + (ns,))
                     for key, (calls, ns) in rows.items())


class ModuleEventTimer(CudaTimer):
    """The fallback without Kineto: CUDA events at module boundaries and the block's; ops run
    untimed (an event pair around an op times its stream, not its kernels). Where no model
    told the timer its devices, the first op on a CUDA device anchors it, so that the module
    boundaries after it are timed there (one test per op until then, none after: this is the
    reusing blocks' hot path too)."""

    def run(self, resolved, args, kwargs):
        func = resolved.run
        if not self._anchors:
            device = op_device(args, kwargs)
            if device >= 0 and device not in self._anchors:
                self._stream_of(device)
        return (func(*args, **kwargs) if kwargs else func(*args)), None


class EstimatingTimer(ModuleEventTimer):
    """A block between sampled ones: no Kineto, no range per op; each op gets its signature's
    kernel time per call from the last block that measured it (``Sampler``), module calls and
    the block their CUDA events. A signature never measured gets no time, and the next block
    is sampled."""

    def __init__(self, devices, sampler: Sampler) -> None:
        super().__init__(devices)
        self.sampler = sampler
        self._records: dict = {}
        self._landed = False
        self._wall: Optional[tuple] = None  # (counts, index, value before) of the block's
        self.wall_ns: Optional[int] = None  # the block's device wall (its end's events)
        self.reused_ns = 0  # Σ of the op times reused from the sampled block
        self.drifted = False  # the wall moved from the reused times: the next block samples

    estimated = True

    def add(self, counts: list, index: int, token) -> None:
        super().add(counts, index, token)
        self._records[id(counts)] = (counts, index)

    def span(self, counts: list, index: int, start, end) -> None:
        if end.block_end:
            self._wall = (counts, index, counts[index])
        super().span(counts, index, start, end)

    replayed = KernelTimer.replayed  # its records get their estimate at ``resolve``

    def facts(self) -> dict:
        """``RunFacts.kernels`` of this block (``resolve`` first)."""
        return {"reused_steps": 1, "reused_ns": self.reused_ns, "drifts": int(self.drifted)}

    def resolve(self) -> None:
        super().resolve()
        if self._landed:
            return
        self._landed = True
        records = list(self._records.values())
        self.sampler.estimate(_by_signature(records, with_ns=False))
        per_call = self.sampler.per_call
        reused = 0
        for counts, index in records:
            signature = counts[SIGNATURE]
            if signature is not None and signature in per_call:
                ns = round(per_call[signature] * counts[CALLS])
                counts[index] += ns
                reused += ns
        self.reused_ns = reused
        if self._wall is not None:  # the block ended: its wall is folded now
            counts, index, before = self._wall
            self.wall_ns = counts[index] - before
        self.drifted = self.sampler.step_done(self.wall_ns, reused)


def _by_signature(records, with_ns: bool) -> dict:
    """``{signature: (calls, ns)}`` (``with_ns``) or ``{signature: calls}`` over op records
    (views, with no signature, left out)."""
    found: dict = {}
    for counts, index in records:
        signature = counts[SIGNATURE]
        if signature is None:
            continue
        calls, ns = found.get(signature, (0, 0))
        found[signature] = (calls + counts[CALLS], ns + counts[index])
    return found if with_ns else {s: calls for s, (calls, _) in found.items()}


def unavailable() -> Optional[str]:
    """Why Kineto cannot record kernels here, or None when it can."""
    from torch.autograd import kineto_available
    from torch.profiler import ProfilerActivity, supported_activities

    missing = [name for name in ("torch._C._profiler._RecordFunctionFast", *_KINETO_APIS)
               if lookup(name) is None]
    if missing:
        return f"this torch lacks {', '.join(missing)}"
    if not kineto_available():
        return "this torch was built without Kineto"
    if ProfilerActivity.CUDA not in supported_activities():
        return "this torch's Kineto has no CUPTI (CUDA activities)"
    if lookup("torch.autograd._profiler_enabled")():
        return "another profiler is recording (CUPTI takes one subscriber)"
    return None


KERNELS = "kernels"  # FlopCounter(timing=KERNELS): what timing=True is on CUDA
EVENTS = "events"  # FlopCounter(timing=EVENTS): a CUDA event pair around each op (opt-out)
TIMINGS = (KERNELS, EVENTS)  # timing's names (besides True and False)
_warned: set = set()
SESSION: Callable[[], object] = KinetoSession  # what records a block (the tests' CPU stand-in)


SAMPLE_EVERY = 10  # with a model: kernels recorded on one block in this many, by default
# the relative drift of an unsampled block's wall / reused-op-time ratio that makes the next
# block sampled (Sampler): above the few % a GPU step's time wanders by run to run
DRIFT = 0.10
_samplers: WeakKeyDictionary = WeakKeyDictionary()  # model -> its Sampler


_RECORDING: WeakSet = WeakSet()  # kernel timers whose block is being recorded
_NESTED = ("a counter around this one records kernels already (CUPTI takes one subscriber); "
           'time nested counters with timing="events" on both, or the outer one only')

# sampler -> its last recorded block's timer, until joined: a loop that never reads results
# still learns from it, when the next block begins (its kernels are all in by then: the
# recorded block synchronized at its end, so the join is host work, outside any block)
_unread: WeakKeyDictionary = WeakKeyDictionary()


def _catch_up(sampler: Sampler) -> None:
    timer = _unread.pop(sampler, None)
    if timer is not None and timer.found is None and not timer._recording:
        timer.resolve()


def kernel_timer(devices=(), model=None, every: int = SAMPLE_EVERY) -> Timer:
    """The timer for ``timing="kernels"`` on CUDA: ``KernelTimer`` on a sampled block (one
    in ``every`` of ``model``'s, see ``Sampler``; every block without a model),
    ``EstimatingTimer`` on the others; where Kineto cannot record (saying why, once per
    reason) ``ModuleEventTimer``."""
    try:
        reason = _NESTED if any(t._recording for t in _RECORDING) else unavailable()
    except Exception as e:
        reason = f"asking Kineto what it records failed ({type(e).__name__}: {e})"
    if reason is None:
        sampler = None
        if model is not None:
            sampler = _samplers.get(model)
            if sampler is None or sampler.every != every:  # a new schedule starts afresh
                if sampler is not None:  # its unread block's timer is let go with it
                    _unread.pop(sampler, None)
                sampler = _samplers[model] = Sampler(every, DRIFT)
            _catch_up(sampler)
            if not sampler.due():
                sampler.begin(False)
                return EstimatingTimer(devices, sampler)
        try:  # the live session, unproven on a GPU: failing to start must not break the step
            timer = KernelTimer(SESSION(), sampler)
            if sampler is not None:
                sampler.begin(True)
                _unread[sampler] = timer
            return timer
        except Exception as e:
            reason = f"Kineto failed to start ({type(e).__name__}: {e})"
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"dispatch_flops: kernel timing unavailable: {reason}; timing module "
                      "boundaries with CUDA events only (ops get no time)", stacklevel=3)
    return ModuleEventTimer(devices)
