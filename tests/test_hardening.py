"""Misuse and unusual input never crash a run, leak, or count wrong in silence: long training
loops, other threads, counters exited out of order or held by suspended generators and
coroutines, interrupted modules, sparse / nested / symbolic tensors, formulas that fail."""

import asyncio
import contextlib
import json
import threading
import tracemalloc
import warnings

import pytest
import torch
from torch import nn

from dispatch_flops import Cost, FlopCounter, Profile, register_formula
from dispatch_flops.formulas import Registry


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))


X = torch.randn(4, 8)


def one_call(model=None) -> int:
    model = model or net()
    with FlopCounter(model) as fc:
        model(X)
    return fc.total.flops


# ---- memory over a training run -------------------------------------------------------------

OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
    "Adam": lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-3),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01),
    "Adadelta": lambda p: torch.optim.Adadelta(p),
    "Adamax": lambda p: torch.optim.Adamax(p),
    "ASGD": lambda p: torch.optim.ASGD(p),
    "NAdam": lambda p: torch.optim.NAdam(p),
    "RAdam": lambda p: torch.optim.RAdam(p),
    "RMSprop": lambda p: torch.optim.RMSprop(p, momentum=0.9, centered=True),
    "Rprop": lambda p: torch.optim.Rprop(p),
    "Adafactor": lambda p: torch.optim.Adafactor(p),
}


def records_in(fc) -> int:
    """Op records a counter holds (not public: the quantity that must not grow)."""
    return len(fc._tracker.ledger.records)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_no_optimizer_or_scheduler_grows_a_counter_kept_open(name):
    """Step sizes and learning rates change every step; the signatures must not."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    opt = OPTIMIZERS[name](model.parameters())
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=500,
                                                cycle_momentum=False)
    with FlopCounter(model) as fc:
        seen = []
        for i in range(60):
            model(X).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            if i in (9, 59):
                seen.append(records_in(fc))
    assert seen[0] == seen[1]


@pytest.mark.slow
def test_a_thousand_adamw_steps_in_bounded_memory():
    """1,000 steps with one counter open (AdamW and a cosine schedule, the reported case):
    from step 100 to step 1,000 Python memory grows no more than the same loop's without a
    counter (torch itself keeps a few dozen bytes a step in this loop) plus 32 KiB."""

    def growth(counter) -> tuple:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
        tracemalloc.start()
        try:
            with counter(model) as fc:
                for i in range(1000):
                    model(X).sum().backward()
                    opt.step()
                    opt.zero_grad()
                    sched.step()
                    if i == 99:
                        early = tracemalloc.get_traced_memory()[0]
                        records = records_in(fc) if fc is not None else None
                late = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        return late - early, records, fc

    eager, _, _ = growth(lambda model: contextlib.nullcontext())
    counted, records, fc = growth(FlopCounter)
    assert records_in(fc) == records
    assert counted < eager + 32 * 1024, (eager, counted)


# ---- threads and control flow ---------------------------------------------------------------


def test_another_thread_calling_the_model_is_not_counted():
    model, once = net(), None
    once = one_call(model)
    stop = threading.Event()

    def other():
        while not stop.is_set():
            model(X)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        with FlopCounter(model) as fc:
            for _ in range(40):
                model(X)
    finally:
        stop.set()
        thread.join(timeout=30)
    modules = fc.by_module()
    assert modules["0"].calls == modules["2"].calls == 40 and modules[""].calls == 40
    assert fc.total.flops == 40 * once
    assert all(len(r.stack) <= 2 for r in fc.records())  # never an impossible stack


def test_counters_exited_out_of_order_each_count_their_block():
    model = net()
    once = one_call(model)
    a, b = FlopCounter(model), FlopCounter(model)
    a.__enter__()
    model(X)
    b.__enter__()
    model(X)
    a.__exit__(None, None, None)  # before b: a stops counting here, b goes on
    model(X)
    b.__exit__(None, None, None)
    assert a.total.flops == 2 * once and b.total.flops == 2 * once
    from torch.utils._python_dispatch import (
        _get_current_dispatch_mode_stack,
        is_in_torch_dispatch_mode,
    )
    assert _get_current_dispatch_mode_stack() == [] and not is_in_torch_dispatch_mode()
    assert one_call(model) == once


def test_counters_in_concurrent_asyncio_tasks():
    model = net()
    once = one_call(model)

    async def task(n):
        with FlopCounter(model) as fc:
            for _ in range(n):
                model(X)
                await asyncio.sleep(0)  # the other task runs here, under this mode too
        return fc

    async def both():
        return await asyncio.gather(task(2), task(3))

    two, three = asyncio.run(both())
    assert two.total.flops == 2 * once and three.total.flops == 3 * once
    assert two.by_module()["0"].calls == 2 and three.by_module()["0"].calls == 3


def test_a_suspended_generator_holding_a_counter():
    model = net()
    once = one_call(model)

    def steps():
        with FlopCounter(model) as fc:
            model(X)
            yield
            model(X)
            yield fc

    gen = steps()
    next(gen)
    for _ in range(3):  # runs while the generator is suspended: not its block
        model(X)
    fc = next(gen)
    assert fc.total.flops == 2 * once and fc.by_module()[""].calls == 2


def test_keyboard_interrupt_caught_in_the_block_leaves_attribution_right():
    """torch skips always-call hooks for a BaseException that is not an Exception."""

    class Interrupt(nn.Module):
        fire = False

        def forward(self, x):
            if self.fire:
                raise KeyboardInterrupt
            return x

    model = nn.Sequential(nn.Linear(8, 8), Interrupt(), nn.Linear(8, 8))
    with FlopCounter(model) as clean:
        model(X)
    with FlopCounter(model) as fc:
        model[1].fire = True
        with pytest.raises(KeyboardInterrupt):
            model(X)
        model[1].fire = False
        model[2](X)  # a module outside the interrupted one, called directly: not inside it
        model(X)
        model(X)
    modules, once = fc.by_module(), clean.by_module()
    assert modules[""].calls == 3 and modules["0"].calls == 3 and modules["2"].calls == 3
    assert modules["2"].flops == 3 * once["2"].flops and modules["1"].flops == 0
    assert modules[""].flops == 3 * once["0"].flops + 3 * once["2"].flops
    assert all(r.stack in {("",), ("", "0"), ("", "1"), ("", "2")} for r in fc.records())


# ---- tensor kinds ---------------------------------------------------------------------------

SPARSE = {
    "coo": lambda d: d.to_sparse(),
    "csr": lambda d: d.to_sparse_csr(),
    "csc": lambda d: d.to_sparse_csc(),
    "bsr": lambda d: d.to_sparse_bsr((4, 4)),
}


def _stored(t):
    """(values, index tensors) of a sparse tensor, read without the counter."""
    if t.layout is torch.sparse_coo:
        return t._values(), [t._indices()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return t.values(), [t.crow_indices(), t.col_indices()]
    return t.values(), [t.ccol_indices(), t.row_indices()]


@pytest.mark.parametrize("layout", sorted(SPARSE))
def test_sparse_matmul_is_priced_by_stored_values(layout):
    torch.manual_seed(0)
    dense = torch.randn(16, 12)
    dense[torch.rand(16, 12) < 0.7] = 0  # about 30 % stored (whole zero 4x4 blocks are rare)
    a = SPARSE[layout](dense)
    b = torch.randn(12, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: sparse CSR/CSC/BSR support is in beta
        with FlopCounter() as fc:
            out = a @ b
    assert torch.allclose(out, dense @ b, atol=1e-5)
    values, indices = _stored(a)
    matmuls = {op: s for op, s in fc.by_operator().items() if s.macs}
    assert sum(s.macs for s in matmuls.values()) == values.numel() * 5  # each value meets a row
    assert fc.unsupported_ops() == {}
    stored = values.nbytes + sum(i.nbytes for i in indices)
    (stats,) = matmuls.values()
    assert stats.bytes_read == stored + b.nbytes + (out.nbytes if stats.calls and
                                                    "addmm" in next(iter(matmuls)) else 0)


def test_sparse_elementwise_never_crashes_and_is_not_priced_dense():
    a = torch.randn(20, 30).relu().to_sparse()
    with FlopCounter() as fc:
        (a + a).coalesce()
        torch.sparse.sum(a)
    assert "aten.add" in fc.unsupported_ops()  # its formula would price the dense shape
    values, indices = a._values(), a._indices()
    add = fc.by_operator()["aten.add"]
    assert add.bytes_read == 2 * (values.nbytes + indices.nbytes)
    fc.table()


def test_symbolic_sizes_count_by_their_hints():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    def work(x, w):
        return (x @ w).relu().sum()

    fake = FakeTensorMode(shape_env=ShapeEnv())
    x = fake.from_tensor(torch.randn(6, 8), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]))
    w = fake.from_tensor(torch.randn(8, 16))
    assert isinstance(x.shape[0], torch.SymInt)
    with fake, FlopCounter() as symbolic:
        work(x, w)
    real = torch.randn(6, 8), torch.randn(8, 16)
    with FlopCounter() as concrete:
        work(*real)
    assert symbolic.by_operator() == concrete.by_operator()
    assert symbolic.unsupported_ops() == {}


@pytest.mark.parametrize("layout", ["jagged", "strided"])
def test_nested_tensors_never_crash_and_are_priced_per_sequence(layout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: the strided layout is a prototype
        nt = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)],
                                        layout=getattr(torch, layout))
        with FlopCounter() as fc:
            (nt * 2).sum() if layout == "jagged" else nt * 2
    assert "aten.mul" not in fc.unsupported_ops()
    assert fc.by_operator()["aten.mul"].flops == 8 * 8  # one per element of the 8 rows
    assert fc.by_operator()["aten.mul"].bytes_read >= 8 * 8 * 4  # the 8 rows it holds
    fc.table(), fc.to_dict()


# ---- formulas the user registers ------------------------------------------------------------


def test_formulas_are_checked_when_registered():
    reg = Registry()
    with pytest.raises(TypeError, match="function"):
        reg.formula(torch.ops.aten.cos)(42)
    with pytest.raises(TypeError, match="out_shape"):
        reg.formula(torch.ops.aten.cos)(lambda x: Cost(1))
    reg.formula(torch.ops.aten.cos)(lambda x, *, out_shape: Cost(1))  # fits the contract
    with pytest.raises(ValueError, match="override=True"):
        register_formula(torch.ops.aten.mm.default)(lambda a, b, *, out_shape: Cost(0))


# what a broken formula returns: not a Cost, or a Cost that is not of integers >= 0
BROKEN = {"none": None, "str": "7", "tuple": (3, 1), "negative": Cost(-1),
          "nan": Cost(float("nan")), "float": Cost(2.5), "raise": ZeroDivisionError}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_failing_formula_loses_nothing_else(broken):
    reg = Registry()
    reg.formula(torch.ops.aten.mm)(lambda a, b, *, out_shape: Cost(2 * a[0] * a[1] * b[1],
                                                                   a[0] * a[1] * b[1]))

    def bad(x, *, out_shape):
        if BROKEN[broken] is ZeroDivisionError:
            raise ZeroDivisionError("bad formula")
        return BROKEN[broken]

    reg.formula(torch.ops.aten.cos)(bad)
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with pytest.warns(RuntimeWarning, match="aten.cos"):
        with FlopCounter(registry=reg) as fc:
            (a @ b).cos()
            (a @ b).cos()
        total = fc.total
    assert fc.by_operator()["aten.mm"].macs == 2 * 3 * 4 * 5
    assert fc.unsupported_ops() == {"aten.cos": 2}
    assert fc.by_operator()["aten.cos"].bytes_read == 2 * 15 * 4  # bytes still counted
    (error,) = fc.to_profile().run.pricing_errors
    assert "aten.cos.default" in error and "(3, 5)" in error
    assert "Not priced" in fc.table()
    assert total.flops == 2 * 2 * 3 * 4 * 5


def test_numpy_integers_are_counts():
    np = pytest.importorskip("numpy")
    reg = Registry()
    reg.formula(torch.ops.aten.cos)(lambda x, *, out_shape: Cost(np.int64(x[0]), np.int32(0)))
    x = torch.randn(7)
    with FlopCounter(registry=reg) as fc:
        x.cos()
    assert fc.total.flops == 7 and fc.unsupported_ops() == {}


# ---- files ----------------------------------------------------------------------------------


def test_a_run_that_cannot_be_written_leaves_the_old_file(tmp_path, monkeypatch):
    with FlopCounter(net()) as fc:
        net()(X)
    path = tmp_path / "run.json"
    fc.to_json(path)
    good = path.read_text()
    import dispatch_flops.results.profile as profile_module

    monkeypatch.setattr(profile_module.Profile, "to_dict",
                        lambda self: {"x": object()})  # not serialisable
    with pytest.raises(TypeError):
        fc.to_profile().to_json(path)
    assert path.read_text() == good and [p.name for p in tmp_path.iterdir()] == ["run.json"]


@pytest.mark.parametrize("damage", ["records", "modules", "model", "stats", "calls", "stack"])
def test_from_json_names_what_is_missing_or_mistyped(tmp_path, damage):
    with FlopCounter(net()) as fc:
        net()(X)
    data = fc.to_dict()
    if damage in ("records", "modules", "model"):
        del data[damage]
    elif damage == "stats":
        del data["records"][0]["stats"]["flops"]
    elif damage == "calls":
        data["records"][0]["stats"]["calls"] = "three"
    else:
        data["records"][0]["stack"] = "0"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    word = {"stats": "flops", "calls": "calls", "stack": "stack"}.get(damage, damage)
    with pytest.raises(ValueError, match=word):
        Profile.from_json(path)


# ---- hooks the user owns --------------------------------------------------------------------


class CountingHooks(torch.autograd.graph.saved_tensors_hooks):
    """The user's own saved-tensors hooks (as save_on_cpu): they wrap what they pack."""

    def __init__(self):
        self.packed = self.unpacked = 0

        def pack(t):
            self.packed += 1
            return ("mine", t)

        def unpack(box):
            assert box[0] == "mine"
            self.unpacked += 1
            return box[1]

        super().__init__(pack, unpack)


def _saved_run(model, where: str):
    hooks = CountingHooks()
    x = torch.randn(4, 8, requires_grad=True)
    if where == "outside":
        with hooks, FlopCounter(model, saved_activations=True) as fc:
            model(x).sum().backward()
    elif where == "inside":
        with FlopCounter(model, saved_activations=True) as fc, hooks:
            model(x).sum().backward()
    else:
        with FlopCounter(model, saved_activations=True) as fc:
            model(x).sum().backward()
    return fc, hooks


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_users_saved_tensors_hooks_keep_working_with_saved_activations(where):
    """Offloading hooks (save_on_cpu) entered before the counter, or inside its block, are
    still called, and the counter still sees what is saved."""
    model = net()
    plain, _ = _saved_run(model, "none")
    fc, hooks = _saved_run(model, where)
    assert hooks.packed > 0 and hooks.unpacked == hooks.packed
    assert fc.by_module()[""].saved_bytes == plain.by_module()[""].saved_bytes > 0
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
