"""Per-rank and gathered tables of a tensor-parallel and an FSDP2 MLP on 2 gloo ranks (CPU),
and an MoE layer's expert dispatch and combine (uneven all-to-all).

    python benchmarks/distributed.py [--ranks 2] [--case pipeline]

Each rank counts its own run; rank 0 prints its table, then the gathered one
(``dispatch_flops.distributed.gather``) with min / max over ranks. The MoE case prints each
rank's compute and both communication figures: comm bytes (what leaves the rank; NCCL-tests'
bus bytes) and algorithm bytes (the buffers, S; NCCL-tests' algbw, torch.profiler's sizes).
``--case pipeline``: one pipeline stage per rank (GPipe, then 1F1B), per-stage compute,
activation and gradient bytes, busy and idle time, and the stages gathered side by side.
"""

import argparse
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.distributed import gather


def mlp(d: int = 256, h: int = 1024) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))


def show(title: str, fc, rank: int) -> None:
    if rank == 0:
        print(f"\n== {title}: rank 0's own counts ==")
        print(fc.table())
    run = gather(fc)
    if run is not None:
        print(f"\n== {title}: gathered over {len(run.ranks)} ranks ==")
        print(run.table(ranks=True))
        print(f"logical (DTensor-level, global shapes): {run.logical.macs:,} MACs; "
              f"summed over ranks: {run.total.macs:,} MACs")


def rank_main(rank: int, world_size: int, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        x = torch.randn(32, 256, generator=torch.Generator().manual_seed(1))
        tp = mlp()
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        with FlopCounter(tp) as fc:
            tp(x).sum().backward()
        show("tensor parallel (ColwiseParallel, RowwiseParallel)", fc, rank)
        sharded = mlp()
        fully_shard(sharded[0])
        fully_shard(sharded[2])
        fully_shard(sharded)
        with FlopCounter(sharded) as fc:
            sharded(x).sum().backward()
        show("FSDP2 (fully_shard per Linear)", fc, rank)
        moe_all_to_all(rank, world_size)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def pipeline_main(rank: int, world_size: int, port: int) -> None:
    """One stage per rank: a block of two Linear layers each, 8 microbatches, GPipe then
    1F1B (a warm-up step first: the stages infer shapes), timed."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from dispatch_flops.distributed import pipeline_stage

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    try:
        x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
        for name, schedule in (("GPipe", ScheduleGPipe), ("1F1B", Schedule1F1B)):
            torch.manual_seed(rank)
            part = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
            stage = PipelineStage(part, rank, world_size, torch.device("cpu"))
            steps = schedule(stage, 8, loss_fn=lambda y, target: y.square().mean())

            def step(steps=steps):
                if rank == 0:
                    steps.step(x)
                elif rank == world_size - 1:
                    steps.step(target=x, losses=[])
                else:
                    steps.step()

            step()
            with FlopCounter(part, timing=True) as fc, pipeline_stage(stage, fc):
                step()
            run = gather(fc)
            if run is None:
                continue
            print(f"\n== pipeline, {name}, {world_size} stages: gathered ==")
            print(run.table(ranks=True, depth=1))
            for r in run.ranks:
                print(f"rank {r.run.rank}: {r.total.flops:,} flops, {r.total.macs:,} MACs, "
                      f"{r.total.comm_bytes:,} comm bytes")
            low, mean, high = run.imbalance()[""]["flops"]
            print(f"flops per stage min / mean / max: {low:,} / {mean:,.0f} / {high:,} "
                  f"(max / mean {high / mean:.3f})")
            phases = run.by_phase()
            print(f"comm bytes: forward {phases['forward'].comm_bytes:,}, backward "
                  f"{phases['backward'].comm_bytes:,}, other {phases['other'].comm_bytes:,}")
            print("stage  rank   fwd  bwd  act sent  act recv  grad sent  grad recv   busy ms"
                  "   idle ms  bubble")
            for s in run.pipeline().values():
                print(f"{s.stage:>5}  {s.rank:>4}  {s.forwards:>4} {s.backwards:>4}  "
                      f"{s.activations_sent:>8,}  {s.activations_received:>8,}  "
                      f"{s.gradients_sent:>9,}  {s.gradients_received:>9,}  "
                      f"{s.busy_s * 1e3:>8.2f}  {s.idle_s * 1e3:>8.2f}  {s.bubble:>6.1%}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


class ExpertParallelMoE(nn.Module):
    """Top-1 MoE with one expert per rank: tokens go to their expert's rank and back through
    uneven all-to-alls (split sizes from the router; the counts exchanged first)."""

    def __init__(self, d: int, n: int):
        super().__init__()
        self.router = nn.Linear(d, n, bias=False)
        self.expert = nn.Linear(d, 4 * d)  # this rank's expert (its own weights)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        import torch.distributed._functional_collectives as funcol

        group = dist.group.WORLD
        choice = self.router(x).argmax(-1)
        order = choice.argsort()
        sent = torch.bincount(choice, minlength=self.router.out_features)
        received = funcol.wait_tensor(funcol.all_to_all_single(sent, None, None, group))
        sent_sizes, received_sizes = sent.tolist(), received.tolist()
        tokens = funcol.wait_tensor(funcol.all_to_all_single(
            x[order], received_sizes, sent_sizes, group))
        y = self.out(torch.relu(self.expert(tokens)))
        back = funcol.wait_tensor(funcol.all_to_all_single(y, sent_sizes, received_sizes,
                                                           group))
        return torch.empty_like(back).index_copy_(0, order, back)


def moe_all_to_all(rank: int, world_size: int, tokens: int = 256, d: int = 128) -> None:
    """An MoE layer's dispatch and combine: per rank, its compute and both byte figures of
    the all-to-alls; gathered, their imbalance over ranks."""
    torch.manual_seed(0)
    moe = ExpertParallelMoE(d, world_size)
    with torch.no_grad():  # a hot expert: the router favours expert 0
        moe.router.weight.add_(torch.eye(world_size, d))
    x = torch.randn(tokens, d, generator=torch.Generator().manual_seed(10 + rank))
    x[:, 0] += 1.0
    with torch.no_grad(), FlopCounter(moe) as fc:
        moe(x)
    run = gather(fc)
    if run is None:
        return
    print(f"\n== MoE expert dispatch and combine (top-1, {world_size} experts, uneven "
          "all-to-all) ==")
    print(f"{'rank':>4} {'tokens in':>9} {'FLOPs':>12} {'comm bytes':>11} {'alg bytes':>11}")
    for p in run.ranks:
        ins = p.by_module()["expert"].macs // (4 * d * d)  # rows through the expert
        print(f"{p.run.rank:>4} {ins:>9} {p.total.flops:>12,} {p.total.comm_bytes:>11,} "
              f"{p.total.comm_alg_bytes:>11,}")
    low, mean, high = run.imbalance()[""]["flops"]
    print(f"FLOPs over ranks: min {low:,.0f}, mean {mean:,.0f}, max {high:,.0f} "
          f"(max / mean {high / mean:.2f})")
    low, mean, high = run.imbalance()[""]["comm_bytes"]
    print(f"comm bytes over ranks: min {low:,.0f}, mean {mean:,.0f}, max {high:,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--case", choices=("tp-fsdp", "pipeline"), default="tp-fsdp")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = pipeline_main if args.case == "pipeline" else rank_main
    mp.start_processes(target, args=(args.ranks, port), nprocs=args.ranks,
                       start_method="spawn")


if __name__ == "__main__":
    main()
