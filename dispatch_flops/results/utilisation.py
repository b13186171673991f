"""A Profile against a device: its rooflines and MFU / HFU.

MFU divides each op's flops by the dense peak of its own compute dtype (fp32 contractions at
the tf32 peak when ``allow_tf32`` was on): time at peak = Σ flops / peak(dtype), MFU = time at
peak / wall time. ``ProfileViews.mfu`` documents the figure; this module computes it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

from dispatch_flops.results.protocols import ProfileLike
from dispatch_flops.results.roofline import (
    DEVICES,
    DeviceSpec,
    Roofline,
    device_spec,
    dtype_name,
    match_device,
)
from dispatch_flops.results.rows import ROW
from dispatch_flops.results.stats import PHASES, Stats

if TYPE_CHECKING:
    import torch

UTILISATION_FLOPS = ("contraction", "all")  # mfu/hfu numerators: 2 x MACs, or every op's
_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
                 "tf32": "tf32", "float8_e4m3fn": "fp8 e4m3", "float8_e5m2": "fp8 e5m2",
                 "float8_e4m3fnuz": "fp8 e4m3fnuz", "float8_e5m2fnuz": "fp8 e5m2fnuz",
                 "float4_e2m1fn_x2": "fp4", "int8": "int8"}
INTEGER_DTYPES = ("int8",)  # compute dtypes of integer contractions (``_int_mm``)


class UtilisationWarning(UserWarning):
    """An MFU or HFU above 1 (100 %): the run did more flops per second than the peak it is
    divided by, so the peak is wrong for it (see ``over_one``)."""


def over_one(value: float, spec: DeviceSpec, explicit_dtype: bool = False) -> str:
    """Why a utilisation above 1 cannot be right, and what to check: the likely causes,
    this spec's first."""
    causes = []
    if spec.source == "calibrated":
        causes.append("the calibrated peak is below what this run reached (calibrate with a "
                      "larger budget_s, or use the datasheet spec)")
    else:
        causes.append("the peak is too low for this device (another device's spec, or a "
                      "figure at base rather than boost clock)")
        causes.append("a sparse (2:4) datasheet figure where the run is dense, or the reverse: "
                      "take the dense one, half the sparse")
    causes.append("a wrong dtype for the peak (" + (
        "dtype= names a slower dtype than the ops ran in; leave it None for each op's own"
        if explicit_dtype else "check flops_by_dtype(): ops in a faster dtype than their "
        "peak's, e.g. fp8 or int8 counted at the bf16 peak") + ")")
    return (f"above 100 % ({value:.2f}x the peak): impossible, so the peak is wrong; likely "
            "causes: " + "; ".join(causes))


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


def require_timing(profile: ProfileLike, what: str) -> None:
    if not profile.timing:
        raise ValueError(f"{what} needs measured time: count with FlopCounter(..., "
                         f"timing=True) or dispatch_flops.measure(...)")


# what every device argument takes: a spec, a name (a key of DEVICES, or a GPU's name as
# torch.cuda.get_device_name() gives it) or a torch.device
DeviceLike = Union[DeviceSpec, str, "torch.device"]
_HOW = ("pass device=DeviceSpec(name, {'bfloat16': flop_s}, bytes_s) or "
        "DeviceSpec.cpu(flop_s, bytes_s), or measure this machine's peaks: "
        "device=DeviceSpec.calibrate() (docs/peaks.md)")


def as_spec(device: Optional[DeviceLike]) -> Optional[DeviceSpec]:
    """``device`` as a ``DeviceSpec``: a spec itself; a name, a key of ``DEVICES``
    ("H100-SXM") or a device's own ("NVIDIA H100 80GB HBM3"); a ``torch.device`` or its
    text ("cuda:0": that GPU's built-in spec); None stays None. ``ValueError`` for a device
    with no built-in spec, ``TypeError`` for anything else: every device argument reads it
    (``mfu``, ``hfu``, their texts, the rooflines, ``conventions``, the callbacks)."""
    import torch

    if device is None or isinstance(device, DeviceSpec):
        return device
    if isinstance(device, str):
        if device in DEVICES:
            return DEVICES[device]
        key, why = match_device(device)
        if key:
            return DEVICES[key]
        try:
            device = torch.device(device)  # "cuda:0", "cpu"
        except RuntimeError:
            raise ValueError(f"unknown device {device!r}: {why} (built in: "
                             f"{', '.join(DEVICES)}); {_HOW}") from None
    if isinstance(device, torch.device):
        spec = device_spec(device)
        if spec is None:
            raise ValueError(f"no built-in peaks for {device} (built in: GPUs only: "
                             f"{', '.join(DEVICES)}); {_HOW}")
        return spec
    raise TypeError(f"device must be a DeviceSpec, a device name (a key of DEVICES such as "
                    f"'H100-SXM', or torch.cuda.get_device_name()) or a torch.device, got "
                    f"{type(device).__name__}")


def elsewhere(profile: ProfileLike, spec: DeviceSpec) -> str:
    """What a figure against ``spec`` must say when the run was not made on that device: a
    GPU's datasheet peak for a run on the CPU (or another device type); "" otherwise."""
    ran_on = profile.run.device
    if spec.source == "datasheet" and ran_on and ran_on.split(":")[0] not in ("cuda", "meta"):
        return f"the run was on the {ran_on.upper() if ran_on == 'cpu' else ran_on}, " \
               f"not a {spec.name}"
    return ""


def device_of(profile: ProfileLike, device: Optional[DeviceLike] = None) -> DeviceSpec:
    """``device`` when given (a spec, a name or a torch.device: ``as_spec``); else the
    built-in spec of the GPU the run was made on (its recorded name), or of the current GPU
    (its name and properties); ``ValueError`` naming the device and how to pass or measure
    a spec, never another device's figures."""
    spec = as_spec(device)
    if spec is not None:
        return spec
    run = profile.run
    why = ""
    if run.device_name:
        key, why = match_device(run.device_name)
        if key:
            return DEVICES[key]
    current = _current_device()
    if current is not None:
        key, why_current = match_device(*current)
        if key:
            return DEVICES[key]
        why = why or why_current
    label = run.device_name or run.device or "cpu"
    raise ValueError(f"unknown device {label!r}: {why or 'no built-in DeviceSpec for it'} "
                     f"(built in: {', '.join(DEVICES)}); {_HOW}")


def _current_device() -> Optional[tuple]:
    """``(name, total memory, multiprocessors)`` of the current CUDA / ROCm device."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return (torch.cuda.get_device_name(), getattr(props, "total_memory", None),
            getattr(props, "multi_processor_count", None))


def roofline_by_operator(profile: ProfileLike, device: Optional[DeviceLike], dtype
                         ) -> dict[str, Roofline]:
    spec, dtype = device_of(profile, device), dtype or profile.dtype
    return {op: spec.roofline(stats, dtype) for op, stats in profile.by_operator().items()}


def roofline_by_module(profile: ProfileLike, device: Optional[DeviceLike], dtype
                       ) -> dict[str, Roofline]:
    spec, dtype = device_of(profile, device), dtype or profile.dtype
    return {name: spec.roofline(m.inclusive, dtype) for name, m in profile.by_module().items()}


def flops_by_dtype(profile: ProfileLike, phases: Sequence[str], flops: str, model: bool = False
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


def _peak_dtype(profile: ProfileLike, dtype: Optional[str], contraction: bool,
                spec: DeviceSpec) -> str:
    """The peak an op of compute ``dtype`` runs at: the model's dtype when unknown; fp32
    contractions at tf32 when allow_tf32 was on (and the device has tensor cores); integer
    element-wise work (no contraction) at the model's, as ops without a dtype."""
    if dtype in INTEGER_DTYPES and not contraction:
        dtype = None
    dtype = dtype or profile.run.dtype
    if (dtype == "float32" and contraction and profile.run.allow_tf32
            and "tf32" in spec.peak_flops_by_dtype):
        return "tf32"
    return dtype


def _peaks_in_words(spec: DeviceSpec, per_peak: dict[str, int]) -> str:
    """MFU's denominator in words: one dtype's dense peak, or each dtype's (mixed). A phrase
    that the warning above 1 and ``views.text.utilisation_text`` both quote."""
    dtypes = sorted(per_peak, key=lambda d: -per_peak[d])
    scale, unit = (1e12, "TFLOPS") if min(map(spec.peak_flops, dtypes)) >= 1e12 else (
        1e9, "GFLOPS")

    def peak(d: str) -> str:
        return f"{spec.peak_flops(d) / scale:.4g}"

    if spec.source == "datasheet":
        whose = f"{spec.name} datasheet"
    elif spec.source == "calibrated":
        whose = f"calibrated on {spec.name}"
        if spec.calibration is not None:  # how far to trust it
            spread = max(spec.calibration.spread.get(d, 0.0) for d in dtypes)
            whose += f" (spread {100 * spread:.0f} % over {spec.calibration.rounds} rounds)"
    else:
        whose = spec.name
    if len(dtypes) == 1:
        d = dtypes[0]
        return f"{peak(d)} {unit} {_SHORT_DTYPES.get(d, d)} dense, {whose}"
    each = ", ".join(f"{_SHORT_DTYPES.get(d, d)} {peak(d)}" for d in dtypes)
    return f"per-op dtype peaks ({each} {unit} dense), {whose}"


def utilisation(profile: ProfileLike, what: str, phases: Sequence[str],
                device: Optional[DeviceLike], dtype, flops: str) -> tuple[float, str]:
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
    words, other = _peaks_in_words(spec, per_peak), elsewhere(profile, spec)
    return seconds / (wall_s * devices), f"{words} ({other})" if other else words


def checked_utilisation(profile: ProfileLike, what: str, phases: Sequence[str],
                        device: Optional[DeviceLike], dtype, flops: str) -> float:
    """``utilisation``'s figure, with a ``UtilisationWarning`` when it is above 1."""
    value, peaks = utilisation(profile, what, phases, device, dtype, flops)
    if value > 1:
        spec = device_of(profile, device)
        warnings.warn(f"{what.upper()} {100 * value:.1f} % of {peaks} is "
                      f"{over_one(value, spec, dtype is not None)}", UtilisationWarning,
                      stacklevel=3)
    return value
