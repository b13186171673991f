"""A counted run cut into parts: what ``profile_generate`` (its steps) and ``profile_pipeline``
(its components and denoising steps) share.

One counter runs for the whole call; a part is an outermost call of what the workflow names.
Its Profile is the difference of two snapshots of the counter's counts
(``FlopCounter.to_profile()`` inside the block; ``results.combine.since``): the first taken as
the call starts, before the counter notes it (the workflow's hooks run around the counter's
own: ``FlopCounter.user_hooks``), so the part counts its own call; the last as it ends.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Callable, Optional

import torch
from torch.utils.hooks import RemovableHandle

from dispatch_flops.counter import FlopCounter
from dispatch_flops.results.profile import Profile


class PartCutter:
    """The edges of a workflow's parts: ``begin()`` as an outermost call starts, ``end()`` as
    it ends (each a snapshot and the clock), ``enter()`` / ``leave()`` keeping the depth of
    the calls running. A workflow's cutter subclasses it, hooks the calls it cuts at
    (``hook``, before the counter is entered) and says which are parts.

    >>> cutter = PartCutter(counter, timing=False, cuda=False)
    >>> if cutter.enter():
    ...     before, start_ns = cutter.begin()
    """

    def __init__(self, counter: FlopCounter, timing: bool, cuda: bool):
        self.counter = counter
        self.timing = timing
        self.synchronize = timing and cuda  # the GPU's work done before the clock is read
        self.depth = 0  # the parts' calls running
        self._handle: Optional[RemovableHandle] = None

    def hook(self, pre_fw_hook: Callable, post_fw_hook: Optional[Callable] = None) -> None:
        """Module hooks the counter runs around its own: ``pre_fw_hook`` before it notes a
        call, ``post_fw_hook`` after it notes the call's end."""
        self._handle = self.counter.user_hooks.register(pre_fw_hook, post_fw_hook)

    def unhook(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def now(self) -> int:
        if self.synchronize:
            torch.cuda.synchronize()
        return perf_counter_ns()

    def snapshot(self) -> Profile:
        self.counter.resolve_times()  # CUDA events: their times, before they are subtracted
        return self.counter.to_profile()

    def begin(self) -> tuple[Profile, int]:
        """A part starts: the counts so far, then the clock."""
        return self.snapshot(), self.now()

    def end(self) -> tuple[Profile, int]:
        """A part ends: the clock, then the counts so far (``(counts, ns)``)."""
        end = self.now()
        return self.snapshot(), end

    def enter(self) -> bool:
        """One more call running: whether it is the outermost."""
        self.depth += 1
        return self.depth == 1

    def leave(self) -> bool:
        """A call ended: whether it was the outermost (``False`` when none was running)."""
        if not self.depth:
            return False
        self.depth -= 1
        return not self.depth
