"""FlopCounter: attribution, phases, bytes, registry, and leaving the user's things as they were."""

import gc
import json
import weakref

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn.modules import module as module_globals
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _get_current_dispatch_mode_stack,
)

from dispatch_flops import ROOT, Cost, FlopCounter, Stats, has_formula, register_formula
from dispatch_flops.formulas import Registry
from helpers import TINY, tiny_gpt


def run_gpt(model, backward=True):
    idx = torch.randint(0, TINY.vocab_size, (2, 8))
    out = model(idx)
    if backward:
        out.sum().backward()
    return out


def _sum(stats):
    return sum(stats, Stats())


# ---- invariants ----------------------------------------------------------------------------


@pytest.mark.parametrize("phase", [None, "forward", "backward"])
def test_attribution_invariants(phase):
    """Root inclusive == total; exclusive values sum to the total; children <= parent."""
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        run_gpt(model)
    modules = fc.by_module(phase=phase)
    total = fc.total if phase is None else fc.by_phase()[phase]
    root = modules[ROOT]
    assert root.inclusive == total
    assert _sum(m.exclusive for m in modules.values()) == total
    assert total.macs > 0
    for name, m in modules.items():
        children = [c for c in modules.values()
                    if c.name.rsplit(".", 1)[0] == name and "." in c.name
                    or (name == ROOT and c.name and "." not in c.name)]
        for field in ("flops", "macs", "bytes_read", "bytes_written", "calls"):
            assert sum(getattr(c.inclusive, field) for c in children) <= getattr(m.inclusive, field)


def test_functionals_count_toward_enclosing_module():
    """F.scaled_dot_product_attention, @ and einsum inside forward go to the module."""

    class Inner(nn.Module):
        def forward(self, x):
            a = F.scaled_dot_product_attention(x, x, x)
            return torch.einsum("bhsd,bhtd->bhst", a, x) @ x

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x) * 2

    model = Outer()
    x = torch.randn(1, 2, 4, 8)
    with FlopCounter(model) as fc:
        model(x)
    inner = fc.by_module()["inner"]
    expected_macs = 2 * 4 * 4 * 16 + 2 * 4 * 4 * 8 + 2 * 4 * 4 * 8  # sdpa + einsum + matmul
    assert inner.exclusive.macs == inner.macs == expected_macs == fc.total.macs
    assert fc.by_module()[ROOT].exclusive.macs == 0


def test_reused_module_accumulates_calls_without_double_counting():
    """A module called three times has calls == 3 and its parent counts each op once."""

    class Reuse(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(self.lin(self.lin(x)))

    model = Reuse()
    with FlopCounter(model) as fc:
        model(torch.randn(3, 4))
    lin = fc.by_module()["lin"]
    assert lin.calls == 3
    assert lin.macs == 3 * 3 * 4 * 4
    assert fc.by_module()[ROOT].macs == lin.macs == fc.total.macs


def test_shared_module_and_reentry_counted_once_in_ancestors():
    """A module shared by two parents, and a module that calls itself, are credited once per
    op to each running ancestor."""

    class Recursive(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, depth=2):
            x = self.lin(x)
            return self(x, depth - 1) if depth else x

    shared = nn.Linear(4, 4)
    model = nn.Sequential(nn.Sequential(shared), nn.Sequential(shared), Recursive())
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    m = fc.by_module()
    per_linear = 2 * 4 * 4
    assert m["0.0"].calls == 2 and m["0.0"].macs == 2 * per_linear
    assert m["0"].macs == m["1"].macs == per_linear
    assert m["2"].calls == 3 and m["2"].macs == 3 * per_linear
    assert m[ROOT].macs == 5 * per_linear == fc.total.macs


def test_no_model_charges_everything_to_root():
    """Without a model, by_module() holds ROOT only, with everything."""
    with FlopCounter() as fc:
        torch.randn(3, 4) @ torch.randn(4, 5)
    assert list(fc.by_module()) == [ROOT]
    assert fc.by_module()[ROOT].inclusive == fc.total
    assert fc.total.macs == 60
    assert "global" in fc.table()


# ---- backward ------------------------------------------------------------------------------


def test_backward_attributed_to_creating_module_even_without_input_grad():
    """Backward ops go to the module whose forward created them; the first layer's weight
    gradient counts even though its input does not require grad."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(5, 8)  # requires_grad=False
    with FlopCounter(model) as fc:
        model(x).sum().backward()
    fwd, bwd = fc.by_module(phase="forward"), fc.by_module(phase="backward")
    assert bwd["0"].macs == 5 * 8 * 16  # weight gradient only: no input gradient needed
    assert bwd["2"].macs == 2 * fwd["2"].macs  # weight and input gradients
    assert fc.by_phase()["backward"].macs == bwd["0"].macs + bwd["2"].macs
    # the loss's .sum() runs after the model returned: phase other, forward and backward
    assert {r.phase for r in fc.records()} == {"forward", "backward", "other"}
    assert {r.operator for r in fc.records() if r.phase == "other"} >= {"aten.sum"}


def test_backward_outside_counter_forward_inside():
    """Backward run after the block is not counted; backward inside with forward outside goes
    to the root."""
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    loss = model(x).sum()
    with FlopCounter(model) as fc:
        loss.backward()
    # only the gradient seed (ones_like, made before the engine starts) is outside a node
    assert fc.by_phase()["forward"].macs == 0
    assert fc.by_module(phase="backward")[ROOT].macs == fc.by_phase()["backward"].macs > 0


# ---- bytes ---------------------------------------------------------------------------------


@given(st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
       st.integers(1, 6), st.integers(1, 6))
def test_bytes_follow_dtype_and_real_elements(dtype, m, n):
    """bytes_read counts an expanded input's real elements at its dtype size; views move 0."""
    a = torch.randn(m, 1, dtype=dtype).expand(m, n)  # real elements: m
    b = torch.randn(n, n, dtype=dtype)
    size = torch.finfo(dtype).bits // 8
    with FlopCounter() as fc:
        out = torch.mm(a, b)
        out.view(-1).t()
    mm = fc.by_operator()["aten.mm"]
    assert mm.bytes_read == (m + n * n) * size
    assert mm.bytes_written == m * n * size
    for op in ("aten.view", "aten.t"):
        assert fc.by_operator()[op].bytes_read == fc.by_operator()[op].bytes_written == 0


def test_out_and_inplace_variants():
    """out= tensors are written, not read; in-place ops read and write self."""
    a, b, out = torch.randn(3, 4), torch.randn(4, 5), torch.empty(3, 5)
    with FlopCounter() as fc:
        torch.mm(a, b, out=out)
    mm = fc.by_operator()["aten.mm"]
    assert (mm.bytes_read, mm.bytes_written, mm.macs) == ((12 + 20) * 4, 15 * 4, 60)
    with FlopCounter() as fc:
        out.zero_()
    assert fc.by_operator()["aten.zero_"].bytes_read == 0
    assert fc.by_operator()["aten.zero_"].bytes_written == 60


# ---- registry ------------------------------------------------------------------------------


@torch.library.custom_op("dispatch_flops_test::unpriced", mutates_args=())
def unpriced(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_unknown_op_is_reported_not_zeroed():
    """An op without a formula or a tag estimate shows up in unsupported_ops() with its call
    count, and its bytes are still counted."""
    x = torch.randn(4)
    with FlopCounter() as fc:
        unpriced(unpriced(x))
    assert fc.unsupported_ops() == {"dispatch_flops_test.unpriced": 2}
    assert fc.by_operator()["dispatch_flops_test.unpriced"].bytes_read == 2 * 16
    assert "dispatch_flops_test.unpriced x2" in fc.table()
    assert not has_formula(torch.ops.dispatch_flops_test.unpriced)
    assert has_formula(torch.ops.aten.mm) and has_formula(torch.ops.aten.view.default)


def test_an_op_this_torch_lacks_is_a_name_that_is_never_met():
    """Formula modules read ops through ``namespace``: one the running torch lacks (a newer
    op on an older torch) is its qualified name, one per overload, so registering it does
    not raise at import and prices nothing; ops torch has are the ops themselves."""
    from dispatch_flops.formulas._registry import namespace

    aten = namespace("aten")
    assert aten.mm is torch.ops.aten.mm and aten.mm.default is torch.ops.aten.mm.default
    default, out = aten.no_such_op_in_torch.default, aten.no_such_op_in_torch.out
    assert (default, out) == ("aten::no_such_op_in_torch.default", "aten::no_such_op_in_torch.out")
    reg = Registry()
    reg.formula([default, out])(lambda *a, out_shape, **k: Cost(5))  # two names: no clash
    reg.formula(aten.sin)(lambda *a, out_shape, **k: Cost(1))
    x = torch.randn(3)
    with FlopCounter(registry=reg) as fc:
        x.sin()
    assert fc.total.flops == 1 and not fc.unsupported_ops()
    with pytest.raises(AttributeError):
        aten.__no_such_dunder__  # noqa: B018 - the lookup itself is what raises
    # the formula modules' lists of ops keep only those this torch has
    assert aten.present(["mm", "no_such_op_in_torch", "sin_"]) == [torch.ops.aten.mm,
                                                                    torch.ops.aten.sin_]
    from dispatch_flops.formulas import REGISTRY
    from dispatch_flops.formulas._registry import _Missing
    # the built-in library registers no name for an op this torch has not got (its filters
    # ask torch itself); a missing op is only ever an op of a newer torch
    assert not [op for op in REGISTRY._named if isinstance(op, _Missing)]


def test_registry_duplicates_and_overrides():
    """Registering twice raises unless override=True; an overload override wins its packet."""
    reg = Registry()
    reg.formula(torch.ops.aten.cos)(lambda *a, out_shape, **k: Cost(1))
    with pytest.raises(ValueError, match="override=True"):
        reg.formula(torch.ops.aten.cos)(lambda *a, out_shape, **k: Cost(2))
    reg.formula(torch.ops.aten.cos, override=True)(lambda *a, out_shape, **k: Cost(3))
    with pytest.raises(ValueError, match="override=True"):  # it would shadow the packet's
        reg.formula(torch.ops.aten.cos.out)(lambda *a, out_shape, **k: Cost(7))
    reg.formula(torch.ops.aten.cos.out, override=True)(lambda *a, out_shape, **k: Cost(7))
    with FlopCounter(registry=reg) as fc:
        x = torch.randn(2)
        x.cos()
        torch.cos(x, out=torch.empty(2))
    assert fc.total.flops == 3 + 7
    with pytest.raises(TypeError, match="OpOverload"):
        reg.formula("aten.cos")


def test_custom_op_end_to_end():
    """A torch.library custom op is priced by a registered formula, inside a module."""

    @torch.library.custom_op("dispatch_flops_test::scaled_mm3", mutates_args=())
    def scaled_mm3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 3 * (a @ b)

    @scaled_mm3.register_fake
    def _(a, b):
        return a.new_empty(a.shape[0], b.shape[1])

    @register_formula(torch.ops.dispatch_flops_test.scaled_mm3)
    def _formula(a, b, *, out_shape):
        m, k = a
        n = b[1]
        return Cost(flops=2 * m * k * n + m * n, macs=m * k * n)

    class UsesIt(nn.Module):
        def forward(self, a, b):
            return scaled_mm3(a, b)

    model = nn.Sequential(UsesIt())
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with FlopCounter(model) as fc:
        model[0](a, b)
    op = fc.by_operator()["dispatch_flops_test.scaled_mm3"]
    assert (op.macs, op.flops) == (60, 135)
    assert fc.by_module()["0"].exclusive.macs == 60
    assert fc.unsupported_ops() == {}  # the op's own kernel runs below the mode
    with pytest.raises(ValueError, match="already registered"):
        register_formula(torch.ops.dispatch_flops_test.scaled_mm3)(_formula)
    # the CustomOpDef itself is accepted too (it names the op's overload, which the packet's
    # formula already prices: replacing it takes override=True)
    register_formula(scaled_mm3, override=True)(lambda a, b, *, out_shape: Cost(1, 0))
    with FlopCounter() as fc:
        scaled_mm3(a, b)
    assert fc.total.flops == 1


# ---- leaving things as they were -----------------------------------------------------------


def test_outputs_bit_identical_and_nothing_left_behind():
    """Same outputs and gradients as without the counter; hooks, modes, training flag restored."""
    model = tiny_gpt().eval()
    idx = torch.randint(0, TINY.vocab_size, (2, 8))
    ref = model(idx)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    hooks_before = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]
    global_before = (len(module_globals._global_forward_pre_hooks),
                     len(module_globals._global_forward_hooks))
    with FlopCounter(model) as fc:
        out = model(idx)
        out.sum().backward()
    assert torch.equal(out, ref)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), ref_grads))
    hooks_after = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]
    assert hooks_after == hooks_before
    assert (len(module_globals._global_forward_pre_hooks),
            len(module_globals._global_forward_hooks)) == global_before
    assert not model.training
    assert not any(isinstance(m, TorchDispatchMode) for m in _get_current_dispatch_mode_stack())
    assert fc.total.flops > 0


def test_exception_inside_block_cleans_up():
    """An exception in forward leaves no hook or mode behind and propagates unchanged."""

    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            self.lin(x)
            raise KeyError("boom")

    model = Boom()
    with pytest.raises(KeyError, match="boom"):
        with FlopCounter(model):
            model(torch.randn(1, 2))
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert not module_globals._global_forward_pre_hooks
    assert not module_globals._global_forward_hooks
    assert _get_current_dispatch_mode_stack() == []


def test_no_tensor_kept_alive():
    """Neither the counter nor its results keep an input or output alive."""
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    with FlopCounter(model) as fc:
        y = model(x)
        y.sum().backward()
    refs = [weakref.ref(x), weakref.ref(y)]
    del x, y
    gc.collect()
    fc.to_dict()
    assert all(r() is None for r in refs)


def test_nested_counters_both_count():
    """An inner counter sees its block; the outer sees everything, both attribute."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with FlopCounter(model) as outer:
        model(torch.randn(1, 4))
        with FlopCounter(model) as inner:
            model(torch.randn(1, 4))
    assert inner.total.macs == 32
    assert outer.total.macs == 64
    assert outer.by_module()["1"].calls == 2 and inner.by_module()["1"].calls == 1
    with pytest.raises(RuntimeError, match="already counting"):
        with inner:
            with inner:
                pass


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="dense"):
        FlopCounter(attention="sparse")
    with pytest.raises(TypeError, match="nn.Module"):
        FlopCounter(model="gpt")
    fc = FlopCounter()
    with pytest.raises(ValueError, match="forward"):
        fc.by_module(phase="fwd")
    with pytest.raises(ValueError, match="depth"):
        fc.table(depth=-1)


# ---- report --------------------------------------------------------------------------------


def test_table_and_dict_agree_with_results():
    """The table lists modules in tree order with units; to_dict() survives JSON."""
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        run_gpt(model)
    table = fc.table(depth=2)
    assert table.splitlines()[2].startswith("GPT")
    labels = [line.split("  ")[0] for line in table.splitlines()[2:]]
    # each module named from the row above it in the tree, indented by depth
    assert labels[:4] == ["GPT", "wte", "wpe", "blocks"]
    assert labels.index("· 0") < labels.index("· 1") < labels.index("lm_head")
    assert "· · attn" not in table and "· · attn" in fc.table(depth=3)
    assert str(fc) == table
    data = json.loads(json.dumps(fc.to_dict()))
    assert data["total"]["macs"] == fc.total.macs
    assert data["by_module"]["blocks.0"]["inclusive"]["flops"] == fc.by_module()["blocks.0"].flops
    assert sum(r["stats"]["flops"] for r in data["records"]) == fc.total.flops


def test_formula_registered_later_is_seen_by_next_counter():
    """Resolutions are cached across counters, but a registration empties that cache."""
    reg = Registry()
    x = torch.randn(3)
    with FlopCounter(registry=reg) as before:
        x.sin()
    assert before.unsupported_ops() == {"aten.sin": 1}
    reg.formula(torch.ops.aten.sin)(lambda x, *, out_shape: Cost(4 * x[0]))
    with FlopCounter(registry=reg) as after:
        x.sin()
    assert after.unsupported_ops() == {} and after.total.flops == 12


def test_signatures_tell_scalar_types_and_default_dtype_apart():
    """1, 1.0 and True are equal dict keys but give int64, float32 and bool outputs; the
    default dtype also sets a factory's output. Bytes written follow the real output, in
    one counter and in a later one sharing the signature cache."""
    with FlopCounter() as fc:
        a, b, c = (torch.full((1000,), v) for v in (1, 1.0, True))
    assert fc.by_operator()["aten.full"].bytes_written == a.nbytes + b.nbytes + c.nbytes
    with FlopCounter() as later:
        b = torch.full((1000,), 1.0)
    assert later.total.bytes_written == b.nbytes == 4000
    previous = torch.get_default_dtype()
    with FlopCounter() as fc:
        x = torch.zeros(1000)
        torch.set_default_dtype(torch.float64)
        try:
            y = torch.zeros(1000)
        finally:
            torch.set_default_dtype(previous)
    assert fc.total.bytes_written == x.nbytes + y.nbytes == 12000


def test_category_is_the_one_counted_under():
    """An op counted without a formula stays unsupported when a formula is registered
    before the results are read: never labelled exact with zero flops."""
    registry = Registry()
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with FlopCounter(registry=registry) as fc:
        a @ b
    registry.formula(torch.ops.aten.mm)(lambda a, b, *, out_shape, **kw: Cost(2, 1))
    assert fc.unsupported_ops() == {"aten.mm": 1}
    assert [r.category for r in fc.records() if r.operator == "aten.mm"] == ["unsupported"]
