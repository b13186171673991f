"""Model flops are the model's: one attention call gives the same model flops and MACs through
every kernel torch may pick for it (issue 41), and a pair masked twice (by a mask and by the
causal rule) is one masked pair, never negative model flops (issue 43).

The CUDA kernels are called here on the CPU with a stand-in kernel below the counter (a
dispatch mode that returns outputs of the right shapes: tests/helpers.py),
so the counter sees the real op, its arguments and the mask as torch hands that kernel: the
memory-efficient kernel an expanded additive mask, cuDNN a boolean mask filled with -65504
(torch's ``convert_boolean_attn_mask_cudnn``), the CPU flash kernel the mask as given, turned
additive. Oracle: the unmasked pairs by a naive loop over the mask (and the causal rule). Run
as a script to print the matrix: ``python tests/test_kernel_invariance.py``.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

from dispatch_flops import FlopCounter, Profile
from dispatch_flops.results.stats import Stats
from helpers import (
    StandInKernels,
    additive,
    attention_stats,
    causal,
    keep_all,
    loop_pairs,
    mask_of,
    window,
)

aten = torch.ops.aten
B, S, D = 2, 16, 8


# -- oracles ------------------------------------------------------------------------------------
# -- one call through each kernel ---------------------------------------------------------------
# (mask kind, allowed) : "none", "is_causal", "bool", "additive" (-inf), "finfo_min", and a
# bool mask with is_causal too ("bool+is_causal")
MASKS = {
    "none": ("none", keep_all),
    "is_causal": ("is_causal", causal),
    "window 5 bool": ("bool", window(5)),
    "window 5 additive -inf": ("additive", window(5)),
    "window 5 additive finfo.min": ("finfo_min", window(5)),
    "window 5 bool + is_causal": ("bool+is_causal", window(5)),
}
KERNELS = ("cpu flash", "flash", "efficient", "cudnn", "efficient kernel", "flash kernel")


def _inputs(h_kv: int):
    torch.manual_seed(0)
    q = torch.randn(B, 4, S, D)
    k, v = torch.randn(B, h_kv, S, D), torch.randn(B, h_kv, S, D)
    return q, k, v


def _additive(kind: str, allowed, dtype=torch.float32) -> torch.Tensor:
    keep = mask_of(allowed, S, S)
    fill = {"additive": float("-inf"), "finfo_min": torch.finfo(dtype).min,
            "bool": float("-inf"), "cudnn": -65504.0}[kind]
    return additive(keep, fill, dtype)


def kernel_call(kernel: str, kind: str, allowed, h_kv: int, dropout: float, backward: bool):
    """Count one attention call (forward, or its backward) through ``kernel``'s aten overload,
    with the mask as torch hands that kernel; None where the kernel takes no such call."""
    q, k, v = _inputs(h_kv)
    is_causal = kind in ("is_causal", "bool+is_causal")
    has_mask = kind not in ("none", "is_causal")
    if has_mask and kernel in ("flash", "flash kernel"):
        return None  # flash kernels take no mask: torch picks another for a masked call
    if kind == "bool+is_causal" and kernel in ("efficient kernel",):
        return None  # the raw kernel takes a mask or a causal type (SDPA passes is_causal)
    if dropout and kernel == "cpu flash":
        return None  # no dropout on the CPU flash kernel: torch runs the math decomposition
    if kernel == "cpu flash" and backward and h_kv != q.shape[1] and torch.__version__ < "2.9":
        # torch 2.8's CPU flash backward aborts the process (Fatal Python error) on GQA
        # shapes; its SDPA runs the math decomposition for them instead
        return None
    mask = None
    if has_mask:
        base = "bool" if kind == "bool+is_causal" else kind
        mask = _additive("cudnn" if kernel == "cudnn" and base == "bool" else base, allowed)
        if kernel != "cpu flash":  # the CUDA paths expand the mask to [b, h, s_q, s_k]
            mask = mask.expand(B, q.shape[1], S, S)
    bshd = [t.transpose(1, 2) for t in (q, k, v)]
    out, lse = torch.empty_like(q), torch.empty(B, q.shape[1], S)
    none = torch.empty(0)
    with StandInKernels(), FlopCounter() as fc:
        if kernel == "cpu flash":
            if not backward:
                aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout, is_causal,
                                                                 attn_mask=mask)
            else:
                aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    out, q, k, v, out, lse, dropout, is_causal, attn_mask=mask)
        elif kernel == "flash":
            if not backward:
                aten._scaled_dot_product_flash_attention(q, k, v, dropout, is_causal)
            else:
                aten._scaled_dot_product_flash_attention_backward(
                    out, q, k, v, out, lse, None, None, S, S, dropout, is_causal, none, none)
        elif kernel == "efficient":
            if not backward:
                aten._scaled_dot_product_efficient_attention(q, k, v, mask, True, dropout,
                                                             is_causal)
            else:
                aten._scaled_dot_product_efficient_attention_backward(
                    out, q, k, v, mask, out, lse, none, none,
                    dropout, [True, True, True, False], is_causal)
        elif kernel == "cudnn":
            if not backward:
                aten._scaled_dot_product_cudnn_attention(q, k, v, mask, True, dropout,
                                                         is_causal, False)
            else:
                aten._scaled_dot_product_cudnn_attention_backward(
                    out, q, k, v, out, lse, none, none, mask, None, None, S, S, dropout,
                    is_causal)
        elif kernel == "efficient kernel":
            mask_type = 1 if is_causal else 0
            if not backward:
                aten._efficient_attention_forward(*bshd, mask, None, None, S, S, dropout,
                                                  mask_type, True)
            else:
                aten._efficient_attention_backward(
                    out.transpose(1, 2), *bshd, mask, out.transpose(1, 2), None, None, S, S,
                    lse, dropout, none, none, mask_type, False)
        elif kernel == "flash kernel":
            if not backward:
                aten._flash_attention_forward(*bshd, None, None, S, S, dropout, is_causal,
                                              False)
            else:
                # dense: no cumulative lengths (undefined tensors reach Python as None)
                aten._flash_attention_backward(out.transpose(1, 2), *bshd, out.transpose(1, 2),
                                               lse, None, None, S, S, dropout, is_causal,
                                               none, none)
    return attention_stats(fc)


CONFIGS = [(mask, h_kv, dropout, backward)
           for mask in MASKS for h_kv in (4, 1) for dropout in (0.0, 0.1)
           for backward in (False, True)]


def _name(config) -> str:
    mask, h_kv, dropout, backward = config
    return (f"{mask}, {'MHA' if h_kv == 4 else 'GQA 4:1'}, dropout {dropout}, "
            f"{'backward' if backward else 'forward'}")


@pytest.mark.parametrize("config", CONFIGS, ids=[_name(c) for c in CONFIGS])
def test_every_kernel_gives_one_call_the_same_model_flops(config):
    """Each kernel that can run the call: model MACs the unmasked pairs (naive loop) times
    the MACs of a pair; model flops and hardware flops equal across kernels (they run the
    same per-pair work); 0 <= model <= hardware."""
    mask, h_kv, dropout, backward = config
    kind, allowed = MASKS[mask]
    figures = {}
    for kernel in KERNELS:
        stats = kernel_call(kernel, kind, allowed, h_kv, dropout, backward)
        if stats is not None:
            figures[kernel] = stats
    assert len(figures) >= 2
    # the model's backward is four contractions (2d + 2d_v per pair); the kernels run five
    # (they recompute q·kᵀ: hardware only)
    per_pair = (2 * D + 2 * D) if backward else 2 * D
    hardware_per_pair = (3 * D + 2 * D) if backward else 2 * D
    useful = B * 4 * loop_pairs(allowed, S, S)
    for kernel, stats in figures.items():
        assert stats.model_macs == useful * per_pair, kernel
        assert stats.macs == B * 4 * S * S * hardware_per_pair, kernel
        assert 0 <= stats.model_flops <= stats.flops, kernel
    assert len({(s.flops, s.model_flops, s.model_macs) for s in figures.values()}) == 1, {
        k: (s.flops, s.model_flops) for k, s in figures.items()}


# -- a mask and the causal rule together (issue 43) -----------------------------------------
def _sdpa_stats(q, k, v, mask, is_causal, backward=False) -> Stats:
    q, k, v = (t.clone().requires_grad_(backward) for t in (q, k, v))
    with FlopCounter() as fc:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                             enable_gqa=k.shape[1] != q.shape[1])
        if backward:
            out.sum().backward()
    return fc


def _oracle(mask: torch.Tensor, b, h, s_q, s_k, is_causal) -> int:
    """Unmasked pairs by a loop: kept by the mask (broadcast to [b, h, s_q, s_k]) and, with
    is_causal, by torch's top-left causal rule."""
    full = mask.expand(b, h, s_q, s_k) if mask.dim() == 4 else mask.expand(b, h, s_q, s_k)
    keep = full if full.dtype == torch.bool else full > float("-inf")
    n = 0
    for bi, hi, i, j in itertools.product(range(b), range(h), range(s_q), range(s_k)):
        if keep[bi, hi, i, j] and (not is_causal or j <= i):
            n += 1
    return n


# torch 2.8's SDPA refuses an explicit mask with is_causal=True (a RuntimeError): the double
# subtraction these tests guard against cannot happen there
_MASK_WITH_CAUSAL = pytest.mark.skipif(
    torch.__version__ < "2.9", reason="torch 2.8's SDPA refuses attn_mask with is_causal=True")


@_MASK_WITH_CAUSAL
def test_an_all_false_mask_with_is_causal_masks_every_pair_once():
    """The case of issue 43: an all-False 8x8 mask with is_causal gave model flops -580."""
    q = torch.randn(1, 1, 8, 4)
    fc = _sdpa_stats(q, q, q, torch.zeros(8, 8, dtype=torch.bool), True)
    stats = attention_stats(fc)
    assert stats.model_macs == 0 and stats.model_flops == 0
    assert stats.masked_flops == stats.flops == 64 * (2 * 8 + 1 + 5 + 1)
    assert fc.model_flops() >= 0


@_MASK_WITH_CAUSAL
@pytest.mark.parametrize("s_q,s_k", [(8, 8), (6, 10), (10, 6)])
@pytest.mark.parametrize("backward", [False, True])
def test_a_mask_and_is_causal_count_the_pairs_both_keep(s_q, s_k, backward):
    torch.manual_seed(1)
    q, kv = torch.randn(2, 4, s_q, D), torch.randn(2, 2, s_k, D)
    mask = torch.rand(2, 1, s_q, s_k) < 0.6  # per batch, broadcast over heads
    stats = attention_stats(_sdpa_stats(q, kv, kv, mask, True, backward))
    per_pair = 2 * D + (4 * D if backward else 0)  # the backward's recomputed q·kᵀ: hardware
    assert stats.model_macs == _oracle(mask, 2, 4, s_q, s_k, True) * per_pair
    assert stats.macs == 2 * 4 * s_q * s_k * (2 * D + (5 * D if backward else 0))


@pytest.mark.skipif(torch.__version__ < "2.9", reason="torch 2.8 refuses a mask with "
                    "is_causal and runs masked GQA calls on SDPA's math path; the test reads "
                    "the fused kernel's row")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s_q=st.integers(1, 9), s_k=st.integers(1, 9), h_kv=st.sampled_from([1, 2]),
       is_causal=st.booleans(), additive=st.booleans(), density=st.floats(0.0, 1.0),
       shape=st.sampled_from(["2d", "per batch", "per head", "row"]), seed=st.integers(0, 99))
def test_model_flops_are_the_unmasked_pairs_and_never_negative(s_q, s_k, h_kv, is_causal,
                                                                additive, density, shape,
                                                                seed):
    """Random masks x is_causal x shapes (broadcast masks, GQA, s_q != s_k): model MACs are
    the pairs the mask and the causal rule both keep, by a loop; 0 <= model <= hardware."""
    generator = torch.Generator().manual_seed(seed)
    dims = {"2d": (s_q, s_k), "per batch": (2, 1, s_q, s_k), "per head": (2, 2, s_q, s_k),
            "row": (1, 1, 1, s_k)}[shape]
    keep = torch.rand(dims, generator=generator) < density
    mask = torch.zeros(dims).masked_fill(~keep, float("-inf")) if additive else keep
    q = torch.randn(2, 2, s_q, 4, generator=generator)
    kv = torch.randn(2, h_kv, s_k, 4, generator=generator)
    fc = _sdpa_stats(q, kv, kv, mask, is_causal)
    stats = attention_stats(fc)
    assert stats.model_macs == _oracle(mask, 2, 2, s_q, s_k, is_causal) * 8
    assert 0 <= stats.model_flops <= stats.flops
    assert 0 <= fc.model_flops() <= fc.hardware_flops()


# -- the same mask in every dtype and through the math decomposition -----------------------------
def test_cudnn_boolean_mask_fill_counts_as_masked():
    """cuDNN gets a boolean mask as an additive one filled with -65504, a finite value: its
    pairs are masked as -inf's are, in every dtype (bf16 rounds it to -65536)."""
    kind, allowed = MASKS["window 5 bool"]
    reference = kernel_call("cpu flash", kind, allowed, 4, 0.0, False)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        mask = _additive("cudnn", allowed, dtype)
        q = torch.randn(B, 4, S, D, dtype=dtype)
        with StandInKernels(), FlopCounter() as fc:
            aten._scaled_dot_product_cudnn_attention(q, q, q, mask, True, 0.0, False, False)
        assert attention_stats(fc).model_macs == reference.model_macs, dtype


@pytest.mark.parametrize("dtype,dropout", [(torch.float32, 0.0), (torch.bfloat16, 0.0),
                                           (torch.float32, 0.3), (torch.bfloat16, 0.3)])
def test_the_math_backend_masks_both_contractions_in_every_dtype(dtype, dropout):
    """SDPA's math decomposition in a half dtype casts the float32 probabilities to the
    inputs' dtype (the weights it returns) and multiplies the float32 copy by v; with dropout
    it multiplies them by its dropout mask first: the masked share of the second contraction
    is found either way (it was half the causal pairs in bf16 or with dropout)."""
    q = torch.randn(1, 2, S, D, dtype=dtype)
    with sdpa_kernel(SDPBackend.MATH), FlopCounter() as fc:
        F.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=dropout)
    bmm = fc.by_operator()["aten.bmm"]
    assert bmm.model_macs == 2 * loop_pairs(causal, S, S) * 2 * D


def matrix() -> str:
    """Model MACs / flops of every configuration through every kernel that runs it."""
    lines = [f"{'configuration':60} {'kernel':17} {'hardware flops':>14} {'model flops':>12} "
             f"{'model MACs':>11}"]
    for config in CONFIGS:
        mask, h_kv, dropout, backward = config
        kind, allowed = MASKS[mask]
        for kernel in KERNELS:
            stats = kernel_call(kernel, kind, allowed, h_kv, dropout, backward)
            if stats is not None:
                lines.append(f"{_name(config):60} {kernel:17} {stats.flops:>14,} "
                             f"{stats.model_flops:>12,} {stats.model_macs:>11,}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(matrix())


@pytest.mark.parametrize("s_q,s_k", [(6, 10), (10, 6), (8, 8)])
@pytest.mark.parametrize("with_mask", [False, True])
def test_the_efficient_kernels_bottom_right_causal_type(s_q, s_k, with_mask):
    """``custom_mask_type`` 2 aligns the causal rule to the last key (row i keeps keys up to
    i + s_k - s_q), alone or with a bias: the pairs both keep, by a loop."""
    torch.manual_seed(2)
    q, kv = torch.randn(1, s_q, 2, D), torch.randn(1, s_k, 2, D)
    keep = torch.rand(s_q, s_k) < 0.5 if with_mask else torch.ones(s_q, s_k, dtype=torch.bool)
    bias = additive(keep.expand(1, 2, s_q, s_k)) if with_mask else None
    with StandInKernels(), FlopCounter() as fc:
        aten._efficient_attention_forward(q, kv, kv, bias, None, None, s_q, s_k, 0.0, 2, True)
    useful = 2 * loop_pairs(lambda i, j: keep[i, j] and j <= i + s_k - s_q, s_q, s_k)
    stats = attention_stats(fc)
    assert stats.model_macs == useful * 2 * D
    assert stats.macs == 2 * s_q * s_k * 2 * D


# -- the math decomposition's backward (issue 41, point 3) --------------------------------------
def _training_call(backend, mask, is_causal: bool, h_kv: int, dropout: float, dtype) -> Stats:
    return _training_counter(backend, mask, is_causal, h_kv, dropout, dtype).total


def _training_counter(backend, mask, is_causal: bool, h_kv: int, dropout: float,
                      dtype) -> FlopCounter:
    torch.manual_seed(0)
    q = torch.randn(B, 4, S, D, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(B, h_kv, S, D, dtype=dtype, requires_grad=True) for _ in range(2))
    with sdpa_kernel(backend), FlopCounter() as fc:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                             dropout_p=dropout, enable_gqa=h_kv != 4)
        out.sum().backward()
    return fc


MATH_CONFIGS = [(mask, h_kv, dropout, dtype)
                for mask in ("none", "is_causal", "window 5 bool", "window 5 additive -inf")
                for h_kv in (4, 1) for dropout in (0.0, 0.3)
                for dtype in (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("config", MATH_CONFIGS,
                         ids=[f"{m}, h_kv {h}, dropout {p}, {str(t)[6:]}"
                              for m, h, p, t in MATH_CONFIGS])
def test_the_math_backward_finds_the_masked_pairs_the_kernels_do(config):
    """Forward + backward through SDPA's math decomposition (its contractions, softmax and
    their autograd): model MACs are the unmasked pairs times the model's 6d MACs a pair (two
    forward contractions, four backward), as the CPU flash kernel's, whose fifth backward
    contraction (q·kᵀ again) is hardware only; hardware MACs differ by exactly that."""
    mask_name, h_kv, dropout, dtype = config
    if h_kv != 4 and torch.__version__ < "2.9":
        pytest.skip("torch 2.8's CPU flash kernel takes no GQA call (no available kernel)")
    kind, allowed = MASKS[mask_name]
    is_causal = kind == "is_causal"
    mask = None
    if kind == "bool":
        mask = mask_of(allowed, S, S)
    elif kind == "additive":
        mask = _additive(kind, allowed, dtype)
    useful = B * 4 * loop_pairs(allowed, S, S)
    counted = _training_counter(SDPBackend.MATH, mask, is_causal, h_kv, dropout, dtype)
    math = counted.total
    assert math.model_macs == useful * 6 * D
    assert math.macs == B * 4 * S * S * 6 * D
    assert 0 <= math.model_flops <= math.flops
    # the CPU flash kernel takes no dropout; model flops do not depend on it (hardware work)
    flash = _training_call(SDPBackend.FLASH_ATTENTION, mask, is_causal, h_kv, 0.0, dtype)
    assert flash.model_macs == math.model_macs
    assert flash.macs - math.macs == B * 4 * S * S * D  # the recomputed q·kᵀ
    # model flops are the model's: the math path's element-wise ops priced as the kernels'
    assert math.model_flops == flash.model_flops
    # ... the rest of what they ran is hardware only, on the softmax (forward) and softmax
    # backward records, beside their masked entries (softmax 5, its backward 4 a masked one)
    ops = counted.by_operator()
    math_hardware_only = sum(ops[op].masked_flops
                             for op in ("aten._safe_softmax", "aten._softmax_backward_data"))
    masked = B * 4 * S * S - useful
    assert math_hardware_only - masked * (5 + 4) == math_minus_fused_flops(
        B, 4, h_kv, S, S, D, useful // B // 4, mask is not None, kind != "none", is_causal)


def math_minus_fused_flops(b, h, h_kv, s_q, s_k, d, unmasked, attn_mask, adds_mask,
                           is_causal) -> int:
    """The element-wise flops SDPA's math decomposition (forward + backward) runs less those a
    fused kernel's formula charges (its model figure), for one call: hardware only on the
    math path, so that model flops are one figure (docs/conventions.md, "Hardware and model
    flops"). ``unmasked``: the pairs of one head the mask keeps."""
    # scale: math multiplies q and k by sqrt(scale), forward and their gradients backward;
    # the kernels charge 1 a kept pair, forward and backward
    scale = 2 * (s_q + s_k) * d - 2 * unmasked
    # mask: math adds it to every score, masked ones too (is_causal: the mask it builds);
    # the kernels charge 1 a kept pair for an attn_mask, nothing for is_causal
    add = (s_q * s_k if adds_mask else 0) - (unmasked if attn_mask else 0)
    built = s_q * s_k if is_causal else 0  # math's causal mask: where(tril(ones), 0, -inf)
    # GQA: math expands k and v to every query head and sums their gradients back
    grouped = b * h * s_k * 2 * d if h_kv != h else 0
    return b * h * (scale + add) + built + grouped


def test_model_flops_of_math_and_kernel_training_agree_without_a_mask():
    """No mask: the math decomposition's element-wise work (q and k scaled, 2·S·D a head)
    matches the kernels' per-pair scale (S² a head) when S = 2D, so model flops agree exactly
    (fwd + bwd); the hardware difference is the kernel's recomputation, named per pair."""
    math = _training_call(SDPBackend.MATH, None, False, 4, 0.0, torch.float32)
    flash = _training_call(SDPBackend.FLASH_ATTENTION, None, False, 4, 0.0, torch.float32)
    assert S == 2 * D
    assert flash.model_flops == math.model_flops
    assert flash.flops - math.flops == B * 4 * S * S * (2 * D + 5)  # q·kᵀ and softmax again


def test_math_model_flops_are_the_kernels_where_its_scaling_is_cheaper():
    """S = 8D, no mask: math scales q and k (2·S·D a head each way), fewer flops than the
    kernels' one scale a pair (S² a head each way). Model flops are still the kernels' (the
    model's figure), so here they exceed what math ran by exactly that difference."""
    s, d = 64, 8
    figures = {}
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        q, k, v = (torch.randn(1, 2, s, d, requires_grad=True) for _ in range(3))
        with sdpa_kernel(backend), FlopCounter() as fc:
            F.scaled_dot_product_attention(q, k, v).sum().backward()
        figures[backend] = fc.total
    math, flash = figures[SDPBackend.MATH], figures[SDPBackend.FLASH_ATTENTION]
    assert math.model_flops == flash.model_flops
    assert math.flops - math.model_flops == math_minus_fused_flops(
        1, 2, 2, s, s, d, s * s, False, False, False) == 2 * (4 * s * d - 2 * s * s) < 0


# -- the meta device (issue 41, point 1) ----------------------------------------------------------
def _meta_and_cpu(run) -> dict:
    return {device: run(device) for device in ("cpu", "meta")}


def test_sdpa_is_causal_on_meta_counts_the_causal_pairs():
    """On meta SDPA runs its math decomposition, whose causal mask (ones().tril(), where) is
    built from shapes: its shadow on the CPU gives the causal pairs, forward and backward."""
    def run(device):
        q = torch.randn(1, 2, 64, 16, device=device, requires_grad=True)
        with FlopCounter() as fc:
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        return fc.total

    figures = _meta_and_cpu(run)
    useful = 2 * loop_pairs(causal, 64, 64)
    assert figures["meta"].model_macs == figures["cpu"].model_macs == useful * 6 * 16
    assert figures["meta"].macs == 2 * 64 * 64 * 6 * 16  # the math backward: no recompute


@pytest.mark.parametrize("mask", ["causal", "sliding"])
def test_a_tiny_llama_built_on_meta_counts_the_model_macs_of_the_cpu(mask):
    """transformers' Llama / Mistral from config on meta vs on the CPU, forward: the causal
    pairs (is_causal on meta's math decomposition) and a sliding window (a mask transformers
    builds from arange and comparisons) give the CPU's model MACs and flops. (A padding mask is the
    user's tensor: on meta it has no values, and transformers itself reads them.)"""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if mask == "sliding":
        config, cls = MistralConfig(sliding_window=8, **kw), MistralForCausalLM
    else:
        config, cls = LlamaConfig(**kw), LlamaForCausalLM
    config._attn_implementation = "sdpa"

    def run(device):
        with torch.device(device):
            model = cls(config).eval()
        ids = torch.zeros(2, 24, dtype=torch.long, device=device)
        with FlopCounter(model) as fc:
            model(ids)
        unvalued.append(fc.to_profile().run.unvalued_masks)
        return fc.total

    unvalued: list = []
    figures = _meta_and_cpu(run)
    assert figures["meta"].masked_macs > 0
    assert figures["meta"].model_macs == figures["cpu"].model_macs
    # the math decomposition's own element-wise work is hardware only: model flops too
    assert figures["meta"].model_flops == figures["cpu"].model_flops
    assert unvalued == [0, 0]  # masks built from shapes: known, no note


@pytest.mark.parametrize("tensors", ["meta", "fake"])
def test_a_users_mask_without_values_is_said_in_the_result(tensors):
    """A padding mask that is the user's meta (or fake) tensor has no values: its calls keep
    every pair in model flops, and the result says so (``run.unvalued_masks``: one per call,
    kept by JSON, summed by ``merge``, a line in the table's footer); a causal mask from
    shapes on the same device is known (no note). Oracle: the dense pairs, and the CPU run of
    the same padding, which does subtract them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    keep = torch.ones(B, 1, S, S, dtype=torch.bool)
    keep[1, ..., S // 2:] = False  # the second sequence is half padding
    q_cpu = torch.randn(B, 4, S, D)

    def count(q, **kw) -> FlopCounter:
        with FlopCounter() as fc:
            for _ in range(3):
                F.scaled_dot_product_attention(q, q, q, **kw)
        return fc

    cpu = count(q_cpu, attn_mask=keep).to_profile()
    assert cpu.run.unvalued_masks == 0 and cpu.total.masked_macs > 0
    if tensors == "meta":
        q, mask = q_cpu.to("meta"), keep.to("meta")
        unknown, causal = count(q, attn_mask=mask), count(q, is_causal=True)
    else:
        with FakeTensorMode() as fake:
            q, mask = fake.from_tensor(q_cpu), fake.from_tensor(keep)
            unknown, causal = count(q, attn_mask=mask), count(q, is_causal=True)
    run = unknown.to_profile()
    assert run.run.unvalued_masks == 3
    assert unknown.total.model_macs == 3 * B * 4 * S * S * 2 * D  # every pair
    assert "every pair of 3 attention calls whose mask has no values" in \
        " ".join(unknown.table(width=200).split())
    assert causal.to_profile().run.unvalued_masks == 0
    assert "mask has no values" not in causal.table(width=200)
    if tensors == "meta":  # the shape-built causal mask is counted, as on the CPU
        assert causal.total.masked_macs > 0
    path = Path(tempfile.mkdtemp()) / "run.json"
    run.to_json(path)
    assert Profile.from_json(path).run.unvalued_masks == 3
    assert Profile.merge([run, run]).run.unvalued_masks == 6
    assert Profile.merge([run, run]).per_step().run.unvalued_masks == 3


@pytest.mark.parametrize("own_expansion", [False, True])
def test_math_model_flops_with_gqa_expanded_by_sdpa_or_by_the_model(own_expansion):
    """GQA through the math decomposition: the k and v expansion SDPA makes itself
    (``enable_gqa``), and its gradients' sums, are hardware only; an expansion the model makes
    before the call (``repeat_interleave``, the same ops) is the model's on every path."""
    if not own_expansion and torch.__version__ < "2.9":
        pytest.skip("torch 2.8's CPU flash kernel takes no GQA call (no available kernel)")
    figures = {}
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        torch.manual_seed(0)
        q = torch.randn(1, 4, S, D, requires_grad=True)
        k, v = (torch.randn(1, 1, S, D, requires_grad=True) for _ in range(2))
        with sdpa_kernel(backend), FlopCounter() as fc:
            if own_expansion:
                k, v = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
            F.scaled_dot_product_attention(q, k, v, enable_gqa=not own_expansion
                                           ).sum().backward()
        figures[backend] = fc.total
    math, flash = figures[SDPBackend.MATH], figures[SDPBackend.FLASH_ATTENTION]
    assert math.model_flops == flash.model_flops
    grouped = 4 * S * 2 * D  # the gradients' sums over each group (k and v)
    assert math.flops - math.model_flops == math_minus_fused_flops(
        1, 4, 1 if not own_expansion else 4, S, S, D, S * S, False, False, False) == \
        (0 if own_expansion else grouped)
