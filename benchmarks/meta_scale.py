"""A 70B-parameter model counted on a laptop: Llama-2-70B's shapes on the meta device.

Builds ``Llama(LLAMA2_70B)`` under ``torch.device("meta")`` (80 layers, d 8192, 64 query
heads, 8 key/value heads, FFN 28672, vocab 32000: no memory behind the parameters), runs
forward + backward at batch 1 x 4096 tokens under torch's FlopCounterMode and under
dispatch_flops' FlopCounter, interleaved, and prints:

- the median time of each and the ratio (target: ours <= 0.5x FlopCounterMode's);
- the process's peak RSS (target <= 0.5 GB), torch's import included;
- 2 x our MACs against the analytic count (target: equal), where, with T = b*s tokens,
  d_kv = d * kv_heads / heads, matmul MACs per layer = T*d*(2d + 2d_kv) + 3*T*d*ffn,
  attention MACs per layer = 2*b*s^2*d (dense: q.k^T and p.v over all s*s pairs),
  lm_head = T*d*vocab, and
      forward  = L * (matmul + attention) + lm_head
      backward = 2 * (L * matmul + lm_head) + r * L * attention
  with r = 2 when attention runs as its math decomposition (bmm backward: two products per
  product) and r = 2.5 when a fused SDPA kernel runs (it recomputes q.k^T): the script reads
  which one ran from the counts.

    python benchmarks/meta_scale.py [--rounds 3] [--seq 4096]
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from dispatch_flops import FlopCounter, human
from dispatch_flops.models import LLAMA2_70B, Llama

FUSED_ATTENTION = ("aten._scaled_dot_product_flash_attention_for_cpu",
                   "aten._scaled_dot_product_flash_attention",
                   "aten._scaled_dot_product_efficient_attention",
                   "aten._scaled_dot_product_cudnn_attention")


def analytic_macs(cfg, b: int, s: int, fused_attention: bool) -> int:
    t, d = b * s, cfg.d_model
    d_kv = d * cfg.n_kv_head // cfg.n_head
    matmul = t * d * (2 * d + 2 * d_kv) + 3 * t * d * cfg.ffn
    attention = 2 * b * s * s * d
    lm_head = t * d * cfg.vocab_size
    forward = cfg.n_layer * (matmul + attention) + lm_head
    r = 2.5 if fused_attention else 2
    backward = 2 * (cfg.n_layer * matmul + lm_head) + r * cfg.n_layer * attention
    return int(forward + backward)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq", type=int, default=4096)
    args = parser.parse_args()
    cfg, b, s = LLAMA2_70B, 1, args.seq
    start = time.perf_counter()
    with torch.device("meta"):
        model = Llama(cfg)
    idx = torch.zeros(b, s, dtype=torch.long, device="meta")
    params = sum(p.numel() for p in model.parameters())
    print(f"Llama-2-70B shapes on meta: {human(params)} parameters, built in "
          f"{time.perf_counter() - start:.2f} s; forward + backward at {b} x {s} tokens")

    def step():
        model(idx).sum().backward()
        model.zero_grad(set_to_none=True)

    times = {"FlopCounterMode": [], "dispatch_flops": []}
    ours = None
    for round_ in range(args.rounds):
        order = ["FlopCounterMode", "dispatch_flops"][:: 1 if round_ % 2 == 0 else -1]
        for name in order:
            gc.collect()
            begin = time.perf_counter()
            if name == "FlopCounterMode":
                with FlopCounterMode(display=False) as theirs:
                    step()
            else:
                with FlopCounter(model) as ours:
                    step()
            times[name].append(time.perf_counter() - begin)
    theirs_s, ours_s = (statistics.median(times[k]) for k in ("FlopCounterMode", "dispatch_flops"))
    ratio = ours_s / theirs_s
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # KiB on Linux
    fused = any(op in ours.by_operator() for op in FUSED_ATTENTION)
    expected = analytic_macs(cfg, b, s, fused)
    got = ours.total.macs
    print(f"ops counted: {ours.total.calls}, unsupported: {ours.unsupported_ops() or 'none'}")
    print(f"FlopCounterMode: {theirs_s:.3f} s   dispatch_flops: {ours_s:.3f} s   "
          f"ratio {ratio:.2f} (target <= 0.5): {'met' if ratio <= 0.5 else 'NOT met'}")
    print(f"peak RSS: {rss_gb:.3f} GB (target <= 0.5): {'met' if rss_gb <= 0.5 else 'NOT met'}")
    print(f"2 x MACs: {2 * got:,} ({human(2 * got, 'FLOP')}); analytic "
          f"({'fused' if fused else 'math'} attention): {2 * expected:,}: "
          f"{'equal' if got == expected else 'DIFFERENT'}")
    print(f"FlopCounterMode's own total: {theirs.get_total_flops():,} flops")
    return 0 if got == expected and ratio <= 0.5 and rss_gb <= 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
