"""Communication per rank on real torch.distributed (gloo, CPU, spawned ranks on localhost):
all-to-all priced from its splits, rooted collectives by each rank's role, both byte figures
(bus and algorithm), ``Profile.logical`` with local tensors under tensor parallelism, and
gathers that survive a skipped round. ``tests/dist_comm.py`` runs the scenarios in every rank
and writes what it saw; the oracles are hand counts made here."""

import json
import socket
import time

import dist_comm
import pytest
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world_size: int, folder, parts: tuple) -> list[dict]:
    context = mp.start_processes(dist_comm.run_rank,
                                 args=(world_size, _free_port(), str(folder), parts),
                                 nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, f"{world_size} gloo ranks did not finish"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world_size)]


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def world(request, tmp_path_factory):
    n = request.param
    return n, _spawn(n, tmp_path_factory.mktemp(f"comm{n}"), ("rounds",))


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
