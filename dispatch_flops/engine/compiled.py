"""Compiled models: counted as they run compiled, and never left de-compiled.

**Never de-compile.** Dynamo refuses to compile a frame while a dispatch mode is on the stack,
and caches that refusal on the code object (pytorch#190286): one counted step used to leave
a compiled model eager for the rest of the process. Where torch has
``TorchDispatchMode.ignore_compile_internals`` (2.9 and later, PR#161648) the counting mode
says True: dynamo compiles and runs compiled code under it, with every mode switched off while
compiling. Dynamo would still trace the counter's global module and optimizer hooks into the
graphs it compiles meanwhile (a graph break at each module call, baked into the cache); the
counter takes its hooks out of torch's global hook dicts for the duration of every compile
(dynamo's compile start and end callbacks) and puts them back after.

Per torch version: 2.9 and later, as above (the counted step runs compiled). 2.8 (no
``ignore_compile_internals``): dynamo skips every frame under the mode, so the counted step
runs eagerly and is counted as eager, and caches the skip on each code object as an
exec strategy; ``_watch_skips`` notes those codes and ``_restore_skipped`` sets their strategy
back when the last counter leaves, so the compiled code (never dropped) runs again. Tested on
2.8.0 (tests/test_compiled.py::test_stays_compiled_after_counting fails there without it).

**Count what compiled code runs.** Every graph dynamo hands to a backend (inductor or any
other) is wrapped in a ``Graph`` (``install``, once, when this package and dynamo are both
imported: graphs compiled earlier are not seen). Outside a counter a graph call costs one
Python call more. Inside one, the graph's work is priced once per counter's ledger,
enclosing frame and input shapes: its GraphModule is re-run on fake tensors under the
counter's own mode, node by node in the frame its ``nn_module_stack`` names (the user's
module names: the stack holds the modules themselves), then its backward on fake gradients;
what that adds to the ledger's records, forward and backward apart, are the graph's counts.
Each real run of the graph then adds its forward counts (split into tuples when priced,
added in C loops: a run of a signature priced already prices nothing and looks nothing up
per record) and runs with the counting modes taken off the dispatch stack (``Without``; a
user's other modes stay, in order, and the stack is put back even when the graph raises):
the extern kernels it still dispatches are in the counts already, and would otherwise each
go through Python. Its compiled backward runs the same way (``_backward_without`` wraps the
backward of the aot_autograd Function class it ran), and its backward counts are added as
that backward starts (by a hook on the nodes it made, for a backend that makes no
aot_autograd node), once per run; the sequence numbers of the nodes it made are mapped to a
sink too, for the ops of nodes that are not aot_autograd's. So compiled counts are eager's
counts of the same graph: the same formulas, signatures and attribution, with no second
pricing path and no double counting; what inductor fuses or decomposes does not change them.

**Time.** With timing on, each graph run is timed whole, forward and backward apart, by the
counter's timer (``mark``/``span``: the host clock on the CPU, events on the device's
current stream on CUDA), into ``ModuleFacts.graph_runs`` under the module that ran it. The
modules inside a graph have no time of their own (fused kernels): they are listed in
``ModuleFacts.in_graphs``, their ``latency_s`` is None and the table says ``in graph``.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
import threading
import warnings
import weakref
from collections import deque
from operator import add, attrgetter, itemgetter, setitem
from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import Tensor

from dispatch_flops.engine import active
from dispatch_flops.engine import module_facts as facts
from dispatch_flops.engine.attention import flex
from dispatch_flops.engine.ledger import Frame
from dispatch_flops.engine.records import CALLS, NS, TALLY
from dispatch_flops.engine.torch_private import TorchDispatchMode, lookup
from dispatch_flops.engine.torch_private import get_current_dispatch_mode_stack as _mode_stack
from dispatch_flops.engine.torch_private import get_sequence_nr as _sequence_nr
from dispatch_flops.engine.torch_private import pop_mode as _pop_mode
from dispatch_flops.engine.torch_private import push_mode as _push_mode
from dispatch_flops.engine.tracker import GLOBAL_HOOK_DICTS, ModuleTracker
from dispatch_flops.results.stats import PHASES, ROOT

_calls = itemgetter(CALLS)
_ns = itemgetter(NS)

_COUNTING = active.COUNTING  # graphs look here on every run (engine.active)
_LOCK = threading.RLock()  # _wrap_compiler may run inside a counter's import of dynamo


def has_ignore_compile_internals() -> bool:
    return hasattr(TorchDispatchMode, "ignore_compile_internals")


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


class _Priced:
    """A graph's counts in one ledger: ``(record, calls)`` pairs of its forward and of its
    backward, and the frames whose module calls it makes. Kept by the graph for as long as
    the ledger lives (``Graph.priced``): it holds no reference to the ledger itself.

    Each run adds them: the pairs are kept apart as tuples too (``_Adds``), so that a run adds
    them in C loops, with nothing priced, looked up or allocated per record."""

    __slots__ = ("forward", "backward", "calls", "tallies", "adds", "backward_adds",
                 "forward_tallies", "backward_tallies")

    def __init__(self, forward, backward, calls, tallies=()):
        self.forward = forward
        self.backward = backward
        self.calls = calls
        # flex calls whose masked (and skipped) pairs each run counts from its inputs
        # (engine.attention.flex.RunTally), forward and backward
        self.tallies = tallies
        self.forward_tallies = tuple(t for t in tallies if not t.backward)
        self.backward_tallies = tuple(t for t in tallies if t.backward)
        self.adds = _Adds(forward, calls)  # what each run adds, forward
        self.backward_adds = _Adds(backward, ()) if backward or self.backward_tallies \
            else None


# a maxlen-0 deque's extend runs an iterator to its end and keeps nothing: a C loop
_consume: Callable[[Iterable], None] = deque(maxlen=0).extend
_frame_calls = attrgetter("calls")


class _Adds:
    """``(record, calls)`` and ``(frame, calls)`` pairs as parallel tuples, added by ``add``
    in C loops (map over itemgetter, add, setitem): a run of a graph with a hundred records
    costs a few Python calls, not a hundred loop turns."""

    __slots__ = ("recs", "slots", "ns", "frames", "frame_ns", "names")

    def __init__(self, pairs, calls):
        self.recs = tuple(rec for rec, _ in pairs)
        self.slots = (CALLS,) * len(self.recs)
        self.ns = tuple(n for _, n in pairs)
        self.frames = tuple(frame for frame, _ in calls)
        self.frame_ns = tuple(n for _, n in calls)
        self.names = ("calls",) * len(self.frames)

    def add(self) -> None:
        recs = self.recs
        # each record once (they are the ledger's, listed once each): read, add, write back
        _consume(map(setitem, recs, self.slots, map(add, map(_calls, recs), self.ns)))
        frames = self.frames
        if frames:
            _consume(map(setattr, frames, self.names,
                         map(add, map(_frame_calls, frames), self.frame_ns)))


def _shape_env():
    try:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
    except ImportError:  # pragma: no cover - every torch the package declares has it
        return None
    return ShapeEnv()


# a graph's price where pricing failed: its runs are counted as eager
_EAGER = _Priced([], [], [])


class Graph:
    """A compiled graph as dynamo calls it: runs ``compiled`` (what the backend returned),
    counted by every counter active on this thread."""

    def __init__(self, gm, compiled, block_sparse: bool = False):
        self.gm = gm
        self.compiled = compiled
        # the backend lowers flex attention to a block-sparse kernel (inductor); other
        # backends run the operator's dense math (engine.attention.flex)
        self.block_sparse = block_sparse
        # dynamic shapes: input shapes are part of what is priced
        self.dynamic = any(_symbolic(n.meta.get("example_value"))
                           for n in gm.graph.nodes if n.op == "placeholder")
        # dynamo reuses one graph for every instance of a module class whose code it compiled
        # (parameters are inputs): the first parameter input tells which instance runs it
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.owners = [(i, _innermost(n)) for i, n in enumerate(placeholders)
                       if isinstance(n.meta.get("example_value"), torch.nn.Parameter)]
        # ledger -> {(forward acc, shapes, instance): _Priced}: a ledger's prices go with it
        # (a model deleted, a ledger replaced), however many shapes dynamic ones met
        self.priced: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.runs = 0  # runs counted, over every counter (tests read it)

    def __call__(self, *args, **kwargs):
        if not _COUNTING:
            return self.compiled(*args, **kwargs)
        return self._counted(args, kwargs)

    def _counted(self, args, kwargs):
        mine = active.counting_here()
        if not mine:
            return self.compiled(*args, **kwargs)
        shapes = tuple(a.shape if isinstance(a, Tensor) else a for a in args
                       if isinstance(a, (Tensor, int))) if self.dynamic else ()
        owner = self.owners[0][0] if self.owners else None
        instance = id(args[owner]) if owner is not None and len(args) > owner else None
        runs = []
        for mode, tracker in mine:
            ledger = tracker.ledger
            prices = self.priced.get(ledger)
            if prices is None:
                prices = self.priced[ledger] = {}
            # an accumulator lives as long as its ledger
            key = (id(tracker.state.forward_acc), shapes, instance)
            priced = prices.get(key)
            if priced is None:
                priced = prices[key] = self._price_or_eager(mode, tracker, args, kwargs)
            if priced is _EAGER:  # counted as eager: the traced graph run under the modes
                return self.gm(*args, **kwargs)
            runs.append((mode, tracker, priced))
        # a signature priced already: its counts added whole, nothing priced or looked up
        timed = []
        for _mode, tracker, priced in runs:
            priced.adds.add()
            tracker.graph_calls += 1  # an optimizer step that runs one is not replayed
            for tally in priced.forward_tallies:
                tally(args)
            graphs = tracker.graph_runs
            if graphs is None:
                graphs = tracker.graph_runs = GraphRuns()
            if id(priced) not in graphs.ran:  # this counter's first run of it
                graphs.ran[id(priced)] = priced
                # the modules it runs ran there, for this counter too (pricing told the one
                # that priced it): their gradients' accumulation goes under them, as eager's
                for frame, _ in priced.calls:
                    tracker.note_module_frame(frame.name, frame)
            if tracker.timer is not None:
                timed.append((tracker.timer, graphs.times_here(tracker.current), tracker))
        first = _sequence_nr()
        modes = tuple(mode for mode, _, _ in runs)
        marks = [timer.mark() for timer, _, _ in timed] if timed else timed
        try:
            # the counting modes are off the stack while it runs (other modes stay): what it
            # dispatches is counted already, and a Python mode slows its every extern kernel
            with Without(modes):
                out = self.compiled(*args, **kwargs)
        finally:
            for (timer, times, _), start in zip(timed, marks):
                times[RUNS] += 1
                timer.span(times, FORWARD_NS, start, timer.mark())
        last = _sequence_nr()
        self.runs += 1
        if last > first:  # nodes made: their backward is counted once, when it first runs
            nodes = _nodes_made(out, first, last)
            adds = [(mode, tracker, priced.backward_adds, priced.backward_tallies, args)
                    for mode, tracker, priced in runs if priced.backward_adds is not None]
            if not _run_backward_without(nodes, modes, timed, adds) and adds:
                _add_on_backward(nodes, adds)  # no aot_autograd node to add them: a hook
            for _mode, tracker, _priced in runs:
                _sink_backward(tracker, first, last)
        return out

    def _price_or_eager(self, mode, tracker, args, kwargs) -> _Priced:
        try:
            return self._price(mode, tracker, args, kwargs)
        except Exception as e:  # what fake tensors cannot run: eager can
            warnings.warn(
                f"dispatch_flops: a compiled graph could not be priced on fake tensors "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                f"its runs inside counters are counted as eager code (the graph "
                f"dynamo traced, run op by op)", RuntimeWarning, stacklevel=3)
            return _EAGER

    def _renames(self, tracker, args) -> dict:
        """``{name at compile time: name now}`` of the modules whose parameters this run
        passes: another instance of the same class can run a graph compiled for one."""
        renames = {}
        for i, key in self.owners:
            if i < len(args) and key is not None:
                then = tracker.module_name(key)
                now = tracker.parameter_owner(id(args[i]))
                if then is not None and now is not None and then != now:
                    renames[then] = now
        return renames

    def _price(self, mode, tracker, args, kwargs) -> _Priced:
        """Run the graph on fake copies of ``args`` under ``mode`` alone, each node in the
        frame of its module stack, then its backward: the records it counted into, and how
        many calls (taken out again)."""
        from dispatch_flops.engine.torch_private import FakeTensorMode
        from dispatch_flops.engine.torch_private import (
            disable_current_modes as _disable_current_modes,
        )

        ledger = tracker.ledger
        records = ledger.records
        running, saved = tracker.current, tracker.state.save()
        before = (list(map(_calls, records)), list(map(_ns, records)))
        held = _hold_tallies(records)
        found: list = [{}, {}]  # masked pairs the run found, forward and backward
        with _disable_current_modes():
            # a shape environment: a value read from a tensor (a Python float the graph takes
            # as a 0-d tensor, ``.item()``) is a symbol there, not an error
            fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=_shape_env())
            # torch's fake-tensor dispatch cache is process-wide and never emptied: pricing
            # each shape dynamic ones meet would leave an entry per op and shapes behind
            fake_mode.cache_enabled = False
            fake = [fake_mode.from_tensor(a, static_shapes=True) if isinstance(a, Tensor)
                    else a for a in args]
        frames = _FrameMap(tracker, running, self._renames(tracker, args))
        pricing = flex.Pricing({id(a): i for i, a in enumerate(fake) if isinstance(a, Tensor)},
                               self.block_sparse)
        active.PRICING.append(pricing)
        try:
            with _disable_current_modes(), mode, torch.enable_grad() \
                    if torch.is_grad_enabled() else _nullcontext():
                outs = _Interpreter(self.gm, frames).run(*fake)
                tracker.resume(running, saved[0])
                middle = list(map(_calls, records))
                found[0] = _tallied(records)
                outs = _sinks([o for o in _flat(outs)
                               if isinstance(o, Tensor) and o.requires_grad])
                inputs = [a for a in fake if isinstance(a, Tensor) and a.requires_grad]
                if outs and inputs:
                    pricing.backward = True
                    with _disable_current_modes():
                        # as a loss reduced outside the graph hands it: one value, expanded
                        grads = [torch.ones((), dtype=o.dtype, device=o.device).expand(o.shape)
                                 for o in outs]
                    torch.autograd.grad(outs, inputs, grads, allow_unused=True)
                found[1] = _tallied(records, found[0])
        except BaseException:  # the pricing run counts nothing itself, failed or not
            for i, rec in enumerate(records):
                rec[CALLS] = before[0][i] if i < len(before[0]) else 0
                rec[NS] = before[1][i] if i < len(before[1]) else 0
            raise
        finally:
            _restore_tallies(records, held)
            active.PRICING.remove(pricing)
            tracker.state.restore(saved)
            tracker.resume(running, saved[0])
        after = list(map(_calls, records))
        # metadata queries fake tensors answer through dispatch (prim.device): eager has none
        fake_only = set()
        for frame in ledger.frames:
            for acc in frame.acc:
                for key, rec in acc.items():
                    op = key if key.__class__ is int else key[0]
                    resolved = mode.resolved.get(op) or mode.resolved.get(-op)
                    if resolved is not None and resolved.func.namespace == "prim":
                        fake_only.add(id(rec))
        forward, backward = [], []
        calls0, ns0 = before
        for i, rec in enumerate(records):
            was = calls0[i] if i < len(calls0) else 0
            mid = middle[i] if i < len(middle) else 0
            if id(rec) in fake_only:
                pass
            elif mid > was:
                forward.append((rec, mid - was))
            if id(rec) not in fake_only and after[i] > mid:
                backward.append((rec, after[i] - mid))
            rec[CALLS] = was  # the pricing run counts nothing itself
            rec[NS] = ns0[i] if i < len(ns0) else 0
        tallies = pricing.tallies + [_ShapeMasks(list(f.values()), bool(i))
                                     for i, f in enumerate(found) if f]
        return _Priced(forward, backward, list(frames.calls.items()), tallies)


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


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _symbolic(value) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        return True
    if isinstance(value, Tensor):
        return any(isinstance(s, torch.SymInt) for s in value.shape)
    return False


def _flat(out):
    if isinstance(out, (list, tuple)):
        for o in out:
            yield from _flat(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _flat(o)
    else:
        yield out


class _ShapeMasks:
    """The masked pairs a pricing run found in masks its fake tensors built from shapes
    (SDPA's math decomposition's causal mask, transformers' causal and sliding-window
    masks: engine.attention follows them on fake tensors as on meta), added again at every run
    of the graph, forward or backward, as flex's ``RunTally`` adds a BlockMask's."""

    __slots__ = ("found", "backward")

    def __init__(self, found: list, backward: bool):
        self.found = found  # (Tally, masked, skipped)
        self.backward = backward

    def __call__(self, args) -> None:
        for tally, masked, skipped in self.found:
            tally.add(masked, skipped)


def _hold_tallies(records) -> list:
    """Set the records' masked pairs aside (``_restore_tallies`` puts them back): what a
    pricing run finds is then its own, read as ints without reading a device's counts."""
    held = []
    for rec in records:
        if len(rec) > TALLY:
            tally = rec[TALLY]
            held.append((tally, tally.masked, tally.skipped))
            tally.masked = tally.skipped = 0
    return held


def _tallied(records, before: Optional[dict] = None) -> dict:
    """``{id(tally): (tally, masked, skipped)}`` of the records' masked pairs found so far,
    less ``before``'s."""
    found = {}
    for rec in records:
        if len(rec) > TALLY:
            tally = rec[TALLY]
            masked, skipped = tally.read()
            was = (before or {}).get(id(tally))
            if was is not None:
                masked, skipped = masked - was[1], skipped - was[2]
            if masked or skipped:
                found[id(tally)] = (tally, masked, skipped)
    return found


def _restore_tallies(records, held: list) -> None:
    for rec in records:
        if len(rec) > TALLY:
            rec[TALLY].reset()  # a tally the pricing run made starts at zero
    for tally, masked, skipped in held:
        tally.masked, tally.skipped = masked, skipped


def _sinks(outs: list) -> list:
    """The outputs no other output is computed from: the ones a backward starts from. A graph
    that returns its loss with the logits and caches it was computed from (transformers with
    ``labels``), or logits with the hidden states and key/value caches behind them, hands
    autograd a gradient for the last only; a gradient given to every output would price an
    ``add`` per element of each of the others, which eager never runs. Outputs are told apart
    by autograd edge (node, output number): ``k`` and ``v`` split from one node are two."""
    seen: set = set()
    fed: set = set()
    stack = [o.grad_fn for o in outs if o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for child, nr in node.next_functions:
            if child is not None:
                fed.add((child, nr))
                stack.append(child)
    return [o for o in outs if o.grad_fn is None or (o.grad_fn, o.output_nr) not in fed]


def _sink_backward(tracker, first: int, last: int) -> None:
    """Backward ops of nodes numbered ``first`` to ``last - 1`` (made by a compiled graph's
    run: their work is in its backward counts) go to the sink."""
    tracker.state.sink_backward(first, last, SINK_FRAME, tracker.current)


def _nodes_made(out, first: int, last: int) -> list:
    """The autograd nodes of a graph's outputs that its run made (numbered ``first`` to
    ``last - 1``), each once."""
    nodes, seen = [], set()
    for o in _flat(out):
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


def _add_on_backward(nodes, adds: list) -> None:
    """Add ``adds`` (see ``_add_backward``) when autograd first runs one of ``nodes``: for a
    run that made no aot_autograd node, whose backward adds them itself."""
    def hook(*_):
        _add_backward(adds)

    for node in nodes:
        node.register_prehook(hook)


_RUN_ATTR = "_dispatch_flops_run"  # on an aot_autograd node: (modes, timed, adds) of its run


def _run_backward_without(nodes, modes, timed, adds) -> bool:
    """The compiled backward of these nodes runs with ``modes`` off the stack, as their
    forward did, timed whole by each timing counter that ran the forward, and adds the run's
    backward counts (``adds``, see ``_add_backward``) as it starts. An aot_autograd node is a
    custom Function's context: its class's ``backward`` is wrapped once (one class per
    compiled graph) to read what its forward left on the node. Whether one was found."""
    found = False
    for node in nodes:
        cls = getattr(node, "_forward_cls", None)
        if cls is None or not hasattr(cls, "compiled_bw"):
            continue  # not aot_autograd's: its ops go to the sink (_sink_backward)
        if not getattr(cls.backward, "_dispatch_flops", False):
            cls.backward = staticmethod(_backward_without(cls.backward))
        setattr(node, _RUN_ATTR, (modes, timed, adds))
        found = True
    return found


def _backward_without(backward):
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


class GraphRuns:
    """What the compiled graphs run under one counter did, kept by its tracker
    (``ModuleTracker.graph_runs``): ``ran``, the pricing of each graph it ran, by id (the
    module calls they make: see ``_Priced``), and ``times``, each module stack's
    ``[runs, forward ns, backward ns]`` of the graphs run from it (timing on)."""

    __slots__ = ("ran", "times")

    def __init__(self) -> None:
        self.ran: dict[int, _Priced] = {}
        self.times: dict[tuple, list[int]] = {}

    def times_here(self, frame: Frame) -> list[int]:
        """The times of graphs run from ``frame`` (the running one)."""
        times = self.times.get(frame.stack)
        if times is None:
            times = self.times[frame.stack] = [0, 0, 0]
        return times


def graph_facts(tracker: ModuleTracker) -> tuple[dict[tuple, tuple], tuple[str, ...]]:
    """``(graph_runs, in_graphs)`` of a counter's run, for its ``ModuleFacts``:
    ``{module stack: (runs, forward ns, backward ns)}`` of the compiled graphs it ran (timing
    on), and the names of the modules whose forward ran inside one of them."""
    runs = tracker.graph_runs
    if runs is None:  # no graph ran (every counter reads this on exit)
        return {}, ()
    names = {frame.name for priced in runs.ran.values() for frame, _ in priced.calls}
    return ({stack: tuple(t) for stack, t in runs.times.items()},
            tuple(n for n in facts.names(tracker) if n in names))


def _innermost(node) -> Optional[int]:
    """The id of the innermost module in a node's ``nn_module_stack`` (None if not one)."""
    stack = node.meta.get("nn_module_stack") or {}
    for key in reversed(list(stack)):
        try:
            return int(key)
        except (TypeError, ValueError):
            return None
    return None


def _renamed(name: str, renames: dict) -> str:
    """``name`` with the longest renamed module prefix replaced."""
    if not renames:
        return name
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in renames:
            return ".".join([renames[prefix]] + parts[cut:]) if cut < len(parts) \
                else renames[prefix]
    return name


class _FrameMap:
    """Frames for a graph's nodes from their ``nn_module_stack``, under ``home`` (the frame
    running when the graph was called), and the module calls the graph makes."""

    def __init__(self, tracker: ModuleTracker, home: Frame,
                 renames: Optional[dict[str, str]] = None):
        self.tracker = tracker
        self.home = home
        self.renames = renames or {}
        self.cache: dict = {}
        self.calls: dict[Frame, int] = {}
        self._open: tuple = ()

    def frame(self, stack: dict) -> Frame:
        """The frame of a node whose ``nn_module_stack`` is ``stack``."""
        key = tuple(stack)
        levels = self.cache.get(key)
        if levels is None:  # (module key, its frame or None when not the model's) per level
            tracker = self.tracker
            frame, levels = self.home, []
            for module_key, value in stack.items():
                name = _module_name(tracker, module_key, value)
                if name is not None:
                    name = _renamed(name, self.renames)
                if name is None or name == ROOT or name in frame.stack:
                    levels.append((module_key, None))
                    continue
                # a module outside the running one (the running frame can be left over from
                # a call that broke the graph): from the innermost frame that holds it
                while frame.parent is not None and not name.startswith(frame.name + "."):
                    frame = frame.parent
                frame = frame.child(name, tracker.ledger.frames)
                tracker.note_module_frame(name, frame)
                levels.append((module_key, frame))
            self.cache[key] = levels = (frame, levels)
        # a module is called where the stack gains it (consecutive nodes share the call)
        for module_key, frame in levels[1]:
            if frame is not None and module_key not in self._open:
                self.calls[frame] = self.calls.get(frame, 0) + 1
        self._open = key
        return levels[0]


def _module_name(tracker: ModuleTracker, key, value) -> Optional[str]:
    """The user's name of a module in an ``nn_module_stack`` entry: its key is the module's
    id (``value``: ``(path, type)``), or its path for a specialised module (not resolved)."""
    try:
        return tracker.module_name(int(key))
    except (TypeError, ValueError):
        return None


class _Interpreter(torch.fx.Interpreter):
    def __init__(self, gm, frames: _FrameMap):
        super().__init__(gm)
        self.frames = frames
        self.current: Optional[Frame] = None

    def run_node(self, n):
        if n.op in ("call_function", "call_method", "call_module"):
            frame = self.frames.frame(n.meta.get("nn_module_stack") or {})
            if frame is not self.current:
                self.current = frame
                self.frames.tracker.enter(frame)
        return super().run_node(n)


def unwrap(module):
    """The user's module inside ``torch.compile(module)`` (an ``OptimizedModule``)."""
    orig = getattr(module, "_orig_mod", None)
    while orig is not None and type(module).__name__ == "OptimizedModule" and \
            isinstance(orig, torch.nn.Module):
        module, orig = orig, getattr(orig, "_orig_mod", None)
    return module


# -- installing ---------------------------------------------------------------------------
_INSTALLED: list[Callable] = []  # dynamo's own call_user_compiler, once wrapped
_DYNAMO = "torch._dynamo"  # the package: imported whole, compilers and callbacks included


# torch warns at every call of a compiled module (``OptimizedModule``) while any global module
# hook is installed, that the hook fires for the wrapper too. A counter's hooks are global and
# pass over the wrapper (the counter counts the module inside: ``unwrap``): the warning is
# about them, untrue, and repeated at every counted step (a "once" filter is not once: torch
# mutates the filters while it compiles, which resets Python's once-registry). Ignored, that
# message only; a user's own global hooks lose it too, which this filter is the price of.
_GLOBAL_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


def install() -> None:
    """Wrap every graph dynamo compiles from now on in a ``Graph`` (once per process): at
    once when dynamo is imported already, else the moment it is (``torch.compile`` imports
    it), so that importing this package does not import dynamo (seconds, for a process that
    never compiles) and no graph is compiled unseen."""
    warnings.filterwarnings("ignore", message=_GLOBAL_HOOKS_WARNING, category=UserWarning)
    if _DYNAMO in sys.modules:
        _wrap_compiler()
    elif not any(isinstance(f, _DynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _DynamoImport())


class _DynamoImport(importlib.abc.MetaPathFinder):
    """Calls ``_wrap_compiler`` right after the ``torch._dynamo`` package is imported (all of
    it: no graph can be compiled before), then takes itself off ``sys.meta_path``. A lookup
    that imports nothing (``importlib.util.find_spec``) or an import that fails leaves it in
    place; the loader found is wrapped, never changed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _DYNAMO:
            return None
        index = sys.meta_path.index(self) if self in sys.meta_path else None
        if index is not None:
            del sys.meta_path[index]  # the real finders answer, not this one
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            if index is not None:
                sys.meta_path.insert(index, self)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenWrap(spec.loader, self)
        return spec


class _ThenWrap(importlib.abc.Loader):
    """``loader``, which then wraps dynamo's compiler (``_wrap_compiler``)."""

    def __init__(self, loader, finder):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self.finder)
        _wrap_compiler()

    def __getattr__(self, name):  # resource readers and the like: the loader's own
        if name in ("loader", "finder"):
            raise AttributeError(name)
        return getattr(self.loader, name)


def _wrap_compiler() -> None:
    with _LOCK:
        if _INSTALLED:
            return
        if _DYNAMO not in sys.modules:  # no dynamo: nothing is compiled
            return
        # a torch that renamed it: one warning, graphs then run as compiled code, uncounted
        original = lookup("torch._dynamo.output_graph.OutputGraph.call_user_compiler")
        if original is None:
            return
        from torch._dynamo.output_graph import OutputGraph

        def call_user_compiler(self, gm, *args, **kwargs):
            compiled = original(self, gm, *args, **kwargs)
            if getattr(self, "export", False):
                return compiled
            backend = getattr(self, "compiler_fn", None)
            backend = getattr(backend, "compiler_name", None) or getattr(backend, "__name__",
                                                                         None)
            return Graph(gm, compiled, block_sparse=backend == "inductor")

        vars(call_user_compiler)["__wrapped__"] = original  # not a typed function attribute
        # a private torch class's method, patched: mypy flags any assignment to a method
        OutputGraph.call_user_compiler = call_user_compiler  # type: ignore[method-assign]
        _INSTALLED.append(original)
        if not has_ignore_compile_internals():
            _watch_skips()
        if _COUNTING:  # dynamo imported inside a counter's block: hide its hooks from now on
            _register_callbacks()


# -- torch < 2.9: the skips dynamo cached while a counter counted, undone -------------------
_SKIPPED: set = set()  # code objects dynamo skipped because a counting mode was on
_RESTORE: list = []  # set_code_exec_strategy and the strategy that lets dynamo look again


def _watch_skips() -> None:
    """Without ``ignore_compile_internals`` dynamo skips every frame it meets under a
    dispatch mode (its compiled code too: the frame runs eagerly, counted as eager) and
    caches the skip on the frame's code object: ``FrameExecStrategy(SKIP, DEFAULT)``, kept
    for every later call. torch 2.8 sets it from the frame callback's answer (in
    ``CatchErrorsWrapper``, where the mode check is) and can set it back
    (``set_code_exec_strategy``): the callback is wrapped to note the codes skipped while a
    counter counts, and ``_restore_skipped`` gives them back the default when the last
    counter leaves; their compiled code, never dropped, runs again."""
    found = [lookup(name) for name in (
        "torch._C._dynamo.eval_frame.set_code_exec_strategy",
        "torch._dynamo.types.FrameAction", "torch._dynamo.types.FrameExecStrategy",
        "torch.utils._python_dispatch.is_in_torch_dispatch_mode",
        "torch._dynamo.convert_frame.CatchErrorsWrapper.__call__")]
    if any(f is None for f in found):  # renamed (warned) or torch >= 2.9: not needed
        return
    set_code_exec_strategy, FrameAction, FrameExecStrategy, is_in_torch_dispatch_mode, \
        original = found
    from torch._dynamo.convert_frame import CatchErrorsWrapper as wrapper

    def __call__(self, frame, *args, **kwargs):
        result = original(self, frame, *args, **kwargs)
        if _COUNTING and getattr(result, "guarded_code", True) is None and \
                is_in_torch_dispatch_mode(include_infra_modes=False):
            _SKIPPED.add(frame.f_code)
        return result

    vars(__call__)["__wrapped__"] = original  # not a typed function attribute
    wrapper.__call__ = __call__  # type: ignore[method-assign]
    _RESTORE.append((set_code_exec_strategy,
                     FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT)))


def _restore_skipped() -> None:
    """Let dynamo look again at the codes it skipped while counters counted (see
    ``_watch_skips``)."""
    if not _RESTORE:
        return
    set_strategy, default = _RESTORE[0]
    while _SKIPPED:
        set_strategy(_SKIPPED.pop(), default)


# -- while a counter counts ---------------------------------------------------------------
_HOOK_DICTS = GLOBAL_HOOK_DICTS


def _hook_dicts():
    return [d for d in map(lookup, _HOOK_DICTS) if d is not None]


_HIDDEN: list = []  # (dict, key, value) taken out for a compile


def _hide_hooks(*_) -> None:
    """At a compile's start: take the counters' hooks out of torch's global hook dicts, so
    that dynamo neither traces them into the graph nor breaks it at every module call."""
    mine = set()
    for tracker in active.trackers():
        mine.update(tracker.hook_ids())
    if not mine:
        return
    for d in _hook_dicts():
        for key in [k for k in d if k in mine]:
            _HIDDEN.append((d, key, d.pop(key)))


def _show_hooks(*_) -> None:
    while _HIDDEN:
        d, key, value = _HIDDEN.pop()
        d[key] = value


def _callbacks():
    """dynamo's compile callbacks, where dynamo is imported (a counter does not import it:
    ``_wrap_compiler`` registers them if it is imported while a counter counts)."""
    if "torch._dynamo.callback" not in sys.modules:
        return None
    return lookup("torch._dynamo.callback.callback_handler")


def _register_callbacks() -> None:
    handler = _callbacks()
    if handler is not None:
        handler.register_start_callback(_hide_hooks)
        handler.register_end_callback(_show_hooks)


def _first_counter() -> None:
    """The first counter starts: its graphs count, its hooks are hidden from compiles."""
    with _LOCK:
        if not _INSTALLED and _DYNAMO in sys.modules:  # imported past the finder
            _wrap_compiler()
        _register_callbacks()


def _last_counter() -> None:
    """No counter counts any more: skipped codes back, compile callbacks off."""
    with _LOCK:
        _restore_skipped()
        handler = _callbacks()
        if handler is not None:
            for remove, fn in ((handler.remove_start_callback, _hide_hooks),
                               (handler.remove_end_callback, _show_hooks)):
                try:
                    remove(fn)
                except ValueError:
                    pass


active.when_first(_first_counter)
active.when_last(_last_counter)
