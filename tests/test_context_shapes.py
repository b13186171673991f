"""Where a counter is entered and what runs beside it never changes what it counts: context
managers (``@contextmanager``, ``@asynccontextmanager``, ExitStack, a class's ``__aenter__``,
a pytest yield fixture) count the caller's block; a generator or coroutine that yields
mid-block counts only its own work; another thread's optimizer steps, a step that raises and
a counter exited in the wrong thread leave every count where it belongs."""

import asyncio
import contextlib
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.checkpoint import checkpoint

from dispatch_flops import FlopCounter, Phase
from strategies import context_runs


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))


X = torch.randn(4, 8)


def once(model) -> int:
    with FlopCounter(model) as fc:
        model(X)
    return fc.total.flops


def phases(fc) -> dict:
    return {phase: stats.flops for phase, stats in fc.by_phase().items() if stats.flops}


# ---- a counter entered in a context manager counts the caller's block -----------------------


@contextlib.contextmanager
def profiled(model, **options):
    with FlopCounter(model, **options) as fc:
        yield fc


@contextlib.asynccontextmanager
async def profiled_async(model, **options):
    with FlopCounter(model, **options) as fc:
        yield fc


def test_a_counter_entered_in_a_contextmanager_counts_the_callers_block():
    model = net()
    one = once(model)
    with profiled(model) as fc:
        model(X)
    with contextlib.ExitStack() as stack:
        stacked = stack.enter_context(profiled(model))
        model(X)
        model(X)

    @contextlib.contextmanager
    def outer():  # a context manager around one: still the caller's block
        with profiled(model) as inner:
            yield inner

    with outer() as nested:
        model(X)

    @profiled(model)
    def decorated():
        model(X)

    decorated()
    assert fc.total.flops == one and stacked.total.flops == 2 * one
    assert nested.total.flops == one and fc.by_module()[""].calls == 1


def test_a_contextmanager_inside_a_generator_counts_only_while_the_generator_runs():
    """The block is the generator's (the with statement's frame): what its consumer runs while
    it is suspended is not counted."""
    model = net()
    one = once(model)

    def steps():
        with profiled(model) as fc:
            model(X)
            yield
            model(X)
            yield fc

    gen = steps()
    next(gen)
    model(X)  # the consumer, while the generator is suspended
    fc = next(gen)
    assert fc.total.flops == 2 * one


def test_asynccontextmanagers_in_concurrent_tasks_each_count_their_block():
    model = net()
    one = once(model)

    async def task(n):
        async with profiled_async(model) as fc:
            for _ in range(n):
                model(X)
                await asyncio.sleep(0)  # the other task runs here: not this block
        return fc

    async def both():
        return await asyncio.gather(task(2), task(3))

    two, three = asyncio.run(both())
    assert two.total.flops == 2 * one and three.total.flops == 3 * one


def test_a_counter_entered_in_a_classes_aenter_counts_the_async_with_block():
    model = net()
    one = once(model)

    class Profiled:
        async def __aenter__(self):
            self.fc = FlopCounter(model).__enter__()
            return self.fc

        async def __aexit__(self, *exc):
            self.fc.__exit__(*exc)

    async def task():
        async with Profiled() as fc:
            model(X)
            await asyncio.sleep(0)
            model(X)
        return fc

    assert asyncio.run(task()).total.flops == 2 * one


@pytest.fixture
def counted_net():
    model = net()
    with FlopCounter(model) as fc:
        yield model, fc


def test_a_counter_entered_in_a_yield_fixture_counts_the_test(counted_net):
    model, fc = counted_net
    model(X)
    so_far = fc.total.flops  # the counts so far: the test's
    assert so_far == once(net())


# ---- optimizer steps: other threads', and steps that raise ----------------------------------


class Paused(torch.optim.SGD):
    """An SGD step that waits, once begun, until told to go on."""

    def __init__(self, params):
        super().__init__(params, lr=0.1)
        self.begun, self.go = threading.Event(), threading.Event()

    def step(self, closure=None):
        self.begun.set()
        assert self.go.wait(30)
        return super().step(closure)


def test_another_threads_optimizer_step_leaves_this_counters_phases_alone():
    model, other = net(), net()
    other(X).sum().backward()
    opt = Paused(other.parameters())
    stepping = threading.Thread(target=opt.step)
    with FlopCounter(model) as fc:
        stepping.start()
        try:
            assert opt.begun.wait(30)
            model(X)  # while the other thread's step runs
        finally:
            opt.go.set()
            stepping.join(30)
        model(X)
    assert phases(fc) == {Phase.FORWARD: 2 * once(model)}


class Failing(torch.optim.SGD):
    """An SGD step that raises after updating the parameters."""

    def step(self, closure=None):
        super().step(closure)
        raise FloatingPointError("the loss went to nan")


@pytest.mark.parametrize("with_model", [True, False])
def test_an_optimizer_step_that_raises_ends_the_optimizer_phase(with_model):
    model = net()
    model(X).sum().backward()
    with FlopCounter(model) as clean:
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    stepped = clean.total.flops
    opt = Failing(model.parameters(), lr=0.1)
    refusing = torch.optim.SGD(model.parameters(), lr=0.1)

    def refuse(*_):
        raise RuntimeError("no step now")

    refusing.register_step_pre_hook(refuse)  # runs after the counter's: no step, no post-hook
    with FlopCounter(model if with_model else None) as fc:
        for failing in (opt, refusing):
            with pytest.raises((FloatingPointError, RuntimeError)):
                failing.step()
            X @ X.T  # no module runs: the next op notices the step is over
            assert not fc._mode.state.stepping  # later ops: the plain path
            model(X)
    outside = 2 * (2 * 4 * 4 * 8)  # X @ X.T twice, outside the model
    expected = {Phase.OPTIMIZER: stepped, Phase.FORWARD: 2 * once(model)}  # one step ran
    if with_model:
        expected[Phase.OTHER] = outside
    else:
        expected[Phase.FORWARD] += outside
    assert phases(fc) == expected


def test_a_closure_that_raises_inside_a_step_leaves_no_phase_behind():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure():
        loss = model(X).sum()
        loss.backward()
        raise ValueError("bad batch")

    with FlopCounter(model) as fc:
        with pytest.raises(ValueError):
            opt.step(closure)
        model(X)
    model.zero_grad(set_to_none=True)  # the first backward again: no gradient to add to
    with FlopCounter(model) as clean:
        model(X).sum().backward()
        model(X)
    assert phases(fc) == phases(clean)


# ---- a counter exited in another thread -----------------------------------------------------


def test_a_counter_exited_in_another_thread_says_so_and_counts_on():
    model = net()
    one = once(model)
    fc = FlopCounter(model).__enter__()
    model(X)
    errors = []

    def exit_here():
        try:
            fc.__exit__(None, None, None)
        except RuntimeError as e:
            errors.append(str(e))

    thread = threading.Thread(target=exit_here)
    thread.start()
    thread.join(30)
    assert len(errors) == 1 and "exit it in the thread that entered it" in errors[0]
    with FlopCounter(model) as later:  # inside the first, still open here: counted once
        model(X)
    assert later.total.flops == one
    fc.__exit__(None, None, None)
    assert fc.total.flops == 2 * one and _get_current_dispatch_mode_stack() == []
    with FlopCounter(model) as after:
        model(X)
    assert after.total.flops == one


# ---- every context shape counts what a plain with block counts ------------------------------


class Raiser(nn.Module):
    """Raises in forward when armed."""

    armed = False

    def forward(self, x):
        x = x * 2
        if self.armed:
            raise ValueError("forward")
        return x


class Interruptible(nn.Linear):
    """A linear layer that asks ``interrupt()`` when it is recomputed (in backward), which
    raises a KeyboardInterrupt when it should stop the recomputation (before the layer's ops:
    non-reentrant checkpointing stops by itself once what backward needs is back)."""

    def __init__(self, interrupt):
        super().__init__(8, 8)
        self.interrupt = interrupt

    def forward(self, x):
        if torch._C._current_autograd_node() is not None:
            self.interrupt()
        return super().forward(x)


class Recomputed(nn.Module):
    """``Interruptible`` run under activation checkpointing."""

    def __init__(self, interrupt, reentrant=False):
        super().__init__()
        self.inner = Interruptible(interrupt)
        self.reentrant = reentrant

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
def test_an_interrupted_recomputation_ends_the_recompute_phase(reentrant):
    """torch runs no always-call hook for a BaseException: the recomputation it ends is over
    at the next op or module call all the same."""
    armed = []

    def interrupt():
        if armed:
            raise KeyboardInterrupt

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Recomputed(interrupt, reentrant))
    x = X.clone().requires_grad_(True) if reentrant else X  # reentrant: an input that needs grad
    with FlopCounter(model) as clean:
        model(x)
    with FlopCounter(model) as fc:
        out = model(x)
        armed.append(True)
        with pytest.raises(KeyboardInterrupt):
            out.sum().backward()
        armed.clear()
        X @ X.T  # no module runs: the op itself notices
        model(x)
    assert fc.by_phase()[Phase.FORWARD].flops == 2 * clean.total.flops
    assert fc.by_phase()[Phase.OTHER].flops == 2 * 4 * 4 * 8 + 4 * 8  # X @ X.T, the sum
    assert fc.by_phase()[Phase.RECOMPUTE].flops == 0  # interrupted before its first op
    assert fc.by_module()["1.inner"].calls == 2


class World:
    """A model and optimizers, with a fault armed at each kind of hook on demand; ``run``
    runs one piece of work (see ``strategies.CONTEXT_PIECES``) with its fault caught."""

    def __init__(self):
        self.armed: tuple = ()  # (thread, piece): the noise of another thread never raises
        torch.manual_seed(0)
        self.model = nn.Sequential(
            nn.Linear(8, 8), Raiser(), nn.Linear(8, 8),
            Recomputed(lambda: self._fault("recompute_interrupted", KeyboardInterrupt)))
        self.model(X).sum().backward()  # every step finds gradients
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.failing = Failing(self.model.parameters(), lr=0.01)
        self.refusing = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.model[0].register_forward_hook(lambda *_: self._fault("post_hook_raises"))
        self.model[2].register_forward_pre_hook(lambda *_: self._fault("pre_hook_raises"))
        self.refusing.register_step_pre_hook(lambda *_: self._fault("step_refused"))
        # what runs beside the block (the consumer of a generator, another task or thread)
        self.noise = nn.Sequential(nn.Linear(8, 8))
        self.noise_opt = torch.optim.SGD(self.noise.parameters(), lr=0.01)

    def _fault(self, name, error=ValueError):
        if self.armed == (threading.get_ident(), name):
            raise error(name)

    def run(self, piece: str) -> None:
        model = self.model
        self.armed = (threading.get_ident(), piece)
        model[1].armed = piece == "forward_raises"
        try:
            if piece in ("forward", "forward_raises", "pre_hook_raises", "post_hook_raises"):
                model(X)
            elif piece == "train":
                model(X).sum().backward()
            elif piece == "recompute_interrupted":
                model(X).sum().backward()
            elif piece == "backward_raises":
                out = model(X)
                out.register_hook(lambda _: self._fault("backward_raises"))
                (out * 3).sum().backward()
            elif piece == "step":
                self.opt.step()
            elif piece == "step_raises":
                self.failing.step()
            elif piece == "step_refused":
                self.refusing.step()
            elif piece == "closure_step":
                self.opt.step(lambda: model(X).sum().backward())
            elif piece == "outside":
                X @ X.T
        except (ValueError, FloatingPointError, KeyboardInterrupt):
            pass
        finally:
            self.armed = ()
            model[1].armed = False

    def noisy(self) -> None:
        """Work that is not the block's: the model's forward and another model's step."""
        self.model[0](X)
        self.noise(X).sum().backward()
        self.noise_opt.step()


class Escape(Exception):
    """Ends a block by an exception."""


def shaped(shape: str, world: World, pieces: list, escape: bool, options: dict):
    """Run ``pieces`` in a counter on ``world.model`` entered in ``shape``, with unrelated work
    running beside it where the shape allows; the counter."""
    found = []

    def block(fc):
        found.append(fc)
        for piece in pieces:
            world.run(piece)
        if escape:
            raise Escape

    def plain():
        with FlopCounter(world.model, **options) as fc:
            block(fc)

    def generator():
        with FlopCounter(world.model, **options) as fc:
            found.append(fc)
            for piece in pieces:
                world.run(piece)
                yield  # the consumer runs other work here
            if escape:
                raise Escape

    async def coroutine(under_cm: bool):
        if under_cm:
            async with profiled_async(world.model, **options) as fc:
                found.append(fc)
                for piece in pieces:
                    world.run(piece)
                    await asyncio.sleep(0)
                if escape:
                    raise Escape
        else:
            with FlopCounter(world.model, **options) as fc:
                found.append(fc)
                for piece in pieces:
                    world.run(piece)
                    await asyncio.sleep(0)
                if escape:
                    raise Escape

    async def beside(main):
        done = False

        async def other():
            while not done:
                world.noisy()
                await asyncio.sleep(0)

        noise = asyncio.ensure_future(other())
        try:
            await main
        finally:
            done = True
            await noise

    with contextlib.suppress(Escape):
        if shape == "plain":
            plain()
        elif shape == "contextmanager":
            with profiled(world.model, **options) as fc:
                block(fc)
        elif shape == "exitstack":
            with contextlib.ExitStack() as stack:
                block(stack.enter_context(profiled(world.model, **options)))
        elif shape == "generator":
            for _ in generator():
                world.noisy()
        elif shape in ("coroutine", "asynccontextmanager"):
            asyncio.run(beside(coroutine(shape == "asynccontextmanager")))
        elif shape == "thread":
            errors = []

            def worker():
                try:
                    plain()
                except Escape:
                    pass
                except BaseException as e:  # the test fails on it below
                    errors.append(e)

            thread = threading.Thread(target=worker)
            thread.start()
            while thread.is_alive():
                world.noisy()
            thread.join()
            assert not errors, errors
    (fc,) = found
    return fc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(context_runs())
def test_every_context_shape_counts_what_each_piece_counts_alone(run):
    """Counted in any context shape, with faults raised (and caught) at every kind of hook,
    a block's flops by phase, and each module's flops and calls, are the sums of its pieces'
    counted one by one, each in a plain with block of its own."""
    shape, pieces, escape, options = run
    world = World()
    expected: dict = {}
    modules: dict = {}
    for piece in pieces:
        with FlopCounter(world.model, **options) as alone:
            world.run(piece)
        for phase, flops in phases(alone).items():
            expected[phase] = expected.get(phase, 0) + flops
        for name, stats in alone.by_module().items():
            flops, calls = modules.get(name, (0, 0))
            modules[name] = (flops + stats.flops, calls + stats.calls)
    fc = shaped(shape, world, pieces, escape, options)
    assert phases(fc) == expected
    assert {name: (s.flops, s.calls) for name, s in fc.by_module().items()} == modules
    assert _get_current_dispatch_mode_stack() == []
