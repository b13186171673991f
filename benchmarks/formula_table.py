"""The reference MFU formulas (``dispatch_flops.workflows.mfu_formulas``) checked over the
project's model families on meta, printed as docs/formulas.md's table.

    python benchmarks/formula_table.py            # the Markdown table
    python benchmarks/formula_table.py --sweep    # + a 50-config sweep of a 7B-class Llama

Every figure is ``check_formula``'s: flops per token, the formula's against the counted
(2 x MACs of forward + backward; vLLM's: of one forward with one logits row per request;
Megatron with recompute: of every pass, recomputation included). tests/test_formula_check.py
asserts these errors, each from a closed form of its own.
"""

from __future__ import annotations

import functools
import sys
import time
import warnings
from typing import Any, Callable

import torch
import torch.utils.checkpoint as checkpoint

from dispatch_flops.workflows import mfu_formulas
from dispatch_flops.workflows.formula_check import FormulaCheck, check_formula

SEQ = 64


def families() -> dict[str, Any]:
    """Small configs of each family (the formulas are linear in what they leave out, so a
    small config shows each miss; the sweep shows one at 7B width)."""
    import transformers

    common = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    out = {
        "Llama (GQA, SwiGLU)": transformers.LlamaConfig(intermediate_size=352, **common),
        "GPT-2 (MHA, GELU, tied)": transformers.GPT2Config(
            vocab_size=512, n_embd=128, n_layer=2, n_head=8, n_positions=256),
        "Mixtral (8 experts, top-2)": transformers.MixtralConfig(
            intermediate_size=192, num_local_experts=8, num_experts_per_tok=2, **common),
        "Qwen2-MoE (shared expert)": transformers.Qwen2MoeConfig(
            intermediate_size=352, moe_intermediate_size=96, shared_expert_intermediate_size=256,
            num_experts=8, num_experts_per_tok=2, **common),
    }
    for config in out.values():
        config._attn_implementation = "sdpa"
    return out


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    base = model.base_model
    return getattr(base, "layers", None) or base.h


def checkpointed(config: Any) -> torch.nn.Module:
    """The causal LM with every decoder layer under ``torch.utils.checkpoint`` (non-reentrant,
    as transformers' gradient checkpointing)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_config(config)
    for layer in _decoder_layers(model):
        layer.forward = functools.partial(_checkpointed_call, layer.forward)
    return model


def _checkpointed_call(forward: Callable, *args: Any, **kwargs: Any) -> Any:
    return checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def serving_inputs(model: torch.nn.Module, config: Any, batch: int, seq: int) -> dict:
    """A prefill: token ids, logits for the last position only (as vLLM computes them)."""
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return {"input_ids": ids, "logits_to_keep": 1}


# name -> (formula, check_formula's keywords)
CHECKS: dict[str, tuple[Callable, dict]] = {
    "6N": (mfu_formulas.six_n, {}),
    "PaLM": (mfu_formulas.palm, {}),
    "PaLM causal": (mfu_formulas.palm_causal, {}),
    "torchtitan": (mfu_formulas.torchtitan, {}),
    "Megatron": (mfu_formulas.megatron, {}),
    "Megatron recompute": (mfu_formulas.megatron_recompute,
                           {"model": checkpointed, "against": "hardware"}),
    "vLLM perf.py": (mfu_formulas.vllm_perf,
                     {"training": False, "per": "step", "inputs": serving_inputs}),
}


def run(seq: int = SEQ) -> dict[tuple[str, str], FormulaCheck]:
    """Every reference formula on every family: ``{(formula, family): check}``."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for family, config in families().items():
            for name, (formula, keywords) in CHECKS.items():
                out[name, family] = check_formula(formula, [config], seq=seq, name=name,
                                                  **keywords)
    return out


def _cell(check: FormulaCheck) -> str:
    row = check.rows[0]
    if row.exact:
        return "exact"
    wrong = [c.name for c in row.components if c.error or (c.formula is None and c.counted)]
    return f"{row.error:+.2%}" + (f" ({', '.join(wrong)})" if wrong else "")


def markdown(checks: dict[tuple[str, str], FormulaCheck]) -> str:
    """The table: a row per formula, a column per family; each cell the error of the
    formula's flops per token against the counted ones, and the components that miss."""
    names = list(dict.fromkeys(name for name, _ in checks))
    fams = list(dict.fromkeys(family for _, family in checks))
    lines = ["| formula | " + " | ".join(fams) + " |", "|---" * (len(fams) + 1) + "|"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_cell(checks[name, f]) for f in fams) + " |")
    return "\n".join(lines)


def sweep_7b(examples: int = 50) -> FormulaCheck:
    """A hypothesis sweep of 7B-class Llamas (width 4096, 32 heads, SwiGLU 11008; layers,
    KV heads and sequence drawn) checked against Megatron's formula with the causal
    attention term doubled (what the meta count runs): exact, so all ``examples`` are
    counted; its ``configs_per_s`` is the sweep's speed."""
    import transformers
    from hypothesis import strategies as st

    base = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                    num_hidden_layers=1, num_attention_heads=32,
                                    num_key_value_heads=32, max_position_embeddings=4096)
    base._attn_implementation = "sdpa"

    def full_square(config: Any, *, seq: int) -> dict[str, int]:
        out = mfu_formulas.megatron(config, seq=seq)
        layers, _, heads, _, head_dim = mfu_formulas._dims(config)
        out["attention"] += 3 * 2 * 2 * heads * head_dim * (seq - seq // 2) * layers
        return out

    return check_formula(full_square, sweep={
        "num_hidden_layers": st.integers(1, 8),
        "num_key_value_heads": st.sampled_from([1, 2, 4, 8, 16, 32]),
        "intermediate_size": st.sampled_from([11008, 14336]),
    }, base=base, examples=examples, seq=128)


def main(argv: list[str]) -> int:
    print(markdown(run()))
    if "--sweep" in argv:
        start = time.perf_counter()
        check = sweep_7b()
        print(f"\n7B-class sweep: {len(check.rows)} configs in {time.perf_counter() - start:.1f} "
              f"s ({check.configs_per_s:.2f} configs/s), exact: {check.exact}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
