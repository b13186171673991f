"""``FlopsCallback`` for transformers' ``Trainer``: tokens/s, flops and MFU of the training
steps in the trainer's own logs (TensorBoard, W&B, CSV... whatever ``report_to`` names).

>>> from dispatch_flops.integrations.transformers import FlopsCallback
>>> trainer = Trainer(model, args, train_dataset=data, callbacks=[FlopsCallback(every=100)])
>>> trainer.train()   # logs: model_flops, hardware_flops, tokens_per_s, step_s, mfu_all_ops...
"""

from __future__ import annotations

import sys
from functools import partial
from types import FrameType
from typing import Optional

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
except ImportError as e:  # say which package: the name alone reads like our own bug
    raise ImportError("dispatch_flops.integrations.transformers needs transformers: pip "
                      "install transformers (or, from a clone, pip install -e "
                      "'.[transformers]')") from e

from dispatch_flops.results.roofline import DTypeLike
from dispatch_flops.results.utilisation import DeviceLike, as_spec
from dispatch_flops.workflows.throughput import METRICS, ThroughputMeter

__all__ = ["FlopsCallback", "METRICS"]


class FlopsCallback(TrainerCallback):
    """Measures the optimizer steps with a ``ThroughputMeter``: counts every ``every``-th step
    after ``warmup`` (default 1) untouched ones (and a step whose inputs' shapes were never
    counted), times the others without counting them, and adds to each log the timed steps
    since the previous log: ``model_flops`` and ``hardware_flops`` (per step, from the last
    counted step with the same input shapes), ``step_s`` (mean time of a timed step),
    ``tokens_per_s`` (``input_ids`` tokens / ``step_s``) and, on a device with a known peak
    (or ``device=``), ``mfu_all_ops`` = model_flops / (step_s × peak_flop_s) (every op's
    flops at one peak: not ``Profile.mfu()``, 2 × model MACs at each op's dtype peak),
    ``hfu_all_ops`` likewise, and ``peak_flop_s``. A step spans every micro-batch's forward
    and backward, clipping and the optimizer. ``meter``: the ``ThroughputMeter``
    (``meter.reading()``: the whole run); ``profile``: the last counted step's ``Profile``.

    It moves itself ahead of the reporting callbacks so that they log its values."""

    def __init__(self, every: int = 100, *, warmup: int = 1,
                 device: Optional[DeviceLike] = None, dtype: Optional[DTypeLike] = None):
        self._meter = partial(ThroughputMeter, every=every, warmup=warmup, device=as_spec(device),
                              dtype=dtype)
        self.meter = self._meter()  # checks them; the model comes later

    @property
    def profile(self):
        return self.meter.profile

    def _first(self) -> None:
        # reporters (TensorBoard, W&B) come before user callbacks and read ``logs`` in
        # order: ours must be in it before them. The handler calling us is the caller.
        handler = sys._getframe(2).f_locals.get("self")
        if isinstance(handler, CallbackHandler) and handler.callbacks[0] is not self:
            handler.callbacks.remove(self)
            handler.callbacks.insert(0, self)

    def on_init_end(self, args, state, control, **kwargs):
        self._guard(_trainer_calling())

    def _guard(self, trainer) -> None:
        """Have ``trainer`` drop the running step when training raises (transformers calls
        no callback then): its training loop, as the trainer looks it up, wrapped once."""
        if trainer is None or getattr(trainer, "_inner_training_loop", None) is None or \
                getattr(trainer._inner_training_loop, _GUARDED, None) is self:
            return
        loop = trainer._inner_training_loop

        def guarded(*args, **kwargs):
            try:
                return loop(*args, **kwargs)
            except BaseException:
                self.meter.abandon()
                raise

        setattr(guarded, _GUARDED, self)
        trainer._inner_training_loop = guarded

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._first()
        self.meter.abandon()  # a step an earlier train() left open
        self._guard(_trainer_calling())  # a callback added after the trainer was made
        self.meter = self._meter(model)

    def on_step_begin(self, args, state, control, **kwargs):
        self.meter.abandon()  # a step left open (none normally)
        self.meter.begin()  # the model's inputs are its signature and tokens

    def on_step_end(self, args, state, control, **kwargs):
        self.meter.end()

    def on_train_end(self, args, state, control, **kwargs):
        self.meter.abandon()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        reading = self.meter.take()
        if reading is None:
            return
        metrics = reading.metrics()
        logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)


_GUARDED = "_dispatch_flops_guarded"  # on the training loop a FlopsCallback wrapped


def _trainer_calling():
    """The ``Trainer`` whose method is calling the callback handler now, or None."""
    from transformers import Trainer

    frame: Optional[FrameType] = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None
