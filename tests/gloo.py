"""Spawning real gloo ranks for the distributed tests: each rank runs ``run_rank(rank,
world_size, port, folder, *extra)`` and writes ``rank<r>.json`` into ``folder``; the whole
group is bounded in time (its processes are terminated past the limit)."""

import json
import socket
import time

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(run_rank, world_size: int, folder, *extra, limit_s: float = 150) -> list[dict]:
    """Each rank's JSON, in rank order, once every rank of ``run_rank`` has finished."""
    context = mp.start_processes(run_rank, args=(world_size, free_port(), str(folder), *extra),
                                 nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + limit_s
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, f"{world_size} gloo ranks did not finish"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world_size)]
