"""Run in spawned processes by test_pipeline: DTensor ops whose sharding DTensor works out by
tracing their decomposition on meta tensors (no sharding rule of their own), counted on one
rank of a real gloo group: hardswish on a row-sharded DTensor and in a tensor-parallel MLP
(fast) and, when asked, torch's
own ``context_parallel`` attention (slow on CPU: tens of seconds for a tiny attention). Writes
what it saw to ``rank{r}.json`` for the test to check against hand counts it computes
itself."""

import json
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dispatch_flops import FlopCounter

ROWS, D = 4, 8  # each rank's rows of the hardswish input
CP_SHAPE = (1, 2, 16, 8)  # context parallel attention: [batch, heads, sequence, head dim]


def ops(fc) -> dict:
    """Per operator: [calls, flops, macs, comm_bytes] of one counter's run."""
    out: dict = {}
    for r in fc.to_profile().records():
        entry = out.setdefault(r.operator, [0, 0, 0, 0])
        for i, v in enumerate((r.stats.calls, r.stats.flops, r.stats.macs, r.stats.comm_bytes)):
            entry[i] += v
    return out


def run_rank(rank: int, world_size: int, port: int, out_dir: str, slow: bool) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    out: dict = {}
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        local = torch.randn(ROWS, D, generator=torch.Generator().manual_seed(rank))
        x = DTensor.from_local(local, mesh, [Shard(0)])
        with FlopCounter() as fc:
            y = F.hardswish(x)
        with FlopCounter() as plain:
            F.hardswish(local)
        out["hardswish"] = {"dtensor": ops(fc), "plain": ops(plain),
                            "right": torch.equal(y.to_local(), F.hardswish(local))}
        # tensor parallel: hardswish between a colwise and a rowwise Linear
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(D, 2 * D), torch.nn.Hardswish(),
                                  torch.nn.Linear(2 * D, D))
        parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        with FlopCounter(mlp) as fc:
            mlp(torch.randn(ROWS, D)).sum().backward()
        out["mlp"] = {"ops": ops(fc),
                      "macs": {ph: s.macs for ph, s in fc.to_profile().by_phase().items()}}
        if slow:
            from torch.distributed.tensor.experimental import context_parallel

            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(*CP_SHAPE, generator=g) for _ in range(3))
            keys, values = k.clone(), v.clone()
            with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
                rows = q.clone()  # this rank's query rows (in the load-balancing order)
                with FlopCounter() as fc:
                    attention = F.scaled_dot_product_attention(q, k, v)
            # without a mask, the order of the keys does not matter: each row as the whole
            mine = F.scaled_dot_product_attention(rows, keys, values)
            out["cp"] = {"ops": ops(fc), "logical_macs": fc.to_profile().logical.macs,
                         "rows": rows.shape[2],
                         "right": torch.allclose(attention, mine, atol=1e-5)}
    finally:
        dist.destroy_process_group()
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump(out, f)
