"""MFU people can trust: each op's flops over the dense peak of its own dtype, the
denominator said next to the figure, and no MFU (with the reason) on an unknown device."""

import json

import pytest
import torch

from dispatch_flops import DeviceSpec, FlopCounter, Profile
from dispatch_flops.results.roofline import DEVICES

G = 1e9
# a device whose dtypes have different peaks, so a wrong choice shows in the figure
TOY = DeviceSpec("toy", {"float32": 1 * G, "tf32": 8 * G, "bfloat16": 4 * G}, 1 * G)


class Mixed(torch.nn.Module):
    """An fp32 Linear(8, 16) feeding a bf16 Linear(16, 4)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4).to(torch.bfloat16)

    def forward(self, x):
        return self.b(self.a(x).to(torch.bfloat16))


def _mixed_run():
    torch.manual_seed(0)
    model, x = Mixed(), torch.randn(2, 8)
    with FlopCounter(model, timing=True) as fc:
        model(x).float().sum().backward()
    return fc.to_profile()


# closed form, batch 2: fp32 a: forward addmm 2*2*8*16 = 512, backward its weight's mm 512
# (x needs no grad); bf16 b: forward 2*2*16*4 = 256, backward grad-input 256 + weight 256
FP32_FLOPS, BF16_FLOPS = 2 * 512, 3 * 256


def test_each_op_is_divided_by_the_peak_of_its_own_dtype():
    p = _mixed_run()
    assert p.flops_by_dtype() == {"float32": FP32_FLOPS, "bfloat16": BF16_FLOPS}
    assert sum(p.flops_by_dtype().values()) == 2 * p.total.macs
    at_peak = FP32_FLOPS / (1 * G) + BF16_FLOPS / (4 * G)
    assert p.mfu(TOY) == pytest.approx(at_peak / p.wall_s)
    # the old single peak (the model's first parameter's dtype, fp32) is not what is used
    assert p.mfu(TOY) != pytest.approx((FP32_FLOPS + BF16_FLOPS) / (1 * G) / p.wall_s)
    # dtype= still divides every flop by one peak, as asked
    assert p.mfu(TOY, "bfloat16") == pytest.approx((FP32_FLOPS + BF16_FLOPS) / (4 * G)
                                                   / p.wall_s)
    # records carry the compute dtype of ops that do arithmetic, and only of those
    dtypes = {(r.operator, r.dtype) for r in p.records() if r.stats.flops}
    assert ("aten.addmm", "float32") in dtypes and ("aten.addmm", "bfloat16") in dtypes
    assert all(r.dtype is None for r in p.records() if not r.stats.flops)


def test_mfu_text_names_the_denominator():
    p = _mixed_run()
    text = p.mfu_text(TOY)
    assert text == f"MFU {100 * p.mfu(TOY):.1f} % of per-op dtype peaks (fp32 1, bf16 4 " \
                   "GFLOPS dense), toy"
    one = p.mfu_text(TOY, "bfloat16")
    assert one == f"MFU {100 * p.mfu(TOY, 'bfloat16'):.1f} % of 4 GFLOPS bf16 dense, toy"
    assert p.hfu_text(TOY).startswith("HFU ")
    h100 = DEVICES["H100-SXM"]
    assert p.mfu_text(h100, "bfloat16").endswith(  # a CPU run: it says so (issue 58)
        "% of 989.4 TFLOPS bf16 dense, H100-SXM datasheet (the run was on the CPU, not a "
        "H100-SXM)")
    with pytest.raises(ValueError, match="contraction"):
        p.mfu_text(TOY, flops="model")


def test_unknown_device_gives_no_mfu_and_says_why():
    if torch.cuda.is_available():
        pytest.skip("the current GPU may have a built-in spec")
    p = _mixed_run()
    with pytest.raises(ValueError, match=r"unknown device 'cpu'.*DeviceSpec\.cpu"):
        p.mfu()
    text = p.mfu_text()
    assert text.startswith("no MFU: unknown device 'cpu'") and "device=DeviceSpec(" in text
    with FlopCounter() as untimed:
        torch.randn(4, 4) @ torch.randn(4, 4)
    assert untimed.mfu_text(TOY).startswith("no MFU: mfu needs measured time")
    # a dtype the device has no peak for is named, not guessed
    fp32_only = DeviceSpec("fp32-only", {"float32": G}, G)
    assert "has no peak for bfloat16" in p.mfu_text(fp32_only)


def test_fp32_matmuls_use_the_tf32_peak_only_when_allowed():
    x = torch.randn(16, 16)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        runs = {}
        for allowed in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allowed
            with FlopCounter(timing=True) as fc:
                x @ x + x
            torch.backends.cuda.matmul.allow_tf32 = before
            runs[allowed] = fc.to_profile()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    flops = 2 * 16**3
    assert runs[False].run.allow_tf32 is False and runs[True].run.allow_tf32 is True
    assert runs[False].mfu(TOY) == pytest.approx(flops / G / runs[False].wall_s)
    assert runs[True].mfu(TOY) == pytest.approx(flops / (8 * G) / runs[True].wall_s)
    assert "tf32 dense" in runs[True].mfu_text(TOY)
    assert "fp32 dense" in runs[False].mfu_text(TOY)
    # flops="all": the element-wise add is no matmul, it stays at the fp32 peak
    assert runs[True].mfu(TOY, flops="all") == pytest.approx(
        (flops / (8 * G) + 16**2 / G) / runs[True].wall_s)
    # a device without a tf32 figure (a CPU) uses its fp32 peak
    cpu = DeviceSpec.cpu(2 * G, G)
    assert runs[True].mfu(cpu) == pytest.approx(flops / (2 * G) / runs[True].wall_s)


def test_json_keeps_dtypes_and_reads_files_written_without_them(tmp_path):
    p = _mixed_run()
    path = tmp_path / "run.json"
    p.to_json(path)
    back = Profile.from_json(path)
    assert back.flops_by_dtype() == p.flops_by_dtype()
    assert back.mfu(TOY) == pytest.approx(p.mfu(TOY))
    data = json.loads(path.read_text())
    assert {r["dtype"] for r in data["records"]} == {"float32", "bfloat16", None}
    for r in data["records"]:  # a file from before dtypes were kept
        del r["dtype"]
    del data["allow_tf32"]
    old = Profile.from_dict(data)
    assert old.flops_by_dtype() == {None: FP32_FLOPS + BF16_FLOPS}
    assert old.run.allow_tf32 is False
    # without dtypes every flop is taken at the model's dtype's peak (fp32 here)
    assert old.mfu(TOY) == pytest.approx((FP32_FLOPS + BF16_FLOPS) / G / p.wall_s)
    data["records"][0]["dtype"] = 16
    with pytest.raises(ValueError, match="dtype"):
        Profile.from_dict(data)


# NVIDIA data-sheet dense (no 2:4 sparsity) bf16 tensor-core peaks, TFLOPS (every device's
# figures against docs/peaks.md: tests/test_peaks.py)
DENSE_BF16 = {"A100-SXM4-80GB": 312, "A100-SXM4-40GB": 312, "A100-PCIE-80GB": 312,
              "H100-SXM": 989.4, "H100-PCIe": 756.5, "H100-NVL": 835.5, "H200": 989.4,
              "L4": 121}


def test_built_in_peaks_are_dense_never_sparse():
    assert set(DENSE_BF16) <= set(DEVICES)
    for name, tflops in DENSE_BF16.items():
        assert DEVICES[name].peak_flops("bfloat16") == pytest.approx(tflops * 1e12), name
    for name, spec in DEVICES.items():
        peaks = spec.peak_flops_by_dtype
        assert spec.source == "datasheet", name
        assert not any("sparse" in d for d in peaks), name
        if "bfloat16" not in peaks:
            continue
        if "float16" in peaks:
            assert peaks["float16"] == peaks["bfloat16"], name
        # dense tf32 is half of dense bf16 (NVIDIA rounds B200's to 1.1 of 2.25); the
        # sparse figures would double both
        if "tf32" in peaks:
            assert peaks["tf32"] == pytest.approx(peaks["bfloat16"] / 2, rel=0.03), name
        for fp8 in ("float8_e4m3fn", "float8_e5m2"):
            # dense fp8 is twice dense bf16 (sparse fp8: four times); Gaudi 3's matrix
            # engines run bf16 and fp8 at one rate
            if fp8 in peaks and name != "Gaudi3":
                assert peaks[fp8] == pytest.approx(2 * peaks["bfloat16"], rel=0.02), name
