"""``FlopCounterMode``: torch's constructor in front of ``FlopCounter``, so code written for
``torch.utils.flop_counter.FlopCounterMode`` switches by changing the import."""

from __future__ import annotations

from typing import Optional

from torch import nn

from .counter import FlopCounter


class FlopCounterMode(FlopCounter):
    """``torch.utils.flop_counter.FlopCounterMode(mods, depth, display, custom_mapping)``,
    counted by this package: ``get_total_flops()``, ``get_flop_counts()``, ``get_table()``
    answer as torch's do, and every ``FlopCounter`` view is there too.

    >>> with FlopCounterMode(model, display=False) as mode:
    ...     model(x).sum().backward()
    >>> mode.get_total_flops(), mode.get_flop_counts()["Global"]

    Pass the model to attribute ops to its modules (torch tracks modules without it; this
    counter charges everything to ``"Global"`` then). Counts follow this package's
    conventions (bias adds, softmax, norms are counted; see README), so they can exceed
    torch's. ``custom_mapping`` is not taken: register formulas with ``register_formula``.
    """

    def __init__(self, mods: Optional[nn.Module] = None, depth: int = 2, display: bool = True,
                 custom_mapping: Optional[dict] = None, **options):
        if custom_mapping:
            raise TypeError("custom_mapping is torch's formula format; register formulas with "
                            "dispatch_flops.register_formula (they return a Cost)")
        if isinstance(mods, (list, tuple)):
            if len(mods) != 1:
                raise TypeError("FlopCounterMode takes one model (torch's list of modules is "
                                "deprecated there too)")
            mods = mods[0]
        super().__init__(mods, **options)
        self.depth = depth
        self.display = display

    def get_table(self, depth: Optional[int] = None) -> str:
        """torch's ``get_table``: ``depth`` defaults to the constructor's."""
        return self.to_profile().get_table(self.depth if depth is None else depth)

    def __exit__(self, exc_type, exc, tb) -> None:
        super().__exit__(exc_type, exc, tb)
        if self.display and exc_type is None:
            print(self.get_table())
