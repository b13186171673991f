"""Latency: CUDA events on CUDA, ``time.perf_counter_ns`` on the CPU.

The dispatch mode asks ``Timer.run`` to run an op and gets back the op's output and a token:
its start and end, in nanoseconds for a CPU op, as recorded CUDA events for a CUDA op. Event pairs
are kept and resolved all at once, after one ``torch.cuda.synchronize()``, when the results
are first read: never a synchronize per op. The same goes for module spans from the hooks.
"""

from __future__ import annotations

from time import perf_counter_ns

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from ._skip import SKIP_FRAMES


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


def _on_cuda(args, kwargs) -> bool:
    """Whether an op runs on CUDA: its first tensor argument (or first tensor of a list) is,
    or, for a factory (zeros, randn, arange), its ``device``."""
    for a in args:
        if isinstance(a, Tensor):
            return a.is_cuda
        if (a.__class__ is list or a.__class__ is tuple) and a and isinstance(a[0], Tensor):
            return a[0].is_cuda
    device = kwargs.get("device") if kwargs else None
    return device is not None and torch.device(device).type == "cuda"


class Timer:
    """Times ops and module spans; ``resolve()`` turns every pending event pair into ns."""

    def __init__(self) -> None:
        warm_dispatch()
        # CUDA events are only made when CUDA is already in use: timing a CPU model on a
        # machine with a GPU must not initialise CUDA
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._pending: list = []  # (list, index, start event, end event)

    def _event(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def run(self, resolved, args, kwargs):
        """``(out, (start, end))``: the op's output and when it started and ended (ns, or
        recorded CUDA events). ``resolved``: the mode's ``_Resolved`` for the op."""
        func = resolved.run
        if self.cuda and _on_cuda(args, kwargs):
            start = self._event()
            out = func(*args, **kwargs) if kwargs else func(*args)
            return out, (start, self._event())
        start = perf_counter_ns()
        out = func(*args, **kwargs) if kwargs else func(*args)
        return out, (start, perf_counter_ns())

    def add(self, counts: list, index: int, token) -> None:
        """Add an op's time (``run``'s token) to ``counts[index]``."""
        self._accumulate(counts, index, token[0], token[1])

    def _accumulate(self, counts: list, index: int, start, end) -> None:
        # now for ns, at ``resolve`` for events
        if start.__class__ is int:
            counts[index] += end - start
        else:
            self._pending.append((counts, index, start, end))

    # -- module spans -----------------------------------------------------------------------
    def mark(self):
        """A point in time for a module boundary: an event when CUDA is in use, else ns."""
        return self._event() if self.cuda else perf_counter_ns()

    def span(self, counts: list, index: int, start, end) -> None:
        """Add a module call's time, from two ``mark`` points, to ``counts[index]``."""
        self._accumulate(counts, index, start, end)

    def resolve(self) -> None:
        """Turn every pending event pair into ns: one synchronize for all of them."""
        if not self._pending:
            return
        torch.cuda.synchronize()
        for counts, index, start, end in self._pending:
            counts[index] += round(start.elapsed_time(end) * 1e6)  # ms -> ns
        self._pending.clear()
