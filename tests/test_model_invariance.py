"""Whole models (issue 41, point 5): real transformers models built from config, counted
eagerly with SDPA, under ``inference_mode`` and ``no_grad``, through SDPA's math backend, with
``attn_implementation="eager"`` (attention as plain ops) and compiled by inductor. Model MACs
are one figure on every path; model flops too, except the element-wise work each path spells
its own way, named here and in docs/conventions.md ("Whole models").

Oracle: the model counted eagerly with SDPA (the CPU flash kernel, its masked pairs from the
mask's values and the causal rule, tested against a naive loop in
tests/test_kernel_invariance.py)."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dispatch_flops import FlopCounter
from dispatch_flops.engine.graphs.dynamo import has_ignore_compile_internals

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow,  # models built from config, and inductor compiles
              pytest.mark.usefixtures("fresh_dynamo")]

V, B, S = 96, 2, 12


def build(name: str, attention: str = "sdpa"):
    torch.manual_seed(0)
    t = transformers
    if name == "gpt2":
        config = t.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=V, n_positions=32)
        cls = t.GPT2LMHeadModel
    elif name == "llama":  # grouped-query attention: 4 query heads share 2 key/value heads
        config = t.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
                               max_position_embeddings=32)
        cls = t.LlamaForCausalLM
    elif name == "bert":
        config = t.BertConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                              num_attention_heads=4, vocab_size=V, max_position_embeddings=32)
        cls = t.BertForMaskedLM
    else:  # an encoder-decoder: T5, relative position bias added to the scores
        config = t.T5Config(num_layers=1, num_decoder_layers=1, d_model=32, d_ff=64,
                            num_heads=4, d_kv=8, vocab_size=V, decoder_start_token_id=0)
        cls = t.T5ForConditionalGeneration
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls._from_config(config, attn_implementation=attention)


def inputs(name: str) -> dict:
    ids = torch.randint(3, V, (B, S), generator=torch.Generator().manual_seed(1))
    kwargs = {"input_ids": ids, "labels": ids.clone()}
    if name in ("bert", "t5"):  # the second sequence padded after 8 tokens
        mask = torch.ones(B, S, dtype=torch.long)
        mask[1, 8:] = 0
        kwargs["attention_mask"] = mask
    return kwargs


def count(model, kwargs, train=False, during=contextlib.nullcontext, call=None):
    """(model flops, model MACs, hardware flops, hardware MACs) of one forward (and the
    loss's backward when ``train``), the model in train() (dropout on) or eval()."""
    model.train(train)
    with FlopCounter(model) as fc, during():
        out = (model if call is None else call)(**kwargs)
        if train:
            out.loss.backward()
    model.zero_grad(set_to_none=True)
    t = fc.total
    return t.model_flops, t.model_macs, t.flops, t.macs


MODELS = ["gpt2", "llama", "bert", "t5"]


@pytest.mark.parametrize("name", MODELS)
def test_forward_rows(name):
    """Forward, eval(): model MACs equal on every path; model flops equal under no_grad,
    inference_mode, with grad on (T5 with grad on runs the math decomposition) and through
    the math backend (its own element-wise ops are hardware only); eager attention (plain
    ops) differs only by its element-wise ops (scale, mask add, mask building), a fraction
    of a percent."""
    model, kwargs = build(name), inputs(name)
    base = count(model, kwargs, during=torch.no_grad)
    assert count(model, kwargs, during=torch.inference_mode) == base
    with sdpa_kernel(SDPBackend.MATH):
        math = count(model, kwargs, during=torch.no_grad)
    # T5's relative position bias is SDPA's mask and a parameter's gradient: with grad on,
    # the CPU flash kernel refuses a mask that requires grad, and SDPA runs its math
    grad_on = count(model, kwargs)
    if name != "t5":
        assert grad_on == base
    plain = count(build(name, "eager"), kwargs, during=torch.no_grad)
    for row in (math, plain, grad_on):
        assert row[1] == base[1] and row[3] == base[3]  # model and hardware MACs
    assert math[0] == grad_on[0] == base[0]
    assert 0 < plain[0] - base[0] < 0.01 * base[0]


def test_gpt2_element_wise_difference_in_closed_form():
    """GPT-2 forward: the math decomposition's model flops are the fused kernel's; its own
    element-wise ops, less the kernel's one scale per unmasked pair, are hardware only (on
    its softmax's record, beside the masked entries' 5 each): q and k scaled apart
    (``2·b·h·s·d``), the causal mask made (``where`` over ``s²``) and added to every score
    (``b·h·s²``). Eager attention (plain ops) still differs in model flops by its own: every
    score scaled and masked (``2·b·h·s²``), the mask built (``le`` over ``s²``, ``where``
    over ``b·s²``, two index adds over ``s``), less the same scale per unmasked pair."""
    model, kwargs = build("gpt2"), inputs("gpt2")
    base = count(model, kwargs, during=torch.no_grad)
    model.eval()
    with sdpa_kernel(SDPBackend.MATH), FlopCounter(model) as fc, torch.no_grad():
        model(**kwargs)
    math = fc.total
    plain = count(build("gpt2", "eager"), kwargs, during=torch.no_grad)
    h, d = 4, 8
    kept = B * h * S * (S + 1) // 2  # unmasked causal pairs
    assert math.model_flops == base[0]
    softmax = fc.by_operator()["aten._safe_softmax"]
    assert softmax.masked_flops - 5 * (B * h * S * S - kept) == \
        2 * B * h * S * d + S * S + B * h * S * S - kept
    assert plain[0] - base[0] == 2 * B * h * S * S + S * S + B * S * S + 2 * S - kept


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_training_rows(name):
    """A training step's forward and backward in train(): model MACs equal through the fused
    kernel (Llama: no attention dropout), SDPA's math decomposition (GPT-2's dropout, or the
    math backend) and eager attention; model flops equal through the fused kernel and the
    math decomposition (Llama's GQA expansion and gradient sums hardware only), eager
    attention's differ by its element-wise ops only."""
    model, kwargs = build(name), inputs(name)
    base = count(model, kwargs, train=True)
    with sdpa_kernel(SDPBackend.MATH):
        math = count(model, kwargs, train=True)
    if name == "gpt2":  # dropout on: the math decomposition either way
        assert math == base
    else:  # no attention dropout: the CPU flash kernel, whose backward recomputes q·kᵀ
        assert math[3] < base[3]  # hardware only: the fused backward's fifth contraction
    assert math[:2] == base[:2]
    plain = count(build(name, "eager"), kwargs, train=True)
    assert plain[1] == base[1]
    assert abs(plain[0] - base[0]) < 0.01 * base[0]


compiled_only = pytest.mark.skipif(not has_ignore_compile_internals(),
                                   reason="torch without ignore_compile_internals")


@compiled_only
@pytest.mark.parametrize("name", MODELS)
def test_compiled_forward(name):
    """Compiled by inductor, forward under no_grad: causal models (their masks built from
    shapes) count as eager, every figure. A padding mask is a graph input: its masked pairs
    are counted at each run from the real mask (model MACs as eager's); transformers skips
    its data-dependent all-ones check of the mask under compile (an ``eq`` over the mask's
    ``b·s``, per mask), the one difference."""
    model, kwargs = build(name), inputs(name)
    eager = count(model, kwargs, during=torch.no_grad)
    compiled = count(model, kwargs, during=torch.no_grad, call=torch.compile(model))
    if name in ("gpt2", "llama"):
        assert compiled == eager
    else:
        masks = 1 if name == "bert" else 2  # T5: the encoder's and the decoder's
        assert eager[1] < eager[3]  # masked pairs found
        assert compiled[1] == eager[1] and compiled[3] == eager[3]
        assert compiled[0] == eager[0] - masks * B * S
        assert compiled[2] == eager[2] - masks * B * S


def padded(name: str) -> dict:
    """``inputs`` with a padding mask for every model: the second sequence after 8 tokens."""
    kwargs = inputs(name)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 8:] = 0
    kwargs["attention_mask"] = mask
    return kwargs


def two_steps(model, call, kwargs, train: bool) -> tuple:
    """(model flops, model MACs, flops, MACs) of two forward + backward steps of ``call``
    (``model`` or its compiled wrapper) in ``train()`` or ``eval()``, one counter."""
    model.train(train)
    with FlopCounter(model) as fc:
        for _ in range(2):
            call(**kwargs).loss.backward()
    model.zero_grad(set_to_none=True)
    t = fc.total
    return t.model_flops, t.model_macs, t.flops, t.macs


@compiled_only
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_compiled_padded_training_steps(name, train):
    """Every model with a padding mask passed in, compiled, two forward and backward steps:
    in eval() (BERT: the CPU flash kernel, forward and backward; T5: SDPA's math
    decomposition, its position bias requiring grad) and in train() (dropout: the math
    decomposition): model MACs equal eager's, the mask's pairs counted at each run, forward
    and backward. Model flops and hardware flops differ only by transformers' data-dependent
    checks of the mask, which compiled code skips: an ``eq`` over its ``b·s`` per mask (BERT,
    T5's two), or the causal models' check that it is all ones (a sum over ``b·s``, 2 flops
    an element, and an ``eq`` per sequence)."""
    model, kwargs = build(name), padded(name)
    eager = two_steps(model, model, kwargs, train)
    compiled = two_steps(model, torch.compile(model), kwargs, train)
    assert eager[1] < eager[3]  # masked pairs found
    skipped = {"bert": B * S, "t5": 2 * B * S}.get(name, 2 * B * S + B)
    assert compiled[1] == eager[1] and compiled[3] == eager[3]
    assert eager[0] - compiled[0] == eager[2] - compiled[2] == 2 * skipped


@compiled_only
def test_compiled_training_step_gpt2():
    """GPT-2 compiled, trained two steps in train() (dropout: the math decomposition, whose
    causal mask the fake run follows on fake tensors): every figure equals eager's, the
    masked pairs counted at each run."""
    model, kwargs = build("gpt2"), inputs("gpt2")
    eager = two_steps(model, model, kwargs, True)
    assert eager[0] < eager[2]  # masked pairs found
    assert two_steps(model, torch.compile(model), kwargs, True) == eager
