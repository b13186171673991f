"""A checked formula as text (``workflows.formula_check.FormulaCheck``): one row per config
(the formula's and the counted flops per token, the error), then each component's miss, and
the smallest failing config. What it reads is a Protocol (views never import workflows)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol, Sequence

from tabulate import tabulate

from dispatch_flops.results.format import scientific


class ComponentCheckLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def formula(self) -> Any: ...

    @property
    def counted(self) -> int: ...

    @property
    def modules(self) -> tuple: ...


    @property
    def miss(self) -> Any: ...

    @property
    def error(self) -> Optional[float]: ...


class ConfigCheckLike(Protocol):
    @property
    def config(self) -> Mapping[str, Any]: ...

    @property
    def tokens(self) -> int: ...

    @property
    def components(self) -> Sequence[ComponentCheckLike]: ...


    @property
    def error(self) -> float: ...

    @property
    def per_token(self) -> tuple[float, float]: ...

    @property
    def exact(self) -> bool: ...


class FormulaCheckLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def per(self) -> str: ...

    @property
    def against(self) -> str: ...

    @property
    def training(self) -> bool: ...

    @property
    def rows(self) -> Sequence[ConfigCheckLike]: ...

    @property
    def smallest_failing(self) -> Optional[ConfigCheckLike]: ...

    @property
    def seconds(self) -> float: ...


    @property
    def configs_per_s(self) -> float: ...


def _config(fields: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in fields.items())


def _error(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:+.2%}"


def _modules(names: Sequence[str]) -> str:
    if not names:
        return "(rest)"
    return names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1})"


def formula_check_text(check: FormulaCheckLike) -> str:
    """The check's table: per config, then per component, then the smallest failing one."""
    measure = {"contractions": "2 x MACs", "all_ops": "all ops",
               "hardware": "hardware"}[check.against]
    phase = "forward + backward" if check.training else "forward"
    rows = []
    for row in check.rows:
        mine, counted = row.per_token
        rows.append([_config(row.config), scientific(mine), scientific(counted),
                     _error(row.error), "yes" if row.exact else "NO"])
        for c in row.components:
            rows.append([f"  {c.name}: {_modules(c.modules)}",
                         "-" if c.formula is None else scientific(float(c.formula) / row.tokens),
                         scientific(c.counted / row.tokens), _error(c.error), ""])
    lines = [f"check_formula {check.name}: flops per token, {phase}, counted as {measure}; "
             f"{len(check.rows)} configs in {check.seconds:.1f} s "
             f"({check.configs_per_s:.2f} configs/s)",
             tabulate(rows, headers=["config / component: modules", "formula", "counted",
                                     "error", "exact"], disable_numparse=True)]
    if check.smallest_failing is not None:
        small = check.smallest_failing
        wrong = [c.name for c in small.components if c.error is not None and c.error != 0
                 and c.formula is not None]
        lines.append(f"smallest failing config: {_config(small.config)} (error "
                     f"{_error(small.error)}; wrong: {', '.join(wrong) or 'the total'})")
    return "\n".join(lines)
