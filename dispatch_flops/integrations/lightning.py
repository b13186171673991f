"""``FlopsCallback`` for Lightning's ``Trainer``: tokens/s, flops and MFU of the training
steps logged with ``pl_module.log``, so every Lightning logger gets them.

>>> from dispatch_flops.integrations.lightning import FlopsCallback
>>> trainer = lightning.Trainer(callbacks=[FlopsCallback(every=100)])
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    try:  # the standalone package
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
    except ImportError as e:  # neither: say which package, not pytorch_lightning's name
        raise ImportError("dispatch_flops.integrations.lightning needs Lightning: pip "
                          "install lightning (or, from a clone, pip install -e "
                          "'.[lightning]')") from e

from dispatch_flops.results.roofline import DTypeLike
from dispatch_flops.results.utilisation import DeviceLike, as_spec
from dispatch_flops.workflows.throughput import METRICS, ThroughputMeter

__all__ = ["FlopsCallback", "METRICS"]


class FlopsCallback(Callback):
    """Measures the optimizer steps with a ``ThroughputMeter``: counts every ``every``-th step
    after ``warmup`` (default 1) untouched ones (and a step whose batch shapes were never
    counted), times the others without counting them, and logs with ``pl_module.log`` at each
    step the timed steps since Lightning's last write (every ``log_every_n_steps``):
    ``model_flops``, ``hardware_flops`` (per step), ``step_s``, ``tokens_per_s`` (the
    batch's ``input_ids``, or its first integer tensor) and, on a device with a known peak (or
    ``device=``), ``mfu_all_ops`` = model_flops / (step_s × peak_flop_s) (every op's flops at
    one peak: not ``Profile.mfu()``), ``hfu_all_ops`` and ``peak_flop_s``,
    as float64 so that a logger reads them back exactly (a counted step logs the last figures
    again). A step runs from its first batch's
    start to the end of the batch that stepped the optimizer (every micro-batch, clipping, the
    optimizer under automatic optimization). ``meter``: the ``ThroughputMeter``;
    ``profile``: the last counted step's ``Profile``."""

    def __init__(self, every: int = 100, *, warmup: int = 1,
                 device: Optional[DeviceLike] = None, dtype: Optional[DTypeLike] = None):
        self._meter = partial(ThroughputMeter, every=every, warmup=warmup, device=as_spec(device),
                              dtype=dtype)
        self.meter = self._meter()  # checks them; the model comes later
        self._step_at: Optional[int] = None  # global_step when the running step began
        self._last: dict = {}  # the metrics logged last

    @property
    def profile(self):
        return self.meter.profile

    def on_train_start(self, trainer, pl_module):
        self.meter.abandon()  # a step an earlier fit left open
        self.meter = self._meter(pl_module)
        self._step_at, self._last = None, {}

    # validation Lightning runs inside an optimizer step (``val_check_interval`` counts
    # batches: it can land between two micro-batches) is not the step's work nor its time
    def on_validation_start(self, trainer, pl_module):
        if trainer.training or self._step_at is not None:
            self.meter.pause()

    def on_validation_end(self, trainer, pl_module):
        self.meter.resume()

    def on_exception(self, trainer, pl_module, exception):
        # a step that raised (or an interrupt): its counter and hooks go now, not never
        self.meter.abandon()
        self._step_at = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._step_at is None:
            self._step_at = trainer.global_step
            self.meter.begin(batch)
        else:  # a later micro-batch of the same optimizer step
            self.meter.note(batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._step_at is None or trainer.global_step == self._step_at:
            return  # accumulating gradients: the step goes on
        self._step_at = None
        self.meter.end()
        # the window's figures at every step (callback_metrics, the progress bar); a new
        # window once a logger wrote them. A step with no timed step in the window (a
        # counted one) logs the last figures again, as Lightning would anyway.
        reading = self.meter.take() if _writes_logs(trainer) else self.meter.window()
        if reading is not None:
            self._last = {k: torch.tensor(v, dtype=torch.float64)
                          for k, v in reading.metrics().items()}
        if self._last:
            pl_module.log_dict(self._last, on_step=True, on_epoch=False, batch_size=1)

    def on_train_end(self, trainer, pl_module):
        self.meter.abandon()
        self._step_at = None


def _writes_logs(trainer) -> bool:
    """Whether Lightning writes its logs after this batch (every ``log_every_n_steps``)."""
    connector = getattr(trainer, "_logger_connector", None)
    return bool(getattr(connector, "should_update_logs", True))
