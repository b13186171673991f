"""torch's FlopCounterMode surface: the drop-in dispatch_flops.FlopCounterMode (constructor,
attributes, module tracking by global hooks, torch-format formulas, table) and the getters
every FlopCounter / Profile answers. torch's own FlopCounterMode is the oracle wherever it
counts the op; its figure is 2 x MACs of the contraction ops."""

import warnings
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_globals
from torch.utils.flop_counter import FlopCounterMode as TorchFlopCounterMode
from torch.utils.flop_counter import register_flop_formula

from dispatch_flops import FlopCounter, FlopCounterMode


class Net(nn.Module):
    """A conv with bias, a ModuleList never called itself, Linears with bias, a functional
    matmul in the root's own forward: every way torch keys a module."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.blocks = nn.ModuleList([nn.Linear(12, 8), nn.Linear(8, 5)])

    def forward(self, x):
        h = self.conv(x).flatten(1)
        for block in self.blocks:
            h = torch.tanh(block(h))
        return h @ h.t()


def net_and_input():
    torch.manual_seed(0)
    return Net(), torch.randn(4, 2, 4, 4)


def quiet(**kwargs):
    return FlopCounterMode(display=False, **kwargs)


def global_hook_counts():
    return (len(module_globals._global_forward_pre_hooks),
            len(module_globals._global_forward_hooks))


def test_every_module_keyed_as_torch_keys_it_forward_and_backward():
    """No model given: the same keys and per-op figures as torch's counter, biases, tanh and
    the loss included in the run (torch does not count them, nor does the drop-in figure);
    the package's all-ops flops stay in total.flops."""
    model, x = net_and_input()
    with TorchFlopCounterMode(display=False) as theirs:
        model(x).sum().backward()
    model.zero_grad()
    with quiet() as ours:
        model(x).sum().backward()
    expected = theirs.get_flop_counts()
    assert "Net.blocks" not in expected  # never called: torch credits running modules only
    assert ours.get_flop_counts() == expected
    assert ours.get_total_flops() == theirs.get_total_flops() == 2 * ours.total.macs
    assert ours.total.flops > ours.get_total_flops()  # bias adds, tanh, sums: this package's
    assert isinstance(ours.flop_counts, defaultdict) and ours.flop_counts["absent"] == {}


def test_composites_keyed_as_torch_keys_them_under_inference_mode():
    """Under inference_mode, conv2d and linear reach the mode whole; the drop-in decomposes
    them as torch's mode does, so the keys and figures are torch's, as in grad mode."""
    model, x = net_and_input()
    with torch.inference_mode():
        with TorchFlopCounterMode(display=False) as theirs:
            model(x)
        with quiet() as ours:
            model(x)
    with quiet() as grad_mode:
        model(x)
    assert ours.get_flop_counts() == theirs.get_flop_counts() == grad_mode.get_flop_counts()
    assert torch.ops.aten.convolution in ours.flop_counts["Net.conv"]


def test_counts_contraction_work_torch_misses():
    """CPU SDPA: torch's counter prices its flash kernel at 0; the drop-in counts both
    products, 2 x (b h s s d) MACs each way: 4 b h s^2 d flops."""
    b, h, s, d = 2, 3, 5, 4
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    with TorchFlopCounterMode(display=False) as theirs:
        F.scaled_dot_product_attention(q, k, v)
    with quiet() as ours:
        F.scaled_dot_product_attention(q, k, v)
    assert theirs.get_total_flops() == 0
    assert ours.get_total_flops() == 4 * b * h * s * s * d


def test_global_hooks_only_while_counting_and_mods_warning():
    """One global forward pre-hook and one forward hook during the block, none after, also
    when the block raises; passing a model warns as torch's does."""
    before = global_hook_counts()
    model, x = net_and_input()
    with quiet() as mode:
        assert global_hook_counts() == (before[0] + 1, before[1] + 1)
        assert mode.mode is not None  # torch's attribute: the dispatch mode, while counting
        model(x)
    assert global_hook_counts() == before and mode.mode is None
    with pytest.raises(RuntimeError, match="boom"), quiet():
        model(x)
        raise RuntimeError("boom")
    assert global_hook_counts() == before
    assert torch._C._len_torch_dispatch_stack() == 0
    with pytest.warns(UserWarning, match="not needed"):
        with_model = FlopCounterMode(model, display=False)
    with with_model:
        model(x)
    assert with_model.get_flop_counts() == mode.get_flop_counts()


def test_custom_mapping_formulas_are_called_during_the_block():
    """torch's formula format: shapes (out_shape) by default, tensors with ``_get_raw``;
    called once per op call, inside the block, their figure replacing the package's."""
    calls = []

    def per_shape(a_shape, b_shape, *args, out_shape):
        calls.append(out_shape)
        return 7

    def raw(*args, out_val):
        return out_val.numel()

    raw._get_raw = True
    a = torch.randn(4, 5)
    with quiet(custom_mapping={torch.ops.aten.add: per_shape, torch.ops.aten.mul: raw}) as mode:
        a + a
        assert calls == [torch.Size([4, 5])]  # called during the block
        a + a
        a * a
    assert calls == [torch.Size([4, 5])] * 2
    assert mode.get_flop_counts()["Global"] == {torch.ops.aten.add: 2 * 7,
                                                torch.ops.aten.mul: 4 * 5}
    assert torch.ops.aten.add in mode.flop_registry and torch.ops.aten.mm in mode.flop_registry
    with pytest.raises(TypeError, match="op packets"):
        FlopCounterMode(custom_mapping={torch.ops.aten.add.Tensor: raw})
    with pytest.raises(TypeError, match="callable"):
        FlopCounterMode(custom_mapping={torch.ops.aten.add: 5})


def test_torch_registered_formula_of_a_custom_op_is_honoured():
    """A formula registered with torch's register_flop_formula, charged to the module that
    ran the op."""

    @torch.library.custom_op("dispatch_flops_test::scaled", mutates_args=())
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @scaled.register_fake
    def _(x):
        return torch.empty_like(x)

    @register_flop_formula(torch.ops.dispatch_flops_test.scaled)
    def formula(x_shape, *args, out_shape=None, **kwargs):
        return 3 * x_shape.numel()

    class Wrap(nn.Module):
        def forward(self, x):
            return scaled(x)

    with quiet() as mode:
        Wrap()(torch.randn(2, 3))
    counts = mode.get_flop_counts()
    assert counts["Global"] == counts["Wrap"] == {torch.ops.dispatch_flops_test.scaled: 18}


def test_table_is_torchs_table():
    """get_table lays the counts out exactly as torch's get_table does for the same counts,
    at every depth; display prints it on exit."""
    pytest.importorskip("tabulate")  # torch's get_table needs it
    model, x = net_and_input()
    with quiet() as ours:
        model(x).sum().backward()
    with quiet() as large:  # figures in thousands and more take torch's unit suffixes
        torch.randn(64, 64) @ torch.randn(64, 64)
    assert large.get_table().splitlines()[2].split() == ["Global", "524.288K", "100.00%"]
    theirs = TorchFlopCounterMode(display=False)
    theirs.flop_counts.update(ours.flop_counts)

    def cells(table):  # tabulate >= 0.10 strips the indentation torch asks it to keep
        lines = table.splitlines()
        return [line.split() for line in lines[:1] + lines[2:]]  # widths follow the indent

    for depth in (1, 2, 3, None):
        assert cells(ours.get_table(depth)) == cells(theirs.get_table(depth))
    assert ours.to_profile().get_table(3) == ours.get_table(3)
    rule = ours.get_table().splitlines()[1]
    assert [len(dashes) for dashes in rule.split()][1:] == [len("FLOP") + 2, len("% Total") + 2]


def test_display_prints_on_exit(capsys):
    model = nn.Linear(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FlopCounterMode(model, depth=1):
            model(torch.ones(2, 4))
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["Module", "FLOP", "%", "Total"]
    assert "Linear" in out and "aten.addmm" in out


def test_flop_counter_getters_use_torchs_figure():
    """FlopCounter(model) answers torch's getters too: 2 x MACs, modules named from the
    model's class."""
    model, x = net_and_input()
    with FlopCounter(model) as fc:
        model(x)
    counts = fc.get_flop_counts()
    assert fc.get_total_flops() == 2 * fc.total.macs == sum(counts["Global"].values())
    assert set(counts) == {"Global", "Net", "Net.conv", "Net.blocks.0", "Net.blocks.1"}
    with FlopCounter() as plain:
        model(x)
    assert set(plain.get_flop_counts()) == {"Global"}
