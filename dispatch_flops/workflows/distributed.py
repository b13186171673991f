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
from dataclasses import replace
from datetime import timedelta
from typing import Optional

from dispatch_flops.results import schema, stages
from dispatch_flops.results.profile import Profile, as_profile
from dispatch_flops.workflows.pipeline import pipeline_stage

__all__ = ["gather", "gathered", "pipeline_stage"]

_ROUNDS: dict = {}  # gathers made per group in this process: every rank counts the same


def gather(run, dst: int = 0, group=None, *, timeout: float = 300.0) -> Optional[Profile]:
    """Every rank of ``group`` (default: the world) calls it with its counter or Profile; on
    rank ``dst`` (a global rank of the group) it returns the gathered Profile (see
    ``gathered``), on the others ``None``. ``RuntimeError`` on ``dst`` when a rank has sent
    nothing within ``timeout`` seconds; ``ValueError`` outside ``torch.distributed`` or when
    ``dst`` is not in the group."""
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
    name = getattr(group, "group_name", "world")
    _ROUNDS[name] = round_ = _ROUNDS.get(name, 0) + 1
    prefix = f"dispatch_flops/gather/{name}/{round_}/"
    store = dist.distributed_c10d._get_default_store()
    if profile.run.rank is None:
        profile = profile.replace(run=replace(profile.run, rank=rank, world_size=len(ranks)))
    store.set(prefix + str(rank), json.dumps(profile.to_dict()))
    if rank != dst:
        return None
    keys = [prefix + str(r) for r in ranks]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception:  # the store's timeout error: say which ranks never sent
        missing = [r for r, k in zip(ranks, keys) if not store.check([k])]
        raise RuntimeError(
            f"dispatch_flops.distributed.gather: rank(s) {missing} sent no profile within "
            f"{timeout:g} s (did they raise inside their block, or not call gather?)") from None
    profiles = []
    for r, key in zip(ranks, keys):
        # a peer's payload is read as a file is: checked field by field (results.validate)
        profiles.append(Profile(*schema.loads(store.get(key), f"rank {r}")))
        store.delete_key(key)
    return gathered(profiles)


def gathered(profiles) -> Profile:
    """One Profile from the Profiles of a run's ranks (in rank order): every view sums over
    them (``Profile.merge``), ``ranks`` keeps them, ``steps`` is a rank's (they ran side by
    side), ``wall_s`` the longest rank's, ``world_size`` their number, and the DTensor-level
    (logical) ops are the first rank's (every rank runs the same global program).

    Ranks that ran different models, or different pipeline stages (``pipeline_stage``: alike
    stages too), are gathered side by side: each one's
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
    sharded = fsdp is not None and hasattr(fsdp, "FSDPModule") and any(
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
