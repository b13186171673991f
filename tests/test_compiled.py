"""torch.compile under the counter: compiled models are counted as they run compiled, equal to
eager's counts of the same model, and stay compiled after a counted step (pytorch#190286).

Real inductor compiles on CPU: each test compiles a small model once and reuses it."""

import copy
import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from dispatch_flops import FlopCounter
from dispatch_flops.engine.graphs.dynamo import has_ignore_compile_internals
from helpers import OpLog, tiny_gpt, tiny_ids

pytestmark = [pytest.mark.slow,  # compiles: seconds a test, dynamo's import first
              pytest.mark.usefixtures("fresh_dynamo")]

# torch >= 2.9: compiled code runs under the counter (counted through its graphs); torch 2.8
# runs the counted step eagerly, and only test_stays_compiled_after_counting applies there
runs_compiled = pytest.mark.skipif(not has_ignore_compile_internals(),
                                   reason="torch without ignore_compile_internals")


def counted(model, *inputs, backward=True, counter_model=None):
    """One forward (+ backward) of ``model`` on ``inputs`` under a fresh counter, gradients
    cleared first (so no accumulation differs between runs)."""
    (counter_model or model).zero_grad(set_to_none=True)
    with FlopCounter(counter_model or model) as fc:
        out = model(*inputs)
        if backward:
            out.sum().backward()
    return fc


def assert_same_counts(compiled, eager, exact_bytes=True):
    """Every module's MACs and flops equal, and the total; bytes too where the gradient a
    graph's backward receives is the expanded one of a reduced loss (``exact_bytes``)."""
    assert compiled.total.macs == eager.total.macs
    assert compiled.total.flops == eager.total.flops
    ours, theirs = compiled.by_module(), eager.by_module()
    assert set(ours) == set(theirs)
    assert ours[""].calls == theirs[""].calls  # the wrapper's call is the model's
    for name, stats in theirs.items():
        assert ours[name].exclusive.macs == stats.exclusive.macs, name
        assert ours[name].exclusive.flops == stats.exclusive.flops, name
        if exact_bytes:
            assert ours[name].inclusive.bytes_read == stats.inclusive.bytes_read, name
        else:  # a graph's incoming gradient priced contiguous-or-expanded, not as it came
            assert abs(ours[name].inclusive.bytes_read - stats.inclusive.bytes_read) <= \
                0.1 * stats.inclusive.bytes_read, name


@runs_compiled
def test_compiled_gpt_counts_as_eager_per_module_and_stays_compiled():
    """A tiny GPT compiled by inductor and counted on its first call (fwd + bwd): every
    module's MACs, flops and bytes equal eager's, under the user's names; it compiled once,
    and afterwards runs the compiled artifact (fused ops never reach the dispatcher), counted
    again the same, with no recompile."""
    model, idx = tiny_gpt(), tiny_ids()
    eager = counted(copy.deepcopy(model), idx)
    compiled = torch.compile(model)
    first = counted(compiled, idx)
    assert_same_counts(first, eager)
    assert not any("_orig_mod" in name for name in first.by_module())
    assert first.to_profile().module_facts.types[0] == "GPT"
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    frames = dict(counters["frames"])
    log = OpLog()
    with log:
        compiled(idx).sum().backward()
    assert "aten.native_layer_norm" not in log.ops and "aten.gelu" not in log.ops
    assert "aten.mm" in log.ops or "aten.addmm" in log.ops  # extern kernels still dispatch
    again = counted(compiled, idx)
    assert_same_counts(again, eager)
    assert dict(counters["frames"]) == frames  # nothing compiled again, nothing skipped


@runs_compiled
def test_inference_counts_forward_only():
    """A compiled model run under no_grad counts its forward, as eager does."""
    model, idx = tiny_gpt(), tiny_ids()
    with torch.no_grad():
        eager = counted(copy.deepcopy(model), idx, backward=False)
        fc = counted(torch.compile(model), idx, backward=False)
    assert_same_counts(fc, eager)
    assert fc.by_phase()["backward"].flops == 0


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 8)

    def forward(self, x):
        y = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(y).tanh()


@runs_compiled
def test_graph_breaks_count_each_graph_once():
    """A model with a graph break is two compiled graphs and eager code between: counted
    once each, equal to eager."""
    torch.manual_seed(0)
    model = nn.Sequential(Broken(), nn.GELU(), Broken())
    x = torch.randn(4, 8)
    eager = counted(copy.deepcopy(model), x)
    compiled = torch.compile(model)
    fc = counted(compiled, x)
    assert counters["graph_break"] and counters["stats"]["unique_graphs"] >= 2
    assert_same_counts(fc, eager, exact_bytes=False)
    fc2 = counted(compiled, x)
    assert fc2.total == fc.total


@runs_compiled
def test_recompiles_for_new_shapes_count_each_shape():
    """A new batch size recompiles (dynamic): each call counts what eager counts for its own
    shapes, on the static graph and on the dynamic one alike."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    reference = copy.deepcopy(model)
    compiled = torch.compile(model)
    for batch in (2, 3, 5, 3):
        x = torch.randn(batch, 8)
        assert_same_counts(counted(compiled, x), counted(reference, x))
    assert counters["stats"]["unique_graphs"] == 2  # static for 2, dynamic from 3 on


@runs_compiled
@pytest.mark.parametrize("backend", ["inductor", "aot_eager", "eager"])
def test_a_repeat_call_prices_nothing_and_adds_the_first_calls_counts(monkeypatch, backend):
    """A graph called again with input shapes priced already adds its priced counts and
    nothing else: no fake_run, in the same counter (counts doubled, as eager's are) or the
    next (equal to the first), timing on as off; its backward counts too where the backend
    makes no aot_autograd node (``eager``: a hook on the nodes it made adds them). A new
    counter's gradient accumulation goes where eager's does: under the modules the graph
    runs, though it never prices them again."""
    from dispatch_flops.engine.graphs.compiled import Graph

    torch.manual_seed(0)
    # nested: a gradient accumulated into 0.0's weight belongs under 0 (inclusive counts)
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 32), nn.GELU()), nn.Linear(32, 8))
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 8)
    first = counted(compiled, x)
    assert_same_counts(first, counted(reference, x))
    priced = []
    original = Graph._count_on_fake
    monkeypatch.setattr(Graph, "_count_on_fake",
                        lambda self, *a: priced.append(self) or original(self, *a))

    def twice(m, timing):
        m.zero_grad(set_to_none=True)
        with FlopCounter(m, timing=timing) as fc:
            for _ in range(2):
                m(x).sum().backward()
        return fc

    for timing in (False, True):
        assert_same_counts(twice(compiled, timing), twice(reference, timing))
        again = counted(compiled, x)
        assert again.total == first.total
        assert again.by_operator() == first.by_operator()
    assert not priced


@runs_compiled
def test_compiled_child_keeps_the_users_names():
    """A submodule compiled in place (``model.block = torch.compile(block)``) is named as the
    user named it, never ``block._orig_mod``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    eager = counted(copy.deepcopy(model), torch.randn(2, 8))
    model[1] = torch.compile(model[1])
    fc = counted(model, torch.randn(2, 8))
    assert_same_counts(fc, eager)
    assert "1.0" in fc.by_module() and not any("_orig_mod" in n for n in fc.by_module())


@runs_compiled
def test_fullgraph_and_reduce_overhead():
    """``fullgraph=True`` counts as eager, and fails with dynamo's own error on a graph
    break; ``mode="reduce-overhead"`` counts as eager (cudagraphs only apply on CUDA)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    eager = counted(copy.deepcopy(model), x)
    assert_same_counts(counted(torch.compile(model, fullgraph=True), x), eager)
    torch._dynamo.reset()
    assert_same_counts(counted(torch.compile(model, mode="reduce-overhead"), x), eager)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        counted(torch.compile(Broken(), fullgraph=True), torch.randn(4, 8))


@runs_compiled
def test_graphs_outside_a_counter_cost_one_call():
    """Outside a counter a compiled graph runs as the backend returned it; the counter leaves
    no hook, callback or graph state behind."""
    from torch._dynamo.callback import callback_handler

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    compiled = torch.compile(model)
    before = (list(callback_handler.start_callbacks), list(callback_handler.end_callbacks))
    counted(compiled, torch.randn(2, 8))
    assert (list(callback_handler.start_callbacks), list(callback_handler.end_callbacks)) \
        == before
    assert not torch.nn.modules.module._global_forward_pre_hooks
    from dispatch_flops.engine.counting import active
    assert not active.COUNTING


@runs_compiled
def test_graphs_run_with_no_counting_mode_and_other_modes_kept(monkeypatch):
    """While a counted graph runs, forward and compiled backward, the counting modes are off
    the dispatch stack (its extern kernels are priced already, never dispatched to Python
    twice): matmuls never reach the counting mode, yet counts equal eager's. A user's mode
    below the counter and one above it keep seeing those kernels, and the stack is the same
    after the step (and after a graph that raises)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from dispatch_flops.engine.counting import mode as _mode

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    x = torch.randn(4, 8)
    eager = counted(copy.deepcopy(model), x)
    compiled = torch.compile(model)
    counted(compiled, x, counter_model=model)  # compiled, and priced (on fake tensors)

    seen = []
    original = _mode.CountingMode.__torch_dispatch__

    def spy(self, func, types, args=(), kwargs=None):
        seen.append(str(func.overloadpacket))
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(_mode.CountingMode, "__torch_dispatch__", spy)
    below, above = OpLog(), OpLog()
    model.zero_grad(set_to_none=True)
    with below:
        with FlopCounter(model) as fc:
            with above:
                stack = _get_current_dispatch_mode_stack()
                compiled(x).sum().backward()
                assert _get_current_dispatch_mode_stack() == stack
    assert_same_counts(fc, eager)
    assert seen and not {"aten.mm", "aten.addmm"} & set(seen)
    for log in (below, above):
        assert {"aten.mm", "aten.addmm"} <= set(log.ops)

    with FlopCounter(model):
        with above:
            stack = _get_current_dispatch_mode_stack()
            with pytest.raises(RuntimeError):
                compiled(torch.randn(4, 9))  # a shape mismatch inside the compiled code
            assert _get_current_dispatch_mode_stack() == stack


def timed_compiled_step(compiled, model, x, timing=True):
    model.zero_grad(set_to_none=True)
    with FlopCounter(model, timing=timing) as fc:
        compiled(x).sum().backward()
    return fc.to_profile()


@runs_compiled
def test_graph_runs_are_timed_whole_and_fused_modules_have_no_time():
    """With timing on (host clock on the CPU), each compiled graph run is timed whole, forward
    and backward, in the time of the module that ran it (the root here) and in the totals;
    the modules inside the graph have no time of their own: ``latency_s`` None, and the table
    says ``in graph`` instead of a zero. Runs add up over merged steps and survive JSON."""
    from dispatch_flops import Profile
    from dispatch_flops.views.table import IN_GRAPH

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Sequential(nn.Linear(32, 8)))
    x = torch.randn(4, 8)
    compiled = torch.compile(model)
    timed_compiled_step(compiled, model, x)  # compiles and prices
    profile = timed_compiled_step(compiled, model, x)
    (stack, (runs, forward, backward)), = profile.graph_runs.items()
    assert stack == ("",) and runs == 1 and forward > 0 and backward > 0
    assert profile.in_graphs == ("0", "1", "2", "2.0")
    modules = profile.by_module()
    assert modules[""].latency_s >= forward + backward
    assert profile.total.latency_s >= forward + backward
    assert profile.by_phase()["backward"].latency_s >= backward
    for name in profile.in_graphs:
        assert modules[name].latency_s is None and modules[name].flops > 0
    table = profile.table(columns=["flops", "latency"])
    rows = {line.split()[0]: line for line in table.splitlines()[2:7]}
    for name in ("0", "1", "2"):
        assert rows[name].rstrip().endswith(IN_GRAPH), rows[name]
    assert "0 s" not in table.split("Coverage")[0]
    assert "Compiled graphs (torch.compile): 1 run, timed whole" in " ".join(table.split())
    # ops that ran only inside the graph have no time of their own: not among the top ones
    top = dict(profile.top_ops_by_time(50))
    assert top and all(stats.latency_s > 0 for stats in top.values())
    assert "aten.addmm" in profile.by_operator() and "aten.addmm" not in top
    merged = Profile.merge([profile, profile])
    assert merged.graph_runs[("",)][0] == 2 and merged.in_graphs == profile.in_graphs
    again = Profile.from_dict(profile.to_dict())
    assert again.graph_runs == profile.graph_runs and again.in_graphs == profile.in_graphs

    eager = timed_compiled_step(model, model, x)  # the same model run eagerly: times its own
    assert not eager.graph_runs and not eager.in_graphs
    assert eager.by_module()["0"].latency_s > 0 and IN_GRAPH not in eager.table()


@runs_compiled
@pytest.mark.parametrize("timing", ["events", True])
def test_graph_runs_are_timed_by_cuda_events(monkeypatch, timing):
    """On CUDA a graph run is bracketed by the timer's marks (events on the device's current
    stream), not the host clock: with the fake CUDA (one tick per event recorded, nothing
    recorded inside the graph) each of its forward and backward runs takes one tick. So with
    timing=True where Kineto cannot record kernels (this CPU torch has no CUPTI): the
    fallback's module-boundary events."""
    from fake_cuda import TICK_NS, FakeCuda

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    x = torch.randn(4, 8)
    compiled = torch.compile(model)
    timed_compiled_step(compiled, model, x)  # compiled and priced on the real (CPU) torch
    fake = FakeCuda().install(monkeypatch)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "dispatch_flops: kernel timing unavailable")
        profile = timed_compiled_step(compiled, model, x, timing)
    assert profile.graph_runs == {("",): (1, TICK_NS / 1e9, TICK_NS / 1e9)}
    assert fake.records_on(0) > 0


def test_stays_compiled_after_counting():
    """On every torch: a compiled model counted on its first call, or on a later one, runs
    its compiled graph on every call after the counted step (a backend that notes its runs
    says so), with no recompile; the counted step counts what eager counts."""
    from torch._inductor.compile_fx import compile_fx

    runs = []

    def backend(gm, example_inputs):
        compiled = compile_fx(gm, example_inputs)

        def run(*args):
            runs.append(1)
            return compiled(*args)
        return run

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    x = torch.randn(4, 8)
    eager = counted(copy.deepcopy(model), x)
    for counted_first in (True, False):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend)
        if not counted_first:
            compiled(x).sum().backward()
        assert_same_counts(counted(compiled, x), eager)
        before, frames = len(runs), dict(counters["frames"])
        for _ in range(2):
            compiled(x).sum().backward()
        assert len(runs) == before + 2, counted_first
        assert dict(counters["frames"]) == frames or not frames  # compiled once, at most
IMPORT_THEN_COMPILE = """
import importlib.util
import sys
import torch
import dispatch_flops
from dispatch_flops import FlopCounter
print("dynamo imported:", "torch._dynamo" in sys.modules)
importlib.util.find_spec("torch._dynamo")  # a library's availability check imports nothing
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
x = torch.randn(4, 8)
with FlopCounter(model) as eager:
    model(x)
compiled = torch.compile(model)
compiled(x)  # compiled outside any counter, counted on a later call
with FlopCounter(compiled) as fc:
    compiled(x)
print("counts equal:", (fc.total.macs, fc.total.flops) == (eager.total.macs, eager.total.flops))
"""


def test_importing_the_package_does_not_import_dynamo():
    """``import dispatch_flops`` leaves dynamo unimported (seconds of import for a process that
    never compiles), even after a lookup of it that imports nothing; graphs compiled once
    ``torch.compile`` imports it are still counted."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", IMPORT_THEN_COMPILE], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dynamo imported: False" in out.stdout
    assert "counts equal: True" in out.stdout
