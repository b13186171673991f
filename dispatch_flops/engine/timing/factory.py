"""Which runner times a counter's ops: the timer factory, and the relay of nested timed counters.

A counter asks ``new_timer`` for its clock and ``runner_for`` for what runs its mode's ops.
Every timer answers the one interface of ``timing.Timer`` (``run``/``add``, ``mark``/``span``,
``resolve``, ``close``, ``facts``, ``idle_of``, ``outside_rows``, ``graph_replay``,
``replayed``, and the flags ``cuda``, ``kernel_tokens``, ``measures_idle``, ``tracing``):
nothing outside the timing files asks a timer's class.

A timed counter nested in another sits above a counting mode that runs the op: its op times
would include the counting work below. The bottom counting mode gets a ``timing.Relay`` put
around its runner (``CountingMode.wrap_runner``), which times the op alone and hands the modes
above the token (``timing.Relayed``); ``unrelay`` takes it off again.
"""

from __future__ import annotations

import warnings
from typing import Optional, Union

import torch

from dispatch_flops.engine.counting.meta import MetaRunner
from dispatch_flops.engine.counting.mode import CountingMode
from dispatch_flops.engine.timing.clock import CudaTimer, Relay, Relayed, Timer
from dispatch_flops.engine.timing.kineto import SAMPLE_EVERY, kernel_timer
from dispatch_flops.engine.timing.trace import CudaTracingTimer, TracingTimer
from dispatch_flops.engine.torch_private import get_current_dispatch_mode_stack


def new_timer(trace: bool, devices=(), limit: Optional[int] = None, kernels: bool = False,
              model=None, sampling: int = SAMPLE_EVERY) -> Timer:
    """The timer for a counter: a timeline's (``engine.timing.trace``) when ``trace``; with
    ``kernels``, on CUDA, ops timed by their kernels (``engine.timing.kineto``, one block in
    ``sampling`` of ``model``'s recorded); else ``CudaTimer`` where CUDA is available (CUDA
    ops may come at any point, even where CUDA is not initialised yet), the host clock's
    otherwise. ``devices``: CUDA device indices known to be in use (the model's)."""
    cuda = torch.cuda.is_available()
    if kernels and not trace and cuda:
        return kernel_timer(devices, model, sampling)
    if trace:
        return CudaTracingTimer(devices, limit) if cuda else TracingTimer(limit)
    return CudaTimer(devices) if cuda else Timer()


def runner_for(timer: Optional[Timer], on_meta: bool) -> tuple:
    """``(runner, relay)``: what runs a new counter's ops (its timer, ``MetaRunner`` on meta
    tensors, None: the op itself), and the relay put under the bottom counting mode for it
    (None: none; ``ALREADY``: one there serves it), for ``unrelay`` when the counter ends."""
    if timer is None:
        return (MetaRunner() if on_meta else None), None
    relay = _relay_below(timer)
    if relay is None:
        return timer, None
    runner: Union[Relayed, Timer] = Relayed(timer)  # nested: timed by the bottom mode's clock
    # the clock below may be no timer (a counter's relayed runner once the counters below it
    # left out of order): none of kernel tokens
    if getattr(_bottom_clock(), "kernel_tokens", False) != timer.kernel_tokens:
        # the clock below hands out tokens of the other kind: count, untimed
        warnings.warn(MIXED_CLOCKS, stacklevel=3)
        runner = Relayed(CallsOnly())
    return runner, relay


def unrelay(relay) -> None:
    """Take the relay ``runner_for`` put under the bottom counting mode off again."""
    if isinstance(relay, Relay):
        relay.mode.unwrap_runner(relay)


ALREADY = object()  # a relay below already serves this counter: nothing to undo
MIXED_CLOCKS = (
    'dispatch_flops: a timed counter nested in another takes its op times from the clock '
    'below, and kernel time (timing=True on CUDA) and per-op events (timing="events") cannot '
    "share one: this counter's ops are counted untimed")


def _bottom_mode() -> Optional[CountingMode]:
    """The counting mode on the dispatch stack that runs the op itself (the lowest)."""
    return next((m for m in get_current_dispatch_mode_stack() if isinstance(m, CountingMode)),
                None)


def _relay_below(timer: Timer):
    """The ``Relay`` put around the bottom counting mode's runner for ``timer``; ``ALREADY``
    when one is there; None when there is no counting mode below, or it counts on meta."""
    bottom = _bottom_mode()
    if bottom is None:
        return None
    runners = bottom.runners()
    if any(isinstance(r, Relay) for r in runners):
        return ALREADY
    if runners and isinstance(runners[-1], MetaRunner):
        return None
    return bottom.wrap_runner(lambda runner: Relay(runner, timer, bottom))


def _bottom_clock():
    """The clock timing ops for the modes above the bottom counting mode (its relay's)."""
    bottom = _bottom_mode()
    runners = bottom.runners() if bottom is not None else []
    return next((r.clock for r in runners if isinstance(r, Relay)),
                runners[0] if runners else None)


class CallsOnly(Timer):
    """Counts calls, adds no time (a nested counter whose clock below it cannot read)."""

    def __init__(self) -> None:
        pass

    def add(self, counts: list, index: int, token) -> None:
        counts[0] += 1
