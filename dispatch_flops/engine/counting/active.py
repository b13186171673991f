"""Which counters are counting now, and which compiled graph is being priced: one registry each.

Compiled graphs (``engine.graphs.compiled``) and CUDA graphs (``engine.graphs.cuda_graphs``) act
only while a counter counts, and only for the counters counting on the thread that runs them. Every
counter is entered here once (``enter``) and left once (``leave``); the parts that follow counters
register what they do when the first one enters and the last one leaves (``when_first``,
``when_leaving``, ``when_last``), and ask ``counting_here()``:

>>> active.enter(mode, tracker)      # FlopCounter.__enter__
>>> active.counting_here()           # [(mode, tracker)] of this thread's counters
>>> active.leave(mode)               # FlopCounter.__exit__

The compiled graphs being counted on fake tensors now are in ``masks.fake_runs``.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from dispatch_flops.engine.torch_private import get_current_dispatch_mode_stack

# (mode, tracker) of every counter counting now, in order of entry; read without the lock
# (a list's truth and a copy of it are atomic): ``if COUNTING`` is the parts' fast test
COUNTING: list = []
_LOCK = threading.RLock()
_FIRST: list[Callable[[], None]] = []  # run when a counter enters with none counting
_LEAVING: list[Callable[[object], None]] = []  # run with the mode of each counter leaving
_LAST: list[Callable[[], None]] = []  # run when the last counter has left



def when_first(fn: Callable[[], None]) -> None:
    """Run ``fn`` (under the registry's lock) when a counter enters while none counts."""
    _FIRST.append(fn)


def when_leaving(fn: Callable[[object], None]) -> None:
    """Run ``fn(mode)`` (under the lock) for each counter leaving, once it is out."""
    _LEAVING.append(fn)


def when_last(fn: Callable[[], None]) -> None:
    """Run ``fn`` (under the lock) when the last counter counting has left."""
    _LAST.append(fn)


def _run_all(callbacks: list, *args) -> None:
    """Run every callback, each whatever an earlier one raised (a part left installed would
    outlive the counters); then raise the first exception."""
    first: Optional[BaseException] = None
    for fn in callbacks:
        try:
            fn(*args)
        except BaseException as e:
            first = first or e
    if first is not None:
        raise first


def enter(mode, tracker) -> None:
    """A counter starts counting (its mode bound to ``tracker``)."""
    with _LOCK:
        if not COUNTING:
            _run_all(_FIRST)
        COUNTING.append((mode, tracker))


def leave(mode) -> None:
    """The counter whose mode is ``mode`` stops counting (safe to call twice)."""
    with _LOCK:
        COUNTING[:] = [(m, t) for m, t in COUNTING if m is not mode]
        try:
            _run_all(_LEAVING, mode)
        finally:
            if not COUNTING:
                _run_all(_LAST)


def counting_here(on_stack: bool = False) -> list:
    """``[(mode, tracker)]`` of the counters counting on this thread (a mode still bound to
    its tracker); ``on_stack``: only those whose mode is on the dispatch mode stack now (a
    compiled graph's run takes the modes off)."""
    ident = threading.get_ident()
    found = [(m, t) for m, t in list(COUNTING)
             if t.thread == ident and t.mode is m and m.tracker is t]
    if on_stack and found:
        stack = get_current_dispatch_mode_stack()
        found = [(m, t) for m, t in found if any(s is m for s in stack)]
    return found


def trackers() -> list:
    """The trackers of every counter counting now, on any thread."""
    return [t for _, t in list(COUNTING)]

