"""Runs of different models as parts of one: pipeline stages (each rank a different part of
the model) gathered into one Profile whose tree holds each stage's under a common root, and
the per-stage figures of a pipeline (``Profile.pipeline``).

``side_by_side`` re-roots each run under a child of a new root (``stage0``, ``stage1``, ...:
the stage index a run's pipeline actions name, else ``rank<r>``) and gives every one the
union of the trees, so ``combine.merge`` adds them like ranks of one model; each run's own
re-rooted Profile (only its own tree) is kept for ``ranks``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from dispatch_flops.results.facts import ModuleFacts
from dispatch_flops.results.protocols import P, ProfileLike
from dispatch_flops.results.stats import ROOT

PIPELINE = "Pipeline"  # the root's label of stages gathered side by side
STAGE = 0  # the slot of an action's stage in RunFacts.pipeline (see facts.RunFacts)


def part_name(profile: ProfileLike, position: int) -> str:
    """The child of the common root ``profile`` goes under: ``stage<i>`` when its pipeline
    actions name one stage ``i``, else ``rank<r>`` (its rank, else its position)."""
    stages = {action[STAGE] for action in profile.run.pipeline}
    if len(stages) == 1:
        return f"stage{stages.pop()}"
    rank = profile.run.rank
    return f"rank{position if rank is None else rank}"


def apart(profiles: Sequence[ProfileLike]) -> bool:
    """Whether runs are parts of one model rather than copies of it: their models differ
    (root label or module tree), or their pipeline actions name different stages."""
    first = profiles[0]
    if any(p.root_label != first.root_label or p.module_facts.names != first.module_facts.names
           for p in profiles[1:]):
        return True
    named = [{action[STAGE] for action in p.run.pipeline} for p in profiles]
    return len({frozenset(n) for n in named if n}) > 1


def _moved(name: str, prefix: str) -> str:
    return prefix if name == ROOT else f"{prefix}.{name}"


def rerooted(profile: P, prefix: str) -> P:
    """``profile`` with its root the module ``prefix`` of a new root labelled ``PIPELINE``:
    every module name, row stack and fact moved under it."""
    def stack(s: tuple) -> tuple:
        return (ROOT,) + tuple(_moved(n, prefix) for n in s)

    facts = profile.module_facts
    moved = ModuleFacts(
        names=(ROOT,) + tuple(_moved(n, prefix) for n in facts.names),
        types=("",) + facts.types,
        params=(facts.params[0],) + facts.params,
        calls={_moved(n, prefix): c for n, c in facts.calls.items()},
        spans={_moved(n, prefix): s for n, s in facts.spans.items()},
        idle={_moved(n, prefix): s for n, s in facts.idle.items()},
        saved={stack(s): b for s, b in facts.saved.items()},
        graph_runs={stack(s): r for s, r in facts.graph_runs.items()},
        in_graphs=tuple(_moved(n, prefix) for n in facts.in_graphs))
    rows = [(key._replace(stack=stack(key.stack)), counts) for key, counts in profile.rows]
    return profile.replace(rows=rows, module_facts=moved,
                           run=replace(profile.run, model=PIPELINE, has_model=True,
                                       experts=tuple((_moved(layer, prefix), *rest)
                                                     for layer, *rest in profile.run.experts)),
                           parts=(), ranks=(), trace=None)


def with_tree(profile: P, names: tuple, types: tuple, params: tuple) -> P:
    """``profile`` with the module tree ``names`` (a union holding its own), for merging."""
    return profile.replace(module_facts=replace(profile.module_facts, names=names,
                                                types=types, params=params))


def side_by_side(profiles: Sequence[ProfileLike]) -> tuple[list, list]:
    """``(parts, own)``: the runs re-rooted side by side, each with the union tree (to merge),
    and each with its own tree only (to keep as ``ranks``)."""
    own = [rerooted(p, part_name(p, i)) for i, p in enumerate(profiles)]
    if len({p.module_facts.names[1] for p in own}) != len(own):
        own = [rerooted(p, f"rank{i}") for i, p in enumerate(profiles)]  # stages repeat
    names, types, params = [ROOT], [""], [sum(p.module_facts.params[0] for p in own)]
    for p in own:
        facts = p.module_facts
        names.extend(facts.names[1:])
        types.extend(facts.types[1:])
        params.extend(facts.params[1:])
    tree = (tuple(names), tuple(types), tuple(params))
    own = [p.replace(module_facts=replace(p.module_facts, params=(tree[2][0],)
                                          + p.module_facts.params[1:])) for p in own]
    return [with_tree(p, *tree) for p in own], own


# -- the pipeline's figures ---------------------------------------------------------------
@dataclass(frozen=True)
class StageStats:
    """One pipeline stage over a run: its actions (forward ``F``, backward ``B`` / ``I``,
    weight gradients ``W``), the bytes of activations and gradients it sent and received,
    and, timed, the seconds its actions ran (``busy_s``), the block's wall time, and the rest
    of it (``idle_s``: waiting for its peers, the pipeline's bubble, and the schedule's own
    work) with ``bubble`` = idle / wall. Times are None untimed."""

    stage: int
    rank: Optional[int]
    forwards: int
    backwards: int
    activations_sent: int
    activations_received: int
    gradients_sent: int
    gradients_received: int
    busy_s: Optional[float]
    wall_s: Optional[float]
    idle_s: Optional[float]
    bubble: Optional[float]


def stage_stats(profile: ProfileLike) -> dict[int, StageStats]:
    """``{stage: StageStats}`` of the stages ``profile``'s pipeline actions name (one rank's,
    or each gathered rank's); {} outside a pipeline."""
    runs = profile.ranks or (profile,)
    out: dict[int, StageStats] = {}
    for run in runs:
        by_stage: dict[int, list] = {}
        for action in run.run.pipeline:
            by_stage.setdefault(action[STAGE], []).append(action)
        timed = run.timing and run.wall_s is not None
        for stage, actions in sorted(by_stage.items()):
            def moved(letters: str, slot: int, actions: list = actions) -> int:
                return sum(a[slot] for a in actions if a[1] in letters)

            busy = sum(a[4] for a in actions) / 1e9 if timed else None
            wall = run.wall_s if timed else None
            idle = None if busy is None or wall is None else max(wall - busy, 0.0)
            out[stage] = StageStats(
                stage=stage, rank=run.run.rank,
                forwards=sum(1 for a in actions if a[1] == "F"),
                backwards=sum(1 for a in actions if a[1] in "BI"),
                activations_sent=moved("F", 5), activations_received=moved("F", 6),
                gradients_sent=moved("BI", 5), gradients_received=moved("BI", 6),
                busy_s=busy, wall_s=wall, idle_s=idle,
                bubble=None if idle is None or not wall else idle / wall)
    return out
