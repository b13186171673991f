"""Device peaks, the roofline and MFU: plain arithmetic on finished results.

    attainable time = max(flops / peak_flops, bytes / memory_bandwidth)

An op (or module) is compute-bound when the first term is the larger, memory-bound otherwise.
Efficiency = attainable / measured time: 1.0 means it ran at its roof.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional, Union

import torch

from ._results import Stats

COMPUTE_BOUND = "compute-bound"
MEMORY_BOUND = "memory-bound"

DTypeLike = Union[torch.dtype, str]


def _dtype_name(dtype: DTypeLike) -> str:
    return str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else dtype


@dataclass(frozen=True)
class DeviceSpec:
    """Peak dense flops per dtype (flop/s) and memory bandwidth (byte/s) of one device.

    >>> spec = DeviceSpec("my-gpu", {"bfloat16": 300e12, "float32": 20e12}, 2e12)
    >>> spec.peak_flops(torch.bfloat16)
    300000000000000.0
    """

    name: str
    peak_flops_by_dtype: Mapping[str, float] = field(default_factory=dict)
    memory_bandwidth: float = 0.0

    def __post_init__(self) -> None:
        peaks = {_dtype_name(k): float(v) for k, v in self.peak_flops_by_dtype.items()}
        if not peaks or any(v <= 0 for v in peaks.values()):
            raise ValueError(f"{self.name}: peak_flops_by_dtype needs positive flop/s values, "
                             f"e.g. {{'float32': 20e12}}; got {dict(self.peak_flops_by_dtype)}")
        if self.memory_bandwidth <= 0:
            raise ValueError(f"{self.name}: memory_bandwidth must be positive bytes/s, "
                             f"e.g. 2e12; got {self.memory_bandwidth!r}")
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
        attainable = max(compute_s, memory_s)
        measured = stats.latency_s
        return Roofline(
            arithmetic_intensity=stats.arithmetic_intensity,
            attainable_s=attainable,
            bound=COMPUTE_BOUND if compute_s >= memory_s else MEMORY_BOUND,
            efficiency=attainable / measured if measured else None,
        )


@dataclass(frozen=True)
class Roofline:
    """One op's or module's place on the roofline. ``efficiency`` is ``None`` untimed."""

    arithmetic_intensity: Optional[float]  # flops per byte moved
    attainable_s: float  # max(flops / peak, bytes / bandwidth)
    bound: str  # COMPUTE_BOUND or MEMORY_BOUND
    efficiency: Optional[float]  # attainable / measured

    def to_dict(self) -> dict:
        return asdict(self)


def _gpu(name: str, bf16: float, fp16: float, tf32: float, fp32: float, fp64: float,
         bandwidth: float, fp8: Optional[float] = None) -> DeviceSpec:
    peaks = {"bfloat16": bf16, "float16": fp16, "tf32": tf32, "float32": fp32, "float64": fp64}
    if fp8:
        peaks["float8_e4m3fn"] = peaks["float8_e5m2"] = fp8
    return DeviceSpec(name, peaks, bandwidth)


T = 1e12
# Dense (no 2:4 sparsity) tensor-core peaks from NVIDIA's data sheets; "float32" is the
# non-tensor-core FP32 rate (torch's default matmul precision), "tf32" the tensor-core one.
DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        _gpu("A100-SXM4-80GB", 312 * T, 312 * T, 156 * T, 19.5 * T, 19.5 * T, 2.039e12),
        _gpu("A100-SXM4-40GB", 312 * T, 312 * T, 156 * T, 19.5 * T, 19.5 * T, 1.555e12),
        _gpu("A100-PCIE-80GB", 312 * T, 312 * T, 156 * T, 19.5 * T, 19.5 * T, 1.935e12),
        _gpu("H100-SXM", 989.4 * T, 989.4 * T, 494.7 * T, 66.9 * T, 66.9 * T, 3.35e12, 1978.9 * T),
        _gpu("H100-PCIe", 756.5 * T, 756.5 * T, 378 * T, 51.2 * T, 51.2 * T, 2.0e12, 1513 * T),
        _gpu("H100-NVL", 835.5 * T, 835.5 * T, 417.5 * T, 60 * T, 60 * T, 3.9e12, 1670.5 * T),
        _gpu("H200", 989.4 * T, 989.4 * T, 494.7 * T, 66.9 * T, 66.9 * T, 4.8e12, 1978.9 * T),
        _gpu("L4", 121 * T, 121 * T, 60 * T, 30.3 * T, 0.49 * T, 0.3e12, 242.5 * T),
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
