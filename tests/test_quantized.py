"""Quantised layers (``torch.ao.quantization``) priced with their MACs, under dtype "int8":
dynamic linear, static linear and convolutions (plain, grouped, strided, transposed), the fp16
dynamic linear, and the (de)quantisation ops between them. The oracle for each layer is the
float model it was converted from, counted by the counter (``addmm`` / ``convolution``):
the same GEMMs, in another dtype."""

import warnings

import pytest
import torch
import torch.ao.quantization as tq
from torch import nn

from dispatch_flops import FlopCounter

pytestmark = pytest.mark.filterwarnings("ignore")


def _macs_by_dtype(fc) -> dict:
    out: dict = {}
    for r in fc.records():
        if r.stats.macs:
            out[r.dtype] = out.get(r.dtype, 0) + r.stats.macs
    return out


def _float_macs(model, x) -> int:
    with torch.no_grad(), FlopCounter() as fc:
        model(x)
    return fc.total.macs


def test_a_dynamically_quantised_linear_costs_its_macs_in_int8():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    x = torch.randn(10, 64)
    quantised = tq.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    with FlopCounter() as fc:
        quantised(x)
    assert fc.unsupported_ops() == {}
    assert _macs_by_dtype(fc) == {"int8": 10 * 64 * 128 + 10 * 128 * 32} \
        == {"int8": _float_macs(model, x)} == {"int8": 122_880}
    first = fc.by_operator()["quantized.linear_dynamic"]
    # GEMM, bias add; the relu is its own op
    assert first.flops == 2 * 122_880 + 10 * 128 + 10 * 32
    # the packed int8 weights and float32 biases are read, besides the activations
    reads = 10 * 64 * 4 + 64 * 128 + 128 * 4 + 10 * 128 * 4 + 128 * 32 + 32 * 4
    assert first.bytes_read == reads


def test_an_fp16_dynamic_linear_is_filed_under_float16():
    model = nn.Sequential(nn.Linear(16, 24))
    quantised = tq.quantize_dynamic(model, {nn.Linear}, dtype=torch.float16)
    with FlopCounter() as fc:
        quantised(torch.randn(5, 16))
    assert _macs_by_dtype(fc) == {"float16": 5 * 16 * 24}
    assert fc.unsupported_ops() == {}


class Static(nn.Module):
    def __init__(self, conv: nn.Module, features: int):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv, self.relu = conv, nn.ReLU()
        self.linear = nn.Linear(features, 10)

    def forward(self, x):
        x = self.relu(self.conv(self.quant(x)))
        return self.dequant(self.linear(x.flatten(1)))


CONVS = {  # (conv, input, features after it)
    "conv2d": (lambda: nn.Conv2d(4, 8, 3), (2, 4, 8, 8), 8 * 6 * 6),
    "grouped_strided": (lambda: nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2),
                        (2, 4, 9, 9), 8 * 5 * 5),
    "conv1d": (lambda: nn.Conv1d(4, 6, 5, dilation=2), (3, 4, 20), 6 * 12),
    "conv3d": (lambda: nn.Conv3d(2, 4, 3), (1, 2, 5, 5, 5), 4 * 3 * 3 * 3),
    "transposed": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2), (2, 4, 5, 5), 6 * 11 * 11),
}


@pytest.mark.parametrize("name", sorted(CONVS))
@pytest.mark.parametrize("engine", ["fbgemm", "qnnpack"])
def test_static_quantised_convolutions_and_linears_cost_the_float_models_macs(name, engine):
    if engine not in torch.backends.quantized.supported_engines:
        pytest.skip(f"no {engine} in this torch")
    make, shape, features = CONVS[name]
    torch.manual_seed(0)
    model = Static(make(), features).eval()
    x = torch.randn(*shape)
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        # per-channel weights (the engines' default) are not supported for a transposed conv
        model.qconfig = tq.default_qconfig if name == "transposed" \
            else tq.get_default_qconfig(engine)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = tq.prepare(model)
            prepared(x)
            quantised = tq.convert(prepared)
        try:
            quantised(x)
        except RuntimeError as e:  # an engine without this layer (transposed on some)
            pytest.skip(f"{engine} cannot run {name}: {e}")
        with FlopCounter() as fc:
            quantised(x)
    finally:
        torch.backends.quantized.engine = previous
    if engine == "qnnpack" and name == "conv3d":
        # QNNPACK cannot unpack a conv3d's weights ("only supports conv2d_unpack"): the
        # kernel's size is unknown, so the call is listed, not guessed
        assert fc.unsupported_ops() == {"quantized.conv3d": 1}
        return
    assert fc.unsupported_ops() == {}
    float_model = Static(make(), features).eval()
    assert _macs_by_dtype(fc) == {"int8": _float_macs(float_model, x)}


def test_quantise_and_dequantise_are_an_affine_map_an_element():
    x = torch.randn(3, 5)
    with FlopCounter() as fc:
        q = torch.quantize_per_tensor(x, 0.1, 3, torch.quint8)
        q.dequantize()
        torch.quantize_per_tensor_dynamic(x, torch.quint8, False)
        q.int_repr(), q.q_scale()
    ops = fc.by_operator()
    assert ops["aten.quantize_per_tensor"].flops == 2 * 15
    assert ops["aten.dequantize"].flops == 2 * 15
    assert ops["aten.quantize_per_tensor_dynamic"].flops == 4 * 15
    assert fc.unsupported_ops() == {}
