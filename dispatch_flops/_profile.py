"""``profile``: warm up, repeat, and keep the median time of every op and module.

Timing one cold call is misleading (first-call allocations, lazy initialisation, caches), so
``profile`` runs the warm-ups outside the counter, counts and times ``repeat`` calls with a
fresh counter each, and returns one counter whose counts are those of every repeat (they
are equal) and whose latencies are medians over the repeats.
"""

from __future__ import annotations

import statistics
from typing import Callable, Optional

from torch import nn

from .counter import FlopCounter


def _check_count(name: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def profile(
    model: Optional[nn.Module],
    args: tuple = (),
    kwargs: Optional[dict] = None,
    *,
    warmup: int = 1,
    repeat: int = 5,
    fn: Optional[Callable] = None,
    progress: Optional[Callable[[str, int, int], None]] = None,
    **options,
) -> FlopCounter:
    """Count and time ``fn(*args, **kwargs)`` (``fn`` defaults to ``model``): ``warmup`` calls
    outside the counter, then ``repeat`` timed ones; latencies in the result are medians.

    >>> fc = profile(model, (x,), warmup=2, repeat=10)
    >>> fc.by_module()["layers.0"].latency_s, fc.mfu(device)
    ``fn`` may run a whole training step (``fn=lambda x: model(x).sum().backward()``);
    ``options`` go to ``FlopCounter`` (``attention=...``, ``trace=True``: the timeline is the
    first timed run's). ``progress(stage, done, total)``, when given, is called after every
    warm-up (stage "warm-up") and timed run ("timed run").
    """
    _check_count("warmup", warmup, 0)
    _check_count("repeat", repeat, 1)
    if "timing" in options:
        raise ValueError("profile always times; use FlopCounter(...) to count without timing")
    call = fn if fn is not None else model
    if not callable(call):
        raise ValueError("profile needs a callable: pass a model, or fn=... with model=None")
    kwargs = kwargs or {}
    for done in range(1, warmup + 1):
        call(*args, **kwargs)
        if progress is not None:
            progress("warm-up", done, warmup)
    runs = []
    for done in range(1, repeat + 1):
        with FlopCounter(model, timing=True, **options) as fc:
            call(*args, **kwargs)
        runs.append(fc)
        if progress is not None:
            progress("timed run", done, repeat)
    return _medians(runs)


def _medians(runs: list[FlopCounter]) -> FlopCounter:
    """The first run, with each op's, module's and the block's time replaced by the median
    over ``runs``. Runs that took other paths (a different set of ops) are left out."""
    base = runs[0]
    for run in runs:
        run._timer.resolve()
    frames = [run._tracker.frames() for run in runs]

    def layout(fs):
        return [(f.stack, [list(acc) for _, acc in f.accumulators()]) for f in fs]

    shape = layout(frames[0])
    alike = [i for i, fs in enumerate(frames) if layout(fs) == shape]
    for position, frame in enumerate(frames[0]):
        others = [frames[i][position] for i in alike]
        frame.span[0] = statistics.median_low([f.span[0] for f in others])
        accumulators = [[acc for _, acc in f.accumulators()] for f in others]
        for index, (_, acc) in enumerate(frame.accumulators()):
            for key, counts in acc.items():
                counts[5] = statistics.median_low([accs[index][key][5] for accs in accumulators])
    base._wall[0] = statistics.median_low([runs[i]._wall[0] for i in alike])
    base._records = None
    base.repeats = len(alike)
    return base
