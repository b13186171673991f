"""profile_generate: a real generate() cut into prefill and decode steps.

Oracles are computed here from each model's config: a decode step's MACs are the linear
layers for one token per sequence plus attention over the keys the cache holds; the KV cache
holds 2 x layers x kv_heads x head_dim x positions x batch x dtype bytes."""

import pytest
import torch
from torch.nn.modules.module import _global_forward_pre_hooks

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from dispatch_flops import (  # noqa: E402
    COMPUTE_BOUND,
    DECODE,
    DEVICES,
    MEMORY_BOUND,
    PREFILL,
    FlopCounter,
    Profile,
    profile_generate,
)

pytestmark = pytest.mark.slow  # transformers models run through generate()

LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             bos_token_id=None, eos_token_id=None)  # no end of sequence: every step runs
GREEDY = dict(do_sample=False, pad_token_id=0)


def llama(**overrides):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**LLAMA, **overrides})).eval()


def llama_token_macs(c) -> int:
    """MACs of the linear layers for one token: q, k, v, o, the gated MLP, the lm head."""
    h, d = c.hidden_size, c.hidden_size // c.num_attention_heads
    per_layer = 2 * h * h + 2 * h * c.num_key_value_heads * d + 3 * h * c.intermediate_size
    return c.num_hidden_layers * per_layer + h * c.vocab_size


def attention_macs(c, batch, queries, keys, layers=None) -> int:
    """q·kᵀ and p·v for every query head: (d + d) MACs per (query, key) pair."""
    d = c.hidden_size // c.num_attention_heads
    layers = c.num_hidden_layers if layers is None else layers
    return layers * batch * c.num_attention_heads * queries * keys * 2 * d


def kv_bytes(c, positions, batch, dtype_bytes=4) -> int:
    d = c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * d * positions * batch * dtype_bytes


@pytest.mark.parametrize("batch", [1, 2])
def test_llama_gqa_decode_steps_match_the_analytic_count(batch):
    """Each decode step: one token's linear layers per sequence + attention over P + t keys;
    the cache grows by one position per step."""
    model = llama()
    c, prompt, new = model.config, 5, 4
    ids = torch.randint(0, c.vocab_size, (batch, prompt))
    gp = profile_generate(model, ids, max_new_tokens=new, **GREEDY)
    assert len(gp.decode) == new - 1  # the last token is sampled from the last step's logits
    costs = gp.per_token()
    assert [s.phase for s in costs] == [PREFILL] + [DECODE] * (new - 1)
    for t, step in enumerate(costs[1:], 1):
        assert step.macs == batch * llama_token_macs(c) + attention_macs(c, batch, 1,
                                                                          prompt + t)
        assert step.positions == prompt + t and step.sequences == batch
    assert list(gp.kv_cache_bytes) == [kv_bytes(c, prompt + t, batch) for t in range(new)]
    assert gp.kv_cache_filled_bytes == gp.kv_cache_bytes


def test_prefill_is_one_forward_of_the_prompt():
    """The prefill's MACs are one forward of the prompt's, with the logits generate asks for
    (the last position's)."""
    model = llama()
    ids = torch.randint(0, 64, (2, 6))
    gp = profile_generate(model, ids, max_new_tokens=2, **GREEDY)
    with torch.no_grad(), FlopCounter(model) as fc:
        model(ids, use_cache=True, logits_to_keep=1)
    assert gp.prefill.total.macs == fc.total.macs
    c = model.config
    causal_dense = attention_macs(c, 2, 6, 6)
    assert gp.prefill.total.macs == 2 * 6 * (llama_token_macs(c) - c.hidden_size
                                             * c.vocab_size) + 2 * c.hidden_size * \
        c.vocab_size + causal_dense


def test_steps_encoder_and_outside_add_up_to_the_run():
    """Every op lands in exactly one part: steps + outside == the whole run."""
    model = llama()
    gp = profile_generate(model, torch.randint(0, 64, (1, 4)), max_new_tokens=3, **GREEDY)
    merged = Profile.merge(list(gp.steps) + [gp.outside])
    for field in ("calls", "flops", "macs", "bytes_read", "bytes_written"):
        assert getattr(merged.total, field) == getattr(gp.total.total, field), field
    assert gp.outside.total.calls > 0  # argmax, stopping criteria: generate's own work
    assert all(p.module_facts.calls[""] == 1 for p in gp.steps)


def test_static_cache_attention_runs_over_the_whole_cache():
    """StaticCache: every decode step attends over the static length; the cache holds it
    all from the prefill on; index_copy_ moves one position per layer, k and v."""
    model = llama()
    c, prompt, new, batch = model.config, 5, 4, 2
    ids = torch.randint(0, 64, (batch, prompt))
    gp = profile_generate(model, ids, max_new_tokens=new, cache_implementation="static",
                          **GREEDY)
    length = gp.kv_cache_bytes[0] // kv_bytes(c, 1, batch)
    assert length >= prompt + new - 1
    assert set(gp.kv_cache_bytes) == {kv_bytes(c, length, batch)}
    assert list(gp.kv_cache_filled_bytes) == [kv_bytes(c, prompt + t, batch)
                                              for t in range(new)]
    for step in gp.decode:
        assert step.total.macs == batch * llama_token_macs(c) + attention_macs(c, batch, 1,
                                                                                length)
        update = step.by_operator()["aten.index_copy_"]
        one_position = kv_bytes(c, 1, batch)  # k and v of every layer
        assert update.bytes_written == one_position
        assert update.bytes_read == one_position + update.calls * 8  # + the int64 position
    assert "filled" in gp.table()


def test_gpt2_decode_macs():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                       n_positions=64, bos_token_id=None, eos_token_id=None)).eval()
    c, prompt = model.config, 4
    gp = profile_generate(model, torch.randint(0, 64, (1, prompt)), max_new_tokens=4,
                          **GREEDY)
    per_token = c.n_layer * 12 * c.n_embd ** 2 + c.n_embd * c.vocab_size
    d = c.n_embd // c.n_head
    for t, step in enumerate(gp.decode, 1):
        assert step.total.macs == per_token + c.n_layer * c.n_head * (prompt + t) * 2 * d
    assert gp.kv_cache_bytes[-1] == 2 * c.n_layer * c.n_embd * (prompt + 3) * 4


def test_t5_encoder_once_decoder_per_token():
    """The encoder runs once, outside the steps; decoder self-attention grows by one key per
    token while cross-attention stays over the encoder's length."""
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)).eval()
    c, batch, source, new = model.config, 2, 6, 4
    gp = profile_generate(model, torch.randint(1, 64, (batch, source)), max_new_tokens=new,
                          do_sample=False)
    assert gp.encoder is not None and gp.encoder.module_facts.calls["encoder"] == 1
    assert all(not any(n.startswith("encoder") for n in p.module_facts.calls)
               for p in gp.steps)
    per_position = 2 * c.num_decoder_layers * c.num_heads * c.d_kv * batch * 4
    cross = per_position * source
    # the decoder starts from its start token: a forward call per new token
    assert list(gp.kv_cache_bytes) == [cross + per_position * (t + 1) for t in range(new)]
    # decoder linear layers per token: self q,k,v,o; cross q,o (k,v once, in the prefill);
    # gated-free ReLU MLP; lm head
    inner = c.num_heads * c.d_kv
    token = c.num_decoder_layers * (6 * c.d_model * inner + 2 * c.d_model * c.d_ff) \
        + c.d_model * c.vocab_size
    for t, step in enumerate(gp.decode, 1):
        attention = c.num_decoder_layers * batch * c.num_heads * 2 * c.d_kv * ((t + 1) + source)
        assert step.total.macs == batch * token + attention


def test_mixtral_decode_counts_the_routed_experts():
    """Each token meets top_k experts whatever the router picks: the router, top_k expert
    MLPs per token, attention over the cache."""
    torch.manual_seed(0)
    config = MixtralConfig(**LLAMA, num_local_experts=4, num_experts_per_tok=2)
    model = MixtralForCausalLM(config).eval()
    c, batch, prompt = model.config, 2, 5
    gp = profile_generate(model, torch.randint(0, 64, (batch, prompt)), max_new_tokens=4,
                          **GREEDY)
    h, d = c.hidden_size, c.hidden_size // c.num_attention_heads
    attention_linear = 2 * h * h + 2 * h * c.num_key_value_heads * d
    moe = h * c.num_local_experts + c.num_experts_per_tok * 3 * h * c.intermediate_size
    token = c.num_hidden_layers * (attention_linear + moe) + h * c.vocab_size
    for t, step in enumerate(gp.decode, 1):
        assert step.total.macs == batch * token + attention_macs(c, batch, 1, prompt + t)


LLAMA2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)


def manual_decode(model):
    # the cache's name: `cache` in current transformers (`past_key_values` warns), before it
    # `past_key_values`
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"

    def run(ids, new_tokens):
        out = model(ids, use_cache=True, logits_to_keep=1)
        for _ in range(new_tokens):
            out = model(ids[:, -1:], **{name: out[name]}, use_cache=True)
    return run


def test_meta_llama2_7b_shapes_with_a_decoding_loop():
    """On the meta device (generate cannot run there) a decoding loop through fn=: the 7B
    shapes at 2 of their 32 layers, in float16, counted exactly; on an H100 decode is
    memory-bound (at least the weights' read time) and the prefill's matmuls of 512 tokens
    compute-bound."""
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA2_7B, num_hidden_layers=2)).half().eval()
    c, prompt = model.config, 512
    ids = torch.zeros(1, prompt, dtype=torch.long, device="meta")
    gp = profile_generate(model, ids, fn=manual_decode(model), new_tokens=3)
    for t, step in enumerate(gp.decode, 1):
        assert step.total.macs == llama_token_macs(c) + attention_macs(c, 1, 1, prompt + t)
    assert list(gp.kv_cache_bytes) == [kv_bytes(c, prompt + t, 1, 2) for t in range(4)]
    roof = gp.roofline("H100-SXM")
    spec = DEVICES["H100-SXM"]
    assert roof.decode_bound == MEMORY_BOUND
    # every weight is read once per step, but the embedding table: one row per token
    weights = sum(p.numel() * 2 for n, p in model.named_parameters() if "embed" not in n)
    assert roof.decode_s_per_step >= weights / spec.memory_bandwidth
    assert roof.tokens_per_s == pytest.approx(1 / roof.decode_s_per_step)
    mm = gp.prefill.by_operator()["aten.mm"]
    assert mm.flops / spec.peak_flops(torch.float16) > mm.bytes / spec.memory_bandwidth


def test_roofline_sums_each_ops_roof():
    """A step's attainable time is the sum over its records of max(flops/peak,
    bytes/bandwidth), computed here from the records."""
    model = llama()
    gp = profile_generate(model, torch.randint(0, 64, (1, 4)), max_new_tokens=3, **GREEDY)
    spec = DEVICES["A100-SXM4-80GB"]
    roof = gp.roofline(spec)
    for step, placed in zip(gp.steps, roof.steps):
        expected = sum(max(r.stats.flops / spec.peak_flops(torch.float32),
                           r.stats.bytes / spec.memory_bandwidth) for r in step.records())
        assert placed.attainable_s == pytest.approx(expected)
        assert placed.bound in (COMPUTE_BOUND, MEMORY_BOUND)
    assert roof.time_to_first_token_s == roof.steps[0].attainable_s
    assert roof.measured_tokens_per_s is None


def test_timing_measures_every_step():
    model = llama()
    gp = profile_generate(model, torch.randint(0, 64, (1, 4)), max_new_tokens=3, timing=True,
                          **GREEDY)
    assert all(s.latency_s and s.latency_s > 0 for s in gp.per_token())
    roof = gp.roofline("H100-SXM")
    assert roof.measured_tokens_per_s == pytest.approx(
        1 / (sum(p.wall_s for p in gp.decode) / len(gp.decode)))
    assert all(r.efficiency is not None for r in roof.steps)
    assert "Time" in gp.table()


def test_nothing_left_behind_and_clear_errors():
    """Hooks are removed (after a failure too); bad input names what is valid."""
    model = llama()
    hooks = (len(_global_forward_pre_hooks), dict(model._forward_hooks),
             dict(model._forward_pre_hooks), model.training)

    def failing(ids):
        model(ids)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        profile_generate(model, torch.randint(0, 64, (1, 3)), fn=failing)
    assert (len(_global_forward_pre_hooks), dict(model._forward_hooks),
            dict(model._forward_pre_hooks), model.training) == hooks
    with pytest.raises(ValueError, match="no generate"):
        profile_generate(torch.nn.Linear(2, 2), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="never called"):
        profile_generate(model, None, fn=lambda: None)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        profile_generate("gpt2", None)
    gp = profile_generate(model, torch.randint(0, 64, (1, 3)), max_new_tokens=2, **GREEDY)
    with pytest.raises(ValueError, match="H100-SXM"):
        gp.roofline("H1000")
    if not torch.cuda.is_available():  # the default: the current GPU's built-in spec
        with pytest.raises(ValueError, match="no built-in spec for this device"):
            gp.roofline()
    from dispatch_flops.results.roofline import DEVICES
    from dispatch_flops.workflows import generation

    with pytest.MonkeyPatch.context() as patch:  # on an H100: its spec, unasked
        patch.setattr(generation, "device_spec", lambda: DEVICES["H100-SXM"])
        assert gp.roofline().tokens_per_s == gp.roofline("H100-SXM").tokens_per_s
    with pytest.raises(ValueError, match="dense"):
        profile_generate(model, torch.randint(0, 64, (1, 3)), attention="flash")


def test_no_deprecation_warning_from_our_reads():
    """Reading each step's cache logs nothing: current transformers name it ``cache`` and
    warn (once per process: the cache of warnings is cleared first) on a read of
    ``past_key_values``; under ``-W error::FutureWarning`` nothing raises either."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    class Records(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    hf_logging.warning_once.cache_clear()  # a test before may have had it logged
    model = llama()
    records = Records()
    logger = hf_logging.get_logger("transformers")  # the root of transformers' loggers
    logger.addHandler(records)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            gp = profile_generate(model, torch.randint(0, 64, (1, 4)), max_new_tokens=3,
                                  **GREEDY)
    finally:
        logger.removeHandler(records)
    assert not [m for m in records.messages if "deprecated" in m], records.messages
    assert gp.kv_cache_bytes[-1] > gp.kv_cache_bytes[0] > 0  # the cache was read


def test_cache_read_under_either_name():
    """Older transformers return ``past_key_values`` (and take it as an argument); newer ones
    ``cache``: a step's cache is found under either, in its output or its arguments."""
    from dispatch_flops.workflows.generation import _cache_of

    cache = ((torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)),)
    assert _cache_of({"logits": 1, "past_key_values": cache}, {}) is cache
    assert _cache_of({"logits": 1, "cache": cache}, {}) is cache
    assert _cache_of((torch.zeros(1),), {"past_key_values": cache}) is cache
    assert _cache_of((torch.zeros(1),), {}) is None


def test_steps_are_named_as_generate_counts_tokens():
    """max_new_tokens=8 is 8 forward calls: the prefill gives the first token, 7 decode
    steps the rest; the table's last line says so."""
    gp = profile_generate(llama(), torch.randint(0, 64, (1, 4)), max_new_tokens=8, **GREEDY)
    assert len(gp.steps) == 8 and len(gp.decode) == 7
    assert gp.table().splitlines()[-1] == ("8 new tokens per sequence (1 sequence): the "
                                           "prefill's, then 7 decode steps of one token each")
    assert "8 new tokens" in repr(gp)


def test_roofline_reads_as_a_line_and_a_table():
    """repr: one short line; every step's compute and memory times are the time of its ops
    on each roof (each op at max(flops / peak, bytes / bandwidth)), summing to the attainable
    time; table(): a row per step."""
    gp = profile_generate(llama(), torch.randint(0, 64, (1, 4)), max_new_tokens=4, **GREEDY)
    spec = DEVICES["H100-SXM"]
    roof = gp.roofline(spec)
    assert len(repr(roof)) < 200 and "\n" not in repr(roof)
    assert repr(roof).startswith("GenerationRoofline(H100-SXM: first token ")
    peak, bandwidth = spec.peak_flops(torch.float32), spec.memory_bandwidth
    for step, r in zip(gp.steps, roof.steps):
        times = [(rec.stats.flops / peak, rec.stats.bytes / bandwidth) for rec in step.records()]
        assert r.compute_s == pytest.approx(sum(c for c, m in times if c >= m))
        assert r.memory_s == pytest.approx(sum(m for c, m in times if c < m))
        assert r.attainable_s == pytest.approx(r.compute_s + r.memory_s)
    rows = [row for row in roof.table().splitlines() if row.startswith(("prefill", "decode"))]
    assert [row.split()[0] for row in rows] == ["prefill", "decode", "decode", "decode"]
    assert str(roof) == roof.table()
