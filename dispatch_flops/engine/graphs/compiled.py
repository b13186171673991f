"""Compiled graphs, counted as they run compiled (``engine.graphs.dynamo`` installs them).

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
go through Python. Its compiled backward runs the same way (``backward_without`` wraps the
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
import warnings
import weakref
from collections import deque
from operator import add, attrgetter, itemgetter, setitem
from typing import Callable, Iterable, Optional

import torch
from torch import Tensor

from dispatch_flops.engine.counting import active, flex
from dispatch_flops.engine.counting.ledger import Frame
from dispatch_flops.engine.counting.records import CALLS, NS
from dispatch_flops.engine.counting.tracker import ModuleTracker
from dispatch_flops.engine.graphs.runs import (
    FORWARD_NS,
    RUNS,
    Without,
    add_on_backward,
    flat,
    nodes_made,
    run_backward_without,
    sink_backward,
)
from dispatch_flops.engine.masks import fake_runs
from dispatch_flops.engine.masks.tally import TALLY
from dispatch_flops.engine.model import module_facts as facts
from dispatch_flops.engine.torch_private import get_sequence_nr as _sequence_nr
from dispatch_flops.results.stats import ROOT

_calls = itemgetter(CALLS)


_ns = itemgetter(NS)


_COUNTING = active.COUNTING  # graphs look here on every run (engine.counting.active)


class _GraphCounts:
    """A graph's counts in one ledger: ``(record, calls)`` pairs of its forward and of its
    backward, and the frames whose module calls it makes. Kept by the graph for as long as
    the ledger lives (``Graph.counted``): it holds no reference to the ledger itself.

    Each run adds them: the pairs are kept apart as tuples too (``_Adds``), so that a run adds
    them in C loops, with nothing counted, looked up or allocated per record."""

    __slots__ = ("forward", "backward", "calls", "tallies", "adds", "backward_adds",
                 "forward_tallies", "backward_tallies")

    def __init__(self, forward, backward, calls, tallies=()):
        self.forward = forward
        self.backward = backward
        self.calls = calls
        # flex calls whose masked (and skipped) pairs each run counts from its inputs
        # (engine.counting.flex.RunTally), forward and backward
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


# a graph whose fake run failed: its runs are counted as eager
_EAGER = _GraphCounts([], [], [])


class Graph:
    """A compiled graph as dynamo calls it: runs ``compiled`` (what the backend returned),
    counted by every counter active on this thread."""

    def __init__(self, gm, compiled, block_sparse: bool = False):
        self.gm = gm
        self.compiled = compiled
        # the backend lowers flex attention to a block-sparse kernel (inductor); other
        # backends run the operator's dense math (engine.counting.flex)
        self.block_sparse = block_sparse
        # dynamic shapes: input shapes are part of what is priced
        self.dynamic = any(_symbolic(n.meta.get("example_value"))
                           for n in gm.graph.nodes if n.op == "placeholder")
        # dynamo reuses one graph for every instance of a module class whose code it compiled
        # (parameters are inputs): the first parameter input tells which instance runs it
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.owners = [(i, _innermost(n)) for i, n in enumerate(placeholders)
                       if isinstance(n.meta.get("example_value"), torch.nn.Parameter)]
        # ledger -> {(forward acc, shapes, instance): _GraphCounts}: a ledger's counts go with it
        # (a model deleted, a ledger replaced), however many shapes dynamic ones met
        self.counted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.runs = 0  # runs counted, over every counter (tests read it)

    def __call__(self, *args, **kwargs):
        if not _COUNTING:
            return self.compiled(*args, **kwargs)
        return self._run_counted(args, kwargs)

    def _run_counted(self, args, kwargs):
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
            counted_here = self.counted.get(ledger)
            if counted_here is None:
                counted_here = self.counted[ledger] = {}
            # an accumulator lives as long as its ledger
            key = (id(tracker.state.forward_acc), shapes, instance)
            counted = counted_here.get(key)
            if counted is None:
                counted = counted_here[key] = self._count_or_eager(mode, tracker, args, kwargs)
            if counted is _EAGER:  # counted as eager: the traced graph run under the modes
                return self.gm(*args, **kwargs)
            runs.append((mode, tracker, counted))
        # a signature priced already: its counts added whole, nothing priced or looked up
        timed = []
        for _mode, tracker, counted in runs:
            counted.adds.add()
            tracker.graph_calls += 1  # an optimizer step that runs one is not replayed
            for tally in counted.forward_tallies:
                tally(args)
            graphs = tracker.graph_runs
            if graphs is None:
                graphs = tracker.graph_runs = GraphRuns()
            if id(counted) not in graphs.ran:  # this counter's first run of it
                graphs.ran[id(counted)] = counted
                # the modules it runs ran there, for this counter too (pricing told the one
                # that priced it): their gradients' accumulation goes under them, as eager's
                for frame, _ in counted.calls:
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
            nodes = nodes_made(out, first, last)
            adds = [(mode, tracker, counted.backward_adds, counted.backward_tallies, args)
                    for mode, tracker, counted in runs if counted.backward_adds is not None]
            if not run_backward_without(nodes, modes, timed, adds) and adds:
                add_on_backward(nodes, adds)  # no aot_autograd node to add them: a hook
            for _mode, tracker, _counted in runs:
                sink_backward(tracker, first, last)
        return out

    def _count_or_eager(self, mode, tracker, args, kwargs) -> _GraphCounts:
        try:
            return self._count_on_fake(mode, tracker, args, kwargs)
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

    def _count_on_fake(self, mode, tracker, args, kwargs) -> _GraphCounts:
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
        fake_run = flex.FakeRun({id(a): i for i, a in enumerate(fake) if isinstance(a, Tensor)},
                               self.block_sparse)
        fake_runs.FAKE_RUNS.append(fake_run)
        try:
            with _disable_current_modes(), mode, torch.enable_grad() \
                    if torch.is_grad_enabled() else contextlib.nullcontext():
                outs = _Interpreter(self.gm, frames).run(*fake)
                tracker.resume(running, saved[0])
                middle = list(map(_calls, records))
                found[0] = _tallied(records)
                outs = _sinks([o for o in flat(outs)
                               if isinstance(o, Tensor) and o.requires_grad])
                inputs = [a for a in fake if isinstance(a, Tensor) and a.requires_grad]
                if outs and inputs:
                    fake_run.backward = True
                    with _disable_current_modes():
                        # as a loss reduced outside the graph hands it: one value, expanded
                        grads = [torch.ones((), dtype=o.dtype, device=o.device).expand(o.shape)
                                 for o in outs]
                    torch.autograd.grad(outs, inputs, grads, allow_unused=True)
                found[1] = _tallied(records, found[0])
        except BaseException:  # the fake run counts nothing itself, failed or not
            for i, rec in enumerate(records):
                rec[CALLS] = before[0][i] if i < len(before[0]) else 0
                rec[NS] = before[1][i] if i < len(before[1]) else 0
            raise
        finally:
            _restore_tallies(records, held)
            fake_runs.FAKE_RUNS.remove(fake_run)
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
            rec[CALLS] = was  # the fake run counts nothing itself
            rec[NS] = ns0[i] if i < len(ns0) else 0
        tallies = fake_run.tallies + [_ShapeMasks(list(f.values()), bool(i))
                                     for i, f in enumerate(found) if f]
        return _GraphCounts(forward, backward, list(frames.calls.items()), tallies)


def _symbolic(value) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        return True
    if isinstance(value, Tensor):
        return any(isinstance(s, torch.SymInt) for s in value.shape)
    return False


class _ShapeMasks:
    """The masked pairs a fake run found in masks its fake tensors built from shapes
    (SDPA's math decomposition's causal mask, transformers' causal and sliding-window
    masks: engine.masks follows them on fake tensors as on meta), added again at every run
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
    fake run finds is then its own, read as ints without reading a device's counts."""
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
            rec[TALLY].reset()  # a tally the fake run made starts at zero
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


class GraphRuns:
    """What the compiled graphs run under one counter did, kept by its tracker
    (``ModuleTracker.graph_runs``): ``ran``, the counts of each graph it ran, by id (the
    module calls they make: see ``_GraphCounts``), and ``times``, each module stack's
    ``[runs, forward ns, backward ns]`` of the graphs run from it (timing on)."""

    __slots__ = ("ran", "times")

    def __init__(self) -> None:
        self.ran: dict[int, _GraphCounts] = {}
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
    names = {frame.name for counted in runs.ran.values() for frame, _ in counted.calls}
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
