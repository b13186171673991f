"""Records storage: the frames a counter's ops are counted under and the ledger that keeps
them (with every op record) from one counter on a model to the next.

A ``Frame`` is one running stack of modules; its ``acc`` holds one accumulator per phase
(``phase_of`` decides which), op key -> op record (see ``engine.counting.records``). A ``Ledger`` is
every frame and record of counting one model; ``shared_ledger`` hands a model's ledger to the
next counter on it.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from itertools import repeat
from operator import itemgetter, setitem
from typing import Any, Callable, Optional, Protocol

from torch import nn

from dispatch_flops.engine.counting.records import CALLS, NS, tallied
from dispatch_flops.results.stats import (
    BACKWARD,
    FORWARD,
    OPTIMIZER,
    OTHER,
    PHASES,
    RECOMPUTE,
    ROOT,
)

_ns = itemgetter(NS)

# indices into PHASES and into every frame's ``acc``
FORWARD_I, BACKWARD_I, OPTIMIZER_I, RECOMPUTE_I, OTHER_I = map(
    PHASES.index, (FORWARD, BACKWARD, OPTIMIZER, RECOMPUTE, OTHER))



class Clock(Protocol):
    """What counting and the graphs read of a counter's timer (``engine.timing.clock.Timer``,
    which counting does not import: the timing room stands above it)."""

    cuda: bool  # its times may land after the block (CUDA events resolved later)
    tracing: bool  # it keeps a timeline pointing at the records
    kernel_tokens: bool  # it times ops by their kernels (Kineto)

    def mark(self, block_end: bool = False) -> Any: ...

    def span(self, counts: list, index: int, start: Any, end: Any) -> None: ...

    def graph_replay(self, nodes: dict) -> Any: ...

    def replayed(self, records: Any) -> None: ...

def phase_of(*, node: bool, recompute: bool, optimizer: bool, outside: bool = False) -> int:
    """The one rule that decides an op's phase (an index into ``PHASES``):

    - ``recompute``: activation checkpointing is re-running forward inside backward (a module
      called while autograd runs a node, reentrant checkpointing's own node, or an op under
      non-reentrant checkpointing's recomputation hook);
    - ``optimizer``: inside ``optimizer.step()`` (torch's global step hooks), no node running;
    - ``other``: ``outside`` the model, a counter with a model: no module of it was running
      when the op ran (forward) or when its node was made (backward): a loss computed after
      the model, gradient clipping, loss scaling. Hardware flops, not model flops;
    - ``backward``: autograd is running a node (``node``);
    - ``forward``: anything else.

    The tracker asks it whenever its state changes and aims the mode's ``forward_acc`` at the
    answer; the mode asks it for each autograd node its ops run under; ``Outside`` asks it
    once for every phase."""
    if recompute:
        return RECOMPUTE_I
    if optimizer and not node:
        return OPTIMIZER_I
    if outside:
        return OTHER_I
    if node:
        return BACKWARD_I
    return FORWARD_I


class Frame:
    """One running stack of modules, root first, with the ops counted under it.

    ``acc[i]`` is phase ``PHASES[i]``'s accumulator: op key (an overload's id, or a
    signature) -> op record (see ``records``); the dispatch mode writes them."""

    __slots__ = ("name", "dotted", "parent", "stack", "children", "calls", "acc", "span")

    def __init__(self, name: str, parent: Optional["Frame"], frames: list):
        self.name = name
        self.dotted = name + "." if name else ""  # what the names of modules inside begin with
        self.parent = parent
        self.stack: tuple = (name,) if parent is None else parent.stack + (name,)
        self.children: dict[str, Frame] = {}
        self.calls = 0  # forward calls of the module that entered this frame
        self.acc: tuple = tuple({} for _ in PHASES)
        self.span = [0]  # ns inside this frame's module calls, hook to hook (timing on)
        frames.append(self)

    def child(self, name: str, frames: list) -> "Frame":
        frame = self.children.get(name)
        if frame is None:
            frame = self.children[name] = Frame(name, self, frames)
        return frame


class Outside(Frame):
    """Where ops go while none of the model's modules runs: the root's frame, each phase's
    accumulator the one ``phase_of(outside=True)`` names (forward and backward: ``other``).
    Not one of the ledger's frames (its accumulators are the root's); entered when the
    model's last running call ends, so the nodes made meanwhile get ``other`` too."""

    __slots__ = ("root",)

    def __init__(self, root: Frame):
        self.root = root
        self.name, self.dotted, self.parent, self.stack = root.name, root.dotted, None, root.stack
        self.children = root.children
        self.calls, self.span = 0, [0]
        self.acc = tuple(root.acc[phase_of(node=i == BACKWARD_I, recompute=i == RECOMPUTE_I,
                                           optimizer=i == OPTIMIZER_I, outside=True)]
                         for i in range(len(PHASES)))

    def child(self, name: str, frames: list) -> Frame:
        return self.root.child(name, frames)


# a ledger holding more records is replaced: every harvest walks them all
_LEDGER_RECORDS_CAP = 10_000


class Ledger:
    """The frames and op records of counting one model, kept from one counter to the next.

    A counter that finds its model's ledger free counts into it: the frames and records its
    ops need are already there, so entering a new ``FlopCounter(model)`` every step costs what
    keeping one open does. A counter that exits leaves its counts here (``holder``: how to
    hand them to it); the next counter on the model first hands them over, if that counter
    is still alive and has not read them yet, and sets them back to zero in place
    (``settle``): a counter nobody reads costs no copy. One counter at a time: a nested counter
    gets a ledger of its own (``busy``)."""

    # weakly referable: a compiled graph keeps what it priced in a ledger for as long as the
    # ledger lives (``compiled.Graph.priced``)
    __slots__ = ("root", "frames", "records", "busy", "home", "layout", "last",
                 "holder", "_outside", "__weakref__")

    def __init__(self):
        self.frames: list[Frame] = []  # every frame, in the order they were made
        self.records: list[list] = []  # every op record of every frame, in the order made
        self.busy = False
        self.home: Optional[tuple] = None  # (ledgers, key) where shared_ledger keeps it
        self.layout = None  # records.Layout of its records, rebuilt when records are added
        self.last = None  # the last Profile harvested: the next may share its views
        self.root = Frame(ROOT, None, self.frames)
        # the counts here are a finished counter's: holder() is the method that copies them
        # into it while it lives (counter._Settler: weak, no callback), else None
        self.holder: Optional[Callable[[], Optional[Callable[[], None]]]] = None
        self._outside: Optional[Outside] = None

    @property
    def outside(self) -> "Outside":
        """The root's ``Outside`` (made once: it holds no counts of its own)."""
        if self._outside is None:
            self._outside = Outside(self.root)
        return self._outside

    def retire(self) -> None:
        """Never hand this ledger to another counter (a mode still counts into it)."""
        if self.home is not None:
            ledgers, key = self.home
            found = ledgers.get(key)
            if found is not None and found[1] is self:
                del ledgers[key]

    def settle(self) -> None:
        """Hand the counts left here to the counter that made them (if it lives), then set
        them back to zero. Called under ``LEDGERS_LOCK``."""
        holder, self.holder = self.holder, None
        if holder is not None:
            take = holder()
            if take is not None:
                take()
            self.reset()

    def reset(self) -> None:
        """Every count back to zero, frames and records kept (their layout stays valid)."""
        records = self.records
        n = len(records)
        # each loop runs in C (map consumed by an empty deque): a ledger holds hundreds
        deque(map(setitem, records, repeat(CALLS, n), repeat(0, n)), maxlen=0)
        if any(map(_ns, records)):
            deque(map(setitem, records, repeat(NS, n), repeat(0, n)), maxlen=0)
        # the records holding a mask's tally: listed by the layout while it is current
        layout = self.layout
        held = layout.tallies(records) if layout is not None and layout.n == n \
            else tallied(records)
        for _, tally in held:
            tally.reset()
        for frame in self.frames:
            frame.calls = 0
            frame.span[0] = 0


def ledger_for(ledgers: dict, model: Optional[nn.Module], timer: Optional[Clock]
               ) -> Optional[Ledger]:
    """The sharing policy: a counter counts into its model's ledger (``shared_ledger``) unless
    it has no model (nothing to keep the ledger with) or times land in its records after the
    block (a CudaTimer's events resolved later, or a trace pointing at the records); None means a
    private ledger."""
    if model is None or timer is not None and (timer.cuda or timer.tracing):
        return None
    return shared_ledger(ledgers, model)


def shared_ledger(ledgers: dict, model: nn.Module) -> Optional[Ledger]:
    """The ledger of ``model``, kept in ``ledgers`` (the engine's cache for
    the registry's version: a registry change starts new ledgers) while the model lives; a new
    one when it is too large (shapes that keep changing); None when it is counting already (a
    nested counter keeps a ledger of its own)."""
    with LEDGERS_LOCK:  # two threads entering counters on one model get a ledger each
        key = id(model)
        found = ledgers.get(key)
        if found is not None and found[0]() is model:
            ledger = found[1]
            if ledger.busy:
                return None
            if len(ledger.records) < _LEDGER_RECORDS_CAP:
                ledger.settle()
                ledger.busy = True
                return ledger
        ledger = Ledger()
        ledger.busy = True
        ledger.home = (ledgers, key)

        def forget(_: weakref.ref) -> None:  # the model is gone: so is its ledger
            ledgers.pop(key, None)

        ledgers[key] = (weakref.ref(model, forget), ledger)
        return ledger


# guards the ledgers and a ledger's hand-over of a finished counter's counts (``settle``)
LEDGERS_LOCK = threading.RLock()  # re-entered: a formula priced under it may count
