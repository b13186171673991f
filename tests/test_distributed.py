"""Distributed runs on real torch.distributed (gloo, CPU, spawned ranks on localhost): per-rank
truth under tensor parallelism (DTensor), FSDP2 and DDP, collectives priced by the ring
convention, ranks gathered, and a failed rank ending dst's gather instead of hanging it.
Each world size is spawned once (``tests/dist_scenarios.py`` runs every scenario and writes
what it saw); the oracles are computed here: closed forms on the shard shapes, and the
single-process count each rank made of the same model."""


import dist_scenarios
import pytest
import torch
from dist_scenarios import BATCH, D, H
from gloo import spawn_ranks

from dispatch_flops import COMM_BOUND, DEVICES, Profile, Stats
from dispatch_flops.distributed import gather, gathered

FLOAT = 4  # float32 bytes




@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def world(request, tmp_path_factory):
    n = request.param
    return n, spawn_ranks(dist_scenarios.run_rank, n, tmp_path_factory.mktemp(f"world{n}"))


def ring_all_reduce(size, n):
    return size * 2 * (n - 1) // n


def ring_gather(size, n):
    return size * (n - 1) // n


@pytest.mark.slow
def test_every_op_priced_in_every_run(world):
    """No op is unsupported or estimated in the TP, FSDP2 and DDP runs of any rank."""
    n, ranks = world
    for rank in ranks:
        for run in ("tp", "fsdp", "ddp"):
            assert rank[run]["unsupported"] == {}, (run, rank[run]["unsupported"])
            assert rank[run]["estimated"] == {}, (run, rank[run]["estimated"])
            assert (rank[run]["rank"], rank[run]["world_size"]) == (ranks.index(rank), n)


@pytest.mark.slow
def test_tensor_parallel_counts_local_shards(world):
    """Each rank counts its shard's MACs (closed form on the local shapes), forward and
    backward; the ranks sum to the single-process count, which the DTensor-level (logical)
    figure keeps."""
    n, ranks = world
    assert ranks[0]["tp_local_weight"] == [H // n, D]
    local = BATCH * D * (H // n)  # one product of one shard: [B, D] x [D, H/n]
    for rank in ranks:
        # forward: x @ W1_shard, h_shard @ W2_shard; backward: fc2's grad input and weight,
        # fc1's grad weight (x needs no gradient)
        assert rank["tp"]["macs"] == {"forward": 2 * local, "backward": 3 * local}
        single = rank["single"]["macs"]
        assert rank["tp"]["logical_macs"] == single["forward"] + single["backward"]
        assert rank["tp"]["dtensor_ops"] > 0
    for phase in ("forward", "backward"):
        assert sum(r["tp"]["macs"][phase] for r in ranks) == ranks[0]["single"]["macs"][phase]


@pytest.mark.slow
def test_tensor_parallel_all_reduce_is_priced_by_the_ring(world):
    """Row-wise parallel all-reduces the [B, D] partial sums: S * 2(n-1)/n per rank."""
    n, ranks = world
    for rank in ranks:
        reduces = {k: v for k, v in rank["tp"]["comm"].items()
                   if k.startswith("_c10d_functional.all_reduce|")}
        assert sum(calls for calls, _ in reduces.values()) == 1
        assert sum(b for _, b in reduces.values()) == ring_all_reduce(BATCH * D * FLOAT, n)
        assert any(k.startswith("_c10d_functional.wait_tensor|") for k in rank["tp"]["comm"])


@pytest.mark.slow
def test_fsdp2_counts_the_local_batch_and_prices_each_unit(world):
    """FSDP2: each rank's flops and MACs equal a single process on its own batch; every
    all-gather and reduce-scatter moves (n-1)/n of its unit's padded flat parameters, and
    each unit is all-gathered in forward and reduce-scattered once."""
    n, ranks = world
    flat = ranks[0]["fsdp_flat_numel"]
    unit_bytes = {ring_gather(numel * FLOAT, n) for numel in flat.values()}
    for rank in ranks:
        for figure in ("macs", "flops"):
            assert rank["fsdp"][figure] == rank["fsdp_single"][figure]
        gathers = scatters = 0
        for key, (calls, comm) in rank["fsdp"]["comm"].items():
            operator, module, phase = key.split("|")
            per_call = comm / calls
            if operator == "c10d._allgather_base_":
                gathers += calls
                if phase == "forward":  # the unit whose forward needs it
                    assert per_call == ring_gather(flat[module] * FLOAT, n)
            elif operator == "c10d._reduce_scatter_base_":
                scatters += calls
                assert per_call in unit_bytes
        assert scatters == len(flat)
        assert gathers >= len(flat)
        forward_gathers = sum(calls for key, (calls, _) in rank["fsdp"]["comm"].items()
                              if key.startswith("c10d._allgather_base_|")
                              and key.endswith("|forward"))
        assert forward_gathers == len(flat)
        total = sum(comm for _, comm in rank["fsdp"]["comm"].values())
        # every phase's: FSDP2's last reduce-scatter runs in autograd's final callback, with
        # no node and no module running ("other")
        assert total == sum(rank["fsdp"]["comm_bytes"].values())


@pytest.mark.slow
def test_ddp_all_reduces_the_gradient_bucket(world):
    """DDP: one bucket holding every gradient, all-reduced in backward: bucket bytes x
    2(n-1)/n; MACs equal a single process on the local batch."""
    n, ranks = world
    for rank in ranks:
        assert rank["ddp"]["macs"] == rank["fsdp_single"]["macs"]
        reduces = [v for k, v in rank["ddp"]["comm"].items() if k.startswith("c10d.allreduce_|")]
        assert sum(calls for calls, _ in reduces) == 1
        assert rank["ddp"]["comm_bytes"]["backward"] == ring_all_reduce(
            rank["ddp_param_bytes"], n)
        assert sum(rank["ddp"]["comm_bytes"].values()) == rank["ddp"]["comm_bytes"]["backward"]


@pytest.mark.slow
def test_gather_sums_ranks_and_keeps_them(world):
    """On rank 0 the gathered Profile sums the ranks, keeps them in rank order, shows min and
    max columns; other ranks get None."""
    n, ranks = world
    g = ranks[0]["tp_gathered"]
    assert g["ranks"] == list(range(n)) and g["world_size"] == n and g["steps"] == 1
    assert g["macs"] == sum(g["rank_macs"]) == sum(
        r["tp"]["macs"]["forward"] + r["tp"]["macs"]["backward"] for r in ranks)
    assert g["comm_bytes"] == n * ring_all_reduce(BATCH * D * FLOAT, n)
    assert g["logical_macs"] == ranks[0]["tp"]["logical_macs"]  # one global program
    low, mean, high = g["imbalance"]["2"]
    assert low == high == mean  # tensor parallel splits evenly
    header = g["table"].splitlines()[0]
    assert "FLOPs min" in header and "FLOPs max" in header and "Comm" in header
    f = ranks[0]["fsdp_gathered"]
    assert f["macs"] == sum(f["rank_macs"]) == n * f["rank_macs"][0]
    assert all("tp_gathered" not in r for r in ranks[1:])


@pytest.mark.slow
def test_a_failed_rank_ends_gather_with_an_error(world):
    """The last rank raised inside its block and never gathered: rank 0's gather raises
    after its timeout, naming it; the other ranks' gather returns None."""
    n, ranks = world
    assert f"rank(s) [{n - 1}] sent no profile within 3 s" in ranks[0]["failed_gather"]
    assert all(r["failed_gather"] == "returned" for r in ranks[1:-1])
    assert "failed_gather" not in ranks[-1]


@pytest.mark.slow
def test_deepspeed_printout_reads_the_device_mesh(world):
    """World / dp / mp sizes: tensor parallel on a 1-D mesh is model parallel, FSDP2 data
    parallel."""
    n, ranks = world

    def sizes(text):
        return [int(line.split()[-1]) for line in text.splitlines()
                if line.startswith(("world size:", "data parallel size:",
                                    "model parallel size:"))]

    for rank in ranks:
        assert sizes(rank["tp_printout"]) == [n, 1, n]
        assert sizes(rank["fsdp_printout"]) == [n, n, 1]


# -- without spawning ---------------------------------------------------------------------
def test_gathered_profiles_and_cross_rank_mfu():
    """``gathered`` sums rank Profiles, keeps them, takes the longest wall; MFU across ranks
    is the summed model flops / (wall x world x peak); bad calls raise ValueError."""
    from torch import nn

    from dispatch_flops import FlopCounter

    model = nn.Linear(8, 8)
    runs = []
    for _ in range(3):
        with FlopCounter(model, timing=True) as fc:
            model(torch.randn(4, 8)).sum().backward()
        runs.append(fc.to_profile())
    g = gathered(runs)
    assert len(g.ranks) == 3 and g.total.macs == 3 * runs[0].total.macs
    assert g.steps == 1 and g.wall_s == max(r.wall_s for r in runs)
    spec = DEVICES["H100-SXM"]
    expected = sum(2 * r.total.macs for r in runs) / (g.wall_s * 3 * spec.peak_flops())
    assert g.mfu(spec, torch.float32) == pytest.approx(expected)
    assert "Latency min" in g.table(ranks=True, width=1000)
    with pytest.raises(ValueError, match="gathered"):
        runs[0].table(ranks=True)
    with pytest.raises(ValueError, match="gathered"):
        runs[0].imbalance()
    with pytest.raises(ValueError, match="init_process_group"):
        gather(runs[0])
    # a JSON file written before comm_bytes existed still reads
    data = runs[0].to_dict()
    for r in data["records"]:
        del r["stats"]["comm_bytes"]
    assert Profile.from_dict(data).total.macs == runs[0].total.macs


def test_comm_time_on_the_roofline():
    """The roofline's comm time is comm bytes / interconnect bandwidth; a collective with
    more wire time than compute or memory time is communication-bound."""
    spec = DEVICES["H100-SXM"]
    stats = Stats(calls=1, bytes_read=1000, bytes_written=1000, comm_bytes=10**9)
    roof = spec.roofline(stats)
    assert roof.comm_s == pytest.approx(10**9 / spec.interconnect_bandwidth)
    assert roof.bound == COMM_BOUND and roof.attainable_s == roof.comm_s
    assert spec.roofline(Stats(flops=10)).comm_s == 0.0
    from dataclasses import replace
    with pytest.raises(ValueError, match="interconnect_bandwidth"):
        replace(spec, interconnect_bandwidth=-1)
    assert replace(spec, interconnect_bandwidth=None).roofline(stats).comm_s is None
