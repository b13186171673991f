"""Device peaks, the roofline and MFU: plain arithmetic on finished results.

    attainable time = max(flops / peak_flops, bytes / memory_bandwidth,
                          comm_bytes / interconnect_bandwidth)

An op (or module) is compute-bound when the first term is the largest, memory-bound when the
second is, communication-bound when the third is (collectives: the bytes this rank puts on
the wire, over its link's one-direction bandwidth; the three overlap at best).
Efficiency = attainable / measured time: 1.0 means it ran at its roof.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional, Union

import torch

from dispatch_flops.results.stats import Stats, StringEnum


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


def _dtype_name(dtype: DTypeLike) -> str:
    return str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else dtype


@dataclass(frozen=True)
class DeviceSpec:
    """Peak dense flops per dtype (flop/s) and memory bandwidth (byte/s) of one device, and
    the bandwidth (byte/s, one direction, per device) of its links to its peers:
    ``interconnect_bandwidth`` (within a node: NVLink) and ``network_bandwidth`` (across
    nodes: InfiniBand), ``None`` when unknown. Comm time reads ``interconnect_bandwidth``;
    for a run across nodes, set it to the network's:
    ``dataclasses.replace(spec, interconnect_bandwidth=spec.network_bandwidth)``.

    >>> spec = DeviceSpec("my-gpu", {"bfloat16": 300e12, "float32": 20e12}, 2e12, 300e9)
    >>> spec.peak_flops(torch.bfloat16)
    300000000000000.0
    """

    name: str
    peak_flops_by_dtype: Mapping[str, float] = field(default_factory=dict)
    memory_bandwidth: float = 0.0
    interconnect_bandwidth: Optional[float] = None
    network_bandwidth: Optional[float] = None

    def __post_init__(self) -> None:
        peaks = {_dtype_name(k): float(v) for k, v in self.peak_flops_by_dtype.items()}
        if not peaks or any(v <= 0 for v in peaks.values()):
            raise ValueError(f"{self.name}: peak_flops_by_dtype needs positive flop/s values, "
                             f"e.g. {{'float32': 20e12}}; got {dict(self.peak_flops_by_dtype)}")
        if self.memory_bandwidth <= 0:
            raise ValueError(f"{self.name}: memory_bandwidth must be positive bytes/s, "
                             f"e.g. 2e12; got {self.memory_bandwidth!r}")
        for link in ("interconnect_bandwidth", "network_bandwidth"):
            value = getattr(self, link)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{self.name}: {link} must be positive bytes/s (one "
                                 f"direction), e.g. 450e9, or None; got {value!r}")
        object.__setattr__(self, "peak_flops_by_dtype", peaks)

    @classmethod
    def cpu(cls, peak_flops: float, memory_bandwidth: float, name: str = "cpu") -> "DeviceSpec":
        """A CPU from figures you give (flop/s for every float dtype, bytes/s)."""
        dtypes = ("float64", "float32", "bfloat16", "float16")
        return cls(name, {d: peak_flops for d in dtypes}, memory_bandwidth)

    def peak_flops(self, dtype: DTypeLike = torch.float32) -> float:
        name = _dtype_name(dtype)
        try:
            return self.peak_flops_by_dtype[name]
        except KeyError:
            raise ValueError(f"{self.name} has no peak for {name}; known dtypes: "
                             f"{sorted(self.peak_flops_by_dtype)}") from None

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


def _gpu(name: str, bf16: float, fp16: float, tf32: float, fp32: float, fp64: float,
         bandwidth: float, fp8: Optional[float] = None, *, link: float, network: float
         ) -> DeviceSpec:
    peaks = {"bfloat16": bf16, "float16": fp16, "tf32": tf32, "float32": fp32, "float64": fp64}
    if fp8:
        peaks["float8_e4m3fn"] = peaks["float8_e5m2"] = fp8
    return DeviceSpec(name, peaks, bandwidth, link, network)


T = 1e12
# Dense (no 2:4 sparsity) tensor-core peaks from NVIDIA's data sheets; "float32" is the
# non-tensor-core FP32 rate (torch's default matmul precision), "tf32" the tensor-core one.
# Links, one direction per GPU: NVLink 3 (A100 SXM, 12 links) 300 GB/s, NVLink 4 (H100/H200
# SXM, 18 links) 450 GB/s, an H100 NVL pair's bridge 300 GB/s; PCIe cards without a bridge
# their PCIe link (Gen4 x16 32 GB/s, Gen5 x16 64 GB/s). Network: one InfiniBand NIC per GPU,
# HDR 200 Gb/s (25 GB/s) beside A100s, NDR 400 Gb/s (50 GB/s) beside H100/H200s, as in DGX
# systems; PCIe cards: HDR.
G = 1e9
DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        _gpu("A100-SXM4-80GB", 312 * T, 312 * T, 156 * T, 19.5 * T, 19.5 * T, 2.039e12,
             link=300 * G, network=25 * G),
        _gpu("A100-SXM4-40GB", 312 * T, 312 * T, 156 * T, 19.5 * T, 19.5 * T, 1.555e12,
             link=300 * G, network=25 * G),
        _gpu("A100-PCIE-80GB", 312 * T, 312 * T, 156 * T, 19.5 * T, 19.5 * T, 1.935e12,
             link=32 * G, network=25 * G),
        _gpu("H100-SXM", 989.4 * T, 989.4 * T, 494.7 * T, 66.9 * T, 66.9 * T, 3.35e12, 1978.9 * T,
             link=450 * G, network=50 * G),
        _gpu("H100-PCIe", 756.5 * T, 756.5 * T, 378 * T, 51.2 * T, 51.2 * T, 2.0e12, 1513 * T,
             link=64 * G, network=25 * G),
        _gpu("H100-NVL", 835.5 * T, 835.5 * T, 417.5 * T, 60 * T, 60 * T, 3.9e12, 1670.5 * T,
             link=300 * G, network=50 * G),
        _gpu("H200", 989.4 * T, 989.4 * T, 494.7 * T, 66.9 * T, 66.9 * T, 4.8e12, 1978.9 * T,
             link=450 * G, network=50 * G),
        _gpu("L4", 121 * T, 121 * T, 60 * T, 30.3 * T, 0.49 * T, 0.3e12, 242.5 * T,
             link=32 * G, network=25 * G),
    )
}

# torch.cuda.get_device_name() substrings, most specific first
_NAME_PATTERNS = (
    ("H200", "H200"),
    ("H100 NVL", "H100-NVL"),
    ("H100 PCIe", "H100-PCIe"),
    ("H100", "H100-SXM"),
    ("A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("A100-PCIE", "A100-PCIE-80GB"),
    ("A100", "A100-SXM4-80GB"),
    ("L4", "L4"),
)


def device_spec(name: Optional[str] = None) -> Optional[DeviceSpec]:
    """The built-in spec for a ``torch.cuda.get_device_name()`` string (the current CUDA
    device when ``name`` is None), or ``None`` when there is none: pass your own then."""
    if name is None:
        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name()
    for pattern, key in _NAME_PATTERNS:
        if pattern.lower() in name.lower():
            return DEVICES[key]
    return DEVICES.get(name)
