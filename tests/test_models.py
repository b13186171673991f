"""Whole-model figures: GPT-2 small and BERT-base, batch 1, 128 tokens."""

import pytest
import torch
from bert import BertModel

from dispatch_flops import ROOT, FlopCounter, human
from dispatch_flops.models import GPT, GPT2_SMALL

pytestmark = pytest.mark.slow  # full-size models: 124M and 110M parameters


def test_gpt2_small_forward_macs_exact():
    """12 x (qkv + proj + mlp + dense attention) + lm_head = 16,114,089,984 MACs."""
    torch.manual_seed(0)
    model = GPT(GPT2_SMALL)
    idx = torch.randint(0, GPT2_SMALL.vocab_size, (1, 128))
    with torch.no_grad(), FlopCounter(model) as fc:
        model(idx)
    d, s, layers, vocab = 768, 128, 12, 50257
    per_layer = s * d * 3 * d + s * d * d + 2 * s * d * 4 * d + 2 * s * s * d
    assert fc.total.macs == layers * per_layer + s * d * vocab == 16_114_089_984
    assert fc.by_module()["lm_head"].macs == s * d * vocab


def test_bert_base_reproduces_seed_figures():
    """The flops-profiler seed's MACs column, to the printed digit."""
    torch.manual_seed(0)
    model = BertModel()
    ids = torch.randint(0, 30522, (1, 128))
    with torch.no_grad(), FlopCounter(model) as fc:
        model(ids)
    m = fc.by_module()
    printed = {
        ROOT: "11.17 GMACs",
        "encoder.layer.0.attention.self": "251.66 MMACs",
        "encoder.layer.0.attention.self.query": "75.50 MMACs",
        "encoder.layer.0.intermediate": "301.99 MMACs",
        "pooler": "589.82 KMACs",
    }
    for name, figure in printed.items():
        assert human(m[name].macs, "MACs") == figure, name
    first = m["encoder.layer.0.attention.self"].macs
    assert all(m[f"encoder.layer.{i}.attention.self"].macs == first for i in range(12))
