"""MoE expert load as figures (``Profile.experts``; ``Profile.experts_table`` lays them out,
in ``views.text``): per MoE layer, the tokens each expert was given, their imbalance, and the
padding a capacity kernel computed. The counts come from ``RunFacts.experts``
(``engine.model.expert_load`` records them, by the rules docs/distributed.md states)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dispatch_flops.results.protocols import ProfileLike


@dataclass(frozen=True)
class ExpertStats:
    """One MoE layer: ``tokens[i]`` the tokens (token-expert pairs) expert ``i`` was given,
    ``rows[i]`` the rows its kernel computed for them (more than its tokens only where it
    pads to a capacity), over ``calls`` calls of the layer. ``imbalance``: the busiest
    expert's tokens / the mean (1.0 when even; None without tokens), ``idle``: experts given
    none, ``padding``: the share of rows computed that held no token."""

    layer: str
    calls: int
    tokens: tuple
    rows: tuple

    @property
    def experts(self) -> int:
        return len(self.tokens)

    @property
    def total(self) -> int:
        return sum(self.tokens)

    @property
    def mean(self) -> float:
        return self.total / len(self.tokens) if self.tokens else 0.0

    @property
    def imbalance(self) -> Optional[float]:
        return max(self.tokens) / self.mean if self.total else None

    @property
    def idle(self) -> int:
        return sum(1 for t in self.tokens if t == 0)

    @property
    def padding_rows(self) -> int:
        return sum(self.rows) - self.total

    @property
    def padding(self) -> float:
        computed = sum(self.rows)
        return self.padding_rows / computed if computed else 0.0


def expert_stats(profile: ProfileLike) -> dict[str, ExpertStats]:
    """``{layer: ExpertStats}`` in tree order; {} for a model without recognised experts."""
    return {layer: ExpertStats(layer, calls, tokens, rows)
            for layer, tokens, rows, calls in profile.run.experts}
