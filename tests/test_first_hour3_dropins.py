"""Issue 58's drop-in points: fused fast paths priced as the peers see them (1), calflops'
detailed printout (5), ptflops' headline on a CNN (6)."""

from __future__ import annotations

import contextlib
import io
import re

import torch
from torch import nn

from dispatch_flops.compat import calflops, fvcore, ptflops, thop
from helpers import real_package


def _encoder() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


X = torch.randn(2, 16, 64)


@contextlib.contextmanager
def _fastpath(enabled: bool):
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def _quiet(call):
    with contextlib.redirect_stdout(io.StringIO()):
        return call()


def _figures(tools):
    model = _encoder()
    analysis = tools["fvcore"].FlopCountAnalysis(model, (X,)).unsupported_ops_warnings(False)
    ost = io.StringIO()
    ptf = _quiet(lambda: tools["ptflops"].get_model_complexity_info(
        model, (16, 64), as_strings=False, ost=ost))
    return {"fvcore": analysis.total(), "fvcore_modules": dict(analysis.by_module()),
            "uncalled": analysis.uncalled_modules(),
            "thop": _quiet(lambda: tools["thop"].profile(model, inputs=(X,), verbose=False,
                                                         ret_layer_info=True)),
            "ptflops": ptf, "ptflops_text": ost.getvalue()}


OURS = {"fvcore": fvcore, "thop": thop, "ptflops": ptflops}


def test_encoder_fast_path_priced_as_the_slow_path_by_every_dropin():
    """On nn.TransformerEncoder in eval mode each drop-in gives its own slow-path figures
    (the path the peers run): the same totals, modules and per-layer lines."""
    with _fastpath(False):
        slow = _figures(OURS)
        slow_calflops = calflops.calculate_flops(_encoder(), args=[X], print_results=False,
                                                 output_as_string=False)
    fast = _figures(OURS)
    assert fast == slow
    assert calflops.calculate_flops(_encoder(), args=[X], print_results=False,
                                    output_as_string=False) == slow_calflops
    assert torch.backends.mha.get_fastpath_enabled()  # the switch given back
    # the work is on the submodules the fused op stood for
    assert fast["fvcore_modules"]["layers.0.linear1"] == 2 * 16 * 64 * 128
    assert fast["fvcore_modules"]["layers.0.norm1"] > 0
    assert fast["fvcore_modules"]["layers.0.self_attn"] > 0
    assert "layers.0.linear1" not in fast["uncalled"]
    assert "(linear1): Linear(8.32 k, 12.428% Params, 133.12 KMac" in fast["ptflops_text"]
    assert fast["ptflops"] == (1136640, 66944)


def test_multihead_attention_fast_path_priced_as_its_parts():
    """nn.MultiheadAttention's fused _native_multi_head_attention: the same figure as its
    slow path in every drop-in."""
    torch.manual_seed(0)
    model = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    q = torch.randn(2, 8, 32)

    class Self(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = model

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    wrapper = Self().eval()

    def figures():
        return (thop.profile(wrapper, inputs=(q,), verbose=False)[0],
                fvcore.FlopCountAnalysis(wrapper, (q,)).total(),
                ptflops.get_model_complexity_info(wrapper, (8, 32), as_strings=False,
                                                  print_per_layer_stat=False))

    with _fastpath(False):
        slow = figures()
    assert figures() == slow
    assert slow[0] >= 2 * 8 * 4 * 32 * 32  # projections and products, not 0


def test_encoder_fast_path_matches_the_real_ptflops_and_fvcore():
    """Against the installed originals (not in CI): ptflops' MACs and per-Linear lines equal;
    fvcore's linear and layer-norm counts and never-called modules equal."""
    real_ptflops = real_package("ptflops", "get_model_complexity_info")
    real_fvcore = real_package("fvcore.nn", "FlopCountAnalysis")
    model = _encoder()
    ost = io.StringIO()
    theirs = _quiet(lambda: real_ptflops.get_model_complexity_info(
        model, (16, 64), as_strings=False, ost=ost))
    ours = _figures(OURS)
    assert ours["ptflops"] == theirs
    assert "(linear1): Linear(8.32 k, 12.428% Params, 133.12 KMac" in ost.getvalue()
    analysis = real_fvcore.FlopCountAnalysis(model, (X,)).unsupported_ops_warnings(False)
    mine = fvcore.FlopCountAnalysis(model, (X,)).unsupported_ops_warnings(False)
    assert mine.by_operator()["linear"] == analysis.by_operator()["linear"] == 2097152
    assert mine.by_operator()["layer_norm"] == analysis.by_operator()["layer_norm"]
    assert mine.uncalled_modules() == analysis.uncalled_modules()


# -- 5: calflops' detailed printout -----------------------------------------------------------
def test_calflops_prints_the_detailed_tree_and_fwd_bwd_lines(capsys):
    """print_detailed=True (the default) prints calflops' module tree with each module's
    params, MACs and FLOPs, and the fwd+bwd lines (calflops' estimate, factor x forward)."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4)))
    calflops.calculate_flops(model, input_shape=(2, 8))
    out = capsys.readouterr().out
    assert "Detailed Calculated FLOPs Results" in out
    assert "fwd+bwd MACs:" in out and "1.15 KMACs" in out  # 384 x (1 + 2)
    assert ("(0): Linear(144 = 67.92% Params, 256 MACs = 66.67% MACs, 512 FLOPS = 66.67% "
            "FLOPs, in_features=8, out_features=16, bias=True)") in out
    assert "  212 = 100% Params, 384 MACs = 100% MACs, 768 FLOPS = 100% FLOPs" in out
    calflops.calculate_flops(model, input_shape=(2, 8), print_detailed=False)
    assert "Detailed" not in capsys.readouterr().out


# -- 6: ptflops' headline on a CNN ------------------------------------------------------------
def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()


def test_ptflops_headline_is_the_tree_root_and_the_original_double_counts():
    """The drop-in's headline is its tree's root; ptflops 0.7's headline adds the
    activations and pools a second time (their modules call the functionals it patches)."""
    ost = io.StringIO()
    macs, _ = ptflops.get_model_complexity_info(_cnn(), (3, 32, 32), as_strings=False, ost=ost)
    root = re.search(r"\d+ k, 100.000% Params, ([\d.]+) MMac", ost.getvalue())
    assert root and float(root.group(1)) == round(macs / 1e6, 2)
    real = real_package("ptflops", "get_model_complexity_info")
    theirs_ost = io.StringIO()
    theirs, _ = _quiet(lambda: real.get_model_complexity_info(
        _cnn(), (3, 32, 32), as_strings=False, ost=theirs_ost))
    their_root = re.search(r"100.000% Params, ([\d.]+) MMac", theirs_ost.getvalue())
    assert their_root and float(their_root.group(1)) == round(macs / 1e6, 2)
    # the double count: ReLU outputs and the pools' inputs, once more
    twice = 16 * 32 * 32 + 16 * 32 * 32 + 32 * 16 * 16 + 32 * 16 * 16
    assert theirs == macs + twice
