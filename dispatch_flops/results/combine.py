"""Combining runs: ``merge`` (steps, repeats, ranks of one model as one), ``per_step`` (the
mean step), ``with_medians`` (a run's times as the medians of its repeats) and ``since``
(what a run counted after an earlier snapshot of it).

How each fact combines is said once, in ``MODULE_RULES`` and ``RUN_RULES`` (a test checks that
every field of ``ModuleFacts`` and ``RunFacts`` has its line); rows always combine by key,
element-wise. The functions build their result from one of the runs (``Profile.replace``),
so this module needs no Profile class of its own.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

from dispatch_flops.results.facts import ModuleFacts, RunFacts
from dispatch_flops.results.protocols import P, ProfileLike
from dispatch_flops.results.rows import NS_AT, accumulate


def _mean(value, n: int):
    """``value / n``: an int where it divides exactly, a float where it does not."""
    return value // n if value % n == 0 else value / n


# -- what a fact does in each combination ------------------------------------------------
def _same(values: list, first) -> Any:  # merge refuses runs where it differs (difference)
    return values[0]


def _first(values: list, first) -> Any:  # the first run's, unchecked (device, rank, ...)
    return values[0]


def _sum(values: list, first) -> Any:
    return sum(values)


def _minus(later, earlier) -> Any:
    return later - earlier


def _mean_up(value: int, n: int) -> int:  # a count of calls stays whole: any left over is one
    return -(-value // n)


def _least(values: list, first) -> Any:
    return min(values)


def _sum_or_none(values: list, first) -> Any:  # None when any run has none
    return None if None in values else sum(values)


def _sum_by_key(values: list, first) -> dict:
    out: dict = {}
    for d in values:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _sum_tuples_by_key(values: list, first) -> dict:
    out: dict = {}
    for d in values:
        for k, v in d.items():
            accumulate(out, k, v)
    return {k: tuple(v) for k, v in out.items()}


def _union(values: list, first) -> tuple:  # in order of first sight
    return tuple(dict.fromkeys(x for v in values for x in v))


def _union_in_tree_order(values: list, first) -> tuple:
    seen = {x for v in values for x in v}
    return tuple(n for n in first.names if n in seen)


def _sum_dtensor_ops(values: list, first) -> tuple:
    out: dict = {}
    for ops in values:
        for overload, shapes, *counts in ops:
            accumulate(out, (overload, shapes), tuple(counts))
    return tuple(k + tuple(v) for k, v in out.items())


def _sum_attention_calls(values: list, first) -> tuple:
    out: dict = {}
    for calls in values:
        for *key, n in calls:
            out[tuple(key)] = out.get(tuple(key), 0) + n
    return tuple(k + (n,) for k, n in out.items())


def _mean_attention_calls(value: tuple, n: int) -> tuple:
    return tuple(tuple(c[:-1]) + (_mean(c[-1], n),) for c in value)


def _minus_attention_calls(later: tuple, earlier: tuple) -> tuple:
    before = {tuple(c[:-1]): c[-1] for c in earlier}
    out = ((tuple(c[:-1]), c[-1] - before.get(tuple(c[:-1]), 0)) for c in later)
    return tuple(k + (n,) for k, n in out if n)
def _concatenated(values: list, first) -> tuple:
    return tuple(x for v in values for x in v)


def _sum_experts(values: list, first) -> tuple:
    out: dict = {}
    for layers in values:
        for layer, tokens, rows, calls in layers:
            had = out.get(layer)
            out[layer] = (tokens, rows, calls) if had is None or len(had[0]) != len(tokens) \
                else (tuple(map(sum, zip(had[0], tokens))), tuple(map(sum, zip(had[1], rows))),
                      had[2] + calls)
    return tuple((layer,) + v for layer, v in out.items())


def _keep(value, *_) -> Any:
    return value


def _one(value, n: int) -> int:
    return 1


def _mean_by_key(value: dict, n: int) -> dict:
    return {k: _mean(v, n) for k, v in value.items()}


def _mean_tuples_by_key(value: dict, n: int) -> dict:
    return {k: tuple(_mean(x, n) for x in v) for k, v in value.items()}


def _seconds_mean(value, n: int):
    return None if value is None else value / n


def _minus_by_key(later: dict, earlier: dict) -> dict:
    out = {k: v - earlier.get(k, 0) for k, v in later.items()}
    return {k: v for k, v in out.items() if v}


def _minus_tuples_by_key(later: dict, earlier: dict) -> dict:
    return {k: tuple(a - b for a, b in zip(v, earlier.get(k, (0,) * len(v))))
            for k, v in later.items() if v != earlier.get(k)}


def _median_by_key(value: dict, values: list) -> dict:
    return {k: statistics.median_low([v.get(k, 0) for v in values]) for k in value}


def _median_graph_times(value: dict, values: list) -> dict:
    # a graph's runs are counts (kept); its forward and backward ns are times (medians)
    return {stack: (runs,) + tuple(statistics.median_low([v.get(stack, (0, 0, 0))[i]
                                                         for v in values]) for i in (1, 2))
            for stack, (runs, *_) in value.items()}


def _median_seconds(value, values: list):
    walls = [v for v in values if v is not None]
    return statistics.median_low(walls) if walls else value


def _count(value, values: list) -> int:
    return len(values)


@dataclass(frozen=True)
class Rule:
    """How one fact combines in ``merge`` (its values over the runs, and the first run's
    facts), ``per_step`` (its value, the steps), ``since`` (the later and the earlier value)
    and ``with_medians`` (its value, and its values over the runs alike)."""

    merge: Callable[[list, Any], Any]
    mean: Callable[[Any, int], Any] = _keep
    minus: Callable[[Any, Any], Any] = _keep
    median: Callable[[Any, list], Any] = _keep


SAME = Rule(_same)  # must agree to merge; then as it is everywhere
COUNT = Rule(_sum_by_key, _mean_by_key, _minus_by_key)
TIME = Rule(_sum_by_key, _mean_by_key, _minus_by_key, _median_by_key)

MODULE_RULES: dict[str, Rule] = {
    "names": SAME,
    "types": Rule(_first),
    "params": SAME,
    "calls": COUNT,
    "spans": TIME,
    "saved": COUNT,
    "graph_runs": Rule(_sum_tuples_by_key, _mean_tuples_by_key, _minus_tuples_by_key,
                       _median_graph_times),
    "in_graphs": Rule(_union_in_tree_order),
    "idle": TIME,
}
RUN_RULES: dict[str, Rule] = {
    "model": SAME,
    "has_model": SAME,
    "attention": SAME,
    "timing": SAME,
    "saved_activations": SAME,
    "allow_tf32": SAME,
    "repeats": Rule(_least, median=_count),
    "wall_s": Rule(_sum_or_none, _seconds_mean, median=_median_seconds),
    "steps": Rule(_sum, _one),
    "dtype": Rule(_first),
    "device": Rule(_first),
    "device_name": Rule(_first),
    "rank": Rule(_first),
    "world_size": Rule(_first),
    "pricing_errors": Rule(_union),
    "dtensor_ops": Rule(_sum_dtensor_ops),
    "attention_calls": Rule(_sum_attention_calls, _mean_attention_calls,
                            _minus_attention_calls),
    "parameters": Rule(_first),
    "pipeline": Rule(_concatenated),
    "experts": Rule(_sum_experts),
    "kernels": COUNT,
    "unvalued_masks": Rule(_sum, _mean_up, _minus),
}
RULES = {ModuleFacts: MODULE_RULES, RunFacts: RUN_RULES}


def _combined(facts: Sequence, how: Callable[[Rule, str], Any]):
    """A ``ModuleFacts``/``RunFacts`` of the type of ``facts[0]``, each field from ``how``."""
    kind = type(facts[0])
    return kind(**{f.name: how(RULES[kind][f.name], f.name) for f in fields(kind)})


# -- the combinations --------------------------------------------------------------------
def difference(a: ProfileLike, b: ProfileLike) -> str:
    """Why two runs cannot be merged ("" when they can): a fact whose rule is ``SAME``
    differs."""
    if a.root_label != b.root_label or a.has_model != b.has_model:
        return f"different models ({a.root_label!r} and {b.root_label!r})"
    if a.module_facts.names != b.module_facts.names:
        return f"different module trees ({a.root_label}: modules differ)"
    if a.module_facts.params != b.module_facts.params:
        return f"different parameter counts ({a.root_label}: a module's parameters differ)"
    for option, rule in RUN_RULES.items():
        if rule is SAME and getattr(a.run, option) != getattr(b.run, option):
            return (f"different {option} ({getattr(a.run, option)!r} and "
                    f"{getattr(b.run, option)!r}): count both runs with the same options")
    return ""


def merge(profiles: Sequence[P]) -> P:
    """``profiles`` (of one model) as one; see ``Profile.merge``."""
    if not profiles:
        raise ValueError("merge needs at least one run")
    first = profiles[0]
    for i, p in enumerate(profiles[1:], 1):
        why = difference(first, p)
        if why:
            raise ValueError(f"cannot merge run {i} with run 0: {why}")
    rows: dict = {}
    for p in profiles:
        for key, counts in p.rows:
            accumulate(rows, key, counts)
    module_facts = [p.module_facts for p in profiles]
    runs = [p.run for p in profiles]
    return first.replace(
        rows=[(k, tuple(v)) for k, v in rows.items()],
        module_facts=_combined(module_facts, lambda rule, name: rule.merge(
            [getattr(f, name) for f in module_facts], module_facts[0])),
        run=_combined(runs, lambda rule, name: rule.merge(
            [getattr(r, name) for r in runs], runs[0])),
        parts=tuple(q for p in profiles for q in (p.parts or (p,))), ranks=(), trace=None)


def per_step(profile: P) -> P:
    """The mean step of ``profile``; see ``Profile.per_step``."""
    n = profile.steps
    if n == 1:
        return profile
    facts, run = profile.module_facts, profile.run
    return profile.replace(
        rows=[(key, tuple(_mean(v, n) for v in counts)) for key, counts in profile.rows],
        module_facts=_combined([facts], lambda rule, name: rule.mean(getattr(facts, name), n)),
        run=_combined([run], lambda rule, name: rule.mean(getattr(run, name), n)),
        parts=(), ranks=(), trace=None)


def with_medians(profile: P, runs: Sequence[ProfileLike]) -> P:
    """``profile`` with its times the medians over ``runs`` alike; see
    ``Profile.with_medians``."""
    keys = [key for key, _ in profile.rows]
    alike = [r for r in runs if [key for key, _ in r.rows] == keys]
    rows = [(key, counts[:NS_AT] + (statistics.median_low([r.rows[i][1][NS_AT]
                                                            for r in alike]),))
            for i, (key, counts) in enumerate(profile.rows)]
    facts, run = profile.module_facts, profile.run
    return profile.replace(
        rows=rows,
        module_facts=_combined([facts], lambda rule, name: rule.median(
            getattr(facts, name), [getattr(r.module_facts, name) for r in alike])),
        run=_combined([run], lambda rule, name: rule.median(
            getattr(run, name), [getattr(r.run, name) for r in alike])),
        parts=(), ranks=())


def since(later: P, earlier: ProfileLike) -> P:
    """What ``later`` counted after ``earlier``, both snapshots of one counter's run (taken
    inside its block with ``to_profile()``): calls, counts, times and module calls
    subtracted; rows that counted nothing left out. ``profile_generate`` cuts a run into
    steps with it."""
    rows = {key: list(counts) for key, counts in later.rows}
    for key, counts in earlier.rows:
        rows[key] = [a - b for a, b in zip(rows.get(key, (0,) * len(counts)), counts)]
    facts, before = later.module_facts, earlier.module_facts
    run, run_before = later.run, earlier.run
    return later.replace(
        rows=[(k, tuple(v)) for k, v in rows.items() if any(v)],
        module_facts=_combined([facts], lambda rule, name: rule.minus(
            getattr(facts, name), getattr(before, name))),
        run=_combined([run], lambda rule, name: rule.minus(
            getattr(run, name), getattr(run_before, name))),
        parts=(), ranks=(), trace=None)
