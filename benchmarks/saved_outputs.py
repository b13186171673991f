"""Every count, table and JSON of a set of runs, written to files: a refactor's byte-identity check.

A change that should not move a figure (a file moved, a name changed, a helper shared) is
checked by running this before and after it and comparing the two folders::

    python benchmarks/saved_outputs.py /tmp/before      # on the old commit
    python benchmarks/saved_outputs.py /tmp/after       # on the new one
    diff -r /tmp/before /tmp/after

Each scenario writes the counter's table, its Profile's JSON (times zeroed: no scenario is
timed) and the compatibility shims' printouts. The runs are deterministic: seeded models, no
clocks. They cover the engine's paths: eager forward, backward and optimizer steps (replayed),
checkpointing, masks (SDPA with a boolean and a float mask, causal), FlexAttention, compiled
graphs (inductor), a generator-owned block, nested counters, meta tensors, a transformers
model built from config, and the torch, DeepSpeed, fvcore, thop, ptflops and calflops shims.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re

import torch
import torch.nn.functional as F
from torch import nn

import dispatch_flops as df
from dispatch_flops.models import GPT, GPTConfig, Llama, LlamaConfig

TINY = GPTConfig(n_layer=2, d_model=32, n_head=4, vocab_size=64, max_seq_len=16)


def _gpt():
    torch.manual_seed(0)
    return GPT(TINY)


def _ids(batch=2, tokens=8):
    seeded = torch.Generator().manual_seed(1)
    return torch.randint(0, TINY.vocab_size, (batch, tokens), generator=seeded)


TIMED = ("ns", "time", "span", "idle", "seconds", "latency", "flops_per_s", "achieved", "mfu", "_s")


def _untimed(data):
    """``data`` with every figure a clock gave replaced by a mark (a timed scenario's)."""
    if isinstance(data, dict):
        return {k: ("<timed>" if any(t in str(k).lower() for t in TIMED)
                    and not isinstance(data[k], (dict, list)) else _untimed(data[k]))
                for k in data}
    if isinstance(data, list):
        return [_untimed(v) for v in data]
    return data


def _save(out, name, fc_or_profile, timed=False):
    profile = fc_or_profile.to_profile()
    data = profile.to_dict()
    if timed:
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(_untimed(data), f, indent=1, sort_keys=True, default=str)
        return
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)
    with open(os.path.join(out, name + ".txt"), "w") as f:
        f.write(profile.table(depth=99, width=200, ops=3) + "\n")
        f.write(str(profile.total) + "\n")
        for path, stats in sorted(profile.by_module().items()):
            f.write(f"{path!r}: {stats}\n")
        f.write(repr(sorted(profile.by_operator().items(), key=str)) + "\n")


def train_steps(out):
    model = _gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(3):
        with df.FlopCounter(model) as fc:
            loss = model(_ids()).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        _save(out, f"train_step_{i}", fc)


def llama_forward(out):
    torch.manual_seed(0)
    model = Llama(LlamaConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=2, ffn=64, vocab_size=64))
    with df.FlopCounter(model) as fc:
        model(_ids())
    _save(out, "llama_forward", fc)


def checkpointed(out):
    from torch.utils.checkpoint import checkpoint

    model = _gpt()

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    wrapped = Wrapped()
    with df.FlopCounter(wrapped, saved_activations=True) as fc:
        wrapped(_ids()).sum().backward()
    _save(out, "checkpointed", fc)


def masks(out):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 16, requires_grad=True) for _ in range(3))
    keep = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(2)) > 0.3
    bias = torch.zeros(2, 1, 8, 8).masked_fill(~keep, float("-inf"))
    with df.FlopCounter() as fc:
        F.scaled_dot_product_attention(q, k, v, attn_mask=keep).sum().backward()
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum().backward()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    _save(out, "masks", fc)


def flex(out):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))

    def causal(b, h, qi, ki):
        return qi >= ki

    block = create_block_mask(causal, 1, 2, 128, 128, device="cpu")
    with df.FlopCounter() as fc:
        flex_attention(q, k, v, block_mask=block)
    _save(out, "flex", fc)


def timed(out):
    model = _gpt()
    for timing in (True, "trace"):
        kwargs = {"trace": True} if timing == "trace" else {"timing": True}
        with df.FlopCounter(model, **kwargs) as fc:
            model(_ids()).sum().backward()
        _save(out, f"timed_{timing}", fc, timed=True)


def compiled_flex(out):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return
    import torch._dynamo

    torch._dynamo.reset()
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))

    def causal(b, h, qi, ki):
        return qi >= ki

    block = create_block_mask(causal, 1, 2, 128, 128, device="cpu")
    attend = torch.compile(flex_attention)
    attend(q, k, v, block_mask=block)
    with df.FlopCounter() as fc:
        attend(q, k, v, block_mask=block)
    _save(out, "compiled_flex", fc)
    torch._dynamo.reset()


def dtensor(out):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        a = distribute_tensor(torch.randn(16, 32), mesh, [Shard(0)])
        w = distribute_tensor(torch.randn(32, 8), mesh, [Shard(0)])
        with df.FlopCounter() as fc:
            (a @ w).sum()
        _save(out, "dtensor", fc)
    finally:
        dist.destroy_process_group()


def compiled(out):
    import torch._dynamo

    torch._dynamo.reset()
    model = _gpt()
    step = torch.compile(model)
    step(_ids())
    with df.FlopCounter(model) as fc:
        step(_ids()).sum().backward()
    _save(out, "compiled", fc)
    torch._dynamo.reset()


def generator_block(out):
    model = _gpt()

    def steps():
        with df.FlopCounter(model) as fc:
            yield model(_ids())
            yield model(_ids(1, 4))
        _save(out, "generator_block", fc)

    for _ in steps():
        pass


def nested(out):
    model = _gpt()
    with df.FlopCounter(model) as outer:
        model(_ids())
        with df.FlopCounter(model.blocks[0]) as inner:
            model(_ids())
    _save(out, "nested_outer", outer)
    _save(out, "nested_inner", inner)


def meta(out):
    with torch.device("meta"):
        model = _gpt()
    ids = torch.zeros(2, 8, dtype=torch.long, device="meta")
    with df.FlopCounter(model) as fc:
        model(ids).sum().backward()
    _save(out, "meta", fc)


def transformers_gpt2(out):
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        return
    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt2", n_layer=2, n_embd=64, n_head=4, vocab_size=128)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(3))
    with df.FlopCounter(model) as fc:
        model(ids, labels=ids).loss.backward()
    _save(out, "transformers_gpt2", fc)


def shims(out):
    model = _gpt()
    ids = _ids()
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        mode = df.FlopCounterMode(display=True, depth=3)
        with mode:
            model(ids).sum().backward()
        print(mode.get_total_flops(), sorted((k, sorted(map(str, v.items())))
                                             for k, v in mode.get_flop_counts().items()))
        flops, macs, params = df.get_model_profile(model, args=[ids], print_profile=True,
                                                   as_string=False)
        print(flops, macs, params)
        from dispatch_flops.compat import calflops, fvcore, ptflops, thop
        counted = fvcore.FlopCountAnalysis(model, ids)
        print(counted.total(), sorted(counted.by_module().items()))
        print(thop.profile(model, inputs=(ids,), verbose=False))
        print(ptflops.get_model_complexity_info(
            model, (8,), input_constructor=lambda _: {"idx": ids}, as_strings=False,
            print_per_layer_stat=True))
        print(calflops.calculate_flops(model, args=[ids], print_results=False,
                                       output_as_string=False))
    # DeepSpeed's printout times the forward: its clock readings (and rates and shares of them)
    # become marks
    printed = re.sub(r"[\d.]+ ?(ms|us|s|[KMGTP]?FLOPS)\b", "<timed>", text.getvalue())
    printed = re.sub(r"[\d.]+% latency|'latency%': '[\d.]+%'", "<timed>", printed)
    with open(os.path.join(out, "shims.txt"), "w") as f:
        f.write(printed)


SCENARIOS = [train_steps, llama_forward, checkpointed, masks, flex, compiled, compiled_flex, timed,
             generator_block, nested, meta, dtensor, transformers_gpt2, shims]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the folder the outputs are written to (made if missing)")
    out = parser.parse_args().out
    os.makedirs(out, exist_ok=True)
    for scenario in SCENARIOS:
        scenario(out)
        print(scenario.__name__, "written")


if __name__ == "__main__":
    main()
