"""The formula contract's opt-in keywords come from one table
(``engine.counting.calls.KEYWORDS``), and the deprecated ``attention="causal"`` keeps its old
figures without keying the engine's caches (figures computed at 0f19d87, before it left the
caches: tests/golden)."""

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import dispatch_flops.formulas._registry as registry_module
from dispatch_flops import FlopCounter, Profile
from dispatch_flops.engine.counting import mode as engine_mode
from dispatch_flops.engine.counting.records import engine_cache
from dispatch_flops.formulas import REGISTRY, Cost, Registry
from dispatch_flops.formulas.attention import attention_pairs
from dispatch_flops.models import GPT, GPTConfig
from helpers import StandInKernels

aten = torch.ops.aten
GOLDEN = Path(__file__).parent / "golden"


def test_the_contract_docstring_lists_exactly_the_tables_keywords():
    """formulas._registry's docstring has one bullet per row of the table, and no other."""
    bullets = re.findall(r"^\* ``(\w+)``:", registry_module.__doc__, re.MULTILINE)
    assert sorted(bullets) == sorted(k.name for k in engine_mode.KEYWORDS)
    assert len(bullets) == len(set(bullets))


def test_a_row_of_the_table_is_all_a_new_keyword_needs(monkeypatch):
    """A formula naming every keyword gets each, the new one's included; a signed keyword's
    value tells calls of equal shapes apart (each priced with its own value)."""
    monkeypatch.setattr(engine_mode, "KEYWORDS", engine_mode.KEYWORDS + (
        engine_mode.Keyword("arguments", lambda args, resolved, layouts: len(args)),
        engine_mode.Keyword("grad_wanted", lambda args, resolved, layouts:
                            args[0].requires_grad, signed=True),
    ))
    seen = []
    registry = Registry()

    @registry.formula(aten.mm)
    def mm(a, b, *, out_shape, dtypes, layouts, group_size, group_rank, int_values,
           arguments, grad_wanted):
        seen.append(dict(dtypes=dtypes, layouts=layouts, group_size=group_size,
                         group_rank=group_rank, int_values=int_values, arguments=arguments,
                         grad_wanted=grad_wanted))
        return Cost(2 * a[0] * a[1] * b[1] + grad_wanted, a[0] * a[1] * b[1])

    a, b = torch.randn(2, 3), torch.randn(3, 4)
    with torch.no_grad(), FlopCounter(registry=registry) as fc:
        torch.mm(a, b)
        torch.mm(a.requires_grad_(), b)
    assert fc.total.flops == 2 * 48 + 1
    assert seen == [dict(dtypes=[torch.float32] * 2, layouts=[None, None], group_size=1,
                         group_rank=0, int_values=[None, None], arguments=2,
                         grad_wanted=wanted) for wanted in (False, True)]


def test_a_formula_gets_only_the_keywords_it_names():
    registry = Registry()
    given = []

    @registry.formula(aten.mm)
    def mm(a, b, *, out_shape, dtypes):
        given.append(dtypes)
        return Cost(0)

    with FlopCounter(registry=registry) as fc:
        torch.mm(torch.randn(2, 3), torch.randn(3, 4))
    assert fc.total.flops == 0 and given == [[torch.float32] * 2]


# -- attention="causal", deprecated ---------------------------------------------------------


def test_the_causal_option_warns_to_read_model_flops():
    with pytest.warns(FutureWarning, match="model_flops"):
        FlopCounter(attention="causal")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FlopCounter(attention="dense")


def _sdpa(option):
    q = torch.randn(2, 3, 40, 8, requires_grad=True)
    k = torch.randn(2, 3, 56, 8, requires_grad=True)
    v = torch.randn(2, 3, 56, 16, requires_grad=True)
    with FlopCounter(attention=option) as fc:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        F.scaled_dot_product_attention(q, k, v).sum().backward()
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    return fc


def _inference(option):
    q = torch.randn(2, 3, 40, 8)
    with torch.inference_mode(), FlopCounter(attention=option) as fc:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    return fc


def _kernels(option):
    b, s, h, d = 2, 24, 3, 8
    q, k, v = torch.randn(b, s, h, d), torch.randn(b, 32, h, d), torch.randn(b, 32, h, 16)
    out, lse = torch.randn(b, s, h, 16), torch.randn(b, h, s)
    seed, offset = torch.empty(2, dtype=torch.int64), torch.empty(0)
    with StandInKernels(), FlopCounter(attention=option) as fc:
        for causal in (True, False):
            aten._flash_attention_forward(q, k, v, None, None, s, 32, 0.0, causal, False)
            aten._efficient_attention_forward(q, k, v, None, None, None, s, 32, 0.0,
                                              int(causal))
            aten._flash_attention_backward(out, q, k, v, out, lse, None, None, s, 32, 0.0,
                                           causal, seed, offset)
            aten._efficient_attention_backward(out, q, k, v, None, out, None, None, s, 32, lse,
                                               0.0, seed, offset, int(causal), False)
    return fc


def _model(option):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, max_seq_len=16))
    x = torch.randint(0, 64, (2, 16))
    with FlopCounter(model, attention=option) as fc:
        model(x).sum().backward()
    return fc


def _figures(profile) -> dict:
    """{"phase overload": [calls, flops, macs, masked_flops, masked_macs]} of the rows that
    count flops (as tests/golden/attention_causal_0f19d87.json keeps them)."""
    rows: dict = {}
    for key, counts in profile.rows:
        if counts[1]:
            row = rows.setdefault(f"{key.phase} {key.overload}", [0] * 5)
            for j, i in enumerate((0, 1, 2, 7, 8)):
                row[j] += counts[i]
    return rows


SCENARIOS = {"sdpa": _sdpa, "inference": _inference, "kernels": _kernels, "model": _model}


@pytest.mark.filterwarnings("ignore:.*attention=\"causal\".*:FutureWarning")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("option", ["dense", "causal"])
def test_both_options_give_the_figures_they_gave_at_0f19d87(scenario, option):
    """SDPA is_causal forward and backward, the flash / efficient kernels (causal or not),
    SDPA seen whole under inference_mode, and a model: the figures 0f19d87 gave."""
    golden = json.loads((GOLDEN / "attention_causal_0f19d87.json").read_text())
    figures = _figures(SCENARIOS[scenario](option).to_profile())
    expected = golden[f"{scenario}/{option}"]
    if (scenario, option) == ("inference", "dense"):
        # SDPA priced by its decomposition now keeps the masked share the kernel's own call
        # has (0f19d87 left it out): hardware figures as they were, model flops the causal
        # pairs', as under attention="causal"
        causal = golden["inference/causal"]
        for key, row in expected.items():
            row[3:] = [row[1] - causal[key][1], row[2] - causal[key][2]]
    for key, (flops, macs) in RECOMPUTED.get(scenario, {}).items():
        # since issue 41 a fused backward's recomputation of q·kᵀ is hardware work only: the
        # unmasked pairs' share joins the masked share (hardware as it was); the option, whose
        # hardware figure is the model's, leaves it out with the masked pairs
        row = expected[key]
        if option == "dense":
            row[3:] = [row[3] + flops, row[4] + macs]
        else:
            row[1:3] = [row[1] - flops, row[2] - macs]
    if scenario == "sdpa":
        # since issue 41 the math decomposition's backward (the first call: v's head size 16)
        # finds its masked pairs: 2·3·(40·56 − 820) of them, in the softmax backward (4 flops
        # each) and in its four contractions (2·16 + 2·8 MACs each)
        masked = 2 * 3 * (40 * 56 - attention_pairs(1, 1, 40, 56, True))
        for key, (flops, macs) in (("backward aten.bmm.default", (2 * 48 * masked, 48 * masked)),
                                   ("backward aten._softmax_backward_data.default",
                                    (4 * masked, 0))):
            expected[key][3:] = [flops, macs]
        # ... and its element-wise work beyond the fused kernels' per-pair figure is hardware
        # only (docs/conventions.md): q and k scaled each way less a scale a kept pair; the
        # causal call's mask built (where, 40·56) and added to every score; the second call
        # (no mask, every pair kept) its scaling alone
        heads, pairs = 2 * 3, 40 * 56
        kept = attention_pairs(2, 3, 40, 56, True)
        scale = heads * (40 + 56) * 8
        forward = (scale - kept + heads * pairs + pairs) + (scale - heads * pairs)
        backward = (scale - kept) + (scale - heads * pairs)
        expected["forward aten._safe_softmax.default"][3] += forward
        expected["backward aten._softmax_backward_data.default"][3] += backward
    assert figures == expected


def _recomputed(calls, d: int) -> tuple:
    """(flops, MACs) a fused backward spends recomputing q·kᵀ and its softmax for the
    unmasked pairs of ``calls`` ((b, h, s_q, s_k, causal) each), d the query's head size."""
    useful = sum(attention_pairs(*call) for call in calls)
    return useful * (2 * d + 5), useful * d


RECOMPUTED = {
    "sdpa": {"backward aten._scaled_dot_product_flash_attention_for_cpu_backward.default":
             _recomputed([(2, 3, 40, 40, True)], 8)},  # v's head size 16: the other two
    # calls run the math decomposition (no recomputation)
    "kernels": {f"forward aten._{kernel}_attention_backward.default":
                _recomputed([(2, 3, 24, 32, True), (2, 3, 24, 32, False)], 8)
                for kernel in ("flash", "efficient")},
    "model": {"backward aten._scaled_dot_product_flash_attention_for_cpu_backward.default":
              _recomputed([(2, 2, 16, 16, True)] * 2, 16)},
}


@pytest.mark.filterwarnings("ignore:.*attention=\"causal\".*:FutureWarning")
def test_the_option_keys_no_cache_and_shares_the_models_ledger():
    """A dense and a causal counter on one model share resolutions, signatures and the
    ledger; each reads its own figures from it."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, d_model=32, n_head=2, vocab_size=64, max_seq_len=16))
    x = torch.randint(0, 64, (2, 16))
    totals = {}
    for option in ("dense", "causal", "dense"):
        with FlopCounter(model, attention=option) as fc:
            model(x)
        totals.setdefault(option, []).append(fc.total)
    cache = engine_cache(REGISTRY)
    assert id(model) in cache.ledgers and all(isinstance(key, int) for key in cache.ledgers)
    dense, causal = totals["dense"][0], totals["causal"][0]
    assert totals["dense"][1] == dense
    assert causal.flops == dense.flops - dense.masked_flops > 0
    assert causal.model_flops == dense.model_flops and causal.masked_flops == 0


def test_a_file_written_with_the_option_still_loads():
    """A Profile saved by an attention="causal" counter at 0f19d87 reads back with its option
    and figures (the same a causal counter gives now)."""
    loaded = Profile.from_json(GOLDEN / "sdpa_attention_causal_0f19d87.json")
    assert loaded.attention == "causal"
    golden = json.loads((GOLDEN / "attention_causal_0f19d87.json").read_text())
    assert _figures(loaded) == golden["sdpa/causal"]
