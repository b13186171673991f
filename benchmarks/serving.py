"""Serving's cost model: what one iteration's evaluation costs, and the one-time counting.

Prints, measured in one run on this machine: the time to fit a small Llama's cost model on
meta (counting), then the time to evaluate one iteration of 256 requests (mixed decode steps
and prefill chunks) through ``CostModel.cost`` (a list of requests) and ``cost_arrays``
(numpy arrays), the median of repeats; with ``--big``, the fit of a Llama-2-70B-shaped config
on meta (80 layers, hidden 8192, GQA 64/8), the one-time cost.

    python benchmarks/serving.py [--big] [--requests 256]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import torch
import transformers

from dispatch_flops.workflows.serving import CostModel, Request


def _fit(config) -> tuple[CostModel, float]:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    start = time.perf_counter()
    cost = CostModel.from_model(model)
    return cost, time.perf_counter() - start


def _per_call(fn, repeat: int = 30, inner: int = 20) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="also fit a 70B-shaped config")
    parser.add_argument("--requests", type=int, default=256)
    args = parser.parse_args()
    small = transformers.LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688,
                                     num_hidden_layers=4, num_attention_heads=8,
                                     num_key_value_heads=2, max_position_embeddings=4096)
    cost, fit_s = _fit(small)
    print(f"fit, small Llama on meta: {fit_s:.2f} s ({cost.probes} forwards counted)")
    rng = random.Random(0)
    batch = [Request(1, rng.randint(0, 4000), 1) if rng.random() < 0.9 else
             Request(rng.randint(1, 512), rng.randint(0, 2000), 1)
             for _ in range(args.requests)]
    n, p, lg = (np.array(column) for column in zip(*batch))
    assert cost.cost(batch) == cost.cost_arrays(n, p, lg)
    listed = _per_call(lambda: cost.cost(batch))
    arrays = _per_call(lambda: cost.cost_arrays(n, p, lg))
    print(f"one iteration of {args.requests} requests: cost(list) {listed * 1e6:.1f} us, "
          f"cost_arrays {arrays * 1e6:.1f} us (target 20 us)")
    if args.big:
        big = transformers.LlamaConfig(vocab_size=32000, hidden_size=8192,
                                       intermediate_size=28672, num_hidden_layers=80,
                                       num_attention_heads=64, num_key_value_heads=8,
                                       max_position_embeddings=4096)
        cost, fit_s = _fit(big)
        print(f"fit, Llama-2-70B shape on meta: {fit_s:.1f} s ({cost.probes} forwards)")


if __name__ == "__main__":
    main()
