"""MoE expert load as figures (``Profile.experts``) and as text (``Profile.experts_table``):
per MoE layer, the tokens each expert was given, their imbalance, and the padding a
capacity kernel computed. The counts come from ``RunFacts.experts`` (``engine.expert_load``
records them, by the rules docs/distributed.md states)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from dispatch_flops.results.format import human

if TYPE_CHECKING:
    from dispatch_flops.results.profile import Profile


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


def expert_stats(profile: Profile) -> dict[str, ExpertStats]:
    """``{layer: ExpertStats}`` in tree order; {} for a model without recognised experts."""
    return {layer: ExpertStats(layer, calls, tokens, rows)
            for layer, tokens, rows, calls in profile.run.experts}


def experts_text(profile: Profile) -> str:
    """One line per MoE layer: experts, tokens, min / mean / max tokens per expert, the
    imbalance (max / mean), idle experts, padding."""
    stats = expert_stats(profile)
    if not stats:
        return "No MoE layers (no module matched the expert rules: docs/distributed.md)"
    width = max(len("Layer"), *(len(s) for s in stats))
    lines = [f"{'Layer':<{width}}  Experts  Calls  Tokens    Min     Mean     Max  Max/mean"
             "  Idle  Padding"]
    lines.append("-" * len(lines[0]))
    for layer, s in stats.items():
        imbalance = f"{s.imbalance:.2f}" if s.imbalance is not None else "-"
        lines.append(f"{layer:<{width}}  {s.experts:>7}  {s.calls:>5}  {human(s.total):>6}  "
                     f"{min(s.tokens):>5}  {s.mean:>7.1f}  {max(s.tokens):>6}  {imbalance:>8}  "
                     f"{s.idle:>4}  {s.padding:>7.1%}")
    return "\n".join(lines)
