"""Packed and nested inputs priced per sequence, from their sizes (never their data): jagged
tensors through Linear, elementwise ops and SDPA; nn.TransformerEncoder's fast path with a
padding mask (strided nested tensors); layout conversions as no-arithmetic. Oracles: the same
work on each unpadded sequence as a dense tensor, counted and summed; closed forms."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.engine.counting import nested as nested_engine

pytestmark = pytest.mark.filterwarnings("ignore")

LENGTHS = (3, 5, 1, 5)


def _jagged(lengths, *inner, requires_grad=False):
    torch.manual_seed(0)
    return torch.nested.nested_tensor([torch.randn(n, *inner) for n in lengths],
                                      layout=torch.jagged, requires_grad=requires_grad)


def _dense_sum(fn, lengths, *inner) -> tuple:
    """(flops, MACs) of ``fn`` run on each sequence alone, as a dense [1, n, ...] tensor."""
    flops = macs = 0
    for n in lengths:
        x = torch.randn(1, n, *inner)
        with FlopCounter() as fc:
            fn(x)
        flops, macs = flops + fc.total.flops, macs + fc.total.macs
    return flops, macs


@pytest.mark.parametrize("grad", [False, True])
def test_a_linear_and_elementwise_ops_on_a_jagged_batch_cost_its_tokens(grad):
    linear = nn.Linear(8, 16)
    x = _jagged(LENGTHS, 8)

    def work(t):
        return torch.relu(linear(t) * 2)

    context = torch.enable_grad() if grad else torch.no_grad()
    with context, FlopCounter() as fc:
        work(x)
    assert fc.unsupported_ops() == {}
    tokens = sum(LENGTHS)
    ops = fc.by_operator()
    assert ops["aten.linear"].macs == tokens * 8 * 16  # closed form
    assert ops["aten.mul"].flops == ops["aten.relu"].flops == tokens * 16
    with context:
        assert (fc.total.flops, fc.total.macs) == _dense_sum(work, LENGTHS, 8)


def test_sdpa_on_a_jagged_batch_costs_the_sum_of_squared_lengths():
    heads, dim = 2, 4
    q = _jagged(LENGTHS, heads, dim).transpose(1, 2)  # [b, h, j, d]

    def attend(t):
        return F.scaled_dot_product_attention(t, t, t)

    with torch.no_grad(), FlopCounter() as fc:
        attend(q)
    assert fc.unsupported_ops() == {}
    # q @ k^T and probs @ v: h * n^2 * d MACs each, per sequence
    assert fc.total.macs == sum(2 * heads * n * n * dim for n in LENGTHS)
    dense = _dense_sum(lambda x: attend(x.transpose(1, 2)), LENGTHS, heads, dim)
    with torch.no_grad():
        assert fc.total.macs == dense[1]


def test_a_jagged_batch_of_equal_lengths_is_priced_without_reading_its_offsets(monkeypatch):
    """The cached min and max lengths agree: every length is known from metadata (on a GPU,
    no device-to-host copy)."""
    x = _jagged((4, 4, 4), 8)
    read = []
    monkeypatch.setattr(nested_engine, "_read", lambda t: read.append(t) or t.tolist())
    with torch.no_grad(), FlopCounter() as fc:
        x * 3
    assert fc.total.flops == 12 * 8 and read == []


def test_offsets_are_read_once_per_batch_not_per_call(monkeypatch):
    x = _jagged(LENGTHS, 8)
    linear = nn.Linear(8, 8)
    nested_engine._LENGTHS.clear()
    read = []
    real = nested_engine._read
    monkeypatch.setattr(nested_engine, "_read", lambda t: read.append(t) or real(t))
    with torch.no_grad(), FlopCounter() as fc:
        y = x
        for _ in range(4):
            y = torch.relu(linear(y))  # outputs share the input's offsets
    assert fc.by_operator()["aten.linear"].macs == 4 * sum(LENGTHS) * 64
    assert len(read) == 1


def _encoder(layers=2, d=32, heads=4, ff=64):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return nn.TransformerEncoder(layer, layers, enable_nested_tensor=True).eval()


def test_the_encoder_fast_path_with_a_padding_mask_costs_its_sequences():
    """The fast path runs on the unpadded sequences (strided nested tensors); priced per
    sequence of n tokens: 4 n D^2 (projections) + 2 n^2 D (q k^T, probs v) + 2 n D F (FFN)
    MACs a layer. Oracle: the slow path (train mode) on each unpadded sequence, summed."""
    encoder, d, ff, layers = _encoder(), 32, 64, 2
    lengths = (7, 4, 10)
    x = torch.randn(3, 10, d)
    mask = torch.arange(10)[None, :] >= torch.tensor(lengths)[:, None]  # True: padding
    with torch.no_grad(), FlopCounter() as fc:
        encoder(x, src_key_padding_mask=mask)
    assert "aten._transformer_encoder_layer_fwd" in fc.by_operator()
    assert fc.unsupported_ops() == {}
    closed = layers * sum(4 * n * d * d + 2 * n * n * d + 2 * n * d * ff for n in lengths)
    assert fc.total.macs == closed == 365_184
    encoder.train()  # the slow path, op by op (dropout is 0)
    slow_flops = slow_macs = 0
    for i, n in enumerate(lengths):
        with torch.no_grad(), FlopCounter() as slow:
            encoder(x[i:i + 1, :n])
        assert "aten._transformer_encoder_layer_fwd" not in slow.by_operator()
        slow_flops, slow_macs = slow_flops + slow.total.flops, slow_macs + slow.total.macs
    assert fc.total.macs == slow_macs
    assert 0.95 * slow_flops <= fc.total.flops <= 1.05 * slow_flops


def test_layout_conversions_do_no_arithmetic():
    encoder = _encoder(layers=1)
    x = torch.randn(2, 6, 32)
    mask = torch.tensor([[False] * 6, [False] * 3 + [True] * 3])
    with torch.no_grad(), FlopCounter() as fc:
        encoder(x, src_key_padding_mask=mask)
        jagged = _jagged((2, 3), 4)
        jagged.to_padded_tensor(0.0)
        torch.nested.to_padded_tensor(torch.nested.nested_tensor([torch.ones(2, 4)]), 0.0)
    categories = {r.operator: r.category for r in fc.records()}
    for op in ("aten._nested_tensor_from_mask", "aten._nested_tensor_from_mask_left_aligned",
               "aten.to_padded_tensor"):
        assert categories[op] == "no_arithmetic", op
    assert fc.unsupported_ops() == {}
    check = fc.by_operator()["aten._nested_tensor_from_mask_left_aligned"]
    assert check.bytes_read == mask.numel()  # the mask, not the activations


def test_a_training_step_on_a_jagged_batch_costs_its_tokens_both_ways():
    """linear_backward (the jagged Linear's backward): grad input and grad weight, one
    product each; oracle: dense backward of each sequence alone (two mm), summed."""
    torch.manual_seed(0)
    linear = nn.Linear(8, 16)
    x = _jagged(LENGTHS, 8, requires_grad=True)
    with FlopCounter() as fc:
        linear(x).values().sum().backward()
    assert fc.unsupported_ops() == {}
    backward = fc.by_operator(phase="backward")
    assert backward["aten.linear_backward"].macs == 2 * sum(LENGTHS) * 8 * 16
    dense_macs = 0
    for n in LENGTHS:
        xi = torch.randn(1, n, 8, requires_grad=True)
        with FlopCounter() as dense:
            linear(xi).sum().backward()
        dense_macs += sum(s.macs for s in dense.by_operator(phase="backward").values())
    assert sum(s.macs for s in backward.values()) == dense_macs
