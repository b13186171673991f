"""Device peaks, the roofline and MFU: plain arithmetic on finished results.

    attainable time = max(flops / peak_flops, bytes / memory_bandwidth,
                          comm_bytes / interconnect_bandwidth)

An op (or module) is compute-bound when the first term is the largest, memory-bound when the
second is, communication-bound when the third is (collectives: the bytes this rank puts on
the wire, over its link's one-direction bandwidth; the three overlap at best).
Efficiency = attainable / measured time: 1.0 means it ran at its roof.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional, Union

import torch

from dispatch_flops.results.stats import Stats, StringEnum

if TYPE_CHECKING:  # calibration.py runs kernels: imported when calibrate() is called
    from dispatch_flops.results.calibration import Calibration


class Bound(StringEnum):
    """Which roof an op or module sits under: the largest term of its attainable time.

    >>> roof = DEVICES["H100-SXM"].roofline(fc.by_operator()["aten.mm"], torch.bfloat16)
    >>> roof.bound is Bound.COMPUTE, f"{roof.bound}"
    (True, 'compute-bound')
    """

    COMPUTE = "compute-bound"  # flops / peak flops
    MEMORY = "memory-bound"  # bytes moved / memory bandwidth
    COMMUNICATION = "communication-bound"  # bytes on the wire / interconnect bandwidth


# the members under their old names, importable as before (not in __all__)
COMPUTE_BOUND = Bound.COMPUTE
MEMORY_BOUND = Bound.MEMORY
COMM_BOUND = Bound.COMMUNICATION

DTypeLike = Union[torch.dtype, str]


# every fp8 format torch has: a device's fp8 peak serves each (ROCm's MI300 runs the fnuz ones)
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
FP4_DTYPE = "float4_e2m1fn_x2"  # two fp4 values a byte: torch's MX / NVFP4 operand
# the short names a spec may be written with, and the peaks' names they stand for
_SHORT_NAMES = {"fp64": ("float64",), "fp32": ("float32",), "bf16": ("bfloat16",),
                "fp16": ("float16",), "fp8": FP8_DTYPES, "fp4": (FP4_DTYPE,)}
SOURCES = ("datasheet", "calibrated", "user")  # where a DeviceSpec's figures come from


def dtype_name(dtype: DTypeLike) -> str:
    return str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else dtype


@dataclass(frozen=True)
class DeviceSpec:
    """Peak dense flops per dtype (flop/s) and memory bandwidth (byte/s) of one device, and
    the bandwidth (byte/s, one direction, per device) of its links to its peers:
    ``interconnect_bandwidth`` (within a node: NVLink) and ``network_bandwidth`` (across
    nodes: InfiniBand), ``None`` when unknown. Comm time reads ``interconnect_bandwidth``;
    for a run across nodes, set it to the network's:
    ``dataclasses.replace(spec, interconnect_bandwidth=spec.network_bandwidth)``.

    Peaks are keyed by torch's dtype names ("bfloat16", "float8_e4m3fn", "int8",
    "float4_e2m1fn_x2"; "tf32" for fp32 contractions on tensor cores); the short names
    "bf16", "fp16", "fp32", "fp64", "fp8" (every fp8 format) and "fp4" are read as those.
    ``source`` says where the figures come from: "datasheet" (the built-in ``DEVICES``),
    "calibrated" (``DeviceSpec.calibrate()``, measured here) or "user" (yours); MFU's text
    names it.

    >>> spec = DeviceSpec("my-gpu", {"bfloat16": 300e12, "float32": 20e12}, 2e12, 300e9)
    >>> spec.peak_flops(torch.bfloat16)
    300000000000000.0
    >>> DeviceSpec.calibrate().peak_flops("float32")   # measured on this machine, in ~5 s
    """

    name: str
    peak_flops_by_dtype: Mapping[str, float] = field(default_factory=dict)
    memory_bandwidth: float = 0.0
    interconnect_bandwidth: Optional[float] = None
    network_bandwidth: Optional[float] = None
    source: str = "user"
    # how a calibrated spec was measured: rounds, each figure's spread, dtypes left out
    calibration: Optional[Calibration] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        peaks: dict[str, float] = {}
        for key, value in self.peak_flops_by_dtype.items():
            name = dtype_name(key)
            for full in _SHORT_NAMES.get(name, (name,)):
                peaks[full] = float(value)
        if self.source not in SOURCES:
            raise ValueError(f"{self.name}: source must be one of {SOURCES}, got "
                             f"{self.source!r}")
        if not peaks or any(not (math.isfinite(v) and v > 0) for v in peaks.values()):
            raise ValueError(f"{self.name}: peak_flops_by_dtype needs positive flop/s values, "
                             f"e.g. {{'float32': 20e12}}; got {dict(self.peak_flops_by_dtype)}")
        if isinstance(self.memory_bandwidth, bool) or \
                not isinstance(self.memory_bandwidth, (int, float)) or \
                not (math.isfinite(self.memory_bandwidth) and self.memory_bandwidth > 0):
            raise ValueError(f"{self.name}: memory_bandwidth must be positive bytes/s, "
                             f"e.g. 2e12; got {self.memory_bandwidth!r}")
        for link in ("interconnect_bandwidth", "network_bandwidth"):
            value = getattr(self, link)
            if value is not None and not (isinstance(value, (int, float)) and
                                          math.isfinite(value) and value > 0):
                raise ValueError(f"{self.name}: {link} must be positive bytes/s (one "
                                 f"direction), e.g. 450e9, or None; got {value!r}")
        object.__setattr__(self, "peak_flops_by_dtype", peaks)

    @classmethod
    def cpu(cls, peak_flops: float, memory_bandwidth: float, name: str = "cpu") -> "DeviceSpec":
        """A CPU from figures you give (flop/s for every float dtype, bytes/s)."""
        dtypes = ("float64", "float32", "bfloat16", "float16")
        return cls(name, {d: peak_flops for d in dtypes}, memory_bandwidth)

    @classmethod
    def calibrate(cls, device: Union[str, torch.device, None] = None, *,
                  budget_s: Optional[float] = None, name: Optional[str] = None
                  ) -> "DeviceSpec":
        """Measure this machine's peaks instead of reading a datasheet: the achievable dense
        matmul flop/s of each dtype the device runs (float32, bfloat16, float16; on CUDA
        also tf32, and fp8 / int8 where torch has ``_scaled_mm`` / ``_int_mm`` for it) and
        its streaming memory bandwidth (a large copy: bytes read + written / time).
        ``device``: "cpu", "cuda", "cuda:1", ... (default: the current CUDA device, else
        the CPU). ``budget_s``: the time it may take, at most 30 s (default 5 s on a CPU,
        10 s on a GPU). The result (``source="calibrated"``) goes wherever a spec does:
        ``fc.mfu(device=spec)``, rooflines, plots, ``profile_generate``'s roofline.

        >>> spec = DeviceSpec.calibrate()          # the CPU here: ~5 s
        >>> fc.mfu_text(spec)                      # "MFU ... % of ... calibrated on cpu"
        """
        from dispatch_flops.results.calibration import calibrate

        label, peaks, bandwidth, identity, calibration = calibrate(device, budget_s, name)
        link = network = None
        key = match_device(*identity)[0] if identity else None
        if key:  # links are not measured: the datasheet's, where there is one
            link, network = DEVICES[key].interconnect_bandwidth, DEVICES[key].network_bandwidth
        return cls(label, peaks, bandwidth, link, network, source="calibrated",
                   calibration=calibration)

    def peak_flops(self, dtype: DTypeLike = torch.float32) -> float:
        name = dtype_name(dtype)
        name = _SHORT_NAMES.get(name, (name,))[0]
        try:
            return self.peak_flops_by_dtype[name]
        except KeyError:
            how = ("measure it with DeviceSpec.calibrate() or pass your own figure: "
                   "dataclasses.replace(spec, peak_flops_by_dtype={..., "
                   f"{name!r}: flop_s}})")
            raise ValueError(f"{self.name} has no peak for {name}; known dtypes: "
                             f"{sorted(self.peak_flops_by_dtype)}; {how}") from None

    def roofline(self, stats: Stats, dtype: DTypeLike = torch.float32) -> "Roofline":
        """Where ``stats`` sits against this device's roofs."""
        compute_s = stats.flops / self.peak_flops(dtype)
        memory_s = stats.bytes / self.memory_bandwidth
        comm_s: Optional[float] = 0.0
        if stats.comm_bytes:
            comm_s = (stats.comm_bytes / self.interconnect_bandwidth
                      if self.interconnect_bandwidth else None)
        attainable = max(compute_s, memory_s, comm_s or 0.0)
        bound = COMPUTE_BOUND if compute_s >= memory_s else MEMORY_BOUND
        if comm_s and comm_s > max(compute_s, memory_s):
            bound = COMM_BOUND
        measured = stats.latency_s
        return Roofline(
            arithmetic_intensity=stats.arithmetic_intensity,
            attainable_s=attainable,
            bound=bound,
            efficiency=attainable / measured if measured else None,
            compute_s=compute_s, memory_s=memory_s, comm_s=comm_s,
        )


@dataclass(frozen=True)
class Roofline:
    """One op's or module's place on the roofline. ``efficiency`` is ``None`` untimed."""

    arithmetic_intensity: Optional[float]  # flops per byte moved
    attainable_s: float  # max(flops / peak, bytes / bandwidth, comm bytes / link bandwidth)
    bound: Bound
    efficiency: Optional[float]  # attainable / measured
    compute_s: Optional[float] = None  # flops / peak
    memory_s: Optional[float] = None  # bytes / memory bandwidth
    # comm bytes / interconnect bandwidth: 0.0 without collectives, None with collectives on
    # a device whose interconnect bandwidth is unknown
    comm_s: Optional[float] = None

    def to_dict(self) -> dict:
        return asdict(self)


T, G = 1e12, 1e9


def _datasheet(name: str, bandwidth_tb: float, *, fp64: Optional[float] = None,
               fp32: Optional[float] = None, tf32: Optional[float] = None,
               bf16: Optional[float] = None, fp16: Optional[float] = None,
               fp8: Optional[float] = None, int8: Optional[float] = None,
               fp4: Optional[float] = None, link: Optional[float] = None,
               network: Optional[float] = None) -> DeviceSpec:
    """A built-in spec: dense peaks in TFLOPS (TOPS for int8), memory bandwidth in TB/s,
    links in GB/s (one direction, per device); a dtype the datasheet prints no figure for is
    left out (MFU then says so rather than guess)."""
    given = {"float64": fp64, "float32": fp32, "tf32": tf32, "bfloat16": bf16,
             "float16": fp16, "fp8": fp8, "int8": int8, "fp4": fp4}
    peaks = {k: v * T for k, v in given.items() if v is not None}
    return DeviceSpec(name, peaks, bandwidth_tb * T, link * G if link else None,
                      network * G if network else None, source="datasheet")


# Dense peaks (no 2:4 sparsity) per device, as torch sees one: the sources, the sparse
# figures halved and the links' conventions are in docs/peaks.md, one row a device.
# "float32" is the fp32 rate a float32 matmul runs at without tf32 (NVIDIA: the non-tensor
# FP32 rate; AMD: the FP32 matrix rate), "tf32" the tensor-core one; "float64" the FP64
# tensor / matrix rate where there is one. GeForce cards: the FP32-accumulate tensor rates
# (what cuBLAS uses for a bf16 / fp16 matmul), half their FP16-accumulate ones. An MI250X /
# MI250 is two GCDs, two torch devices: each gets half the module's figures.
DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        # NVIDIA Volta, Turing
        _datasheet("V100-SXM2", 0.9, fp64=7.8, fp32=15.7, fp16=125, link=150),
        _datasheet("V100-PCIe", 0.9, fp64=7, fp32=14, fp16=112, link=16),
        _datasheet("V100S-PCIe", 1.134, fp64=8.2, fp32=16.4, fp16=130, link=16),
        _datasheet("T4", 0.32, fp32=8.1, fp16=65, int8=130, link=16),
        # NVIDIA Ampere
        _datasheet("A10", 0.6, fp32=31.2, tf32=62.5, bf16=125, fp16=125, int8=250, link=32),
        _datasheet("A10G", 0.6, fp32=31.52, tf32=35, bf16=70, fp16=70, int8=140, link=32),
        _datasheet("A30", 0.933, fp64=10.3, fp32=10.3, tf32=82, bf16=165, fp16=165, int8=330,
                   link=100),
        _datasheet("A40", 0.696, fp32=37.4, tf32=74.8, bf16=149.7, fp16=149.7, int8=299.3,
                   link=56.25),
        _datasheet("A100-SXM4-80GB", 2.039, fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312,
                   int8=624, link=300, network=25),
        _datasheet("A100-SXM4-40GB", 1.555, fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312,
                   int8=624, link=300, network=25),
        _datasheet("A100-PCIE-80GB", 1.935, fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312,
                   int8=624, link=32, network=25),
        _datasheet("A100-PCIE-40GB", 1.555, fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312,
                   int8=624, link=32, network=25),
        _datasheet("RTX-3090", 0.936, fp32=35.6, tf32=35.6, bf16=71, fp16=71, int8=284,
                   link=56.25),
        # NVIDIA Ada
        _datasheet("L4", 0.3, fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5, int8=242.5,
                   link=32, network=25),
        _datasheet("L40", 0.864, fp32=90.5, tf32=90.5, bf16=181, fp16=181, fp8=362, int8=362,
                   link=32),
        _datasheet("L40S", 0.864, fp32=91.6, tf32=183, bf16=362.05, fp16=362.05, fp8=733,
                   int8=733, link=32),
        _datasheet("RTX-4090", 1.008, fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3,
                   int8=660.6, link=32),
        _datasheet("RTX-6000-Ada", 0.96, fp32=91.1, tf32=182.1, bf16=364.2, fp16=364.2,
                   fp8=728.5, int8=728.5, link=32),
        # NVIDIA Hopper
        _datasheet("H100-SXM", 3.35, fp64=66.9, fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4,
                   fp8=1978.9, int8=1978.9, link=450, network=50),
        _datasheet("H100-PCIe", 2.0, fp64=51.2, fp32=51.2, tf32=378, bf16=756.5, fp16=756.5,
                   fp8=1513, int8=1513, link=64, network=25),
        _datasheet("H100-NVL", 3.9, fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5,
                   fp8=1670.5, int8=1670.5, link=300, network=50),
        _datasheet("H200", 4.8, fp64=66.9, fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4,
                   fp8=1978.9, int8=1978.9, link=450, network=50),
        _datasheet("H200-NVL", 4.8, fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5,
                   fp8=1670.5, int8=1670.5, link=450),
        _datasheet("H20", 4.0, fp64=1, fp32=44, tf32=74, bf16=148, fp16=148, fp8=296, int8=296,
                   link=450),
        _datasheet("GH200-96GB", 4.0, fp64=66.9, fp32=66.9, tf32=494.7, bf16=989.4,
                   fp16=989.4, fp8=1978.9, int8=1978.9, link=450, network=50),
        _datasheet("GH200-144GB", 4.9, fp64=66.9, fp32=66.9, tf32=494.7, bf16=989.4,
                   fp16=989.4, fp8=1978.9, int8=1978.9, link=450, network=50),
        # NVIDIA Blackwell, Blackwell Ultra
        _datasheet("B100", 8.0, fp64=30, tf32=900, bf16=1750, fp16=1750, fp8=3500, int8=3500,
                   fp4=7000, link=900, network=50),
        _datasheet("B200", 7.7, fp64=37, fp32=75, tf32=1100, bf16=2250, fp16=2250, fp8=4500,
                   int8=4500, fp4=9000, link=900, network=50),
        _datasheet("GB200", 8.0, fp64=40, fp32=80, tf32=1250, bf16=2500, fp16=2500, fp8=5000,
                   int8=5000, fp4=10000, link=900, network=50),
        _datasheet("B300", 8.0, fp64=1.25, fp32=75, tf32=1125, bf16=2250, fp16=2250, fp8=4500,
                   fp4=13500, link=900, network=100),
        _datasheet("GB300", 8.0, fp64=1.39, fp32=83.3, tf32=1250, bf16=2500, fp16=2500,
                   fp8=5000, int8=166.7, fp4=15000, link=900, network=100),
        _datasheet("RTX-5090", 1.792, fp32=104.8, tf32=104.8, bf16=209.5, fp16=209.5, fp8=419,
                   int8=838, fp4=1676, link=64),
        # AMD Instinct
        _datasheet("MI210", 1.6384, fp64=45.3, fp32=45.3, bf16=181, fp16=181, int8=181,
                   link=150),
        _datasheet("MI250X", 1.6384, fp64=47.85, fp32=47.85, bf16=191.5, fp16=191.5,
                   int8=191.5, link=50),
        _datasheet("MI250", 1.6384, fp64=45.25, fp32=45.25, bf16=181.05, fp16=181.05,
                   int8=181.05, link=50),
        _datasheet("MI300X", 5.3, fp64=163.4, fp32=163.4, tf32=653.7, bf16=1307.4,
                   fp16=1307.4, fp8=2614.9, int8=2614.9, link=448),
        _datasheet("MI325X", 6.0, fp64=163.4, fp32=163.4, tf32=653.7, bf16=1307.4,
                   fp16=1307.4, fp8=2614.9, int8=2614.9, link=448),
        _datasheet("MI350X", 8.0, fp64=72.1, fp32=144.2, bf16=2306.9, fp16=2306.9, fp8=4613.7,
                   int8=4613.7, fp4=9227.5, link=537.6),
        _datasheet("MI355X", 8.0, fp64=78.6, fp32=157.3, bf16=2516.6, fp16=2516.6, fp8=5033.2,
                   int8=5033.2, fp4=10066.4, link=537.6),
        # Intel Gaudi (torch.hpu)
        _datasheet("Gaudi2", 2.46, bf16=432, fp8=865, link=262.5, network=37.5),
        _datasheet("Gaudi3", 3.7, bf16=1835, fp8=1835, link=525, network=75),
    )
}


class _Pattern(NamedTuple):
    """A built-in spec's name as devices report it: every token of ``tokens`` among the
    name's (split at anything not a letter or digit, upper-cased), none of ``without``;
    where names alone cannot tell two devices apart, a range of the device's memory (GiB)
    or compute units (SMs / CUs) does, and without it the device is ambiguous."""

    key: str
    tokens: frozenset
    without: frozenset = frozenset()
    memory_gib: Optional[tuple[float, float]] = None
    units: Optional[tuple[int, int]] = None


def _p(key: str, tokens: str, without: str = "", memory_gib=None, units=None) -> _Pattern:
    return _Pattern(key, frozenset(tokens.split()), frozenset(without.split()), memory_gib,
                    units)


_BIG = 1e9
# Most specific first; tokens, not substrings, so "L4" never matches "L40S", "A10" never
# "A100", "H100" never "GH200", "B200" never "GB200", "MI300X" never "MI300A". A name with
# any of _NEVER (a MIG slice, a laptop part) matches nothing: its peaks are not the card's.
_NEVER = frozenset({"MIG", "LAPTOP", "MOBILE", "MAX-Q"})
_NAME_PATTERNS: tuple[_Pattern, ...] = (
    _p("V100S-PCIe", "V100S"),
    _p("V100-SXM2", "V100 SXM2"),
    _p("V100-PCIe", "V100 PCIE"),
    _p("T4", "T4"),
    _p("A10G", "A10G"),
    _p("A10", "A10"),
    _p("A30", "A30"),
    _p("A40", "A40"),
    _p("A100-PCIE-40GB", "A100 PCIE 40GB"),
    _p("A100-PCIE-80GB", "A100 PCIE 80GB"),
    _p("A100-SXM4-40GB", "A100 40GB"),
    _p("A100-SXM4-80GB", "A100 80GB"),
    _p("A100-PCIE-40GB", "A100 PCIE", memory_gib=(0, 48)),
    _p("A100-PCIE-80GB", "A100 PCIE", memory_gib=(48, _BIG)),
    _p("A100-SXM4-40GB", "A100", memory_gib=(0, 48)),
    _p("A100-SXM4-80GB", "A100", memory_gib=(48, _BIG)),
    _p("L4", "L4"),
    _p("L40S", "L40S"),
    _p("L40", "L40"),
    _p("RTX-3090", "RTX 3090", without="TI"),
    _p("RTX-4090", "RTX 4090", without="D DD"),
    _p("RTX-5090", "RTX 5090", without="D DD"),
    _p("RTX-6000-Ada", "RTX 6000 ADA"),
    _p("H100-NVL", "H100 NVL"),
    _p("H100-PCIe", "H100 PCIE"),
    _p("H100-SXM", "H100", without="64GB 94GB 96GB"),
    _p("H200-NVL", "H200 NVL"),
    _p("H200", "H200"),
    _p("H20", "H20", without="3E"),
    _p("GH200-144GB", "GH200 HBM3E"),
    _p("GH200-144GB", "GH200 144G"),
    _p("GH200-96GB", "GH200 480GB"),
    _p("GH200-96GB", "GH200", memory_gib=(0, 120)),
    _p("GH200-144GB", "GH200", memory_gib=(120, _BIG)),
    _p("B100", "B100"),
    _p("B200", "B200"),
    _p("B300", "B300"),
    _p("GB200", "GB200"),
    _p("GB300", "GB300"),
    _p("MI210", "MI210"),
    _p("MI250X", "MI250X", without="MI250"),
    _p("MI250", "MI250", without="MI250X"),
    # ROCm names both "AMD Instinct MI250X / MI250": a GCD's compute units tell them apart
    _p("MI250X", "MI250X MI250", units=(108, 1 << 30)),
    _p("MI250", "MI250X MI250", units=(0, 108)),
    _p("MI300X", "MI300X"),
    _p("MI325X", "MI325X"),
    _p("MI350X", "MI350X"),
    _p("MI355X", "MI355X"),
    _p("Gaudi2", "GAUDI2"),
    _p("Gaudi2", "GAUDI 2"),
    _p("Gaudi3", "GAUDI3"),
    _p("Gaudi3", "GAUDI 3"),
)


def _within(value: Optional[float], bounds: Optional[tuple]) -> Optional[bool]:
    """True / False, or None when the bound needs a value nobody gave."""
    if bounds is None:
        return True
    if value is None:
        return None
    return bounds[0] <= value < bounds[1]


def match_device(name: str, total_memory: Optional[int] = None,
                 multi_processor_count: Optional[int] = None) -> tuple[Optional[str], str]:
    """``(key in DEVICES, "")`` for a device name (``torch.cuda.get_device_name()``, ROCm's
    too), or ``(None, why)``: unknown, or ambiguous without its memory / compute units."""
    if name in DEVICES:
        return name, ""
    tokens = frozenset(t for t in re.split(r"[^A-Z0-9]+", name.upper()) if t)
    if tokens & _NEVER:
        return None, (f"{name!r} is a slice or a mobile part ({', '.join(sorted(tokens & _NEVER))}"
                      "): no datasheet gives its peaks")
    memory = total_memory / 2**30 if total_memory else None
    undecided: list[str] = []
    for pattern in _NAME_PATTERNS:
        if not pattern.tokens <= tokens or pattern.without & tokens:
            continue
        fits = (_within(memory, pattern.memory_gib), _within(multi_processor_count,
                                                              pattern.units))
        if False in fits:
            continue
        if None in fits:
            undecided.append(pattern.key)
            continue
        if undecided:  # an earlier candidate needs what was not given: do not guess
            break
        return pattern.key, ""
    if undecided:
        what = "total_memory" if any(
            p.key in undecided and p.memory_gib for p in _NAME_PATTERNS) else \
            "multi_processor_count"
        return None, (f"{name!r} may be {' or '.join(dict.fromkeys(undecided))}: the "
                      f"device's {what} tells which (device_spec(name, {what}=...))")
    return None, f"no built-in DeviceSpec matches {name!r}"


def device_spec(name: Union[str, int, torch.device, None] = None,
                total_memory: Optional[int] = None,
                multi_processor_count: Optional[int] = None) -> Optional[DeviceSpec]:
    """The built-in spec for a device name (``torch.cuda.get_device_name()``, ROCm's
    "AMD Instinct MI300X" too, or a key of ``DEVICES``), or ``None`` when none matches:
    pass your own (``DeviceSpec(...)``) or measure one (``DeviceSpec.calibrate()``) then,
    never another device's figures. With ``name`` None: the current CUDA / ROCm device, its
    memory and compute units read from its properties (they tell an A100 40GB from an
    80GB where the name does not); a CUDA device index or ``torch.device``: that device
    (a CPU's: ``None``). ``total_memory`` in bytes."""
    index = None
    if isinstance(name, torch.device) and name.type != "cuda":
        return None  # no built-in spec for a CPU (or another device type)
    if isinstance(name, torch.device) or (isinstance(name, int) and
                                          not isinstance(name, bool)):
        index = name.index if isinstance(name, torch.device) else name
        if not torch.cuda.is_available() or \
                not (index is None or 0 <= index < torch.cuda.device_count()):
            raise ValueError(f"device_spec({name!r}): no such CUDA device here "
                             f"({torch.cuda.device_count()} visible); pass a device name "
                             f"(a key of DEVICES, or torch.cuda.get_device_name()), a CUDA "
                             f"device index, or None for the current one")
        if index is None:
            name = None
    elif name is not None and not isinstance(name, str):
        raise ValueError(f"device_spec: name must be a device name (a key of DEVICES, or "
                         f"torch.cuda.get_device_name()), a CUDA device index, a "
                         f"torch.device or None; got {name!r}")
    if name is None or index is not None:
        if not torch.cuda.is_available():
            return None
        if index is None:
            index = torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        props = torch.cuda.get_device_properties(index)
        total_memory = getattr(props, "total_memory", None)
        multi_processor_count = getattr(props, "multi_processor_count", None)
    assert isinstance(name, str)  # an index or a device was read as its name above
    key, _ = match_device(name, total_memory, multi_processor_count)
    return DEVICES[key] if key else None
