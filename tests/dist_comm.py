"""Run in spawned processes by test_distributed_comm: one rank of a real gloo group runs
collectives with uneven and rooted layouts, a tensor-parallel attention block on local tensors,
and gathers that skip a round, and writes what it saw to ``rank{r}.json`` for the test to check
against hand counts it computes itself."""

import json
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.distributed import gather


def run_rank(rank: int, world_size: int, port: int, out_dir: str, parts: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    out: dict = {}
    try:
        for part in parts:
            out[part] = globals()["_" + part](rank, world_size)
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump(out, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


# -- gather rounds ----------------------------------------------------------------------------
def _attempt(fc, **kwargs) -> str:
    try:
        result = gather(fc, **kwargs)
    except RuntimeError as e:
        return str(e)
    return "none" if result is None else f"ranks {[p.run.rank for p in result.ranks]}"


def _rounds(rank: int, n: int) -> dict:
    """Round 1: every rank. Round 2: the last rank skips it. Round 3: every rank. Round 4:
    dst (0) skips it. Round 5: every rank. A barrier between rounds orders them (the rounds
    themselves are not barriers)."""
    model = nn.Linear(4, 4)
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    seen = []
    for round_, skipping in enumerate((None, n - 1, None, 0, None), start=1):
        seen.append("skipped" if rank == skipping else _attempt(fc, timeout=2))
        dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    keys = sorted(k for k in _keys(store) if "dispatch_flops/gather" in k)
    return {"seen": seen, "keys": keys}


def _keys(store) -> list:
    try:
        return [k.decode() if isinstance(k, bytes) else k for k in store.list_keys()]
    except Exception as e:  # a store without the extended API
        return [f"unlisted: {e}"]
