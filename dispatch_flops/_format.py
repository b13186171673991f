"""The one number formatter used everywhere in the package."""

from __future__ import annotations

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))


def human(value: float, unit: str = "", precision: int = 2) -> str:
    """11_170_000_000 -> '11.17 G' (+unit). Decimal prefixes, as DeepSpeed prints them."""
    magnitude = abs(value)
    for scale, prefix in _PREFIXES:
        if magnitude >= scale:
            return f"{value / scale:.{precision}f} {prefix}{unit}"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value)} {unit}".rstrip()
    return f"{value:.{precision}f} {unit}".rstrip()


def duration(seconds: float, precision: int = 2) -> str:
    """0.08319 -> '83.19 ms': seconds in the largest unit that keeps the value >= 1."""
    magnitude = abs(seconds)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if magnitude >= scale:
            return f"{seconds / scale:.{precision}f} {unit}"
    return f"{seconds / 1e-9:.{precision}f} ns" if magnitude else "0 s"
