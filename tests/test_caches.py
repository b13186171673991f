"""What the engine keeps between counters is bounded, and what it keeps for a model goes with
the model: a process that meets a new shape every step (sequence lengths that vary, in a
server or a notebook) does not grow for ever. ``benchmarks/long_run.py`` measures it."""

import gc
import warnings

import torch
from torch import nn

from dispatch_flops import Cost, FlopCounter
from dispatch_flops.engine.counting import mode as engine_mode
from dispatch_flops.engine.counting import records
from dispatch_flops.engine.counting.calls import SIGNATURES_KEPT
from dispatch_flops.engine.counting.ledger import Ledger
from dispatch_flops.engine.counting.records import engine_cache
from dispatch_flops.formulas import REGISTRY, Registry


def _signatures(registry=REGISTRY) -> int:
    return len(engine_cache(registry).signatures)


def test_the_shared_signature_cache_keeps_at_most_its_bound_and_the_recent_ones(monkeypatch):
    hot = torch.randn(3, 5)
    for n in range(1, SIGNATURES_KEPT + 200):
        with FlopCounter():  # no model: a ledger of its own, its records made anew
            torch.ones(n).mul_(2)  # a new signature each time
            hot.exp()  # met by every counter: never the least recently met
    assert _signatures() <= SIGNATURES_KEPT
    worked = []
    work_out = engine_mode._work_out
    monkeypatch.setattr(engine_mode, "_work_out", lambda *a: worked.append(a) or work_out(*a))
    with FlopCounter() as fc:  # a new counter finds it worked out
        hot.exp()
    assert worked == [] and fc.total.flops == 15


def _ledgers_alive() -> int:
    gc.collect()
    return sum(isinstance(o, Ledger) for o in gc.get_objects())


def test_a_compiled_graph_keeps_no_ledger_of_a_deleted_model():
    """Dynamic shapes: a price per shape met, kept with the ledger, not with the graph."""
    before = _ledgers_alive()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    compiled = torch.compile(net, backend="eager", dynamic=True)
    for n in range(3, 8):
        with FlopCounter(net) as fc:
            compiled(torch.randn(n, 8)).sum().backward()
        assert fc.total.flops > 0
    assert _ledgers_alive() > before
    del fc, net, compiled
    assert _ledgers_alive() == before


def test_pricing_on_fake_tensors_leaves_torchs_fake_tensor_cache_as_it_was():
    """A composite under inference_mode is priced by running its decomposition on fake
    tensors: torch's fake-tensor dispatch cache is process-wide, an entry per op and shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    linear = nn.Linear(11, 17)
    before = len(FakeTensorMode.cache)
    with torch.inference_mode(), FlopCounter() as fc:
        for n in range(1, 6):  # shapes no other test uses: priced here
            linear(torch.randn(n, 3, 11))
    assert fc.total.flops == 15 * 3 * (2 * 11 + 1) * 17  # products, sums and the bias
    assert len(FakeTensorMode.cache) == before


def test_pricing_errors_warned_about_are_bounded(monkeypatch):
    """A formula that fails names the shapes in its message: one per shape, not for ever."""
    monkeypatch.setattr(records, "WARNED_KEPT", 8)
    registry = Registry()
    registry.formula(torch.ops.aten.exp)(lambda x, *, out_shape: Cost(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in range(1, 30):
            with FlopCounter(registry=registry) as fc:
                torch.ones(n).exp()
            assert "aten.exp" in fc.unsupported_ops()  # read: priced, the formula failed
    assert len(records._WARNED) <= 8
