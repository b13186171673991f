"""The engine's parts and their couplings: saved activations counted apart from the tracker,
module facts and compiled graphs reading the tracker through its public surface, and the
dispatch mode's switch for DTensor made only where it lets a DTensor run an op."""

import ast
import pathlib

import torch
from torch import nn

from dispatch_flops import ROOT, FlopCounter
from dispatch_flops.engine.counting.mode import _unwrapping

ENGINE = pathlib.Path(__file__).resolve().parent.parent / "dispatch_flops" / "engine"


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def test_tensors_saved_outside_the_model_are_the_roots():
    """A loss computed after the model (ops of phase ``other``) saves the model's output for
    its backward: those bytes are the root's own, beside what the modules saved."""
    model, x = mlp(), torch.randn(5, 8)
    with FlopCounter(model, saved_activations=True) as fc:
        (model(x) ** 2).sum().backward()
    modules = fc.by_module()
    assert modules[ROOT].saved_bytes_exclusive == 5 * 4 * 4  # the output, squared
    assert modules[ROOT].saved_bytes == x.nbytes + 5 * 32 * 4 + 5 * 4 * 4


def test_saved_bytes_stay_each_counters_own_on_a_shared_ledger():
    """Counters entered one after another on a model count into one ledger; the bytes each
    saw saved are its own, read before or after the next one counts."""
    model = mlp()
    with FlopCounter(model, saved_activations=True) as first:
        model(torch.randn(5, 8)).sum().backward()
    with FlopCounter(model, saved_activations=True) as second:
        model(torch.randn(2, 8)).sum().backward()
    assert first._tracker.ledger is second._tracker.ledger
    assert second.by_module()[ROOT].saved_bytes == 2 * 8 * 4 + 2 * 32 * 4
    assert first.by_module()[ROOT].saved_bytes == 5 * 8 * 4 + 5 * 32 * 4
    with FlopCounter(model) as off:  # the same ledger, not watching: nothing left over
        model(torch.randn(5, 8)).sum().backward()
    assert off.by_module()[ROOT].saved_bytes is None


def _private_tracker_reads(path: pathlib.Path) -> list[str]:
    """``<line>: <expression>`` for every ``..tracker._name`` or ``..tracker.__dict__`` read
    or written in the file (a private attribute of a ModuleTracker, by the name it goes by)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else \
                owner.id if isinstance(owner, ast.Name) else ""
            if name.lstrip("_") == "tracker":
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_engines_parts_use_only_the_trackers_public_surface():
    """Compiled graphs, module facts, saved activations, the dispatch mode and the counter
    read the tracker through its documented methods and attributes, never its private
    state."""
    files = [ENGINE / "graphs" / "compiled.py", ENGINE / "graphs" / "runs.py",
             ENGINE / "graphs" / "dynamo.py", ENGINE / "model" / "module_facts.py",
             ENGINE / "model" / "saved.py", ENGINE / "counting" / "mode.py",
             ENGINE.parent / "counter.py"]
    assert {f.name: _private_tracker_reads(f) for f in files} == {f.name: [] for f in files}


def test_only_torch_distributed_subclasses_run_an_op_before_the_mode():
    """``_unwrapping`` names DTensor and AsyncCollectiveTensor (torch.distributed's), nothing
    else; a mode that met neither keeps the class's dispatch (no instance override)."""
    dtensor = type("DTensor", (torch.Tensor,), {"__module__": "torch.distributed.tensor._api"})
    waiting = type("AsyncCollectiveTensor", (torch.Tensor,),
                   {"__module__": "torch.distributed._functional_collectives"})
    lookalike = type("DTensor", (torch.Tensor,), {"__module__": "my_package"})
    assert _unwrapping((torch.Tensor, dtensor)) == "DTensor"
    assert _unwrapping((waiting,)) == "AsyncCollectiveTensor"
    assert _unwrapping((lookalike, torch.Tensor)) is None and _unwrapping(()) is None
    model = mlp()
    with FlopCounter(model) as fc:
        model(torch.randn(5, 8)).sum().backward()
    assert "__torch_dispatch__" not in vars(fc._mode)
