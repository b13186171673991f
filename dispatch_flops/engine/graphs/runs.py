"""How a priced compiled graph runs inside a counter: with the counting modes off the
dispatch stack (``Without``), its backward likewise (``backward_without`` wraps the backward of
the aot_autograd Function class it ran), its backward counts added once as that backward starts
(``add_on_backward`` for a backend that makes no aot_autograd node), and the sequence numbers of
the nodes it made sunk (``sink_backward``), so that no op of its backward is counted twice.
``engine.graphs.compiled`` prices the graph; this is what each real run does.
"""

from __future__ import annotations

from typing import Sequence

from torch import Tensor

from dispatch_flops.engine.counting import active
from dispatch_flops.engine.torch_private import TorchDispatchMode
from dispatch_flops.engine.torch_private import get_current_dispatch_mode_stack as _mode_stack
from dispatch_flops.engine.torch_private import pop_mode as _pop_mode
from dispatch_flops.engine.torch_private import push_mode as _push_mode
from dispatch_flops.results.stats import PHASES


class _Sink(dict):
    """An accumulator that keeps nothing: every key reads one throwaway record."""

    __slots__ = ("record",)

    def __init__(self):
        super().__init__()
        self.record = [0, 0, None]

    def get(self, key, default=None):
        return self.record


class _SinkFrame:
    """Where the boundary lists send the backward ops of a compiled graph's nodes."""

    __slots__ = ("acc", "name", "parent", "stack")

    def __init__(self):
        self.acc = tuple(_Sink() for _ in PHASES)
        self.name = "<compiled>"
        self.parent = None
        self.stack = ()


SINK_FRAME = _SinkFrame()


class Without:
    """Takes ``modes`` off the dispatch mode stack for the block, wherever they are on it, and
    puts the stack back as it was on the way out, exception or not; every other mode (a
    user's mode above or below ours) stays on, in its order."""

    __slots__ = ("modes", "popped", "kept")

    def __init__(self, modes: Sequence[TorchDispatchMode]):
        self.modes = modes
        self.popped: Sequence[TorchDispatchMode] = ()  # taken off, top first (in the block)
        self.kept: Sequence[TorchDispatchMode] = ()  # of those, the ones put back on

    def __enter__(self):
        stack = _mode_stack()
        modes = [m for m in self.modes if any(m is s for s in stack)]
        popped, kept = [], []
        if modes:
            # user modes pop from the top down; ours are among them, so reached before any
            # infra mode (those sit apart, in fixed slots)
            left = len(modes)
            while left:
                top = _pop_mode()
                popped.append(top)
                if any(top is m for m in modes):
                    left -= 1
                else:
                    kept.append(top)
            for m in reversed(kept):
                _push_mode(m)
        self.popped, self.kept = popped, kept
        return self

    def __exit__(self, *exc):
        for _ in self.kept:
            _pop_mode()
        for m in reversed(self.popped):
            _push_mode(m)
        self.popped = self.kept = ()
        return False


def flat(out):
    if isinstance(out, (list, tuple)):
        for o in out:
            yield from flat(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from flat(o)
    else:
        yield out


def sink_backward(tracker, first: int, last: int) -> None:
    """Backward ops of nodes numbered ``first`` to ``last - 1`` (made by a compiled graph's
    run: their work is in its backward counts) go to the sink."""
    tracker.state.sink_backward(first, last, SINK_FRAME, tracker.current)


def nodes_made(out, first: int, last: int) -> list:
    """The autograd nodes of a graph's outputs that its run made (numbered ``first`` to
    ``last - 1``), each once."""
    nodes, seen = [], set()
    for o in flat(out):
        node = o.grad_fn if isinstance(o, Tensor) else None
        if node is not None and first <= node._sequence_nr() < last and id(node) not in seen:
            seen.add(id(node))
            nodes.append(node)
    return nodes


def _add_backward(adds: list) -> None:
    """Add a run's backward counts (``adds``: ``(mode, tracker, backward adds, tallies, forward
    args)`` per counter that ran it), once: the list is emptied, so that the run's other
    nodes, a retained graph's second backward, add nothing; only while the same counter
    still counts."""
    while adds:
        mode, tracker, backward, tallies, args = adds.pop()
        if mode.tracker is tracker:
            backward.add()
            for tally in tallies:
                tally(args)


def add_on_backward(nodes, adds: list) -> None:
    """Add ``adds`` (see ``_add_backward``) when autograd first runs one of ``nodes``: for a
    run that made no aot_autograd node, whose backward adds them itself."""
    def hook(*_):
        _add_backward(adds)

    for node in nodes:
        node.register_prehook(hook)


_RUN_ATTR = "_dispatch_flops_run"  # on an aot_autograd node: (modes, timed, adds) of its run


def run_backward_without(nodes, modes, timed, adds) -> bool:
    """The compiled backward of these nodes runs with ``modes`` off the stack, as their
    forward did, timed whole by each timing counter that ran the forward, and adds the run's
    backward counts (``adds``, see ``_add_backward``) as it starts. An aot_autograd node is a
    custom Function's context: its class's ``backward`` is wrapped once (one class per
    compiled graph) to read what its forward left on the node. Whether one was found."""
    found = False
    for node in nodes:
        cls = getattr(node, "_forward_cls", None)
        if cls is None or not hasattr(cls, "compiled_bw"):
            continue  # not aot_autograd's: its ops go to the sink (sink_backward)
        if not getattr(cls.backward, "_dispatch_flops", False):
            cls.backward = staticmethod(backward_without(cls.backward))
        setattr(node, _RUN_ATTR, (modes, timed, adds))
        found = True
    return found


def backward_without(backward):
    def counted_backward(ctx, *grads):
        run = getattr(ctx, _RUN_ATTR, None)
        if run is None:
            return backward(ctx, *grads)
        modes, timed, adds = run
        if adds:
            _add_backward(adds)
        if timed:
            timed = [(timer, times) for timer, times, tracker in timed
                     if any(t is tracker for t in active.trackers())]
        marks = [timer.mark() for timer, _ in timed] if timed else timed
        try:
            with Without(modes):
                return backward(ctx, *grads)
        finally:
            for (timer, times), start in zip(timed, marks):
                timer.span(times, BACKWARD_NS, start, timer.mark())

    # a function's own attributes, which a type checker does not know of
    vars(counted_backward).update(_dispatch_flops=True, __wrapped__=backward)
    return counted_backward


# a graph run's times, per module stack that ran it: [runs, forward ns, backward ns]
RUNS, FORWARD_NS, BACKWARD_NS = 0, 1, 2
