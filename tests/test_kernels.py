"""The kernel join (engine.timing.kernels) from activity traces in Kineto's shape: the CPU half
recorded here by torch.profiler, the GPU half synthetic (tests/kineto_traces.py)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kineto_traces import add_gpu, device_event, host_op, launch, mark, record_cpu

from dispatch_flops.engine.timing import kernels as K

KERNELS = {
    "aten::addmm": [("kernel", "ampere_sgemm_32x32_sliced1x4_tn", 10.0)],
    "aten::relu": [("kernel", "vectorized_elementwise_kernel<relu>", 2.0)],
    "aten::mm": [("kernel", "ampere_sgemm_64x32_nn", 8.0)],
    "aten::sum": [("kernel", "reduce_kernel<sum>", 3.0), ("gpu_memset", "Memset (Device)", 1.0)],
    "aten::threshold_backward": [("kernel", "threshold_backward_kernel", 2.0)],
}


def training_step(mode):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8, requires_grad=True)
    mark(0)
    with mode:
        model(x).sum().backward()
    mark(1)


@pytest.fixture(scope="module")
def recorded():
    trace, ops = record_cpu(training_step)
    return trace, ops


def expected(ops: dict) -> dict:
    """Oracle: each token's op (as the mode saw it) runs the kernels given for its name."""
    found = {t: sum(round(d * 1000) for _, _, d in KERNELS.get(name, ())) for t, name in
             ops.items()}
    return {t: ns for t, ns in found.items() if ns}


def torch_self_device_ns(trace: dict) -> dict:
    """torch's rule (profiler_util: self device time = Σ of the device events whose External
    id is the op's own): External id -> ns."""
    out: dict = {}
    for e in trace["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
            key = e["args"]["External id"]
            out[key] = out.get(key, 0) + round(e["dur"] * 1000)
    return out


def test_each_op_gets_the_kernels_it_launched_from_a_real_cpu_trace(recorded):
    trace, ops = recorded
    trace = {"traceEvents": list(trace["traceEvents"])}
    added = add_gpu(trace, KERNELS)
    host, device = K.from_chrome_trace(trace)
    found = K.join(host, device, [("block", 0, 1)])
    assert found.op_ns == expected(ops)
    assert found.device_ns == sum(round(e["dur"] * 1000) for e in added)
    assert found.attributed_ns == found.device_ns and found.attributed_share == 1.0
    assert found.outside == () and found.dropped == found.unlinked == 0
    # torch's self device time, summed over the ops that launched: the same total
    assert sum(torch_self_device_ns(trace).values()) == found.attributed_ns
    block = found.calls["block"]
    assert block.kernels == len(added)
    assert block.busy_ns == found.device_ns  # one stream: no overlap
    assert block.idle_ns == block.span_ns - block.busy_ns > 0  # host-bound: the GPU waits


def backward_on_its_own_thread(trace: dict, thread: int) -> dict:
    """The trace with every host event inside autograd's node evaluations moved to
    ``thread``, as on CUDA, where autograd runs backward on a device thread."""
    events = [dict(e) for e in trace["traceEvents"]]
    nodes = [e for e in events if e.get("ph") == "X" and
             e.get("name", "").startswith(K.BACKWARD_PREFIX)]
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime") and any(
                n["ts"] <= e["ts"] and e["ts"] + e["dur"] <= n["ts"] + n["dur"] for n in nodes):
            e["tid"] = thread
    return {"traceEvents": events}


def test_backward_ops_on_autograds_thread_keep_their_kernels(recorded):
    trace, ops = recorded
    moved = backward_on_its_own_thread(trace, 999)
    assert any(e.get("tid") == 999 for e in moved["traceEvents"])
    add_gpu(moved, KERNELS)
    found = K.join(*K.from_chrome_trace(moved))
    assert found.op_ns == expected(ops)


def test_nesting_is_per_thread_never_across_threads():
    """An op on thread 2 whose host interval lies inside thread 1's op range is not that
    op's: the join nests only within the launching thread."""
    events = [host_op("df:op:0", 1, 0.0, 100.0, 1), host_op("aten::mm", 1, 10.0, 20.0, 2),
              host_op("aten::add", 2, 40.0, 10.0, 3),  # no range of ours on thread 2
              device_event("kernel", "gemm", 200.0, 5.0, 50, 2),
              device_event("kernel", "add_kernel", 210.0, 1.0, 51, 3)]
    found = K.join(*K.from_chrome_trace({"traceEvents": events}))
    assert found.op_ns == {0: 5000}
    assert [(r.call, r.name, r.ns) for r in found.outside] == [(None, "add_kernel", 1000)]


def test_kernels_no_op_launched_go_to_the_module_call_around_their_launch():
    """A raw kernel (cuLaunchKernel, no op open) inside a module call: its own row there,
    with its time; the call's busy time is the union of its kernels on two streams, its idle
    the rest of its span."""
    events = [
        host_op("df:mark:1", 1, 0.0, 0.0, 1), host_op("df:mark:2", 1, 5.0, 0.0, 2),
        host_op("df:op:0", 1, 10.0, 10.0, 3), host_op("aten::mm", 1, 11.0, 8.0, 4),
        launch("cudaLaunchKernel", "cuda_runtime", 1, 12.0, 2.0, 70, external_id=4),
        launch("cuLaunchKernel", "cuda_driver", 1, 30.0, 2.0, 71),  # Triton, no op open
        launch("cuLaunchKernel", "cuda_driver", 1, 35.0, 2.0, 72),
        host_op("df:mark:3", 1, 40.0, 0.0, 5), host_op("df:mark:4", 1, 50.0, 0.0, 6),
        device_event("kernel", "gemm", 100.0, 10.0, 70, 4, stream=7),
        device_event("kernel", "triton_poi_fused_add_0", 105.0, 10.0, 71, None, stream=8),
        device_event("kernel", "triton_poi_fused_add_0", 130.0, 4.0, 72, None, stream=7),
    ]
    spans = [("outer", 1, 4), ("inner", 2, 3)]
    found = K.join(*K.from_chrome_trace({"traceEvents": events}), spans)
    assert found.op_ns == {0: 10_000}
    assert found.outside == (K.Outside("inner", "forward", "triton_poi_fused_add_0", "kernel",
                                       2, 14_000, False),)
    assert found.attributed_share == pytest.approx(10 / 24)
    inner = found.calls["inner"]
    assert (inner.kernels, inner.busy_ns, inner.span_ns) == (3, 19_000, 34_000)
    assert inner.idle_ns == 15_000
    assert found.calls["outer"] == inner  # nothing launched outside "inner"


def test_cuda_graph_replays_are_counted_and_their_kernels_timed():
    events = [host_op("df:mark:1", 1, 0.0, 0.0, 1), host_op("df:mark:2", 1, 90.0, 0.0, 2)]
    t = 100.0
    for replay, at in enumerate((10.0, 50.0)):
        correlation = 500 + replay
        events.append(launch("cudaGraphLaunch", "cuda_runtime", 1, at, 5.0, correlation))
        for name in ("gemm", "add", "gemm"):
            events.append(device_event("kernel", name, t, 2.0, correlation, None))
            t += 3.0
    found = K.join(*K.from_chrome_trace({"traceEvents": events}), [("decoder", 1, 2)])
    assert found.graph_replays == 2
    rows = {r.name: r for r in found.outside}
    assert rows["gemm"].calls == 4 and rows["add"].calls == 2
    assert all(r.graph and r.call == "decoder" for r in rows.values())
    assert found.outside_ns == found.device_ns == 12_000


def test_records_whose_host_side_is_missing_are_reported_not_lost():
    events = [host_op("df:op:0", 1, 0.0, 10.0, 1),
              device_event("kernel", "gemm", 20.0, 4.0, 80, 1),
              device_event("kernel", "lost", 30.0, 2.0, 81, 12345),  # its op not recorded
              device_event("kernel", "nccl:all_reduce", 40.0, 6.0, 82, None)]  # no launch
    found = K.join(*K.from_chrome_trace({"traceEvents": events}))
    assert (found.dropped, found.unlinked) == (1, 1)
    assert found.device_ns == 12_000 and found.attributed_ns == 4_000
    assert {r.name: (r.call, r.phase) for r in found.outside} == {
        "lost": (None, "other"), "nccl:all_reduce": (None, "other")}


def test_outside_kernels_in_backward_and_optimizer_are_phased():
    events = [
        host_op("autograd::engine::evaluate_function: SelectiveScanFnBackward", 2, 0.0, 50.0,
                1),
        launch("cuLaunchKernel", "cuda_driver", 2, 10.0, 2.0, 90, external_id=1),
        {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "pid": 1,
         "tid": 1, "ts": 100.0, "dur": 50.0, "args": {"External id": 2}},
        host_op("aten::_foreach_add_", 1, 110.0, 10.0, 3),
        launch("cudaLaunchKernel", "cuda_runtime", 1, 112.0, 2.0, 91, external_id=3),
        device_event("kernel", "selective_scan_bwd_kernel", 200.0, 7.0, 90, 1),
        device_event("kernel", "multi_tensor_apply_kernel", 210.0, 3.0, 91, 3),
    ]
    found = K.join(*K.from_chrome_trace({"traceEvents": events}))
    assert {(r.name, r.phase) for r in found.outside} == {
        ("selective_scan_bwd_kernel", "backward"), ("multi_tensor_apply_kernel", "optimizer")}


def test_memcpy_and_memset_count_as_device_time(recorded):
    events = [host_op("df:op:3", 1, 0.0, 10.0, 1), host_op("aten::copy_", 1, 1.0, 8.0, 2),
              device_event("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 20.0, 6.0, 60, 2),
              host_op("df:op:4", 1, 12.0, 5.0, 3),
              device_event("gpu_memset", "Memset (Device)", 30.0, 1.0, 61, 3)]
    found = K.join(*K.from_chrome_trace({"traceEvents": events}))
    assert found.op_ns == {3: 6000, 4: 1000} and found.op_kernels == {3: 1, 4: 1}


class _FakeKinetoEvent:
    """``_KinetoEvent``'s accessors over one Chrome trace event (the fields torch's
    ``_parse_kineto_results`` reads)."""

    def __init__(self, e: dict) -> None:
        self.e = e

    def activity_type(self):
        return self.e["cat"]

    def name(self):
        return self.e["name"]

    def start_ns(self):
        return round(self.e["ts"] * 1000)

    def end_ns(self):
        return round((self.e["ts"] + self.e["dur"]) * 1000)

    def device_index(self):
        return self.e["pid"]

    def device_resource_id(self):
        return self.e["tid"]

    def correlation_id(self):
        args = self.e.get("args", {})
        if self.e["cat"] in ("cpu_op", "user_annotation"):
            return args.get("External id", 0)
        return args.get("correlation", 0)

    def linked_correlation_id(self):
        if self.e["cat"] in ("cpu_op", "user_annotation"):
            return 0
        return self.e.get("args", {}).get("External id", 0)


def test_kineto_events_and_chrome_trace_read_the_same(recorded):
    trace, ops = recorded
    trace = {"traceEvents": list(trace["traceEvents"])}
    add_gpu(trace, KERNELS)
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    from_events = K.join(*K.from_kineto(_FakeKinetoEvent(e) for e in xs))
    assert from_events == K.join(*K.from_chrome_trace(trace))


def test_real_kineto_events_give_the_host_half_the_chrome_trace_has():
    """torch's own _KinetoEvents (CPU): same ops, ids and threads as its Chrome export."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        mark(7)
        torch.ones(4).add(1)
    host, device = K.from_kineto(prof.profiler.kineto_results.events())
    assert device == []
    names = {e.name: e for e in host}
    assert "df:mark:7" in names and "aten::add" in names
    assert len({e.thread for e in host}) == 1 and host[0].thread != 1  # the OS thread id
    assert len({e.id for e in host}) == len(host)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=30),
       st.integers(0, 120), st.integers(0, 20))
def test_innermost_matches_a_brute_force_search(cuts, start, length):
    """On properly nested intervals (a stack of ranges), the innermost one containing a query
    is the shortest containing one."""
    intervals, stack, t = [], [], 0
    for opened, closed in cuts:  # a random sequence of pushes and pops builds a valid nest
        t += 1
        for _ in range(opened % 3):
            stack.append(t)
            t += 1
        for _ in range(closed % 3):
            if stack:
                intervals.append((stack.pop(), t, len(intervals)))
                t += 1
    nest = K.Nest(intervals)
    end = start + length
    found = nest.innermost(start, end)
    containing = [i for i in intervals if i[0] <= start and end <= i[1]]
    if not containing:
        assert found == -1
    else:
        assert nest.values[found] == min(containing, key=lambda i: i[1] - i[0])[2]



@given(st.integers(0, 2_000_000_000_000_000), st.integers(0, 2**41), st.integers(0, 999))
def test_microseconds_are_read_as_ns_exactly(epoch, whole, fraction):
    """Whole microseconds (older traces: since the epoch, past 2**53 ns) and three decimals
    (current ones, about 1.4e12 us: below 2**41, where a double is finer than half a ns)
    give their ns exactly; through one double, 1.7e18 ns would be up to 128 ns off."""
    assert K.us_to_ns(epoch) == epoch * 1000
    assert K.us_to_ns(float(f"{whole}.{fraction:03d}")) == whole * 1000 + fraction
    for bad in ("12", None, True, float("nan"), float("-inf")):
        with pytest.raises(ValueError):
            K.us_to_ns(bad)


def test_the_chrome_trace_reader_keeps_an_edge_shared_at_epoch_microseconds():
    """The live path's reader converts the same way: a launch ending with its op at whole
    epoch microseconds stays in it (through a double it ends 24 ns later)."""
    at = 1_683_564_901_549_715
    events = [host_op("df:op:0", 1, at, 2, 1),
              launch("cudaLaunchKernel", "cuda_runtime", 1, at + 1, 1, 9),
              device_event("kernel", "gemm", at + 5, 3, 9, None)]
    found = K.join(*K.from_chrome_trace({"traceEvents": events}))
    assert found.op_ns == {0: 3000}

def step(sampler) -> bool:
    """A step begins: whether it is sampled."""
    sampled = sampler.due()
    sampler.begin(sampled)
    return sampled


def test_sampler_schedule_reuse_and_drift():
    sampler = K.Sampler(every=4, tolerance=0.1)
    assert step(sampler)
    assert step(sampler)  # the first step's results never read: nothing learned, sample
    sampler.learn({"mm": (2, 200), "add": (4, 40)})
    assert not step(sampler)
    times, missing = sampler.estimate({"mm": 3, "add": 1})
    assert times == {"mm": 300, "add": 10} and missing == ()
    # the first step reusing sets the reference: the wall twice the reused ops' time
    assert not sampler.step_done(wall_ns=620, reused_ns=310) and sampler.ratio == 2.0
    # 2.1 against 2.0: within 10 %; the wall alone is not what is compared (45 % more than
    # the step before's: more calls, more reused time)
    assert not step(sampler)
    assert not sampler.step_done(wall_ns=903, reused_ns=430) and sampler.drifts == 0
    assert not step(sampler)  # its results never read: the schedule moves all the same
    assert step(sampler)  # every fourth step
    sampler.learn({"mm": (1, 100)})
    assert sampler.ratio is None  # a new reference after a sample
    assert not step(sampler)
    _, missing = sampler.estimate({"softmax": 1})
    assert missing == ("softmax",) and sampler.due()  # a new signature: measure it next
    assert step(sampler)
    sampler.learn({"softmax": (1, 5), "mm": (1, 100)})
    assert not step(sampler)
    assert not sampler.step_done(wall_ns=210, reused_ns=105)  # the reference: 2.0
    assert not step(sampler)
    # the same ops reused (105 ns) but the wall 250: the kernels got slower, 2.38 vs 2.0
    assert sampler.step_done(wall_ns=250, reused_ns=105) and sampler.due()
    assert sampler.drifts == 1
    assert step(sampler)
    assert not sampler.step_done(wall_ns=None, reused_ns=100)  # no wall: nothing to compare
    assert not sampler.step_done(wall_ns=200, reused_ns=0) and sampler.ratio is None
    with pytest.raises(ValueError, match="every"):
        K.Sampler(every=0)
