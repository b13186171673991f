"""Fused paths against the same computation spelt op by op: nn's inference fast paths against
their slow paths, CPU recurrent layers against a loop of cells, fused optimizer steps against
the foreach and single-tensor loops."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dispatch_flops import FlopCounter

aten = torch.ops.aten


def count(fn):
    with FlopCounter() as fc:
        fn()
    assert fc.unsupported_ops() == {} and fc.estimated_ops() == {}
    return fc


@given(st.integers(1, 2), st.integers(1, 5), st.sampled_from([(8, 2), (16, 4)]), st.booleans(),
       st.booleans())
@settings(max_examples=10)
def test_multi_head_attention_fast_path_matches_slow_path(batch, length, dims, need_weights,
                                                          masked):
    """_native_multi_head_attention (eval, no grad; torch wants an even head count) has the
    MACs of the slow path's linears and attention products; flops within 10% (the slow path
    scales q per element, a padding mask is applied differently)."""
    embed, heads = dims
    mha = nn.MultiheadAttention(embed, heads, batch_first=True).eval()
    x = torch.randn(batch, length, embed)
    mask = torch.zeros(batch, length, dtype=torch.bool) if masked else None
    with torch.no_grad():
        fast = count(lambda: mha(x, x, x, key_padding_mask=mask, need_weights=need_weights))
    assert "aten._native_multi_head_attention" in fast.by_operator()
    slow = count(lambda: mha(x, x, x, key_padding_mask=mask, need_weights=need_weights))
    assert "aten._native_multi_head_attention" not in slow.by_operator()
    assert fast.total.macs == slow.total.macs
    assert 0.9 * slow.total.flops <= fast.total.flops <= 1.1 * slow.total.flops


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_fast_path_matches_slow_path(activation, norm_first):
    """_transformer_encoder_layer_fwd: the slow path's MACs exactly, flops within 5%."""
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        fast = count(lambda: layer(x))
    assert "aten._transformer_encoder_layer_fwd" in fast.by_operator()
    slow = count(lambda: layer(x))  # grad enabled: the fast path is not taken
    assert fast.total.macs == slow.total.macs
    assert 0.95 * slow.total.flops <= fast.total.flops <= 1.05 * slow.total.flops


def _cell_loop(cell_fn, x, state, weights):
    """Run a recurrent layer as a Python loop of aten cells over time (x: [t, b, i])."""
    outputs = []
    for step in x:
        state = cell_fn(step, state, *weights)
        outputs.append(state[0] if isinstance(state, tuple) else state)
    return torch.stack(outputs)


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 5), st.integers(1, 5), st.booleans())
@settings(max_examples=10)
def test_recurrent_layers_equal_a_loop_of_cells(steps, batch, inputs, hidden, bias):
    """nn.LSTM (mkldnn_rnn_layer on CPU) and nn.GRU count exactly what a loop of lstm_cell /
    gru_cell counts; the LSTM's backward has twice its forward MACs, as the loop's has."""
    x = torch.randn(steps, batch, inputs)
    for kind, cell_fn in (("LSTM", torch.lstm_cell), ("GRU", torch.gru_cell)):
        layer = getattr(nn, kind)(inputs, hidden, bias=bias)
        weights = [p.detach() for p in layer.parameters()]
        zeros = torch.zeros(batch, hidden)
        state = (zeros, zeros) if kind == "LSTM" else zeros
        with torch.no_grad():
            whole = count(lambda: layer(x))
            loop = count(lambda: _cell_loop(cell_fn, x, state, weights))
        assert (whole.total.flops, whole.total.macs) == (loop.total.flops, loop.total.macs)
    lstm = nn.LSTM(inputs, hidden, bias=bias)
    trained = count(lambda: lstm(x)[0].sum().backward())
    assert "aten.mkldnn_rnn_layer_backward" in trained.by_operator()
    assert trained.by_phase()["backward"].macs == 2 * trained.by_phase()["forward"].macs


def _steps(make_optimizer, steps=2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer = make_optimizer(model.parameters())
    with FlopCounter() as fc:
        for _ in range(steps):
            optimizer.step()
    assert fc.unsupported_ops() == {} and fc.estimated_ops() == {}
    return fc, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,kwargs,per_element", [
    ("AdamW", dict(weight_decay=0.01), 14),
    ("Adam", dict(weight_decay=0.01, amsgrad=True), 16),
    ("Adam", dict(), 13),
    ("SGD", dict(lr=0.1, momentum=0.9), None),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1), None),
])
def test_fused_foreach_and_loop_optimizers_count_the_same(name, kwargs, per_element):
    """The fused kernel, the foreach ops and the single-tensor loop price one step alike;
    Adam(W)'s per-element cost is the table's derivation (13, + 1 decoupled weight decay,
    + 2 L2 weight decay, + 1 amsgrad)."""
    cls = getattr(torch.optim, name)
    counts = {}
    for impl in ("foreach", "loop", "fused"):
        flags = {"foreach": dict(foreach=True), "loop": dict(foreach=False),
                 "fused": dict(fused=True)}[impl]
        fc, n = _steps(lambda params: cls(params, **kwargs, **flags))
        counts[impl] = fc.total.flops
    assert counts["fused"] == counts["foreach"] == counts["loop"]
    if per_element is not None:
        tensors = 6
        # two steps; each also increments every parameter's step counter (one add)
        assert counts["fused"] == 2 * (per_element * n + tensors)
