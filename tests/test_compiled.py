"""torch.compile under the counter: compiled models are counted as they run compiled, equal to
eager's counts of the same model, and stay compiled after a counted step (pytorch#190286).

Real inductor compiles on CPU: each test compiles a small model once and reuses it."""

import copy

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

from dispatch_flops import FlopCounter
from dispatch_flops._compiled import has_ignore_compile_internals

from helpers import tiny_gpt, tiny_ids

pytestmark = pytest.mark.skipif(not has_ignore_compile_internals(),
                                reason="torch without ignore_compile_internals")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


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
    for name, stats in theirs.items():
        assert ours[name].exclusive.macs == stats.exclusive.macs, name
        assert ours[name].exclusive.flops == stats.exclusive.flops, name
        if exact_bytes:
            assert ours[name].inclusive.bytes_read == stats.inclusive.bytes_read, name
        else:  # a graph's incoming gradient priced contiguous-or-expanded, not as it came
            assert abs(ours[name].inclusive.bytes_read - stats.inclusive.bytes_read) <= \
                0.1 * stats.inclusive.bytes_read, name


class OpLog(TorchDispatchMode):
    """The aten ops that reach the dispatcher (compiled code runs under it, as ours does)."""

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


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
    from dispatch_flops import _compiled
    assert not _compiled.ACTIVE
