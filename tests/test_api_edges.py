"""The edges of the API: arguments of the wrong type fail where they are given, a formula
registry never says an op is classified that does not exist, a table keeps to its width
whatever the names, torch.func's refusal of saved-tensors hooks is documented, and torch's
warning about global hooks is not repeated at every counted compiled call."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from dispatch_flops import Cost, FlopCounter, has_formula, register_formula
from dispatch_flops.formulas import Category, Movement, Registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("registry", ["x", {}, Registry])
def test_a_counter_takes_a_registry_or_none_and_says_so_at_once(registry):
    with pytest.raises(TypeError, match="registry must be a dispatch_flops.formulas.Registry"):
        FlopCounter(registry=registry)


def test_registering_no_ops_is_an_error():
    reg = Registry()
    for register in (lambda: reg.formula([])(lambda *, out_shape: Cost(0)),
                     lambda: reg.collective(())(lambda *, out_shape: Cost(0)),
                     lambda: reg.no_arithmetic([], Movement.COPY),
                     lambda: register_formula([])):
        with pytest.raises(ValueError, match="no ops given"):
            register()
    assert reg.version == 0


@pytest.mark.parametrize("name", ["aten::", "::mm", "::"])
def test_a_qualified_name_needs_its_namespace_and_its_name(name):
    with pytest.raises(TypeError, match="namespace::name"):
        Registry().formula(name)


def test_a_name_registered_before_its_op_exists_is_classified_once_it_does():
    """A formula may wait for an op registered later (on an import): the registry takes the
    name, and says the op is classified only from when it exists."""
    reg = Registry()
    reg.formula("dispatch_flops_edges::later", lazy=True)(lambda x, *, out_shape: Cost(x[0]))
    assert not reg.has("dispatch_flops_edges::later")

    lib = torch.library.Library("dispatch_flops_edges", "DEF")  # noqa: TOR901
    lib.define("later(Tensor x) -> Tensor")
    lib.impl("later", lambda x: x.clone(), "CompositeExplicitAutograd")
    assert reg.has("dispatch_flops_edges::later")
    assert reg.has(torch.ops.dispatch_flops_edges.later)
    assert reg.has(torch.ops.dispatch_flops_edges.later.default)
    with FlopCounter(registry=reg) as fc:
        torch.ops.dispatch_flops_edges.later(torch.ones(7))
    assert fc.total.flops == 7


@pytest.mark.parametrize("register", [
    lambda reg, name: reg.formula(name)(lambda *a, out_shape: Cost(1)),
    lambda reg, name: reg.no_arithmetic(name, Movement.COPY),
    lambda reg, name: reg.collective(name)(lambda *a, out_shape: Cost(0)),
])
@pytest.mark.parametrize("name", ["aten::no_such_op", "aten::mm.no_such_overload",
                                  "dispatch_flops_nowhere::op"])
def test_a_name_of_no_op_is_refused_unless_registered_lazily(register, name):
    """A misspelt name would never fire: it is a ValueError saying how to name an op whose
    library loads later (lazy=True), and the registry is left as it was."""
    reg = Registry()
    with pytest.raises(ValueError, match="no op named|has no overload") as raised:
        register(reg, name)
    assert "lazy=True" in str(raised.value) or "overloads: " in str(raised.value)
    assert reg.version == 0 and not reg.has(name)


def test_a_name_of_an_existing_op_is_that_op():
    """"aten::mm" registers aten.mm (a duplicate of the packet's formula is refused) and
    "aten::cos.default" its overload, which the lookup finds."""
    reg = Registry()
    reg.formula("aten::mm")(lambda a, b, *, out_shape: Cost(7))
    with pytest.raises(ValueError, match="already registered"):
        reg.formula(torch.ops.aten.mm)(lambda a, b, *, out_shape: Cost(7))
    reg.formula("aten::cos.default")(lambda a, *, out_shape: Cost(3))
    assert reg.lookup(torch.ops.aten.cos.default).category == Category.EXACT
    assert reg.lookup(torch.ops.aten.cos.out).category != Category.EXACT


def test_a_lazy_overload_name_prices_only_that_overload():
    reg = Registry()
    reg.formula("dispatch_flops_lazy::op.twice", lazy=True)(lambda x, *, out_shape: Cost(2))
    lib = torch.library.Library("dispatch_flops_lazy", "DEF")  # noqa: TOR901
    lib.define("op(Tensor x) -> Tensor")
    lib.define("op.twice(Tensor x, int n) -> Tensor")
    assert reg.lookup(torch.ops.dispatch_flops_lazy.op.twice).category == Category.EXACT
    assert reg.lookup(torch.ops.dispatch_flops_lazy.op.default).category == Category.UNSUPPORTED


def test_has_formula_of_a_name_with_no_op_is_false():
    assert not has_formula("aten::no_such_op_anywhere")
    assert has_formula("aten::mm")


def test_a_table_keeps_to_its_width_whatever_the_names():
    """A class name of a megabyte (and a module name of kilobytes) is shortened to the width
    asked, as module names already were; so are op rows."""
    huge = type("M" * 1_000_000, (nn.Module,), {
        "__init__": lambda self: (nn.Module.__init__(self),
                                  setattr(self, "linear", nn.Linear(4, 4)))[0],
        "forward": lambda self, x: getattr(self, "r" * 5000)(self.linear(x))})
    model = huge()
    model.add_module("r" * 5000, nn.ReLU())
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    for width in (40, 100):
        for ops in (0, 2):
            lines = fc.table(width=width, ops=ops).splitlines()
            assert max(map(len, lines)) <= width
            assert lines[2].startswith("MMM") and "…" in lines[2]  # head … tail


def test_saved_activations_and_torch_func_grad_are_documented_apart():
    """torch.func's transforms refuse any saved-tensors hook, which saved_activations=True
    installs: torch raises, and the counter's docstring and docs/phases.md say so."""
    model = nn.Linear(4, 4)
    params = dict(model.named_parameters())
    x = torch.randn(2, 4)

    def loss(p):
        return torch.func.functional_call(model, p, (x,)).sum()

    with FlopCounter(model) as fc:
        torch.func.grad(loss)(params)
    assert fc.total.flops > 0
    with pytest.raises(RuntimeError, match="saved tensor hooks"):
        with FlopCounter(model, saved_activations=True):
            torch.func.grad(loss)(params)
    assert FlopCounter.__doc__ is not None and "torch.func" in FlopCounter.__doc__
    with open(os.path.join(ROOT, "docs", "phases.md")) as f:
        assert "`torch.func`'s `grad`" in f.read()


def test_torchs_warning_about_global_hooks_is_not_repeated_at_every_counted_call():
    script = textwrap.dedent("""
        import torch
        from torch import nn
        from dispatch_flops import FlopCounter
        net = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        compiled = torch.compile(net, backend="eager")
        for _ in range(3):
            with FlopCounter(net) as fc:
                compiled(torch.randn(2, 8))
            fc.total
        with FlopCounter(net):
            compiled(torch.randn(2, 8))  # another line: a "default" filter would warn again
        print(fc.total.flops)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0
    assert done.stderr.count("when there are global hooks") <= 1
