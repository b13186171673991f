"""Module tracker: which modules are running, for forward ops and for the backward ops
their autograd nodes run later.

Each distinct running stack of modules is one interned ``Frame``; a frame holds the per-op
accumulators of the ops run under it, one per phase. A forward pre/post hook pair moves the
tracker between frames (one dict lookup, no tuple building) and notes the autograd sequence
number (``torch.autograd._get_sequence_nr()``) at every move: a node created while the counter
reads ``s`` was created under the frame entered last at or before ``s``. In backward,
``torch._C._current_autograd_node()`` names the running node, so its ops go to the module
whose forward created it, whether or not that module's inputs required grad.
"""

from __future__ import annotations

import threading
import weakref
from operator import attrgetter, itemgetter
from typing import Optional

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from ._results import BACKWARD, FORWARD, OPTIMIZER, RECOMPUTE, ROOT

ACCUMULATE_GRAD_SEQ = 2**64 - 1  # AccumulateGrad nodes carry the largest sequence number
# an op record: [calls, flops, macs, bytes_read, bytes_written, ns, signature entry or None]
RECORD_FIELDS = 7
# module boundaries kept for attributing backward ops (see _forget_oldest_boundaries)
BOUNDARY_WINDOW = 100_000
_sequence_nr = torch.autograd._get_sequence_nr
_current_node = torch._C._current_autograd_node
top_saved_tensors_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def walk_modules(model: nn.Module) -> tuple[dict[int, str], list[nn.Module]]:
    """``{id(module): name}`` and the modules, in ``model.named_modules()`` order with its
    names and de-duplication, walked without recursive generators: it runs on every
    counter's entry."""
    name_of: dict[int, str] = {}
    modules: list[nn.Module] = []
    todo = [(ROOT, model)]
    while todo:
        name, module = todo.pop()
        if id(module) in name_of:
            continue
        name_of[id(module)] = name
        modules.append(module)
        children = module._modules
        if children:
            prefix = name + "." if name else ""
            for key, child in reversed(list(children.items())):
                if child is not None:
                    todo.append((prefix + key, child))
    return name_of, modules


def static_prefixes(name: str) -> list[str]:
    """'a.b.c' -> ['a', 'a.b', 'a.b.c']; the root has none."""
    if name == ROOT:
        return []
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


class Frame:
    """One running stack of modules, root first, with the ops counted under it.

    Each phase's accumulator maps an op key to ``[calls, flops, macs, bytes_read,
    bytes_written, ns]``; the dispatch mode writes them, the report reads them."""

    __slots__ = ("name", "parent", "stack", "children", "calls", "forward", "backward",
                 "optimizer", "recompute", "span", "saved", "book")

    def __init__(self, name: str, parent: Optional["Frame"], book: Optional[list] = None):
        self.name = name
        self.parent = parent
        # every frame of the tree, in the order they were made (parents before children)
        self.book: list = parent.book if parent is not None else book if book is not None else []
        self.book.append(self)
        self.stack: tuple = (name,) if parent is None else parent.stack + (name,)
        self.children: dict[str, Frame] = {}
        self.calls = 0  # forward calls of the module that entered this frame
        self.forward: dict = {}
        self.backward: dict = {}
        self.optimizer: dict = {}  # only the root's is used: a step is no module's
        self.recompute: dict = {}  # forward ops re-run by activation checkpointing
        self.span = [0]  # ns inside this frame's module calls, hook to hook (timing on)
        self.saved = 0  # bytes saved for backward by the ops run directly under this frame

    def child(self, name: str) -> "Frame":
        frame = self.children.get(name)
        if frame is None:
            frame = self.children[name] = Frame(name, self)
        return frame

    def accumulators(self):
        """(phase, {op key: counts}) for every phase."""
        return ((FORWARD, self.forward), (BACKWARD, self.backward),
                (OPTIMIZER, self.optimizer), (RECOMPUTE, self.recompute))


# a ledger holding more records is replaced: each counter's snapshots and report walk them all
_LEDGER_RECORDS_CAP = 10_000


class Ledger:
    """The frames and op records of counting one model, kept from one counter to the next.

    A counter that finds its model's ledger free counts into it: the frames and records its
    ops need are already there, so entering a new ``FlopCounter(model)`` every step costs what
    keeping one open does. Counts only grow; each counter snapshots them when it enters and
    when it leaves, and reads its own results as the difference (see ``ModuleTracker``).
    A ledger counts for one counter at a time: a nested counter gets a new one."""

    __slots__ = ("root", "frames", "records", "priced", "busy", "last_end", "home")

    def __init__(self):
        self.frames: list[Frame] = []  # every frame, in the order they were made
        self.records: list[list] = []  # every op record of every frame, in the same order
        # the records priced as they were counted (unhashable, symbolic, sizes), whose flops
        # and bytes fields grow too; all others only grow their calls and ns
        self.priced: list[list] = []
        self.busy = False
        # the snapshot its last counter ended on: nothing counts into a ledger between two
        # counters, so it is where the next one starts
        self.last_end: Optional[tuple] = None
        self.home: Optional[tuple] = None  # (ledgers, key) where shared_ledger keeps it
        self.root = Frame(ROOT, None, self.frames)

    def retire(self) -> None:
        """Never hand this ledger to another counter (a mode still counts into it)."""
        if self.home is not None:
            ledgers, key = self.home
            found = ledgers.get(key)
            if found is not None and found[1] is self:
                del ledgers[key]

    def snapshot(self) -> tuple:
        """What grows: every record's calls and ns, the priced records' fields, every frame's
        calls, span ns and saved bytes."""
        return (list(map(_calls_field, self.records)), list(map(_ns_field, self.records)),
                [rec[:] for rec in self.priced], list(map(_calls_of, self.frames)),
                [f.span[0] for f in self.frames], list(map(_saved_of, self.frames)))


_calls_field = itemgetter(0)
_ns_field = itemgetter(5)
_calls_of = attrgetter("calls")
_saved_of = attrgetter("saved")


def shared_ledger(cache: dict, model: nn.Module, options) -> Optional[Ledger]:
    """The ledger of ``model`` under ``options``, kept in ``cache`` (the registry's lookup
    cache: a registry change starts new ledgers) while the model lives; a new one when it is
    too large (shapes that keep changing); None when it is counting already (a nested
    counter keeps a ledger of its own)."""
    with _LEDGERS_LOCK:  # two threads entering counters on one model get a ledger each
        ledgers = cache.setdefault("ledgers", {})
        key = (id(model), options)
        found = ledgers.get(key)
        if found is not None and found[0]() is model:
            ledger = found[1]
            if ledger.busy:
                return None
            if len(ledger.records) < _LEDGER_RECORDS_CAP:
                ledger.busy = True
                return ledger
        ledger = Ledger()
        ledger.busy = True
        ledger.home = (ledgers, key)
        ref = weakref.ref(model, lambda _, ledgers=ledgers, key=key: ledgers.pop(key, None))
        ledgers[key] = (ref, ledger)
        return ledger


_LEDGERS_LOCK = threading.Lock()


class ModuleTracker:
    """Maintains the running frame of ``model`` through hooks it removes on detach, and tells
    ``mode`` (through ``mode.forward_acc``) where forward ops go.

    >>> tracker = ModuleTracker(model, mode)
    >>> tracker.attach(); model(x); tracker.detach()
    """

    def __init__(self, model: Optional[nn.Module], mode, timer=None,
                 ledger: Optional[Ledger] = None):
        self.model = model
        self.mode = mode
        self.timer = timer
        self._open: list = []  # (frame, start mark) of module calls running, when timing
        # a shared ledger (see Ledger) is read through snapshots; a private one directly
        self.shared = ledger is not None
        self.ledger = ledger if ledger is not None else Ledger()
        self._base = (self.ledger.last_end or self.ledger.snapshot()) if self.shared else None
        self._end: Optional[tuple] = None
        self._view: Optional[Frame] = None
        self.root = self.ledger.root
        self.current = self.root
        # frame entered at each module boundary, with the sequence number noted there; the
        # sentinel makes ``frames[bisect_right(seqs, s) - 1]`` valid for any s
        self.boundary_seqs: list[int] = [-1]
        self.boundary_frames: list[Frame] = [self.root]
        self.root_calls = 0
        self._modules: list[nn.Module] = []
        self._name_of: dict[int, str] = {}
        self._param_owner: Optional[dict[int, str]] = None
        self._accumulation_frames: dict[int, Frame] = {}
        self._first_frames: dict[str, Frame] = {}  # each module's first frame
        self._handles: list = []
        self._optimizer_depth = 0  # optimizer.step() calls running
        self._saved_seen: Optional[set] = None  # storages charged, when watching saved ones
        self._param_storages: set = set()
        self._recompute_depth = 0  # module calls running inside backward (checkpointing)
        self._resume = self.root  # the frame to go back to when recomputing ends
        # (saved-tensors pack hook, frame): where the last recomputation's modules sit
        self.recompute_home: tuple = (None, self.root)
        mode.forward_acc = self.root.forward

    # -- lifecycle --------------------------------------------------------------------------
    def attach(self) -> None:
        """Global hooks: optimizer step pre/post, and (with a model) module forward pre/post,
        filtered to the model's modules by identity: a few registrations however large the
        model is."""
        try:
            self._handles.append(register_optimizer_step_pre_hook(self._step_begins))
            self._handles.append(register_optimizer_step_post_hook(self._step_ends))
            if self.model is None:
                return
            self._name_of, self._modules = walk_modules(self.model)
            self._handles.append(register_module_forward_pre_hook(self._push))
            self._handles.append(register_module_forward_hook(self._pop, always_call=True))
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def close(self) -> None:
        """Counting is over: keep this counter's end of a shared ledger and free it. A mode
        left installed (counters left out of order, or a failed exit) may go on counting into
        the ledger: then the ledger is retired, not freed, and the mode keeps its tracker."""
        left_installed = self.mode in _get_current_dispatch_mode_stack()
        if not left_installed:
            self.mode.tracker = None  # no cycle left for the garbage collector to find
        if self.shared and self._end is None:
            self._end = self.ledger.snapshot()
            if left_installed:
                self.ledger.retire()
            else:
                self.ledger.last_end = self._end
                self.ledger.busy = False

    # -- hooks ------------------------------------------------------------------------------
    def _enter(self, frame: Frame) -> None:
        self.current = frame
        self.mode.forward_acc = (frame.recompute if self._recompute_depth
                                 else frame.optimizer if self._optimizer_depth else frame.forward)
        self.boundary_seqs.append(_sequence_nr())
        self.boundary_frames.append(frame)
        if len(self.boundary_frames) > 2 * BOUNDARY_WINDOW:
            self._forget_oldest_boundaries()

    def _forget_oldest_boundaries(self) -> None:
        """Keep a counter open for a whole training run in bounded memory: only the last
        ``BOUNDARY_WINDOW`` module boundaries (a module call makes two) are kept, in place (the
        mode holds the lists). Backward ops of a node created before them go to the root's
        frame (the sentinel kept at the front): only a graph built over more than 50,000
        module calls before its backward runs loses any attribution."""
        del self.boundary_seqs[1: -BOUNDARY_WINDOW]
        del self.boundary_frames[1: -BOUNDARY_WINDOW]

    def _push(self, module, args) -> None:
        name = self._name_of.get(id(module))
        if name is None:  # not one of the model's modules: ops stay with the enclosing one
            return
        if self._recompute_depth or _current_node() is not None:
            return self._push_recompute(name)
        if name == ROOT:
            self.root_calls += 1
            frame = self.root
            if self.current is self.root and self._saved_seen is not None:
                self._saved_seen.clear()  # a new step: storages of the last may be reused
        else:
            frame = self.current.children.get(name)
            if frame is None:
                frame = self.current.child(name)
            if name not in self._first_frames:  # per counter: a ledger's frames outlive it
                self._first_frames[name] = frame
            frame.calls += 1
            self._enter(frame)
        if self.timer is not None:
            self._open.append((frame, self.timer.mark()))

    def _push_recompute(self, name: str) -> None:
        """A module called while autograd runs a node: activation checkpointing re-running
        forward (reentrant or not). Its ops go to the recompute phase of the module's frame,
        placed where the module ran in forward; no call or time is added to forward's."""
        if not self._recompute_depth:
            self._resume = self.current
            first = self._first_frames.get(name)
            self.current = first.parent if first is not None and first.parent else self.root
            # for the ops between its module calls, with the recomputation they belong to
            hooks = top_saved_tensors_hooks(False)
            self.recompute_home = (hooks[0] if hooks is not None else None, self.current)
            self.mode.recomputing = True
        self._recompute_depth += 1
        if name != ROOT:
            self._enter(self.current.child(name))

    def _pop(self, module, args, output) -> None:
        name = self._name_of.get(id(module))
        if name is None:
            return
        if self._recompute_depth:
            return self._pop_recompute(name)
        if name == ROOT:
            frame = self.root
        else:
            frame = self.current
            while frame.name != name:  # an inner module left without its hook running
                frame = frame.parent
                if frame is None:
                    return
            self._enter(frame.parent)
        if self.timer is not None:
            self._close(frame)

    def _pop_recompute(self, name: str) -> None:
        if name != ROOT:
            frame = self.current
            while frame.name != name and frame.parent is not None:
                frame = frame.parent
            self._enter(frame.parent if frame.parent is not None else self.root)
        self._recompute_depth -= 1
        if not self._recompute_depth:
            self.mode.recomputing = False
            self.current = self._resume
            self.mode.forward_acc = self._resume.forward

    # -- saved activations (FlopCounter(saved_activations=True)) -----------------------------
    def watch_saved(self) -> None:
        """Start charging tensors saved for backward to the frame that saves them: each
        storage once (the first saver), parameters' storages never."""
        self._saved_seen = set()
        self._param_storages = {
            p.untyped_storage()._cdata for p in self.model.parameters()
        } if self.model is not None else set()

    def pack(self, tensor):
        """``saved_tensors_hooks`` pack hook: note the bytes, keep the tensor as it is."""
        if not self._recompute_depth:
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
                return tensor
            key = storage._cdata
            if key not in self._saved_seen and key not in self._param_storages:
                self._saved_seen.add(key)
                self.current.saved += storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor):
        return tensor

    def _step_begins(self, optimizer, args, kwargs) -> None:
        self._optimizer_depth += 1  # modules called inside the step stay in its phase
        self.mode.forward_acc = self.current.optimizer

    def _step_ends(self, optimizer, args, kwargs) -> None:
        self._optimizer_depth = max(0, self._optimizer_depth - 1)
        if not self._optimizer_depth:
            self.mode.forward_acc = self.current.forward

    def _close(self, frame: Frame) -> None:
        """End the span of ``frame``'s module call (and of any inner call left unclosed)."""
        if not any(f is frame for f, _ in self._open):
            return
        end = self.timer.mark()
        while self._open:
            inner, start = self._open.pop()
            self.timer.span(inner.span, 0, start, end)
            if inner is frame:
                return

    # -- backward ---------------------------------------------------------------------------
    def frame_of_accumulation(self, node) -> Frame:
        """The frame of an AccumulateGrad node: the first frame its parameter's module ran in
        (a module that never ran: its place under the modules that did)."""
        key = id(getattr(node, "variable", None))
        frame = self._accumulation_frames.get(key)
        if frame is None:
            if self._param_owner is None:  # first gradient accumulation: build the map once
                self._param_owner = {}
                for name, module in zip(self._name_of.values(), self._modules):
                    for p in module._parameters.values():
                        if p is not None:
                            self._param_owner.setdefault(id(p), name)
            owner = self._param_owner.get(key)
            frame = self.root if owner is None else self.frame_of_name(owner)
            self._accumulation_frames[key] = frame
        return frame

    def frame_of_name(self, name: str) -> Frame:
        """The first frame module ``name`` ran in; for a module that never ran, its place
        under its called static ancestors."""
        frame = self._first_frames.get(name)
        if frame is None:
            frame = self.root
            for prefix in static_prefixes(name)[:-1]:
                frame = self._first_frames.get(prefix, frame)
            frame = frame.child(name)
        return frame

    # -- report -----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """The model's module names in ``named_modules()`` order (none without a model)."""
        return list(self._name_of.values())

    def counted_root(self) -> Frame:
        """The root of what this counter counted: the ledger's own tree when it is private; from
        a shared one, a tree of the differences between this counter's snapshots (the end one
        taken now while counting), with only the frames this counter ran."""
        if not self.shared:
            return self.root
        if self._view is not None:
            return self._view
        calls, ns, priced, frame_calls, spans, saved = self._end or self.ledger.snapshot()
        base_calls, base_ns, base_priced, base_frame_calls, base_spans, base_saved = self._base
        # the priced records' fields at both ends, the others' calls and ns
        ends = {id(rec): copy for rec, copy in zip(self.ledger.priced, priced)}
        starts = {id(rec): copy for rec, copy in zip(self.ledger.priced, base_priced)}
        index = {id(rec): i for i, rec in enumerate(self.ledger.records)}
        copies: dict[int, Frame] = {}
        active: set[int] = set()
        for i, frame in enumerate(self.ledger.frames[: len(frame_calls)]):
            if frame.parent is None:
                copy = Frame(frame.name, None)
            else:
                copy = copies[id(frame.parent)].child(frame.name)
            copies[id(frame)] = copy
            before = i < len(base_frame_calls)
            copy.calls = frame_calls[i] - (base_frame_calls[i] if before else 0)
            copy.span[0] = spans[i] - (base_spans[i] if before else 0)
            copy.saved = saved[i] - (base_saved[i] if before else 0)
            if copy.calls or copy.span[0] or copy.saved:
                active.add(id(copy))
            for (_, acc), (_, mine) in zip(frame.accumulators(), copy.accumulators()):
                for key, rec in acc.items():
                    at = index[id(rec)]
                    if at >= len(calls):  # made after this counter ended
                        continue
                    end = ends.get(id(rec))
                    if end is None:
                        known = at < len(base_calls)
                        n = calls[at] - (base_calls[at] if known else 0)
                        counts = [n, 0, 0, 0, 0, ns[at] - (base_ns[at] if known else 0),
                                  rec[-1]] if n else None
                    else:
                        start = starts.get(id(rec), (0,) * (RECORD_FIELDS - 1))
                        deltas = [a - b for a, b in zip(end[:-1], start)]
                        counts = deltas + [None] if any(deltas) else None
                    if counts is not None:
                        mine[key] = counts
                        active.add(id(copy))
        root = copies[id(self.ledger.root)]
        # leave out the frames this counter never ran: children come after their parents
        for copy in reversed(root.book):
            if copy.parent is not None and id(copy) not in active and not copy.children:
                del copy.parent.children[copy.name]
        if self._end is not None:
            self._view = root
        return root

    def frames(self) -> list[Frame]:
        """Every frame, root first, parents before children."""
        out, todo = [], [self.counted_root()]
        while todo:
            frame = todo.pop()
            out.append(frame)
            todo.extend(reversed(list(frame.children.values())))
        return out

    def spans(self) -> dict[str, int]:
        """ns inside each module's forward calls (timing on). A module re-entered by itself
        counts once (only frames with no ancestor of the same name count); a container that
        is never called itself (ModuleList) gets the spans of the modules it holds."""
        if self.timer is not None:
            self.timer.resolve()
        calls = self.call_counts()
        out: dict[str, int] = {}
        root = self.counted_root()
        todo = [(root, frozenset())]
        while todo:
            frame, above = todo.pop()
            if frame is not root or self.root_calls:
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

    def call_counts(self) -> dict[str, int]:
        """Forward calls of each module, over all the frames it ran in."""
        counts: dict[str, int] = {ROOT: self.root_calls}
        for frame in self.frames()[1:]:
            counts[frame.name] = counts.get(frame.name, 0) + frame.calls
        return counts

    def credited(self, stack: tuple, calls: dict[str, int]) -> set[str]:
        """Modules whose inclusive totals an op run under ``stack`` counts toward: every running
        module once, plus static ancestors never called themselves (ModuleList, ModuleDict)."""
        names = set(stack)
        for name in stack:
            for prefix in static_prefixes(name)[:-1]:
                if not calls.get(prefix):
                    names.add(prefix)
        return names
