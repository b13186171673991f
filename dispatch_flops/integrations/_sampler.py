"""What both callbacks share: which steps to count, and what to log of a counted one."""

from __future__ import annotations

import warnings
from typing import Optional

from torch import nn
from torch.utils.hooks import RemovableHandle

from dispatch_flops.counter import FlopCounter
from dispatch_flops.results.profile import Profile
from dispatch_flops.results.roofline import DeviceSpec, device_spec
from dispatch_flops.results.stats import check_int

METRICS = ("model_flops", "hardware_flops", "tokens_per_s", "mfu", "hfu")


class StepSampler:
    """Counts every ``every``-th training step after ``warmup`` uncounted ones (step indices
    ``warmup``, ``warmup + every``, ...), with a ``FlopCounter(model, timing=True)`` entered
    at the step's start and left at its end. A step not counted costs one comparison: no
    counter, no hook. ``device``: the peaks for MFU / HFU (default: the CUDA device's
    built-in spec; none, and no MFU, on a device without one)."""

    def __init__(self, every: int, warmup: int, device: Optional[DeviceSpec]):
        check_int("every", every, 1)
        check_int("warmup", warmup, 0)
        if device is not None and not isinstance(device, DeviceSpec):
            raise ValueError(f"device must be a DeviceSpec or None, got {device!r}")
        self.every, self.warmup, self.device = every, warmup, device
        self._counter: Optional[FlopCounter] = None
        self._hook: Optional[RemovableHandle] = None
        self._tokens = 0
        self.last: dict[str, float] = {}  # the metrics of the last counted step, until logged
        self.profile: Optional[Profile] = None  # the last counted step's Profile
        self._said_why = False

    def counts(self, step: int) -> bool:
        return step >= self.warmup and (step - self.warmup) % self.every == 0

    def begin(self, model: nn.Module, step: int, tokens: Optional[int] = None) -> None:
        """Enter a counted step; ``tokens`` of it when known, else the model's integer
        inputs (``input_ids``, or its first argument) are counted as it is called."""
        if not self.counts(step) or self._counter is not None:
            return
        self._tokens = tokens or 0
        if tokens is None:
            self._hook = model.register_forward_pre_hook(self._count_tokens, with_kwargs=True)
        self._counter = FlopCounter(model, timing=True)
        self._counter.__enter__()

    def _count_tokens(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and hasattr(ids, "numel") and not ids.is_floating_point():
            self._tokens += ids.numel()

    def end(self) -> Optional[dict]:
        """Leave a counted step: its metrics (also kept in ``last``), else None."""
        counter, self._counter = self._counter, None
        if counter is None:
            return None
        try:
            counter.__exit__(None, None, None)
        finally:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
        profile = self.profile = counter.to_profile()
        wall = profile.wall_s
        metrics: dict[str, float] = {"model_flops": profile.model_flops(),
                   "hardware_flops": profile.hardware_flops()}
        if self._tokens and wall:
            metrics["tokens_per_s"] = self._tokens / wall
        spec = self.device or device_spec()
        if spec is not None and wall:
            try:
                metrics["mfu"], metrics["hfu"] = profile.mfu(spec), profile.hfu(spec)
            except ValueError as e:  # no peak for the model's dtype on this device
                self._why(str(e))
        else:
            self._why("no DeviceSpec for this device (pass device=DeviceSpec(...))")
        self.last = metrics
        return metrics

    def _why(self, reason: str) -> None:
        if not self._said_why:
            self._said_why = True
            warnings.warn(f"dispatch_flops FlopsCallback: no mfu / hfu logged: {reason}",
                          RuntimeWarning, stacklevel=3)

    def take(self) -> dict:
        """The metrics not logged yet (then forgotten)."""
        metrics, self.last = self.last, {}
        return metrics

    def abandon(self) -> None:
        """Training stopped inside a counted step: leave the counter, remove the hook."""
        if self._counter is not None:
            try:
                self.end()
            except Exception:
                pass
