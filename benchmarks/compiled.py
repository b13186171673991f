"""A compiled model under the counter, and after it (issue 15; pytorch#190286).

A pointwise-heavy 4-block MLP (inductor fuses its activations and residuals), forward +
backward on CPU, one thread: eager, compiled, compiled under FlopCounter, and compiled again
after counted steps, interleaved round by round (medians). Before this, one counted step left
a compiled model eager for the rest of the process. Targets: compiled under the counter
<= 1.05x the compiled step; after counting, the compiled step unchanged.

    python benchmarks/compiled.py [--rounds 15] [--iters 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch._dynamo.utils import counters

from dispatch_flops import FlopCounter


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.up(self.norm(x))
        h = torch.nn.functional.gelu(h) * torch.sigmoid(h) + h.tanh()  # pointwise-heavy
        return x + self.down(h) * 0.5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(128) for _ in range(4)])
    x = torch.randn(64, 128)
    compiled = torch.compile(model)

    def step(m):
        m(x).sum().backward()

    def timed(fn) -> float:
        start = time.perf_counter()
        for _ in range(args.iters):
            fn()
        return (time.perf_counter() - start) / args.iters * 1e3

    def counted():
        with FlopCounter(compiled):
            step(compiled)

    for _ in range(3):  # compile, warm up, and count once before the "after" runs
        step(model), step(compiled), counted()
    frames = dict(counters["frames"])
    eager, fast, under, after = [], [], [], []
    for _ in range(args.rounds):
        eager.append(timed(lambda: step(model)))
        fast.append(timed(lambda: step(compiled)))
        under.append(timed(counted))
        after.append(timed(lambda: step(compiled)))
    e, c, u, a = map(statistics.median, (eager, fast, under, after))
    with FlopCounter(compiled) as fc:
        step(compiled)
    with FlopCounter(model) as ref:
        step(model)
    print(f"4-block MLP d=128, batch 64, fwd+bwd, 1 thread, {args.rounds} rounds x "
          f"{args.iters} steps (medians)")
    print(f"eager step:                 {e:6.3f} ms")
    print(f"compiled step:              {c:6.3f} ms")
    print(f"compiled under FlopCounter: {u:6.3f} ms  ({u / c:.3f}x compiled; target <= 1.05x)")
    print(f"compiled after counting:    {a:6.3f} ms  ({a / c:.3f}x compiled; target 1.00x)")
    print(f"compiles after the first counted step: "
          f"{dict(counters['frames']) == frames and 'none' or dict(counters['frames'])}")
    print(f"MACs compiled {fc.total.macs} vs eager {ref.total.macs}; "
          f"flops {fc.total.flops} vs {ref.total.flops}")


if __name__ == "__main__":
    main()
