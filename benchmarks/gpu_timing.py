"""GPU timing checks: CUDA-event latency per op against end-to-end time, overhead, peak.

On a GPU, for a GPT-2-small-shaped model in bf16 (batch and length large enough that the GPU,
not Python, sets the pace), prints three checks, each with its figures:

1. the sum of per-op event times is within 10 % of one event pair around the whole forward;
2. a timed forward (FlopCounter(timing=True)) is within 10 % of an untimed eager forward;
3. a large bf16 matmul's achieved FLOPS is near the device's peak (built-in DeviceSpec).

Without CUDA it says so and exits 0.

    python benchmarks/gpu_timing.py [--batch 8] [--seq 1024] [--repeat 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from dispatch_flops import FlopCounter, device_spec, human, profile
from dispatch_flops._format import duration
from dispatch_flops.models import GPT, GPT2_SMALL


def event_time(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` between two CUDA events."""
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def check(label: str, ok: bool, detail: str) -> bool:
    print(f"[{'PASS' if ok else 'FAIL'}] {label}: {detail}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available: GPU timing checks skipped.")
        return 0
    spec = device_spec()
    print(f"device: {torch.cuda.get_device_name()} -> built-in spec: "
          f"{spec.name if spec else 'none'}")
    torch.manual_seed(0)
    model = GPT(GPT2_SMALL).to("cuda", torch.bfloat16).eval()
    idx = torch.randint(0, GPT2_SMALL.vocab_size, (args.batch, args.seq), device="cuda")

    def forward():
        with torch.no_grad():
            model(idx)

    for _ in range(3):
        forward()
    torch.cuda.synchronize()
    ok = True

    fc = profile(model, (idx,), warmup=2, repeat=args.repeat, fn=lambda i: forward())
    op_sum, block = fc.total.latency_s, fc.wall_s
    ok &= check("sum of per-op event times vs one event pair around the forward",
                abs(op_sum - block) <= 0.10 * block,
                f"ops {duration(op_sum)}, block {duration(block)}, "
                f"ratio {op_sum / block:.3f}")

    eager = event_time(forward, args.repeat)
    timed = []
    for _ in range(args.repeat):
        with FlopCounter(model, timing=True) as run:
            forward()
        timed.append(run.wall_s)
    timed_s = statistics.median(timed)
    ok &= check("timed forward vs untimed eager forward", timed_s <= 1.10 * eager,
                f"timed {duration(timed_s)}, eager {duration(eager)}, "
                f"ratio {timed_s / eager:.3f}")
    print(f"model: {human(fc.total.flops, 'FLOP')} per forward, "
          f"{human(fc.total.flops / eager, 'FLOPS')} achieved eager")
    if spec is not None:
        print(f"MFU of the profiled forward (bf16 peak {human(spec.peak_flops(torch.bfloat16), 'FLOPS')}): "
              f"{fc.mfu(spec, torch.bfloat16):.1%}")

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm = profile(None, (a, b), warmup=3, repeat=args.repeat, fn=torch.mm)
    achieved = mm.by_operator()["aten.mm"].achieved_flops
    if spec is not None:
        peak = spec.peak_flops(torch.bfloat16)
        ok &= check(f"{n}x{n} bf16 matmul achieved FLOPS vs peak", achieved >= 0.6 * peak,
                    f"{human(achieved, 'FLOPS')} of {human(peak, 'FLOPS')} "
                    f"({achieved / peak:.1%}; dense peak, clocks and power limit apply)")
    else:
        print(f"{n}x{n} bf16 matmul: {human(achieved, 'FLOPS')} (no built-in spec to compare)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
