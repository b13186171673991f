"""Optimizer steps as a tracker sees them: torch's global step pre/post hooks put ops run
inside ``optimizer.step()`` in the optimizer phase; a step that raised (no post-hook) is seen
to end once its frame leaves the stack; a closure the step runs is the training step's.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Optional, Protocol

from dispatch_flops.engine.torch_private import get_sequence_nr as _sequence_nr

if TYPE_CHECKING:
    from dispatch_flops.engine.counting.ledger import Frame
    from dispatch_flops.engine.counting.state import CountingState

_getframe = sys._getframe
_get_ident = threading.get_ident


def running(frame, start) -> bool:
    """Whether the Python ``frame`` is on the call stack at ``start`` (start itself or a
    caller of it): a module call, or a generator or coroutine, still running."""
    while start is not None:
        if start is frame:
            return True
        start = start.f_back
    return False


# frames that can be suspended with a counter open in them: a generator or a coroutine
_SUSPENDABLE = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE,
# CO_ASYNC_GENERATOR


def suspendable(frame) -> bool:
    """Whether ``frame`` (where a counter is entered) can be suspended while other code runs
    on its thread (a generator, a coroutine: asyncio tasks)."""
    return bool(frame is not None and frame.f_code.co_flags & _SUSPENDABLE)


# in a tracker's steps: the closure a step was given is running (not the step's phase)
CLOSURE = object()


class Replayer(Protocol):
    """What the step hooks tell a step replay (``engine.counting.step_replay.StepReplay``)."""

    def begin(self, optimizer) -> None: ...

    def end(self, optimizer) -> None: ...

    def abort(self) -> None: ...


class OptimizerSteps:
    """The optimizer-step half of ``ModuleTracker`` (its hooks ``_step_begins`` and
    ``_step_ends``, registered by ``attach``): the steps running on the tracker's thread,
    innermost last, in ``_steps``."""

    # the tracker's, set by ModuleTracker.__init__
    thread: int
    guard: Optional[FrameType]
    state: CountingState
    current: Frame
    root: Frame
    _steps: list
    _recompute_depth: int
    _replay: Optional[Replayer]

    if TYPE_CHECKING:
        def _aim(self, phase_changed: bool = False) -> None: ...

    def _step_begins(self, optimizer, args, kwargs):
        step = _getframe(1)  # torch's wrapper of step()
        if _get_ident() != self.thread or \
                (self.guard is not None and not running(self.guard, step)):
            return None  # another thread's step, or one run while the generator is suspended
        self._drop_ended_steps(step)
        self._steps.append(step)  # modules called inside the step stay in its phase
        self._step_phase()
        # torch hands the hook step's arguments with the optimizer first
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if callable(closure):  # what the closure runs is the training step, not the step's
            wrapped = self._outside_the_step(closure)
            if "closure" in kwargs:
                return args, {**kwargs, "closure": wrapped}
            return tuple(args[:1]) + (wrapped,) + tuple(args[2:]), kwargs
        if self._replay is not None and len(self._steps) == 1:  # the outermost step
            self._replay.begin(optimizer)
        return None

    def _outside_the_step(self, closure):
        """``closure`` run out of the optimizer's phase: an optimizer's closure (LBFGS,
        Lightning's automatic optimization) runs the model's forward and backward."""

        def run(*args, **kwargs):
            steps = self._steps
            steps.append(CLOSURE)
            self._step_phase()
            try:
                return closure(*args, **kwargs)
            finally:
                while steps and steps.pop() is not CLOSURE:
                    pass  # steps the closure ran that raised
                self._step_phase()

        return run

    def _step_ends(self, optimizer, args, kwargs) -> None:
        step = _getframe(1)
        steps = self._steps
        if _get_ident() != self.thread or not any(s is step for s in steps):
            return  # not a step this counter saw begin
        while steps.pop() is not step:
            pass  # steps inside it that raised
        if not steps and self._replay is not None:
            self._replay.end(optimizer)
        self._step_phase()
        if not steps and not self._recompute_depth:
            # a step is over: the graphs its backward ran are gone, and with them every node
            # the boundaries so far could attribute (a graph kept across optimizer steps with
            # retain_graph=True would see its later backward go to the root)
            state = self.state
            del state.boundary_seqs[1:]
            del state.boundary_frames[1:]
            if self.current is not self.root:
                state.boundary_seqs.append(_sequence_nr())
                state.boundary_frames.append(self.current)

    def check_steps(self, start) -> tuple:
        """The frames from Python frame ``start`` to the innermost optimizer step's, when that
        step still runs on the tracker's thread (generators and coroutines left out: their
        callers change), else (). The mode asks at the ops of a step (``start``: the op's
        caller): a step that raised ran no post-hook, so it is over once its frame is no longer
        on the stack, and forgotten here."""
        steps = self._steps
        if _get_ident() != self.thread or not steps or steps[-1] is CLOSURE:
            return ()
        step, frame, inside = steps[-1], start, []
        while frame is not None and frame is not step:
            if not suspendable(frame):
                inside.append(frame)
            frame = frame.f_back
        if frame is None:
            self._drop_ended_steps(start)
            return ()
        inside.append(step)
        return tuple(inside)

    def _drop_ended_steps(self, start) -> None:
        """Forget the steps that ended without their post-hook (the step, or a pre-hook after
        this counter's, raised) as seen from Python frame ``start``."""
        steps = self._steps
        if not steps or steps[-1] is CLOSURE or running(steps[-1], start):
            return
        while steps and steps[-1] is not CLOSURE and not running(steps[-1], start):
            steps.pop()
        if not steps and self._replay is not None:
            self._replay.abort()
        self._step_phase()

    def _step_phase(self) -> None:
        """The steps running changed: aim the mode at the phase, and, while one counts, have
        it check at each op with no autograd node that the innermost step still runs
        (``check_steps``: how a step that raised is seen to end; other phases' ops pay a flag
        test)."""
        self._aim(phase_changed=True)
        steps = self._steps
        self.state.watch_steps(bool(steps) and steps[-1] is not CLOSURE)
