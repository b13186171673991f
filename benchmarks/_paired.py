"""Paired rounds: the way the overhead benchmarks time variants on a shared, noisy machine.

Every round runs each variant ``iters`` times (the order rotated each round, garbage collected
before each block) and measures two clocks: wall time, and this thread's CPU time
(``time.thread_time``), which time slices given to other processes do not add to. The
workloads are single-threaded (one intra-op thread; on the CPU, autograd runs backward on the
calling thread), so the two agree on a quiet machine. A variant's *added* time is its time minus
the eager variant's in the same round, and a ratio of added times is taken within each round
(the same minutes of the machine) before the median over rounds is taken.
"""

from __future__ import annotations

import gc
import statistics
import time


class Rounds:
    """Per-round times of each variant: ``wall[name]`` and ``cpu[name]``, seconds per iteration."""

    def __init__(self, variants: dict, rounds: int, iters: int, baseline: str = "eager"):
        self.baseline = baseline
        self.wall = {name: [] for name in variants}
        self.cpu = {name: [] for name in variants}
        names = list(variants)
        for round_ in range(rounds):
            for name in names[round_ % len(names):] + names[: round_ % len(names)]:
                run = variants[name]
                gc.collect()
                wall, cpu = time.perf_counter(), time.thread_time()
                for _ in range(iters):
                    run()
                self.cpu[name].append((time.thread_time() - cpu) / iters)
                self.wall[name].append((time.perf_counter() - wall) / iters)

    def median(self, name: str, clock: str = "cpu") -> float:
        return statistics.median(getattr(self, clock)[name])

    def added(self, name: str, clock: str = "cpu") -> list:
        """Seconds ``name`` adds to the baseline, per round."""
        times = getattr(self, clock)
        return [t - e for t, e in zip(times[name], times[self.baseline])]

    def ratio(self, name: str, to: str, clock: str = "cpu") -> float:
        """The median over rounds of (what ``name`` adds) / (what ``to`` adds)."""
        return statistics.median(a / b for a, b in zip(self.added(name, clock),
                                                       self.added(to, clock)))


def warmed_ops(model, step, variants: dict) -> int:
    """Run each variant twice (first-call set-up, optimizer state, compiles), then count the
    aten ops of one ``step`` of ``model``."""
    from dispatch_flops import FlopCounter

    for go in variants.values():
        for _ in range(2):
            go()
    with FlopCounter(model) as probe:
        step()
    return probe.total.calls
