"""Added cost per aten op: a do-nothing TorchDispatchMode vs torch's FlopCounterMode vs ours.

One model (the tiny GPT demo, forward + backward: many small ops, so per-op overhead shows),
run eagerly and under each mode, interleaved round by round in this one process. Each round
gives every variant's added time against the eager run of the same round (paired, so slow
drifts of this shared machine cancel); the figures are medians over rounds.
Prints the added microseconds per aten op and the ratios to the do-nothing mode's cost, also
with timing on (CPU timers around every op and module call). torch wraps every dispatch
mode's ``__torch_dispatch__`` in a torch.compile guard that costs two Python frames per op;
ours gives that guarantee at C level instead, so the ratios are also printed against a
do-nothing mode that does the same ("unwrapped"): that ratio is the counting's own cost.
Target: ours <= 1.5x the do-nothing mode, well under FlopCounterMode.

    python benchmarks/overhead.py [--rounds 15] [--iters 5]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from dispatch_flops import FlopCounter
from dispatch_flops._skip import SKIP_FRAMES as _SKIP_FRAMES
from dispatch_flops.models import GPT, GPTConfig


class DoNothing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class DoNothingUnwrapped(TorchDispatchMode):
    """The do-nothing mode without torch's per-op torch.compile guard (two Python frames
    around every ``__torch_dispatch__``), the guard given at C level instead, as our
    counting mode does: what is left of our cost over this one is the counting itself."""

    @classmethod
    def _should_skip_dynamo(cls):
        return _SKIP_FRAMES is None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


if _SKIP_FRAMES is not None:
    _SKIP_FRAMES(DoNothingUnwrapped.__torch_dispatch__.__code__)


def workload():
    """(config, model, one train step, aten ops per step): the tiny GPT, forward + backward,
    on one thread."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = GPTConfig(n_layer=4, d_model=64, n_head=4, vocab_size=256, max_seq_len=32)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))

    def step():
        model(idx).sum().backward()

    with FlopCounter(model) as probe:
        step()
    return cfg, model, step, probe.total.calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    cfg, model, step, ops = workload()

    variants = {
        "eager": contextlib.nullcontext,
        "do-nothing mode": DoNothing,
        "  (unwrapped)": DoNothingUnwrapped,
        "FlopCounterMode": lambda: FlopCounterMode(display=False),
        "dispatch_flops": lambda: FlopCounter(model),
        "  (no model)": lambda: FlopCounter(),  # the same without module attribution
        "  (timing on)": lambda: FlopCounter(model, timing=True),  # + a timer per op/module
    }
    # steady state: one counter open across all of a round's steps (setup paid once)
    steady = {"do-nothing mode": DoNothing, "  (unwrapped)": DoNothingUnwrapped,
              "dispatch_flops": lambda: FlopCounter(model)}
    steady_times = {name: [] for name in ("eager", *steady)}
    times = {name: [] for name in variants}
    for _ in range(3):  # warm-up
        for make in variants.values():
            with make():
                step()
    names = list(variants)
    for round_ in range(args.rounds):
        # rotate the order each round and collect garbage before each block, so no variant
        # always pays for the garbage the one before it left (FlopCounterMode leaves a lot)
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            make = variants[name]
            gc.collect()
            start = time.perf_counter()
            for _ in range(args.iters):
                with make():
                    step()
            times[name].append((time.perf_counter() - start) / args.iters)
        for name, make in (("eager", contextlib.nullcontext), *steady.items()):
            gc.collect()
            start = time.perf_counter()
            with make():
                for _ in range(args.iters):
                    step()
            steady_times[name].append((time.perf_counter() - start) / args.iters)
    median = {name: statistics.median(t) for name, t in times.items()}
    added = {
        name: statistics.median(t - e for t, e in zip(times[name], times["eager"])) / ops * 1e6
        for name in variants
    }
    print(f"model: GPT {cfg.n_layer}x{cfg.d_model}, batch 2 x 16 tokens, forward + backward, "
          f"{ops} aten ops per step, {args.rounds} rounds x {args.iters} steps, 1 thread")
    print(f"eager step: {median['eager'] * 1e3:.2f} ms")
    for name in ("do-nothing mode", "  (unwrapped)", "FlopCounterMode", "dispatch_flops",
                 "  (no model)", "  (timing on)"):
        print(f"{name:>16}: step {median[name] * 1e3:7.2f} ms, added {added[name]:6.2f} us/op, "
              f"{added[name] / added['do-nothing mode']:.2f}x the do-nothing mode, "
              f"{added[name] / added['  (unwrapped)']:.2f}x unwrapped")
    steady_added = {
        name: statistics.median(t - e for t, e in zip(steady_times[name], steady_times["eager"]))
        / ops * 1e6
        for name in steady
    }
    print(f"one counter across {args.iters} steps: do-nothing added "
          f"{steady_added['do-nothing mode']:.2f} us/op (unwrapped "
          f"{steady_added['  (unwrapped)']:.2f}), dispatch_flops added "
          f"{steady_added['dispatch_flops']:.2f} us/op, "
          f"{steady_added['dispatch_flops'] / steady_added['do-nothing mode']:.2f}x the "
          f"do-nothing mode, "
          f"{steady_added['dispatch_flops'] / steady_added['  (unwrapped)']:.2f}x unwrapped")
    ratio = added["dispatch_flops"] / added["do-nothing mode"]
    print(f"target ours <= 1.5x do-nothing (fresh counter per step): "
          f"{'met' if ratio <= 1.5 else 'NOT met'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
