"""Optimizer steps counted once, then replayed (engine.counting.step_replay): every figure a
replayed step gives equals what counting it in full gives, and the steps a replay could get
wrong are counted in full."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.engine.counting import step_replay
from dispatch_flops.engine.counting.step_replay import StepReplay


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.LayerNorm(3))


def _figures(fc: FlopCounter) -> tuple:
    """Everything a counter's result says about the step, as plain data."""
    t = fc.total
    by_phase = {k: (v.flops, v.macs, v.bytes_read, v.bytes_written, v.calls)
                for k, v in fc.by_phase().items()}
    by_module = {k: (v.flops, v.calls, v.bytes_read)
                 for k, v in fc.by_module("optimizer").items()}
    records = sorted((r.overload, r.phase, r.module, r.dtype, r.stats)
                     for r in fc.records())
    return (t.flops, t.macs, t.bytes_read, t.bytes_written, t.calls, by_phase, by_module,
            records)


@pytest.fixture
def replays(monkeypatch):
    """The number of steps replayed so far (a list, one entry a replay)."""
    seen: list = []
    add = StepReplay._add

    def counted(self, acc, totals):
        seen.append(len(totals))
        return add(self, acc, totals)

    monkeypatch.setattr(StepReplay, "_add", counted)
    return seen


def _train(make_optimizer, steps: int, fresh: bool, enabled: bool, between=None) -> list:
    """Figures of each step (``fresh``: a counter per step) or of all (one counter), with
    replay on or off; ``between(i, model, optimizer)`` runs before step ``i``."""
    step_replay.ENABLED = enabled
    try:
        model = _model()
        optimizer = make_optimizer(model)
        x = torch.randn(5, 6)
        out = []

        def step(i):
            if between is not None:
                between(i, model, optimizer)
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        if fresh:
            for i in range(steps):
                with FlopCounter(model) as fc:
                    step(i)
                out.append(_figures(fc))
        else:
            with FlopCounter(model) as fc:
                for i in range(steps):
                    step(i)
            out.append(_figures(fc))
        return out
    finally:
        step_replay.ENABLED = True


OPTIMIZERS = {
    "SGD": lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
    "SGD momentum nesterov wd": lambda m: torch.optim.SGD(
        m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "Adam amsgrad": lambda m: torch.optim.Adam(m.parameters(), amsgrad=True, foreach=False),
    "AdamW foreach": lambda m: torch.optim.AdamW(m.parameters(), foreach=True),
    "AdamW loop": lambda m: torch.optim.AdamW(m.parameters(), foreach=False),
    "AdamW fused": lambda m: torch.optim.AdamW(m.parameters(), fused=True),
    "Adagrad": lambda m: torch.optim.Adagrad(m.parameters(), foreach=False),
    "RMSprop centered momentum": lambda m: torch.optim.RMSprop(
        m.parameters(), centered=True, momentum=0.5, foreach=False),
    "Adamax": lambda m: torch.optim.Adamax(m.parameters()),
    "NAdam": lambda m: torch.optim.NAdam(m.parameters(), foreach=False),
    "Adadelta": lambda m: torch.optim.Adadelta(m.parameters()),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("fresh", [True, False], ids=["counter per step", "one counter"])
def test_replayed_steps_count_what_full_counting_counts(name, fresh, replays):
    make = OPTIMIZERS[name]
    full = _train(make, 6, fresh, enabled=False)
    assert not replays
    replayed = _train(make, 6, fresh, enabled=True)
    assert replayed == full
    # learned from two steps alike, after the first has made the optimizer's state (Adagrad
    # makes it in its constructor, plain SGD keeps none: their first two steps are alike)
    assert len(replays) == (4 if name in ("Adagrad", "SGD") else 3)


def test_a_learning_rate_schedule_still_replays(replays):
    """lr changes every step (a float the ops' signatures do not tell apart): the same ops."""
    def make(m):
        optimizer = torch.optim.AdamW(m.parameters(), lr=0.01, foreach=False)
        make.schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1 / (i + 1))
        return optimizer

    def between(i, model, optimizer):
        if i:
            make.schedule.step()

    assert _train(make, 6, True, True, between) == _train(make, 6, True, False, between)
    assert len(replays) == 3


def test_what_the_key_holds_changing_counts_in_full(replays):
    """A parameter with no gradient for a while, weight decay switched on, a learning rate
    that becomes a tensor, a dtype changed: each makes a new key, counted (and learned)
    again before any replay."""
    def between(i, model, optimizer):
        first = model[0]
        first.weight.requires_grad_(not 3 <= i < 6)  # no grad: the step skips it
        if i == 7:
            optimizer.param_groups[0]["weight_decay"] = 0.0
        if i == 10:
            optimizer.param_groups[0]["lr"] = torch.tensor(0.01)

    make = lambda m: torch.optim.AdamW(m.parameters(), foreach=False)  # noqa: E731
    full = _train(make, 13, True, False, between)
    assert _train(make, 13, True, True, between) == full
    # the key changes at steps 1 (state made), 3, 6, 7 and 10: each new key is counted twice
    # before its steps replay (5, 9, 12)
    assert len(replays) == 3


def test_steps_a_replay_could_get_wrong_are_counted_in_full(replays):
    """A subclass (its own step may branch), a step with a closure, RAdam (branches on the
    step number), an optimizer's own pre- or post-hook (its ops run inside the step: one
    that scales the weights every third step counts as in full), timing: counted in full
    every step."""
    class Mine(torch.optim.SGD):
        pass

    def hooked(m):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: None)
        return optimizer

    for make in (lambda m: Mine(m.parameters(), lr=0.1),
                 lambda m: torch.optim.RAdam(m.parameters()), hooked):
        _train(make, 5, True, True)
    assert not replays

    def post_hooked(m):  # torch runs it before the global post-hooks: inside the step
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        steps = []

        def every_third(opt, args, kwargs):
            steps.append(1)
            if len(steps) % 3 == 0:
                with torch.no_grad():
                    for p in m.parameters():
                        p.mul_(0.5)

        optimizer.register_step_post_hook(every_third)
        return optimizer

    assert _train(post_hooked, 7, True, True) == _train(post_hooked, 7, True, False)
    assert not replays

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 6)

    def closure():
        optimizer.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    for _ in range(5):
        with FlopCounter(model):
            optimizer.step(closure)
    for _ in range(5):
        model(x).sum().backward()
        with FlopCounter(model, timing=True) as fc:
            optimizer.step()
        assert fc.by_phase()["optimizer"].calls > 0
    assert not replays


def test_a_step_that_runs_other_ops_is_counted_as_learned_with_a_warning(monkeypatch):
    """If a replayed step's ops differ from the learned ones (a branch on a value the key
    does not hold), the step is counted as learned, a warning names the ops that differ, and
    that optimizer's steps are counted in full from then on."""
    class Branching(torch.optim.SGD):
        calls = 0

        def step(self, closure=None):
            Branching.calls += 1
            out = super().step(closure)
            if Branching.calls >= 5:  # from the fifth step on, one more op
                with torch.no_grad():
                    self.param_groups[0]["params"][0].mul_(1.0)
            return out

    Branching.step = torch.optim.Optimizer.profile_hook_step(Branching.step)
    monkeypatch.setattr(step_replay, "REPLAYED", step_replay.REPLAYED | {Branching})
    model = _model()
    optimizer = Branching(model.parameters(), lr=0.1)
    x = torch.randn(5, 6)
    calls = []
    for i in range(7):
        model(x).sum().backward()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with FlopCounter(model) as fc:
                optimizer.step()
        calls.append(fc.by_phase()["optimizer"].calls)
        named = [str(w.message) for w in caught if "ran other ops" in str(w.message)]
        assert bool(named) == (i == 4), (i, named)
        if named:
            assert "aten.mul_.Tensor 1 calls, learned 0" in named[0]
    # steps 0-1 learn, 2-3 replay, 4 replays with a warning (counted as learned), 5-6 full
    assert calls[4] == calls[3] and calls[5] == calls[6] == calls[3] + 1


def test_a_replayed_step_that_raises_leaves_counting_as_it_was(replays, monkeypatch):
    """A step that raises ends without its post-hook: the replay is abandoned (what it ran is
    not counted), and the ops after it are counted as ever."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(5, 6)
    for _ in range(4):
        model(x).sum().backward()
        with FlopCounter(model):
            optimizer.step()
    assert len(replays) == 1

    from torch.optim import sgd

    real = sgd._single_tensor_sgd

    def failing(*args, **kwargs):
        torch.ones(2).add_(1)  # an op of the step's
        raise RuntimeError("boom")

    model(x).sum().backward()
    with FlopCounter(model) as fc:
        monkeypatch.setattr(sgd, "_single_tensor_sgd", failing)
        with pytest.raises(RuntimeError, match="boom"):
            optimizer.step()
        monkeypatch.setattr(sgd, "_single_tensor_sgd", real)
        y = torch.ones(3) * 2  # after the step: the forward phase, counted
    assert y.sum() == 6
    counted = sorted((r.overload, r.phase, r.stats.calls) for r in fc.records())
    # the step's own ops (ones, add_) went uncounted; what ran before it (the profiler's
    # record_function, which step() enters before its hooks) and after it is counted
    assert counted == [("aten.mul.Tensor", "other", 1), ("aten.ones.default", "other", 1),
                       ("profiler._record_function_enter_new.default", "other", 1)]
    # and the next step replays as before
    model(x).sum().backward()
    with FlopCounter(model) as fc:
        optimizer.step()
    assert len(replays) == 2


def test_nested_counters_each_count_the_steps_as_in_full(replays):
    """Two counters open over the same steps (the inner one fresh each step) both count
    what full counting counts; each replays on its own."""
    def run(enabled: bool) -> list:
        step_replay.ENABLED = enabled
        try:
            model = _model()
            optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
            x = torch.randn(5, 6)
            inner = []
            with FlopCounter(model) as outer:
                for _ in range(6):
                    model(x).sum().backward()
                    with FlopCounter() as fc:
                        optimizer.step()
                    optimizer.zero_grad()
                    inner.append(_figures(fc))
            return [_figures(outer)] + inner
        finally:
            step_replay.ENABLED = True

    full = run(False)
    assert not replays
    assert run(True) == full
    # what is learned is kept per optimizer, for every counter: both learn from steps 0-1 and
    # replay steps 2-5
    assert len(replays) == 8


@pytest.mark.slow
def test_a_compiled_step_counts_what_full_counting_counts(replays):
    """``torch.compile`` of a function calling ``optimizer.step()``: the graph adds its
    counts whole; the replay never adds them again."""
    def run(enabled: bool) -> list:
        step_replay.ENABLED = enabled
        try:
            torch._dynamo.reset()
            model = _model()
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)

            @torch.compile
            def step():
                optimizer.step()

            x = torch.randn(5, 6)
            out = []
            for _ in range(5):
                model(x).sum().backward()
                with FlopCounter(model) as fc:
                    step()
                optimizer.zero_grad()
                out.append(_figures(fc))
            return out
        finally:
            step_replay.ENABLED = True

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no replay warning either
        warnings.filterwarnings("ignore", message=".*record function.*")
        assert run(True) == run(False)
