"""Device time from the kernels' own records: the join of a step's device activities (CUPTI
kernels, memcpys, memsets, as Kineto reports them) to the op calls that launched them.

Pure data in, data out; nothing here touches torch or a GPU, so every rule is tested on the CPU
from activity traces in the shape Kineto produces (``from_chrome_trace`` reads its Chrome JSON,
``from_kineto`` its ``_KinetoEvent``s). The CUDA adapter (``engine.timing.kineto``) records them.

How a device activity finds its op. Kineto links each device activity to the innermost
RecordFunction open on the launching thread when it was launched (CUPTI's external
correlation): the activity's ``external_id`` is that host event's ``id`` ("External id" in
the Chrome trace on both sides). The timer opens one such range of its own around each op the
counting mode runs (named ``df:op:<token>``), so the op is the innermost of *our* ranges
enclosing the linked host event on that host event's thread: host events of one thread share
one clock and nest (RecordFunction is a stack), so this is containment, never a time window
across the CPU and GPU clocks. An activity with no linked host event is placed by its launch
(the ``cuda_runtime``/``cuda_driver`` event with the same CUPTI ``correlation``), the same way.

What no op launched (a raw Triton kernel, an extension's, NCCL's, a CUDA graph replay's) goes
to the innermost module call open at its launch, as an ``Outside`` row named by the kernel;
module calls are the timer's boundary marks (``df:mark:<id>``, instants), paired by
``spans``. A module call's *busy* time is the union of its kernels' intervals, its *span*
from its first kernel's start to its last one's end, and *idle* the rest of the span: the
device waiting on the host, named as such and charged to no op.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Sequence

# activity kinds, as Kineto names them ("cat" in the Chrome trace, activity_type())
KERNEL, MEMCPY, MEMSET = "kernel", "gpu_memcpy", "gpu_memset"
DEVICE_KINDS = frozenset((KERNEL, MEMCPY, MEMSET))
CPU_OP, USER_ANNOTATION = "cpu_op", "user_annotation"
RUNTIME, DRIVER = "cuda_runtime", "cuda_driver"
LAUNCH_KINDS = frozenset((RUNTIME, DRIVER))
HOST_KINDS = frozenset((CPU_OP, USER_ANNOTATION)) | LAUNCH_KINDS

OP_PREFIX = "df:op:"  # the timer's range around one op call: df:op:<token>
MARK_PREFIX = "df:mark:"  # the timer's instant at a module boundary: df:mark:<id>
GRAPH_PREFIX = "df:graph:"  # the timer's range around a CUDA graph replay: df:graph:<n>
# launches whose correlation every kernel of a CUDA graph replay carries
GRAPH_LAUNCHES = frozenset(("cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch",
                            "cuGraphLaunch_ptsz", "hipGraphLaunch", "hipGraphLaunch_spt"))
# how a trace's device records say "no op": their own correlation as External id (before
# kineto PR#1001, 2024-10), or no External id (since)
OLD_CONVENTION, NEW_CONVENTION = "own correlation", "linked op only"
BACKWARD_PREFIX = "autograd::engine::evaluate_function"  # autograd runs a node in it
OPTIMIZER_PREFIX = "Optimizer.step#"  # torch's optimizers run step() in it


class HostEvent(NamedTuple):
    """One host-side record. ``id``: its own Kineto id (an op or range; 0 for a launch);
    ``linked``: a launch's op (the id open when it launched, 0 for none); ``correlation``: a
    launch's CUPTI correlation id (0 for an op)."""

    kind: str
    name: str
    thread: int
    start_ns: int
    end_ns: int
    id: int = 0
    linked: int = 0
    correlation: int = 0


class DeviceActivity(NamedTuple):
    """One kernel, memcpy or memset on a device. ``external_id``: the host event it is linked
    to (0 when Kineto linked none); ``correlation``: its launch's CUPTI correlation id."""

    kind: str
    name: str
    device: int
    stream: int
    start_ns: int
    end_ns: int
    correlation: int
    external_id: int = 0
    grid: tuple = ()
    block: tuple = ()
    graph_node: int = 0  # a graph replay's kernel: its node's tools id (Kineto's "graph node id")

    @property
    def ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


class Outside(NamedTuple):
    """Device activities of one name that no op launched, in one module call's key
    (``call``: the key ``spans`` gave it; None: no module call was open), in ``phase``
    ("forward", "backward", "optimizer" or "other", from the host ranges around the launch).
    ``graph``: launched by a CUDA graph replay."""

    call: Any
    phase: str
    name: str
    kind: str
    calls: int
    ns: int
    graph: bool


@dataclass(frozen=True)
class CallTime:
    """A module's calls' device time, summed over its calls: ``busy_ns`` (the union of the
    intervals of the kernels launched inside, nested calls included), ``span_ns`` (each call's
    first kernel start to last kernel end) and ``idle_ns`` (span minus busy: the device
    waiting for the host); ``kernels``: how many."""

    busy_ns: int = 0
    span_ns: int = 0
    kernels: int = 0

    @property
    def idle_ns(self) -> int:
        return self.span_ns - self.busy_ns


@dataclass(frozen=True)
class KernelJoin:
    """What ``join`` found. ``op_ns``/``op_kernels``: per op token, Σ of its kernels' ns and
    their number; ``outside``: rows for what no op launched; ``calls``: per module-call key;
    ``device_ns``: Σ of every activity (the step's kernel time); ``dropped``: activities
    linked to a host event the trace lacks, with no launch record either (placed in no
    module); ``unlinked``: activities with neither a link nor a launch; ``graph_replays``:
    CUDA graph launches seen."""

    op_ns: Mapping[int, int] = field(default_factory=dict)
    op_kernels: Mapping[int, int] = field(default_factory=dict)
    outside: tuple = ()
    calls: Mapping[Any, CallTime] = field(default_factory=dict)
    device_ns: int = 0
    dropped: int = 0
    unlinked: int = 0
    graph_replays: int = 0

    @property
    def attributed_ns(self) -> int:
        """Device ns given to ops."""
        return sum(self.op_ns.values())

    @property
    def outside_ns(self) -> int:
        return sum(row.ns for row in self.outside)

    @property
    def attributed_share(self) -> float:
        """Share of the step's device time given to ops (1.0 for a step with none)."""
        return self.attributed_ns / self.device_ns if self.device_ns else 1.0


class Nest:
    """One thread's intervals (properly nested: a RecordFunction stack), answering "the
    innermost one containing [start, end]" in O(log n + depth)."""

    __slots__ = ("starts", "ends", "values", "parents")

    def __init__(self, intervals: Iterable[tuple[int, int, Any]]) -> None:
        ordered = sorted(intervals, key=lambda i: (i[0], -i[1]))  # outer first on ties
        self.starts = [i[0] for i in ordered]
        self.ends = [i[1] for i in ordered]
        self.values = [i[2] for i in ordered]
        self.parents: list[int] = []
        stack: list[int] = []
        for k, (_, end, _) in enumerate(ordered):
            while stack and self.ends[stack[-1]] < end:  # a parent holds its child whole
                stack.pop()
            self.parents.append(stack[-1] if stack else -1)
            stack.append(k)

    def innermost(self, start: int, end: int) -> int:
        """Index of the innermost interval containing [start, end], -1 for none. The last
        interval starting at or before ``start`` either contains it or has the one that
        does among its ancestors (nesting)."""
        k = _bisect_right(self.starts, start) - 1
        while k >= 0 and self.ends[k] < end:
            k = self.parents[k]
        return k

    def chain(self, k: int):
        """``k`` and its ancestors, innermost first."""
        while k >= 0:
            yield k
            k = self.parents[k]


def _bisect_right(values: list, x) -> int:
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < values[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _token(name: str, prefix: str) -> Optional[int]:
    if name.startswith(prefix):
        try:
            return int(name[len(prefix):])
        except ValueError:
            return None
    return None


def _union_ns(intervals: list) -> int:
    """Length of the union of ``(start, end)`` intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def join(host: Sequence[HostEvent], device: Sequence[DeviceActivity],
         spans: Iterable[tuple[Any, int, int]] = (),
         graph_ops: Optional[Mapping[int, Mapping[int, int]]] = None, *,
         op_ranges: Iterable[tuple[int, int, int, int]] = (),
         call_ranges: Iterable[tuple[Any, int, int, int]] = ()) -> KernelJoin:
    """Give each device activity to the op call (``df:op:<token>`` range) that launched it,
    else to the innermost module call open at its launch as an ``Outside`` row. ``spans``:
    ``(key, start mark id, end mark id)`` per module call; calls with one key add up.
    ``graph_ops``: per CUDA graph replay (``df:graph:<n>`` range, ``n`` the key), the op token
    each graph node (tools id) was captured from: a replay's kernel whose node is named there
    is that op's, as if the op had launched it. A recorded file has no ranges of ours: its
    ops and module calls come as ``op_ranges`` (``(token, thread, start_ns, end_ns)``) and
    ``call_ranges`` (``(key, thread, start_ns, end_ns)``), joined the same way."""
    graph_ops = graph_ops or {}
    by_id: dict[int, HostEvent] = {}
    launches: dict[int, HostEvent] = {}
    ranges: dict[int, list] = defaultdict(list)  # thread -> (start, end, host event)
    ops: dict[int, list] = defaultdict(list)  # thread -> (start, end, token)
    replays: dict[int, list] = defaultdict(list)  # thread -> (start, end, replay)
    marks: dict[int, tuple[int, int]] = {}  # mark id -> (thread, ns)
    for event in host:
        if event.kind in LAUNCH_KINDS:
            if event.correlation:
                launches[event.correlation] = event
            continue
        if event.id:
            by_id[event.id] = event
        token = _token(event.name, OP_PREFIX)
        if token is not None:
            ops[event.thread].append((event.start_ns, event.end_ns, token))
            continue
        mark = _token(event.name, MARK_PREFIX)
        if mark is not None:
            marks[mark] = (event.thread, event.start_ns)
            continue
        replay = _token(event.name, GRAPH_PREFIX) if graph_ops else None
        if replay is not None:
            replays[event.thread].append((event.start_ns, event.end_ns, replay))
            continue
        if event.name.startswith((BACKWARD_PREFIX, OPTIMIZER_PREFIX)):
            ranges[event.thread].append((event.start_ns, event.end_ns, event))
    for token, thread, start, end in op_ranges:
        ops[thread].append((start, end, token))
    calls: dict[int, list] = defaultdict(list)  # thread -> (start, end, key)
    for key, thread, start, end in call_ranges:
        calls[thread].append((start, end, key))
    for key, start, end in spans:
        first, last = marks.get(start), marks.get(end)
        if first is not None and last is not None and first[0] == last[0]:
            calls[first[0]].append((first[1], last[1], key))
    op_nests = {t: Nest(v) for t, v in ops.items()}
    call_nests = {t: Nest(v) for t, v in calls.items()}
    range_nests = {t: Nest(v) for t, v in ranges.items()}
    replay_nests = {t: Nest(v) for t, v in replays.items()}

    op_ns: dict[int, int] = defaultdict(int)
    op_kernels: dict[int, int] = defaultdict(int)
    outside: dict[tuple, list] = {}
    intervals: dict[tuple, list] = defaultdict(list)  # (thread, call index) -> kernels
    graph_launches: set[int] = set()
    device_ns = dropped = unlinked = 0
    for activity in device:
        if activity.kind not in DEVICE_KINDS:
            continue
        ns = activity.ns
        device_ns += ns
        launch = launches.get(activity.correlation)
        graph = launch is not None and launch.name in GRAPH_LAUNCHES
        if graph:
            graph_launches.add(activity.correlation)
        anchor = by_id.get(activity.external_id) if activity.external_id else None
        if anchor is None:
            anchor = launch
        if anchor is None:
            if activity.external_id:
                dropped += 1
            else:
                unlinked += 1
            _add_outside(outside, None, "other", activity, graph)
            continue
        thread, start, end = anchor.thread, anchor.start_ns, anchor.end_ns
        call_nest = call_nests.get(thread)
        k = call_nest.innermost(start, end) if call_nest is not None else -1
        key = None
        if call_nest is not None and k >= 0:
            key = call_nest.values[k]
            interval = (activity.start_ns, activity.end_ns)
            for j in call_nest.chain(k):  # inclusive: every call open around the launch
                intervals[thread, j].append(interval)
        op_nest = op_nests.get(thread)
        j = op_nest.innermost(start, end) if op_nest is not None else -1
        if op_nest is not None and j >= 0:
            token = op_nest.values[j]
            op_ns[token] += ns
            op_kernels[token] += 1
            continue
        replay_nest = replay_nests.get(thread) if activity.graph_node else None
        r = replay_nest.innermost(start, end) if replay_nest is not None else -1
        if replay_nest is not None and r >= 0:
            token = graph_ops.get(replay_nest.values[r], {}).get(activity.graph_node)
            if token is not None:
                op_ns[token] += ns
                op_kernels[token] += 1
                continue
        _add_outside(outside, key, _phase(range_nests.get(thread), start, end, k >= 0),
                     activity, graph)
    by_key: dict[Any, list] = {}
    for (thread, k), found in intervals.items():
        key = call_nests[thread].values[k]
        total = by_key.setdefault(key, [0, 0, 0])
        total[0] += _union_ns(found)
        total[1] += max(e for _, e in found) - min(s for s, _ in found)
        total[2] += len(found)
    return KernelJoin(
        op_ns=dict(op_ns), op_kernels=dict(op_kernels),
        outside=tuple(Outside(key, phase, name, kind, n, ns, graph)
                      for (key, phase, name, kind, graph), (n, ns) in outside.items()),
        calls={key: CallTime(*t) for key, t in by_key.items()},
        device_ns=device_ns, dropped=dropped, unlinked=unlinked,
        graph_replays=len(graph_launches))


def _phase(nest: Optional[Nest], start: int, end: int, in_call: bool) -> str:
    """The phase a launch outside every op ran in: inside autograd's evaluation of a node,
    backward; inside an optimizer's step, optimizer; inside a module call, forward."""
    if nest is not None:
        k = nest.innermost(start, end)
        if k >= 0:
            name = nest.values[k].name
            return "backward" if name.startswith(BACKWARD_PREFIX) else "optimizer"
    return "forward" if in_call else "other"


def _add_outside(outside: dict, key, phase: str, activity: DeviceActivity,
                 graph: bool) -> None:
    row = outside.setdefault((key, phase, activity.name, activity.kind, graph), [0, 0])
    row[0] += 1
    row[1] += activity.ns


# -- readers --------------------------------------------------------------------------------


def us_to_ns(us) -> int:
    """Kineto's "ts"/"dur" (microseconds: with three decimals, integral ns, in current
    traces; whole, since the epoch, in older ones) as ns, exactly. ``float(us) * 1000`` is
    not: past 2**53 ns (epoch microseconds, 1.7e18 ns) doubles are 256 ns apart, so a launch
    sharing its op's end edge could end past it and leave the op. Whole microseconds are
    taken as an integer and only a float's fraction is scaled: exact to the ns below 2**41
    us, where current traces' times lie (about 1.4e12 us, from their baseTimeNanoseconds).
    Anything but a finite number: ``ValueError``."""
    if isinstance(us, bool) or not isinstance(us, (int, float)):
        raise ValueError(f"{us!r} is not a number")
    if isinstance(us, int):
        return us * 1000
    if not math.isfinite(us):
        raise ValueError(f"{us!r} is not a finite number")
    whole = math.floor(us)
    return whole * 1000 + round((us - whole) * 1000)  # us - whole: exact (Sterbenz)


def from_chrome_trace(trace: Mapping) -> tuple[list[HostEvent], list[DeviceActivity]]:
    """The host events and device activities of a Kineto Chrome trace (``prof.export_chrome_
    trace``'s JSON, loaded): ``"ph": "X"`` events of the kinds the join reads; flows and
    metadata are left out (the ids carry the same links)."""
    host: list[HostEvent] = []
    device: list[DeviceActivity] = []
    for event in trace.get("traceEvents", ()):
        if event.get("ph") != "X":
            continue
        kind = event.get("cat")
        args = event.get("args") or {}
        start = us_to_ns(event.get("ts", 0))
        end = start + us_to_ns(event.get("dur", 0))
        external = int(args.get("External id", 0))
        if kind in DEVICE_KINDS:
            device.append(DeviceActivity(
                kind, event.get("name", ""), int(args.get("device", event.get("pid", 0))),
                int(args.get("stream", event.get("tid", 0))), start, end,
                int(args.get("correlation", 0)), external,
                tuple(args.get("grid", ())), tuple(args.get("block", ())),
                int(args.get("graph node id", 0))))
        elif kind in LAUNCH_KINDS:
            host.append(HostEvent(kind, event.get("name", ""), int(event.get("tid", 0)),
                                  start, end, 0, external, int(args.get("correlation", 0))))
        elif kind in HOST_KINDS:
            host.append(HostEvent(kind, event.get("name", ""), int(event.get("tid", 0)),
                                  start, end, external))
    device = unlink_own_correlations(host, device)[0]
    return host, device


def unlink_own_correlations(host: list, device: list) -> tuple[list, int, Optional[str]]:
    """Device records whose External id is their own correlation (the convention before
    kineto PR#1001) with no link: kept only where the host range of that id is the innermost
    one (``cpu_op`` or ``user_annotation``) enclosing the record's launch on the launch's
    thread, which is what a real link is (the innermost RecordFunction open at the launch);
    an id that collides with a range that does not enclose the launch, or with an outer one
    (a ``ProfilerStep#`` around everything), would charge the kernel to the wrong op.
    Returns the records, how many were unlinked, and the convention seen."""
    if not device:
        return device, 0, None
    by_id = {e.id: e for e in host if e.id}
    launches = {e.correlation: e for e in host if e.kind in LAUNCH_KINDS and e.correlation}
    nests: dict[int, Nest] = {}  # launch thread -> its ranges with ids, built when needed
    out, unlinked, own, none = [], 0, 0, 0
    for activity in device:
        if not activity.external_id:
            none += 1
        elif activity.external_id == activity.correlation:
            own += 1
            anchor = by_id.get(activity.external_id)
            launch = launches.get(activity.correlation)
            if not (anchor is not None and launch is not None and
                    _innermost_is(nests, host, anchor, launch)):
                activity = activity._replace(external_id=0)
                unlinked += 1
        out.append(activity)
    convention = OLD_CONVENTION if own > none else NEW_CONVENTION
    return out, unlinked, convention


def _innermost_is(nests: dict, host: list, anchor: HostEvent, launch: HostEvent) -> bool:
    """Whether ``anchor`` is the innermost host range with an id enclosing ``launch`` (a
    range of the same interval, nested in it, counts as the same place)."""
    if anchor.thread != launch.thread or not (
            anchor.start_ns <= launch.start_ns and launch.end_ns <= anchor.end_ns):
        return False
    nest = nests.get(launch.thread)
    if nest is None:
        nest = nests[launch.thread] = Nest(
            (e.start_ns, e.end_ns, e) for e in host
            if e.id and e.thread == launch.thread and e.kind not in LAUNCH_KINDS)
    k = nest.innermost(launch.start_ns, launch.end_ns)
    return k >= 0 and (nest.starts[k], nest.ends[k]) == (anchor.start_ns, anchor.end_ns)


def _activity_kind(event) -> str:
    """Kineto's name for an event's activity. torch 2.8's ``_KinetoEvent`` has no
    ``activity_type()``: there it is told from the device and the annotation flag, which
    cannot tell a launch record (``cuda_runtime``) from an op, nor a memcpy from a kernel, so
    on 2.8 kernels no op encloses go unlinked and every device activity counts as a kernel."""
    activity_type = getattr(event, "activity_type", None)
    if activity_type is not None:
        return str(activity_type())
    if "CUDA" in str(event.device_type()) or "HIP" in str(event.device_type()):
        return "kernel"
    return "user_annotation" if event.is_user_annotation() else "cpu_op"


_GRAPH_NODE = re.compile(r'"graph node id":\s*(\d+)')


def _graph_node(event) -> int:
    """A kernel's graph node tools id from its Kineto metadata (0: not a graph replay's, or a
    torch whose ``_KinetoEvent`` has no ``metadata_json``)."""
    metadata = getattr(event, "metadata_json", None)
    if metadata is None:
        return 0
    found = _GRAPH_NODE.search(metadata() or "")
    return int(found.group(1)) if found else 0


def from_kineto(events: Iterable) -> tuple[list[HostEvent], list[DeviceActivity]]:
    """The host events and device activities of ``_KinetoEvent``s (a ``_ProfilerResult``'s
    ``events()``). A device activity's ``linked_correlation_id()`` is the ``correlation_id()``
    of the host event it is linked to; a launch's ``correlation_id()`` is CUPTI's. Host
    events are threaded by ``device_resource_id()`` (the OS thread id, as the Chrome trace's
    ``tid``), not ``start_thread_id()`` (the profiler's own index for ops)."""
    host: list[HostEvent] = []
    device: list[DeviceActivity] = []
    for event in events:
        kind = _activity_kind(event)
        if kind in DEVICE_KINDS:
            device.append(DeviceActivity(
                kind, event.name(), event.device_index(), event.device_resource_id(),
                event.start_ns(), event.end_ns(), event.correlation_id(),
                event.linked_correlation_id(), graph_node=_graph_node(event)))
        elif kind in LAUNCH_KINDS:
            host.append(HostEvent(kind, event.name(), event.device_resource_id(),
                                  event.start_ns(), event.end_ns(), 0,
                                  event.linked_correlation_id(), event.correlation_id()))
        elif kind in HOST_KINDS:
            host.append(HostEvent(kind, event.name(), event.device_resource_id(),
                                  event.start_ns(), event.end_ns(), event.correlation_id()))
    return host, device


# -- sampling -------------------------------------------------------------------------------


class Sampler:
    """Which steps record kernels, and each op signature's kernel time reused on the others.

    A step is sampled when it is the first, every ``every``-th after the last sampled one, when
    the step before it met a signature with no measured time, or when the step before it
    drifted. Drift: an unsampled step measures its device wall cheaply (CUDA events at the
    block's boundaries) and sums the op times it reused. The wall exceeds that sum by the
    host-bound idle and the kernels no op launched, so what is compared is the ratio
    ``wall / sum``, against the first unsampled step after the last sampled one (measured the
    same way: a sampled step's own wall carries Kineto's host cost, which would read as drift
    on every host-bound step). A ratio more than ``tolerance`` away (relative) means the
    reused times no longer describe the step (kernels slower or faster: clocks, contention,
    data-dependent kernels; or the host's pace changed): the next step is sampled.
    The schedule moves when a step begins (``begin``), not when its results are read, so
    steps whose results nobody reads keep it; with nothing learned yet (a sampled step not
    read) the next step is sampled too. ``learn`` keeps ns per call per signature from a
    sampled step; ``estimate`` gives an unsampled step's calls those times, and notes the
    signatures it could not price.

        sampler = Sampler(every=10)
        sampled = sampler.due(); sampler.begin(sampled)
        if sampled:
            ...record kernels, join...; sampler.learn({sig: (calls, ns)})
        else:
            times, missing = sampler.estimate({sig: calls})
            sampler.step_done(wall_ns, sum(times.values()))
    """

    def __init__(self, every: int = 10, tolerance: float = 0.10) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1, not {every!r}")
        if not tolerance > 0:
            raise ValueError(f"tolerance must be positive, not {tolerance!r}")
        self.every = every
        self.tolerance = tolerance
        self.per_call: dict = {}  # signature -> ns per call, from the last step measuring it
        self.since: Optional[int] = None  # steps since the last sampled one (None: none yet)
        self.ratio: Optional[float] = None  # wall / reused ns of the first step reusing
        self.stale = False  # a reason to sample the next step
        self.drifts = 0  # unsampled steps that drifted (each made the next one sampled)

    def due(self) -> bool:
        """Whether the next step records kernels."""
        return self.since is None or self.stale or not self.per_call or \
            self.since + 1 >= self.every

    def begin(self, sampled: bool) -> None:
        """A step begins, sampled or not."""
        if sampled:  # a new measurement, so a new reference for drift
            self.since, self.stale, self.ratio = 0, False, None
        else:
            self.since = 1 if self.since is None else self.since + 1

    def learn(self, measured: Mapping) -> None:
        """A sampled step's ``{signature: (calls, ns)}``."""
        for signature, (calls, ns) in measured.items():
            if calls:
                self.per_call[signature] = ns / calls

    def estimate(self, calls: Mapping) -> tuple[dict, tuple]:
        """``({signature: ns}, signatures with no measured time)`` for an unsampled step's
        ``{signature: calls}``."""
        times, missing = {}, []
        for signature, n in calls.items():
            per_call = self.per_call.get(signature)
            if per_call is None:
                missing.append(signature)
            else:
                times[signature] = round(per_call * n)
        if missing:
            self.stale = True
        return times, tuple(missing)

    def step_done(self, wall_ns: Optional[int] = None, reused_ns: Optional[int] = None
                  ) -> bool:
        """An unsampled step ended, with its device wall and the sum of the op times it
        reused: True when their ratio drifted from the reference past the tolerance (the next
        step is then sampled); the first such step since a sampled one sets the reference."""
        if not (wall_ns and reused_ns):
            return False
        ratio = wall_ns / reused_ns
        if self.ratio is None:
            self.ratio = ratio
            return False
        drifted = abs(ratio / self.ratio - 1) > self.tolerance
        if drifted:
            self.stale = True
            self.drifts += 1
        return drifted
