"""``FlopCounter(timing="kernels")`` end to end on the CPU: the kernel timer's ranges and
marks recorded by a real Kineto session (CPU activity), a synthetic GPU half added when it
stops (tests/kineto_traces.py ``SyntheticGpu``), the CUDA parts faked (tests/fake_cuda.py)."""

import warnings

import pytest
import torch
from fake_cuda import FakeCuda
from kineto_traces import SyntheticGpu, raw_launch
from torch import nn

from dispatch_flops import FlopCounter, Profile
from dispatch_flops.engine.timing import kineto as _kineto

KERNELS = {
    "aten::addmm": [("kernel", "sm90_xmma_gemm_bf16", 10.0)],
    "aten::mm": [("kernel", "sm90_xmma_gemm_bf16_nn", 8.0)],
    "aten::relu": [("kernel", "vectorized_elementwise_kernel<relu>", 2.0)],
    "aten::threshold_backward": [("kernel", "elementwise_kernel<threshold_bw>", 2.0)],
    "aten::sum": [("kernel", "reduce_kernel<sum>", 3.0)],
}
RAW = "triton_poi_fused_gelu_0"


class Block(nn.Module):
    """A linear, then a raw kernel launched with no aten op (a Triton kernel called by hand)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        raw_launch(RAW)
        return y.relu()


def model_and_input():
    torch.manual_seed(0)
    return nn.Sequential(Block(), nn.Linear(8, 8)), torch.randn(4, 8)


@pytest.fixture
def gpu(monkeypatch):
    FakeCuda().install(monkeypatch)
    monkeypatch.setattr(_kineto, "unavailable", lambda: None)
    sessions: list = []

    def session():
        sessions.append(SyntheticGpu(KERNELS))
        return sessions[-1]

    monkeypatch.setattr(_kineto, "SESSION", session)
    return sessions


def test_each_op_timed_by_its_kernels_and_raw_kernels_get_rows(gpu):
    model, x = model_and_input()
    with FlopCounter(model, timing="kernels") as fc:
        model(x).sum().backward()
    assert [s.stopped for s in gpu] == [1]  # stopped at the block's end, before any read
    ops = fc.by_operator()
    for op, name in (("aten.addmm", "aten::addmm"), ("aten.mm", "aten::mm"),
                     ("aten.relu", "aten::relu"), ("aten.sum", "aten::sum")):
        per_call = KERNELS[name][0][2] * 1e-6
        assert ops[op].latency_s == pytest.approx(ops[op].calls * per_call), op
    assert ops["aten.t"].latency_s == 0  # a view launches nothing
    raw = ops["kernel:" + RAW]
    assert (raw.calls, raw.flops) == (1, 0) and raw.latency_s == pytest.approx(5e-6)
    assert fc.unsupported_ops()["kernel:" + RAW] == 1  # flops unknown, listed
    # Block's own: relu 2, the raw kernel 5, relu's backward 2 (its linear's are the child's)
    assert fc.by_module()["0"].exclusive.latency_s == pytest.approx((2 + 5 + 2) * 1e-6)
    found = fc.timer.found  # the join: every device activity went to an op or a row
    assert found.attributed_ns + found.outside_ns == found.device_ns
    assert fc.total.latency_s == pytest.approx(found.device_ns * 1e-9)
    footer = fc.table()
    assert "1 kernel launched outside aten ops" in footer
    loaded = Profile.from_dict(fc.to_dict())
    assert loaded.by_operator()["kernel:" + RAW].latency_s == pytest.approx(5e-6)


def test_module_time_is_its_kernels_span(gpu):
    model, x = model_and_input()
    with FlopCounter(model, timing="kernels") as fc:
        model(x)
    block = fc.by_module()["0"]
    # gemm 10 us, 1 us idle (SyntheticGpu's gap after an op's kernel), raw 5, relu 2: its
    # kernels' span on the device, idle included
    assert block.latency_s == pytest.approx(18e-6)


def test_without_cupti_warns_once_and_times_module_boundaries_only(monkeypatch):
    FakeCuda().install(monkeypatch)
    monkeypatch.setattr(_kineto, "unavailable",
                        lambda: "another profiler is recording (test)")
    monkeypatch.setattr(_kineto, "_warned", set())
    model, x = model_and_input()
    with pytest.warns(UserWarning, match="kernel timing unavailable: another profiler"):
        with FlopCounter(model, timing="kernels") as fc:
            model(x)
    assert fc.by_operator()["aten.addmm"].latency_s == 0  # never an event pair per op
    assert fc.by_module()["0"].latency_s > 0  # module boundaries: events
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FlopCounter(model, timing="kernels"):
            model(x)


def test_on_the_cpu_kernels_timing_is_the_host_clock():
    model, x = model_and_input()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FlopCounter(model, timing="kernels") as fc:
            model(x)
    assert fc.by_operator()["aten.addmm"].latency_s > 0


def test_timing_must_be_a_known_value():
    with pytest.raises(ValueError, match="True, False, 'kernels', 'events', got 'cupti'"):
        FlopCounter(timing="cupti")
    with pytest.raises(TypeError, match="timing must be True or False"):
        FlopCounter(timing=1)


def test_kernels_recorded_on_one_block_in_k_and_reused_on_the_others(gpu, monkeypatch):
    """With a model, Kineto records one block in ``kernel_sampling``; the blocks between reuse
    each signature's kernel time per call; a new signature makes the next block sampled."""
    model, x = model_and_input()
    times, estimated = [], []
    for _ in range(4):
        model.zero_grad(set_to_none=True)  # else step 1 accumulates grads: new signatures
        with FlopCounter(model, timing="kernels", kernel_sampling=3) as fc:
            model(x).sum().backward()
        times.append({op: s.latency_s for op, s in fc.by_operator().items()
                      if not op.startswith("kernel:")})
        estimated.append(fc.timer.estimated)
    assert estimated == [False, True, True, False] and len(gpu) == 2
    for step in (1, 2):
        assert times[step] == pytest.approx(times[0]), step
    with FlopCounter(model, timing="kernels", kernel_sampling=3) as fc:  # a new shape: its
        model(torch.randn(6, 8))  # signatures never measured
    assert fc.timer.estimated and fc.by_operator()["aten.addmm"].latency_s == 0
    with FlopCounter(model, timing="kernels", kernel_sampling=3) as fc:
        model(torch.randn(6, 8))
    assert not fc.timer.estimated  # measured at once
    with FlopCounter(model, timing="kernels", kernel_sampling=2) as fc:  # another schedule
        model(torch.randn(6, 8))
    assert not fc.timer.estimated  # starts afresh: its first block is recorded


def test_kernel_sampling_is_a_whole_number_of_blocks():
    """``kernel_sampling`` names what it takes, like ``timing``."""
    for bad in (0, -1, 2.5, True, "10", None):
        with pytest.raises(ValueError, match="kernel_sampling must be a whole number"):
            FlopCounter(kernel_sampling=bad)
    assert FlopCounter().kernel_sampling == 10
    assert FlopCounter(kernel_sampling=1).kernel_sampling == 1


def test_unavailable_names_why(monkeypatch):
    """Each reason kernel timing falls back, named: a private API this torch lacks, another
    profiler recording; none on this CPU torch (Kineto built in, CUPTI not: CPU build)."""
    real = _kineto.lookup
    monkeypatch.setattr(_kineto, "lookup", lambda name: None
                        if name.endswith("_enable_profiler") else real(name))
    assert "lacks torch.autograd.profiler._enable_profiler" in _kineto.unavailable()
    monkeypatch.setattr(_kineto, "lookup", real)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        reason = _kineto.unavailable()
    assert reason is not None and ("another profiler" in reason or "CUPTI" in reason)


def test_nested_counters_mixing_clocks_count_untimed_and_say_so(gpu, monkeypatch):
    """An event-timed counter nested in a kernel-timed one (or the other way round): ops are
    timed by the clock below, which hands out tokens of another kind; the counter above
    counts them untimed, with a warning, and raises nothing."""
    monkeypatch.setattr(_kineto, "unavailable", lambda: None)
    model, x = model_and_input()
    with pytest.warns(UserWarning, match="cannot share one"):
        with FlopCounter(timing="kernels") as outer:
            with FlopCounter(timing="events") as inner:
                model(x)
    assert inner.by_operator()["aten.addmm"].calls == 2
    assert inner.by_operator()["aten.addmm"].latency_s == 0
    assert outer.by_operator()["aten.addmm"].latency_s == pytest.approx(2 * 10e-6)


def test_a_step_whose_wall_drifts_from_the_reused_times_is_measured_again(gpu, monkeypatch):
    """Between sampled steps the block's wall (CUDA events at its boundaries: the fake
    device's ticks) is compared with the op times reused, as a ratio to the first reusing
    step's: the fake device made twice as slow, the reused times no longer describe the
    step, and the next one records kernels again, long before ``kernel_sampling``."""
    import fake_cuda

    model, x = model_and_input()
    profiles = []

    def step():
        model.zero_grad(set_to_none=True)
        with FlopCounter(model, timing="kernels", kernel_sampling=100) as fc:
            model(x).sum().backward()
        profiles.append(fc.to_profile())
        return fc.timer

    first, reference, steady = step(), step(), step()
    assert not first.estimated and reference.estimated and steady.estimated
    assert reference.wall_ns > 0 and reference.reused_ns > 0
    assert (steady.wall_ns, steady.reused_ns) == (reference.wall_ns, reference.reused_ns)
    assert not reference.drifted and not steady.drifted
    monkeypatch.setattr(fake_cuda, "TICK_NS", 2 * fake_cuda.TICK_NS)  # the device slower
    slow = step()
    assert slow.estimated and slow.drifted and slow.wall_ns == 2 * steady.wall_ns
    assert slow.reused_ns == steady.reused_ns  # the reused times alone cannot tell
    again = step()
    assert not again.estimated and len(gpu) == 2  # measured again
    assert step().estimated  # and reused after it
    kernel_time = Profile.merge(profiles).kernel_time  # the schedule, in the data
    assert (kernel_time.measured_steps, kernel_time.reused_steps, kernel_time.drifts) == \
        (2, 4, 1)
    assert kernel_time.reused_s == pytest.approx(4 * reference.reused_ns / 1e9)
    assert "on the 2 recorded block(s)" in Profile.merge(profiles).table()
    assert "4 blocks reused each op's time (1 drifted and were measured again)" in \
        Profile.merge(profiles).table()


class FailingSession:
    """A Kineto session that raises where ``where`` says ("start" or "stop")."""

    def __init__(self, where: str) -> None:
        self.where = where

    def start(self) -> None:
        if self.where == "start":
            raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED (test)")

    def stop(self):
        raise RuntimeError("CUPTI_ERROR_INVALID_DEVICE (test)")


def test_a_session_failing_to_start_falls_back_and_the_step_runs(monkeypatch):
    """Kineto raising at start (never run on a GPU by this project yet): the step runs, the
    counts are whole, a warning names the failure once, and module boundaries are timed by
    events, never the ops by event pairs."""
    FakeCuda().install(monkeypatch)
    monkeypatch.setattr(_kineto, "unavailable", lambda: None)
    monkeypatch.setattr(_kineto, "_warned", set())
    monkeypatch.setattr(_kineto, "SESSION", lambda: FailingSession("start"))
    model, x = model_and_input()
    with pytest.warns(UserWarning, match="Kineto failed to start.*CUPTI_ERROR_NOT_INIT"):
        with FlopCounter(model, timing=True) as fc:
            model(x).sum().backward()
    assert isinstance(fc.timer, _kineto.ModuleEventTimer)
    assert fc.by_operator()["aten.addmm"].calls == 2
    assert fc.by_operator()["aten.addmm"].latency_s == 0
    assert fc.by_module()["0"].latency_s > 0
    with warnings.catch_warnings():  # said once
        warnings.simplefilter("error")
        with FlopCounter(model, timing=True):
            model(x)


def test_a_session_failing_at_the_blocks_end_leaves_counts_and_says_so(monkeypatch):
    FakeCuda().install(monkeypatch)
    monkeypatch.setattr(_kineto, "unavailable", lambda: None)
    monkeypatch.setattr(_kineto, "SESSION", lambda: FailingSession("stop"))
    model, x = model_and_input()
    with pytest.warns(UserWarning, match="stopping Kineto failed.*CUPTI_ERROR_INVALID"):
        with FlopCounter(timing="kernels") as fc:
            model(x)
    assert fc.timer.failure is not None
    assert fc.by_operator()["aten.addmm"].calls == 2
    assert fc.by_operator()["aten.addmm"].latency_s == 0


def test_timing_true_on_cuda_is_kernel_time_and_events_is_the_opt_out(gpu, monkeypatch):
    model, x = model_and_input()
    with FlopCounter(timing=True) as fc:
        model(x)
    assert isinstance(fc.timer, _kineto.KernelTimer)
    assert fc.by_operator()["aten.addmm"].latency_s == pytest.approx(2 * 10e-6)
    with FlopCounter(timing="events") as fc:
        model(x)
    assert type(fc.timer).__name__ == "CudaTimer"  # an event pair per op, asked for
    assert fc.by_operator()["aten.addmm"].latency_s > 0


def test_idle_inside_modules_and_the_joins_findings_are_profile_data(gpu):
    """The device idle inside each module's forward (its kernels' span minus their union:
    SyntheticGpu leaves 1 us after each op's kernel) is ModuleStats.idle_s, in the table's
    footer, in JSON, kept through a load and summed by merge; the join's figures (attributed
    share, kernels outside ops, dropped records) are Profile.kernel_time."""
    import dataclasses
    import json

    model, x = model_and_input()
    with FlopCounter(model, timing=True) as fc:
        model(x)
    modules = fc.by_module()
    # Block: gemm 10, 1 idle, raw 5, relu 2; the model: Block, 1 idle, the second gemm 10
    assert modules["0"].idle_s == pytest.approx(1e-6)
    assert modules[""].idle_s == pytest.approx(2e-6)
    assert modules["0.linear"].idle_s == 0  # one kernel: nothing idle inside
    assert modules["0"].latency_s == pytest.approx(18e-6)  # the span: idle included
    kernel_time = fc.kernel_time
    assert kernel_time.device_s == pytest.approx(27e-6)
    assert kernel_time.outside_s == pytest.approx(5e-6)
    assert kernel_time.attributed_share == pytest.approx(22 / 27)
    assert (kernel_time.dropped, kernel_time.unlinked, kernel_time.measured_steps) == (0, 0, 1)
    table = fc.table()
    assert "Idle (host-bound): 2.00 us inside Sequential's forward (7 % of its span)" in table
    assert "81.5 % given to ops" in table
    profile = fc.to_profile()
    loaded = Profile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert loaded.by_module()["0"].idle_s == pytest.approx(1e-6)
    assert loaded.kernel_time == kernel_time
    assert profile.to_dict()["by_module"]["0"]["idle_s"] == pytest.approx(1e-6)
    merged = Profile.merge([profile, loaded])
    assert merged.by_module()[""].idle_s == pytest.approx(4e-6)
    assert merged.kernel_time.measured_steps == 2
    assert merged.kernel_time.attributed_share == pytest.approx(22 / 27)
    with FlopCounter(model, timing="events") as events:  # not timed by kernels: none
        model(x)
    assert events.by_module()["0"].idle_s is None and events.kernel_time is None
    assert "Idle (host-bound)" not in events.table()
    # per_step() means can be fractions of a ns: the file holds whole ones (spans too)
    facts = profile.module_facts
    mean = profile.replace(module_facts=dataclasses.replace(
        facts, idle={**facts.idle, "": 4000 / 3}, spans={**facts.spans, "": 29000 / 3}))
    loaded = Profile.from_dict(json.loads(json.dumps(mean.to_dict())))
    assert loaded.module_facts.idle[""] == 1333 and loaded.module_facts.spans[""] == 9667


def test_the_schedule_holds_when_no_block_is_read(gpu, monkeypatch):
    """A loop that never reads its counters (a benchmark, a long run read at the end): the
    recorded block is joined when the next one begins, so the blocks after it reuse its
    times and the schedule keeps one recorded block in ``kernel_sampling``."""
    model, x = model_and_input()
    counters = []
    for _ in range(4):
        with FlopCounter(model, timing="kernels", kernel_sampling=3) as fc:
            model(x)
        counters.append(fc)
    assert [fc.timer.estimated for fc in counters] == [False, True, True, False]
    assert counters[1].by_operator()["aten.addmm"].latency_s == pytest.approx(2 * 10e-6)


def test_a_kernel_timed_counter_inside_another_says_why_it_counts_untimed(gpu, monkeypatch):
    """CUPTI takes one subscriber: the outer counter's. The inner one says so (not "another
    profiler"), counts its ops untimed, and the outer one keeps its kernel times."""
    monkeypatch.setattr(_kineto, "_warned", set())
    model, x = model_and_input()
    with pytest.warns(UserWarning) as caught:
        with FlopCounter(timing=True) as outer:
            with FlopCounter(timing=True) as inner:
                model(x)
    said = [str(w.message) for w in caught]
    assert any("a counter around this one records kernels already" in m for m in said)
    assert not any("another profiler" in m for m in said)
    assert len(gpu) == 1  # one session: the outer one's
    assert inner.by_operator()["aten.addmm"].calls == 2
    assert inner.by_operator()["aten.addmm"].latency_s == 0
    assert outer.by_operator()["aten.addmm"].latency_s == pytest.approx(2 * 10e-6)


def test_times_read_inside_the_block_wait_for_its_end_and_the_block_stays_timed(gpu):
    """resolve_times() inside a kernel-timed block: Kineto hands its records over only when
    it stops, so nothing lands yet (said once), and the session keeps recording: every op of
    the block has its kernels' time once it ends."""
    model, x = model_and_input()
    with FlopCounter(timing=True) as fc:
        model(x)
        with pytest.warns(UserWarning, match="kernel times land when the block ends"):
            fc.resolve_times()
        model(x)
    assert [s.stopped for s in gpu] == [1]
    assert fc.by_operator()["aten.addmm"].latency_s == pytest.approx(4 * 10e-6)


def test_a_block_failing_to_begin_stops_its_kineto_session(gpu, monkeypatch):
    from dispatch_flops import counter as _counter

    def fail(*args, **kwargs):
        raise RuntimeError("a tracker that cannot attach (test)")

    monkeypatch.setattr(_counter, "ModuleTracker", fail)
    model, _ = model_and_input()
    with pytest.raises(RuntimeError, match="cannot attach"):
        with FlopCounter(model, timing=True):
            pass
    assert [s.stopped for s in gpu] == [1]
