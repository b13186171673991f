"""``python -m dispatch_flops``: profile the built-in GPT demo, forward and backward."""

from __future__ import annotations

import argparse
import time

import torch

from . import FlopCounter
from .models import GPT, GPTConfig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="dispatch-flops",
        description="Profile the built-in GPT demo model (forward + backward) on CPU.",
    )
    parser.add_argument("--depth", type=int, default=2, help="module tree depth (default 2)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens (default 128)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    cfg = GPTConfig()
    if not 1 <= args.seq_len <= cfg.max_seq_len:
        parser.error(f"--seq-len must be between 1 and {cfg.max_seq_len}")
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (1, args.seq_len))
    start = time.perf_counter()
    with FlopCounter(model) as fc:
        logits = model(idx)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
    elapsed = time.perf_counter() - start
    print(f"GPT demo: {cfg.n_layer} layers, d_model {cfg.d_model}, batch 1 x {args.seq_len} "
          f"tokens, forward + backward ({elapsed:.2f} s under the counter)\n")
    print(fc.table(depth=args.depth))


if __name__ == "__main__":
    main()
