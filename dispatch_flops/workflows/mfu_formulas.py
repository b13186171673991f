"""The field's MFU formulas as their authors wrote them, to run through ``check_formula``.

Each is a pure function of a transformers config (and ``seq``, ``batch`` or the built
``model`` where the original reads them) and returns flops per token of one training step
(forward + backward), or per step where the original does (``vllm_perf``: a forward). None is
corrected here: where one misses what the model runs, docs/formulas.md says by how much and
why, and ``benchmarks/formula_table.py`` prints the table the tests assert.

    six_n            6 N                                    Kaplan et al. 2020
    palm             6 N + 12 L H Q T                       Chowdhery et al. 2022, app. B
    palm_causal      6 N + 6 L H Q T                        the same, masked half left out
    torchtitan       6 (N - E) + 12 L H Q T                 torchtitan llama3 get_nparams_and_flops
    megatron         3 x (GEMMs, causal attention, logits)  Megatron-LM
                                                            num_floating_point_operations
    megatron(recompute=True)  layers' forward twice         Narayanan et al. 2021, eq. (3)
    vllm_perf        qkv, out, QK^T, AV, SwiGLU FFN, unembed vllm/v1/metrics/perf.py

``N``: the model's parameters (a tied head once); ``E``: its input embedding's.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

# the config fields, under the names the families use
_LAYERS = ("num_hidden_layers", "n_layer")
_WIDTH = ("hidden_size", "n_embd")
_HEADS = ("num_attention_heads", "n_head")


def _field(config: Any, names: tuple, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if default is None:
        raise AttributeError(f"{type(config).__name__} has none of {names}")
    return default


def _dims(config: Any) -> tuple[int, int, int, int, int]:
    """``(L, h, heads, kv heads, head dim)``."""
    layers, width, heads = (_field(config, n) for n in (_LAYERS, _WIDTH, _HEADS))
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or width // heads
    return layers, width, heads, kv, head_dim


def parameters(model: nn.Module) -> int:
    """``N``: every parameter once (a tied LM head is the embedding's weight)."""
    return sum(p.numel() for p in model.parameters())


def _embedding(model: nn.Module) -> int:
    get = getattr(model, "get_input_embeddings", None)
    embed = get() if callable(get) else None
    return embed.weight.numel() if isinstance(embed, nn.Embedding) else 0


def six_n(config: Any, *, model: nn.Module) -> int:
    """6 N per token: 2 flops per parameter forward, 4 backward (Kaplan et al. 2020, 2.1)."""
    return 6 * parameters(model)


def palm(config: Any, *, model: nn.Module, seq: int) -> int:
    """6 N + 12 L H Q T (Chowdhery et al. 2022, appendix B): the attention's two T x T
    products at full square, forward and backward."""
    layers, _, heads, _, head_dim = _dims(config)
    return 6 * parameters(model) + 12 * layers * heads * head_dim * seq


def palm_causal(config: Any, *, model: nn.Module, seq: int) -> int:
    """PaLM with the causal mask's half left out: 6 N + 6 L H Q T."""
    layers, _, heads, _, head_dim = _dims(config)
    return 6 * parameters(model) + 6 * layers * heads * head_dim * seq


def torchtitan(config: Any, *, model: nn.Module, seq: int) -> int:
    """torchtitan's llama3 ``get_nparams_and_flops``: ``6 * (nparams - nparams_embedding) +
    12 * l * h * q * t``, the embedding's parameters left out (a tied head with them)."""
    layers, _, heads, _, head_dim = _dims(config)
    return 6 * (parameters(model) - _embedding(model)) + 12 * layers * heads * head_dim * seq


def _ffn(config: Any) -> tuple[int, int, int, int, int, bool]:
    """``(dense ffn, moe ffn, experts per token, shared ffn, moe layers, glu)``."""
    layers, width, *_ = _dims(config)
    dense = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) \
        or 4 * width
    top_k = getattr(config, "num_experts_per_tok", 0) or 0
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", 0)
    moe = (getattr(config, "moe_intermediate_size", None) or dense) if experts else 0
    shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
    glu = getattr(config, "hidden_act", "silu") in ("silu", "swiglu") and \
        getattr(config, "model_type", "") != "gpt2"
    return dense, moe, top_k if experts else 0, shared, layers if experts else 0, glu


def megatron(config: Any, *, seq: int, recompute: bool = False) -> dict[str, int]:
    """Megatron-LM's ``num_floating_point_operations`` per token (training.py,
    ``transformer_flops``): 3 passes (forward, weight and data gradients) x 2 flops per MAC
    over the GEMMs, attention's QK^T and AV at the causal half, the logit GEMM. With
    ``recompute`` (full activation recomputation) the layers run their forward twice: 4 passes
    (Narayanan et al. 2021, eq. (3): 96 B s l h^2 instead of 72); the logits stay 3.
    Components: ``attention``, ``mlp`` (or, with experts, ``experts`` and ``shared_expert``),
    ``lm_head``."""
    layers, width, heads, kv, head_dim = _dims(config)
    dense, moe, top_k, shared, moe_layers, glu = _ffn(config)
    passes = 4 if recompute else 3
    q, k = heads * head_dim, kv * head_dim
    attention = 2 * (width * (q + 2 * k) + 2 * q * (seq // 2) + q * width)
    matrices = 3 if glu else 2
    out = {"attention": passes * attention * layers}
    if moe_layers:
        out["experts"] = passes * 2 * width * moe * top_k * matrices * moe_layers
        if shared:
            out["shared_expert"] = passes * 2 * width * shared * matrices * moe_layers
    else:
        out["mlp"] = passes * 2 * width * dense * matrices * layers
    out["lm_head"] = 3 * 2 * width * config.vocab_size
    return out


def megatron_recompute(config: Any, *, seq: int) -> dict[str, int]:
    """``megatron(config, seq=seq, recompute=True)``: to check against hardware flops."""
    return megatron(config, seq=seq, recompute=True)


def vllm_perf(config: Any, *, batch: int, seq: int,
              shared_experts: Optional[int] = None) -> dict[str, int]:
    """vLLM's analytic estimator (``vllm/v1/metrics/perf.py``: ``AttentionMetrics``,
    ``FfnMetrics``, ``UnembedMetrics``.get_num_flops_breakdown) for ``batch`` prefill
    requests of ``seq`` tokens each, one forward step, per step: ``qkv_proj`` 2 T D (q + 2 kv)
    d L, ``out_proj`` 2 T D q d L, ``attn_qk`` and ``attn_av`` 2 q (T x context) d L each (the
    full token-context product: no causal half), ``dense_ffn`` 2 D 3 DI T (SwiGLU's three
    matrices for every model), ``routed_ffn`` 2 D 3 MI (T k), ``shared_ffn`` 2 D 3 MI S T with
    S read from ``n_shared_experts`` / ``num_shared_experts`` (0 when the config has neither),
    ``unembed`` 2 D V per logits token: one per prefill request. Sliding windows, MLA and
    quantization are left out here (the families checked have none)."""
    layers, width, heads, kv, head_dim = _dims(config)
    dense, moe, top_k, _, moe_layers, _ = _ffn(config)
    tokens, context = batch * seq, batch * seq * seq
    if shared_experts is None:
        shared_experts = getattr(config, "n_shared_experts", None) or \
            getattr(config, "num_shared_experts", None) or 0
    out = {"attention": 2 * tokens * width * (heads + 2 * kv) * head_dim * layers
           + 2 * tokens * width * heads * head_dim * layers
           + 2 * (2 * heads * context * head_dim * layers)}
    dense_layers = layers - moe_layers
    if dense_layers:
        out["mlp"] = 2 * width * 3 * dense * tokens * dense_layers
    if moe_layers:
        out["experts"] = 2 * width * 3 * moe * tokens * top_k * moe_layers
        if shared_experts:
            out["shared_expert"] = 2 * width * 3 * moe * shared_experts * tokens * moe_layers
    out["lm_head"] = 2 * batch * width * config.vocab_size
    return out


REFERENCES = {
    "6N": six_n,
    "PaLM": palm,
    "PaLM causal": palm_causal,
    "torchtitan": torchtitan,
    "Megatron": megatron,
    "Megatron recompute": megatron_recompute,
    "vLLM perf.py": vllm_perf,
}
