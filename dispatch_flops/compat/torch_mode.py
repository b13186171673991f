"""``FlopCounterMode``: torch's ``torch.utils.flop_counter.FlopCounterMode`` (constructor,
attributes, getters, table, module tracking, formulas) in front of ``FlopCounter``, so code
written for torch's switches by changing the import.

What torch's counter does that a ``FlopCounter`` does not, this class adds:

- every module called in the block is tracked (global hooks, removed on exit) and keyed as
  torch keys it (``"ResNet"``, ``"ResNet.layer1"``), with no model given;
- composite ops reaching the dispatch mode (under ``torch.inference_mode()``) are decomposed,
  as torch's mode decomposes them, so ops are keyed alike in every grad mode
  (``aten.convolution``, never ``aten.conv2d``);
- torch-format formulas (``custom_mapping``, and ``torch.utils.flop_counter.
  register_flop_formula`` registrations other than torch's own) are called on each call during
  the block, with torch's arguments, and their figure replaces this package's for that op.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.utils.flop_counter as torch_flop_counter

from dispatch_flops.counter import FlopCounter
from dispatch_flops.engine.torch_private import TorchDispatchMode
from dispatch_flops.results.stats import ROOT
from dispatch_flops.results.torch_figures import TORCH_GLOBAL, torch_flop_counts
from dispatch_flops.views.torch_table import torch_table

_COMPOSITE = "CompositeImplicitAutograd"


def _torch_own(formula) -> bool:
    """Whether a formula of torch's registry is one torch ships (those ops this package
    counts itself) rather than one a user registered."""
    return getattr(formula, "__module__", "") == torch_flop_counter.__name__


def _user_formulas(custom_mapping: dict) -> tuple[dict, dict]:
    """torch's ``flop_registry`` for this mode (torch's, then ``custom_mapping`` wrapped as
    torch wraps it) and the formulas of it this mode calls: ``custom_mapping``'s and the
    op packets users registered in torch's registry."""
    for key, formula in custom_mapping.items():
        if not isinstance(key, torch._ops.OpOverloadPacket):
            raise TypeError(f"custom_mapping keys are op packets (torch.ops.aten.add), got "
                            f"{key!r} of type {type(key).__name__}")
        if not callable(formula):
            raise TypeError(f"custom_mapping[{key}] must be a formula (a callable), got "
                            f"{formula!r}")
    custom = {k: v if getattr(v, "_get_raw", False) else torch_flop_counter.shape_wrapper(v)
              for k, v in custom_mapping.items()}
    registry = {**torch_flop_counter.flop_registry, **custom}
    called = {k: v for k, v in torch_flop_counter.flop_registry.items()
              if isinstance(k, torch._ops.OpOverloadPacket) and not _torch_own(v)}
    called.update(custom)
    return registry, called


class _TorchKeys(TorchDispatchMode):
    """Sits above the counting mode during a ``FlopCounterMode`` block: decomposes composite
    ops as torch's mode does, and calls torch-format formulas; the ops themselves run (and
    are counted) below."""

    def __init__(self, counter: "FlopCounterMode"):
        super().__init__()
        self.counter = counter
        self._composite: dict = {}  # overload -> has a CompositeImplicitAutograd kernel

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        composite = self._composite.get(func)
        if composite is None:
            composite = self._composite[func] = torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), _COMPOSITE)
        if composite:
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        formula = self.counter._called.get(func._overloadpacket)
        if formula is not None:
            self.counter._count_formula(func._overloadpacket, formula, args, kwargs, out)
        return out


class FlopCounterMode(FlopCounter):
    """``torch.utils.flop_counter.FlopCounterMode(mods=None, depth=2, display=True,
    custom_mapping=None)``, counted by this package's engine.

    >>> with FlopCounterMode(display=False) as mode:
    ...     model(x).sum().backward()
    >>> mode.get_total_flops(), mode.flop_counts["Global"][torch.ops.aten.mm]
    >>> mode.get_flop_counts()["ResNet.layer1"], print(mode.get_table(depth=3))

    Figures are torch's: 2 × the MACs of the contraction ops (matmul, convolution, attention,
    recurrent and fast-path kernels, including those torch's counter misses; see
    docs/conventions.md). Every ``FlopCounter`` view is there too, with this package's all-ops
    flops (``mode.total.flops``). Modules are keyed as torch keys them, whether or not
    ``mods`` is given (torch warns that it is not needed, and so does this class).
    ``custom_mapping={packet: formula}`` takes torch's formula format; formulas registered
    with torch's ``register_flop_formula`` are honoured too. Other keyword arguments
    (``timing=True``, ``attention="causal"``, ...) are ``FlopCounter``'s.
    """

    def __init__(self, mods=None, depth: Optional[int] = 2, display: bool = True,
                 custom_mapping: Optional[dict] = None, **options):
        if "model" in options:
            raise TypeError("FlopCounterMode takes torch's mods, not model=: modules are "
                            "tracked without it; use FlopCounter(model) for names relative "
                            "to a model")
        if mods is not None:
            warnings.warn("mods argument is not needed anymore, you can stop passing it",
                          stacklevel=2)
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool)):
            raise TypeError(f"depth must be an int or None, got {depth!r}")
        if custom_mapping is not None and not isinstance(custom_mapping, dict):
            raise TypeError(f"custom_mapping must be a dict {{op packet: formula}}, got "
                            f"{type(custom_mapping).__name__}")
        super().__init__(None, **options)
        self._every_module = True
        self.depth = depth
        self.display = display
        self.flop_registry, self._called = _user_formulas(custom_mapping or {})
        self.mode: Optional[_TorchKeys] = None  # torch's: the dispatch mode, while counting
        self._extra: dict = {}  # (frame stack, packet) -> flops of torch-format formulas

    # -- the block --------------------------------------------------------------------------
    def __enter__(self) -> "FlopCounterMode":
        super().__enter__()
        self._extra = {}
        keys = _TorchKeys(self)
        try:
            keys.__enter__()
        except BaseException:
            super().__exit__(None, None, None)
            raise
        self.mode = keys
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.mode is not None:
                self.mode.__exit__(exc_type, exc, tb)
        finally:
            self.mode = None
            super().__exit__(exc_type, exc, tb)
        if self.display and exc_type is None:
            print(self.get_table(self.depth))

    def _count_formula(self, key, formula, args, kwargs, out) -> None:
        """Call a torch-format formula as torch does, and charge its flops to the modules
        running: in backward, those whose forward made the autograd node (as the engine)."""
        flops = formula(*args, **kwargs, out_val=out)
        counting = self._mode
        found = counting.attribution() if counting is not None else None
        assert found is not None, "only called inside the block"
        index = (found[0].stack, key)
        self._extra[index] = self._extra.get(index, 0) + flops

    # -- torch's reading API ----------------------------------------------------------------
    @property
    def flop_counts(self) -> dict:
        """torch's ``flop_counts``: ``{module: {op packet: flops}}`` (a ``defaultdict``, so
        a module that ran nothing reads ``{}``), torch's figure; read it during the block or
        after."""
        counts = torch_flop_counts(self.to_profile())
        if self._called:
            for ops in counts.values():
                for key in self._called:  # a torch-format formula replaces our figure
                    ops.pop(key, None)
            for (stack, key), flops in self._extra.items():
                for name in (TORCH_GLOBAL,) + tuple(n for n in stack if n != ROOT):
                    counts[name][key] += flops
        return counts

    def get_total_flops(self) -> int:
        """torch's: the sum of ``flop_counts["Global"]``."""
        return sum(self.flop_counts[TORCH_GLOBAL].values())

    def get_flop_counts(self) -> dict:
        """torch's: ``flop_counts`` as plain dicts."""
        return {k: dict(v) for k, v in self.flop_counts.items()}

    def get_table(self, depth: Optional[int] = None) -> str:
        """torch's table: ``depth`` defaults to the constructor's (None: every depth)."""
        return torch_table(self.flop_counts, self.depth if depth is None else depth)
