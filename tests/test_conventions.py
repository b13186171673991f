"""The field's MFU conventions side by side (``conventions``): on meta-device models built from
the published configs, each row equals that convention's published closed form for the config,
worked out here from the config alone, to the flop."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from dispatch_flops import FlopCounter, Profile
from dispatch_flops.results.combine import since
from dispatch_flops.results.conventions import WIDTH, rows_of
from dispatch_flops.results.roofline import DEVICES

transformers = pytest.importorskip("transformers")

A100 = DEVICES["A100-SXM4-80GB"]
NAMES = ("6N", "6N no embeddings", "PaLM", "PaLM causal", "torchtitan", "Megatron")


def _count(model_class, config, batch: int, seq: int, backward: bool = True):
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = model_class(config).to(torch.bfloat16)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    with FlopCounter(model) as fc:
        out = model(input_ids=ids, labels=ids)
        if backward:
            out.loss.backward()
    return fc.to_profile()


def _published(n, e, layers, heads, head_dim, seq, megatron) -> dict:
    """The conventions' closed forms for a config: N, E and L·H·Q·T put in."""
    lhqt = layers * heads * head_dim * seq
    return {"6N": 6 * n, "6N no embeddings": 6 * (n - e), "PaLM": 6 * n + 12 * lhqt,
            "PaLM causal": 6 * n + 6 * lhqt, "torchtitan": 6 * (n - e) + 12 * lhqt,
            "Megatron": megatron}


def _megatron(*, h, layers, heads, groups, head_dim, ffn, glu, seq, vocab, routed=1):
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py,
    transformer_flops) per token, for a GQA / SwiGLU / MoE transformer: 3 (forward, wgrad,
    dgrad) x 2 (flops per MAC) x the GEMMs, causal half of attention, the logit GEMM."""
    q, kv = head_dim * heads, head_dim * groups
    mlp = 3 * 2 * h * ffn * routed * (3 if glu else 2) * layers
    attention = 3 * 2 * (h * (q + 2 * kv) + q * seq // 2 * 2 + q * h) * layers
    return mlp + attention + 3 * 2 * h * vocab


def _check(profile, published: dict, tokens: int):
    c = profile.conventions()
    assert c.shape.tokens == tokens and c.shape.tokens_seen
    for name in NAMES:
        assert c[name].flops_per_token == published[name], name
    return c


def test_llama3_8b_rows_and_torchtitan_mfus():
    """Llama-3-8B (8,030,261,248 parameters) at seq 8,192: every row is its closed form, and at
    2,973 tokens/s on an A100-SXM4-80GB (312 TFLOP/s bf16) the three readings of torchtitan's
    run are 58.2 % (6N + 12·LHQT), 55.2 % (torchtitan's, no embeddings) and 52.05 % (causal)."""
    V, h, L, H, G, ffn, T = 128256, 4096, 32, 32, 8, 14336, 8192
    d = h // H
    config = transformers.LlamaConfig(
        vocab_size=V, hidden_size=h, intermediate_size=ffn, num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=G, max_position_embeddings=T)
    profile = _count(transformers.LlamaForCausalLM, config, 1, T)
    n = 2 * V * h + L * (2 * h * h + 2 * h * G * d + 3 * h * ffn + 2 * h) + h
    assert n == 8_030_261_248
    published = _published(n, V * h, L, H, d, T, _megatron(
        h=h, layers=L, heads=H, groups=G, head_dim=d, ffn=ffn, glu=True, seq=T, vocab=V))
    _check(profile, published, T)
    assert published["PaLM"] == 61_066_469_376  # the 6·8.03e9 + 12·32·4096·8192

    c = profile.conventions(tokens_per_s=2973, device=A100)
    assert c.peak_flops == 312e12 and c.dtype == "bfloat16"
    for name in NAMES:
        assert c[name].mfu == published[name] * 2973 / 312e12
    table = str(c)
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert lines["PaLM"].endswith("58.2 %")
    assert lines["torchtitan"].endswith("55.2 %")
    # 52.0504 %: the 52.0 % rounds N to 8.03e9 (52.0489 %)
    assert lines["PaLM causal"].endswith("52.1 %")
    rounded = dataclasses.replace(c.shape, parameters=8_030_000_000)
    mfus = {r[0]: r[2] * 2973 / 312e12 for r in rows_of(rounded)[0]}
    assert [f"{100 * mfus[k]:.1f}" for k in ("PaLM", "torchtitan", "PaLM causal")] == \
        ["58.2", "55.2", "52.0"]
    assert max(map(len, table.splitlines())) <= WIDTH


def test_llama2_7b_rows():
    """Llama-2-7B (6,738,415,616 parameters, multi-head, seq 4,096)."""
    V, h, L, H, ffn, T = 32000, 4096, 32, 32, 11008, 4096
    d = h // H
    config = transformers.LlamaConfig(
        vocab_size=V, hidden_size=h, intermediate_size=ffn, num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=H, max_position_embeddings=T)
    profile = _count(transformers.LlamaForCausalLM, config, 1, T)
    n = 2 * V * h + L * (4 * h * h + 3 * h * ffn + 2 * h) + h
    assert n == 6_738_415_616
    _check(profile, _published(n, V * h, L, H, d, T, _megatron(
        h=h, layers=L, heads=H, groups=H, head_dim=d, ffn=ffn, glu=True, seq=T, vocab=V)), T)


def test_gpt3_175b_rows():
    """GPT-3 175B as the GPT-2 architecture (96 layers, d 12,288, 96 heads, context 2,048,
    vocab 50,257): biases, learned positions and an LM head tied to the token embedding. Its
    attention runs eager on meta (softmax beside two bmm), read all the same; two sequences."""
    V, h, L, H, T = 50257, 12288, 96, 96, 2048
    config = transformers.GPT2Config(n_layer=L, n_embd=h, n_head=H, n_positions=T,
                                     vocab_size=V)
    profile = _count(transformers.GPT2LMHeadModel, config, 2, T)
    n = V * h + T * h + L * (12 * h * h + 13 * h) + 2 * h
    assert round(n / 1e9, 1) == 174.6
    c = _check(profile, _published(n, V * h + T * h, L, H, h // H, T, _megatron(
        h=h, layers=L, heads=H, groups=H, head_dim=h // H, ffn=4 * h, glu=False, seq=T,
        vocab=V)), 2 * T)
    assert c.shape.tied and c.shape.lm_head == V * h


def test_mixtral_8x7b_rows():
    """Mixtral-8x7B (46.7e9 parameters, 12.9e9 a token uses: 2 of 8 experts), seq 4,096: N is
    the parameters a token uses, Megatron's routed experts are k x the expert FFN, the router
    is not a GEMM it counts."""
    V, h, L, H, G, ffn, E, k, T = 32000, 4096, 32, 32, 8, 14336, 8, 2, 4096
    d = h // H
    config = transformers.MixtralConfig(
        vocab_size=V, hidden_size=h, intermediate_size=ffn, num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=G, num_local_experts=E,
        num_experts_per_tok=k)
    profile = _count(transformers.MixtralForCausalLM, config, 1, T)
    total = 2 * V * h + L * (2 * h * h + 2 * h * G * d + E * 3 * h * ffn + E * h + 2 * h) + h
    assert total == 46_702_792_704
    n = total - L * (E - k) * 3 * h * ffn
    assert round(n / 1e9, 1) == 12.9
    c = _check(profile, _published(n, V * h, L, H, d, T, _megatron(
        h=h, layers=L, heads=H, groups=G, head_dim=d, ffn=ffn, glu=True, seq=T, vocab=V,
        routed=k)), T)
    assert c.shape.experts == (E, k)
    assert c.shape.inactive == L * (E - k) * 3 * h * ffn


class _Block(torch.nn.Module):
    """An MoE block the older way: a router ``gate`` and a ModuleList of experts, top-k taken
    in the block's own forward."""

    def __init__(self, h: int, ffn: int, experts: int, k: int):
        super().__init__()
        self.k = k
        self.gate = torch.nn.Linear(h, experts, bias=False)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(h, ffn), torch.nn.ReLU(), torch.nn.Linear(ffn, h))
            for _ in range(experts))

    def forward(self, x):
        weights, chosen = self.gate(x).softmax(-1).topk(self.k, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            hit = (chosen == e).any(-1, keepdim=True)
            out = out + hit * expert(x)
        return out


def test_module_list_experts_and_a_router_in_the_block():
    """Experts held as a ModuleList of E modules, top-k run in the block itself: N counts
    k / E of them; the router (a [E, h] weight) is no GEMM of Megatron's."""
    h, ffn, E, k = 8, 16, 4, 2
    model = torch.nn.Sequential(torch.nn.Embedding(50, h), _Block(h, ffn, E, k))
    with FlopCounter(model) as fc:
        model(torch.zeros(2, 5, dtype=torch.long)).sum().backward()
    s = fc.conventions(tokens=10).shape
    expert = 2 * h * ffn + ffn + h
    assert s.experts == (E, k) and s.inactive == (E - k) * expert
    assert s.parameters == 50 * h + E * h + k * expert
    assert s.matrices == k * 2 * h * ffn  # the experts' weights a token uses: not the router's
    assert s.other == E * h + k * (ffn + h)  # router and biases


@pytest.mark.parametrize("layers", [2, 4])
def test_forward_only_rows_are_the_forward_third_and_scale_with_layers(layers):
    """Counted forward only, each row is its formula's forward third (2N, 4·L·H·Q·T, ...);
    the attention terms grow with the layers the module tree ran."""
    V, h, H, ffn, T = 1000, 256, 4, 512, 64
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=h, intermediate_size=ffn,
                                      num_hidden_layers=layers, num_attention_heads=H)
    profile = _count(transformers.LlamaForCausalLM, config, 3, T, backward=False)
    c = profile.conventions()
    n = 2 * V * h + layers * (4 * h * h + 3 * h * ffn + 2 * h) + h
    lhqt = layers * h * T
    assert c.shape.passes == 1 and c.shape.layers == layers and c.shape.tokens == 3 * T
    assert c["6N"].flops_per_token == 2 * n
    assert c["PaLM"].flops_per_token == 2 * n + 4 * lhqt
    assert c["torchtitan"].flops_per_token == 2 * (n - V * h) + 4 * lhqt
    assert c["Megatron"].flops_per_token == 2 * (layers * (4 * h * h + 3 * h * ffn) + V * h) \
        + 2 * lhqt
    assert c["measured"].flops_per_token == profile.model_flops() / (3 * T)


def test_real_run_reads_fused_causal_attention_and_recompute():
    """A real CPU run: the fused SDPA kernel says it is causal; gradient checkpointing adds a
    recompute row (hardware flops) that no MFU row includes."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2)
    config._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(config)
    enable = getattr(model, "activation_checkpointing_enable", None) or \
        model.gradient_checkpointing_enable
    enable()
    model.train()
    ids = torch.randint(0, 100, (2, 8))
    with FlopCounter(model) as fc:
        model(input_ids=ids, labels=ids).loss.backward()
    c = fc.conventions()
    assert c.shape.causal is True and c.shape.tokens == 16
    assert (c.shape.layers, c.shape.heads, c.shape.head_dim, c.shape.keys) == (2, 4, 8, 8)
    recompute = fc.by_phase()["recompute"].flops
    assert recompute > 0
    assert c["measured + recompute"].flops_per_token == \
        (fc.model_flops() + recompute) / 16
    assert "recompute" in {d.name for d in c.differences}


def test_eager_attention_is_read_from_softmax_and_its_contractions():
    """Eager attention (no fused op): heads, head dim and keys from the softmax over
    [b, h, s_q, s_k] and the two contractions beside it."""
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32,
                                     vocab_size=100)
    config._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 100, (2, 16))
    with FlopCounter(model) as fc:
        model(input_ids=ids, labels=ids).loss.backward()
    s = fc.conventions().shape
    assert (s.layers, s.heads, s.head_dim, s.keys, s.tokens) == (2, 4, 16, 16, 32)
    assert s.causal is None  # the mask is a tensor


def test_saved_merged_and_given_tokens():
    """The facts survive to_json / from_json; a merge of two steps has twice the tokens and
    the same rows per token; given tokens replace the ones read."""
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4)
    config._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 100, (2, 8))
    runs = []
    for _ in range(2):
        with FlopCounter(model) as fc:
            model(input_ids=ids, labels=ids).loss.backward()
        runs.append(fc.to_profile())
        model.zero_grad(set_to_none=True)  # the next step alike (no gradient accumulation)
    one = runs[0].conventions()
    loaded = Profile.from_dict(json.loads(json.dumps(runs[0].to_dict())))
    assert loaded.conventions() == one
    merged = Profile.merge(runs).conventions()
    assert merged.shape.tokens == 32
    assert [r.flops_per_token for r in merged.rows] == [r.flops_per_token for r in one.rows]
    given = runs[0].conventions(tokens=32)
    assert not given.shape.tokens_seen
    assert given["6N"].flops_per_token == one["6N"].flops_per_token
    assert given["measured"].flops_per_token == one["measured"].flops_per_token / 2


def test_a_step_cut_from_a_run_has_its_own_tokens():
    """``since`` (how profile_generate cuts steps) subtracts the attention calls too: a
    step's conventions read that step's tokens, not the run's so far."""
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4)
    config._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad(), FlopCounter(model) as fc:
        model(input_ids=torch.zeros(1, 8, dtype=torch.long))
        first = fc.to_profile()
        model(input_ids=torch.zeros(3, 8, dtype=torch.long))
        both = fc.to_profile()
    assert first.conventions().shape.tokens == 8 and both.conventions().shape.tokens == 32
    assert since(both, first).conventions().shape.tokens == 24


def test_bad_input_is_a_clear_error():
    with FlopCounter() as fc:
        torch.ones(4, 4) @ torch.ones(4, 4)
    with pytest.raises(ValueError, match="model's parameters"):
        fc.conventions()
    model = torch.nn.Linear(4, 4)
    with FlopCounter(model) as fc:
        model(torch.ones(2, 4))
    with pytest.raises(ValueError, match="pass tokens="):
        fc.conventions()
    with pytest.raises(ValueError, match="positive int"):
        fc.conventions(tokens=0)
    with pytest.raises(ValueError, match="tokens_per_s must be a positive number"):
        fc.conventions(tokens=2, tokens_per_s=-1.0, device=A100)
    assert fc.conventions(tokens=2)["6N"].flops_per_token == 2 * 20  # forward only: 2N
    with pytest.raises(KeyError, match="no convention"):
        fc.conventions(tokens=2)["nope"]
