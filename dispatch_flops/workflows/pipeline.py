"""Pipeline stages (``torch.distributed.pipelining``) counted stage by stage: each
activation and gradient a stage sends or receives counted in the phase of the work that
produces or consumes it, and each action the schedule runs on the stage noted (forward or
backward of which microbatch, its time, the bytes it sent and received).

>>> from dispatch_flops import FlopCounter
>>> from dispatch_flops.distributed import gather, PipelineStageCounter
>>> stage = PipelineStage(my_part, rank, world, device)
>>> schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=loss_fn)
>>> with FlopCounter(stage.submod, timing=True) as fc, PipelineStageCounter(stage, fc):
...     schedule.step(x) if rank == 0 else schedule.step(target=y, losses=[])
>>> run = gather(fc)          # stages with different modules: one tree per stage
>>> run.pipeline()            # {stage: PipelineStage figures}: busy, idle (the bubble), bytes

Why it is needed: a schedule sends a microbatch's activations after ``forward_one_chunk``
returns and its gradients after ``backward_one_chunk`` returns (and 1F1B fires a forward's
sends in one batch with the next backward's receives), so by when they run every transfer
looks alike: no module running, no autograd node (phase ``other``). The stage's own methods
say which is which before they run: ``get_fwd_recv_ops`` / ``get_fwd_send_ops`` return the
transfers of a forward, ``get_bwd_recv_ops`` / ``get_bwd_send_ops`` those of a backward, each
with the tensor it moves. ``PipelineStageCounter`` wraps those methods on the stage object (not
its class; put back on exit) and tags each tensor in the counter's state, whose mode counts
the transfer that moves it into the stage root's forward or backward
(``CountingState.tag_transfer``).
Transfers the stage's set-up makes (shape inference in the first step) stay ``other``.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from dispatch_flops.counter import FlopCounter
from dispatch_flops.results.stats import BACKWARD, FORWARD

__all__ = ["PipelineStageCounter", "pipeline_stage"]

# the stage methods wrapped: transfers (their group: "F" forward, "B" backward) and actions
_TRANSFERS = {"get_fwd_recv_ops": ("F", "received"), "get_fwd_send_ops": ("F", "sent"),
              "get_bwd_recv_ops": ("B", "received"), "get_bwd_send_ops": ("B", "sent")}
_ACTIONS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
START, NS, SENT, RECEIVED = 3, 4, 5, 6  # slots of an action: see RunFacts.pipeline


class PipelineStageCounter:
    """Count ``stage`` (a ``torch.distributed.pipelining`` ``PipelineStage``) as a pipeline
    stage inside ``counter``'s block: a context manager entered inside it (see the module's
    docstring; ``pipeline_stage`` is its old name). ``ValueError`` when ``counter`` is not a
    counting FlopCounter or ``stage`` is not a pipeline stage.

    >>> with FlopCounter(stage.submod) as fc, PipelineStageCounter(stage, fc):
    ...     schedule.step(x)
    """

    def __init__(self, stage: Any, counter: FlopCounter):
        missing = [m for m in (*_TRANSFERS, "forward_one_chunk", "backward_one_chunk")
                   if not callable(getattr(stage, m, None))]
        if missing:
            raise ValueError(f"pipeline_stage needs a torch.distributed.pipelining stage "
                             f"(PipelineStage); {type(stage).__name__} has no {missing}")
        if not isinstance(counter, FlopCounter) or not counter.counting:
            raise ValueError("pipeline_stage needs a FlopCounter that is counting: enter it "
                             "inside the counter's block (with FlopCounter(stage.submod) as fc,"
                             " pipeline_stage(stage, fc): ...)")
        self.stage, self.state, self.timer = stage, counter.state, counter.timer
        self._start = counter.block_start_ns  # the block's start on the host clock
        self._open: dict = {}  # (group, microbatch): its action now being filled
        self._done: set = set()  # id() of the actions that ran their compute
        self._saved: dict = {}
        self._tags: list = []

    # -- the stage's methods, wrapped ---------------------------------------------------------
    def __enter__(self) -> "PipelineStageCounter":
        own = vars(self.stage)
        for name in (*_TRANSFERS, *_ACTIONS):
            if not callable(getattr(self.stage, name, None)):
                continue  # backward_weight_one_chunk: torch versions without zero bubble
            self._saved[name] = own.get(name)
            original = getattr(self.stage, name)
            wrap = self._transfer if name in _TRANSFERS else self._action
            setattr(self.stage, name, wrap(name, original))
        return self

    def __exit__(self, *exc) -> None:
        own = vars(self.stage)
        for name, before in self._saved.items():
            if before is None:
                own.pop(name, None)
            else:
                own[name] = before
        self._saved = {}
        self.state.untag(self._tags)  # transfers made but never run
        self._tags = []

    def _transfer(self, name: str, original):
        group, direction = _TRANSFERS[name]
        phase, state = FORWARD if group == "F" else BACKWARD, self.state

        def transfers(chunk_id, *args, **kwargs):
            ops = original(chunk_id, *args, **kwargs)
            moved = 0
            for op in ops:
                tensor = getattr(op, "tensor", None)
                if tensor is None:
                    continue
                state.tag_transfer(tensor, phase)
                self._tags.append(id(tensor))
                moved += tensor.numel() * tensor.element_size()
            key = (group, chunk_id)
            event = self._open.get(key)
            if direction == "received" and (event is None or id(event) in self._done):
                event = None  # what a compute to come consumes: a new action
            if event is None:
                event = self._new(group, chunk_id)
            event[SENT if direction == "sent" else RECEIVED] += moved
            return ops

        return transfers

    def _new(self, group: str, microbatch: int) -> list:
        event = [getattr(self.stage, "stage_index", 0), group, microbatch, 0, 0, 0, 0]
        self._open[(group, microbatch)] = event
        self.state.note_pipeline(event)
        return event

    def _action(self, name: str, original):
        timer, start = self.timer, self._start

        def acts(chunk_id, *args, **kwargs):
            if name == "forward_one_chunk":
                group = letter = "F"
            elif name == "backward_weight_one_chunk":
                group = letter = "W"
            else:
                group = "B"
                # backward_one_chunk(chunk, loss=None, full_backward=True, ...)
                full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
                letter = "B" if full else "I"
            key = (group, chunk_id)
            event = self._open.get(key)
            if event is None or id(event) in self._done:
                event = self._new(group, chunk_id)
            event[1] = letter
            self._done.add(id(event))
            if timer is None:
                return original(chunk_id, *args, **kwargs)
            event[START] = perf_counter_ns() - start
            begin = timer.mark()
            try:
                return original(chunk_id, *args, **kwargs)
            finally:
                timer.span(event, NS, begin, timer.mark())

        return acts


pipeline_stage = PipelineStageCounter  # its old name, kept working
