"""CUDA graphs under a counter: a graph captured while a counter counts keeps its counts, and
every replay inside a counter adds them again.

**Capture counts nothing itself.** Capturing runs no kernel: the ops dispatched between
``capture_begin`` and ``capture_end`` (``torch.cuda.graph``, ``make_graphed_callables``,
inductor's cudagraph trees) only record work that each ``replay()`` then runs. So the counts
those ops added to the capturing counter's records are taken out again at ``capture_end`` and
kept as the graph's *per-replay* counts (calls per record, with the module stack, phase and
signature of each, and the module calls made), and each replay inside a counter adds them: N
replays count N times the captured work, as N eager runs would.

**Where a replay's counts go.** To the modules that ran at capture when the replaying counter
counts the same model as the capturing one (the same stacks of names, in its own ledger);
otherwise (no model then or now, another model) to the module running around the replay, in
the phase captured. A graph captured with no counter counting has no counts: each replay inside
a counter is then an unsupported row ``cuda_graph:replay`` (calls, flops unknown) under the
module around it; with ``timing="kernels"`` its kernels are ``kernel:<name>`` rows as well.

**Time** (``timing="kernels"``). A replay's kernels all carry its ``cudaGraphLaunch``'s
correlation, so they cannot be told apart by launch. Where torch can name each graph node's
op (``torch.cuda._graph_annotations``: ``cudaGraphNodeGetToolsId``, cuda.bindings and a CUDA
13.1 driver), the counting mode's runner is wrapped for the length of the capture so that each
op is a ``mark_kernels`` scope, and the kernels Kineto reports with that ``graph node id`` go
to the op's record; the rest go to the module around the replay as ``kernel:<name>`` rows
(``engine.timing.kernels.join``). A replay's records join the kernel sampler like dispatched ops':
learned on sampled blocks, estimated per call between them. Host clock and CUDA-event timing
give replays no time per op.

**Never patched while no counter counts.** ``capture_begin``, ``capture_end`` and ``replay`` of
``torch.cuda.CUDAGraph`` are wrapped when the first counter enters and put back when the last
one leaves (by a torch built with CUDA only: on a CPU build no graph can exist); the user's
graph objects are never written to (what a graph captured is kept in a ``WeakKeyDictionary``).
A replay or capture with the counting modes off the dispatch stack (a compiled graph's run:
``runs.Without``, whose counts are the compiled graph's) is left alone, as is one on
another thread than the counter's.
"""

from __future__ import annotations

import weakref
from collections import Counter
from contextlib import ExitStack
from typing import Any, Callable, Optional

import torch

from dispatch_flops.engine.counting import active
from dispatch_flops.engine.counting.ledger import BACKWARD_I, Frame
from dispatch_flops.engine.counting.records import CALLS, NS, SIGNATURE
from dispatch_flops.engine.torch_private import get_current_dispatch_mode_stack as _mode_stack
from dispatch_flops.engine.torch_private import lookup
from dispatch_flops.results.rows import ROW, RowKey
from dispatch_flops.results.stats import PHASES, UNSUPPORTED, Phase

REPLAY_ROW = "cuda_graph:replay"  # the operator of a replay whose graph has no counts
# the classes whose captures and replays are followed: torch.cuda's (a name) and the tests'
# stand-ins (classes)
TARGETS: list = ["CUDAGraph"]
_METHODS = ("capture_begin", "capture_end", "replay")

_COUNTING = active.COUNTING  # (mode, tracker) of every counter counting now
_PATCHED: list = []  # (class, method name, the class's own function)
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> PerReplay
_CAPTURING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> _Capture
_UNCOUNTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tracker -> Counter


# -- what a graph captured ----------------------------------------------------------------


class _Op:
    """One record's share of a capture: ``calls`` of ``key`` (signature) in phase ``phase``
    of the frame whose stack is ``stack``."""

    __slots__ = ("stack", "phase", "key", "signature", "func", "calls")

    def __init__(self, stack, phase, key, signature, func, calls):
        self.stack, self.phase, self.key = stack, phase, key
        self.signature, self.func, self.calls = signature, func, calls


class _Variant:
    """What one capturing counter counted: ``ops``, ``module_calls`` (``(stack, calls)``;
    ``root_calls``, the model's own), ``model`` (a weak reference, None without one) and
    ``nodes`` (graph node tools id -> index into ``ops``, where torch named them)."""

    __slots__ = ("model", "ops", "module_calls", "root_calls", "nodes")

    def __init__(self, model, ops, module_calls, root_calls, nodes):
        self.model, self.ops, self.module_calls = model, ops, module_calls
        self.root_calls, self.nodes = root_calls, nodes

    def same_model(self, tracker) -> bool:
        mine = self.model() if self.model is not None else None
        return mine is tracker.model


class PerReplay:
    """A captured graph's counts, added by each replay (``add_to``)."""

    __slots__ = ("variants", "_targets")

    def __init__(self, variants: list):
        self.variants = variants
        # ledger -> {frame id or None: (records per op, frames per module call)}
        self._targets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _variant(self, tracker) -> tuple:
        for variant in self.variants:
            if variant.same_model(tracker):
                return variant, True
        return self.variants[0], False

    def targets(self, mode, tracker) -> tuple:
        """Where one replay's counts go in ``tracker``'s ledger: ``(variant, records, module
        frames, by_stack)``, the records (made where missing) in the order of
        ``variant.ops``."""
        variant, by_stack = self._variant(tracker)
        ledger = tracker.ledger
        cache = self._targets.get(ledger)
        if cache is None:
            cache = self._targets[ledger] = {}
        home: Optional[Frame] = None if by_stack else tracker.current
        found = cache.get(id(home) if home is not None else None)
        if found is None or (home is not None and found[2] is not home):
            found = _targets(variant, mode, ledger, home, by_stack)
            cache[id(home) if home is not None else None] = found
        return variant, found[0], found[1], by_stack

    @staticmethod
    def add(tracker, variant: _Variant, records: list, frames: list, by_stack: bool) -> None:
        """One replay's counts, added where ``targets`` said."""
        for rec, op in zip(records, variant.ops):
            rec[CALLS] += op.calls
        for frame, calls in frames:
            frame.calls += calls
        if by_stack:
            tracker.root_calls += variant.root_calls


def _frame_at(ledger, stack: tuple) -> Frame:
    frame = ledger.root
    for name in stack[1:]:
        frame = frame.child(name, ledger.frames)
    return frame


def _targets(variant: _Variant, mode, ledger, home: Optional[Frame], by_stack: bool) -> tuple:
    """The records (made where missing) and module frames a replay adds to in ``ledger``."""
    records = []
    for op in variant.ops:
        frame = _frame_at(ledger, op.stack) if home is None else home
        acc = frame.acc[op.phase]
        rec = acc.get(op.key)
        if rec is None:
            rec = acc[op.key] = [0, 0, op.signature]
            mode.book(rec)
        op_id = op.key if op.key.__class__ is int else op.key[0]
        if op_id not in mode.resolved and op.func is not None:  # another registry
            mode.resolve(op.func)
        records.append(rec)
    frames = [(_frame_at(ledger, stack), calls) for stack, calls in variant.module_calls] \
        if by_stack else []
    return records, frames, home


class _Capture:
    """The counts of every counter counting on this thread when a capture began, so that
    ``finish`` can take out what the capture added."""

    def __init__(self, counters: list, annotations) -> None:
        self.before = []
        for mode, tracker in counters:
            ledger = tracker.ledger
            self.before.append((mode, tracker, [r[CALLS] for r in ledger.records],
                                [r[NS] for r in ledger.records],
                                [(f.calls, f.span[0]) for f in ledger.frames],
                                tracker.root_calls))
        self.annotations = annotations
        self.labels: dict = {}  # op label -> the record the op was counted in (annotated)
        self.swapped: Optional[tuple] = None  # (mode, the _Annotating it put around its runner)

    def finish(self, nodes: dict) -> Optional[PerReplay]:
        """Every count the capture added, taken out and returned as per-replay counts
        (``nodes``: tools id -> op label, where annotated)."""
        variants = []
        for k, (mode, tracker, calls0, ns0, frames0, root0) in enumerate(self.before):
            ledger = tracker.ledger
            where = {id(rec): (frame, i, key) for frame in ledger.frames
                     for i, acc in enumerate(frame.acc) for key, rec in acc.items()}
            ops: list[_Op] = []
            index: dict[int, int] = {}
            for j, rec in enumerate(ledger.records):
                was = calls0[j] if j < len(calls0) else 0
                added = rec[CALLS] - was
                rec[CALLS] = was
                rec[NS] = ns0[j] if j < len(ns0) else 0
                place = where.get(id(rec))
                if added <= 0 or place is None:
                    continue
                frame, phase, key = place
                op_id = key if key.__class__ is int else key[0]
                resolved = mode.resolved.get(op_id)
                index[id(rec)] = len(ops)
                ops.append(_Op(frame.stack, phase, key, rec[SIGNATURE],
                               resolved.func if resolved is not None else None, added))
            module_calls = []
            for j, frame in enumerate(ledger.frames):
                calls, span = frames0[j] if j < len(frames0) else (0, 0)
                if frame.calls > calls:
                    module_calls.append((frame.stack, frame.calls - calls))
                frame.calls, frame.span[0] = calls, span
            root_calls, tracker.root_calls = tracker.root_calls - root0, root0
            tools = {}
            if k == 0:  # the bottom counter's runner was the one annotated
                for tools_id, label in nodes.items():
                    rec = self.labels.get(label)
                    if rec is not None and id(rec) in index:
                        tools[tools_id] = index[id(rec)]
            model = tracker.model
            variants.append(_Variant(weakref.ref(model) if model is not None else None,
                                     ops, module_calls, root_calls, tools))
        return PerReplay(variants) if variants else None


class _Annotating:
    """The bottom counting mode's runner during a capture: each op inside a
    ``mark_kernels`` scope labelled by its number, noting the record it was counted in."""

    def __init__(self, runner, capture: _Capture) -> None:
        self.runner = runner
        self.capture = capture
        self.next = 0

    def run(self, resolved, args, kwargs):
        label = self.next
        self.next += 1
        with self.capture.annotations.scope(label):
            if self.runner is None:
                func = resolved.run
                return (func(*args, **kwargs) if kwargs else func(*args)), (label, None)
            out, token = self.runner.run(resolved, args, kwargs)
        return out, (label, token)

    def add(self, counts: list, index: int, token) -> None:
        label, inner = token if isinstance(token, tuple) else (None, token)
        if label is not None:
            self.capture.labels[label] = counts
        if self.runner is None:
            counts[CALLS] += 1
        else:
            self.runner.add(counts, index, inner)

    def __getattr__(self, name):  # what else the mode's code reads of its runner
        return getattr(self.runner, name)


class TorchAnnotations:
    """torch's graph-node annotations (``torch.cuda._graph_annotations``, torch 2.13): a
    label per captured op, read back by tools id. Available with cuda.bindings and a driver
    that has ``cudaGraphNodeGetToolsId`` (CUDA 13.1); the user's own annotations and the
    module's enabled flag are left as they were."""

    KEY = "dispatch_flops"

    def __init__(self) -> None:
        self.module = lookup("torch.cuda._graph_annotations")
        self._enabled = False

    def available(self) -> bool:
        module = self.module
        if module is None:
            return False
        try:
            return not module._is_tools_id_unavailable()
        except Exception:  # a probe that fails: no annotations, counting unaffected
            return False

    def begin(self) -> None:
        self._enabled = self.module._annotations_enabled
        self.module.enable_annotations()

    def scope(self, label):
        return self.module.mark_kernels({self.KEY: label})

    def end(self, graph) -> dict:
        """``{tools id: label}`` of this capture's ops; ours taken out of torch's map."""
        module = self.module
        found: dict = {}
        try:
            module.resolve_pending_annotations()
            module.remap_to_exec_graph(graph)
            kept = module.get_kernel_annotations()
            for tools_id in list(kept):
                left = []
                for annotation in kept[tools_id]:
                    if isinstance(annotation, dict) and self.KEY in annotation:
                        found[tools_id] = annotation[self.KEY]
                        annotation = {k: v for k, v in annotation.items() if k != self.KEY}
                        if not annotation:
                            continue
                    left.append(annotation)
                if left:
                    kept[tools_id] = left
                else:
                    del kept[tools_id]
        except Exception:  # keep_graph=True (no exec graph yet) and the like: no mapping
            found = {}
        finally:
            if not self._enabled:
                module.disable_annotations()
        return found


ANNOTATIONS: Callable[[], Any] = TorchAnnotations  # what names graph nodes (the tests' seam)


# -- the wrapped methods --------------------------------------------------------------------


_INSIDE: set = set()  # (graph id, method) being followed: a subclass's super() call passes


def _capture_begin(original):
    def capture_begin(self, *args, **kwargs):
        counters = active.counting_here(on_stack=True) if _COUNTING else []
        if not counters or (id(self), "begin") in _INSIDE:
            return original(self, *args, **kwargs)
        # graph nodes are named only for kernel timing (what their time goes to)
        annotations = ANNOTATIONS() if any(t.timer is not None and t.timer.kernel_tokens
                                           for _, t in counters) else None
        if annotations is not None and not annotations.available():
            annotations = None
        capture = _Capture(counters, annotations)
        _INSIDE.add((id(self), "begin"))
        try:
            result = original(self, *args, **kwargs)
        finally:
            _INSIDE.discard((id(self), "begin"))
        _CAPTURING[self] = capture
        if annotations is not None:
            # the bottom counting mode runs the op (the ones above relay or re-dispatch)
            bottom: Any = next(c for m in _mode_stack() for c, _ in counters if m is c)
            annotations.begin()
            capture.swapped = (bottom, bottom.wrap_runner(
                lambda runner: _Annotating(runner, capture)))
        return result

    return capture_begin


def _capture_end(original):
    def capture_end(self, *args, **kwargs):
        capture = _CAPTURING.pop(self, None)
        if capture is None:
            return original(self, *args, **kwargs)
        if capture.swapped is not None:
            mode, annotating = capture.swapped
            mode.unwrap_runner(annotating)
        ok = False
        try:
            result = original(self, *args, **kwargs)
            ok = True
        finally:
            nodes = capture.annotations.end(self) if capture.annotations is not None and ok \
                else {}
            per = capture.finish(nodes)  # taken out whether the capture ended or failed
            if ok and per is not None:
                _GRAPHS[self] = per
        return result

    return capture_end


def _replay(original):
    def replay(self, *args, **kwargs):
        counters = active.counting_here(on_stack=True) if _COUNTING else []
        if not counters or (id(self), "replay") in _INSIDE:
            return original(self, *args, **kwargs)
        per = _GRAPHS.get(self)
        adds = []
        with ExitStack() as ranges:
            timed = False  # one Kineto session records: the first kernel timer's
            for mode, tracker in counters:
                if per is None:
                    adds.append((tracker, None))
                    continue
                found = per.targets(mode, tracker)
                adds.append((tracker, found))
                timer = tracker.timer
                if timer is not None and timer.kernel_tokens and not timed:
                    timed = True
                    variant, records = found[0], found[1]
                    nodes = {tools_id: [(records[i], NS)] for tools_id, i in
                             variant.nodes.items()}
                    scope = timer.graph_replay(nodes)
                    if scope is not None:
                        ranges.enter_context(scope)
            _INSIDE.add((id(self), "replay"))
            try:
                result = original(self, *args, **kwargs)
            finally:
                _INSIDE.discard((id(self), "replay"))
        for tracker, found in adds:  # counted once it ran (a replay that raised ran nothing)
            if found is None:
                _note_uncounted(tracker)
            else:
                PerReplay.add(tracker, *found)
                if tracker.timer is not None:
                    tracker.timer.replayed(found[1])
        return result

    return replay


def _note_uncounted(tracker) -> None:
    notes = _UNCOUNTED.get(tracker)
    if notes is None:
        notes = _UNCOUNTED[tracker] = Counter()
    frame = tracker.current
    forward = tracker.state.forward_acc
    phase = next((i for i, acc in enumerate(frame.acc) if acc is forward), 0)
    if _current_node() is not None:  # autograd is running a node: backward
        phase = BACKWARD_I
    notes[frame.stack, phase] += 1


def _current_node():
    current = lookup("torch._C._current_autograd_node")
    return current() if current is not None else None


def uncounted_rows(tracker) -> tuple:
    """Rows for the replays of graphs with no counts (captured with no counter counting):
    operator ``cuda_graph:replay``, unsupported, calls only."""
    notes = _UNCOUNTED.get(tracker)
    if not notes:
        return ()
    width = len(ROW)
    return tuple((RowKey(stack, Phase(PHASES[phase]), REPLAY_ROW, "replay", UNSUPPORTED, None),
                  (calls,) + (0,) * (width - 1)) for (stack, phase), calls in notes.items())


# -- installing while counters count --------------------------------------------------------

_WRAPPERS = {"capture_begin": _capture_begin, "capture_end": _capture_end, "replay": _replay}


def _patch() -> None:
    # a torch built without CUDA captures and replays no graph: torch.cuda's class is left as
    # it is (a fresh counter per step patched and unpatched it every step; setting a class's
    # attribute also drops the interpreter's caches for it). Asked of the build, not the
    # driver: ``torch.cuda.is_available()`` would initialise it and poison fork for the rest
    # of the process, where a counter that times nothing never touched CUDA
    cuda = torch.backends.cuda.is_built()
    for target in TARGETS:
        if isinstance(target, str):
            cls = getattr(torch.cuda, target, None) if cuda else None
        else:
            cls = target
        if cls is None:
            continue
        for name in _METHODS:
            original = cls.__dict__.get(name)  # its own: an inherited one is its base's
            if original is None:
                continue
            _PATCHED.append((cls, name, original))
            wrapper = _WRAPPERS[name](original)
            vars(wrapper)["__wrapped__"] = original
            setattr(cls, name, wrapper)


def _unpatch() -> None:
    while _PATCHED:
        cls, name, original = _PATCHED.pop()
        setattr(cls, name, original)


def _leaving(mode) -> None:
    """A counter leaves: a capture of its that never ended gives its runner back."""
    for capture in list(_CAPTURING.values()) if _CAPTURING else ():
        swapped = capture.swapped
        if swapped is not None and swapped[0] is mode:
            mode.unwrap_runner(swapped[1])


# captures and replays are followed while a counter counts
active.when_first(_patch)
active.when_leaving(_leaving)
active.when_last(_unpatch)
