"""FlopCounter: the public entry point."""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from torch import nn

from dispatch_flops.formulas import REGISTRY, Category, Registry

from ._mode import CountingMode
from ._report import module_table
from ._results import (
    BACKWARD,
    CATEGORIES,
    ESTIMATED,
    EXACT,
    FORWARD,
    NO_ARITHMETIC,
    PHASES,
    ROOT,
    UNSUPPORTED,
    Coverage,
    ModuleStats,
    OpRecord,
    Stats,
    frozen_mapping,
)
from ._tracker import ModuleTracker

ATTENTION_MODES = ("dense", "causal")
_CATEGORY_NAME = {
    Category.FORMULA: EXACT,
    Category.NO_ARITHMETIC: NO_ARITHMETIC,
    Category.ESTIMATED: ESTIMATED,
    Category.UNSUPPORTED: UNSUPPORTED,
}


def _check_phase(phase: Optional[str]) -> None:
    if phase is not None and phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES} or None (all phases), got {phase!r}")


class FlopCounter:
    """Counts the flops, MACs and bytes of every aten op run inside the block, attributed to
    the modules of ``model`` that ran them, forward and backward.

    >>> with FlopCounter(model) as fc:
    ...     model(x).sum().backward()
    >>> fc.total.flops, fc.by_module()["layers.0"].exclusive.macs
    >>> print(fc)  # the table

    ``attention="dense"`` (default) counts every (query, key) pair of attention;
    ``attention="causal"`` counts only the unmasked pairs when ``is_causal=True``.
    Register custom formulas before entering the block.
    """

    def __init__(
        self,
        model: Optional[nn.Module] = None,
        *,
        attention: str = "dense",
        registry: Optional[Registry] = None,
    ):
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        self.model = model
        self.attention = attention
        self.registry = registry if registry is not None else REGISTRY
        self.root_label = type(model).__name__ if model is not None else "global"
        self._mode: Optional[CountingMode] = None
        self._tracker: Optional[ModuleTracker] = None
        self._active = False
        self._records: Optional[list[OpRecord]] = None
        self._params: Optional[dict[str, int]] = None

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> "FlopCounter":
        if self._active:
            raise RuntimeError("this FlopCounter is already counting; nest a new FlopCounter")
        mode_box = []
        tracker = ModuleTracker(self.model, lambda stack: mode_box[0].on_stack_change(stack))
        mode = CountingMode(self.registry, tracker, self.attention == "causal")
        mode_box.append(mode)
        tracker.attach()
        try:
            mode.__enter__()
        except BaseException:
            tracker.detach()
            raise
        self._tracker, self._mode, self._active, self._records = tracker, mode, True, None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._mode.__exit__(exc_type, exc, tb)
        finally:
            self._tracker.detach()
            self._active = False
            self._records = None

    def _param_counts(self) -> dict[str, int]:
        # read at report time, not on entry: counting is what must stay cheap
        if self._params is None:
            self._params = {} if self.model is None else {
                name: sum(p.numel() for p in module.parameters())
                for name, module in self.model.named_modules()
            }
        return self._params

    # -- raw records ----------------------------------------------------------------------
    def records(self) -> list[OpRecord]:
        """Every (module stack, phase, op overload) with its aggregated counts."""
        if self._mode is None:
            return []
        if self._records is not None:
            return list(self._records)
        records = []
        for (stack, phase), acc in list(self._mode.frames.items()):
            for key, (calls, flops, macs, read, written) in list(acc.items()):
                func = self._mode.op(key)
                records.append(
                    OpRecord(
                        module=stack[-1],
                        stack=stack,
                        phase=phase,
                        operator=str(func.overloadpacket),
                        overload=str(func),
                        category=_CATEGORY_NAME[self._mode.category(func)],
                        stats=Stats(calls, flops, macs, read, written),
                    )
                )
        if not self._active:
            self._records = records
        return list(records)

    # -- views ----------------------------------------------------------------------------
    @property
    def total(self) -> Stats:
        """Everything counted, all phases."""
        return sum((r.stats for r in self.records()), Stats())

    def by_phase(self) -> dict[str, Stats]:
        out = {phase: Stats() for phase in PHASES}
        for r in self.records():
            out[r.phase] = out[r.phase] + r.stats
        return out

    def by_operator(self, phase: Optional[str] = None) -> dict[str, Stats]:
        """``{"aten.mm": Stats}`` over the whole run (or one phase)."""
        _check_phase(phase)
        out: dict[str, Stats] = defaultdict(Stats)
        for r in self.records():
            if phase is None or r.phase == phase:
                out[r.operator] = out[r.operator] + r.stats
        return dict(out)

    def by_module(self, phase: Optional[str] = None) -> dict[str, ModuleStats]:
        """``{name: ModuleStats}`` for every module that ran (names of ``named_modules()``;
        ``ROOT`` == "" is the root model, or everything when no model was given)."""
        _check_phase(phase)
        tracker = self._tracker
        inclusive: dict[str, Stats] = defaultdict(Stats)
        exclusive: dict[str, Stats] = defaultdict(Stats)
        operators: dict[str, dict[str, Stats]] = defaultdict(lambda: defaultdict(Stats))
        credited_cache: dict[tuple, set] = {}
        for r in self.records():
            if phase is not None and r.phase != phase:
                continue
            exclusive[r.module] = exclusive[r.module] + r.stats
            credited = credited_cache.get(r.stack)
            if credited is None:
                credited = credited_cache[r.stack] = tracker.credited(r.stack)
            for name in credited:
                inclusive[name] = inclusive[name] + r.stats
                operators[name][r.operator] = operators[name][r.operator] + r.stats
        calls = tracker.calls if tracker is not None else {}
        names = set(inclusive) | {n for n, c in calls.items() if c}
        if self.model is None or tracker is None:
            names.add(ROOT)
        return {
            name: ModuleStats(
                name=name,
                calls=calls.get(name, 0),
                params=self._param_counts().get(name, 0),
                inclusive=inclusive.get(name, Stats()),
                exclusive=exclusive.get(name, Stats()),
                by_operator=frozen_mapping(operators.get(name, {})),
            )
            for name in self._ordered(names)
        }

    def module_names(self) -> list[str]:
        """Module names in ``named_modules()`` order (the table's tree order)."""
        if self._tracker is None or not self._tracker.names:
            return [ROOT]
        return list(self._tracker.names)

    def _ordered(self, names: set) -> list[str]:
        order = {name: i for i, name in enumerate(self.module_names())}
        return sorted(names, key=lambda n: (order.get(n, len(order)), n))

    def _calls_in(self, category: str) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.records():
            if r.category == category:
                out[r.operator] += r.stats.calls
        return dict(out)

    def unsupported_ops(self) -> dict[str, int]:
        """``{"aten.foo": calls}`` for ops with no formula, no estimate, not declared zero-work:
        their bytes are counted, their flops are unknown."""
        return self._calls_in(UNSUPPORTED)

    def estimated_ops(self) -> dict[str, int]:
        """``{"aten.foo": calls}`` for ops priced by the family estimate of their tag
        (``torch.Tag.pointwise``: one flop per output element), not by a formula."""
        return self._calls_in(ESTIMATED)

    def coverage(self) -> Coverage:
        """Shares of the run's op calls, and of its bytes moved, priced by a formula, declared
        to do no arithmetic, estimated, or unknown."""
        calls = dict.fromkeys(CATEGORIES, 0)
        moved = dict.fromkeys(CATEGORIES, 0)
        for r in self.records():
            calls[r.category] += r.stats.calls
            moved[r.category] += r.stats.bytes_read + r.stats.bytes_written
        return Coverage(frozen_mapping(calls), frozen_mapping(moved))

    # -- output ---------------------------------------------------------------------------
    def table(self, depth: int = 2) -> str:
        """The module tree to ``depth`` (0 = root only) with human units and % of total."""
        return module_table(self, depth)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict:
        """Everything above as JSON-serialisable plain data."""
        return {
            "model": self.root_label,
            "attention": self.attention,
            "total": self.total.to_dict(),
            "by_phase": {p: s.to_dict() for p, s in self.by_phase().items()},
            "by_module": {n: m.to_dict() for n, m in self.by_module().items()},
            "by_operator": {op: s.to_dict() for op, s in self.by_operator().items()},
            "unsupported_ops": self.unsupported_ops(),
            "estimated_ops": self.estimated_ops(),
            "coverage": self.coverage().to_dict(),
            "records": [r.to_dict() for r in self.records()],
        }
