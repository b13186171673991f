"""Small helpers for the tests: counting with ours and with torch's own counter."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from dispatch_flops import FlopCounter
from dispatch_flops.models import GPT, GPTConfig
from dispatch_flops.results.stats import Stats


def ours(fn, *args, model=None, **kwargs):
    with FlopCounter(model, **kwargs) as fc:
        fn(*args)
    return fc


def torch_flops(fn, *args):
    with FlopCounterMode(display=False) as mode:
        fn(*args)
    return mode.get_total_flops()


def macs_of(fc, *operators):
    """MACs of the given operators only (all when none given)."""
    by_op = fc.by_operator()
    return sum(s.macs for op, s in by_op.items() if not operators or op in operators)


TINY = GPTConfig(n_layer=2, d_model=32, n_head=4, vocab_size=64, max_seq_len=16)


def tiny_gpt(config: GPTConfig = TINY):
    """The built-in GPT at TINY's shapes (or ``config``'s), seeded: every test's tiny GPT."""
    torch.manual_seed(0)
    return GPT(config)


def tiny_ids(batch: int = 2, tokens: int = 8, config: GPTConfig = TINY):
    """Token ids for the tiny GPT."""
    return torch.randint(0, config.vocab_size, (batch, tokens))


def step(model, idx):
    """One forward + backward."""
    model(idx).sum().backward()


def attention_stats(fc) -> Stats:
    """The counts of the attention ops alone (SDPA kernels, flex operators)."""
    total = Stats()
    for name, stats in fc.by_operator().items():
        if "attention" in name:
            total = total + stats
    return total
