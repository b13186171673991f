"""A model's facts kept from one counter to the next (``engine.counting.model_cache``): a fresh
counter per step reuses the module types, parameter counts, parameter groups and expert
layers worked out for the last one, and sees every change between steps that they depend
on: a module added, removed, replaced or renamed, a parameter replaced, added or removed.
The oracle for each is the model read directly (``named_modules``, ``parameters``)."""

import gc
import weakref

import torch
from moe_models import ListMoE
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.engine.counting import model_cache


class Tied(nn.Module):
    """An embedding, a stack of linears and an output layer that may share its weight."""

    def __init__(self, vocab: int = 11, d: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.stack = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.stack(self.embed(ids)))


IDS = torch.tensor([[1, 2, 3, 4]])


def counted(model):
    with FlopCounter(model) as fc:
        model(IDS).sum().backward()
    profile = fc.to_profile()
    return fc, profile


def facts(profile) -> dict:
    module = profile.module_facts
    return {"names": module.names, "types": module.types, "params": module.params,
            "groups": dict(profile.run.parameters)}


def expected(model) -> dict:
    """The same facts read from the model: names, class names and parameter counts in
    ``named_modules`` order; the total (shared parameters once) and the tied head."""
    named = list(model.named_modules())
    return {"names": tuple(n for n, _ in named),
            "types": tuple(type(m).__name__ for _, m in named),
            "params": tuple(sum(p.numel() for p in m.parameters()) for _, m in named),
            "total": sum(p.numel() for p in model.parameters()),
            "tied": int(model.head.weight is model.embed.weight)}


def assert_facts_of(model, profile):
    got, want = facts(profile), expected(model)
    assert got["names"] == want["names"]
    assert got["types"] == want["types"]
    assert got["params"] == want["params"]
    assert got["groups"]["total"] == want["total"]
    assert got["groups"]["tied_head"] == want["tied"]


def test_an_unchanged_model_reuses_its_facts():
    """The second counter on an unchanged model finds the first one's facts (one object)
    and gives the same figures."""
    model = Tied()
    fc1, p1 = counted(model)
    fc2, p2 = counted(model)
    assert fc1._tracker.model_facts is fc2._tracker.model_facts
    assert facts(p1) == facts(p2)
    assert_facts_of(model, p2)


def test_a_module_added_removed_replaced_or_renamed_is_seen():
    model = Tied()
    seen = [counted(model)[0]._tracker.model_facts]

    def step():
        fc, profile = counted(model)
        assert_facts_of(model, profile)
        assert all(fc._tracker.model_facts is not old for old in seen)
        seen.append(fc._tracker.model_facts)

    model.stack.append(nn.Linear(8, 8))  # added
    step()
    del model.stack[1]  # removed (Sequential rebuilds its dict)
    step()
    model.stack[1] = nn.Linear(8, 8, bias=False)  # replaced: one parameter fewer
    step()
    model.stack[0] = nn.Sequential(nn.Linear(8, 8))  # replaced by another class
    step()
    model.stack._modules = {("renamed" if k == "0" else k): v
                            for k, v in model.stack._modules.items()}  # renamed
    step()
    assert "stack.renamed.0" in facts(counted(model)[1])["names"]


def test_a_parameter_replaced_added_or_removed_is_seen():
    """Untying the head (its weight replaced, the old one still alive in the embedding and an
    optimizer) changes the total and ``tied_head``; a registered or removed parameter
    changes its module's count."""
    model = Tied()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # holds the old weights too
    assert facts(counted(model)[1])["groups"]["tied_head"] == 1
    model.head.weight = nn.Parameter(model.embed.weight.detach().clone())
    _, profile = counted(model)
    assert_facts_of(model, profile)
    assert facts(profile)["groups"]["tied_head"] == 0
    model.stack[0].register_parameter("extra", nn.Parameter(torch.zeros(5)))
    assert_facts_of(model, counted(model)[1])
    model.stack[2].bias = None
    assert_facts_of(model, counted(model)[1])
    model.head.weight = model.embed.weight  # tied again: the embedding's own parameter
    _, profile = counted(model)
    assert_facts_of(model, profile)
    assert facts(profile)["groups"]["tied_head"] == 1
    assert optimizer.param_groups  # kept alive to the end


def test_expert_layers_follow_a_replaced_list():
    """A one-module list is no MoE layer; the same name holding four experts is, from the
    next counter on."""
    D, H, E, assignment = 8, 16, 4, [0, 0, 0, 1, 2, 2, 0, 1, 0, 2]
    model = ListMoE(D, H, E, assignment)
    full = model.experts
    model.experts = nn.ModuleList([full[0]])
    x = torch.randn(len(assignment), D)
    with FlopCounter(model) as fc:
        model(x)
    assert fc.experts() == {}
    model.experts = full
    with FlopCounter(model) as fc:
        model(x)
    assert fc.experts()["experts"].tokens == (5, 2, 3, 0)


def test_the_facts_keep_no_model_alive():
    model = Tied()
    counted(model)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    assert all(m is not None for m in model_cache._FACTS.keys())


def test_identity_is_compared_by_reference_never_by_value():
    """Two live parameters of one shape are different parameters (``==`` on them would be a
    tensor); a dead reference equals no new one."""
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    ref = weakref.ref
    assert model_cache._same((ref(a),), (ref(a),))
    assert not model_cache._same((ref(a),), (ref(b),))
    assert not model_cache._same((ref(a),), ())
    dead = ref(nn.Parameter(torch.ones(3)))
    gc.collect()
    assert dead() is None and not model_cache._same((dead,), (ref(a),))


def test_gradient_accumulation_follows_a_replaced_parameter():
    """Each parameter's gradient accumulation goes under its module (the owners' map is kept
    with the facts): untying the head puts the new weight's accumulation under ``head``,
    where the tied weight's went under ``embed`` (its first owner)."""
    def accumulated(profile) -> dict:
        return {r.module: r.stats.calls for r in profile.records()
                if r.phase == "backward" and r.operator in ("aten.add_", "aten.detach",
                                                             "aten.copy_", "aten.clone")}

    def first_accumulation(model):  # every gradient made anew: the same ops each time
        model.zero_grad(set_to_none=True)
        return counted(model)[1]

    model = Tied()
    tied = first_accumulation(model)
    again = first_accumulation(model)  # the kept map
    assert accumulated(again) == accumulated(tied)
    model.head.weight = nn.Parameter(model.embed.weight.detach().clone())
    untied = first_accumulation(model)
    fresh = Tied()  # the oracle: a model built untied, counted once
    fresh.head.weight = nn.Parameter(fresh.embed.weight.detach().clone())
    built = first_accumulation(fresh)
    assert accumulated(untied) == accumulated(built)
    assert "head" in accumulated(built) and "head" not in accumulated(tied)
