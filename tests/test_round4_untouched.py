"""Issue 56, item 1: the drop-ins (fvcore, thop, ptflops, calflops) and ``paper_table`` give the
user's model back exactly as they found it — gradients (the same tensors, the same values),
buffers, RNG, train flags, hooks, attributes — after success, an exception, or a
KeyboardInterrupt at any install or remove point; they make no inference tensor a model may
keep; and they keep nothing per call."""

from __future__ import annotations

import gc
import sys

import pytest
import torch
from test_hostile_users import Interrupts, _globals
from torch import nn

from dispatch_flops import paper_table
from dispatch_flops.compat import _conventions, calflops, fvcore, ptflops, thop


class Rotary(nn.Module):
    """Builds its cos/sin cache on its first forward (as rotary embeddings do) and keeps it:
    made under ``inference_mode``, the cache could never be saved for backward."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = torch.arange(8.0).cos()
        return self.proj(x) * self.cache


class Block(nn.Module):
    """BatchNorm (running statistics, a counter), dropout (draws from the RNG), a rotary
    cache; its class is given a thop / ptflops rule in the tests."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.rot = Rotary()

    def forward(self, x):
        return self.rot(self.drop(self.bn(self.lin(x))))


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), nn.ReLU(), nn.Linear(8, 2))
    model(torch.randn(4, 8)).sum().backward()  # the user's gradients, and moved statistics
    model[0].rot.cache = None
    model[0].drop.train(False)  # a mixed train/eval model: every flag must come back as it was
    return model


X = torch.randn(4, 8)


def _state(model, *leaves):
    """Everything of the user's a drop-in could change, as comparable values (gradients by
    identity and value)."""
    modules = [(type(m).__name__, m.training, sorted(m.__dict__),
                [(k, len(v)) for k, v in sorted(m.__dict__.items()) if isinstance(v, dict)])
               for m in model.modules()]
    grads = [(id(t.grad), t.grad.clone() if t.grad is not None else None)
             for t in list(model.parameters()) + list(leaves)]
    buffers = [b.clone() for b in model.buffers()]
    return modules, grads, buffers, torch.random.get_rng_state(), _globals()


def _same(before, after):
    modules, grads, buffers, rng, globals_ = before
    assert after[0] == modules
    assert [g[0] for g in after[1]] == [g[0] for g in grads]  # the same tensors
    for (_, a), (_, b) in zip(after[1], grads):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    assert all(torch.equal(a, b) for a, b in zip(after[2], buffers))
    assert torch.equal(after[3], rng)
    assert after[4] == globals_


def _rule(module, inputs, output):
    module.total_ops += 7


def _flops_rule(module, inputs, output):
    module.__flops__ += 7


def _fvcore(model, x):
    return fvcore.FlopCountAnalysis(model, (x,)).total()


DROP_INS = {
    "thop": lambda m, x: thop.profile(m, (x,), custom_ops={Block: _rule}, verbose=False),
    "fvcore": _fvcore,
    "ptflops": lambda m, x: ptflops.get_model_complexity_info(
        m, (8,), input_constructor=lambda _: x, custom_modules_hooks={Block: _flops_rule},
        print_per_layer_stat=False),
    "calflops": lambda m, x: calflops.calculate_flops(m, args=[x], print_results=False),
    "calflops_backward": lambda m, x: calflops.calculate_flops(
        m, args=[x], include_backPropagation=True, print_results=False),
    "paper_forward": lambda m, x: paper_table({"m": (m, x)}),
    "paper_train": lambda m, x: paper_table({"m": (m, x)}, step="train"),
}


@pytest.mark.parametrize("name", list(DROP_INS))
def test_a_drop_in_leaves_the_model_as_it_found_it(name):
    """Gradients (same tensors, same values), BatchNorm's statistics and counter, the RNG,
    train flags, hooks and attributes after each drop-in; on e85fa8b calflops' backward and
    paper_table's training step added into the user's ``.grad`` and moved
    ``num_batches_tracked`` (5 -> 6), and the RNG had moved."""
    model = _model()
    x = X.clone().requires_grad_()
    x.grad = torch.full_like(x, 3.0)  # the user's input gradient too (a neighbour)
    before = _state(model, x)
    DROP_INS[name](model, x)
    _same(before, _state(model, x))


class Failing(torch.autograd.Function):
    """Backward raises half-way (after part of the graph's gradients were added)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward failed")


class FailsInBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 8)
        self.tail = nn.Linear(8, 8)

    def forward(self, x):
        # the tail's gradient is added before the failing node is reached
        return self.tail(Failing.apply(self.head(x)))


@pytest.mark.parametrize("name", ["calflops_backward", "paper_train"])
def test_a_backward_that_raises_half_way_leaves_the_gradients(name):
    """The tail's ``.grad`` (the user's) is the same tensor with the same values after a
    backward that raised part-way (e85fa8b: the tail's gradient had the step's added)."""
    model = FailsInBackward()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = _state(model)
    with pytest.raises(RuntimeError, match="backward failed"):
        DROP_INS[name](model, X)
    _same(before, _state(model))


@pytest.mark.parametrize("name", ["thop", "fvcore", "ptflops", "calflops", "paper_forward"])
def test_no_inference_tensor_is_left_for_the_model_to_keep(name):
    """A model that builds a cache on its first forward trains after a drop-in (e85fa8b: thop,
    fvcore and ptflops ran it under inference_mode, and the step raised "Inference tensors
    cannot be saved for backward"); the cache itself is the model's own attribute, given back
    as found (None)."""
    model = nn.Sequential(Rotary(), nn.Linear(8, 2))
    DROP_INS[name](model, X)
    assert model[0].cache is None
    out = model(X)  # builds the cache now, outside any drop-in
    DROP_INS[name](model, X)  # the drop-in on a model holding its cache
    assert not model[0].cache.is_inference()
    model(X.requires_grad_()).sum().backward()
    assert model[0].proj.weight.grad is not None and out.shape == (4, 2)


@pytest.mark.parametrize("name", ["thop", "fvcore", "ptflops"])
def test_counting_state_is_not_kept_per_call(name):
    """20 calls keep no registry (nor the engine cache and ledgers under it) alive
    (e85fa8b: each thop or fvcore call kept its registry, and the model's ledger under it,
    as long as the model: one more ``PeerRegistry`` a call)."""
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(10)])
    DROP_INS[name](model, X)
    gc.collect()
    registries = sum(isinstance(o, _conventions.PeerRegistry) for o in gc.get_objects())
    for _ in range(20):
        DROP_INS[name](model, X)
    gc.collect()
    assert sum(isinstance(o, _conventions.PeerRegistry) for o in gc.get_objects()) <= registries


class DropInInterrupts(Interrupts):
    """The counter's install and remove points, and the drop-ins' own: their rules' forward
    hooks, train flags set, backward run."""

    POINTS = Interrupts.POINTS + [
        (nn.Module, "register_forward_hook"),
        (nn.Module, "train"),
        (torch.Tensor, "backward"),
    ]

    def _wrap(self, fn):
        wrapped = super()._wrap(fn)

        def outside_pricing(*args, **kwargs):
            # the engine prices a composite on fake tensors under modes of its own, inside a
            # dispatch: not an install or remove point of the drop-in (listed in the issue's
            # note: an interrupt landing there aborts in torch's C++ mode stack)
            frame = sys._getframe(1)
            while frame is not None:
                if frame.f_code.co_name in ("_decomposed", "__torch_dispatch__"):
                    return fn(*args, **kwargs)
                frame = frame.f_back
            return wrapped(*args, **kwargs)

        return outside_pricing


@pytest.mark.parametrize("name", list(DROP_INS))
def test_an_interrupt_at_any_point_of_a_drop_in_leaves_nothing(monkeypatch, name):
    """A KeyboardInterrupt at the k-th install / remove / flag / backward point, for every k,
    before or after the real call: the model, its gradients, buffers, hooks, attributes, the
    RNG and the global hooks are as found (e85fa8b: thop left ``total_ops`` and its rules'
    hooks, ptflops ``__flops__``, calflops the train flags behind)."""
    model = _model()
    fired = 0
    for after in (False, True):
        k = 0
        while True:
            k += 1
            before = _state(model)
            with monkeypatch.context() as patch:
                interrupts = DropInInterrupts(patch, k, after)
                interrupts.armed = True
                try:
                    DROP_INS[name](model, X)
                except KeyboardInterrupt:
                    assert interrupts.fired
                interrupts.armed = False
            _same(before, _state(model))
            if not interrupts.fired:
                break
            fired += 1
    assert fired > 8  # the points were reached
