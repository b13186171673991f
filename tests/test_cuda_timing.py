"""The CUDA branch of timing, run on the CPU through a fake CUDA (tests/fake_cuda.py): each
event stamps its device's virtual clock, one tick per record, so an op timed with nothing but
itself between its two events took exactly one tick."""

import inspect
import json
import tracemalloc

import pytest
import torch
from fake_cuda import TICK_NS, FakeCuda, HostDevices
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.engine.counting import mode as _mode
from dispatch_flops.engine.timing import clock as _timing


@pytest.fixture
def fake(monkeypatch):
    return FakeCuda().install(monkeypatch)


CUDA = torch.device("cuda")


def to_cuda(x):
    """``x.to("cuda")`` as the dispatch mode sees it (this torch has no CUDA to parse it)."""
    return torch.ops.aten._to_copy.default(x, device=CUDA)


def ticks(fc) -> dict:
    """Each record's latency in ticks, per (stack, phase, overload)."""
    return {(r.stack, r.phase, r.overload): (r.stats.calls, r.stats.latency_s * 1e9 / TICK_NS)
            for r in fc.records()}


def assert_one_tick_per_kernel(fc) -> None:
    """Every record's time is one tick per call (its op on CUDA, alone between its events)
    or none at all (a view: no kernel); some have time."""
    found = ticks(fc)
    for key, (calls, t) in found.items():
        assert t == pytest.approx(calls) or t == 0, key
    assert any(t for _, t in found.values())


def test_op_device_reads_device_kwarg_and_every_tensor(fake):
    cpu, on0 = torch.ones(2, dtype=torch.float16), torch.ones(2)
    fake.dtypes = {torch.float32: 0, torch.float64: 1}
    on1 = torch.ones(2, dtype=torch.float64)
    assert _timing.op_device((cpu,), {"device": torch.device("cuda", 1)}) == 1  # host to device
    assert _timing.op_device((cpu,), {"device": torch.device("cuda")}) == 0  # current device
    assert _timing.op_device((on1,), {"device": torch.device("cpu")}) == 1  # device to host
    assert _timing.op_device((cpu, on1), {}) == 1  # not only the first tensor
    assert _timing.op_device(([cpu, on0],), None) == 0  # Tensor[] arguments
    assert _timing.op_device((cpu,), {"out": on1}) == 1
    assert _timing.op_device((cpu, 2.0), {}) == -1


def test_two_devices_each_op_on_its_own_stream_every_device_synchronized(fake):
    """A model on cuda:1 records on cuda:1 (the fake raises on an event recorded on one device
    and read against another), and reading results synchronizes both devices."""
    fake.dtypes = {torch.float32: 0, torch.float64: 1}
    torch.manual_seed(0)
    first, second = nn.Linear(4, 4), nn.Linear(4, 4).double()
    x = torch.randn(3, 4)
    with FlopCounter(timing="events") as fc:
        first(x).sum().backward()
        second(x.double()).sum().backward()
    assert fake.records_on(0) and fake.records_on(1)
    assert fake.synced == []  # nothing synchronized inside the block
    assert_one_tick_per_kernel(fc)
    assert set(fake.synced) == {0, 1}
    assert fc.wall_s > 0


def test_host_to_device_copy_is_timed_on_the_device(fake):
    x = torch.ones(8, dtype=torch.float16)  # a host tensor, by the fake's dtypes
    with HostDevices(), FlopCounter(timing="events") as fc:
        to_cuda(x)
    assert fc.by_operator()["aten._to_copy"].latency_s * 1e9 == TICK_NS
    assert fake.records_on(0) >= 2


def test_cuda_first_used_inside_the_block(fake):
    assert not fake.initialized
    with HostDevices(), FlopCounter(timing="events") as fc:
        w = torch.ops.aten.ones.default([4, 4], device=CUDA)
        (w @ w).relu()
    assert fake.initialized
    assert fc.by_operator()["aten.mm"].latency_s * 1e9 == TICK_NS
    assert_one_tick_per_kernel(fc)


def test_cpu_model_in_a_process_that_touched_cuda_records_no_event(fake):
    fake.initialized, fake.dtypes = True, {}  # CUDA in use, but not by this model
    model = nn.Linear(4, 4)
    with FlopCounter(model, timing="events") as fc:
        model(torch.randn(2, 4)).sum().backward()
    assert fc.total.latency_s > 0 and fc.wall_s > 0
    assert not fake.recorded and fake.synced == []


def test_a_thousand_steps_with_one_counter_hold_bounded_events_and_memory(fake):
    """Pairs are folded as they complete (the fake's device runs 8 records behind): the
    queues, the pool and the timer's memory stay bounded however long the counter is open."""
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    # what the timer and the fake allocate, not what the ops allocate under the runner's frame
    timer_memory = [tracemalloc.Filter(True, "*_timing.py"),
                    tracemalloc.Filter(True, "*fake_cuda.py")]
    lines = inspect.getsource(_timing).splitlines()
    timer_memory += [tracemalloc.Filter(False, "*_timing.py", i)
                     for i, line in enumerate(lines, 1) if "func(*args" in line]
    tracemalloc.start()
    try:
        most_pending, sizes = 0, []
        with FlopCounter(model, timing="events") as fc:
            for i in range(1000):
                model(x).sum().backward()
                most_pending = max(most_pending, fake.pending())
                if i in (299, 999):
                    snapshot = tracemalloc.take_snapshot().filter_traces(timer_memory)
                    sizes.append(sum(s.size for s in snapshot.statistics("filename")))
    finally:
        tracemalloc.stop()
    assert fake.synced == []
    assert most_pending <= _timing.FOLD_EVERY + fake.lag
    assert fake.created <= 4 * (_timing.FOLD_EVERY + fake.lag)
    # 700 more steps of ~10 pairs: megabytes if kept; the pool settling in is kilobytes
    assert sizes[1] - sizes[0] < 100_000, sizes
    assert fc.total.calls > 10_000
    assert_one_tick_per_kernel(fc)


def test_a_failed_read_can_be_read_again(fake):
    """elapsed_time failing halfway through resolve() adds nothing twice on the next read."""
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with FlopCounter(model, timing="events") as fc:
        model(x).sum().backward()
    fake.fail_elapsed = 3  # the third pair read fails
    with pytest.raises(RuntimeError, match="illegal memory access"):
        fc.to_profile()
    assert_one_tick_per_kernel(fc)
    assert fc.wall_s > 0


@pytest.mark.parametrize("outer_timing", ["events", False])
def test_nested_counter_times_the_op_alone(fake, outer_timing):
    """A counter nested in another takes the op's time from the mode below it, which runs
    the op: nothing of the outer counter's work is inside it."""
    w = torch.randn(4, 4)
    with FlopCounter(timing=outer_timing) as outer:
        with FlopCounter(timing="events") as inner:
            (w @ w).relu().sum()
            assert isinstance(outer._mode.runner, _timing.Relay)
        assert not isinstance(outer._mode.runner, _timing.Relay)  # given back
    assert_one_tick_per_kernel(inner)
    assert outer.total.calls == inner.total.calls
    if outer_timing:
        assert outer.total.latency_s == inner.total.latency_s


def test_nested_counter_on_the_cpu_times_the_op_alone(monkeypatch):
    """The same on the host clock, made virtual so that load cannot move it: each read of the
    clock advances it one tick, and the outer counter's per-op work advances it 2 ms. The
    inner counter's op took one tick (nothing but the op between its two reads); with the
    outer counter's work inside it, it would take 2 ms more."""
    now = [0]

    def clock():
        now[0] += 1
        return now[0]

    real = _mode._current_node
    outer_work = []

    def slow():
        outer_work.append(now[0])
        now[0] += 2_000_000
        return real()

    monkeypatch.setattr(_timing, "perf_counter_ns", clock)
    a = torch.randn(8, 8)
    with FlopCounter() as outer:
        with FlopCounter(timing="events") as inner:
            monkeypatch.setattr(_mode, "_current_node", slow)
            a @ a
            monkeypatch.setattr(_mode, "_current_node", real)
    assert outer_work  # the slowed work ran, in this op's dispatch
    assert outer.total.calls == inner.total.calls == 1
    assert inner.total.latency_s * 1e9 == pytest.approx(1)


def test_graph_capture_counts_ops_without_time(fake):
    w = torch.randn(4, 4)
    with FlopCounter(timing="events") as fc:
        w @ w
        fake.capturing = True
        with pytest.warns(UserWarning, match="CUDA graph"):
            w @ w
        fake.capturing = False
    mm = fc.by_operator()["aten.mm"]
    assert mm.calls == 2 and mm.latency_s * 1e9 == TICK_NS


def test_wall_ends_on_every_stream_used(fake):
    w = torch.randn(4, 4)
    with FlopCounter(timing="events") as fc:
        w @ w
        with fake.stream(0, 7):
            w @ w  # on a side stream
    assert fake.recorded[0, 7] == 3  # the op's two events and the wall's end
    assert fc.wall_s * 1e9 >= fc.total.latency_s * 1e9 == 2 * TICK_NS


def test_trace_places_cuda_ops(fake, tmp_path):
    w = torch.randn(4, 4)
    model = nn.Linear(4, 4)
    with FlopCounter(model, trace=True) as fc:
        model(w @ w).sum().backward()
    path = tmp_path / "trace.json"
    fc.to_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    mm = [e for e in events if e.get("name") == "aten.mm"]
    assert mm and all(e["dur"] == TICK_NS / 1e3 for e in mm)
    assert fake.pending() == 0
