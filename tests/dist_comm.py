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
    for skipping in (None, n - 1, None, 0, None):
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


# -- collectives: what each rank sends ------------------------------------------------------
ROW = 16  # float32 elements per row: 64 bytes


def rows_sent(call: int, src: int, dst: int) -> int:
    """Rows rank ``src`` sends ``dst`` in all-to-all number ``call`` (its own chunk: 5)."""
    return 5 if src == dst else 1 + (src + dst + call) % 3


def _comm(fc) -> dict:
    """``{operator: [calls, comm_bytes, comm_alg_bytes]}`` of the collectives counted."""
    out: dict = {}
    for r in fc.to_profile().records():
        if r.category == "communication":
            entry = out.setdefault(r.operator, [0, 0, 0])
            entry[0] += r.stats.calls
            entry[1] += r.stats.comm_bytes
            entry[2] += r.stats.comm_alg_bytes
    return out


def _collectives(rank: int, n: int) -> dict:
    import torch.distributed._functional_collectives as funcol

    out: dict = {}

    def split(call):
        sent = [rows_sent(call, rank, d) for d in range(n)]
        received = [rows_sent(call, s, rank) for s in range(n)]
        return sent, received

    # uneven all-to-all, functional (the MoE dispatch / combine path) then c10d's
    with FlopCounter() as fc:
        for call in (0, 1):
            sent, received = split(call)
            x = torch.randn(sum(sent), ROW)
            y = funcol.all_to_all_single(x, received, sent, dist.group.WORLD)
            y = funcol.wait_tensor(y)
            assert y.shape[0] == sum(received)
    out["functional_uneven"] = _comm(fc)
    out["table_header"] = fc.table(width=1000).splitlines()[0]
    with FlopCounter() as fc:
        for call in (0, 1):
            sent, received = split(call)
            x = torch.randn(sum(sent), ROW)
            y = torch.empty(sum(received), ROW)
            dist.all_to_all_single(y, x, received, sent)
    out["c10d_uneven"] = _comm(fc)
    with FlopCounter() as fc:  # even: no split sizes
        x = torch.randn(4 * n, ROW)
        dist.all_to_all_single(torch.empty_like(x), x)
    out["c10d_even"] = _comm(fc)
    with FlopCounter() as fc:  # lists: one [3, ROW] tensor per rank (gloo: same sizes)
        dist.all_to_all([torch.empty(3, ROW) for _ in range(n)],
                        [torch.randn(3, ROW) for _ in range(n)])
    out["c10d_lists"] = _comm(fc)
    # rooted collectives: root 1 for broadcast and reduce (so the chain's last rank is 0),
    # root 0 for gather and scatter
    t = torch.randn(4, ROW)
    with FlopCounter() as fc:
        dist.broadcast(t, src=1)
    out["broadcast"] = _comm(fc)
    with FlopCounter() as fc:
        dist.reduce(t, dst=1)
    out["reduce"] = _comm(fc)
    with FlopCounter() as fc:
        dist.gather(t, [torch.empty_like(t) for _ in range(n)] if rank == 0 else None, dst=0)
    out["gather"] = _comm(fc)
    with FlopCounter() as fc:
        dist.scatter(t, [torch.randn(4, ROW) for _ in range(n)] if rank == 0 else None, src=0)
    out["scatter"] = _comm(fc)
    with FlopCounter() as fc:
        dist.all_reduce(t)
    out["all_reduce"] = _comm(fc)
    return out


# -- tensor parallel attention on local tensors ---------------------------------------------
B, S, DIM, HEADS = 2, 8, 16, 4


class Attention(nn.Module):
    """Multi-head self-attention written out: under tensor parallelism (q, k, v column-wise,
    o row-wise, ``use_local_output``) the attention math runs on plain local tensors holding
    the rank's heads (``-1``: as many as it has)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x):
        hd = DIM // HEADS
        q, k, v = (f(x).view(B, S, -1, hd).transpose(1, 2) for f in (self.q, self.k, self.v))
        weights = ((q @ k.transpose(-2, -1)) * hd ** -0.5).softmax(-1)
        return self.o((weights @ v).transpose(1, 2).reshape(B, S, -1))


def _attention(rank: int, n: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(1)  # the same input on every rank (tensor parallel replicates it)
    x = torch.randn(B, S, DIM)
    single = Attention()
    with FlopCounter(single) as fc:
        single(x).sum().backward()
    p = fc.to_profile()
    out = {"single": [p.total.flops, p.total.macs],
           "single_forward": [p.by_phase()["forward"].flops, p.by_phase()["forward"].macs]}
    mesh = init_device_mesh("cpu", (n,))
    tp = Attention()
    parallelize_module(tp, mesh, {"q": ColwiseParallel(), "k": ColwiseParallel(),
                                  "v": ColwiseParallel(), "o": RowwiseParallel()})
    with FlopCounter(tp) as fc:
        tp(x).sum().backward()
    p = fc.to_profile()
    out["tp_logical"] = [p.logical.flops, p.logical.macs]
    out["tp_flops"] = p.total.flops
    with torch.no_grad(), FlopCounter(tp) as fc:  # forward only, to_local without autograd
        tp(x)
    out["tp_forward_logical"] = [fc.logical.flops, fc.logical.macs]
    gathered = gather(fc, timeout=30)
    if gathered is not None:
        out["gathered_logical"] = [gathered.logical.flops, gathered.logical.macs]
    return out


def _fsdp(rank: int, n: int) -> dict:
    """FSDP2 on the attention block, with an SGD step: each rank its own batch; the logical
    figure is one replica's unsharded program (the step on whole parameters), what a single
    process counts on that batch."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(100 + rank)
    x = torch.randn(B, S, DIM)
    single = Attention()
    step = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
    with FlopCounter(single) as fc:
        single(x).sum().backward()
        step.step()
    out = {"single": [fc.total.flops, fc.total.macs]}
    sharded = Attention()
    for layer in (sharded.q, sharded.k, sharded.v, sharded.o):
        fully_shard(layer)
    fully_shard(sharded)
    step = torch.optim.SGD(sharded.parameters(), lr=0.1, momentum=0.9)
    with FlopCounter(sharded) as fc:
        sharded(x).sum().backward()
        step.step()
    out["logical"] = [fc.logical.flops, fc.logical.macs]
    out["executed"] = [fc.total.flops, fc.total.macs]
    return out
