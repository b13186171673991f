"""GPU timing checks: CUDA-event latency per op against the kernels' own (CUPTI) times.

On a GPU, for a GPT-2-small-shaped model in bf16 training (forward, backward, AdamW step),
prints each check with its figures:

1. one training step counted with ``FlopCounter(timing=True)`` inside ``torch.profiler``
   (CPU + CUDA activities): the sum of our per-op event times against the sum of the step's
   kernel, memcpy and memset times (CUPTI), within 10 %; and the top ops side by side (ours
   vs the profiler's self device time per aten op);
2. a timed step against an eager one (median of repeats, events around the step), within
   1.10x, with no synchronize inside the block;
3. host microseconds each variant adds per aten op (eager, counting, counting with timing),
   measured directly on a small batch where the host sets the pace;
4. events held after many steps with one counter open (pooled and pending: bounded);
5. the same training step on ``cuda:1`` when there are two GPUs, without ``set_device``;
6. a Chrome trace of one step written and read back;
7. a large bf16 matmul's achieved FLOPS against the device's built-in peak;
8. with ``--kernels``: ``timing="kernels"`` on the same step against torch.profiler (attributed
   share >= 99 %, top ops within 1 % of ``self_device_time_total``, a timed step amortised
   over ``SAMPLE_EVERY`` steps <= 1.10x eager, a recorded step alone printed).

Exit status: 0 when every check passes, 1 when one fails, 3 when there is no CUDA device
(nothing was checked).

    python benchmarks/gpu_timing.py [--batch 8] [--seq 512] [--repeat 10] [--steps 200] [--kernels]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

from dispatch_flops import FlopCounter, device_spec, human, measure
from dispatch_flops.engine import timing as _timing
from dispatch_flops.models import GPT, GPT2_SMALL, GPTConfig
from dispatch_flops.results.format import duration

NO_CUDA = 3  # exit status: skipped, no CUDA device


def check(label: str, ok: bool, detail: str) -> bool:
    print(f"[{'PASS' if ok else 'FAIL'}] {label}: {detail}")
    return ok


def training(config: GPTConfig, batch: int, seq: int, device: str):
    """(model, one training step): forward, backward and an AdamW step, bf16."""
    torch.manual_seed(0)
    model = GPT(config).to(device, torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, config.vocab_size, (batch, seq), device=device)

    def step():
        model(idx).float().sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def event_time(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` between two CUDA events on the current stream."""
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def ours_vs_kernels(model, step, top: int) -> bool:
    """Check 1: one step counted inside torch.profiler."""
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        with FlopCounter(model, timing=True) as fc:
            step()
        torch.cuda.synchronize()
    ours_s = fc.total.latency_s
    # device activities (kernels, memcpy, memset) carry device_type CUDA; times in us
    device_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    kernels_s = sum(e.time_range.elapsed_us() for e in device_events) / 1e6
    ok = check("sum of per-op event times vs the step's kernel (CUPTI) times",
               abs(ours_s - kernels_s) <= 0.10 * kernels_s,
               f"ours {duration(ours_s)}, kernels {duration(kernels_s)} "
               f"({len(device_events)} device activities), ratio {ours_s / kernels_s:.3f}")
    theirs = {a.key: a.self_device_time_total / 1e6 for a in prof.key_averages()
              if a.key.startswith("aten::")}
    print(f"  top {top} ops by our time, against the profiler's self device time:")
    print(f"  {'op':32s} {'ours':>10s} {'kernels':>10s} {'ratio':>6s}")
    for name, stats in fc.top_ops_by_time(top):
        kernel = theirs.get(name.replace(".", "::", 1), 0.0)
        ratio = f"{stats.latency_s / kernel:.2f}" if kernel else "-"
        print(f"  {name:32s} {duration(stats.latency_s):>10s} {duration(kernel):>10s} "
              f"{ratio:>6s}")
    return ok


def timed_vs_eager(model, step, repeat: int) -> bool:
    """Check 2: a timed step costs at most 10 % over eager; nothing syncs inside it."""
    eager = event_time(step, repeat)
    synced = []
    real_sync = torch.cuda.synchronize

    def counting_sync(device=None):
        synced.append(device)
        real_sync(device)

    timed = []
    for _ in range(repeat):
        torch.cuda.synchronize = counting_sync
        try:
            with FlopCounter(model, timing=True) as run:
                step()
        finally:
            torch.cuda.synchronize = real_sync
        timed.append(run.wall_s)  # read after the block: resolve syncs here, not inside
    timed_s = statistics.median(timed)
    ok = check("timed step vs eager step", timed_s <= 1.10 * eager,
               f"timed {duration(timed_s)}, eager {duration(eager)}, "
               f"ratio {timed_s / eager:.3f}")
    ok &= check("no synchronize inside the block", not synced,
                f"{len(synced)} synchronize calls inside {repeat} timed steps")
    return ok


def host_cost_per_op(repeat: int) -> None:
    """Check 3 (figures only): host us each variant adds per aten op, small batch."""
    model, step = training(GPTConfig(n_layer=4, d_model=128, n_head=4, vocab_size=512,
                                     max_seq_len=64), 2, 32, "cuda")
    for _ in range(3):
        step()
    with FlopCounter(model) as probe:
        step()
    ops = probe.total.calls
    variants = {"eager": None, "counting": dict(), "counting + timing": dict(timing=True)}
    host = {}
    for name, options in variants.items():
        times = []
        for _ in range(repeat):
            torch.cuda.synchronize()
            start = time.perf_counter()
            if options is None:
                step()
            else:
                with FlopCounter(model, **options):
                    step()
            times.append(time.perf_counter() - start)  # host time: no sync before reading
        host[name] = statistics.median(times)
    torch.cuda.synchronize()
    print(f"host cost, small batch ({ops} aten ops per training step, host-bound):")
    for name in variants:
        added = (host[name] - host["eager"]) / ops * 1e6
        print(f"  {name:18s} step {duration(host[name]):>10s} on the host, "
              f"added {added:6.2f} us per op")


def bounded_events(model, step, steps: int) -> bool:
    """Check 4: events held with one counter open over many steps."""
    state = _timing._STATE
    held = []
    with FlopCounter(model, timing=True) as fc:
        for i in range(steps):
            step()
            if i % 10 == 9:
                held.append(sum(len(p) for p in state.pools.values())
                            + 2 * sum(len(s.pending) for s in state.streams.values()))
    ops = fc.total.calls  # the first read resolves the events
    half = held[len(held) // 2:]
    return check(f"events held over {steps} steps with one counter open",
                 max(half) <= 2 * max(held[: len(held) // 2] or [1]) + 2 * _timing.FOLD_EVERY,
                 f"{ops} ops timed; events held every 10 steps: first {held[:3]}, "
                 f"last {held[-3:]}, most {max(held)}")


def second_device(batch: int, seq: int) -> bool:
    """Check 5: the step on cuda:1 without set_device."""
    model, step = training(GPT2_SMALL, batch, seq, "cuda:1")
    step()
    with FlopCounter(model, timing=True) as fc:
        step()
    devices = sorted(_timing._STATE.pools)
    return check("a model on cuda:1, current device 0", fc.total.latency_s > 0 and 1 in devices,
                 f"ops {duration(fc.total.latency_s)}, wall {duration(fc.wall_s)}, events "
                 f"pooled on devices {devices}")


def trace_export(model, step) -> bool:
    """Check 6: a Chrome trace of one step."""
    with FlopCounter(model, trace=True) as fc:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        fc.to_chrome_trace(path)
        events = json.loads(path.read_text())["traceEvents"]
        size = path.stat().st_size
    ops = [e for e in events if e.get("cat") == "op"] or events
    return check("trace export", len(events) > 0,
                 f"{len(events)} trace events ({len(ops)} ops), {human(size, 'B')}")


def matmul_vs_peak(spec, repeat: int) -> bool:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm = measure(None, (a, b), warmup=3, repeat=repeat, fn=torch.mm)
    achieved = mm.by_operator()["aten.mm"].achieved_flops
    if spec is None:
        print(f"{n}x{n} bf16 matmul: {human(achieved, 'FLOPS')} (no built-in spec to compare)")
        return True
    peak = spec.peak_flops(torch.bfloat16)
    return check(f"{n}x{n} bf16 matmul achieved FLOPS vs peak", achieved >= 0.6 * peak,
                 f"{human(achieved, 'FLOPS')} of {human(peak, 'FLOPS')} "
                 f"({achieved / peak:.1%}; dense peak, clocks and power limit apply)")


def kernels_vs_profiler(model, step, repeat: int, top: int) -> bool:
    """Check 8 (``--kernels``): ``timing="kernels"`` against torch.profiler on the same step:
    the attributed share, each top op against its ``self_device_time_total``, and what a
    sampled and an estimated step cost against eager."""
    from dispatch_flops.engine import kineto

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        step()
        torch.cuda.synchronize()
    theirs = {a.key: a.self_device_time_total / 1e6 for a in prof.key_averages()
              if a.key.startswith("aten::")}
    kernels_s = sum(e.time_range.elapsed_us() for e in prof.events()
                    if e.device_type == DeviceType.CUDA) / 1e6
    with FlopCounter(timing="kernels") as fc:  # no model: this block is recorded
        step()
    found = fc.timer.found
    ok = check("kernel time attributed to ops", found.attributed_share >= 0.99,
               f"{found.attributed_share:.2%} of {duration(found.device_ns / 1e9)}; outside "
               f"ops {duration(found.outside_ns / 1e9)} in {len(found.outside)} rows, "
               f"{found.dropped} dropped, {found.unlinked} unlinked, "
               f"{found.graph_replays} graph replays")
    ok &= check("the step's kernel time vs torch.profiler's",
                abs(found.device_ns / 1e9 - kernels_s) <= 0.05 * kernels_s,
                f"ours {duration(found.device_ns / 1e9)}, profiler {duration(kernels_s)}")
    print(f"  {'op':40s} {'ours':>10s} {'self dev':>10s} {'ratio':>6s}")
    off = []
    for name, stats in fc.top_ops_by_time(top):
        kernel = theirs.get(name.replace(".", "::", 1), 0.0)
        ratio = stats.latency_s / kernel if kernel else float("nan")
        if not abs(ratio - 1) <= 0.01:
            off.append(name)
        print(f"  {name:40s} {duration(stats.latency_s):>10s} {duration(kernel):>10s} "
              f"{ratio:6.3f}")
    ok &= check("top ops within 1 % of self_device_time_total", not off, f"off: {off}")
    eager = event_time(step, repeat)
    sampled = event_time(lambda: _counted(model, step, every=1), repeat)
    steps = kineto.SAMPLE_EVERY
    amortised = event_time(lambda: [_counted(model, step) for _ in range(steps)],
                           max(1, repeat // steps)) / steps
    ok &= check(f"kernel-timed step vs eager, amortised over {steps} steps",
                amortised <= 1.10 * eager, f"{duration(amortised)} vs {duration(eager)}, "
                f"ratio {amortised / eager:.3f}; a recorded step alone {duration(sampled)} "
                f"({sampled / eager:.2f}x)")
    return ok


def _counted(model, step, every=None) -> None:
    from dispatch_flops.engine import kineto

    if every is not None:  # every block recorded: the sampled step's cost
        kineto._samplers.pop(model, None)
    with FlopCounter(model, timing="kernels"):
        step()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200, help="steps for the events check")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--kernels", action="store_true",
                        help='also check timing="kernels" against torch.profiler')
    args = parser.parse_args()
    for name in ("batch", "seq", "repeat", "steps", "top"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not torch.cuda.is_available():
        print(f"CUDA is not available: GPU timing checks skipped (exit status {NO_CUDA}).")
        return NO_CUDA
    spec = device_spec()
    print(f"device: {torch.cuda.get_device_name()} -> built-in spec: "
          f"{spec.name if spec else 'none'}; {torch.cuda.device_count()} GPU(s)")
    model, step = training(GPT2_SMALL, args.batch, args.seq, "cuda")
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print(f"GPT-2 small, bf16, batch {args.batch} x {args.seq}, forward + backward + AdamW")
    ok = ours_vs_kernels(model, step, args.top)
    ok &= timed_vs_eager(model, step, args.repeat)
    host_cost_per_op(args.repeat)
    small, small_step = training(GPTConfig(n_layer=2, d_model=64, n_head=2, vocab_size=256,
                                           max_seq_len=32), 2, 16, "cuda")
    ok &= bounded_events(small, small_step, args.steps)
    if torch.cuda.device_count() > 1:
        ok &= second_device(args.batch, args.seq)
    else:
        print("one GPU: the cuda:1 check skipped")
    ok &= trace_export(model, step)
    with FlopCounter(model) as counted:
        step()
    print(f"model: {human(counted.total.flops, 'FLOP')} per training step")
    ok &= matmul_vs_peak(spec, args.repeat)
    if args.kernels:
        ok &= kernels_vs_profiler(model, step, args.repeat, args.top)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
