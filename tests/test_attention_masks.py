"""Attention as it ran: hardware flops (the pairs the kernel computed) and model flops (the
unmasked pairs), over a matrix of masks, kernels and models (issue 33).

Every configuration's oracle is independent of the counter: the unmasked pairs by a naive
Python loop over the mask's predicate (or the mask's own entries), the computed pairs of a
block-sparse kernel from the BlockMask's own block grid (``to_dense()``). Run as a script to
print the matrix: ``python tests/test_attention_masks.py``.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from dispatch_flops import FlopCounter
from dispatch_flops.formulas import ELEMENT_COSTS
from dispatch_flops.results.stats import Stats
from helpers import (
    additive,
    attention_stats,
    causal,
    chunked,
    documents,
    loop_pairs,
    mask_of,
    window,
)

B, H, D = 1, 2, 16
SCALE_SOFTMAX = ELEMENT_COSTS["attention_scale"] + ELEMENT_COSTS["softmax"]


# -- oracles ------------------------------------------------------------------------------------
def block_pairs(block_mask, s_q: int, s_k: int) -> int:
    """Pairs in the blocks a BlockMask lists (partial or full): its own block grid."""
    grid = block_mask.to_dense()[0, 0]
    q_block, kv_block = block_mask.BLOCK_SIZE
    n = 0
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if grid[i, j]:
                n += min(q_block, s_q - i * q_block) * min(kv_block, s_k - j * kv_block)
    return n




# -- the configurations ---------------------------------------------------------------------
def _sdpa(mask=None, is_causal=False, s=256, h_kv=H, backward=False):
    q = torch.randn(B, H, s, D, requires_grad=backward)
    kv = torch.randn(B, h_kv, s, D, requires_grad=backward)
    with FlopCounter() as fc:
        out = F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, is_causal=is_causal,
                                             enable_gqa=h_kv != H)
        if backward:
            out.sum().backward()
    return attention_stats(fc)


def sdpa_case(allowed, s, kind="bool", h_kv=H, backward=False):
    def run():
        if allowed is causal and kind == "is_causal":
            return _sdpa(is_causal=True, s=s, h_kv=h_kv, backward=backward)
        m = mask_of(allowed, s)
        if kind == "additive":
            m = additive(m)
        elif kind == "finfo_min":  # transformers' stand-in for -inf
            m = additive(m, torch.finfo(torch.float32).min)
        return _sdpa(mask=m, s=s, h_kv=h_kv, backward=backward)

    heads = B * H
    pairs = heads * s * s
    useful = heads * loop_pairs(allowed, s, s)
    forward = D + D
    macs = forward + (3 * D + 2 * D if backward else 0)
    # the kernel's backward recomputes q·kᵀ (D MACs a pair): hardware work, not the model's
    model = macs - (D if backward else 0)
    return run, pairs * macs, useful * model


def random_mask_case(s=128):
    generator = torch.Generator().manual_seed(0)
    m = torch.rand(s, s, generator=generator) < 0.3

    def run():
        return _sdpa(mask=m, s=s)

    entries = m.tolist()
    useful = B * H * loop_pairs(lambda i, j: entries[i][j], s, s)
    return run, B * H * s * s * 2 * D, useful * 2 * D


def flex_case(allowed, s, compiled, block=64, mask_mod=None):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if mask_mod is None:
        def mask_mod(b, h, q, kv):
            return allowed_tensor(q, kv)
    table = mask_of(allowed, s)

    def allowed_tensor(q, kv):
        return table[q, kv]

    block_mask = create_block_mask(mask_mod, 1, 1, s, s, device="cpu", BLOCK_SIZE=block)

    def run():
        q = torch.randn(B, H, s, D)
        attend = torch.compile(flex_attention) if compiled else flex_attention
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with FlopCounter() as fc:
                attend(q, q, q, block_mask=block_mask)
        return attention_stats(fc)

    useful = B * H * loop_pairs(allowed, s, s)
    computed = B * H * (block_pairs(block_mask, s, s) if compiled else s * s)
    return run, computed * 2 * D, useful * 2 * D


def flex_document_case(lengths, compiled):
    doc_ids = torch.tensor([d for d, n in enumerate(lengths) for _ in range(n)])

    def mask_mod(b, h, q, kv):  # reads a buffer: the document of each token
        return (doc_ids[q] == doc_ids[kv]) & (kv <= q)

    return flex_case(documents(lengths), sum(lengths), compiled, mask_mod=mask_mod)


def _tiny_hf(kind: str, impl: str):
    transformers = pytest.importorskip("transformers")
    if kind == "gemma3":
        config = transformers.Gemma3TextConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=D, sliding_window=64,
            layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512)
        model = transformers.Gemma3ForCausalLM(config)
    elif kind == "mistral":
        config = transformers.MistralConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, head_dim=D, sliding_window=128,
            max_position_embeddings=512)
        model = transformers.MistralForCausalLM(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512)
        model = transformers.LlamaForCausalLM(config)
    model.config._attn_implementation = impl
    return model.eval()


def eager_case(allowed, s, kind="additive"):
    """Attention written as plain ops: scores, an additive mask, softmax, then @ v."""
    bias = additive(mask_of(allowed, s), float("-inf") if kind == "additive"
                    else torch.finfo(torch.float32).min)

    def run():
        q = torch.randn(B, H, s, D)
        with FlopCounter() as fc:
            scores = q @ q.transpose(-2, -1) / math.sqrt(D) + bias
            torch.softmax(scores, dim=-1) @ q
        return eager_stats(fc)

    useful = B * H * loop_pairs(allowed, s, s)
    return run, B * H * s * s * 2 * D, useful * 2 * D


def eager_stats(fc) -> Stats:
    """The contractions of attention written as plain ops (bmm)."""
    return fc.by_operator().get("aten.bmm", Stats())


def hf_case(kind, s=256, lengths=None, impl="sdpa"):
    def run():
        model = _tiny_hf(kind, impl)
        tokens = torch.randint(0, 64, (1, s))
        kwargs = {"use_cache": False}
        if lengths is not None:  # packed: position ids restart at each sequence
            kwargs["position_ids"] = torch.cat([torch.arange(n) for n in lengths])[None]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with FlopCounter(model) as fc, torch.no_grad():
                model(tokens, **kwargs)
        return attention_stats(fc) if impl == "sdpa" else eager_stats(fc)

    heads = B * H
    if kind == "gemma3":  # one sliding layer (window 64), one global (causal)
        useful = heads * (loop_pairs(window(64), s, s) + loop_pairs(causal, s, s))
        pairs = 2 * heads * s * s
    elif kind == "mistral":
        useful, pairs = heads * loop_pairs(window(128), s, s), heads * s * s
    else:
        useful, pairs = heads * loop_pairs(documents(lengths), s, s), heads * s * s
    return run, pairs * 2 * D, useful * 2 * D


CASES = {
    "causal is_causal S=256": lambda: sdpa_case(causal, 256, "is_causal"),
    "causal bool S=256": lambda: sdpa_case(causal, 256),
    "window 64 S=256": lambda: sdpa_case(window(64), 256),
    "window 128 S=256": lambda: sdpa_case(window(128), 256),
    "window 64 S=512": lambda: sdpa_case(window(64), 512),
    "window 128 S=512": lambda: sdpa_case(window(128), 512),
    "chunked 64 S=256": lambda: sdpa_case(chunked(64), 256),
    "documents 100/60/96": lambda: sdpa_case(documents([100, 60, 96]), 256),
    "bool random 30%": random_mask_case,
    "additive -inf window 64": lambda: sdpa_case(window(64), 256, "additive"),
    "additive finfo.min window 64": lambda: sdpa_case(window(64), 256, "finfo_min"),
    "GQA 2:1 window 64": lambda: sdpa_case(window(64), 256, h_kv=1),
    "window 64 fwd+bwd": lambda: sdpa_case(window(64), 256, backward=True),
    "causal is_causal fwd+bwd": lambda: sdpa_case(causal, 256, "is_causal", backward=True),
    "flex eager causal": lambda: flex_case(causal, 256, False),
    "flex eager window 64": lambda: flex_case(window(64), 256, False),
    "flex eager documents": lambda: flex_document_case([100, 60, 96], False),
    "HF Gemma-3 sdpa (sliding + global)": lambda: hf_case("gemma3"),
    "HF Mistral sdpa window 128": lambda: hf_case("mistral"),
    "HF Llama packed 100/60/96": lambda: hf_case("llama", lengths=[100, 60, 96]),
    "eager ops window 64 (-inf)": lambda: eager_case(window(64), 256),
    "eager ops documents (finfo.min)": lambda: eager_case(documents([100, 60, 96]), 256,
                                                          "finfo_min"),
    "HF Gemma-3 eager (sliding + global)": lambda: hf_case("gemma3", impl="eager"),
    "HF Mistral eager window 128": lambda: hf_case("mistral", impl="eager"),
}
COMPILED = {
    "flex compiled causal": lambda: flex_case(causal, 256, True),
    "flex compiled window 64": lambda: flex_case(window(64), 256, True),
    "flex compiled documents": lambda: flex_document_case([100, 60, 96], True),
}


def check(case) -> tuple[Stats, int, int]:
    run, hardware_macs, model_macs = case()
    stats = run()
    assert stats.macs == hardware_macs
    assert stats.model_macs == model_macs
    assert 0 <= stats.model_flops <= stats.flops
    assert 0 <= stats.model_macs <= stats.macs
    return stats, hardware_macs, model_macs


@pytest.mark.parametrize("name", list(CASES))
def test_model_and_hardware_flops(name):
    """Hardware MACs are the pairs the kernel computed, model MACs the unmasked pairs (a
    naive loop over the mask), times the MACs of a pair; model never exceeds hardware."""
    check(CASES[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMPILED))
def test_compiled_flex_counts_the_blocks_it_ran(name):
    """Compiled flex (inductor's block-sparse kernel): hardware = the BlockMask's computed
    blocks (partial and full), model = the unmasked pairs, counted each run."""
    check(COMPILED[name])


def test_a_masked_softmax_after_no_contraction_masks_nothing():
    """A softmax over masked logits that no contraction produced (a classifier's) is not
    attention: nothing is counted masked."""
    logits = torch.randn(4, 10).masked_fill(torch.rand(4, 10) < 0.5, float("-inf"))
    with FlopCounter() as fc:
        torch.softmax(logits + 1, dim=-1)
    assert fc.total.masked_flops == 0


def test_masked_flops_are_the_masked_pairs_at_the_formula_rate():
    """The flops of a masked pair are those the formula charges a pair: 2 (d + d_v) for the
    contractions, then the scale, the softmax and the additive mask."""
    s = 128
    m = mask_of(window(32), s)
    stats = _sdpa(mask=m, s=s)
    masked_pairs = B * H * (s * s - loop_pairs(window(32), s, s))
    assert stats.masked_flops == masked_pairs * (2 * 2 * D + SCALE_SOFTMAX + 1)
    assert stats.masked_macs == masked_pairs * 2 * D


@pytest.mark.filterwarnings('ignore:.*attention="causal".*:FutureWarning')
def test_causal_option_keeps_its_old_meaning():
    """attention="causal" prices is_causal kernels as skipping the masked half (hardware =
    model); the default prices them dense, model flops the causal pairs either way."""
    q = torch.randn(1, 2, 64, D)
    pairs = 2 * 64 * 65 // 2
    figures = {}
    for option in ("dense", "causal"):
        with FlopCounter(attention=option) as fc:
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        figures[option] = fc.total
    assert figures["dense"].macs == 2 * 64 * 64 * 2 * D
    assert figures["causal"].macs == pairs * 2 * D
    assert figures["dense"].model_macs == figures["causal"].model_macs == pairs * 2 * D


def test_a_mask_on_the_meta_device_keeps_the_formula_figure():
    """Meta tensors hold no values: the call is priced dense, nothing masked (no crash)."""
    q = torch.randn(1, 2, 64, D, device="meta")
    m = torch.ones(64, 64, dtype=torch.bool, device="meta")
    with FlopCounter() as fc:
        F.scaled_dot_product_attention(q, q, q, attn_mask=m)
    # meta runs SDPA's math decomposition: the two contractions over every pair
    assert fc.total.macs == 2 * 64 * 64 * 2 * D and fc.total.masked_macs == 0


def test_masked_counts_survive_json_and_mfu_uses_model_flops(tmp_path):
    """masked_flops goes through JSON; a file without it reads as 0; MFU divides model
    flops, HFU hardware flops."""
    from dispatch_flops import Profile
    from dispatch_flops.results.roofline import DeviceSpec

    q = torch.randn(1, 2, 128, D)
    m = mask_of(window(32), 128)
    with FlopCounter(timing=True) as fc:
        F.scaled_dot_product_attention(q, q, q, attn_mask=m)
    profile = fc.to_profile()
    fc.to_json(tmp_path / "run.json")
    again = Profile.from_json(tmp_path / "run.json")
    assert again.total.masked_flops == profile.total.masked_flops > 0
    old = json.loads((tmp_path / "run.json").read_text())
    for record in old["records"]:  # as written before the fields existed
        del record["stats"]["masked_flops"], record["stats"]["masked_macs"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Profile.from_json(tmp_path / "old.json").total.masked_flops == 0
    spec = DeviceSpec.cpu(1e12, 1e11)
    mfu, hfu = fc.mfu(spec), fc.hfu(spec)
    assert mfu / hfu == pytest.approx(fc.total.model_macs / fc.total.macs)
    assert fc.model_flops() == fc.total.model_flops


def test_flex_backward_operator_is_counted():
    """flex_attention_backward (CPU: the operator called directly, as autograd would on a
    GPU): backward rates over every pair, model the unmasked ones."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_op
    from torch._higher_order_ops.flex_attention import flex_attention_backward
    from torch.nn.attention.flex_attention import _identity, create_block_mask

    s = 128
    block_mask = create_block_mask(lambda b, h, q, kv: kv <= q, 1, 1, s, s, device="cpu",
                                   BLOCK_SIZE=64)
    q = torch.randn(B, H, s, D)
    out, lse, _ = flex_op(q, q, q, _identity, block_mask.as_tuple(), 1 / math.sqrt(D), {})
    with FlopCounter() as fc:
        flex_attention_backward(q, q, q, out, lse, torch.ones_like(out), None, _identity,
                                None, block_mask.as_tuple(), 1 / math.sqrt(D), {}, (), ())
    stats = attention_stats(fc)
    assert stats.macs == B * H * s * s * 5 * D
    # the model's backward: four contractions (the fifth recomputes q·kᵀ)
    assert stats.model_macs == B * H * loop_pairs(causal, s, s) * 4 * D


def matrix(names=None) -> str:
    """The matrix as text: each configuration's hardware and model MACs against its
    oracles."""
    lines = [f"{'configuration':38} {'hardware MACs':>14} {'oracle':>14} {'model MACs':>12} "
             f"{'oracle':>12} {'model/hw':>8}"]
    cases = {**CASES, **COMPILED}
    for name in names or cases:
        stats, hardware, model = check(cases[name])
        lines.append(f"{name:38} {stats.macs:>14,} {hardware:>14,} {stats.model_macs:>12,} "
                     f"{model:>12,} {stats.model_macs / stats.macs:>8.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(matrix())


def test_device_counts_are_kept_on_the_device_and_read_once():
    """A count on a device other than the CPU is added as a tensor (never read per call);
    ``read_all`` reads every tally's counts with one stack per device."""
    from dispatch_flops.engine.masks.tally import Tally, read_all

    kept = Tally(1, 1)
    kept.add(torch.tensor(3, device="meta"))
    kept.add(torch.tensor(4, device="meta"))
    assert isinstance(kept.masked, torch.Tensor) and kept.masked.device.type == "meta"
    on_cpu, plain = Tally(1, 1), Tally(1, 1)
    on_cpu.masked, on_cpu.skipped = torch.tensor(5), torch.tensor(7)  # as a device keeps them
    plain.add(2, 1)
    assert read_all([on_cpu, plain]) == [(5, 7), (2, 1)]


@pytest.mark.parametrize("s", [300, 256])
def test_block_counts_clip_the_last_block_to_the_sequence(s):
    """A sequence that is not a multiple of the block size: the last blocks hold fewer pairs
    (the BlockMask's own grid, clipped, by a loop), and the unmasked pairs inside the listed
    blocks equal the naive loop's (a consistent mask lists every block holding one)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from dispatch_flops.engine.counting import flex

    allowed = documents([100, 60, s - 160])
    table = mask_of(allowed, s)
    block_mask = create_block_mask(lambda b, h, q, kv: table[q, kv], 1, 1, s, s,
                                   device="cpu", BLOCK_SIZE=64)
    parts = block_mask.as_tuple()
    assert int(flex.computed_pairs(parts, 1, 2, s, s, "cpu")) == 2 * block_pairs(block_mask,
                                                                                  s, s)
    useful = flex.unmasked_pairs(parts, (), 1, 2, s, s, "cpu", blocks=True)
    assert int(useful) == 2 * loop_pairs(allowed, s, s)


def test_a_model_counted_again_starts_its_masked_pairs_from_zero():
    """Counters on one model share its ledger: the next counter's masked pairs are its own
    (the tallies are set back to zero with the calls), every step alike."""
    m = mask_of(window(16), 64)

    class Attend(torch.nn.Module):
        def forward(self, x):
            return F.scaled_dot_product_attention(x, x, x, attn_mask=m)

    model, x = Attend(), torch.randn(1, 2, 64, D)
    steps = []
    for _ in range(3):
        with FlopCounter(model) as fc:
            model(x)
        steps.append(fc)  # read after the next counter took the ledger
    useful = 2 * loop_pairs(window(16), 64, 64) * 2 * D
    assert [attention_stats(fc).model_macs for fc in steps] == [useful] * 3


def test_a_mask_met_late_on_records_counted_before_is_counted_and_reset():
    """A ledger keeps the list of its records holding a mask's tally between counters: a mask
    first met in a later counter, on records earlier counters made (the same ops, the same
    shapes), is counted there, its pairs read and set back to zero for the next counter; the
    oracle is a counter with a ledger of its own (no model)."""
    s = 32
    open_bias = torch.zeros(s, s)
    causal_bias = additive(mask_of(causal, s))

    class Attend(torch.nn.Module):
        def forward(self, q, bias):
            scores = q @ q.transpose(-2, -1) / math.sqrt(D) + bias
            return torch.softmax(scores, dim=-1) @ q

    model, q = Attend(), torch.randn(B, H, s, D)

    def counted(bias, with_model=True):
        with FlopCounter(model if with_model else None) as fc:
            model(q, bias)
        return fc.total.masked_macs, fc.total.macs

    unmasked = counted(open_bias)
    assert unmasked[0] == 0
    masked = counted(causal_bias)  # tallies given to records the first counter made
    assert masked == counted(causal_bias, with_model=False)
    assert masked[0] > 0 and masked[1] == unmasked[1]
    assert counted(open_bias) == unmasked  # the late tallies were set back to zero
