"""Run in spawned processes by test_deepspeed: one rank of a real gloo group profiles a small
model, once with model-parallel size 1 and once with 2."""

from datetime import timedelta

import torch.distributed as dist
from torch import nn

from dispatch_flops import get_model_profile


def profile_rank(rank: int, world_size: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=30))
    try:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        for mp_size in (1, 2):
            get_model_profile(model, input_shape=(4, 8), mp_size=mp_size, detailed=False,
                              output_file=f"{out_dir}/rank{rank}_mp{mp_size}.txt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
