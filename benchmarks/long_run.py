"""A long run with a new sequence length every step: what stays in memory, and for how long.

A small MLP (two linears and a ReLU, width 16) runs ``--steps`` training steps (forward and
backward), batch 1 x ``s`` tokens with ``s`` new every step, under one ``FlopCounter(model)``
held open for the whole run, then closed and read. Python's memory (tracemalloc: the
package's records and caches are Python objects; tensors are torch's allocator's, not
traced) is printed against a baseline taken after one warm-up counter:

- during the run, every ``--every`` steps: the open counter keeps one op record per distinct
  call signature it counted (its result is made from them): it grows with the shapes met;
- after closing and reading the counter: the same records (the counter and the model's
  ledger share them);
- after deleting the counter, then the model: back to the baseline, but for the engine's
  process-wide signature cache, at most ``SIGNATURES_KEPT`` entries whatever the run met.

Target: after deleting the model, at most the cache's bound above the baseline (before it
was bounded: about 14 KB per step here, kept for the life of the process). Measured, 5,000
steps on a shared 2-core CPU (7 minutes under tracemalloc): during, 14.4 KB per step (about
10 signatures a step, 1.4 KB each); after deleting the model, 1.6 MB above the baseline (the
cache's 1,024 signatures), against 68 MB (50,012 signatures) before it was bounded.

    python benchmarks/long_run.py [--steps 5000] [--every 1000]
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

import torch
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.engine.counting.calls import SIGNATURES_KEPT
from dispatch_flops.engine.counting.records import engine_cache
from dispatch_flops.formulas import REGISTRY

WIDTH = 16


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))


def step(net: nn.Module, tokens: int) -> None:
    net(torch.randn(tokens, WIDTH)).sum().backward()


def traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def cached() -> int:
    """Signatures held by the engine's process-wide cache (every attention option)."""
    return sum(len(d) for d in engine_cache(REGISTRY).signatures.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--every", type=int, default=1000, help="steps between readings")
    args = parser.parse_args()

    tracemalloc.start()
    net = model()
    with FlopCounter(model()):  # imports, resolutions and hooks made once, before the baseline
        step(net, 1)
    net.zero_grad(set_to_none=True)
    base = traced()
    kib = 1024

    def show(label: str, extra: str = "") -> int:
        now = traced() - base
        print(f"{label:<34} {now / kib:>10.1f} KiB above baseline   cache "
              f"{cached():>5} signatures{extra}")
        return now

    print(f"{args.steps} steps, a new sequence length each; the cache keeps at most "
          f"{SIGNATURES_KEPT} signatures")
    show("baseline")
    fc = FlopCounter(net)
    with fc:
        for i in range(args.steps):
            step(net, 2 + i)  # 1 is the warm-up's length
            if (i + 1) % args.every == 0:
                during = traced() - base
                show(f"during, after {i + 1} steps",
                     f"   ({during / (i + 1):.0f} B per step)")
    flops = fc.total.flops
    show("after closing and reading it")
    del fc
    show("after deleting the counter")
    del net
    after = show("after deleting the model")
    # what the cache may hold: its entries' share of what one held cost before the bound
    print(f"counted {flops:,} flops; after deleting the model: {after / kib:.1f} KiB above "
          f"baseline, {after / max(cached(), 1):.0f} B per cached signature")


if __name__ == "__main__":
    main()
