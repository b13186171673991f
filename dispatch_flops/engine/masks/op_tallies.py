"""Which tally each aten op has: the mode's lookup (``tally_of``, ``shadow_tally_of``).

SDPA's kernels (``masks.sdpa``), the ops of attention written as plain ops
(``masks.math_path``), dropout's noise (``masks.dropout``) and, apart, the ops that
build masks from shapes (``masks.shadows``).
"""

from __future__ import annotations

from typing import Callable, Optional

from dispatch_flops.engine.masks import dropout, math_path, sdpa
from dispatch_flops.engine.masks.shadows import SHADOW_TALLIES

# no op is in two of these tables: one op, one tally
TALLIES = {**sdpa.TALLIES, **math_path.TALLIES, **dropout.TALLIES}


def tally_of(func) -> Optional[Callable]:
    """The tally of ``func`` (an op overload), None for ops that read no mask."""
    return TALLIES.get(func)


def shadow_tally_of(func) -> Optional[Callable]:
    """The tally that keeps the CPU values of ``func``'s meta outputs built from shapes
    (``shadows.SHADOWS``), None for ops that cannot build a mask; to be called only for a call
    whose output is a meta tensor."""
    return SHADOW_TALLIES.get(func)
