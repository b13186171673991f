"""``check_formula``: a hand-written formula against what the model runs on meta. Each
public bug class, written into a small config, is flagged on the right component and its
correction is exact; the reference formulas' misses equal closed forms worked out here from
the config alone; a hypothesis sweep shrinks to the smallest failing config; the table in
docs/formulas.md is what benchmarks/formula_table.py prints."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import warnings

import pytest
import torch
from torch import nn

import dispatch_flops
from dispatch_flops import check_formula
from dispatch_flops.workflows import mfu_formulas
from dispatch_flops.workflows.formula_check import UNNAMED

transformers = pytest.importorskip("transformers")
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEQ = 32
pytestmark = pytest.mark.filterwarnings("ignore")


def _table_module():
    spec = importlib.util.spec_from_file_location("formula_table",
                                                  ROOT / "benchmarks" / "formula_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _llama(**kw):
    fields = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    fields.update(kw)
    config = transformers.LlamaConfig(**fields)
    config._attn_implementation = "sdpa"
    return config


def _qwen_moe(**kw):
    fields = dict(vocab_size=256, hidden_size=64, intermediate_size=160,
                  moe_intermediate_size=32, shared_expert_intermediate_size=96, num_experts=4,
                  num_experts_per_tok=2, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2)
    fields.update(kw)
    config = transformers.Qwen2MoeConfig(**fields)
    config._attn_implementation = "sdpa"
    return config


def _exact(config, *, seq: int, experts_layers=None, expert_width=None, shared_scale=1,
           embeddings=False, attention_seq=None) -> dict:
    """Training flops per token of a Llama-style decoder, worked out from the config: 3
    passes x 2 flops per MAC over every GEMM, attention's QK^T and AV at full square (what
    the meta count runs), the router and the shared expert's gate. The keywords plant the
    public bugs."""
    h, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    kv = config.num_key_value_heads
    d = h // heads
    t = attention_seq or seq
    out = {"attention": 6 * layers * (h * (heads + 2 * kv) * d + heads * d * h
                                      + 2 * heads * d * t)}
    experts = getattr(config, "num_experts", 0)
    if experts:
        moe_layers = layers if experts_layers is None else experts_layers
        width = config.moe_intermediate_size if expert_width is None else expert_width
        out["experts"] = 6 * moe_layers * 3 * h * width * config.num_experts_per_tok
        out["shared_expert"] = 6 * layers * 3 * h * config.shared_expert_intermediate_size \
            // shared_scale
        out["mlp"] = 6 * layers * h * (experts + 1)  # the router and the shared expert's gate
    else:
        out["mlp"] = 6 * layers * 3 * h * config.intermediate_size
    out["lm_head"] = 6 * h * config.vocab_size
    if embeddings:
        out["embeddings"] = 6 * h * config.vocab_size  # priced as a matmul (TRL PR#5698)
    return out


def test_exported():
    """check_formula is public: in dispatch_flops and its __all__."""
    assert "check_formula" in dispatch_flops.__all__


def test_exact_formula_is_exact_per_component():
    """The closed form above equals the counted work, in total and per named component."""
    check = check_formula(lambda c, seq: _exact(c, seq=seq), [_llama(), _qwen_moe()], seq=SEQ)
    assert check.exact, str(check)
    for row in check.rows:
        assert [c.name for c in row.components if c.name == UNNAMED] == []
        assert row.contractions == row.formula


def test_embeddings_as_matmul_flagged():
    """TRL PR#5698: the embedding lookup priced as a 2Vh matmul: 'embeddings' flagged, by
    6Vh per token; corrected (a lookup: no flops) exact."""
    config = _llama()
    bad = check_formula(lambda c, seq: _exact(c, seq=seq, embeddings=True), [config], seq=SEQ)
    row = bad.rows[0]
    assert row.failing() == ("total", "embeddings")
    (embed,) = [c for c in row.components if c.name == "embeddings"]
    assert embed.counted == 0 and embed.modules == ("model.embed_tokens",)
    assert embed.miss == 6 * config.hidden_size * config.vocab_size * SEQ
    good = check_formula(lambda c, seq: {**_exact(c, seq=seq), "embeddings": 0}, [config],
                         seq=SEQ)
    assert good.exact


def test_shared_expert_undercounted_flagged():
    """MaxText PR#4017: the shared expert counted a third of its work: 'shared_expert'
    flagged with its miss, -2/3 of it; corrected exact."""
    config = _qwen_moe()
    bad = check_formula(lambda c, seq: _exact(c, seq=seq, shared_scale=3), [config], seq=SEQ)
    row = bad.rows[0]
    assert row.failing() == ("total", "shared_expert")
    (shared,) = [c for c in row.components if c.name == "shared_expert"]
    assert shared.error == pytest.approx(-2 / 3)
    assert len(shared.modules) == config.num_hidden_layers
    assert check_formula(lambda c, seq: _exact(c, seq=seq), [config], seq=SEQ).exact


def test_moe_layer_off_by_one_flagged():
    """TRL PR#7069: the MoE layer rule one layer short: 'experts' flagged, short by one
    layer's experts; corrected exact."""
    config = _qwen_moe()
    layers = config.num_hidden_layers
    bad = check_formula(lambda c, seq: _exact(c, seq=seq, experts_layers=layers - 1),
                        [config], seq=SEQ)
    (experts,) = [c for c in bad.rows[0].components if c.name == "experts"]
    assert bad.rows[0].failing() == ("total", "experts")
    assert experts.error == pytest.approx(-1 / layers)


def test_moe_total_parameters_flagged():
    """torchtitan PR#4300 class: experts priced at all of them, not the top-k a token uses:
    'experts' flagged, E/k times the counted."""
    config = _qwen_moe()
    width = config.moe_intermediate_size * config.num_experts // config.num_experts_per_tok
    bad = check_formula(lambda c, seq: _exact(c, seq=seq, expert_width=width), [config],
                        seq=SEQ)
    (experts,) = [c for c in bad.rows[0].components if c.name == "experts"]
    assert experts.error == pytest.approx(config.num_experts / config.num_experts_per_tok - 1)


class Float8Linear(nn.Linear):
    """A stand-in for torchao's Float8Linear: an nn.Linear subclass."""


def _float8_mlps(config):
    model = transformers.AutoModelForCausalLM.from_config(config)
    for layer in model.model.layers:
        for name in ("gate_proj", "up_proj", "down_proj"):
            old = getattr(layer.mlp, name)
            setattr(layer.mlp, name, Float8Linear(old.in_features, old.out_features,
                                                  bias=False, device=old.weight.device))
    return model


def _linear_params(model, exact_type: bool, part: str) -> int:
    return sum(m.weight.numel() for name, m in model.named_modules()
               if (type(m) is nn.Linear if exact_type else isinstance(m, nn.Linear))
               and part in name)


def test_float8_linear_missed_flagged():
    """nanochat PR#815: a formula summing nn.Linear weights by exact type misses the
    Float8Linear ones: 'mlp' flagged at -100 %; isinstance corrects it, exact."""
    config = _llama()

    def formula(c, seq, model, exact_type=True):
        out = _exact(c, seq=seq)
        out["mlp"] = 6 * _linear_params(model, exact_type, ".mlp.")
        return out

    bad = check_formula(formula, [config], seq=SEQ, model=_float8_mlps)
    (mlp,) = [c for c in bad.rows[0].components if c.name == "mlp"]
    assert mlp.formula == 0 and mlp.error == -1
    good = check_formula(lambda c, seq, model: formula(c, seq, model, exact_type=False),
                         [config], seq=SEQ, model=_float8_mlps)
    assert good.exact


def test_config_sequence_length_flagged():
    """Megatron-Bridge#3498: the config's sequence length, not the batch's: 'attention'
    flagged, over by the attention of the missing tokens; corrected exact."""
    config = _llama(max_position_embeddings=256)
    bad = check_formula(lambda c, seq: _exact(c, seq=seq, attention_seq=c.max_position_embeddings),
                        [config], seq=SEQ)
    assert bad.rows[0].failing() == ("total", "attention")
    (attention,) = [c for c in bad.rows[0].components if c.name == "attention"]
    h, layers = config.hidden_size, config.num_hidden_layers
    assert attention.miss == 6 * layers * 2 * h * (256 - SEQ) * SEQ


def test_sweep_shrinks_to_smallest_failing():
    """A formula wrong only with grouped KV heads (it prices K and V at every head): the
    sweep finds it and shrinks to one layer and one KV head; the wrong part is attention."""
    def formula(c, seq):
        return _exact(_llama(**{**c.to_dict(), "num_key_value_heads": c.num_attention_heads,
                                "vocab_size": c.vocab_size}), seq=seq)

    check = check_formula(formula, sweep={"num_hidden_layers": st.integers(1, 3),
                                          "num_key_value_heads": st.sampled_from([4, 2, 1])},
                          base=_llama(), examples=20, seq=SEQ)
    small = check.smallest_failing
    assert small is not None and not small.exact
    assert dict(small.config) == {"num_hidden_layers": 1, "num_key_value_heads": 2}
    assert small.failing() == ("total", "attention")
    assert "smallest failing config" in str(check)


def _norms(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.dim() == 1)


def test_reference_misses_are_closed_forms():
    """On Llama: PaLM is over by 6 (E + norms) per token, torchtitan by 6 norms (the tensor
    parameters no GEMM uses), Megatron's attention under by its causal half, vLLM's forward
    exact; on GPT-2 vLLM's SwiGLU FFN over by one h x 4h matrix per layer."""
    config = _llama()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    embed, norms = config.vocab_size * config.hidden_size, _norms(model)
    palm = check_formula(mfu_formulas.palm, [config], seq=SEQ).rows[0]
    assert palm.formula - palm.contractions == 6 * (embed + norms) * SEQ
    titan = check_formula(mfu_formulas.torchtitan, [config], seq=SEQ).rows[0]
    assert titan.formula - titan.contractions == 6 * norms * SEQ
    mega = check_formula(mfu_formulas.megatron, [config], seq=SEQ).rows[0]
    (attention,) = [c for c in mega.components if c.name == "attention"]
    heads, d = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    assert attention.miss == -12 * config.num_hidden_layers * heads * d * (SEQ - SEQ // 2) * SEQ
    assert [c.name for c in mega.components if c.error] == ["attention"]
    table = _table_module()
    vllm = check_formula(mfu_formulas.vllm_perf, [config], seq=SEQ, training=False,
                         per="step", inputs=table.serving_inputs)
    assert vllm.exact
    gpt2 = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4)
    gpt2._attn_implementation = "sdpa"
    row = check_formula(mfu_formulas.vllm_perf, [gpt2], seq=SEQ, training=False, per="step",
                        inputs=table.serving_inputs).rows[0]
    (mlp,) = [c for c in row.components if c.name == "mlp"]
    assert mlp.miss == 2 * 64 * 4 * 64 * SEQ * 2


def test_docs_table_is_the_scripts():
    """docs/formulas.md's table is what benchmarks/formula_table.py prints now."""
    table = _table_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        printed = table.markdown(table.run())
    page = (ROOT / "docs" / "formulas.md").read_text()
    assert printed in page, printed
    assert re.search(r"\| vLLM perf\.py \| exact \|", printed)
