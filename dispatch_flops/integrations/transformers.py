"""``FlopsCallback`` for transformers' ``Trainer``: flops and MFU of sampled steps in the
trainer's own logs (TensorBoard, W&B, CSV... whatever ``report_to`` names).

>>> from dispatch_flops.integrations.transformers import FlopsCallback
>>> trainer = Trainer(model, args, train_dataset=data, callbacks=[FlopsCallback(every=100)])
>>> trainer.train()   # logs carry model_flops, hardware_flops, tokens_per_s (and mfu, hfu)
"""

from __future__ import annotations

import sys
from typing import Optional

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
except ImportError as e:  # say which package: the name alone reads like our own bug
    raise ImportError("dispatch_flops.integrations.transformers needs transformers: pip "
                      "install transformers (or, from a clone, pip install -e "
                      "'.[transformers]')") from e

from dispatch_flops.integrations._sampler import METRICS, StepSampler
from dispatch_flops.results.roofline import DeviceSpec

__all__ = ["FlopsCallback", "METRICS"]


class FlopsCallback(TrainerCallback):
    """Counts every ``every``-th optimizer step after ``warmup`` (default 1) uncounted ones,
    the whole step (forward and backward of every micro-batch, clipping, the optimizer), and
    adds to the next logs: ``model_flops`` (forward + backward), ``hardware_flops`` (all
    executed), ``tokens_per_s`` (``input_ids`` tokens / the step's wall time) and, on a device
    with a known peak (or ``device=``), ``mfu`` and ``hfu``. Steps not counted cost nothing.
    ``profile``: the last counted step's ``Profile``, every view of it.

    It moves itself ahead of the reporting callbacks so that they log its values."""

    def __init__(self, every: int = 100, *, warmup: int = 1,
                 device: Optional[DeviceSpec] = None):
        self.sampler = StepSampler(every, warmup, device)

    @property
    def profile(self):
        return self.sampler.profile

    def _first(self) -> None:
        # reporters (TensorBoard, W&B) come before user callbacks and read ``logs`` in
        # order: ours must be in it before them. The handler calling us is the caller.
        handler = sys._getframe(2).f_locals.get("self")
        if isinstance(handler, CallbackHandler) and handler.callbacks[0] is not self:
            handler.callbacks.remove(self)
            handler.callbacks.insert(0, self)

    def on_train_begin(self, args, state, control, **kwargs):
        self._first()

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if self.sampler.counts(state.global_step) and model is not None:
            self.sampler.begin(model, state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self.sampler.end()

    def on_train_end(self, args, state, control, **kwargs):
        self.sampler.abandon()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None:
            metrics = self.sampler.take()
            logs.update(metrics)
            if metrics and state.log_history and state.log_history[-1].get("step") == \
                    state.global_step:
                state.log_history[-1].update(metrics)
