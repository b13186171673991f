"""A Profile's rows: one per (module stack, phase, op overload, category, dtype), with its
counts. The engine makes them (``engine.counting.records.Captured.rows``); ``schema`` reads them
from files; every view in ``aggregate`` sums them.
"""

from __future__ import annotations

from operator import add
from typing import Any, NamedTuple, Optional

from dispatch_flops.results.stats import COUNTS

ROW = COUNTS + ("ns",)  # a row's counts: every Stats count, then measured ns
NS_AT = len(ROW) - 1  # where ns sits in a row's counts
# the operator of a row of kernels no op launched (raw Triton, extensions, NCCL, CUDA graph
# replays): "kernel:<kernel name>", unsupported (flops unknown), timed (engine.timing.kineto)
KERNEL_ROW_PREFIX = "kernel:"
# a row's counts: ints in ROW order (per_step's means may make some floats)
Counts = tuple


class RowKey(NamedTuple):
    """What a row counts: the ops of one overload run under one module stack in one phase.
    A plain tuple underneath (hashes and compares as one), named for reading."""

    stack: tuple  # the running modules' names, root ("") first
    phase: str  # one of PHASES
    operator: str  # the op's packet, "aten.mm"
    overload: str  # "aten.mm.default"
    category: str  # one of CATEGORIES
    dtype: Optional[str]  # the op's compute dtype (its first floating-point argument's)


Row = tuple[RowKey, Counts]


def accumulate(into: dict[Any, list], key: Any, counts: tuple) -> None:
    """Add ``counts`` to ``into[key]`` element-wise (a new list at first sight)."""
    total = into.get(key)
    into[key] = list(counts) if total is None else list(map(add, total, counts))
