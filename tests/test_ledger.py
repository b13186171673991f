"""Counters entered one after another on the same model share its ledger of frames and
records (see ``_tracker.Ledger``); each must still read exactly its own block. And the
counting mode, which skips torch's per-op dynamo wrapper, must stay invisible to torch.compile.
"""

import copy
import gc

import pytest
import torch
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.engine.counting.records import engine_cache
from dispatch_flops.formulas import REGISTRY, Registry
from helpers import tiny_gpt, tiny_ids


class _first:
    """A counter that finds no ledger (it counts a copy of the model, which has none): what
    any counter would report with no history. Run the block on ``.model``."""

    def __init__(self, model, **kwargs):
        self.model = copy.deepcopy(model)
        self.counter = FlopCounter(self.model, **kwargs)

    def __enter__(self):
        return self.counter.__enter__()

    def __exit__(self, *exc):
        return self.counter.__exit__(*exc)


def _assert_next_counter_reads_right(model, x):
    """The next counter on ``model`` reports a forward exactly as one with no history."""
    with FlopCounter(model) as later:
        model(x)
    first = _first(model)
    with first as check:
        first.model(x)
    assert later.to_dict() == check.to_dict()


def step(model, idx):
    """One forward + backward from no gradients: the same ops every time."""
    model.zero_grad(set_to_none=True)
    model(idx).sum().backward()


def test_each_counter_reads_only_its_own_block():
    """Later counters on the same model give what a first counter gives for the same work,
    and an earlier counter's results do not move when later ones count."""
    model, idx = tiny_gpt(), tiny_ids()
    fresh = _first(model)
    with fresh as alone:
        step(fresh.model, idx)
    first = []
    for _ in range(3):
        with FlopCounter(model) as fc:
            step(model, idx)
        first.append(fc)
    with FlopCounter(model) as forward_only:
        model(idx)
    assert first[0].to_dict() == alone.to_dict()
    for fc in first:
        assert fc.total == first[0].total
        assert fc.by_module() == first[0].by_module()
        assert fc.records() == first[0].records()
    assert first[0].records() and set(first[0].by_phase()) == set(alone.by_phase())
    # the forward-only block: no backward, and just one call of each module
    phases = forward_only.by_phase()
    assert phases["backward"].calls == 0
    block = forward_only.by_module()["blocks.0"]
    assert block.calls == 1
    assert block.inclusive == first[0].by_module(phase="forward")["blocks.0"].inclusive


def test_results_match_a_counter_with_its_own_ledger():
    """The shared ledger changes nothing a report shows: same figures as a private one."""
    model, idx = tiny_gpt(), tiny_ids()
    with FlopCounter(model):  # the ledger now has history, other shapes among it
        step(model, idx)
        model(tiny_ids(1, 4))
    with FlopCounter(model) as shared:
        step(model, idx)
    fresh = _first(model)
    with fresh as private:
        step(fresh.model, idx)
    assert shared.total == private.total
    assert shared.by_module() == private.by_module()
    assert shared.table() == private.table()
    assert shared.to_dict() == private.to_dict()


def test_modules_run_only_before_are_not_reported():
    """A module that ran under an earlier counter, not this one, is absent from its report."""

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x, use_b):
            x = self.a(x)
            return self.b(x) if use_b else x

    model, x = Two(), torch.randn(2, 4)
    with FlopCounter(model) as both:
        model(x, True)
    with FlopCounter(model) as only_a:
        model(x, False)
    assert set(both.by_module()) == {"", "a", "b"}
    assert set(only_a.by_module()) == {"", "a"}
    assert only_a.total.macs == 2 * 4 * 4
    assert both.total.macs == 2 * 2 * 4 * 4  # unchanged by the later counter


def test_reading_while_counting_then_after():
    model, idx = tiny_gpt(), tiny_ids()
    with FlopCounter(model):
        step(model, idx)
    with FlopCounter(model) as fc:
        model(idx)
        during = fc.total
        step(model, idx)
    assert during.flops and fc.total.flops > during.flops
    fresh = _first(model)
    with fresh as check:
        fresh.model(idx)
        step(fresh.model, idx)
    assert fc.to_dict() == check.to_dict()


def test_a_counter_read_late_reports_its_own_run():
    """A counter's counts stay in the ledger until read or until the next counter on the
    model needs it; what it reports is still its own block, and the model as it was then."""
    model, idx = tiny_gpt(), tiny_ids()
    with FlopCounter(model) as first:
        step(model, idx)
    model.double()  # no counter since: the first is read from the ledger as it was left
    assert first.to_profile().run.dtype == "float32"
    model.float()
    with FlopCounter(model) as early:
        step(model, idx)
    unread_flops = []
    for _ in range(2):  # later counters, one dropped unread: the ledger is handed on
        with FlopCounter(model) as later:
            model(idx)
        unread_flops.append(later.total.flops if not unread_flops else None)
        del later
    model.double()  # after the blocks: the profile still says what ran
    with FlopCounter(model) as doubled:
        step(model, idx.clone())
    assert early.to_profile().run.dtype == "float32"  # read while the model is float64
    assert doubled.to_profile().run.dtype == "float64"
    fresh = _first(model.float())
    with fresh as check:
        step(fresh.model, idx)
    assert early.to_dict() == check.to_dict() == first.to_dict()
    assert doubled.total.flops == early.total.flops > unread_flops[0] > 0


def test_nested_counters_on_one_model_count_apart():
    """Both count every op of the inner block: the inner one cannot share the outer's ledger."""
    model, idx = tiny_gpt(), tiny_ids()
    with FlopCounter(model) as outer:
        model(idx)
        with FlopCounter(model) as inner:
            model(idx)
    assert outer.total.flops == 2 * inner.total.flops
    assert outer.by_module()["blocks.0"].calls == 2 and inner.by_module()["blocks.0"].calls == 1
    with FlopCounter(model) as after:  # the outer's ledger is free again
        model(idx)
    assert after.total == inner.total


def test_a_block_that_raises_frees_the_ledger():
    model, idx = tiny_gpt(), tiny_ids()
    with pytest.raises(ValueError):
        with FlopCounter(model):
            model(idx)
            raise ValueError
    assert not any(ledger.busy for _, ledger in engine_cache(REGISTRY).ledgers.values())
    _assert_next_counter_reads_right(model, idx)


def test_ledger_goes_with_its_model_and_a_registry_change():
    registry = Registry()
    model = nn.Linear(3, 3)
    with FlopCounter(model, registry=registry):
        model(torch.randn(1, 3))
    ledgers = engine_cache(registry).ledgers
    assert len(ledgers) == 1
    del model
    gc.collect()
    assert not ledgers  # nothing kept for a model that is gone
    model = nn.Linear(3, 3)
    with FlopCounter(model, registry=registry):
        model(torch.randn(1, 3))
    assert engine_cache(registry).ledgers is ledgers
    registry.formula(torch.ops.aten.cos)(lambda a, *, out_shape: None)  # any change
    assert not engine_cache(registry).ledgers  # a new cache: the formula is seen


@pytest.mark.slow
def test_torch_compile_never_traces_the_counter():
    """torch.compile inside the block compiles the user's code, none of our frames (as with
    torch's own wrapper: no graph break but the user's), and counts what eager counts."""
    from torch._dynamo.utils import counters

    def fn(x):
        y = x.cos()
        torch._dynamo.graph_break()
        return (y @ y.T).exp()

    x = torch.randn(4, 4)
    with FlopCounter() as eager:
        fn(x)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, backend="eager")
    with FlopCounter() as fc:
        compiled(x)
    assert counters["frames"]["ok"] == 2  # compiled, not skipped (pytorch#190286)
    assert len(counters["graph_break"]) == 1  # the user's
    assert fc.total == eager.total
    assert fc.by_operator()["aten.mm"].macs == 4 * 4 * 4


def test_one_counter_for_a_long_run_keeps_a_window_of_boundaries(monkeypatch):
    """Module boundaries (for attributing backward ops) are kept in a window, so a counter
    left open across a training run stays small; a window as long as one step changes
    nothing."""
    from dispatch_flops.engine.counting import tracker as _tracker

    model, idx = tiny_gpt(), tiny_ids()
    with FlopCounter(model) as one:
        step(model, idx)
    per_step = len(one._tracker.state.boundary_frames) - 1
    monkeypatch.setattr(_tracker, "BOUNDARY_WINDOW", per_step)
    with FlopCounter(model) as five:
        for _ in range(5):
            step(model, idx)
    assert len(five._tracker.state.boundary_frames) <= 2 * per_step + 1
    for name, stats in one.by_module().items():
        assert five.by_module()[name].inclusive.flops == 5 * stats.inclusive.flops
        assert five.by_module()[name].exclusive.macs == 5 * stats.exclusive.macs


def test_ops_priced_as_they_run_keep_their_figures_in_every_counter():
    """An op whose signature cannot be hashed (a symbolic size among its arguments) is priced
    as it runs; later counters on the ledger still see its flops and bytes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    fake = FakeTensorMode(shape_env=ShapeEnv())
    x = fake.from_tensor(torch.randn(4, 8), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]))
    size = x.shape[0]  # a SymInt

    class Scale(nn.Module):
        def forward(self, y):
            return y.mul(size)

    model = nn.Sequential(Scale())
    with fake:
        y = torch.empty(4, 8)
    seen = []
    for _ in range(3):
        with fake, FlopCounter(model) as fc:
            model(y)
        seen.append(fc.by_operator()["aten.mul"])
    assert seen[0].calls == 1 and seen[0].flops == 4 * 8
    assert seen[0].bytes_read == seen[0].bytes_written == 4 * 8 * 4
    assert seen[1] == seen[0] and seen[2] == seen[0]


def test_counters_left_out_of_order_leave_later_counters_right():
    """Leaving an outer counter before its inner one (torch then pops the inner's mode and
    the outer's goes on counting) neither breaks the step nor leaks into later counters."""
    model, x = nn.Sequential(nn.Linear(8, 8)), torch.randn(4, 8)
    outer, inner = FlopCounter(model), FlopCounter(model)
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    model(x).sum().backward()
    inner.__exit__(None, None, None)
    assert outer.total.calls == 0  # nothing ran while it was open
    _assert_next_counter_reads_right(model, x)


def test_timed_counters_share_the_ledger_and_time_only_their_block():
    """CPU timing lands in the ledger as it runs, so timed counters share it too; each one's
    op and module times come from its own block: never more than its wall time."""
    model, idx = tiny_gpt(), tiny_ids()
    with FlopCounter(model, timing=True) as long:
        for _ in range(3):
            step(model, idx)
    with FlopCounter(model, timing=True) as short:
        step(model, idx)
    assert short._tracker.ledger is long._tracker.ledger
    for fc in (long, short):
        assert 0 < fc.total.latency_s <= fc.wall_s
        block = fc.by_module()["blocks.0"]
        assert 0 < block.inclusive.latency_s <= fc.wall_s
    assert short.total.calls * 3 == long.total.calls
    with FlopCounter(model, trace=True) as traced:  # a trace keeps a ledger of its own
        step(model, idx)
    assert traced._tracker.ledger is not long._tracker.ledger
