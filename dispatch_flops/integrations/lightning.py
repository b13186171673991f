"""``FlopsCallback`` for Lightning's ``Trainer``: flops and MFU of sampled steps logged with
``pl_module.log``, so every Lightning logger gets them.

>>> from dispatch_flops.integrations.lightning import FlopsCallback
>>> trainer = lightning.Trainer(callbacks=[FlopsCallback(every=100)])
"""

from __future__ import annotations

from typing import Optional

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    try:  # the standalone package
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
    except ImportError as e:  # neither: say which package, not pytorch_lightning's name
        raise ImportError("dispatch_flops.integrations.lightning needs Lightning: pip "
                          "install lightning (or, from a clone, pip install -e "
                          "'.[lightning]')") from e

from dispatch_flops.integrations._sampler import METRICS, StepSampler
from dispatch_flops.results.roofline import DeviceSpec

__all__ = ["FlopsCallback", "METRICS"]


class FlopsCallback(Callback):
    """Counts every ``every``-th training batch after ``warmup`` (default 1) uncounted ones,
    the whole of it (forward, backward, clipping, the optimizer step under automatic
    optimization), and logs ``model_flops``, ``hardware_flops``, ``tokens_per_s`` (the batch's
    ``input_ids``, or its first integer tensor) and, on a device with a known peak
    (or ``device=``), ``mfu`` and ``hfu``, with ``pl_module.log`` at that step. Batches not
    counted cost nothing. ``profile``: the last counted step's ``Profile``."""

    def __init__(self, every: int = 100, *, warmup: int = 1,
                 device: Optional[DeviceSpec] = None):
        self.sampler = StepSampler(every, warmup, device)

    @property
    def profile(self):
        return self.sampler.profile

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.sampler.counts(trainer.global_step):
            self.sampler.begin(pl_module, trainer.global_step, _tokens(batch))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        metrics = self.sampler.end()
        if metrics:
            self.sampler.take()
            pl_module.log_dict({k: float(v) for k, v in metrics.items()}, on_step=True,
                               on_epoch=False, batch_size=1)

    def on_train_end(self, trainer, pl_module):
        self.sampler.abandon()


def _tokens(batch) -> int:
    """Token ids in a batch: its ``input_ids``, else its first integer tensor's elements."""
    if isinstance(batch, dict):
        ids = batch.get("input_ids")
        values = [ids] if ids is not None else list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        values = [batch]
    for value in values:
        if hasattr(value, "is_floating_point") and not value.is_floating_point():
            return value.numel()
    return 0
