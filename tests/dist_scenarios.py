"""Run in spawned processes by test_distributed: one rank of a real gloo group counts tensor
parallel, FSDP2 and DDP runs, gathers them, and writes what it saw to ``rank{r}.json`` for
the test to check against oracles it computes itself. One spawn runs every scenario."""

import contextlib
import io
import json
import math
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from dispatch_flops import BACKWARD, FORWARD, FlopCounter, FlopsProfiler
from dispatch_flops.distributed import gather

D, H, BATCH = 16, 32, 4  # MLP d -> h -> d; every rank's local batch


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, D))


def summary(fc) -> dict:
    """What a test checks of one rank's run."""
    p = fc.to_profile()
    phases = p.by_phase()
    comm: dict = {}  # (operator, module) -> [calls, comm_bytes]
    for r in p.records():
        if r.category == "communication":
            entry = comm.setdefault(f"{r.operator}|{r.module}|{r.phase}", [0, 0])
            entry[0] += r.stats.calls
            entry[1] += r.stats.comm_bytes
    return {
        "macs": {ph: phases[ph].macs for ph in (FORWARD, BACKWARD)},
        "flops": {ph: phases[ph].flops for ph in (FORWARD, BACKWARD)},
        "comm_bytes": {ph: stats.comm_bytes for ph, stats in phases.items()},
        "unsupported": p.unsupported_ops(),
        "estimated": p.estimated_ops(),
        "comm": comm,
        "logical_macs": p.logical.macs,
        "dtensor_ops": len(p.run.dtensor_ops),
        "rank": p.run.rank,
        "world_size": p.run.world_size,
        "by_operator_flops": {op: s.flops for op, s in p.by_operator().items()},
    }


def run_rank(rank: int, world_size: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    try:
        _scenarios(rank, world_size, out_dir)
    finally:
        dist.destroy_process_group()


def _scenarios(rank: int, n: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    out: dict = {}
    mesh = init_device_mesh("cpu", (n,))
    torch.manual_seed(1)  # the same input on every rank (tensor parallel replicates it)
    x = torch.randn(BATCH, D)

    # single process, full model: the oracle every distributed count is compared with
    with FlopCounter(mlp()) as fc:
        mlp()(x)  # a different instance: nothing counted toward the counter's modules
    reference = mlp()
    with FlopCounter(reference) as fc:
        reference(x).sum().backward()
    out["single"] = summary(fc)

    # tensor parallel: column-wise then row-wise
    tp = mlp()
    parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    with FlopCounter(tp) as fc_tp:
        tp(x).sum().backward()
    out["tp"] = summary(fc_tp)
    out["tp_local_weight"] = list(tp[0].weight.to_local().shape)
    printout = io.StringIO()
    with contextlib.redirect_stdout(printout):
        with FlopsProfiler(tp) as prof:
            tp(x)
        prof.print_model_profile(detailed=False)
    out["tp_printout"] = printout.getvalue()
    gathered_tp = gather(fc_tp)
    if gathered_tp is not None:
        out["tp_gathered"] = {
            "ranks": [p.run.rank for p in gathered_tp.ranks],
            "macs": gathered_tp.total.macs,
            "rank_macs": [p.total.macs for p in gathered_tp.ranks],
            "comm_bytes": gathered_tp.total.comm_bytes,
            "steps": gathered_tp.steps,
            "world_size": gathered_tp.run.world_size,
            "logical_macs": gathered_tp.logical.macs,
            "imbalance": {k: v["flops"] for k, v in gathered_tp.imbalance().items()},
            "table": gathered_tp.table(ranks=True, width=1000),
        }

    # FSDP2: each Linear a unit, the root too; every rank its own batch
    torch.manual_seed(100 + rank)
    local_x = torch.randn(BATCH, D)
    sharded = mlp()
    units = {"0": sharded[0], "2": sharded[2]}
    flat = {name: sum(math.ceil(p.shape[0] / n) * n * math.prod(p.shape[1:])
                      for p in unit.parameters()) for name, unit in units.items()}
    for unit in units.values():
        fully_shard(unit)
    fully_shard(sharded)
    with FlopCounter(sharded) as fc_fsdp:
        sharded(local_x).sum().backward()
    out["fsdp"] = summary(fc_fsdp)
    out["fsdp_flat_numel"] = flat
    with FlopCounter(mlp()) as fc:
        pass
    local_reference = mlp()
    with FlopCounter(local_reference) as fc:
        local_reference(local_x).sum().backward()
    out["fsdp_single"] = summary(fc)
    printout = io.StringIO()
    with contextlib.redirect_stdout(printout):
        with FlopsProfiler(sharded) as prof:
            sharded(local_x)
        prof.print_model_profile(detailed=False)
    out["fsdp_printout"] = printout.getvalue()
    gathered_fsdp = gather(fc_fsdp)
    if gathered_fsdp is not None:
        out["fsdp_gathered"] = {"macs": gathered_fsdp.total.macs,
                                "rank_macs": [p.total.macs for p in gathered_fsdp.ranks]}

    # DDP: one gradient bucket, all-reduced
    ddp_model = mlp()
    ddp = nn.parallel.DistributedDataParallel(ddp_model)
    with FlopCounter(ddp) as fc_ddp:
        ddp(local_x).sum().backward()
    out["ddp"] = summary(fc_ddp)
    out["ddp_param_bytes"] = sum(p.numel() * p.element_size() for p in ddp_model.parameters())

    # a rank that raises inside its block never gathers: dst's gather ends with an error
    if rank == n - 1:
        try:
            with FlopCounter(mlp()):
                raise RuntimeError("this rank failed")
        except RuntimeError:
            pass
    else:
        try:
            result = gather(fc_ddp, timeout=3)
            out["failed_gather"] = "returned" if result is None else "gathered"
        except RuntimeError as e:
            out["failed_gather"] = str(e)

    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()
