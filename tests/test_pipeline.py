"""Pipeline parallelism (torch.distributed.pipelining) on real gloo groups of 2 and 4 spawned
ranks, one stage each, GPipe and 1F1B: each stage's MACs, its activation and gradient
transfers in the phase of the work that produces or consumes them (none left in ``other``),
each microbatch's actions in the schedule's order with their bytes, busy and idle time, and
the stages (different modules) gathered side by side. Hand counts are computed here
(``tests/pipe_scenarios.py`` runs the ranks)."""


import pipe_scenarios
import pytest
import torch
from gloo import spawn_ranks
from pipe_scenarios import BATCH, MICRO, D

from dispatch_flops import FlopCounter, Profile
from dispatch_flops.distributed import gathered, pipeline_stage

FLOAT = 4
ROWS = BATCH // MICRO  # a microbatch's rows
ACTIVATION = ROWS * D * FLOAT  # bytes of one microbatch's activation (and of its gradient)




@pytest.fixture(scope="module", params=[2, pytest.param(4, marks=pytest.mark.slow)],
                ids=["2 ranks", "4 ranks"])
def world(request, tmp_path_factory):
    n = request.param
    return n, spawn_ranks(pipe_scenarios.run_rank, n, tmp_path_factory.mktemp(f"pipe{n}"))


def expected_order(schedule: str, stage: int, n: int) -> list:
    """The (action, microbatch) sequence a stage runs, from the schedules' definitions:
    GPipe all forwards then all backwards; 1F1B min(M, n - stage) forwards to warm up, then
    one backward and one forward in turn, then the backwards left."""
    if schedule == "gpipe":
        return [["F", i] for i in range(MICRO)] + [["B", i] for i in range(MICRO)]
    warmup = min(MICRO, n - stage)
    order = [["F", i] for i in range(warmup)]
    forward, backward = warmup, 0
    while True:
        order.append(["B", backward])
        backward += 1
        if forward == MICRO:
            break
        order.append(["F", forward])
        forward += 1
    order += [["B", i] for i in range(backward, MICRO)]
    return order


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_stage_counts_its_microbatches(world, schedule):
    """Forward: one [ROWS, D] x [D, D] product per microbatch; backward: the weight gradient,
    and the input gradient on every stage but the first (its input needs none)."""
    n, ranks = world
    for stage, rank in enumerate(ranks):
        run = rank[schedule]
        product = ROWS * D * D
        assert run["macs"]["forward"] == MICRO * product
        assert run["macs"]["backward"] == MICRO * product * (1 if stage == 0 else 2)
        assert run["restored"]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_transfers_land_in_the_phase_that_makes_or_uses_them(world, schedule):
    """Activations sent and received in forward, gradients in backward, one transfer per
    microbatch, on the stage's root; none in ``other`` (1F1B fires a forward's sends in one
    batch with the next backward's receives: told apart by the tensor each moves)."""
    n, ranks = world
    for stage, rank in enumerate(ranks):
        comm = rank[schedule]["comm"]
        want = {}
        if stage < n - 1:  # sends activations forward, receives their gradients
            want["c10d.send|forward|"] = [MICRO, MICRO * ACTIVATION]
            want["c10d.recv_|backward|"] = [MICRO, 0]
        if stage > 0:  # receives activations, sends their gradients back
            want["c10d.recv_|forward|"] = [MICRO, 0]
            want["c10d.send|backward|"] = [MICRO, MICRO * ACTIVATION]
        assert comm == want, (stage, comm)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_every_microbatch_action_in_the_schedules_order(world, schedule):
    """Each stage's actions, in the order they ran, are the schedule's; a forward sends and
    receives one activation, a backward one gradient (none past either end)."""
    n, ranks = world
    for stage, rank in enumerate(ranks):
        actions = rank[schedule]["pipeline"]
        assert [a[1:3] for a in actions] == expected_order(schedule, stage, n)
        for s, action, _, start, ns, sent, received in actions:
            assert s == stage and ns > 0 and start > 0
            first, last = stage == 0, stage == n - 1
            if action == "F":
                assert (sent, received) == (0 if last else ACTIVATION, 0 if first else ACTIVATION)
            else:
                assert (sent, received) == (0 if first else ACTIVATION, 0 if last else ACTIVATION)
        starts = [a[3] for a in actions]
        assert starts == sorted(starts)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_busy_and_idle_time_per_stage(world, schedule):
    """Busy: the seconds the stage's actions ran; idle: the rest of its block (the bubble)."""
    n, ranks = world
    for stage, rank in enumerate(ranks):
        run = rank[schedule]
        stats = run["stages"][str(stage)]
        busy = sum(a[4] for a in run["pipeline"]) / 1e9
        assert stats["busy_s"] == pytest.approx(busy)
        assert stats["wall_s"] == run["wall_s"]
        assert stats["busy_s"] + stats["idle_s"] == pytest.approx(run["wall_s"])
        assert 0 < stats["bubble"] < 1
        assert stats["bubble"] == pytest.approx(stats["idle_s"] / stats["wall_s"])
        assert (stats["forwards"], stats["backwards"]) == (MICRO, MICRO)
        assert stats["activations_sent"] == (0 if stage == n - 1 else MICRO * ACTIVATION)
        assert stats["gradients_received"] == (0 if stage == n - 1 else MICRO * ACTIVATION)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_stages_gathered_side_by_side(world, schedule):
    """Stages with different modules: one tree per stage under a common root, sums over the
    whole pipeline, imbalance of the root over every rank and of a stage's module over its
    own rank, every stage's figures."""
    n, ranks = world
    g = ranks[0][schedule]["gathered"]
    assert all("gathered" not in r[schedule] for r in ranks[1:])
    assert g["root"] == "Pipeline"
    assert g["names"] == ["", "stage0"] + [name for s in range(1, n)
                                           for name in (f"stage{s}", f"stage{s}.0",
                                                        f"stage{s}.1")]
    macs = [sum(r[schedule]["macs"].values()) for r in ranks]
    assert g["rank_macs"] == macs and g["macs"] == sum(macs)
    assert g["forward_comm"] == g["backward_comm"] == (n - 1) * MICRO * ACTIVATION
    flops = [r[schedule]["flops"] for r in ranks]
    low, mean, high = g["imbalance"][""]["flops"]
    assert (low, mean, high) == (min(flops), sum(flops) / n, max(flops))
    for s in range(n):
        low, mean, high = g["imbalance"][f"stage{s}"]["flops"]
        assert low == mean == high == flops[s]
    assert sorted(g["stages"]) == [str(s) for s in range(n)]
    assert [g["stages"][str(s)]["rank"] for s in range(n)] == list(range(n))
    header, _, root, *_ = g["table"].splitlines()
    assert "FLOPs min" in header or "Fmin" in header
    assert root.startswith("Pipeline")


def test_expert_load_per_rank_and_gathered(world):
    """Rank r sends token i to expert (route[i] + r) mod 4: its tokens per expert are rank
    0's [5, 2, 3, 0] shifted by r; gathered, they add up expert by expert, one call per rank."""
    n, ranks = world
    base = [5, 2, 3, 0]
    mine = [[base[(e - r) % 4] for e in range(4)] for r in range(n)]
    assert [r["moe"]["tokens"] for r in ranks] == mine
    g = ranks[0]["moe"]["gathered"]
    assert g["ranks"] == mine and g["calls"] == n
    assert g["tokens"] == [sum(m[e] for m in mine) for e in range(4)]


# -- without spawning ---------------------------------------------------------------------
def test_pipeline_stage_refuses_what_it_cannot_watch():
    """A stage outside a counting block, or an object that is no pipeline stage: ValueError
    saying what is needed."""
    class Stage:
        def __getattr__(self, name):
            return lambda *a, **k: []

    fc = FlopCounter(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="counting"):
        pipeline_stage(Stage(), fc)
    with fc, pytest.raises(ValueError, match="PipelineStage"):
        pipeline_stage(object(), fc)


def test_pipeline_actions_round_trip_and_merge(tmp_path):
    """The actions survive to_json / from_json; merging runs of one stage keeps them all;
    profiles of different models are gathered side by side."""
    a = Profile.from_dict({**FlopCounter(torch.nn.Linear(2, 2)).to_profile().to_dict(),
                           "pipeline": [{"stage": 0, "action": "F", "microbatch": 0,
                                         "start_ns": 5, "ns": 7, "sent": 64, "received": 0}]})
    assert a.run.pipeline == ((0, "F", 0, 5, 7, 64, 0),)
    a.to_json(tmp_path / "a.json")
    assert Profile.from_json(tmp_path / "a.json").run.pipeline == a.run.pipeline
    assert Profile.merge([a, a]).run.pipeline == a.run.pipeline * 2
    assert a.pipeline()[0].activations_sent == 64 and a.pipeline()[0].busy_s is None
    bad = {**a.to_dict(), "pipeline": [{**a.to_dict()["pipeline"][0], "action": "X"}]}
    with pytest.raises(ValueError, match="pipeline action"):
        Profile.from_dict(bad)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with FlopCounter(model) as fc:
        model(torch.ones(1, 2))
    g = gathered([a, fc])
    assert g.module_names() == ["", "stage0", "rank1", "rank1.0"]
    assert [r.module_names() for r in g.ranks] == [["", "stage0"], ["", "rank1", "rank1.0"]]


def test_alike_stages_are_gathered_side_by_side_and_ranks_of_one_stage_merged():
    """Stages with the same modules are still stages (their actions name them): side by side;
    runs without pipeline actions and the same tree are ranks of one model: merged."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with FlopCounter(model) as fc:
        model(torch.ones(1, 2))
    base = fc.to_profile().to_dict()

    def stage(i):
        return Profile.from_dict({**base, "pipeline": [
            {"stage": i, "action": "F", "microbatch": 0, "start_ns": 0, "ns": 0, "sent": 8,
             "received": 0}]})

    g = gathered([stage(0), stage(1)])
    assert g.module_names() == ["", "stage0", "stage0.0", "stage1", "stage1.0"]
    assert g.total.macs == 2 * fc.total.macs
    assert g.imbalance()["stage1.0"]["flops"] == (fc.total.flops,) * 3
    assert sorted(g.pipeline()) == [0, 1]
    same = gathered([fc, fc])
    assert same.module_names() == ["", "0"] and same.total.macs == 2 * fc.total.macs


# -- context parallel ---------------------------------------------------------------------
def test_ring_attention_counts_each_rank_its_share(world):
    """Ring attention over n ranks: each rank's query block (S/n rows) meets every key block,
    so it does S/n x S of the S x S scores, 2 products each (QK, PV): 2 B H (S/n) S d MACs
    per rank, no factor of n or n^2 wrong, and the ranks add up to the whole attention. It
    sends its K and V blocks on n - 1 times: 2 (n - 1) sends of B H (S/n) d floats; receives
    cost nothing (the sender's traffic). The result is the whole attention's rows."""
    from pipe_scenarios import CP_SHAPE

    n, ranks = world
    b, h, s, d = CP_SHAPE
    per_rank = 2 * b * h * (s // n) * s * d
    kv_block = b * h * (s // n) * d * FLOAT
    for rank in ranks:
        cp = rank["cp"]
        assert cp["right"]
        ring = cp["ring"]
        assert ring["macs"]["forward"] == per_rank  # no model: what runs is forward
        assert ring["comm"] == {
            "c10d.send|forward|": [2 * (n - 1), 2 * (n - 1) * kv_block],
            "c10d.recv_|forward|": [2 * (n - 1), 0]}
    assert sum(r["cp"]["ring"]["macs"]["forward"] for r in ranks) == 2 * b * h * s * s * d


# -- DTensor's sharding propagation is not this rank's work --------------------------------
def _spawn_cp(world_size: int, folder, slow: bool) -> list[dict]:
    import cp_scenarios

    return spawn_ranks(cp_scenarios.run_rank, world_size, folder, slow,
                       limit_s=400 if slow else 120)


def test_sharding_propagation_by_decomposition_is_not_counted(tmp_path):
    """hardswish has no sharding rule of its own: DTensor traces its decomposition on meta
    tensors, once per candidate placement, on a fake mesh it builds, under the counter's
    mode. None of that is this rank's work: a rank counts one hardswish of its own rows,
    exactly what the same call on the plain local tensor counts (and nothing else)."""
    from cp_scenarios import ROWS
    from cp_scenarios import D as WIDTH
    for rank in _spawn_cp(2, tmp_path, slow=False):
        run = rank["hardswish"]
        assert run["right"]
        assert run["dtensor"] == run["plain"] == {"aten.hardswish": run["plain"]["aten.hardswish"]}
        assert run["plain"]["aten.hardswish"][0] == 1
        # the same in a tensor-parallel MLP, Linear(D, 2D) colwise, Hardswish, Linear(2D, D)
        # rowwise: each rank's matmuls on its D of the 2D hidden features, ROWS rows; backward
        # the two weights' gradients and the hidden activation's (the input needs none)
        mlp = rank["mlp"]
        local = ROWS * WIDTH * (2 * WIDTH // 2)
        assert mlp["macs"]["forward"] == 2 * local and mlp["macs"]["backward"] == 3 * local
        assert mlp["ops"]["aten.hardswish"][0] == mlp["ops"]["aten.hardswish_backward"][0] == 1
        assert mlp["ops"]["_c10d_functional.all_reduce"][0] == 1
        assert not {"aten.add", "aten.clamp", "aten.empty", "aten.mul"} & set(mlp["ops"])


@pytest.mark.slow
def test_torch_context_parallel_counts_each_rank_its_attention(tmp_path):
    """torch's own context_parallel (all-gather rotation, CPU flash kernel; forward only:
    no sharding rule for the CPU flash backward in torch 2.13) on 2 ranks. Its sharding of
    the CPU flash kernel comes from tracing the kernel's decomposition (math attention:
    matmul, bmm, softmax) on meta tensors for every candidate placement, about 15.5 M MACs
    that were counted as the rank's before. Now each rank counts: one flash call of its S/n
    query rows against all S keys, B H (S/n) S (d + d_v) MACs (QK^T and PV), the two
    all-gathers of K and V (comm_bytes S (n - 1) / n of each gathered [B, H, S, d]) and the
    views around them; the logical figure is the whole attention's B H S S (d + d_v)."""
    from cp_scenarios import CP_SHAPE

    n = 2
    b, h, s, d = CP_SHAPE
    gathered = b * h * s * d * FLOAT
    for rank in _spawn_cp(n, tmp_path, slow=True):
        cp = rank["cp"]
        assert cp["right"] and cp["rows"] == s // n
        ops = cp["ops"]
        assert ops["aten._scaled_dot_product_flash_attention_for_cpu"][0] == 1
        assert ops["aten._scaled_dot_product_flash_attention_for_cpu"][2] == \
            b * h * (s // n) * s * (d + d)
        assert sum(v[2] for v in ops.values()) == b * h * (s // n) * s * (d + d)
        assert ops["_c10d_functional.all_gather_into_tensor"] == \
            [2, 0, 0, 2 * gathered * (n - 1) // n]
        assert sum(v[3] for v in ops.values()) == 2 * gathered * (n - 1) // n
        # what DTensor's strategy tracing ran: none of it here
        assert not {"aten.matmul", "aten.bmm", "aten._safe_softmax", "aten.empty",
                    "aten._scaled_dot_product_attention_math"} & set(ops)
        assert cp["logical_macs"] == b * h * s * s * (d + d)
