"""The counting state: everything that changes while a counter counts, in one slotted object.

A ``FlopCounter`` makes one ``CountingState`` per block and hands it to its dispatch mode and
its module tracker; compiled graphs and workflows reach it through them. Each part has one
writer; the others read it, or change it through the named methods below:

=====================================  ==============================  ====================
part                                   written by                      through
=====================================  ==============================  ====================
``forward_acc``                        the tracker (its running frame  ``enter``, ``_aim``;
                                       and phase); compiled graphs     ``aim``, ``restore``
``boundary_seqs``, ``boundary_frames``  the tracker and its optimizer   ``enter``, ``steps``;
                                       steps; compiled graphs (their   ``sink_backward``
                                       backward's sink)
``recomputing``, ``recompute_home``    the tracker (checkpointing);    ``_push_recompute``;
                                       the mode's rechecks             ``unbound``
``stepping``, ``in_step``              the tracker; the mode's         ``watch_steps``;
                                       rechecks                        ``seen_in_step``
``replay``                             the tracker (a step replayed:   ``StepReplay``
                                       engine.counting.step_replay); the mode
                                       counts overloads into it
``last``                               the mode (hot path)             ``forget_node``
``p2p_tags``, ``pipeline``             workflows (pipeline stages);    ``tag_transfer``,
                                       the mode uses tags up           ``note_pipeline``
``ledger``, ``records``                the mode and a replayed step    ``book``
                                       add records
=====================================  ==============================  ====================

``WRITERS`` says the same as data: the engine files that may write each part (assign it, or
change the list or dict it holds, itself or through a local name for it), which
``tests/test_owners.py`` holds the package to. The accumulators ``forward_acc`` points at are
the ledger's frames': counting adds records to them wherever it counts.
``save``/``restore`` put every part a compiled graph's fake run changes back as it was.
The dispatch mode aliases the lists (``records``, the boundaries) when it binds, and loads
the state once per op: its hot path pays one attribute load per part it reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from torch import Tensor

from dispatch_flops.engine.counting.ledger import FORWARD_I
from dispatch_flops.results.stats import PHASES

if TYPE_CHECKING:
    from dispatch_flops.engine.counting.ledger import Frame, Ledger

NO_NODE: tuple = (None, None, -1)  # ``last`` before any autograd node ran

# each part's writers, by the name of the engine file (the module's table): this file's
# methods write for the others
WRITERS: dict[str, tuple[str, ...]] = {
    "ledger": ("state",),
    "records": ("state", "mode", "step_replay"),
    "forward_acc": ("state", "tracker"),
    "boundary_seqs": ("state", "tracker", "steps"),
    "boundary_frames": ("state", "tracker", "steps"),
    "last": ("state", "mode"),
    "recomputing": ("state", "tracker"),
    "recompute_home": ("state", "tracker"),
    "stepping": ("state",),
    "in_step": ("state",),
    "replay": ("state", "step_replay", "mode"),
    "p2p_tags": ("state",),
    "pipeline": ("state",),
}


class CountingState:
    """What one counter's counting changes, owned by the counter (see the module's table).

    >>> state = CountingState(ledger)
    >>> tracker = ModuleTracker(model, mode, state); mode.bind(tracker, state)
    """

    __slots__ = ("ledger", "records", "forward_acc", "boundary_seqs", "boundary_frames",
                 "last", "recomputing", "recompute_home", "stepping", "in_step", "replay",
                 "p2p_tags", "pipeline")

    def __init__(self, ledger: Optional[Ledger] = None):
        self.ledger = ledger
        root = ledger.root if ledger is not None else None
        # every op record made, in order (the ledger's: see Ledger)
        self.records: list = ledger.records if ledger is not None else []
        # where ops with no autograd node go (forward, optimizer, recompute): the running
        # frame's accumulator for the tracker's phase (see tracker.phase_of)
        self.forward_acc: dict = root.acc[FORWARD_I] if root is not None else {}
        # the frame entered at each module boundary, with the autograd sequence number noted
        # there; the sentinel makes ``frames[bisect_right(seqs, s) - 1]`` valid for any s
        self.boundary_seqs: list[int] = [-1]
        self.boundary_frames: list = [root]
        # (node, accumulator, sequence number) of the last autograd node the mode saw
        self.last: tuple = NO_NODE
        self.recomputing = False  # activation checkpointing is re-running forward
        # (saved-tensors pack hook, frame): where the last recomputation's modules sit
        self.recompute_home: tuple = (None, root)
        self.stepping = False  # the innermost optimizer step counts (see CountingMode._recheck)
        self.in_step: tuple = ()  # Python frames seen running inside that step
        # while an optimizer step is replayed (engine.counting.step_replay): {id(overload): calls}
        self.replay: Optional[dict] = None
        # point-to-point transfers a workflow told apart before they run (pipeline stages):
        # {id(tensor): (tensor, accumulator)}, each transfer counted into that accumulator
        self.p2p_tags: dict = {}
        # the pipeline actions a workflow noted, as run facts (see RunFacts.pipeline)
        self.pipeline: list = []

    # -- compiled graphs --------------------------------------------------------------------
    def save(self) -> tuple:
        """What a compiled graph's fake run changes (``restore`` puts it back)."""
        return (self.forward_acc, len(self.boundary_seqs), self.last, self.recomputing)

    def restore(self, saved: tuple) -> None:
        """Put back what ``save`` returned: the boundaries noted since are dropped."""
        self.forward_acc, n, self.last, self.recomputing = saved
        del self.boundary_seqs[n:]
        del self.boundary_frames[n:]

    def aim(self, acc: dict) -> None:
        """Ops with no autograd node go to ``acc`` (a compiled graph's fake run, between
        its forward and its backward: back to the running frame's)."""
        self.forward_acc = acc

    def sink_backward(self, first: int, last: int, sink: Frame, current: Frame) -> None:
        """Backward ops of nodes numbered ``first`` to ``last - 1`` (made by a compiled
        graph's run: their work is in its backward counts) go to ``sink``; later ones to
        ``current``. Attribution is left as it is when a boundary was noted inside the run."""
        seqs, frames = self.boundary_seqs, self.boundary_frames
        if seqs[-1] > first:
            return
        seqs.append(first)
        frames.append(sink)
        seqs.append(last)
        frames.append(current)

    # -- the mode ---------------------------------------------------------------------------
    def forget_node(self) -> None:
        """Let go of the last autograd node seen (it would be kept alive)."""
        self.last = NO_NODE

    def unbound(self) -> None:
        """The mode counts with no tracker (a composite's fake run, a closed counter):
        no recomputation or optimizer step can be on."""
        self.recomputing = self.stepping = False

    def seen_in_step(self, frames: tuple) -> None:
        """The Python frames seen running inside the optimizer step that counts now."""
        self.in_step = frames

    def watch_steps(self, on: bool) -> None:
        """Whether the innermost optimizer step counts now: while it does, each op with no
        autograd node first checks that the step still runs (``CountingMode._recheck``)."""
        self.stepping = on
        self.in_step = ()

    def take_tag(self, args, acc: dict) -> dict:
        """The accumulator a tagged tensor among a communication op's arguments names (its
        tag used up: a tensor is sent or received once), else ``acc``."""
        tags = self.p2p_tags
        for a in args:
            for t in (a if a.__class__ is list or a.__class__ is tuple else (a,)):
                if isinstance(t, Tensor):
                    tag = tags.pop(id(t), None)
                    if tag is not None and tag[0] is t:
                        return tag[1]
        return acc

    # -- workflows --------------------------------------------------------------------------
    def tag_transfer(self, tensor: Tensor, phase: str) -> None:
        """Count the point-to-point transfer that will move ``tensor`` into the root's
        ``phase`` (a name in ``PHASES``: ``"forward"``, ``"backward"``), whatever is running
        when it runs."""
        assert self.ledger is not None, "a counter's state has a ledger"
        self.p2p_tags[id(tensor)] = (tensor, self.ledger.root.acc[PHASES.index(phase)])

    def untag(self, tensor_ids) -> None:
        """Forget the tags of transfers made but never run (``id()`` of their tensors)."""
        tags = self.p2p_tags
        for key in tensor_ids:
            tags.pop(key, None)

    def note_pipeline(self, action: list) -> None:
        """Keep ``action`` (a list its workflow goes on filling: see RunFacts.pipeline) as
        one of the run's pipeline actions."""
        self.pipeline.append(action)

    def pipeline_actions(self) -> tuple:
        """The pipeline actions noted, as tuples."""
        return tuple(map(tuple, self.pipeline))
