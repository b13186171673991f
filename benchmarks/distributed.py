"""Per-rank and gathered tables of a tensor-parallel and an FSDP2 MLP on 2 gloo ranks (CPU).

    python benchmarks/distributed.py [--ranks 2]

Each rank counts its own run; rank 0 prints its table, then the gathered one
(``dispatch_flops.distributed.gather``) with min / max over ranks.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(rank_main, args=(args.ranks, port), nprocs=args.ranks,
                       start_method="spawn")


if __name__ == "__main__":
    main()
