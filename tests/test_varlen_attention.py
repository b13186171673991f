"""Variable-length (packed) flash / memory-efficient attention, priced per sequence from its
cumulative sequence lengths: Σ s_q,i · s_k,i pairs per head, not batch · max². The kernels are
CUDA-only: their calls are made here on the CPU, with a stand-in kernel below the counter
(a dispatch mode that returns outputs of the right shapes: tests/helpers.py), so the counter
sees the real op and arguments. Oracle: the block-diagonal mask of the packed tokens, its
True entries counted."""

import pytest
import torch

from dispatch_flops import FlopCounter
from dispatch_flops.formulas import REGISTRY
from helpers import StandInKernels

aten = torch.ops.aten


def block_diagonal_pairs(lengths_q, lengths_k) -> int:
    """(query, key) pairs of the same sequence, counted on the packed tokens' mask."""
    owner_q = torch.repeat_interleave(torch.arange(len(lengths_q)), torch.tensor(lengths_q))
    owner_k = torch.repeat_interleave(torch.arange(len(lengths_k)), torch.tensor(lengths_k))
    return int((owner_q[:, None] == owner_k[None, :]).sum())


def _cumulative(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)


LENGTHS_Q, LENGTHS_K = (5, 1, 12, 3), (7, 2, 12, 4)
HEADS, D, D_V = 2, 8, 8


def _flash_call(lengths_q=LENGTHS_Q, lengths_k=LENGTHS_K, cumulative=True):
    q = torch.randn(sum(lengths_q), HEADS, D)
    k = torch.randn(sum(lengths_k), HEADS, D)
    v = torch.randn(sum(lengths_k), HEADS, D_V)
    cu_q, cu_k = (_cumulative(lengths_q), _cumulative(lengths_k)) if cumulative else (None,
                                                                                      None)
    with StandInKernels(), FlopCounter() as fc:
        aten._flash_attention_forward(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                      0.0, False, False)
    return fc


def test_a_varlen_flash_call_costs_its_sequences_pairs():
    fc = _flash_call()
    pairs = HEADS * block_diagonal_pairs(LENGTHS_Q, LENGTHS_K)
    assert pairs == HEADS * sum(a * b for a, b in zip(LENGTHS_Q, LENGTHS_K))
    row = fc.by_operator()["aten._flash_attention_forward"]
    assert row.macs == pairs * (D + D_V)
    assert fc.unsupported_ops() == {}
    # batch x max_q x max_k, the old price, is far above
    assert row.macs < HEADS * 4 * 12 * 12 * (D + D_V)


def test_a_varlen_efficient_call_costs_its_sequences_pairs():
    q = torch.randn(1, sum(LENGTHS_Q), HEADS, D)
    k = torch.randn(1, sum(LENGTHS_K), HEADS, D)
    v = torch.randn(1, sum(LENGTHS_K), HEADS, D_V)
    with StandInKernels(), FlopCounter() as fc:
        aten._efficient_attention_forward(q, k, v, None, _cumulative(LENGTHS_Q),
                                          _cumulative(LENGTHS_K), max(LENGTHS_Q),
                                          max(LENGTHS_K), 0.0, 0)
    pairs = HEADS * block_diagonal_pairs(LENGTHS_Q, LENGTHS_K)
    assert fc.by_operator()["aten._efficient_attention_forward"].macs == pairs * (D + D_V)


def test_calls_with_other_lengths_are_other_signatures():
    a, b = _flash_call((4, 4), (4, 4)), _flash_call((7, 1), (7, 1))
    assert a.total.macs == HEADS * 32 * (D + D_V)
    assert b.total.macs == HEADS * 50 * (D + D_V)


def test_without_the_lengths_values_the_bound_needs_none():
    """On an accelerator the lengths are not read (the host would wait for the device): the
    price is min(max_k · total_q, max_q · total_k) pairs per head, an upper bound that needs
    no values, exact for equal lengths."""
    formula = REGISTRY.lookup(aten._flash_attention_forward.default).formula
    shapes = (torch.Size([sum(LENGTHS_Q), HEADS, D]), torch.Size([sum(LENGTHS_K), HEADS, D]),
              torch.Size([sum(LENGTHS_K), HEADS, D_V]), torch.Size([5]), torch.Size([5]),
              12, 12, 0.0, False, False)
    unknown = formula(*shapes, out_shape=None, int_values=[None] * 10)
    bound = HEADS * min(12 * sum(LENGTHS_Q), 12 * sum(LENGTHS_K)) * (D + D_V)
    assert unknown.macs == bound
    known = formula(*shapes, out_shape=None, int_values=[None, None, None,
                                                          tuple(_cumulative(LENGTHS_Q).tolist()),
                                                          tuple(_cumulative(LENGTHS_K).tolist())]
                    + [None] * 5)
    assert known.macs == HEADS * block_diagonal_pairs(LENGTHS_Q, LENGTHS_K) * (D + D_V) < bound
    equal = formula(torch.Size([12, HEADS, D]), torch.Size([12, HEADS, D]),
                    torch.Size([12, HEADS, D_V]), torch.Size([4]), torch.Size([4]), 4, 4, 0.0,
                    False, False, out_shape=None, int_values=[None] * 10)
    assert equal.macs == HEADS * 3 * 4 * 4 * (D + D_V)  # three sequences of 4, exact


@pytest.mark.parametrize("causal", [False, True])
def test_the_backward_is_priced_per_sequence_too(causal):
    formula = REGISTRY.lookup(aten._flash_attention_backward.default).formula
    total_q, total_k = sum(LENGTHS_Q), sum(LENGTHS_K)
    q, k = torch.Size([total_q, HEADS, D]), torch.Size([total_k, HEADS, D])
    cu = [None] * 6 + [tuple(_cumulative(LENGTHS_Q).tolist()),
                       tuple(_cumulative(LENGTHS_K).tolist())] + [None] * 6
    cost = formula(q, q, k, k, q, torch.Size([HEADS, total_q]), torch.Size([5]),
                   torch.Size([5]), 12, 12, 0.0, causal, torch.Size([2]), torch.Size([0]),
                   out_shape=None, int_values=cu)
    assert cost.macs == HEADS * block_diagonal_pairs(LENGTHS_Q, LENGTHS_K) * (3 * D + 2 * D)
