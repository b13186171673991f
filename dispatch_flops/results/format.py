"""The one number formatter used everywhere in the package."""

from __future__ import annotations

from typing import Optional

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))


def _digits(value: float, precision: int, compact: bool) -> str:
    # compact: as DeepSpeed prints, str(round(x, 2)): '75.5', '144.0', not '75.50', '144.00'
    return str(round(value, precision)) if compact else f"{value:.{precision}f}"


def human(value: float, unit: str = "", precision: int = 2, *, compact: bool = False) -> str:
    """11_170_000_000 -> '11.17 G' (+unit). Decimal prefixes, as DeepSpeed prints them;
    ``compact=True`` drops trailing zeros as DeepSpeed does ('75.5 MMACs', not '75.50')."""
    magnitude = abs(value)
    for scale, prefix in _PREFIXES:
        if magnitude >= scale:
            return f"{_digits(value / scale, precision, compact)} {prefix}{unit}"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value)} {unit}".rstrip()
    return f"{_digits(value, precision, compact)} {unit}".rstrip()


def duration(seconds: float, precision: int = 2, *, compact: bool = False) -> str:
    """0.08319 -> '83.19 ms': seconds in the largest unit that keeps the value >= 1;
    ``compact=True`` as ``human`` ('144.0 us')."""
    magnitude = abs(seconds)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if magnitude >= scale:
            return f"{_digits(seconds / scale, precision, compact)} {unit}"
    return f"{_digits(seconds / 1e-9, precision, compact)} ns" if magnitude else "0 s"


def percent(part: float, whole: Optional[float], precision: int = 2) -> str:
    """'12.34%' of ``whole``; '-' when ``whole`` is 0 or unknown (None)."""
    return f"{100.0 * part / whole:.{precision}f}%" if whole else "-"


def scientific(x: float) -> str:
    """4 significant digits, in e-notation from 10,000 on: 1234.5 -> '1235', 123456 ->
    '1.235e5' (no '+' or leading zeros in the exponent)."""
    if abs(x) < 1e4:
        return f"{x:.4g}"
    mantissa, exponent = f"{x:.3e}".split("e")
    return f"{mantissa}e{int(exponent)}"
