"""The fvcore, thop, ptflops and calflops drop-ins (dispatch_flops.compat.*): their units,
return types, rounding and strings, error behaviour, and the work the originals miss. Oracles:
closed forms on small shapes, and a plain FlopCounter on the same call (the engine's MACs)."""

import io
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_globals

from dispatch_flops import FlopCounter
from dispatch_flops.compat import calflops, fvcore, ptflops, thop


class Net(nn.Module):
    """A conv with bias, a batch norm, ReLU, adaptive pooling, a linear layer: the ops each
    peer prices by a convention of its own."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.pool(self.act(self.bn(self.conv(x)))).flatten(1))


class Attention(nn.Module):
    """Attention as a functional in forward: module-hook counters see no module for it."""

    def forward(self, q):
        return F.scaled_dot_product_attention(q, q, q)


X = torch.randn(2, 3, 8, 8)
CONV_MACS = 2 * 4 * 6 * 6 * 3 * 9  # b c_out h w c_in k
CONV_OUT = 2 * 4 * 6 * 6
FC_MACS = 2 * 4 * 2


def engine_macs(model, *args):
    with torch.no_grad(), FlopCounter(model) as fc:
        model(*args)
    return fc.total.macs


def global_hooks():
    return (len(module_globals._global_forward_pre_hooks),
            len(module_globals._global_forward_hooks))


# -- fvcore ---------------------------------------------------------------------------------
def test_fvcore_counts_macs_and_its_norm_and_pool_conventions():
    """fvcore's "flops" are MACs; batch norm in eval with an affine is 2 an element, adaptive
    pooling 1 an input element; ReLU ignored, nothing unsupported; ints, fvcore's names."""
    model = Net().eval()
    flops = fvcore.FlopCountAnalysis(model, (X,))
    expected = {"conv": CONV_MACS, "batch_norm": 2 * CONV_OUT, "adaptive_avg_pool2d": CONV_OUT,
                "linear": FC_MACS}
    assert dict(flops.by_operator()) == expected
    assert flops.total() == sum(expected.values()) and isinstance(flops.total(), int)
    assert flops.by_module()["conv"] == CONV_MACS == engine_macs(model.conv, X)
    assert flops.by_module()["act"] == 0 and flops.unsupported_ops() == {}
    assert model.training is False


def test_fvcore_training_batch_norm_and_the_ignore_switch():
    """In training a batch norm is 5 an element with an affine (4 without); set_op_handle(kind,
    None) leaves an op out, as fvcore's users drop batch norms."""
    model = Net().train()
    flops = fvcore.FlopCountAnalysis(model, (X,))
    assert flops.by_operator()["batch_norm"] == 5 * CONV_OUT
    assert model.training is True and model.bn.training is True
    flops.set_op_handle("aten::batch_norm", None)
    assert "batch_norm" not in flops.by_operator()
    # the running-stats step (num_batches_tracked += 1): fvcore's trace reports it too
    assert flops.unsupported_ops() == {"aten::add_": 1}


def test_fvcore_counts_attention_it_has_no_handle_for():
    """fvcore reports SDPA unsupported (0); the drop-in counts its two products:
    2 b h s^2 d MACs, under the op's name."""
    b, h, s, d = 1, 2, 5, 4
    q = torch.randn(b, h, s, d)
    flops = fvcore.FlopCountAnalysis(Attention(), (q,))
    assert flops.by_operator() == {"scaled_dot_product_attention": 2 * b * h * s * s * d}


def test_fvcore_unsupported_ops_and_warnings(caplog):
    """An op with arithmetic and no handle is unsupported (counted by calls, logged as fvcore
    logs it); the switches silence the log; a bad mode names the choices."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    flops = fvcore.FlopCountAnalysis(model, (torch.randn(3, 4),))
    with pytest.raises(RuntimeError, match="computed before"):
        flops.unsupported_ops()
    with caplog.at_level(logging.WARNING):
        flops.total()
    assert flops.unsupported_ops() == {"aten::sigmoid": 1}
    assert "Unsupported operator aten::sigmoid encountered 1 time(s)" in caplog.text
    caplog.clear()
    quiet = fvcore.FlopCountAnalysis(model, (torch.randn(3, 4),)).unsupported_ops_warnings(False)
    with caplog.at_level(logging.WARNING):
        quiet.total()
    assert "Unsupported" not in caplog.text
    with pytest.raises(ValueError, match="ancestor mode"):
        flops.ancestor_mode("parent")
    with pytest.raises(KeyError, match="not among"):
        flops.total("missing")


def test_fvcore_names_ops_as_its_handles_do_and_reports_unknown_ops():
    """A handle returning a number names the op by its kind (fvcore's matmul handle set for
    aten::mm reports "mm"); a custom op nobody prices is unsupported, by calls."""

    @torch.library.custom_op("dispatch_flops_test::fvcore_unknown", mutates_args=())
    def unknown(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @unknown.register_fake
    def _(x):
        return torch.empty_like(x)

    class Model(nn.Module):
        def forward(self, a, b):
            return unknown(torch.mm(a, b))

    a, b = torch.randn(3, 4), torch.randn(4, 5)
    flops = fvcore.JitModelAnalysis(Model(), (a, b)).set_op_handle(
        "aten::mm", fvcore.matmul_flop_jit).unsupported_ops_warnings(False)
    assert flops.by_operator() == {"mm": 3 * 4 * 5}
    assert flops.unsupported_ops() == {"dispatch_flops_test::fvcore_unknown": 1}


def test_fvcore_custom_handle_gets_jit_like_values():
    """A handle written against fvcore's jit values (get_shape, toIValue) reads the call's
    shapes and arguments in the jit node's order."""
    seen = []

    def handle(inputs, outputs):
        seen.append((fvcore.get_shape(inputs[0]), inputs[1].toIValue(),
                     fvcore.get_shape(outputs[0])))
        return 7

    x = torch.randn(2, 3, 4, 4)
    flops = fvcore.FlopCountAnalysis(nn.Softmax(dim=1), (x,)).set_op_handle(
        "aten::softmax", handle)
    assert flops.by_operator() == {"softmax": 7}
    assert seen == [([2, 3, 4, 4], 1, [2, 3, 4, 4])]


def test_fvcore_tables_and_parameter_count():
    """flop_count_table / flop_count_str: fvcore's layout with this run's figures."""
    model = Net().eval()
    flops = fvcore.FlopCountAnalysis(model, (X,))
    table = fvcore.flop_count_table(flops)
    header = [cell.strip() for cell in table.splitlines()[0].split("|")[1:-1]]
    assert header == ["module", "#parameters or shape", "#flops"]
    assert " conv.weight " in table and "(4, 3, 3, 3)" in table
    assert fvcore.parameter_count(model)[""] == sum(p.numel() for p in model.parameters())
    text = fvcore.flop_count_str(flops)
    assert text.startswith("Net(") and "#flops: 7.78K" in text  # conv: 7776 MACs
    rows = [[c.strip() for c in line.split("|")[1:-1]]
            for line in fvcore.parameter_count_table(model).splitlines()[2:]]
    assert rows[:3] == [["model", "0.1K"], ["conv", "0.1K"], ["conv.weight", "(4, 3, 3, 3)"]]
    assert rows[4] == ["bn", "8"]  # fvcore's style: K from 100 up, one decimal


# -- thop -----------------------------------------------------------------------------------
def test_thop_returns_float_macs_and_params_with_its_conventions():
    """thop's profile: (MACs, params) floats; conv and linear are MACs (no bias), a batch
    norm with an affine 4 an element, ReLU 0, adaptive pooling an add per input and a
    divide per output; params are every parameter."""
    model = Net()
    macs, params = thop.profile(model, inputs=(X,), verbose=False)
    assert type(macs) is float and type(params) is float
    expected = CONV_MACS + 4 * CONV_OUT + (CONV_OUT + 2 * 4) + FC_MACS
    assert macs == expected
    assert params == sum(p.numel() for p in model.parameters())
    assert model.training is True and not hasattr(model.conv, "total_ops")


def test_thop_counts_functional_attention_and_custom_rules_replace():
    """A functional SDPA is 0 in thop (no module rule); the drop-in counts it. A custom rule
    replaces the count inside its module."""
    q = torch.randn(1, 2, 5, 4)
    macs, _ = thop.profile(Attention(), inputs=(q,), verbose=False)
    assert macs == engine_macs(Attention(), q) == 2 * 2 * 25 * 4

    def rule(module, inputs, output):
        module.total_ops += 11

    model = Net()
    macs, _, layers = thop.profile(model, inputs=(X,), custom_ops={nn.Conv2d: rule},
                                   verbose=False, ret_layer_info=True)
    assert layers["conv"] == (11.0, float(4 * 3 * 9 + 4), {})
    assert macs == 11 + 4 * CONV_OUT + (CONV_OUT + 8) + FC_MACS


def test_thop_transposed_convolutions_count_input_positions():
    """A transposed convolution applies its kernel once per input position (ultralytics-thop
    2.x's fix; 0.1.1 counted output positions): n c_in h w (c_out / g) k_h k_w."""
    net = nn.ConvTranspose2d(8, 4, 3, stride=2, groups=2, bias=False)
    macs, _ = thop.profile(net, inputs=(torch.randn(1, 8, 4, 4),), verbose=False)
    assert macs == 1 * 8 * 4 * 4 * (4 // 2) * 3 * 3


def test_thop_pool_and_upsample_conventions():
    """thop 2.x: average pooling an add per pooled input and a divide per output (padding
    outside the input counted when count_include_pad), upsampling by mode an output."""
    x = torch.randn(1, 2, 4, 4)
    assert thop.profile(nn.AvgPool2d(2), inputs=(x,), verbose=False)[0] == 2 * 16 + 2 * 4
    padded = nn.AvgPool2d(3, stride=1, padding=1)  # 4 outputs a dim, windows 3 wide
    assert thop.profile(padded, inputs=(x,), verbose=False)[0] == 2 * 12 * 12 + 2 * 16
    padded.count_include_pad = False  # the windows' inputs only: 2 + 3 + 3 + 2 a dim
    assert thop.profile(padded, inputs=(x,), verbose=False)[0] == 2 * 10 * 10 + 2 * 16
    bilinear = nn.Upsample(scale_factor=2, mode="bilinear")
    assert thop.profile(bilinear, inputs=(x,), verbose=False)[0] == 11 * 2 * 8 * 8
    assert thop.profile(nn.Upsample(scale_factor=2), inputs=(x,), verbose=False)[0] == 0


def test_thop_clever_format():
    """thop's strings: format of T/G/M/K at 1000**k and above (2.x's rule), else "B"; a tuple
    for several numbers."""
    assert thop.clever_format(1) == "1.00B"
    assert thop.clever_format([1e9, 1234567.0], "%.3f") == ("1.000G", "1.235M")
    assert thop.clever_format(-2500) == "-2.50K"
    with pytest.raises(TypeError, match="tuple"):
        thop.profile(Net(), inputs=X)


# -- ptflops --------------------------------------------------------------------------------
def test_ptflops_strings_ints_and_conventions():
    """ptflops' pytorch backend: bias adds, ReLU an element, batch norm 2 an element with an
    affine, pooling an input element; per sample; strings with GMac/MMac/KMac."""
    model = Net()
    macs, params = ptflops.get_model_complexity_info(model, (3, 8, 8), as_strings=False,
                                                     print_per_layer_stat=False)
    one = CONV_OUT // 2
    expected = (CONV_MACS // 2 + one) + 2 * one + one + one + (FC_MACS // 2 + 2)
    assert (macs, params) == (expected, sum(p.numel() for p in model.parameters()))
    assert isinstance(macs, int)
    text = ptflops.get_model_complexity_info(model, (3, 8, 8), print_per_layer_stat=False)
    assert text == (f"{round(expected / 1e3, 2)} KMac", "130")
    assert ptflops.flops_to_string(4_123_456_789) == "4.12 GMac"
    assert ptflops.params_to_string(25_557_032) == "25.56 M"


def test_ptflops_ignored_modules_and_custom_hooks():
    """ignore_modules drops those modules' own ops (ReLU: an element each); a custom hook's
    ``__flops__`` replaces what is counted inside its module."""
    model = Net()
    full, _ = ptflops.get_model_complexity_info(model, (3, 8, 8), as_strings=False,
                                                print_per_layer_stat=False)
    ignored, _ = ptflops.get_model_complexity_info(model, (3, 8, 8), as_strings=False,
                                                   print_per_layer_stat=False,
                                                   ignore_modules=[nn.ReLU])
    assert full - ignored == CONV_OUT // 2

    def hook(module, inputs, output):
        module.__flops__ += 1000

    hooked, _ = ptflops.get_model_complexity_info(model, (3, 8, 8), as_strings=False,
                                                  print_per_layer_stat=False,
                                                  custom_modules_hooks={nn.Conv2d: hook})
    assert hooked == full - (CONV_MACS // 2 + CONV_OUT // 2) + 1000
    assert not hasattr(model.conv, "__flops__")


def test_ptflops_per_sample_and_error_contract(capsys):
    """A batch of 4 from input_constructor is divided by 4; a model that raises returns
    (None, None) and prints ptflops' message; a bad backend names the choices."""
    model = nn.Linear(3, 2)
    macs, _ = ptflops.get_model_complexity_info(
        model, (3,), as_strings=False, print_per_layer_stat=False,
        input_constructor=lambda res: torch.ones(4, *res))
    assert macs == 3 * 2 + 2

    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    assert ptflops.get_model_complexity_info(Broken(), (3,), print_per_layer_stat=False) == (
        None, None)
    assert "Flops estimation was not finished successfully" in capsys.readouterr().out
    with pytest.raises(ValueError, match="backend must be one of"):
        ptflops.get_model_complexity_info(model, (3,), backend="jit")
    with pytest.raises(ValueError, match="input_res"):
        ptflops.get_model_complexity_info(model, [3])


def test_ptflops_per_layer_printout():
    """print_per_layer_stat prints str(model) with each module's params, MACs and shares."""
    stream = io.StringIO()
    ptflops.get_model_complexity_info(Net(), (3, 8, 8), ost=stream)
    text = stream.getvalue()
    assert text.startswith("Net(") and "(conv): Conv2d(112, 86.154% Params" in text
    assert "% MACs" in text


# -- calflops -------------------------------------------------------------------------------
def test_calflops_flops_are_twice_the_macs_and_strings():
    model = Net()
    flops, macs, params = calflops.calculate_flops(model, input_shape=(2, 3, 8, 8),
                                                   print_results=False,
                                                   output_as_string=False)
    assert macs == CONV_MACS + FC_MACS and flops == 2 * macs
    assert params == sum(p.numel() for p in model.parameters())
    strings = calflops.calculate_flops(model, input_shape=(2, 3, 8, 8), print_results=False)
    assert strings == (f"{round(2 * macs / 1e3, 2):g} KFLOPS", f"{round(macs / 1e3, 2):g} KMACs",
                       "130")
    assert calflops.params_to_string(6.74e9) == "6.74 B"
    assert model.training is True


def test_calflops_builds_transformers_inputs_from_a_tokenizer():
    """transformer_tokenizer with input_shape (batch, length): the empty text's encoding
    padded to the length with the pad token, attention mask 0 there, as calflops builds it."""

    class Tokenizer:
        pad_token_id = 0

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [101, 102], "attention_mask": [1, 1]}

    seen = {}

    class Embedder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(200, 8)
            self.proj = nn.Linear(8, 8)

        def forward(self, input_ids, attention_mask):
            seen.update(input_ids=input_ids, attention_mask=attention_mask)
            return self.proj(self.embed(input_ids))

    _, macs, _ = calflops.calculate_flops(Embedder(), input_shape=(2, 6),
                                          transformer_tokenizer=Tokenizer(),
                                          print_results=False, output_as_string=False)
    assert seen["input_ids"].tolist() == [[101, 102, 0, 0, 0, 0]] * 2
    assert seen["attention_mask"].tolist() == [[1, 1, 0, 0, 0, 0]] * 2
    assert macs == 2 * 6 * 8 * 8


def test_calflops_backward_is_measured():
    """include_backPropagation runs backward: the figure is the engine's forward + backward
    MACs, not (1 + compute_bp_factor) x forward."""
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))
    x = torch.randn(3, 10)
    _, macs, _ = calflops.calculate_flops(model, args=[x], include_backPropagation=True,
                                          print_results=False, output_as_string=False)
    forward = 3 * 10 * 20 + 3 * 20 * 5
    backward = 3 * 5 * 20 + 20 * 3 * 5 + 10 * 3 * 20  # input grad of fc2, both weight grads
    assert macs == forward + backward
    assert all(p.grad is None for p in model.parameters())  # the user's grads left as they were
    with pytest.raises(ValueError, match="forward_mode must be one of"):
        calflops.calculate_flops(model, args=[x], forward_mode="backward")
    with pytest.raises(ValueError, match="input_shape or args"):
        calflops.calculate_flops(model, input_shape=(3, 10), args=[x])


def test_every_shim_leaves_no_hook_behind():
    before = global_hooks()
    model = Net()
    thop.profile(model, inputs=(X,), verbose=False, custom_ops={nn.ReLU: lambda m, i, o: None})
    ptflops.get_model_complexity_info(model, (3, 8, 8), print_per_layer_stat=False)
    fvcore.FlopCountAnalysis(model, (X,)).total()
    calflops.calculate_flops(model, args=[X], print_results=False)
    assert global_hooks() == before
    assert all(not m._forward_hooks for m in model.modules())
    assert torch._C._len_torch_dispatch_stack() == 0
