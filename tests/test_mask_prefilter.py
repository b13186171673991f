"""The mask tallies' pre-filters (issue 42) are filters only: a tensor whose numel no paired
probabilities or dropout noise has is passed over without reading its storage, and nothing
that matched before is dropped. Oracle: the same steps counted with the numel sets made to
contain every numel (no pre-filter, the code as it was), and the closed forms of
tests/test_dropout_invariance.py. The count of a softmax's masked entries runs under a C++
dispatch guard: a mode below the counter sees only the user's ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from dispatch_flops import FlopCounter
from dispatch_flops.engine.masks import dropout, math_path
from dispatch_flops.formulas import ELEMENT_COSTS as C


class _Every(set):
    """A numel set that holds every numel: the pre-filter passes everything."""

    def __contains__(self, n) -> bool:
        return True


@pytest.fixture
def unfiltered(monkeypatch):
    def off():
        monkeypatch.setattr(math_path, "PAIRED_NUMELS", _Every())  # dropout reads it there
        monkeypatch.setattr(dropout, "_NOISE_NUMELS", _Every())
    return off


def _figures(fc: FlopCounter) -> tuple:
    t = fc.total
    return (t.flops, t.macs, t.masked_flops, t.masked_macs, fc.model_flops(),
            fc.hardware_flops())


def _attention_step(dtype) -> tuple:
    """SDPA's math decomposition in training, with an additive padding mask and dropout (the
    probabilities cast to the inputs' half dtype, multiplied by its noise, saved for the
    backward), and a residual dropout whose noise has the probabilities' numel."""
    torch.manual_seed(0)
    # [b, h, s, d] = [2, 2, 8, 8]: the probabilities, q, k, v and the residual share a numel
    q, k, v = (torch.randn(2, 2, 8, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.zeros(2, 1, 8, 8, dtype=dtype)
    mask[1, :, :, 5:] = torch.finfo(dtype).min  # the second sequence padded
    with FlopCounter() as fc, sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.2)
        out = F.dropout(out * 2.0, 0.3) * torch.randn(2, 2, 8, 8, dtype=dtype)
        out.float().sum().backward()
    return _figures(fc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_counts_equal_without_the_prefilter(dtype, unfiltered):
    """Masked pairs and dropout counted with the pre-filter equal those counted without it,
    in float32 and with the probabilities consumed after a cast (bfloat16)."""
    fast = _attention_step(dtype)
    unfiltered()
    assert _attention_step(dtype) == fast
    assert fast[2] > 0  # masked pairs and dropout found: the check can fail


def test_noise_of_a_shared_numel_is_found():
    """Dropout's noise shares its numel with the activations around it (64: the GELU's output
    and the noise): every product with the noise is charged, none of the others."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.3), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    with FlopCounter(model) as fc:
        (model(x) * torch.ones(4, 8)).sum().backward()
    n = 4 * 16
    assert fc.total.masked_flops == n * (C["random_draw"] + C["bernoulli"] + C["div"] +
                                         2 * C["mul"])


def test_purge_keeps_the_numels_of_live_entries(monkeypatch):
    """Past the purge threshold, freed entries go and the numel sets are rebuilt from the
    entries kept: every live tensor is still found (the set never loses a live numel)."""
    paired: dict = {}  # one dict where it lives and where dropout's mul looks it up
    for module in (math_path, dropout):
        monkeypatch.setattr(module, "PAIRED_PURGE", 4)
        monkeypatch.setattr(module, "PAIRED", paired)
    monkeypatch.setattr(math_path, "PAIRED_NUMELS", set())
    monkeypatch.setattr(dropout, "_NOISE", {})
    monkeypatch.setattr(dropout, "_NOISE_NUMELS", set())
    kept = []
    for n in range(1, 13):
        t = torch.zeros(n)
        math_path.note_paired(t, n, forward=False)
        dropout._noise_drawn(0)([0, 0, None], (t, 0.5), None, t)  # a draw that costs nothing
        if n % 3 == 0:
            kept.append(t)  # the others are freed: purged when the dicts pass 4 entries
    for t in kept:
        assert math_path.paired_count(t) == t.numel()
        assert dropout._is_noise(t)
    assert len(math_path.PAIRED) < 12 and math_path.PAIRED_NUMELS >= {t.numel() for t in kept}
    assert math_path.paired_count(torch.zeros(3)) is None  # a numel kept, another storage
    assert not dropout._is_noise(torch.zeros(3))


class _Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class _RunsOnly(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _logged_below(counted: bool) -> list:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 4, requires_grad=True) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4)
    mask[..., 3:] = float("-inf")
    with _Log() as below:
        # against a mode that only runs each op: on torch 2.8 any mode above another makes
        # autograd's detaches reach the one below
        with FlopCounter() if counted else _RunsOnly(), sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    return below.ops


def test_a_mode_below_sees_no_op_of_the_count():
    """The masked entries are counted with torch's dispatch off (a C++ guard, not the modes
    popped): a mode under the counter sees what it sees under a mode that only runs each op,
    nothing of the count."""
    assert _logged_below(counted=True) == _logged_below(counted=False)
