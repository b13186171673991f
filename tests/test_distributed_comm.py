"""Communication per rank on real torch.distributed (gloo, CPU, spawned ranks on localhost):
all-to-all priced from its splits, rooted collectives by each rank's role, both byte figures
(bus and algorithm), ``Profile.logical`` with local tensors under tensor parallelism, and
gathers that survive a skipped round. ``tests/dist_comm.py`` runs the scenarios in every rank
and writes what it saw; the oracles are hand counts made here."""


import dist_comm
import pytest
from dist_comm import DIM, HEADS, ROW, B, S, rows_sent
from gloo import spawn_ranks

ROW_BYTES = ROW * 4  # float32
BLOCK = 4 * ROW_BYTES  # the [4, ROW] tensor of the rooted collectives




@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def world(request, tmp_path_factory):
    n = request.param
    parts = ("collectives", "attention", "fsdp", "rounds")
    return n, spawn_ranks(dist_comm.run_rank, n, tmp_path_factory.mktemp(f"comm{n}"), parts,
                          limit_s=120)


@pytest.mark.slow
def test_a_skipped_round_fails_alone_and_names_the_missing_rank(world):
    """Round 2: the last rank skips it; dst's gather fails naming that rank (not one that
    called), the others return. Round 4: dst skips it; the others fail naming dst. Rounds 3
    and 5 gather every rank again; no payload key is left in the store."""
    n, ranks = world
    everyone = f"ranks {list(range(n))}"
    seen = [r["rounds"]["seen"] for r in ranks]
    assert seen[0][0] == seen[0][2] == seen[0][4] == everyone
    assert f"rank(s) [{n - 1}] sent no profile within 2 s" in seen[0][1]
    assert seen[n - 1][1] == "skipped" and seen[0][3] == "skipped"
    for r in range(1, n):
        assert seen[r][0] == seen[r][2] == seen[r][4] == "none"
        assert "rank 0 (dst) opened no gather round within 2 s" in seen[r][3]
    for r in range(1, n - 1):
        assert seen[r][1] == "none"
    keys = ranks[0]["rounds"]["keys"]
    assert not any(k.startswith("unlisted") for k in keys), keys
    assert sorted(k.rsplit("/", 1)[-1] for k in keys) == ["current", "rounds"], keys


@pytest.mark.slow
def test_uneven_all_to_all_is_priced_from_the_splits(world):
    """Each rank's comm bytes are the rows it sends to the others (its own chunk stays), its
    algorithm bytes every row it sends; functional and c10d alike, two calls each. Even
    splits, and c10d's lists (gloo: one size), keep (n - 1)/n; the table shows both."""
    n, ranks = world
    for r, seen in enumerate(ranks):
        leaves = sum(rows_sent(call, r, d) for call in (0, 1) for d in range(n) if d != r)
        whole = sum(rows_sent(call, r, d) for call in (0, 1) for d in range(n))
        expected = [2, leaves * ROW_BYTES, whole * ROW_BYTES]
        assert seen["collectives"]["functional_uneven"][
            "_c10d_functional.all_to_all_single"] == expected
        assert seen["collectives"]["c10d_uneven"]["c10d.alltoall_base_"] == expected
        if n == 2 and r == 0:  # [5, 2] then [5, 3] rows: (n - 1)/n of them said 480 B
            assert expected[1:] == [5 * ROW_BYTES, 15 * ROW_BYTES]
        assert seen["collectives"]["c10d_lists"]["c10d.alltoall_"] == [
            1, (n - 1) * 3 * ROW_BYTES, n * 3 * ROW_BYTES]
        assert "Comm S" in seen["collectives"]["table_header"]
        size = 4 * n * ROW_BYTES  # even: (n - 1)/n of the buffer, as before
        assert seen["collectives"]["c10d_even"]["c10d.alltoall_base_"] == [
            1, size * (n - 1) // n, size]


@pytest.mark.slow
def test_rooted_collectives_by_each_ranks_role(world):
    """Broadcast from 1 along the chain 1, 2, .., 0: every rank forwards the block but 0;
    reduce to 1: every rank sends it but 1; gather to 0: every rank sends its block but 0;
    scatter from 0: 0 sends n - 1 blocks. Algorithm bytes: the block (broadcast, reduce,
    all-reduce), the n blocks (gather, scatter)."""
    n, ranks = world
    for r, seen in enumerate(ranks):
        c = seen["collectives"]
        assert c["broadcast"]["c10d.broadcast_"] == [1, 0 if r == 0 else BLOCK, BLOCK]
        assert c["reduce"]["c10d.reduce_"] == [1, 0 if r == 1 else BLOCK, BLOCK]
        assert c["gather"]["c10d.gather_"] == [1, 0 if r == 0 else BLOCK, n * BLOCK]
        assert c["scatter"]["c10d.scatter_"] == [1, (n - 1) * BLOCK if r == 0 else 0,
                                                 n * BLOCK]
        assert c["all_reduce"]["c10d.allreduce_"] == [1, BLOCK * 2 * (n - 1) // n, BLOCK]


@pytest.mark.slow
def test_logical_counts_attention_on_local_tensors(world):
    """Tensor parallel attention with ``use_local_output``: the attention math runs on plain
    local tensors holding n times fewer heads. ``logical`` (each rank's, and the gathered
    one) equals the single process: forward by hand (four projections, two attention
    products), forward and backward as a single process counts them; the ranks' executed
    flops stay theirs."""
    n, ranks = world
    hd = DIM // HEADS
    forward_macs = 4 * B * S * DIM * DIM + 2 * B * HEADS * S * S * hd
    for seen in ranks:
        a = seen["attention"]
        assert a["single_forward"][1] == forward_macs
        assert a["tp_forward_logical"] == a["single_forward"]
        assert a["tp_logical"] == a["single"]
        assert a["tp_flops"] < a["single"][0]  # what the rank executed: its share
    assert ranks[0]["attention"]["gathered_logical"] == ranks[0]["attention"]["single_forward"]


@pytest.mark.slow
def test_logical_under_fsdp2_is_one_replicas_program(world):
    """FSDP2 (each layer a unit) and an SGD step with momentum: compute runs on gathered
    plain parameters, the step on DTensor shards. ``logical`` equals a single process on the
    rank's batch, step included; what the rank executed has its shard's step only."""
    n, ranks = world
    params = 4 * (DIM * DIM + DIM)  # every dim divides by n: no padding
    for seen in ranks:
        f = seen["fsdp"]
        assert f["logical"] == f["single"]
        # a first SGD step with momentum: the buffer is the gradient's copy, then a scaled
        # add into the parameter (2 flops per element); the rank steps 1/n of the elements
        assert f["single"][0] - f["executed"][0] == 2 * params * (n - 1) // n


# -- without spawning: the formulas called as the engine calls them --------------------------
def test_all_to_all_formulas_take_the_ranks_own_chunk():
    """Lists (c10d's all_to_all): every tensor but the rank's own leaves; split sizes: the
    rows of the others; an empty split list: n even chunks; a split list of the wrong length:
    ValueError naming the sizes."""
    import torch

    from dispatch_flops.formulas import collectives as c

    f32 = torch.float32
    inputs = [torch.Size([5, ROW]), torch.Size([1, ROW]), torch.Size([2, ROW])]
    cost = c.alltoall(inputs, inputs, ("ProcessGroup", 3, 1), out_shape=None,
                      dtypes=[[f32] * 3, [f32] * 3], group_size=3, group_rank=1)
    assert (cost.comm_bytes, cost.comm_alg_bytes) == (7 * ROW_BYTES, 8 * ROW_BYTES)
    shape = torch.Size([8, ROW])
    for rank, leaves in ((0, 3), (1, 7), (2, 6)):
        cost = c.all_to_all_single(shape, [8, 8, 8], [5, 1, 2], "0", out_shape=shape,
                                   dtypes=[f32, None, None, None], group_size=3,
                                   group_rank=rank)
        assert (cost.comm_bytes, cost.comm_alg_bytes) == (leaves * ROW_BYTES, 8 * ROW_BYTES)
    # the case: rank 0 of 2 sends [5, 1] then [5, 2] rows of 64 B: 192 B leave it
    # ((n - 1)/n of the buffers said 416 B)
    two = [c.all_to_all_single(torch.Size([sum(split), ROW]), [], split, "0",
                               out_shape=torch.Size([sum(split), ROW]),
                               dtypes=[f32, None, None, None], group_size=2, group_rank=0)
           for split in ([5, 1], [5, 2])]
    assert sum(x.comm_bytes for x in two) == 192
    assert sum(x.comm_alg_bytes for x in two) == 13 * ROW_BYTES
    even = c.alltoall_base(shape, shape, ("ProcessGroup", 4, 2), [], [], out_shape=None,
                           dtypes=[f32, f32, None, None, None], group_size=4, group_rank=2)
    assert (even.comm_bytes, even.comm_alg_bytes) == (6 * ROW_BYTES, 8 * ROW_BYTES)
    with pytest.raises(ValueError, match=r"over 3 ranks got 2 split sizes \[5, 3\]"):
        c.all_to_all_single(shape, [], [5, 3], "0", out_shape=shape,
                            dtypes=[f32, None, None, None], group_size=3, group_rank=0)


def test_broadcast_chain_and_a_group_of_one():
    """Functional broadcast from src 2 over 4 ranks: rank 1 ends the chain and sends
    nothing; a group of one sends nothing at all, its algorithm bytes stay S."""
    import torch

    from dispatch_flops.formulas import collectives as c

    shape = torch.Size([4, ROW])
    sent = [c.functional_broadcast(shape, 2, "0", out_shape=shape,
                                   dtypes=[torch.float32, None, None], group_size=4,
                                   group_rank=r).comm_bytes for r in range(4)]
    assert sent == [BLOCK, 0, BLOCK, BLOCK]
    alone = c.broadcast([shape], ("ProcessGroup", 1, 0), 0, 0, out_shape=None,
                        dtypes=[[torch.float32], None, None, None], group_size=1,
                        group_rank=0)
    assert (alone.comm_bytes, alone.comm_alg_bytes) == (0, BLOCK)


def test_algorithm_bytes_travel_like_every_count(tmp_path):
    """``comm_alg_bytes`` is a Stats count: summed by merge, written and read back by
    to_dict / from_dict, 0 in a file written before it existed, a CSV column, and a table
    column when a run communicated."""
    import torch
    from torch import nn

    from dispatch_flops import FlopCounter, Profile, Stats

    assert Stats(comm_alg_bytes=3) + Stats(comm_alg_bytes=4) == Stats(comm_alg_bytes=7)
    model = nn.Linear(4, 4)
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    p = fc.to_profile()
    data = p.to_dict()
    for r in data["records"]:
        del r["stats"]["comm_alg_bytes"]
    assert Profile.from_dict(data).total == p.total
    p.to_csv(tmp_path / "run.csv")
    assert "comm_alg_bytes" in (tmp_path / "run.csv").read_text().splitlines()[0]
    assert "Comm S" not in p.table(width=1000)
