"""Run in spawned processes by test_pipeline: one rank of a real gloo group is one pipeline
stage (torch.distributed.pipelining), runs GPipe and 1F1B steps under a counter with
``pipeline_stage``, gathers them, then counts an MoE layer whose routing depends on the rank
(expert load), and writes what it saw to ``rank{r}.json`` for the test to check against hand
counts it computes itself. One spawn runs every scenario."""

import json
from datetime import timedelta

import torch
import torch.distributed as dist
from moe_models import ListMoE
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.distributed import gather, pipeline_stage

D, BATCH, MICRO = 8, 8, 4  # every stage a Linear(D, D); microbatches of BATCH / MICRO rows
MOE_EXPERTS, MOE_ROUTE = 4, [0, 0, 0, 1, 2, 2, 0, 1, 0, 2]  # rank 0's routing of 10 tokens


def stage_module(rank: int) -> nn.Module:
    """Stage 0 a bare Linear, the others a Linear and a ReLU: the stages' trees differ."""
    torch.manual_seed(rank)
    return nn.Linear(D, D) if rank == 0 else nn.Sequential(nn.Linear(D, D), nn.ReLU())


def summary(p) -> dict:
    """What a test checks of one rank's run: MACs per phase, communication per (operator,
    phase) as [calls, comm_bytes], the pipeline actions."""
    comm: dict = {}
    for r in p.records():
        if r.category == "communication":
            entry = comm.setdefault(f"{r.operator}|{r.phase}|{r.module}", [0, 0])
            entry[0] += r.stats.calls
            entry[1] += r.stats.comm_bytes
    return {"macs": {ph: s.macs for ph, s in p.by_phase().items()}, "comm": comm,
            "flops": p.total.flops,
            "pipeline": [list(a) for a in p.run.pipeline], "wall_s": p.wall_s,
            "stages": {str(k): vars(v) for k, v in p.pipeline().items()}}


CP_SHAPE = (1, 2, 16, 8)  # context parallel attention: [batch, heads, sequence, head dim]


def ring_attention(q, k, v, rank: int, n: int):
    """Context parallel attention as ring attention does it: this rank's query block against
    every key / value block, the blocks rotating around the ring (send to the next rank,
    receive from the previous one) while the current one is computed; the partial results
    merged by their log-sum-exp (the CPU flash kernel returns it)."""
    out = lse = None
    for step in range(n):
        works = []
        if step < n - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            after, before = (rank + 1) % n, (rank - 1) % n
            works = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, after), dist.P2POp(dist.isend, v, after),
                dist.P2POp(dist.irecv, k_next, before), dist.P2POp(dist.irecv, v_next, before)])
        block, block_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v)[:2]
        block_lse = block_lse.unsqueeze(-1)
        if out is None:
            out, lse = block, block_lse
        else:
            merged = torch.logaddexp(lse, block_lse)
            out = out * torch.exp(lse - merged) + block * torch.exp(block_lse - merged)
            lse = merged
        for work in works:
            work.wait()
        if step < n - 1:
            k, v = k_next, v_next
    return out


def context_parallel_runs(rank: int, n: int) -> dict:
    """Ring attention over the ranks' sequence blocks (each rank's block of the same q, k,
    v), checked against the whole attention. (torch's own context_parallel runs forward
    only on CPU in torch 2.13, its backward having no sharding rule for the CPU flash
    kernel: docs/distributed.md.)"""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*CP_SHAPE, generator=g) for _ in range(3))
    block = CP_SHAPE[2] // n
    mine = [t[:, :, rank * block:(rank + 1) * block].contiguous() for t in (q, k, v)]
    with FlopCounter() as fc:
        out = ring_attention(*mine, rank, n)
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out_cp: dict = {"right": torch.allclose(out, whole[:, :, rank * block:(rank + 1) * block],
                                            atol=1e-5)}
    out_cp["ring"] = summary(fc.to_profile())
    return out_cp


def run_rank(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    out: dict = {}
    try:
        for name, schedule in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
            module = stage_module(rank)
            stage = PipelineStage(module, rank, world_size, torch.device("cpu"))
            steps = schedule(stage, MICRO, loss_fn=lambda y, target: y.sum())
            x = torch.randn(BATCH, D, generator=torch.Generator().manual_seed(1))

            def step(steps=steps):
                if rank == 0:
                    steps.step(x)
                elif rank == world_size - 1:
                    steps.step(target=torch.zeros(BATCH, D), losses=[])
                else:
                    steps.step()

            step()  # the first step also infers shapes between stages: left uncounted
            with FlopCounter(module, timing=True) as fc, pipeline_stage(stage, fc):
                step()
            out[name] = summary(fc.to_profile())
            out[name]["restored"] = "forward_one_chunk" not in vars(stage)
            run = gather(fc)
            if run is not None:
                out[name]["gathered"] = {
                    "names": run.module_names(), "root": run.root_label,
                    "macs": run.total.macs, "comm_bytes": run.total.comm_bytes,
                    "rank_macs": [r.total.macs for r in run.ranks],
                    "imbalance": run.imbalance(), "table": run.table(ranks=True, width=120),
                    "stages": {str(k): vars(v) for k, v in run.pipeline().items()},
                    "forward_comm": run.by_phase()["forward"].comm_bytes,
                    "backward_comm": run.by_phase()["backward"].comm_bytes}
        # expert load: every rank routes the same tokens to experts shifted by its rank
        moe = ListMoE(D, 2 * D, MOE_EXPERTS, [(e + rank) % MOE_EXPERTS for e in MOE_ROUTE])
        with FlopCounter(moe) as fc:
            moe(torch.randn(len(MOE_ROUTE), D)).sum().backward()
        out["moe"] = {"tokens": list(fc.experts()["experts"].tokens)}
        run = gather(fc)
        if run is not None:
            layer = run.experts()["experts"]
            out["moe"]["gathered"] = {"tokens": list(layer.tokens), "calls": layer.calls,
                                      "ranks": [list(r.experts()["experts"].tokens)
                                                for r in run.ranks]}
        out["cp"] = context_parallel_runs(rank, world_size)
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump(out, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
