"""Device peaks people can trust: the built-in table matches its cited docs page figure for
figure, device names match by token (never another device's figures), a peak can be measured
here, an MFU above 100 % is flagged, and int8 / fp8 / fp4 work is divided by its own peak."""

import math
import pathlib
import re
import time
import types
import warnings

import pytest
import torch

from dispatch_flops import DeviceSpec, FlopCounter, UtilisationWarning
from dispatch_flops.results.roofline import DEVICES, device_spec, match_device

PEAKS_PAGE = pathlib.Path(__file__).parent.parent / "docs" / "peaks.md"
COLUMNS = ("float64", "float32", "tf32", "bfloat16", "float16", "float8_e4m3fn", "int8",
           "float4_e2m1fn_x2")
G, GIB = 1e9, 2**30


def _page_rows() -> dict[str, list[str]]:
    rows = {}
    for line in PEAKS_PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 13 and cells[0] in DEVICES:
            rows[cells[0]] = cells[1:]
    return rows


def test_the_docs_table_is_the_code_table_figure_for_figure():
    """Every built-in device has one row in docs/peaks.md, every figure there equals the
    spec's (dense TFLOPS per dtype, TB/s, GB/s one direction), and every row cites a
    source."""
    rows = _page_rows()
    assert set(rows) == set(DEVICES)
    for name, cells in rows.items():
        spec = DEVICES[name]
        *peaks, memory, link, network, source = cells
        for dtype, cell in zip(COLUMNS, peaks):
            if cell == "—":
                assert dtype not in spec.peak_flops_by_dtype, (name, dtype)
            else:
                assert spec.peak_flops(dtype) == pytest.approx(float(cell) * 1e12), (name, dtype)
        assert spec.memory_bandwidth == pytest.approx(float(memory) * 1e12), name
        for value, cell in ((spec.interconnect_bandwidth, link),
                            (spec.network_bandwidth, network)):
            assert (value is None) if cell == "—" else value == pytest.approx(float(cell) * G)
        assert re.search(r"\[[^]]+\]\[\w+\]|datasheet|specification", source), name
        # every cited source has its address at the foot of the page
        for ref in re.findall(r"\]\[(\w+)\]", source):
            assert re.search(rf"^\[{ref}\]: https://", PEAKS_PAGE.read_text(), re.M), ref


def test_the_table_covers_the_accelerators_people_train_and_serve_on():
    wanted = ("V100-SXM2 V100-PCIe T4 A10 A10G A30 A40 A100-SXM4-40GB A100-SXM4-80GB "
              "A100-PCIE-40GB A100-PCIE-80GB L4 L40 L40S RTX-3090 RTX-4090 RTX-5090 "
              "RTX-6000-Ada H100-SXM H100-PCIe H100-NVL H200 H200-NVL H20 GH200-96GB "
              "GH200-144GB B100 B200 B300 GB200 GB300 MI210 MI250X MI300X MI325X MI350X "
              "MI355X Gaudi2 Gaudi3").split()
    assert set(wanted) <= set(DEVICES) and len(DEVICES) >= 30
    for spec in DEVICES.values():
        assert spec.source == "datasheet" and spec.memory_bandwidth > 0
    # low-precision peaks where the hardware has them, and none where it has not
    assert "float4_e2m1fn_x2" in DEVICES["B200"].peak_flops_by_dtype
    assert "float4_e2m1fn_x2" in DEVICES["MI355X"].peak_flops_by_dtype
    assert "float8_e4m3fn" not in DEVICES["A100-SXM4-80GB"].peak_flops_by_dtype
    assert "bfloat16" not in DEVICES["V100-SXM2"].peak_flops_by_dtype
    assert DEVICES["H100-SXM"].peak_flops("int8") == DEVICES["H100-SXM"].peak_flops("fp8")
    # ROCm's fp8 formats share the device's fp8 peak
    assert DEVICES["MI300X"].peak_flops("float8_e4m3fnuz") == pytest.approx(2614.9e12)


# (torch.cuda.get_device_name() as devices report it, the spec it must be)
NAMES = [
    ("Tesla V100-SXM2-16GB", "V100-SXM2"), ("Tesla V100-SXM2-32GB", "V100-SXM2"),
    ("Tesla V100-PCIE-32GB", "V100-PCIe"), ("Tesla V100S-PCIE-32GB", "V100S-PCIe"),
    ("Tesla T4", "T4"), ("NVIDIA A10", "A10"), ("NVIDIA A10G", "A10G"), ("NVIDIA A30", "A30"),
    ("NVIDIA A40", "A40"), ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"), ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"), ("NVIDIA L4", "L4"), ("NVIDIA L40", "L40"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 3090", "RTX-3090"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"), ("NVIDIA GeForce RTX 5090", "RTX-5090"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"), ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H100 NVL", "H100-NVL"), ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", "H200-NVL"), ("NVIDIA H20", "H20"), ("NVIDIA GH200 480GB", "GH200-96GB"),
    ("NVIDIA GH200 144G HBM3e", "GH200-144GB"), ("NVIDIA B100", "B100"), ("NVIDIA B200", "B200"),
    ("NVIDIA B300 SXM6 AC", "B300"), ("NVIDIA GB200", "GB200"), ("NVIDIA GB300", "GB300"),
    ("AMD Instinct MI210", "MI210"), ("AMD Instinct MI250X", "MI250X"),
    ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI300X VF", "MI300X"),
    ("AMD Instinct MI325X", "MI325X"), ("AMD Instinct MI350X", "MI350X"),
    ("AMD Instinct MI355X", "MI355X"), ("GAUDI2", "Gaudi2"), ("Intel Gaudi 3", "Gaudi3"),
    ("H100-SXM", "H100-SXM"),  # a key of DEVICES is its own name
]
# names that contain another device's name, or look like one: none may borrow its figures
UNKNOWN = ["NVIDIA RTX A6000", "Quadro RTX 6000", "NVIDIA GeForce RTX 4090 D",
           "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4090 Laptop GPU",
           "AMD Instinct MI300A", "NVIDIA H800", "NVIDIA A800-SXM4-80GB", "NVIDIA L20",
           "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
           "NVIDIA H20-3e", "NVIDIA GeForce RTX 4080", "Some Other GPU", "", "cpu"]


@pytest.mark.parametrize("name, key", NAMES)
def test_device_names_match_their_own_spec(name, key):
    assert device_spec(name) is DEVICES[key]
    assert device_spec(name.lower()) is DEVICES[key]  # case does not matter


@pytest.mark.parametrize("name", UNKNOWN)
def test_unknown_names_match_nothing(name):
    assert device_spec(name) is None
    assert match_device(name)[1]  # and say why


def test_substring_traps():
    """"L4" in "L40S", "A10" in "A100", "H100" in "GH200", "B200" in "GB200", "H20" in
    "H200", "MI300X" beside "MI300A": tokens, not substrings."""
    assert device_spec("NVIDIA L40S").name == "L40S" != device_spec("NVIDIA L4").name
    assert device_spec("NVIDIA A100-SXM4-80GB").name != "A10"
    assert device_spec("NVIDIA A10").name == "A10"
    assert device_spec("NVIDIA GH200 480GB").name.startswith("GH200")
    assert device_spec("NVIDIA GB200").name == "GB200"
    assert device_spec("NVIDIA H200").name == "H200" and device_spec("NVIDIA H20").name == "H20"
    assert device_spec("NVIDIA B200").name == "B200"
    assert device_spec("NVIDIA GB300").name == "GB300"


def test_properties_decide_where_the_name_cannot():
    """An A100 named without its size, a GH200 without its memory, ROCm's shared MI250X /
    MI250 name: the memory or the compute units decide; without them, no spec."""
    assert device_spec("NVIDIA A100") is None
    assert "total_memory" in match_device("NVIDIA A100")[1]
    assert device_spec("NVIDIA A100", total_memory=int(39.4 * GIB)).name == "A100-SXM4-40GB"
    assert device_spec("NVIDIA A100", total_memory=int(79.1 * GIB)).name == "A100-SXM4-80GB"
    assert device_spec("NVIDIA A100 PCIe", total_memory=int(39.4 * GIB)).name == \
        "A100-PCIE-40GB"
    assert device_spec("NVIDIA GH200", total_memory=int(95 * GIB)).name == "GH200-96GB"
    assert device_spec("NVIDIA GH200", total_memory=int(143 * GIB)).name == "GH200-144GB"
    assert device_spec("NVIDIA GH200") is None
    rocm = "AMD Instinct MI250X / MI250"
    assert device_spec(rocm) is None
    assert "multi_processor_count" in match_device(rocm)[1]
    assert device_spec(rocm, multi_processor_count=110).name == "MI250X"
    assert device_spec(rocm, multi_processor_count=104).name == "MI250"
    # an MI250X GCD is half the module: 383 TFLOPS bf16 a module
    assert DEVICES["MI250X"].peak_flops("bf16") == pytest.approx(383e12 / 2)


def _fake_gpu(monkeypatch, name, total_memory=80 * GIB, units=132):
    props = types.SimpleNamespace(total_memory=int(total_memory), multi_processor_count=units)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)


def _timed_mm(n=64):
    a, b = torch.randn(n, n), torch.randn(n, n)
    with FlopCounter(timing=True) as fc:
        a @ b
    return fc.to_profile()


def test_the_current_device_is_read_with_its_properties(monkeypatch):
    """With no device=, MFU takes the running GPU's spec (name and properties, faked here);
    an unknown GPU is an error naming it and how to pass or measure a spec."""
    p = _timed_mm()  # counted on the CPU: no device name recorded
    _fake_gpu(monkeypatch, "NVIDIA A100", total_memory=39.4 * GIB)
    assert device_spec().name == "A100-SXM4-40GB"
    assert p.mfu_text().endswith("A100-SXM4-40GB datasheet")
    _fake_gpu(monkeypatch, "AMD Instinct MI300X", total_memory=192 * GIB, units=304)
    assert device_spec() is DEVICES["MI300X"]
    assert p.mfu() == pytest.approx(2 * 64**3 / DEVICES["MI300X"].peak_flops("fp32")
                                    / p.wall_s)
    _fake_gpu(monkeypatch, "NVIDIA B40")
    assert device_spec() is None
    with pytest.raises(ValueError) as raised:
        p.mfu()
    message = str(raised.value)
    assert "unknown device" in message and "matches 'NVIDIA B40'" in message
    assert "DeviceSpec.calibrate()" in message
    assert "device=DeviceSpec(" in message and "DeviceSpec.cpu" in message


def test_short_dtype_names_and_sources():
    spec = DeviceSpec("mine", {"bf16": 4 * G, "fp8": 8 * G, "fp4": 16 * G, "fp32": G}, G)
    assert spec.source == "user"
    assert spec.peak_flops(torch.bfloat16) == spec.peak_flops("bf16") == 4 * G
    for fp8 in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "fp8"):
        assert spec.peak_flops(fp8) == 8 * G
    assert spec.peak_flops(torch.float4_e2m1fn_x2) == 16 * G
    with pytest.raises(ValueError, match="source must be one of"):
        DeviceSpec("x", {"fp32": G}, G, source="vendor")
    with pytest.raises(ValueError, match="no peak for int8.*calibrate"):
        spec.peak_flops("int8")
    # the constructor is as it was: positional fields first, the new one last
    old = DeviceSpec("x", {"float32": G}, 2 * G, 3 * G, 4 * G)
    assert (old.interconnect_bandwidth, old.network_bandwidth, old.source) == \
        (3 * G, 4 * G, "user")


@pytest.fixture(scope="module")
def calibrated():
    began = time.perf_counter()
    spec = DeviceSpec.calibrate("cpu")
    return spec, time.perf_counter() - began


def test_calibrate_measures_this_cpu_within_its_budget(calibrated):
    """The default budget on a CPU (5 s) is kept, well under the 30 s ceiling (margin for a
    busy machine: the copy's set-up may overrun a slice); figures are finite and plausible
    for any CPU."""
    spec, took = calibrated
    assert took < 20
    assert spec.source == "calibrated" and spec.name == "cpu"
    for dtype, flop_s in spec.peak_flops_by_dtype.items():
        assert math.isfinite(flop_s) and 1e6 < flop_s < 1e13, (dtype, flop_s)
    assert 1e8 < spec.peak_flops("float32") < 1e13
    assert 1e8 < spec.memory_bandwidth < 1e12
    assert "tf32" not in spec.peak_flops_by_dtype  # a CUDA setting: never on a CPU


def test_a_calibrated_spec_goes_where_a_spec_goes(calibrated):
    spec, _ = calibrated
    p = _timed_mm(128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UtilisationWarning)  # a busy CPU may beat its best
        mfu = p.mfu(device=spec)
    assert math.isfinite(mfu) and mfu > 0
    assert mfu == pytest.approx(2 * 128**3 / spec.peak_flops("float32") / p.wall_s)
    assert "dense, calibrated on cpu" in p.mfu_text(device=spec)
    roof = p.roofline_by_operator(device=spec)["aten.mm"]
    assert roof.attainable_s > 0 and roof.bound in ("compute-bound", "memory-bound")


def test_calibrate_refuses_bad_budgets_and_devices():
    for budget in (0, -1, 31, "5"):
        with pytest.raises(ValueError, match="budget_s"):
            DeviceSpec.calibrate("cpu", budget_s=budget)
    with pytest.raises(ValueError, match="'cpu', 'cuda'"):
        DeviceSpec.calibrate("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            DeviceSpec.calibrate("cuda")
    began = time.perf_counter()
    small = DeviceSpec.calibrate("cpu", budget_s=1, name="this box")
    # float32 and the copy are measured even when a busy machine overruns a tiny budget
    assert time.perf_counter() - began < 15 and small.name == "this box"
    assert small.peak_flops("float32") > 0 and small.memory_bandwidth > 0


def test_an_mfu_above_one_is_never_silent():
    """A peak far below what the run reached: mfu() warns (one UtilisationWarning class),
    the text form says "above 100 %" with the likely causes, HFU too."""
    p = _timed_mm()
    slow = DeviceSpec("too-slow", {"float32": 1.0}, 1.0)
    with pytest.warns(UtilisationWarning, match="above 100 %") as caught:
        value = p.mfu(device=slow)
    assert value > 1
    message = str(caught[0].message)
    for cause in ("peak is too low", "sparse", "dtype"):
        assert cause in message
    with pytest.warns(UtilisationWarning):
        p.hfu(device=slow)
    text = p.mfu_text(device=slow)
    assert text.startswith("MFU ") and "above 100 %" in text and "sparse" in text
    # calibrated: the cause named first is the measurement; dtype= names itself
    measured = DeviceSpec("cpu", {"float32": 1.0}, 1.0, source="calibrated")
    assert "calibrated peak is below" in p.mfu_text(device=measured)
    assert "dtype= names a slower dtype" in p.mfu_text(device=slow, dtype="float32")
    # below 1: no warning, no flag
    fast = DeviceSpec("fast", {"float32": 1e18}, 1e18)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UtilisationWarning)
        assert p.mfu(device=fast) < 1
    assert "above" not in p.mfu_text(device=fast)


def test_int8_contractions_run_at_the_int8_peak():
    """A real torch._int_mm on this CPU is filed under int8 and divided by the int8 peak;
    a device without one says so instead of using the model dtype's."""
    m, k, n = 64, 128, 32
    a = torch.randint(-8, 8, (m, k), dtype=torch.int8)
    b = torch.randint(-8, 8, (k, n), dtype=torch.int8)
    with FlopCounter(timing=True) as fc:
        torch._int_mm(a, b)
    p = fc.to_profile()
    assert p.flops_by_dtype() == {"int8": 2 * m * k * n}
    assert [(r.operator, r.dtype) for r in p.records()] == [("aten._int_mm", "int8")]
    spec = DeviceSpec("toy", {"float32": G, "int8": 8 * G}, G)
    assert p.mfu(device=spec) == pytest.approx(2 * m * k * n / (8 * G) / p.wall_s)
    assert "int8 dense" in p.mfu_text(device=spec)
    no_int8 = DeviceSpec("fp32-only", {"float32": G}, G)
    assert "has no peak for int8" in p.mfu_text(device=no_int8)
    # integer element-wise work is no contraction: the model dtype's peak, as before
    with FlopCounter(timing=True) as fc2:
        a + a
    assert fc2.to_profile().mfu(device=no_int8, flops="all") > 0


def test_fp8_and_fp4_contractions_run_at_their_own_peaks():
    """_scaled_mm is filed under its operands' dtype, not its scales': fp8 (run here on the
    CPU), fp4 with e8m0 (MX) scales (on meta tensors), each with its own peak; fp4 operands
    pack two values a byte, so k is twice the stored width."""
    spec = DeviceSpec("toy", {"float32": G, "bf16": 2 * G, "fp8": 4 * G, "fp4": 8 * G}, G)
    f = torch.randn(32, 64).to(torch.float8_e4m3fn)
    scale = torch.tensor(1.0)
    try:
        with FlopCounter(timing=True) as fc:
            torch._scaled_mm(f, f.t(), scale, scale, out_dtype=torch.bfloat16)
    except RuntimeError as e:  # an older CPU build without fp8 kernels
        pytest.skip(f"_scaled_mm does not run here: {e}")
    p = fc.to_profile()
    assert p.flops_by_dtype() == {"float8_e4m3fn": 2 * 32 * 64 * 32}
    assert p.mfu(device=spec) == pytest.approx(2 * 32 * 64 * 32 / (4 * G) / p.wall_s)
    m, stored_k, n = 128, 32, 128
    x = torch.empty(m, stored_k, dtype=torch.float4_e2m1fn_x2, device="meta")
    y = torch.empty(n, stored_k, dtype=torch.float4_e2m1fn_x2, device="meta").t()
    scales = torch.empty(512, dtype=torch.float8_e8m0fnu, device="meta")
    with FlopCounter() as fc4:
        torch._scaled_mm(x, y, scales, scales, out_dtype=torch.bfloat16)
    p4 = fc4.to_profile()
    assert p4.flops_by_dtype() == {"float4_e2m1fn_x2": 2 * m * (2 * stored_k) * n}
    assert p4.total.macs == m * (2 * stored_k) * n


def test_the_cli_prints_mfu_against_a_measured_or_named_peak(capsys, monkeypatch):
    """``--peaks calibrate`` measures this machine first (budget shortened here), a built-in
    name takes its datasheet; without --timing, or with a name not in DEVICES: an error."""
    from dispatch_flops.__main__ import main

    real = DeviceSpec.calibrate.__func__
    monkeypatch.setattr(DeviceSpec, "calibrate", classmethod(
        lambda cls, device=None, **kw: real(cls, device, budget_s=1)))
    main(["--timing", "--repeat", "1", "--warmup", "0", "--seq-len", "8", "--peaks",
          "calibrate"])
    out = capsys.readouterr().out
    assert re.search(r"^MFU [\d.]+ % of .* dense, calibrated on cpu", out, re.M)
    assert re.search(r"^HFU [\d.]+ % of .* dense, calibrated on cpu", out, re.M)
    main(["--timing", "--repeat", "1", "--warmup", "0", "--seq-len", "8", "--peaks",
          "H100-SXM"])
    assert "TFLOPS fp32 dense, H100-SXM datasheet" in capsys.readouterr().out
    for args, message in ((["--peaks", "calibrate"], "needs measured time"),
                          (["--timing", "--peaks", "H999"], "'calibrate' or one of")):
        with pytest.raises(SystemExit):
            main(args)
        assert message in capsys.readouterr().err
