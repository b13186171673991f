"""CUDA graphs under a counter (engine.graphs.cuda_graphs), on the CPU: a stand-in for
``torch.cuda.CUDAGraph`` (tests/fake_cuda_graph.py) with its surface, followed as torch's own
class is; the oracle is the same model counted eagerly."""

import pytest
import torch
from fake_cuda import FakeCuda
from fake_cuda_graph import StandInGraph, graph, make_graphed_callables
from kineto_traces import SyntheticGpu
from torch import nn

from dispatch_flops import FlopCounter, Profile
from dispatch_flops.engine.graphs import cuda_graphs as _graphs
from dispatch_flops.engine.graphs.runs import Without
from dispatch_flops.engine.timing import kineto as _kineto
from dispatch_flops.engine.timing.kernels import GRAPH_PREFIX, DeviceActivity, HostEvent, join
from helpers import OpLog


@pytest.fixture(autouse=True)
def stand_in(monkeypatch):
    monkeypatch.setattr(_graphs, "TARGETS", [*_graphs.TARGETS, StandInGraph])


def model_and_input():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(2, 8)


def eager(model, x, backward=False):
    with FlopCounter(model) as fc:
        out = model(x)
        if backward:
            out.sum().backward()
    return fc


def captured_counted():
    """(model, its eager counts, a graph captured from it under a counter on the model)."""
    model, x = model_and_input()
    once = eager(model, x)
    g = StandInGraph()
    with FlopCounter(model):
        with graph(g):
            model(x)
    return model, once, g


def per_module(fc, field="flops"):
    return {name: getattr(stats, field) for name, stats in fc.by_module().items()}


def test_each_replay_adds_the_captured_counts_and_capture_adds_none():
    model, x = model_and_input()
    once = eager(model, x)
    g = StandInGraph()
    with FlopCounter(model) as fc:
        with graph(g):
            model(x)
        assert fc.total.flops == 0  # capture runs no kernel
        assert all(n == 0 for n in per_module(fc, "calls").values())
        for _ in range(3):
            g.replay()
    assert g.replays == 3
    assert fc.total.flops == 3 * once.total.flops
    assert fc.total.bytes_read == 3 * once.total.bytes_read
    assert per_module(fc) == {k: 3 * v for k, v in per_module(once).items()}
    assert per_module(fc, "calls") == {k: 3 * v for k, v in per_module(once, "calls").items()}
    assert fc.by_operator()["aten.addmm"].calls == 3 * once.by_operator()["aten.addmm"].calls


def test_a_later_counter_on_the_model_counts_replays_under_the_modules_captured():
    model, once, g = captured_counted()
    for _ in range(2):  # each a fresh counter: the ledger is shared, then handed on
        with FlopCounter(model) as fc:
            g.replay()
        assert per_module(fc) == per_module(once)
        assert fc.by_module()["0"].exclusive.macs == once.by_module()["0"].exclusive.macs


class Wrapper(nn.Module):
    """Another model, whose child replays a graph captured from the first."""

    def __init__(self, g) -> None:
        super().__init__()
        self.g = g
        self.inner = Replayer(g)

    def forward(self):
        return self.inner()


class Replayer(nn.Module):
    def __init__(self, g) -> None:
        super().__init__()
        self.g = g

    def forward(self):
        self.g.replay()


def test_another_model_or_none_counts_replays_under_the_module_around_them():
    _, once, g = captured_counted()
    wrapper = Wrapper(g)
    with FlopCounter(wrapper) as fc:
        wrapper()
    assert fc.total.flops == once.total.flops
    assert fc.by_module()["inner"].exclusive.flops == once.total.flops
    with FlopCounter() as bare:
        g.replay()
    assert bare.total.flops == once.total.flops
    assert bare.by_operator()["aten.addmm"].flops == once.by_operator()["aten.addmm"].flops


def test_nested_counters_each_count_every_replay():
    model, x = model_and_input()
    once = eager(model, x)
    g = StandInGraph()
    with FlopCounter(model) as outer:
        with FlopCounter(model) as inner:
            with graph(g):
                model(x)
            g.replay()
        g.replay()
    assert inner.total.flops == once.total.flops
    assert outer.total.flops == 2 * once.total.flops
    assert per_module(outer) == {k: 2 * v for k, v in per_module(once).items()}


def test_replays_outside_counters_add_nothing_and_nothing_stays_patched():
    model, x = model_and_input()
    g = StandInGraph()
    originals = {name: StandInGraph.__dict__[name] for name in _graphs._METHODS}
    with FlopCounter(model) as fc:
        assert StandInGraph.__dict__["replay"] is not originals["replay"]  # followed
        with graph(g):
            model(x)
    for name, method in originals.items():
        assert StandInGraph.__dict__[name] is method, name
    assert vars(g).keys() == vars(StandInGraph()).keys()  # the user's graph: no new state
    g.replay()
    g.replay()
    assert g.replays == 2 and fc.total.flops == 0
    with FlopCounter(model) as later:
        g.replay()
    assert later.total.flops == eager(model, x).total.flops


def test_a_graph_captured_uncounted_is_an_unsupported_row_per_replay():
    model, x = model_and_input()
    g = StandInGraph()
    with graph(g):
        model(x)
    wrapper = Wrapper(g)
    with FlopCounter(wrapper) as fc:
        wrapper()
        wrapper()
    row = fc.by_operator()[_graphs.REPLAY_ROW]
    assert (row.calls, row.flops) == (2, 0)
    assert fc.unsupported_ops() == {_graphs.REPLAY_ROW: 2}
    assert fc.by_module()["inner"].exclusive.calls == 2
    assert "cuda_graph:replay x2" in fc.table()
    loaded = Profile.from_dict(fc.to_dict())
    assert loaded.unsupported_ops() == {_graphs.REPLAY_ROW: 2}


class FailingGraph(StandInGraph):
    """A capture CUDA refuses at its end (an op that synchronized mid-capture)."""

    def capture_end(self) -> None:
        super().capture_end()
        self.captured = False
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_capture_counts_nothing_and_keeps_no_graph(monkeypatch):
    monkeypatch.setattr(_graphs, "TARGETS", [*_graphs.TARGETS, FailingGraph])
    model, x = model_and_input()
    g = FailingGraph()
    with FlopCounter(model) as fc:
        with pytest.raises(RuntimeError, match="capturing"):
            with graph(g):
                model(x)
        with pytest.raises(RuntimeError, match="never captured"):
            g.replay()  # a replay that raised ran nothing: counts nothing
    assert fc.total.flops == 0 and fc.total.calls == 0
    assert g not in _graphs._GRAPHS


def test_replays_with_the_counting_modes_off_are_a_compiled_graphs_own():
    """Inductor's cudagraph trees capture and replay inside a compiled graph's run, with the
    counting modes off the stack: that run's counts are the compiled graph's already."""
    model, x = model_and_input()
    g = StandInGraph()
    with FlopCounter(model) as fc:
        mode = fc._mode
        with Without((mode,)):
            with graph(g):
                model(x)
            g.replay()
    assert fc.total.flops == 0 and fc.total.calls == 0


def test_make_graphed_callables_counts_forward_and_backward_per_call():
    model, x = model_and_input()
    x.requires_grad_(True)
    step = eager(model, x, backward=True)
    with FlopCounter(model) as setup:
        graphed, fwd, bwd = make_graphed_callables(model, x, warmup=2)
    # the warm-up runs ran kernels: counted; the captures ran none
    assert setup.by_operator()["aten.addmm"].calls == 2 * 2
    with FlopCounter(model) as fc:
        for _ in range(3):
            graphed(x).sum().backward()
    assert (fwd.replays, bwd.replays) == (3, 3)
    ops, theirs = fc.by_operator(), step.by_operator()
    for op in ("aten.addmm", "aten.mm", "aten.relu", "aten.threshold_backward"):
        assert ops[op].flops == 3 * theirs[op].flops, op
    assert fc.by_module()["0"].exclusive.macs == 3 * step.by_module()["0"].exclusive.macs


# -- kernel time: a replay's kernels go to the ops captured --------------------------------


def test_join_gives_a_replays_kernels_to_the_ops_their_nodes_came_from():
    """A replay: the df:graph range, its cudaGraphLaunch, three kernels with the launch's
    correlation and graph node ids, two of them named by the capture."""
    host = [HostEvent("user_annotation", f"{GRAPH_PREFIX}0", 1, 1000, 9000, id=7),
            HostEvent("cuda_runtime", "cudaGraphLaunch", 1, 2000, 3000, 0, 7, 55)]
    device = [DeviceActivity("kernel", "gemm", 0, 7, 10_000, 12_000, 55, 7, graph_node=101),
              DeviceActivity("kernel", "relu", 0, 7, 12_000, 12_500, 55, 7, graph_node=102),
              DeviceActivity("kernel", "memset", 0, 7, 12_500, 12_600, 55, 7, graph_node=103)]
    found = join(host, device, graph_ops={0: {101: 3, 102: 4}})
    assert found.op_ns == {3: 2000, 4: 500}
    assert [(r.name, r.ns, r.graph) for r in found.outside] == [("memset", 100, True)]
    assert found.attributed_ns + found.outside_ns == found.device_ns
    unnamed = join(host, device)  # no node named: every kernel a row, as before
    assert unnamed.op_ns == {} and unnamed.outside_ns == 2600 and unnamed.graph_replays == 1


class FakeAnnotations:
    """torch.cuda._graph_annotations' part we use: a label per op scope, read back by the
    graph node each label's kernels became (tools id: the graph's number + 1, then the label;
    0 is no node)."""

    def __init__(self) -> None:
        self.labels: list = []

    def available(self) -> bool:
        return True

    def begin(self) -> None:
        pass

    def scope(self, label):
        self.labels.append(label)
        return torch.autograd.profiler.record_function(f"scope:{label}")

    def end(self, g) -> dict:
        return {((g.number + 1) << 32) | label: label for label in self.labels}


def test_kernel_timing_gives_replay_kernels_to_captured_ops(monkeypatch):
    FakeCuda().install(monkeypatch)
    monkeypatch.setattr(_kineto, "unavailable", lambda: None)
    annotations = FakeAnnotations()
    monkeypatch.setattr(_graphs, "ANNOTATIONS", lambda: annotations)
    graphs: dict = {}
    monkeypatch.setattr(_kineto, "SESSION", lambda: SyntheticGpu({}, graphs=graphs))
    model, x = model_and_input()
    log = OpLog()
    with log:
        model(x)
    g = StandInGraph()
    with FlopCounter(model, timing="kernels") as fc:
        with graph(g):
            model(x)
        # each captured op became one node with a kernel of (label + 1) us, and one node
        # no op made (a memset torch added): a kernel:<name> row of 3 us
        graphs[g.number] = [(((g.number + 1) << 32) | label, f"k{label}", label + 1.0)
                            for label in annotations.labels] + [(999, "graph_memset", 3.0)]
        for _ in range(2):
            g.replay()
    assert annotations.labels == list(range(len(log.ops)))
    ops = fc.by_operator()
    for name in ("aten.addmm", "aten.relu"):
        us = sum(label + 1.0 for label, op in enumerate(log.ops) if op == name)
        assert ops[name].latency_s == pytest.approx(2 * us * 1e-6), name
        assert ops[name].calls == 2 * log.ops.count(name)
    extra = ops["kernel:graph_memset"]
    assert (extra.calls, extra.flops) == (2, 0) and extra.latency_s == pytest.approx(6e-6)
    found = fc.timer.found
    assert found.attributed_ns + found.outside_ns == found.device_ns
    assert found.graph_replays == 2
    # the blocks between samples reuse each captured op's kernel time per call
    for _ in range(2):
        with FlopCounter(model, timing="kernels") as between:
            g.replay()
        assert between.timer.estimated
        assert between.by_operator()["aten.addmm"].latency_s == \
            pytest.approx(ops["aten.addmm"].latency_s / 2)




class AnnotationModule:
    """``torch.cuda._graph_annotations``' functions that ``TorchAnnotations`` calls, over a
    map holding a user's annotations beside ours (one merged with a user scope's)."""

    def __init__(self) -> None:
        self._annotations_enabled = False
        self.kept = {5: [{"dispatch_flops": 0}], 6: [{"dispatch_flops": 1, "str": "phase_A"}],
                     7: ["user's"]}
        self.calls: list = []

    def _is_tools_id_unavailable(self) -> bool:
        return False

    def enable_annotations(self) -> None:
        self._annotations_enabled = True

    def disable_annotations(self) -> None:
        self._annotations_enabled = False

    def resolve_pending_annotations(self) -> None:
        self.calls.append("resolve")

    def remap_to_exec_graph(self, g) -> None:
        self.calls.append("remap")

    def get_kernel_annotations(self) -> dict:
        return self.kept


def test_torch_annotations_take_our_labels_out_and_leave_the_users():
    annotations = _graphs.TorchAnnotations()
    module = annotations.module = AnnotationModule()
    assert annotations.available()
    annotations.begin()
    assert module._annotations_enabled
    assert annotations.end(StandInGraph()) == {5: 0, 6: 1}
    assert module.calls == ["resolve", "remap"]
    assert module.kept == {6: [{"str": "phase_A"}], 7: ["user's"]}
    assert not module._annotations_enabled  # as the user had it
    annotations.module = None  # a torch without them (before 2.13): no mapping
    assert not annotations.available()


# -- torch.compile(mode="reduce-overhead") ---------------------------------------------------


@pytest.mark.slow  # compiles
def test_reduce_overhead_counts_and_times_every_call():
    """On the CPU reduce-overhead has no CUDA graphs: each call runs the compiled graph,
    counted per call (the eager oracle's counts times the calls) and timed whole per call;
    no ``cuda_graph:replay`` row (a cudagraph tree's replays are the compiled run's)."""
    torch._dynamo.reset()
    model, x = model_and_input()
    x.requires_grad_(True)
    step = eager(model, x, backward=True)
    compiled = torch.compile(model, mode="reduce-overhead")
    compiled(x).sum().backward()  # compiles
    with FlopCounter(model, timing=True) as fc:
        for _ in range(3):
            model.zero_grad(set_to_none=True)  # as the eager oracle: no accumulation
            x.grad = None
            compiled(x).sum().backward()
    assert fc.total.flops == 3 * step.total.flops
    assert fc.total.macs == 3 * step.total.macs
    for name, stats in step.by_module().items():
        assert fc.by_module()[name].exclusive.flops == 3 * stats.exclusive.flops, name
    (stack, (runs, forward, backward)), = fc.to_profile().graph_runs.items()
    assert stack == ("",) and runs == 3 and forward > 0 and backward > 0
    assert _graphs.REPLAY_ROW not in fc.by_operator()
    torch._dynamo.reset()


@pytest.mark.parametrize("cuda", [False, True])
def test_torch_cuda_graph_class_is_followed_only_by_a_cuda_build(monkeypatch, cuda):
    """torch.cuda.CUDAGraph is wrapped while a counter counts only by a torch built with CUDA
    (a CPU build has no graph: a fresh counter per step left it alone), asked without
    touching the driver; the stand-in class is wrapped either way, and both are as they were
    after the block."""
    def driver():
        raise AssertionError("a counter that times nothing asked the CUDA driver")

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_available", driver)
    torch_class = torch.cuda.CUDAGraph
    before = {name: torch_class.__dict__.get(name) for name in ("replay", "capture_begin")}
    stand_in_replay = StandInGraph.__dict__["replay"]
    model, x = model_and_input()
    with FlopCounter(model):
        inside = {name: torch_class.__dict__.get(name) for name in before}
        assert StandInGraph.__dict__["replay"] is not stand_in_replay
    assert StandInGraph.__dict__["replay"] is stand_in_replay
    assert {name: torch_class.__dict__.get(name) for name in before} == before
    wrapped = [name for name in before if inside[name] is not before[name]]
    assert wrapped == ([name for name in before if before[name] is not None] if cuda else [])
