"""Timing on the CPU, measure() medians, the roofline and MFU (the CUDA-event path runs in
benchmarks/gpu_timing.py, on a GPU)."""

import gc
import weakref
from dataclasses import replace

import pytest
import torch
from torch import nn

from dispatch_flops import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    ROOT,
    DeviceSpec,
    FlopCounter,
    device_spec,
    measure,
)
from helpers import TINY, step, tiny_gpt


def children(modules, name):
    if name == ROOT:
        return [n for n in modules if n and "." not in n]
    return [n for n in modules if n.rpartition(".")[0] == name]


@pytest.mark.parametrize("phase", [None, "forward", "backward"])
def test_every_module_timed_and_parents_cover_children(phase):
    """Timing on: every leaf that ran has a positive latency, and a parent's inclusive
    latency is at least the sum of its children's, in each phase."""
    model = tiny_gpt()
    idx = torch.randint(0, TINY.vocab_size, (2, 8))
    with FlopCounter(model, timing=True) as fc:
        step(model, idx)
    modules = fc.by_module(phase=phase)
    leaves = [n for n, m in model.named_modules() if not list(m.children())]
    for name in leaves:
        if name in modules and modules[name].exclusive.calls:
            assert modules[name].latency_s > 0, name
    for name, m in modules.items():  # to the nanosecond: sums of float seconds round
        inside = sum(modules[c].latency_s for c in children(modules, name))
        assert m.latency_s >= inside - 1e-9, name
    assert fc.wall_s >= modules[ROOT].latency_s > 0


def test_timing_changes_nothing_but_time():
    """Counts, records and outputs are those of an untimed run; only latency_s is added."""
    model = tiny_gpt()
    idx = torch.randint(0, TINY.vocab_size, (2, 8))
    with FlopCounter(model) as plain:
        expected = model(idx)
    with FlopCounter(model, timing=True) as timed:
        got = model(idx)
    assert torch.equal(expected, got)
    assert all(r.stats.latency_s is None for r in plain.records())
    assert all(r.stats.latency_s is not None for r in timed.records())
    untimed = [replace(r, stats=replace(r.stats, latency_s=None)) for r in timed.records()]
    assert untimed == plain.records()
    assert plain.wall_s is None and plain.by_module()[ROOT].latency_s is None


def test_timing_keeps_no_tensor_alive():
    model = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with FlopCounter(model, timing=True) as fc:
        y = model(x)
        y.sum().backward()
    ref = weakref.ref(y)
    del y
    gc.collect()
    fc.records(), fc.by_module()
    assert ref() is None


def test_measure_takes_medians_of_warm_repeats():
    """measure(): counts equal one counted call's; the block's time, and each op's time per
    (module stack, phase, overload) is the median of the repeats'."""
    model = tiny_gpt()
    idx = torch.randint(0, TINY.vocab_size, (2, 8))
    seen = []
    original = FlopCounter.__exit__

    def keep(self, *exc):
        original(self, *exc)
        times = {(r.stack, r.phase, r.overload): r.stats.latency_s for r in self.records()}
        seen.append((self.wall_s, times))

    FlopCounter.__exit__ = keep
    try:
        fc = measure(model, (idx,), warmup=1, repeat=3, fn=lambda i: step(model, i))
    finally:
        FlopCounter.__exit__ = original
    with FlopCounter(model) as plain:
        step(model, idx)
    assert fc.repeats == 3 and len(seen) == 3
    assert fc.total.flops == plain.total.flops and fc.total.calls == plain.total.calls
    assert fc.wall_s == sorted(wall for wall, _ in seen)[1]
    entries = [(r.stack, r.phase, r.overload, r.stats.latency_s) for r in fc.records()]
    assert len(entries) == len(seen[0][1])
    for stack, phase, key, latency in entries:
        assert latency == sorted(run[(stack, phase, key)] for _, run in seen)[1]


@pytest.mark.parametrize("bad", [{"repeat": 0}, {"warmup": -1}, {"repeat": 1.5}, {"timing": False}])
def test_measure_rejects_bad_arguments(bad):
    with pytest.raises(ValueError):
        measure(nn.Linear(2, 2), (torch.randn(1, 2),), **bad)


def test_roofline_closed_form():
    """attainable = max(flops / peak, bytes / bandwidth); the larger term names the bound;
    efficiency = attainable / measured."""
    spec = DeviceSpec("toy", {"float32": 1e9}, 1e9)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with FlopCounter(timing=True) as fc:
        a @ b  # 2*64^3 flops over 3*64*64*4 bytes: intensity 10.7 > 1 -> compute-bound
        a + b  # no formula yet or 1 flop/element: intensity < 1 -> memory-bound
    rooflines = fc.roofline_by_operator(spec, torch.float32)
    mm = fc.by_operator()["aten.mm"]
    assert rooflines["aten.mm"].attainable_s == max(mm.flops / 1e9, mm.bytes / 1e9)
    assert rooflines["aten.mm"].bound == COMPUTE_BOUND
    assert rooflines["aten.mm"].efficiency == pytest.approx(
        rooflines["aten.mm"].attainable_s / mm.latency_s)
    assert rooflines["aten.add"].bound == MEMORY_BOUND
    # the default numerator is 2 x MACs (the mm's 64^3), "all" adds the add's 64^2 flops
    assert fc.mfu(spec, torch.float32) == pytest.approx(2 * 64**3 / (fc.wall_s * 1e9))
    assert fc.mfu(spec, torch.float32, flops="all") == pytest.approx(
        fc.total.flops / (fc.wall_s * 1e9)) == pytest.approx(
        (2 * 64**3 + 64**2) / (fc.wall_s * 1e9))
    assert fc.hfu(spec, torch.float32) == fc.mfu(spec, torch.float32)  # no optimizer, recompute
    with pytest.raises(ValueError, match="contraction"):
        fc.mfu(spec, torch.float32, flops="model")


def test_device_table_and_bad_specs():
    assert device_spec("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert device_spec("NVIDIA H100 PCIe").name == "H100-PCIe"
    assert device_spec("NVIDIA H200").name == "H200"
    assert device_spec("NVIDIA A100-SXM4-40GB").name == "A100-SXM4-40GB"
    assert device_spec("NVIDIA A100-SXM4-80GB").name == "A100-SXM4-80GB"
    assert device_spec("NVIDIA L4").name == "L4"
    assert device_spec("Some Other GPU") is None
    h100 = device_spec("NVIDIA H100 80GB HBM3")
    assert h100.peak_flops(torch.bfloat16) > h100.peak_flops(torch.float32)
    with pytest.raises(ValueError, match="known dtypes"):
        h100.peak_flops(torch.int16)
    with pytest.raises(ValueError, match="positive"):
        DeviceSpec("x", {"float32": 0}, 1e9)
    with pytest.raises(ValueError, match="positive"):
        DeviceSpec("x", {"float32": 1e9}, 0)
    assert DeviceSpec.cpu(1e11, 5e10).peak_flops(torch.bfloat16) == 1e11


def test_timing_views_need_timing():
    with FlopCounter() as fc:
        torch.randn(4, 4) @ torch.randn(4, 4)
    for call in (fc.top_ops_by_time, fc.top_modules_by_time,
                 lambda: fc.mfu(DeviceSpec.cpu(1e9, 1e9))):
        with pytest.raises(ValueError, match="timing=True"):
            call()
    with pytest.raises(ValueError, match="'kernels', 'events', got 'yes'"):
        FlopCounter(timing="yes")  # a string names a mode: the valid ones listed
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="DeviceSpec.cpu"):
            fc.roofline_by_operator()


def test_table_shows_time_columns_only_when_timed():
    model = tiny_gpt()
    idx = torch.randint(0, TINY.vocab_size, (1, 4))
    with FlopCounter(model) as plain:
        model(idx)
    with FlopCounter(model, timing=True) as timed:
        model(idx)
    wide = 1000  # every column that applies
    assert "Latency" not in plain.table(width=wide) and "Top ops by time" not in plain.table()
    assert "Latency" in timed.table(width=wide) and "Top ops by time" in timed.table()
    top = timed.top_ops_by_time(3)
    assert [s.latency_s for _, s in top] == sorted((s.latency_s for _, s in top), reverse=True)
    d = timed.to_dict()
    assert d["timing"] is True and d["wall_s"] > 0
    assert d["by_module"][ROOT]["inclusive"]["latency_s"] > 0


def test_a_timed_counter_over_one_left_out_of_order_times_its_ops():
    """Counters exited out of order leave a timed counter's mode at the bottom of the stack,
    its runner a relayed one (no timer of its own, no clock below it any more): a timed
    counter entered above it counts its ops (untimed, as before the runner stack), where the
    runner stack's first version raised AttributeError."""
    from dispatch_flops import FlopCounter

    x = torch.randn(8, 8)
    a, b = FlopCounter(), FlopCounter(timing=True)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # b's mode is now the bottom one
    try:
        with FlopCounter(timing=True) as c:
            x @ x
    finally:
        b.__exit__(None, None, None)
    assert c.by_operator()["aten.mm"].calls == 1 == b.by_operator()["aten.mm"].calls


def test_a_relay_times_by_what_it_wraps_now():
    """A wrapper taken off the runner stack under a relay (a CUDA graph capture's annotation
    ending while a nested timed counter runs) is off the relay's clock too."""
    from dispatch_flops.engine.counting.mode import CountingMode
    from dispatch_flops.engine.timing.clock import Relay, Timer
    from dispatch_flops.formulas import REGISTRY

    class Wrapper:
        def __init__(self, runner):
            self.runner = runner

    own, clock = Timer(), Timer()
    mode = CountingMode(REGISTRY, own)
    inner = mode.wrap_runner(Wrapper)
    relay = mode.wrap_runner(lambda runner: Relay(runner, clock, mode))
    assert relay.clock is inner
    mode.unwrap_runner(inner)
    assert relay.runner is own and relay.clock is own and mode.runners() == [relay, own]
    mode.unwrap_runner(relay)
    assert mode.runner is own and mode.runners() == [own]
    mode.unwrap_runner(relay)  # taken off already: nothing
    assert mode.runner is own
    bare = CountingMode(REGISTRY)
    relay = bare.wrap_runner(lambda runner: Relay(runner, clock, bare))
    assert relay.clock is clock and bare.runners() == [relay]
