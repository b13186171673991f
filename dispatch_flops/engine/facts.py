"""Module facts for a counter's result (``results.profile.ModuleFacts``): the module names,
types, parameter counts, forward calls and time spans, read from a ``ModuleTracker`` and its
ledger when a result is made, never while counting.

>>> calls = call_counts(tracker)
>>> ModuleFacts(names=names(tracker), calls=calls, spans=spans(tracker, calls), ...)
"""

from __future__ import annotations

from typing import Optional

from torch import nn

from dispatch_flops.engine.tracker import Frame, ModuleTracker
from dispatch_flops.results.stats import ROOT, static_prefixes


def names(tracker: ModuleTracker) -> tuple[str, ...]:
    """The model's module names in ``named_modules()`` order; without a model, the root's
    and those of the modules named as they were called (``every_module``), or the root's
    alone."""
    if tracker.model is None:
        return (ROOT,) + tracker.module_names()
    return tracker.module_names()


def types_and_params(tracker: ModuleTracker) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Each module's class name and parameters (``sum(p.numel() for p in
    module.parameters())``), in ``names()`` order; kept with the ledger while the model's
    modules stay the same."""
    modules = tracker.modules()
    if not modules:
        return ("",), (0,)
    if tracker.every_module:  # the root: everything, no module of its own
        types = ("",) + tuple(type(m).__name__ for m in modules)
        return types, (0,) + tuple(sum(p.numel() for p in m.parameters()) for m in modules)
    ids = tuple(map(id, modules))
    ledger = tracker.ledger
    cached = ledger.params
    if cached is None or cached[0] != ids:
        types = tuple(type(m).__name__ for m in modules)
        counts = tuple(sum(p.numel() for p in m.parameters()) for m in modules)
        cached = ledger.params = (ids, types, counts)
    return cached[1], cached[2]


def first_parameter(tracker: ModuleTracker) -> Optional[nn.Parameter]:
    """The model's first floating parameter (its first parameter if none is floating; None
    without one), read from the modules walked on entry."""
    first = None
    for module in tracker.modules():
        for p in module._parameters.values():
            if p is not None:
                if p.is_floating_point():
                    return p
                first = first if first is not None else p
    return first


def call_counts(tracker: ModuleTracker) -> dict[str, int]:
    """Forward calls of each module, over all the frames it ran in."""
    counts: dict[str, int] = {ROOT: tracker.root_calls}
    for frame in tracker.ledger.frames:
        if frame.calls:
            counts[frame.name] = counts.get(frame.name, 0) + frame.calls
    return counts


def spans(tracker: ModuleTracker, calls: dict[str, int]) -> dict[str, int]:
    """ns inside each module's forward calls (timing on). A module re-entered by itself
    counts once (only frames with no ancestor of the same name count); a container that is
    never called itself (ModuleList) gets the spans of the modules it holds."""
    out: dict[str, int] = {}
    root = tracker.root
    root_called = bool(tracker.root_calls)
    todo: list[tuple[Frame, frozenset[str]]] = [(root, frozenset())]
    while todo:
        frame, above = todo.pop()
        if (frame is not root and frame.calls) or (frame is root and root_called):
            if frame.name not in above:
                out[frame.name] = out.get(frame.name, 0) + frame.span[0]
                parent = frame.parent.name if frame.parent is not None else None
                for prefix in static_prefixes(frame.name)[:-1]:
                    if not calls.get(prefix) and prefix not in above and not (
                        parent is not None and (parent + ".").startswith(prefix + ".")
                    ):
                        out[prefix] = out.get(prefix, 0) + frame.span[0]
        inner = above | {frame.name}
        todo.extend((child, inner) for child in frame.children.values())
    return out
