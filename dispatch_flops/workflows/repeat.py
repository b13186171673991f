"""``measure``: warm up, repeat, and keep the median time of every op and module.

Timing one cold call is misleading (first-call allocations, lazy initialisation, caches), so
``measure`` runs the warm-ups outside the counter, counts and times ``repeat`` calls with a
fresh counter each, and returns one Profile whose counts are those of every repeat (they
are equal) and whose latencies are medians over the repeats.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Callable, Optional, Union

import torch
from torch import nn

from dispatch_flops.counter import FlopCounter
from dispatch_flops.results.profile import Profile
from dispatch_flops.results.stats import check_int


def measure(
    model: Optional[nn.Module],
    args: Union[tuple, torch.Tensor] = (),
    kwargs: Optional[dict] = None,
    *,
    warmup: int = 1,
    repeat: int = 5,
    fn: Optional[Callable] = None,
    progress: Optional[Callable[[str, int, int], None]] = None,
    **options,
) -> Profile:
    """Count and time ``fn(*args, **kwargs)`` (``fn`` defaults to ``model``): ``warmup`` calls
    outside the counter, then ``repeat`` timed ones; latencies in the result are medians.

    >>> fc = measure(model, (x,), warmup=2, repeat=10)
    >>> fc.by_module()["layers.0"].latency_s, fc.mfu(device)
    ``args`` is the tuple of positional arguments, as ``model(*args)``; one tensor alone is
    taken as ``(x,)`` (as ``paper_table``'s inputs: a tensor is never a tuple of arguments,
    where unpacked it would call the model with each of its rows); anything else that is
    not a tuple or list is a ``TypeError`` (a dict of keyword arguments: ``kwargs=``).
    ``fn`` may run a whole training step (``fn=lambda x: model(x).sum().backward()``);
    ``options`` go to ``FlopCounter`` (``attention=...``, ``trace=True``: the timeline is the
    first timed run's). ``progress(stage, done, total)``, when given, is called after every
    warm-up (stage "warm-up") and timed run ("timed run").
    """
    check_int("warmup", warmup, 0)
    check_int("repeat", repeat, 1)
    if "timing" in options:
        raise ValueError("measure always times; use FlopCounter(...) to count without timing")
    call = fn if fn is not None else model
    if not callable(call):
        raise ValueError("measure needs a callable: pass a model, or fn=... with model=None")
    args = _positional(args)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"measure(model, args, kwargs): kwargs is a dict of keyword arguments, "
                        f"got {type(kwargs).__name__}")
    kwargs = kwargs or {}
    for done in range(1, warmup + 1):
        call(*args, **kwargs)
        if progress is not None:
            progress("warm-up", done, warmup)
    runs = []
    for done in range(1, repeat + 1):
        with FlopCounter(model, timing=True, **options) as fc:
            call(*args, **kwargs)
        runs.append(fc.to_profile())
        if progress is not None:
            progress("timed run", done, repeat)
    return runs[0].with_medians(runs)


def _positional(args) -> tuple:
    """``args`` as the tuple ``model(*args)`` unpacks: one tensor alone is ``(x,)``."""
    if isinstance(args, torch.Tensor):
        return (args,)
    if isinstance(args, (tuple, list)):
        return tuple(args)
    hint = " (keyword arguments go in kwargs=)" if isinstance(args, dict) else ""
    raise TypeError(f"measure(model, args): args is a tuple of the model's positional "
                    f"arguments, e.g. (x,) or (x, mask), got {type(args).__name__}{hint}")


def profile(*args, **kwargs) -> Profile:
    """Deprecated: ``measure``'s old name (it read as the class ``Profile``), to be removed in
    the next release. Takes ``measure``'s arguments and returns its result, with a
    ``FutureWarning``."""
    # FutureWarning, not DeprecationWarning: Python's default filters hide a
    # DeprecationWarning unless the calling code is __main__, so a script that calls profile
    # from its own module would never learn the name goes away; FutureWarning is shown by
    # default everywhere. stacklevel=2 names the caller's line, not this one.
    warnings.warn("dispatch_flops.profile is renamed dispatch_flops.measure (same arguments, "
                  "same result); profile will be removed in the next release",
                  FutureWarning, stacklevel=2)
    return measure(*args, **kwargs)


# help() and IDEs show measure's parameters for the alias too
profile.__signature__ = inspect.signature(measure)  # type: ignore[attr-defined]
