"""Per-rank and gathered tables of a tensor-parallel and an FSDP2 MLP on 2 gloo ranks (CPU).

    python benchmarks/distributed.py [--ranks 2] [--case pipeline]

Each rank counts its own run; rank 0 prints its table, then the gathered one
(``dispatch_flops.distributed.gather``) with min / max over ranks. ``--case pipeline``: one
pipeline stage per rank (GPipe, then 1F1B), per-stage compute, activation and gradient bytes,
busy and idle time, and the stages gathered side by side.
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
