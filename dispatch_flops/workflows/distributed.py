"""Ranks brought together: every rank's Profile gathered into one on ``dst``.

>>> import torch.distributed as dist
>>> from dispatch_flops import FlopCounter
>>> from dispatch_flops.distributed import gather
>>> with FlopCounter(model) as fc:
...     model(x).sum().backward()
>>> run = gather(fc)                      # on every rank; the Profile on rank 0, None elsewhere
>>> if run is not None:
...     print(run.table(ranks=True))      # summed over ranks, with min / max columns
...     run.ranks[1].by_module()          # one rank's own Profile
...     run.imbalance()["layers.0"]["flops"]   # (min, mean, max) over ranks

The Profiles travel through the process group's key-value store (the one
``init_process_group`` made), not through a collective: a rank that raised inside its block
and never calls ``gather`` makes ``dst`` wait ``timeout`` seconds and then raise, naming it,
instead of hanging every rank in a collective that can never complete.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import timedelta
from typing import Optional

from dispatch_flops.engine.torch_private import lookup
from dispatch_flops.results import schema, stages
from dispatch_flops.results.profile import Profile, as_profile
from dispatch_flops.workflows.pipeline import PipelineStageCounter, pipeline_stage

__all__ = ["gather", "gathered", "PipelineStageCounter", "pipeline_stage"]

def gather(run, dst: int = 0, group=None, *, timeout: float = 300.0) -> Optional[Profile]:
    """Every rank of ``group`` (default: the world) calls it with its counter or Profile; on
    rank ``dst`` (a global rank of the group) it returns the gathered Profile (see
    ``gathered``), on the others ``None``. ``RuntimeError`` on ``dst`` when a rank has sent
    nothing within ``timeout`` seconds, and on the others when ``dst`` opened no round within
    it; ``ValueError`` outside ``torch.distributed`` or when ``dst`` is not in the group.

    Rounds are agreed through the store, not counted per process: ``dst`` opens round ``k``
    (a store-side counter), every other rank joins the round ``dst`` has open, and ``dst``
    closes it when it has read every payload or given up waiting, deleting the round's keys.
    A rank that skipped a round (raised, returned early) joins the next one: one failed
    round never shifts the later ones. A call made while ``dst`` still waits on a round
    joins that round."""
    import torch.distributed as dist

    profile = as_profile(run)
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("gather needs torch.distributed: call torch.distributed."
                         "init_process_group first (torchrun sets it up)")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    group = group if group is not None else dist.group.WORLD
    ranks = dist.get_process_group_ranks(group)
    if dst not in ranks:
        raise ValueError(f"dst must be one of the group's ranks {ranks}, got {dst!r}")
    rank = dist.get_rank()
    if rank not in ranks:
        raise ValueError(f"rank {rank} is not in the group (its ranks: {ranks})")
    base = f"{_PREFIX}{getattr(group, 'group_name', 'world')}/"
    get_store = lookup("torch.distributed.distributed_c10d._get_default_store")
    if get_store is None:  # renamed in this torch (warned once, naming gather)
        import torch

        raise RuntimeError(f"dispatch_flops.gather needs torch.distributed's default store, "
                           f"which torch {torch.__version__} renamed: gather each rank's "
                           f"Profile.to_json() yourself and merge them with Profile.merge")
    store = get_store()
    if profile.run.rank is None:
        profile = profile.replace(run=replace(profile.run, rank=rank, world_size=len(ranks)))
    payload = json.dumps(profile.to_dict())
    if rank != dst:
        _join(store, base, rank, dst, payload, timeout)
        return None
    round_ = store.add(base + "rounds", 1)  # the store's count: every rank reads the same
    prefix = f"{base}{round_}/"
    others = [r for r in ranks if r != dst]
    keys = [prefix + str(r) for r in others]
    store.set(base + "current", f"{round_} open")
    try:
        try:
            if keys:
                store.wait(keys, timedelta(seconds=timeout))
        except Exception:  # the store's timeout error: say which ranks never sent
            missing = [r for r, k in zip(others, keys) if not store.check([k])]
            raise RuntimeError(
                f"dispatch_flops.distributed.gather: rank(s) {missing} sent no profile within "
                f"{timeout:g} s (did they raise inside their block, or not call gather?)"
            ) from None
        texts: dict = dict(zip(others, (store.get(key) for key in keys)))
    finally:
        store.set(base + "current", f"{round_} closed")
        for key in keys:
            if store.check([key]):
                store.delete_key(key)
    texts[dst] = payload
    # a peer's payload is read as a file is: checked field by field (results.validate)
    return gathered([Profile(*schema.loads(texts[r], f"rank {r}")) for r in ranks])


_PREFIX = "dispatch_flops/gather/"
_POLL_S = 0.02


def _join(store, base: str, rank: int, dst: int, payload: str, timeout: float) -> None:
    """A rank other than ``dst``: wait (``timeout`` seconds at most) for ``dst`` to open a
    round this rank has not posted to, post ``payload`` there, and take it back if ``dst``
    closed the round meanwhile (it would be a stale key)."""
    deadline = time.monotonic() + timeout
    current = base + "current"
    while True:
        state = store.get(current).decode() if store.check([current]) else "0 closed"
        number, status = state.split()
        key = f"{base}{number}/{rank}"
        if status == "open" and not store.check([key]):
            break
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"dispatch_flops.distributed.gather: rank {dst} (dst) opened no gather round "
                f"within {timeout:g} s (did it raise inside its block, or not call gather?)")
        time.sleep(_POLL_S)
    store.set(key, payload)
    if store.get(current).decode() != state:
        store.delete_key(key)  # closed before we posted: dst will never read it


def gathered(profiles) -> Profile:
    """One Profile from the Profiles of a run's ranks (in rank order): every view sums over
    them (``Profile.merge``), ``ranks`` keeps them, ``steps`` is a rank's (they ran side by
    side), ``wall_s`` the longest rank's, ``world_size`` their number, and the DTensor-level
    (logical) ops are the first rank's (every rank runs the same global program).

    Ranks that ran different models, or different pipeline stages (``PipelineStageCounter``:
    alike stages too), are gathered side by side: each one's
    tree under a child of a common root labelled ``Pipeline`` (``stage<i>`` as its pipeline
    actions name it, else ``rank<r>``), every view summing over the whole pipeline, and
    ``ranks`` holding each rank's re-rooted Profile (its own tree only): ``imbalance``
    compares a module over the ranks that have it, the root over every rank."""
    profiles = [as_profile(p) for p in profiles]
    if stages.apart(profiles):
        profiles, own = stages.side_by_side(profiles)
        return _gathered(profiles).replace(ranks=tuple(own))
    return _gathered(profiles)


def _gathered(profiles: list) -> Profile:
    merged = Profile.merge(profiles)
    walls = [p.wall_s for p in profiles]
    run = replace(merged.run, steps=profiles[0].steps, rank=None, world_size=len(profiles),
                  wall_s=None if None in walls else max(walls),
                  dtensor_ops=profiles[0].run.dtensor_ops)
    return merged.replace(run=run, ranks=tuple(profiles))


_DATA_PARALLEL_DIMS = ("dp", "dp_shard", "dp_replicate", "fsdp", "hsdp", "ddp", "data",
                       "dp_shard_cp", "dp_cp")


def mesh_sizes(model) -> Optional[tuple]:
    """``(world, data parallel, model parallel)`` sizes from the device mesh of ``model``'s
    DTensor parameters (FSDP2, tensor parallelism), or None when it has none. A mesh
    dimension counts as data parallel when it is named so (``dp``, ``dp_shard``,
    ``dp_replicate``, ``fsdp``, ``hsdp``, ...) or, unnamed, when the model is FSDP2-sharded;
    every other dimension (``tp``, ``pp``, ``cp``, ``ep``, or an unnamed one under tensor
    parallelism alone) counts as model parallel."""
    import sys

    tensor = sys.modules.get("torch.distributed.tensor")
    if tensor is None or model is None:
        return None
    mesh = None
    for p in model.parameters():
        if isinstance(p, tensor.DTensor):
            mesh = p.device_mesh
            break
    if mesh is None:
        return None
    fsdp = sys.modules.get("torch.distributed.fsdp")
    sharded = fsdp is not None and any(
        isinstance(m, fsdp.FSDPModule) for m in model.modules())
    names = mesh.mesh_dim_names or (None,) * mesh.ndim
    dp = mp = 1
    for name, size in zip(names, mesh.shape):
        data_parallel = sharded if name is None else name.lower() in _DATA_PARALLEL_DIMS
        if data_parallel:
            dp *= size
        else:
            mp *= size
    return dp * mp, dp, mp
