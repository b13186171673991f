"""A Profile against a device: its rooflines and MFU / HFU.

MFU divides each op's flops by the dense peak of its own compute dtype (fp32 contractions at
the tf32 peak when ``allow_tf32`` was on): time at peak = Σ flops / peak(dtype), MFU = time at
peak / wall time. ``ProfileViews.mfu`` documents the figure; this module computes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Sequence

from dispatch_flops.results.roofline import DEVICES, DeviceSpec, Roofline, device_spec
from dispatch_flops.results.roofline import _dtype_name as dtype_name
from dispatch_flops.results.rows import ROW
from dispatch_flops.results.stats import PHASES, Stats

if TYPE_CHECKING:
    from dispatch_flops.results.profile import Profile

UTILISATION_FLOPS = ("contraction", "all")  # mfu/hfu numerators: 2 x MACs, or every op's
_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
                 "tf32": "tf32", "float8_e4m3fn": "fp8 e4m3", "float8_e5m2": "fp8 e5m2"}


def flops_figure(flops: str) -> Callable[[Stats], int]:
    """The ``Stats`` -> flops figure ``mfu``/``hfu`` divide: 2 x MACs or all-ops flops."""
    if flops == "contraction":
        return lambda stats: 2 * stats.macs
    if flops == "all":
        return lambda stats: stats.flops
    raise ValueError(f"flops must be one of {UTILISATION_FLOPS}, got {flops!r}")


def check_phase(phase: Optional[str]) -> None:
    if phase is not None and phase not in PHASES:
        raise ValueError(f"phase must be one of {tuple(p.value for p in PHASES)} or None (all "
                         f"phases), got {phase!r}")


def require_timing(profile: Profile, what: str) -> None:
    if not profile.timing:
        raise ValueError(f"{what} needs measured time: count with FlopCounter(..., "
                         f"timing=True) or dispatch_flops.measure(...)")


def device_of(profile: Profile, device: Optional[DeviceSpec] = None) -> DeviceSpec:
    """``device`` when given; else the built-in spec of the GPU the run was made on, or of
    the current GPU; ``ValueError`` naming the device and how to pass a spec."""
    if device is not None:
        if not isinstance(device, DeviceSpec):
            raise TypeError(f"device must be a DeviceSpec, got {type(device).__name__}")
        return device
    run = profile.run
    found = device_spec(run.device_name) if run.device_name else None
    if found is None:
        found = device_spec()
    if found is None:
        label = run.device_name or run.device or "cpu"
        raise ValueError(f"unknown device {label!r}: no built-in "
                         f"DeviceSpec for it (built in: {sorted(DEVICES)}); pass "
                         "device=DeviceSpec(name, {'bfloat16': flop_s}, bytes_s) or "
                         "DeviceSpec.cpu(flop_s, bytes_s)")
    return found


def roofline_by_operator(profile: Profile, device: Optional[DeviceSpec], dtype
                         ) -> dict[str, Roofline]:
    spec, dtype = device_of(profile, device), dtype or profile.dtype
    return {op: spec.roofline(stats, dtype) for op, stats in profile.by_operator().items()}


def roofline_by_module(profile: Profile, device: Optional[DeviceSpec], dtype
                       ) -> dict[str, Roofline]:
    spec, dtype = device_of(profile, device), dtype or profile.dtype
    return {name: spec.roofline(m.inclusive, dtype) for name, m in profile.by_module().items()}


def flops_by_dtype(profile: Profile, phases: Sequence[str], flops: str, model: bool = False
                   ) -> dict[tuple[Optional[str], bool], int]:
    """``{(dtype, contraction): flops}`` of ``phases``: ``contraction`` for rows of ops with
    MACs. ``model``: less the masked attention pairs' share (model flops, MFU's numerator;
    HFU's is what the kernels executed)."""
    flops_figure(flops)
    macs = ROW.index("macs")
    index = macs if flops == "contraction" else ROW.index("flops")
    masked = ROW.index("masked_macs" if flops == "contraction" else "masked_flops")
    scale = 2 if flops == "contraction" else 1
    out: dict[tuple[Optional[str], bool], int] = {}
    for key, counts in profile.rows:
        if key.phase in phases:
            n = scale * (counts[index] - counts[masked] if model else counts[index])
            if n:
                part = (key.dtype, counts[macs] > 0)
                out[part] = out.get(part, 0) + n
    return out


def _peak_dtype(profile: Profile, dtype: Optional[str], contraction: bool,
                spec: DeviceSpec) -> str:
    """The peak an op of compute ``dtype`` runs at: the model's dtype when unknown; fp32
    contractions at tf32 when allow_tf32 was on (and the device has tensor cores)."""
    dtype = dtype or profile.run.dtype
    if (dtype == "float32" and contraction and profile.run.allow_tf32
            and "tf32" in spec.peak_flops_by_dtype):
        return "tf32"
    return dtype


def _peaks_text(spec: DeviceSpec, per_peak: dict[str, int]) -> str:
    """MFU's denominator in words: one dtype's dense peak, or each dtype's (mixed)."""
    dtypes = sorted(per_peak, key=lambda d: -per_peak[d])
    scale, unit = (1e12, "TFLOPS") if min(map(spec.peak_flops, dtypes)) >= 1e12 else (
        1e9, "GFLOPS")

    def peak(d: str) -> str:
        return f"{spec.peak_flops(d) / scale:.4g}"

    if len(dtypes) == 1:
        d = dtypes[0]
        return f"{peak(d)} {unit} {_SHORT_DTYPES.get(d, d)} dense, {spec.name}"
    each = ", ".join(f"{_SHORT_DTYPES.get(d, d)} {peak(d)}" for d in dtypes)
    return f"per-op dtype peaks ({each} {unit} dense), {spec.name}"


def utilisation(profile: Profile, what: str, phases: Sequence[str],
                device: Optional[DeviceSpec], dtype, flops: str) -> tuple[float, str]:
    """``(utilisation, the denominator in words)`` of ``what`` ("mfu" or "hfu")."""
    flops_figure(flops)
    require_timing(profile, what)
    wall_s = profile.wall_s
    if not wall_s:
        raise ValueError(f"{what} needs a finished, timed block: read it after the block")
    spec = device_of(profile, device)
    by_dtype = flops_by_dtype(profile, phases, flops, model=what == "mfu")
    per_peak: dict[str, int] = {}
    if dtype is not None:  # one peak for every flop, as asked
        per_peak[dtype_name(dtype)] = sum(by_dtype.values())
    else:
        for (d, contraction), n in by_dtype.items():
            peak = _peak_dtype(profile, d, contraction, spec)
            per_peak[peak] = per_peak.get(peak, 0) + n
    if not per_peak:
        per_peak[_peak_dtype(profile, None, True, spec)] = 0
    seconds = sum(n / spec.peak_flops(d) for d, n in per_peak.items())
    devices = len(profile.ranks) or 1  # gathered: flops summed over ranks, wall the longest
    return seconds / (wall_s * devices), _peaks_text(spec, per_peak)


def utilisation_text(profile: Profile, what: str, phases: Sequence[str],
                     device: Optional[DeviceSpec], dtype, flops: str) -> str:
    """``utilisation`` in words, or why there is none."""
    flops_figure(flops)  # a bad ``flops`` is the caller's error, raised
    try:
        value, peaks = utilisation(profile, what, phases, device, dtype, flops)
    except ValueError as e:
        return f"no {what.upper()}: {e}"
    return f"{what.upper()} {100 * value:.1f} % of {peaks}"
