"""MoE expert load (``Profile.experts``): tokens per expert per layer, their imbalance, and
the padding of capacity kernels, against routings fixed by hand (``tests/moe_models.py``)
and against the router's own decision in transformers' Mixtral under each of its expert
kernels (a loop over experts, batched_mm, torch._grouped_mm)."""

import pytest
import torch
from moe_models import CapacityMoE, ListMoE
from torch import nn

from dispatch_flops import FlopCounter, Profile

D, H, E = 8, 16, 4
ASSIGNMENT = [0, 0, 0, 1, 2, 2, 0, 1, 0, 2]  # expert 3 gets none
TOKENS = [5, 2, 3, 0]  # tokens per expert, by hand


def test_a_list_of_experts_gets_its_tokens():
    """Each expert's tokens are the rows it was called on; its MACs agree (tokens x 2dh);
    the idle expert is counted as idle; imbalance = max / mean."""
    model = ListMoE(D, H, E, ASSIGNMENT)
    x = torch.randn(len(ASSIGNMENT), D)
    with FlopCounter(model) as fc:
        model(x).sum().backward()
    layer = fc.experts()["experts"]
    assert layer.tokens == layer.rows == tuple(TOKENS)
    assert layer.calls == 1 and layer.experts == E and layer.idle == 1
    assert layer.imbalance == pytest.approx(5 / (10 / 4)) and layer.padding == 0
    modules = fc.by_module("forward")
    for i, tokens in enumerate(TOKENS):
        if tokens:
            assert modules[f"experts.{i}"].macs == tokens * 2 * D * H
    assert "experts" in fc.experts_table() and "2.00" in fc.experts_table()


def test_capacity_experts_count_their_padding():
    """Capacity 3: expert 0's 5 tokens are cut to 3 (2 dropped), every expert computes 3
    rows: 12 rows for 3 + 2 + 3 + 0 = 8 tokens, 4 rows (a third) padding."""
    model = CapacityMoE(D, H, E, 3, ASSIGNMENT)
    x = torch.randn(len(ASSIGNMENT), D)
    with FlopCounter(model) as fc:
        model(x).sum().backward()
    layer = fc.experts()["experts"]
    assert layer.tokens == (3, 2, 3, 0) and layer.rows == (3, 3, 3, 3)
    assert layer.padding_rows == 4 and layer.padding == pytest.approx(4 / 12)
    # the kernel computes every slot: its MACs are those of the rows, padding included
    assert fc.by_module("forward")["experts"].macs == E * 3 * 2 * D * H


@pytest.mark.parametrize("kernel", ["eager", "batched_mm", "grouped_mm"])
def test_mixtral_experts_follow_the_router(kernel):
    """transformers' Mixtral (fused experts): each layer's tokens per expert are the
    router's top-k choices (read here by a hook on the router), 2 per token; the experts'
    forward MACs are those tokens x 3 (gate, up, down) x d x h, whichever kernel runs."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config)
    if kernel != "eager":
        model.set_experts_implementation(kernel)
    ids = torch.randint(0, 64, (2, 8))
    chosen = []
    hooks = [layer.mlp.gate.register_forward_hook(
        lambda m, a, out: chosen.append(torch.bincount(out[2].flatten(), minlength=4)))
        for layer in model.model.layers]
    with FlopCounter(model) as fc:
        model(ids).logits.sum().backward()
    for h in hooks:
        h.remove()
    load = fc.experts()
    assert list(load) == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    forward = fc.by_module("forward")
    for (name, layer), router in zip(load.items(), chosen):
        assert layer.tokens == tuple(router.tolist())
        assert layer.total == 16 * 2 and layer.padding == 0
        assert forward[name].macs == layer.total * 3 * 16 * 32
    assert not any(type(m).__name__ == "MixtralExperts" and m._forward_pre_hooks
                   for m in model.modules())  # the hooks are gone


def test_no_experts_no_hooks_and_figures_combine(tmp_path):
    """A model without experts: {} and a sentence; the facts survive JSON, add up over
    merged runs, and a bad file is refused naming the field."""
    plain = nn.Linear(2, 2)
    with FlopCounter(plain) as fc:
        plain(torch.ones(1, 2))
    assert fc.experts() == {} and "No MoE layers" in fc.experts_table()
    model = ListMoE(D, H, E, ASSIGNMENT)
    with FlopCounter(model) as fc:
        model(torch.randn(len(ASSIGNMENT), D))
    fc.to_json(tmp_path / "moe.json")
    back = Profile.from_json(tmp_path / "moe.json")
    assert back.experts()["experts"].tokens == tuple(TOKENS)
    twice = Profile.merge([back, back]).experts()["experts"]
    assert twice.tokens == tuple(2 * t for t in TOKENS) and twice.calls == 2
    data = back.to_dict()
    data["experts"][0]["tokens"] = [1, -1]
    with pytest.raises(ValueError, match=r"experts\[0\]\.tokens\[1\] is -1"):
        Profile.from_dict(data)


def test_expert_plot():
    """One row of bars per layer, a bar per expert (and a padding bar each, stacked, for a
    capacity layer); a layer the run has not got is a ValueError naming the run's."""
    pytest.importorskip("matplotlib")
    from dispatch_flops import plot

    model = CapacityMoE(D, H, E, 3, ASSIGNMENT)
    with FlopCounter(model) as fc:
        model(torch.randn(len(ASSIGNMENT), D))
    fig = plot.experts(fc)
    (ax,) = fig.axes
    heights = [round(b.get_height()) for b in ax.patches]
    assert heights == [3, 2, 3, 0, 0, 1, 0, 3]  # tokens, then padding on top
    assert "max/mean" in ax.get_title()
    with pytest.raises(ValueError, match="the run's"):
        plot.experts(fc, layers=["nope"])


def test_transformers_grouped_mm_fallback_is_priced_as_its_mm_loop():
    """transformers' own grouped matmul op (what its experts run where torch has no
    _grouped_mm) costs what its loop of per-expert mm calls costs, forward and backward."""
    pytest.importorskip("transformers")
    import torch.nn.functional as F
    from transformers.integrations import moe  # registers the op
    del moe
    op = getattr(torch.ops.transformers, "grouped_mm_fallback", None)
    if op is None:
        pytest.skip("this transformers has no grouped_mm_fallback op")
    torch.manual_seed(0)
    x = torch.randn(11, 6, requires_grad=True)
    weight = torch.randn(3, 6, 5, requires_grad=True)
    offs = torch.tensor([4, 4, 11])  # expert 1 gets no rows
    with FlopCounter() as fc:
        op(x, weight, offs).sum().backward()
    with FlopCounter() as loop:  # the oracle: the same product as one mm per expert's rows
        start, out = 0, []
        for e, end in enumerate(offs.tolist()):
            out.append(F.linear(x[start:end], weight[e].T))
            start = end
        torch.cat(out).sum().backward()
    assert not any("grouped_mm" in op for op in fc.unsupported_ops())
    for phase in ("forward", "backward"):
        assert fc.by_phase()[phase].macs == loop.by_phase()[phase].macs > 0
