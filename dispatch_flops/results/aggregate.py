"""Sums of a Profile's rows: the totals, by phase, by operator and by module (inclusive and
exclusive, with forward spans and compiled graphs' times placed), and the records."""

from __future__ import annotations

from operator import add
from typing import Callable, Optional

from dispatch_flops.results.protocols import ProfileLike
from dispatch_flops.results.rows import ROW, RowKey, accumulate
from dispatch_flops.results.stats import (
    BACKWARD,
    FORWARD,
    ROOT,
    ModuleStats,
    OpRecord,
    Stats,
    credited,
    frozen_mapping,
)


def graph_phase_ns(forward: int, backward: int, phase: Optional[str]) -> int:
    """ns of a compiled graph's runs (``forward`` and ``backward`` ns) in ``phase`` (None:
    all)."""
    return (forward if phase in (None, FORWARD) else 0) + \
        (backward if phase in (None, BACKWARD) else 0)


def graph_ns(profile: ProfileLike, phase: Optional[str]) -> int:
    """ns of the compiled graphs' runs in ``phase`` (all phases: None)."""
    return sum(graph_phase_ns(forward, backward, phase)
               for _, forward, backward in profile.module_facts.graph_runs.values())


def sum_rows(profile: ProfileLike, keep: Callable[[RowKey], bool], extra_ns: int = 0) -> Stats:
    """The rows ``keep`` keeps, summed (``extra_ns`` added to their time)."""
    total = [0] * len(ROW)
    for key, counts in profile.rows:
        if keep(key):
            total = list(map(add, total, counts))
    return Stats.of(total[:-1], total[-1] + extra_ns, profile.timing)


def records(profile: ProfileLike) -> tuple[OpRecord, ...]:
    timed = profile.timing
    return tuple(
        OpRecord(module=key.stack[-1], stack=key.stack, phase=key.phase,
                 operator=key.operator, overload=key.overload, category=key.category,
                 stats=Stats.of(counts[:-1], counts[-1], timed), dtype=key.dtype)
        for key, counts in profile.rows)


def by_operator(profile: ProfileLike, phase: Optional[str]) -> dict[str, Stats]:
    sums: dict[str, list] = {}
    for key, counts in profile.rows:
        if phase is None or key.phase == phase:
            accumulate(sums, key.operator, counts)
    return {op: Stats.of(t[:-1], t[-1], profile.timing) for op, t in sums.items()}


def calls_in(profile: ProfileLike, category: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, counts in profile.rows:
        if key.category == category:
            out[key.operator] = out.get(key.operator, 0) + counts[0]
    return out


def by_module(profile: ProfileLike, phase: Optional[str]) -> dict[str, ModuleStats]:
    """Every module that ran, in tree order: its inclusive counts (credited to every running
    module and to never-called containers above them), exclusive counts, operators, saved
    bytes; forward spans replace forward op times in a called module's latency."""
    facts, timed = profile.module_facts, profile.timing
    calls = facts.calls
    inclusive: dict[str, list] = {}
    exclusive: dict[str, list] = {}
    operators: dict[str, dict] = {}
    forward_ns: dict[str, int] = {}
    credits: dict[tuple, set] = {}
    for key, counts in profile.rows:
        stack, p = key.stack, key.phase
        if phase is not None and p != phase:
            continue
        accumulate(exclusive, stack[-1], counts)
        names = credits.get(stack)
        if names is None:
            names = credits[stack] = credited(stack, calls)
        for name in names:
            accumulate(inclusive, name, counts)
            accumulate(operators.setdefault(name, {}), key.operator, counts)
            if p == FORWARD:
                forward_ns[name] = forward_ns.get(name, 0) + counts[-1]
    if timed:
        # a compiled graph's runs are timed whole: their time is the time of the module
        # that ran them (and its callers), as an op's would be
        for stack, (_, forward, backward) in facts.graph_runs.items():
            ns = graph_phase_ns(forward, backward, phase)
            if not ns:
                continue
            only_time = (0,) * (len(ROW) - 1) + (ns,)
            accumulate(exclusive, stack[-1], only_time)
            for name in credited(stack, calls):
                accumulate(inclusive, name, only_time)
                if phase in (None, FORWARD):
                    forward_ns[name] = forward_ns.get(name, 0) + forward
    if timed and phase in (None, FORWARD):
        # a called module's forward latency is its call spans, hook to hook (what its
        # caller waits for, Python between its ops included); backward stays the sum of
        # its ops' times. Spans replace the forward ops' times, never add to them.
        for name, span_ns in facts.spans.items():
            total = inclusive.setdefault(name, [0] * len(ROW))
            total[-1] += span_ns - forward_ns.get(name, 0)
    saved: dict[str, int] = {}
    own_saved: dict[str, int] = {}
    if profile.saved_activations and phase in (None, FORWARD):
        for stack, n in facts.saved.items():
            own_saved[stack[-1]] = own_saved.get(stack[-1], 0) + n
            for name in credited(stack, calls):
                saved[name] = saved.get(name, 0) + n
    names = set(inclusive) | {n for n, c in calls.items() if c}
    if not profile.has_model:
        names.add(ROOT)
    params = dict(zip(facts.names, facts.params))
    order = {name: i for i, name in enumerate(facts.names)}
    zero = (0,) * len(ROW)

    def stats(counts, has_time: bool = timed) -> Stats:
        return Stats.of(counts[:-1], counts[-1], has_time)

    with_saved = profile.saved_activations
    idle = facts.idle if timed and phase in (None, FORWARD) else {}
    # a module run inside a compiled graph has no time of its own (None, not a zero)
    in_graphs = set(facts.in_graphs)
    return {
        name: ModuleStats(
            name=name,
            calls=calls.get(name, 0),
            params=params.get(name, 0),
            inclusive=stats(inclusive.get(name, zero), timed and name not in in_graphs),
            exclusive=stats(exclusive.get(name, zero), timed and name not in in_graphs),
            by_operator=frozen_mapping({op: stats(c)
                                        for op, c in operators.get(name, {}).items()}),
            saved_bytes=saved.get(name, 0) if with_saved else None,
            saved_bytes_exclusive=own_saved.get(name, 0) if with_saved else None,
            idle_s=idle[name] / 1e9 if name in idle else None,
        )
        for name in sorted(names, key=lambda n: (order.get(n, len(order)), n))
    }


def by_type(profile: ProfileLike, phase: Optional[str]) -> dict[str, ModuleStats]:
    """Figures per module class (``ModuleStats`` named by the class): inclusive, every op run
    while a module of the class ran, counted once however many of them were nested;
    exclusive, the ops the class's modules ran directly. ``calls``: the class's module calls;
    ``params``: those of its outermost modules (a nested one's are in its parent's). Largest
    inclusive flops first."""
    facts, timed = profile.module_facts, profile.timing
    types = dict(zip(facts.names, facts.types))
    calls = facts.calls
    inclusive: dict[str, list] = {}
    exclusive: dict[str, list] = {}
    operators: dict[str, dict] = {}
    credits: dict[tuple, set] = {}
    for key, counts in profile.rows:
        if phase is not None and key.phase != phase:
            continue
        stack = key.stack
        if stack[-1] in types:
            accumulate(exclusive, types[stack[-1]], counts)
        classes = credits.get(stack)
        if classes is None:
            classes = credits[stack] = {types[n] for n in credited(stack, calls) if n in types}
        for cls in classes:
            accumulate(inclusive, cls, counts)
            accumulate(operators.setdefault(cls, {}), key.operator, counts)
    params: dict[str, int] = {}
    called: dict[str, int] = {}
    for name, count in zip(facts.names, facts.params):
        cls = types[name]
        called[cls] = called.get(cls, 0) + calls.get(name, 0)
        outer = [p for p in _parents(name) if types.get(p) == cls]
        if not outer:
            params[cls] = params.get(cls, 0) + count
    zero = (0,) * len(ROW)

    def stats(counts) -> Stats:
        return Stats.of(counts[:-1], counts[-1], timed)

    ran = set(inclusive) | {cls for cls, n in called.items() if n}
    return {
        cls: ModuleStats(
            name=cls, calls=called.get(cls, 0), params=params.get(cls, 0),
            inclusive=stats(inclusive.get(cls, zero)), exclusive=stats(exclusive.get(cls, zero)),
            by_operator=frozen_mapping({op: stats(c)
                                        for op, c in operators.get(cls, {}).items()}))
        for cls in sorted(ran, key=lambda c: (-inclusive.get(c, zero)[_FLOPS], c))
    }


_FLOPS = ROW.index("flops")


def _parents(name: str) -> list[str]:
    """The module names above ``name``, the root ("") included."""
    if name == ROOT:
        return []
    parts = name.split(".")
    return [ROOT] + [".".join(parts[:i]) for i in range(1, len(parts))]
