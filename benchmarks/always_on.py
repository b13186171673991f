"""What it costs to count, and read, every training step: a logger's view.

Two tiny transformers models built from config (GPT-2 and Llama: 4 layers, width 64, batch
2 x 16 tokens), one training step each (forward + backward + AdamW), on one thread. Variants,
interleaved round by round in this one process:

- eager: the step alone;
- do-nothing mode: the step under a ``TorchDispatchMode`` that only runs each op;
- counted: the step under a fresh ``FlopCounter(model)`` each step;
- counted + read: the same, then ``fc.total`` and ``fc.by_module()`` read after each step,
  as a logger would.

Timed in paired rounds (``_paired.py``): each variant's added time against the eager step of
the same round, and its ratio to the do-nothing mode's added time within that round; medians
over rounds, on this thread's CPU time (other processes on a shared machine disturb it less)
and on wall time.
Target: counted + read adds <= 1.2x what the do-nothing mode adds.

``--model bert`` (issue 42's forward figure): transformers' BertModel from config at base size
(12 layers, width 768; no weights downloaded) on a short sequence (batch 1 x 32 tokens), its
forward under ``no_grad``, a fresh counter per forward (and its total read), against the
do-nothing mode, paired as above. Target: <= 1.2x what the do-nothing mode adds. Also the
do-nothing mode with two empty global module hooks (a forward pre-hook and an always-called
forward hook, as a counter registers): what torch's own module-call path with hooks costs,
before any counting.

    python benchmarks/always_on.py [--rounds 20] [--iters 5] [--model bert]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _paired import Rounds, warmed_ops  # noqa: E402

from dispatch_flops import FlopCounter  # noqa: E402

TARGET = 1.2  # issue 42: a fresh counter per training step, read each step
FORWARD_TARGET = 1.2  # issue 42: BERT-base forward, a fresh counter per forward


class DoNothing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def models():
    """{name: model} of the two tiny transformers models, built from config (no weights)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=256,
                                      n_positions=32, bos_token_id=0, eos_token_id=0))
    llama = LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                                         num_key_value_heads=4, intermediate_size=128,
                                         vocab_size=256, max_position_embeddings=32))
    return {"GPT-2": gpt2, "Llama": llama}


def training_step(model):
    """One forward + backward + AdamW step on batch 2 x 16, as a closure."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 256, (2, 16))

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def run(name: str, model, rounds: int, iters: int) -> float:
    model.train()
    step = training_step(model)
    sink = []

    def counted():
        with FlopCounter(model):
            step()

    def counted_read():
        with FlopCounter(model) as fc:
            step()
        sink.append((fc.total.flops, len(fc.by_module())))
        sink.clear()

    def under(mode):
        def go():
            with mode():
                step()
        return go

    variants = {"eager": step, "do-nothing mode": under(DoNothing), "counted": counted,
                "counted + read": counted_read}
    return timed(model, step, variants, rounds, iters,
                 f"{name}: {{ops}} aten ops per step, eager step {{eager_ms:.2f}} ms CPU "
                 f"({rounds} rounds x {iters} steps)", "ms/step")


def timed(model, step, variants: dict, rounds: int, iters: int, title: str, unit: str) -> float:
    """Warm each variant up (first-call set-up, optimizer state), count ``step``'s aten ops,
    time the variants in paired rounds and print each one's added time against the
    do-nothing mode's (``title``: a format string of ``ops`` and ``eager_ms``); the
    counted + read ratio."""
    ops = warmed_ops(model, step, variants)
    paired = Rounds(variants, rounds, iters)
    print(title.format(ops=ops, eager_ms=paired.median("eager") * 1e3))
    shown = [v for v in variants if v != "eager"]
    width = max(map(len, shown))
    for v in shown:
        cpu = statistics.median(paired.added(v))
        print(f"  {v:>{width}}: added {cpu * 1e3:6.2f} {unit} ({cpu / ops * 1e6:5.2f} us/op), "
              f"{paired.ratio(v, 'do-nothing mode'):.2f}x the do-nothing mode "
              f"(wall: {paired.ratio(v, 'do-nothing mode', 'wall'):.2f}x)")
    return paired.ratio("counted + read", "do-nothing mode")


def bert_forward(rounds: int, iters: int, tokens: int) -> float:
    """BERT-base's forward under ``no_grad``, a fresh counter per forward: its ratio to the
    do-nothing mode's added time."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval()  # base size: 12 layers, width 768, 12 heads
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    sink = []

    def forward():
        with torch.no_grad():
            model(input_ids=ids)

    def counted_read():
        with FlopCounter(model) as fc:
            forward()
        sink.append(fc.total.flops)
        sink.clear()

    def do_nothing():
        with DoNothing():
            forward()

    def hooked():  # what torch's module-call path costs with global hooks, as a counter's
        pre = register_module_forward_pre_hook(lambda module, args: None)
        post = register_module_forward_hook(lambda module, args, out: None, always_call=True)
        try:
            with DoNothing():
                forward()
        finally:
            pre.remove()
            post.remove()

    variants = {"eager": forward, "do-nothing mode": do_nothing,
                "do-nothing + hooks": hooked, "counted + read": counted_read}
    return timed(model, forward, variants, rounds, iters,
                 f"BERT-base forward, no_grad, 1 x {tokens} tokens: {{ops}} aten ops, eager "
                 f"{{eager_ms:.2f}} ms CPU ({rounds} rounds x {iters} forwards)", "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--model", choices=("gpt2+llama", "bert"), default="gpt2+llama",
                        help="the training steps (default), or BERT-base's forward")
    parser.add_argument("--tokens", type=int, default=32, help="sequence length (bert)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.model == "bert":
        ratio = bert_forward(args.rounds, args.iters, args.tokens)
        verdict = "met" if ratio <= FORWARD_TARGET else "NOT met"
        print(f"target: counted + read <= {FORWARD_TARGET}x the do-nothing mode (CPU time): "
              f"{verdict} ({ratio:.2f}x)")
        return
    worst = 0.0
    for name, model in models().items():
        worst = max(worst, run(name, model, args.rounds, args.iters))
    verdict = "met" if worst <= TARGET else "NOT met"
    print(f"target: counted + read <= {TARGET}x the do-nothing mode (CPU time): {verdict} "
          f"(worst {worst:.2f}x)")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
