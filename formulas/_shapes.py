"""Small shape helpers shared by the formula modules."""

from __future__ import annotations

from math import prod
from typing import Sequence


def numel(shape: Sequence[int]) -> int:
    return prod(shape)
