"""Training steps: backward, optimizer and recompute phases, saved activations, shape-only
counting on meta and under FakeTensorMode."""

import re

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from dispatch_flops import ROOT, FlopCounter
from dispatch_flops.models import Llama, LlamaConfig
from helpers import step, tiny_gpt, tiny_ids


def stacked_linears(widths):
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(a, b) for a, b in zip(widths, widths[1:])))


@pytest.mark.parametrize("input_requires_grad", [False, True])
def test_backward_macs_twice_forward_per_weight_layer(input_requires_grad):
    """Each Linear's backward MACs are 2x its forward MACs (grad input + grad weight), or 1x
    for a first layer whose input needs no gradient; charged to the same modules."""
    model = stacked_linears([8, 16, 12, 4])
    x = torch.randn(5, 8, requires_grad=input_requires_grad)
    with FlopCounter(model) as fc:
        model(x).sum().backward()
    forward, backward = fc.by_module("forward"), fc.by_module("backward")
    for i in range(3):
        name = str(i)
        factor = 1 if i == 0 and not input_requires_grad else 2
        assert forward[name].macs == 5 * model[i].in_features * model[i].out_features
        assert backward[name].macs == factor * forward[name].macs, name


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Stack(nn.Module):
    def __init__(self, d=16, n=3, mode=None):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.mode = mode  # None, "reentrant" or "non-reentrant": checkpoint each block

    def forward(self, x):
        for block in self.blocks:
            if self.mode is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.mode == "reentrant")
        return x


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_checkpointing_adds_exactly_the_recomputed_forward(mode):
    """Same model flops with and without checkpointing; hardware flops differ by exactly the
    recomputed forward, charged to the checkpointed modules in phase recompute."""
    x = torch.randn(4, 16)
    with FlopCounter(plain := Stack()) as base:
        plain(x.requires_grad_()).sum().backward()
    # recompute all of each block, not only up to the last tensor backward needs; a fresh
    # leaf, or its gradient would be accumulated into the first run's
    with set_checkpoint_early_stop(False), FlopCounter(ck := Stack(mode=mode)) as fc:
        ck(x.detach().requires_grad_()).sum().backward()
    assert fc.model_flops() == base.model_flops()
    recompute = fc.by_phase()["recompute"]
    assert recompute.macs == base.by_phase()["forward"].macs > 0
    # the loss's sum (outside the model) is other: hardware flops, not model flops
    assert fc.hardware_flops() - fc.model_flops() == recompute.flops + fc.by_phase()["other"].flops
    by_module = fc.by_module("recompute")
    forward = base.by_module("forward")
    for i in range(3):
        for name in (f"blocks.{i}", f"blocks.{i}.a", f"blocks.{i}.b"):
            assert by_module[name].macs == forward[name].macs, name
    assert fc.by_module("forward")["blocks.0"].calls == 1  # recompute adds no forward call
    d = fc.to_dict()
    assert (d["model_flops"], d["hardware_flops"]) == (fc.model_flops(), fc.hardware_flops())
    assert d["by_phase"]["recompute"]["macs"] == recompute.macs


def test_optimizer_steps_counted_in_their_phase():
    """Ops inside optimizer.step() land in phase optimizer at the documented per-element
    cost (formulas/costs.py): AdamW = adam_step + 1 (decoupled weight decay) per parameter
    element plus 1 per tensor (its step count), the same for foreach, loop and fused; SGD
    with momentum = sgd_step + 2 once the buffer exists. The hooks are gone afterwards; only
    the profiler's record_function enter/exit, which step() runs around its hooks, stay out."""
    from torch.optim.optimizer import (
        _global_optimizer_post_hooks,
        _global_optimizer_pre_hooks,
    )

    from dispatch_flops.formulas import ELEMENT_COSTS

    adamw = lambda n, tensors: (ELEMENT_COSTS["adam_step"] + 1) * n + tensors  # noqa: E731
    sgd = lambda n, tensors: (ELEMENT_COSTS["sgd_step"] + 2) * n  # noqa: E731
    for make, cost in ((lambda p: torch.optim.AdamW(p, foreach=True), adamw),
                       (lambda p: torch.optim.AdamW(p, foreach=False), adamw),
                       (lambda p: torch.optim.AdamW(p, fused=True), adamw),
                       (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), sgd)):
        model = stacked_linears([8, 8, 4])
        opt = make(model.parameters())
        for _ in range(2):  # the second step: optimizer state exists
            model(torch.randn(3, 8)).sum().backward()
            with FlopCounter(model) as fc:
                opt.step()
        phases = fc.by_phase()
        n = sum(p.numel() for p in model.parameters())
        assert phases["optimizer"].flops == cost(n, len(list(model.parameters())))
        assert phases["optimizer"].bytes_written > 0
        outside = {r.operator for r in fc.records() if r.phase != "optimizer"}
        assert outside <= {"profiler._record_function_enter_new", "profiler._record_function_exit"}
        assert not fc.unsupported_ops()
    assert not _global_optimizer_pre_hooks and not _global_optimizer_post_hooks


def test_saved_activations_of_an_mlp_equal_a_hand_count():
    """Linear -> ReLU -> Linear saves x (for the first weight's gradient) and the ReLU's output
    (for ReLU's and the second Linear's backward, one storage counted once); weights are
    parameters and do not count."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(5, 8)
    with FlopCounter(model, saved_activations=True) as fc:
        model(x).sum().backward()
    modules = fc.by_module()
    assert modules["0"].saved_bytes == x.nbytes
    assert modules["1"].saved_bytes == 5 * 32 * 4
    assert modules["2"].saved_bytes == 0  # its input is ReLU's output, already counted
    assert modules[ROOT].saved_bytes == x.nbytes + 5 * 32 * 4
    assert "Saved" in fc.table(width=1000)
    with FlopCounter(model) as off:
        model(x)
    assert off.by_module()[ROOT].saved_bytes is None and "Saved" not in off.table(width=1000)


def test_saved_activations_drop_where_checkpointed():
    x = torch.randn(4, 16, requires_grad=True)
    with FlopCounter(plain := Stack(), saved_activations=True) as base:
        plain(x).sum().backward()
    with FlopCounter(ck := Stack(mode="non-reentrant"), saved_activations=True) as fc:
        ck(x).sum().backward()
    assert fc.by_module()["blocks.1"].saved_bytes == 0 < base.by_module()["blocks.1"].saved_bytes


def test_shape_only_counting_on_meta_equals_real_counts():
    """A model built on meta, with meta inputs, forward + backward: the same counts as on
    real tensors."""
    cfg = LlamaConfig()
    torch.manual_seed(0)
    real = Llama(cfg)
    with torch.device("meta"):
        meta = Llama(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    counts = []
    for model, inputs in ((real, idx), (meta, idx.to("meta"))):
        with FlopCounter(model) as fc:
            model(inputs).sum().backward()
        counts.append({n: (m.flops, m.macs) for n, m in fc.by_module().items()})
    # attention runs the fused kernel on CPU and its math decomposition on meta: every
    # module that does not hold attention agrees to the flop
    holds_attention = re.compile(r"^(|layers|layers\.\d+|layers\.\d+\.attn)$")
    same = [n for n in counts[0] if not holds_attention.match(n)]
    assert len(same) > 10 and set(counts[0]) == set(counts[1])
    for name in same:
        assert counts[0][name] == counts[1][name], name


def test_shape_only_counting_under_fake_tensor_mode():
    with FakeTensorMode():
        model = tiny_gpt()
        with FlopCounter(model) as fake:
            step(model, tiny_ids())
    model = tiny_gpt()
    with FlopCounter(model) as real:
        step(model, tiny_ids())
    assert fake.by_phase()["forward"].macs == real.by_phase()["forward"].macs
    assert fake.by_module()["lm_head"].macs == real.by_module()["lm_head"].macs


def test_meta_runner_changes_nothing_but_speed(monkeypatch):
    """On meta, functional ops are run once per signature: every count, and the output's
    shape, strides and dtype, equal those of running every op."""
    from dispatch_flops import counter

    cfg = LlamaConfig(n_layer=3)
    with torch.device("meta"):
        model = Llama(cfg)
    idx = torch.zeros(2, 16, dtype=torch.long, device="meta")
    results = []
    for cached in (True, False):
        monkeypatch.setattr(counter.FlopCounter, "_on_meta", lambda self, c=cached: c)
        with FlopCounter(model) as fc:
            out = model(idx)
            out.sum().backward()
        model.zero_grad(set_to_none=True)
        results.append((fc.records(), out.shape, out.stride(), out.dtype, fc._mode.runner))
    (cached_records, *cached_out, runner), (plain_records, *plain_out, none) = results
    assert cached_records == plain_records and cached_out == plain_out and none is None
    assert 0 < len(runner._outputs) < sum(r.stats.calls for r in cached_records)


def test_meta_runner_runs_mutating_aliasing_and_real_ops_for_real():
    from types import SimpleNamespace

    from dispatch_flops.engine.counting.meta import MetaRunner

    class Runner(MetaRunner):  # the mode hands runners its resolution of the op
        def run(self, op, args, kwargs):
            return super().run(SimpleNamespace(func=op, run=op), args, kwargs)

    runner = Runner()
    a, b = torch.empty(4, 3, device="meta"), torch.empty(4, 3, device="meta").t().t()
    first, _ = runner.run(torch.ops.aten.add.Tensor, (a, b), {})
    second, _ = runner.run(torch.ops.aten.add.Tensor, (a, b), {})
    assert second is not first and (second.shape, second.stride(), second.dtype) == (
        first.shape, first.stride(), first.dtype)
    assert len(runner._outputs) == 1
    inplace, _ = runner.run(torch.ops.aten.add_.Tensor, (a, b), {})
    view, _ = runner.run(torch.ops.aten.t.default, (a,), {})
    assert inplace is a and view._base is a
    real, _ = runner.run(torch.ops.aten.add.Tensor, (torch.ones(2), torch.ones(2)), {})
    assert torch.equal(real, torch.full((2,), 2.0)) and len(runner._outputs) == 1


def test_ops_returning_nothing_write_what_they_mutate():
    """_foreach_add_ returns None: it writes its first list and reads both."""
    a, b, c, d = torch.randn(3, 4), torch.randn(5), torch.randn(3, 4), torch.randn(5)
    with FlopCounter() as fc:
        torch._foreach_add_([a, b], [c, d])
    stats = fc.by_operator()["aten._foreach_add_"]
    assert stats.bytes_written == a.nbytes + b.nbytes
    assert stats.bytes_read == a.nbytes + b.nbytes + c.nbytes + d.nbytes
    assert stats.flops == a.numel() + b.numel()


def test_meta_runner_keeps_dtypes_and_devices():
    """Counting a meta model: scalar types and the default dtype still set the output dtype,
    and a factory asked for the CPU still makes a CPU tensor."""
    with torch.device("meta"):
        model = nn.Linear(4, 4)
    with FlopCounter(model) as fc:
        ints = torch.full((10,), 1, device="meta")
        floats = torch.full((10,), 1.0, device="meta")
        flags = torch.full((10,), True, device="meta")
        first, second = torch.zeros(3), torch.zeros(3)
        ranges = torch.arange(5, device="meta"), torch.arange(5.0, device="meta")
    assert fc._mode.runner is not None
    assert (ints.dtype, floats.dtype, flags.dtype) == (torch.int64, torch.float32, torch.bool)
    assert first.device.type == second.device.type == "cpu"
    assert [r.dtype for r in ranges] == [torch.int64, torch.float32]


class Gated(nn.Module):
    """A block whose checkpointed function runs ops between its modules."""

    def __init__(self, d=16, mode=None):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)
        self.mode = mode

    def inner(self, x):
        return self.b(torch.tanh(self.a(x)) * 3.0)

    def forward(self, x):
        if self.mode is None:
            return self.inner(x)
        return checkpoint(self.inner, x, use_reentrant=self.mode == "reentrant")


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_recompute_includes_ops_between_modules(mode):
    """tanh and the scaling between the checkpointed modules are recompute of the enclosing
    module, not backward: model flops equal the plain model's, recompute the forward's."""
    x = torch.randn(4, 16)
    with FlopCounter(plain := Gated()) as base:
        plain(x.requires_grad_()).sum().backward()
    with set_checkpoint_early_stop(False), FlopCounter(ck := Gated(mode=mode)) as fc:
        ck(x.detach().requires_grad_()).sum().backward()
    assert fc.model_flops() == base.model_flops()
    assert "aten.sum" in base.by_operator("other")  # the loss: outside the model
    assert fc.by_phase()["recompute"].flops == base.by_phase()["forward"].flops > 0
    recompute, forward = fc.by_module("recompute"), base.by_module("forward")
    for name in ("a", "b"):
        assert recompute[name].flops == forward[name].flops, name
    own = {r.operator for r in fc.records() if r.phase == "recompute" and r.module == ""}
    assert {"aten.tanh", "aten.mul"} <= own


def test_module_called_inside_a_step_keeps_the_optimizer_phase():
    """A module run inside optimizer.step() (an EMA model) counts in phase optimizer, under
    that module, and the step's own ops after it stay in that phase."""
    model = stacked_linears([4, 4, 2])

    class Probing(torch.optim.SGD):
        @torch.no_grad()
        def step(self, closure=None):
            model[0](torch.ones(2, 4))
            return super().step(closure)

    opt = Probing(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    with FlopCounter(model) as fc:
        opt.step()
    outside = {r.operator for r in fc.records() if r.phase != "optimizer"}
    assert outside <= {"profiler._record_function_enter_new", "profiler._record_function_exit"}
    assert fc.by_module("optimizer")["0"].exclusive.macs == 2 * 4 * 4
    n = sum(p.numel() for p in model.parameters())
    assert fc.by_module("optimizer")[ROOT].exclusive.flops >= 2 * n  # SGD after the call


def test_an_optimizer_closure_is_the_training_step():
    """What a closure passed to optimizer.step() runs (LBFGS, Lightning's automatic
    optimization) is forward, backward and other, as without the closure; only the update
    is optimizer."""
    x = torch.randn(3, 4)

    def run(with_closure: bool):
        model = stacked_linears([4, 4, 2])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def closure():
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            return loss

        with FlopCounter(model) as fc:
            if with_closure:
                opt.step(closure)
            else:
                closure()
                opt.step()
        return fc

    plain, closed = run(False), run(True)
    for phase in ("forward", "backward", "other", "optimizer"):
        assert closed.by_phase()[phase].flops == plain.by_phase()[phase].flops, phase
    assert closed.model_flops() == plain.model_flops() > 0
