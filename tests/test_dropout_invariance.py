"""Dropout is hardware work (issue 41, point 1): a model has the same model flops in
``train()`` and ``eval()``; its random draws, mask and scale are in hardware flops only, named
in the table's footer. Oracle: ``eval()`` (no dropout op runs), and the per-element costs of
the ops dropout runs (``ELEMENT_COSTS``), forward and backward, on every path torch takes:
the CPU's decomposition (``bernoulli_``, ``div_``, the products with its noise), CUDA's
``native_dropout`` / ``native_dropout_backward``, the composite seen whole under
``inference_mode``, and SDPA's ``dropout_p`` through its math decomposition."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from dispatch_flops import FlopCounter
from dispatch_flops.formulas import ELEMENT_COSTS

C = ELEMENT_COSTS


def _step(model, x) -> FlopCounter:
    with FlopCounter(model) as fc:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    return fc


def test_nn_dropout_train_and_eval_have_one_model_figure():
    """nn.Dropout on the CPU: noise drawn, scaled, multiplied in forward and backward; model
    flops equal eval()'s, and hardware exceeds them by exactly that work."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.3), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    train = _step(model.train(), x)
    evaluated = _step(model.eval(), x)
    n = 4 * 16
    dropout = n * (C["random_draw"] + C["bernoulli"] + C["div"] + 2 * C["mul"])
    assert train.model_flops() == evaluated.model_flops()
    assert train.hardware_flops() - evaluated.hardware_flops() == dropout
    assert train.total.masked_flops == dropout  # the hardware-only share: all dropout
    footer = " ".join(train.table(width=200).split())
    assert "Dropout (random mask, scale): 256 flops" in footer and "Masked +" not in footer
    assert not model.training  # left as the test set it
    assert "Dropout (random mask" not in evaluated.table(width=200)


def test_native_dropout_and_its_backward_are_hardware_only():
    """CUDA's path (here on the CPU, the same aten ops): native_dropout (a draw, compare,
    mask, scale: 3 an element) and native_dropout_backward (2)."""
    x = torch.randn(3, 5, requires_grad=True)
    with FlopCounter() as fc:
        out, mask = torch.ops.aten.native_dropout(x, 0.5, True)
        torch.ops.aten.native_dropout_backward(torch.ones_like(out), mask, 2.0)
    n = 15
    assert fc.hardware_flops() == n * (C["random_draw"] + C["dropout"] + C["dropout_backward"])
    assert fc.model_flops() == 0


def test_dropout_seen_whole_under_inference_mode_is_hardware_only():
    x = torch.randn(6, 7)
    with torch.inference_mode(), FlopCounter() as fc:
        F.dropout(x, 0.2, training=True)
    assert fc.hardware_flops() == 42 * (C["random_draw"] + C["bernoulli"] + C["div"] + C["mul"])
    assert fc.model_flops() == 0


@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_dropout_on_the_math_path_leaves_model_flops_alone(is_causal):
    """SDPA's math decomposition with dropout_p (the CPU's path whenever dropout is on): its
    noise on the probabilities is hardware work; model flops equal dropout_p=0's on the same
    path, forward + backward, and so do the masked pairs."""
    def call(p):
        torch.manual_seed(0)
        q = torch.randn(2, 2, 16, 8, requires_grad=True)
        with sdpa_kernel(SDPBackend.MATH), FlopCounter() as fc:
            F.scaled_dot_product_attention(q, q, q, dropout_p=p, is_causal=is_causal)\
                .sum().backward()
        return fc

    off, on = call(0.0), call(0.3)
    n = 2 * 2 * 16 * 16  # one noise element per (query, key) pair
    dropout = n * (C["random_draw"] + C["bernoulli"] + C["div"] + 2 * C["mul"])
    assert on.model_flops() == off.model_flops()
    assert on.total.model_macs == off.total.model_macs
    assert (on.hardware_flops() - on.model_flops()) - (off.hardware_flops()
                                                        - off.model_flops()) == dropout


@pytest.mark.slow
def test_gpt2_train_and_eval_have_one_model_figure_on_one_attention_path():
    """transformers' GPT-2 (attention, residual and embedding dropout) in train() and eval(),
    forward + backward, SDPA held to its math path (the CPU runs it whenever dropout is on;
    the element-wise difference between math and fused attention is docs/conventions.md's)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 64, (2, 16))

    def step(mode):
        getattr(model, mode)()
        with sdpa_kernel(SDPBackend.MATH), FlopCounter(model) as fc:
            model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        return fc

    train, evaluated = step("train"), step("eval")
    assert train.model_flops() == evaluated.model_flops()
    assert train.total.model_macs == evaluated.total.model_macs
    assert train.hardware_flops() > evaluated.hardware_flops()
