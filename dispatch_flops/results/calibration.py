"""Measured peaks: ``DeviceSpec.calibrate()``, a device's achievable dense matmul flop/s per
dtype and streaming memory bandwidth, measured on this machine in a few seconds.

What it runs, within ``budget_s`` (default 5 s on a CPU, 10 s on a GPU, at most 30 s):

* bandwidth: ``dst.copy_(src)`` of a buffer far larger than the caches (a GPU: up to 1 GiB,
  an eighth of its memory at most; a CPU: 128 MiB), bytes read + written / time;
* each dtype: square ``a @ b`` (``torch._int_mm`` for int8, ``torch._scaled_mm`` for fp8)
  grown until one product takes a measurable time, then repeated; 2·n³ flops a product;
  on CUDA float32 runs with tf32 off and ``"tf32"`` with it on (the setting is restored).

Every figure is measured in ``ROUNDS`` rounds, each measuring all of them in turn (so a
machine that gets busy halfway is seen in every figure), and is the best repetition of all
rounds: what the device was seen to reach, the achievable peak (below a datasheet's, which
assumes boost clocks and perfect kernels). How far apart the rounds' bests lie is its
``spread`` (``Calibration``), with a ``CalibrationWarning`` above ``SPREAD_WARNED``: a
loaded machine, whose figures say little. GPU times come from CUDA events after a
synchronize; CPU ones from the host clock. Every run tries the same dtypes; one the device
does not run (an error, or a product slower than a thousandth of float32's) is left out,
with the reason in ``Calibration.left_out``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Union

import torch

MAX_BUDGET_S = 30.0
DEFAULT_BUDGET_S = {"cpu": 5.0, "gpu": 10.0}
_CPU_COPY_BYTES = 128 << 20
_GPU_COPY_BYTES = 1 << 30
ROUNDS = 3
SPREAD_WARNED = 0.25  # (best - worst) / best of the rounds' figures
BANDWIDTH = "bandwidth"  # the copy's key in Calibration.spread


class CalibrationWarning(UserWarning):
    """A calibration whose rounds disagree: the machine was busy, the figures are unsure."""


@dataclass(frozen=True)
class Calibration:
    """How a calibrated ``DeviceSpec``'s figures were measured: ``rounds``, each figure's
    ``spread`` over them ((best - worst) / best of each round's best; ``"bandwidth"`` for
    the copy; 0 after one round: a busy machine that spent the budget in the first gets no
    more, and ``rounds`` says so), and the dtypes ``left_out`` with the reason.

    >>> spec = DeviceSpec.calibrate()
    >>> spec.calibration.spread["float32"], spec.calibration.left_out
    """

    rounds: int
    spread: Mapping[str, float] = field(default_factory=dict)
    left_out: Mapping[str, str] = field(default_factory=dict)

    @property
    def largest_spread(self) -> float:
        return max(self.spread.values(), default=0.0)


def _resolve(device: Union[str, torch.device, None]) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"calibrate: device must be 'cpu', 'cuda' or 'cuda:N'; got "
                         f"{device!r} ({e})") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("calibrate: device 'cuda' asked, but no CUDA device is available "
                             "here; calibrate 'cpu', or run on the GPU you want measured")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    elif resolved.type != "cpu":
        raise ValueError(f"calibrate: device must be 'cpu', 'cuda' or 'cuda:N'; got "
                         f"{device!r}")
    return resolved


class _Clock:
    """Seconds one call of ``fn`` takes: CUDA events around it (then a synchronize) on a
    GPU, the host clock on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) / 1e3
        began = time.perf_counter()
        fn()
        return time.perf_counter() - began


def _best_rate(clock: _Clock, make: Callable[[int], tuple[Callable[[], object], float]],
               slice_s: float, sizes: tuple[int, int]) -> tuple[Optional[float], int]:
    """The best work / second of ``make(n)``'s call (``(call, work)``): ``n`` doubled from
    ``sizes[0]`` while a call stays short (up to ``sizes[1]``), then repeated until
    ``slice_s`` is spent; and the ``n`` it reached. ``None`` when the call fails on this
    device."""
    deadline = time.perf_counter() + slice_s
    n, best = sizes[0], 0.0
    try:
        call, work = make(n)
        call()  # warm-up: kernels picked, pages touched
        took = clock(call)
        best = work / took if took > 0 else 0.0
        # a doubled square product takes ~8x: grow while that stays within half the slice (a
        # small product is mostly overhead, and on a busy machine mostly waiting)
        while n * 2 <= sizes[1] and 8 * took < slice_s / 2 and time.perf_counter() < deadline:
            n *= 2
            call, work = make(n)
            call()
            took = clock(call)
            best = max(best, work / took if took > 0 else 0.0)
        while time.perf_counter() + took < deadline:
            took = clock(call)
            best = max(best, work / took if took > 0 else 0.0)
    except (RuntimeError, TypeError, NotImplementedError, ValueError):
        return None, n
    return best or None, n


def _matmuls(device: torch.device) -> dict[str, Callable[[int], tuple[Callable, float]]]:
    """What each dtype's product is: ``make(n) -> (call, flops)``."""

    def plain(dtype: torch.dtype):
        def make(n: int):
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            return (lambda: torch.mm(a, b)), 2.0 * n ** 3
        return make

    def int8(n: int):
        a = torch.randint(-8, 8, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-8, 8, (n, n), dtype=torch.int8, device=device)
        return (lambda: torch._int_mm(a, b)), 2.0 * n ** 3

    def fp8(n: int):
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major
        scale = torch.tensor(1.0, device=device)
        return (lambda: torch._scaled_mm(a, b, scale, scale, out_dtype=torch.bfloat16)), \
            2.0 * n ** 3

    makers = {"float32": plain(torch.float32), "bfloat16": plain(torch.bfloat16),
              "float16": plain(torch.float16), "float64": plain(torch.float64)}
    if device.type == "cuda":
        makers["tf32"] = plain(torch.float32)
    makers["int8"] = int8
    makers["float8_e4m3fn"] = fp8
    return makers


def calibrate(device: Union[str, torch.device, None], budget_s: Optional[float],
              name: Optional[str]
              ) -> tuple[str, dict[str, float], float, Optional[tuple], Calibration]:
    """``DeviceSpec.calibrate``'s measurements: ``(name, peaks, bandwidth, identity,
    calibration)``, ``identity`` the GPU's ``(name, total memory, multiprocessors)`` (None on
    a CPU)."""
    resolved = _resolve(device)
    kind = "gpu" if resolved.type == "cuda" else "cpu"
    if budget_s is None:
        budget_s = DEFAULT_BUDGET_S[kind]
    if not (isinstance(budget_s, (int, float)) and 0 < budget_s <= MAX_BUDGET_S):
        raise ValueError(f"calibrate: budget_s must be a number of seconds in (0, "
                         f"{MAX_BUDGET_S:g}], got {budget_s!r}")
    # on a thread of its own: the counters open on the caller's thread (their dispatch modes
    # are per thread) never see its kernels; the random numbers it draws come from a fork of
    # the global generators (the CPU's and the device's), which are left as they were
    result: dict = {}

    def measure() -> None:
        try:
            with torch.cuda.device(resolved) if kind == "gpu" else contextlib.nullcontext():
                result["value"] = _measure(resolved, kind, budget_s, name)
        except BaseException as e:  # handed to the caller
            result["error"] = e

    with torch.random.fork_rng(devices=[resolved.index] if kind == "gpu" else []):
        thread = threading.Thread(target=measure, name="dispatch_flops calibrate",
                                  daemon=True)
        thread.start()
        thread.join()
    if "error" in result:
        raise result["error"]
    calibration = result["value"][-1]
    if calibration.largest_spread > SPREAD_WARNED:
        # warned here, on the caller's thread: pointing at the caller's line, not threading's
        spread = calibration.spread
        worst = max(spread, key=lambda k: spread[k])
        warnings.warn(f"calibrate: the {calibration.rounds} rounds' figures disagree by up to "
                      f"{calibration.largest_spread:.0%} ({worst}): the machine is busy, so "
                      "these peaks are unsure; calibrate again on an idle machine, or pass "
                      "your own figures (DeviceSpec.cpu(...))", CalibrationWarning,
                      stacklevel=3)
    return result["value"]


def _measure(resolved: torch.device, kind: str, budget_s: float, name: Optional[str]
             ) -> tuple[str, dict[str, float], float, Optional[tuple], Calibration]:
    clock = _Clock(resolved)
    started = time.perf_counter()
    deadline = started + budget_s * 0.95  # set-up and the last repetition's overrun
    makers = _matmuls(resolved)
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    if kind == "gpu":
        total = torch.cuda.get_device_properties(resolved).total_memory
        nbytes = min(_GPU_COPY_BYTES, total // 8)
        sizes = (1024, 16384)
    else:
        nbytes, sizes = _CPU_COPY_BYTES, (256, 4096)

    def copy(_n: int):
        src = torch.empty(nbytes, dtype=torch.uint8, device=resolved)
        dst = torch.empty_like(src)
        src.fill_(1)
        return (lambda: dst.copy_(src)), 2.0 * nbytes  # read once, written once

    rates: dict[str, list] = {}  # figure -> each round's best
    reached: dict[str, tuple[int, int]] = {}  # figure -> sizes: grown in the first round only
    failed: set = set()
    items = [(BANDWIDTH, copy)] + list(makers.items())
    rounds = 0
    try:
        for round_ in range(ROUNDS):
            # the first round measures every figure whatever the time; a later one only
            # within the budget (a busy machine that overran it gets fewer rounds, said so)
            if round_ and time.perf_counter() >= deadline:
                break
            rounds += 1
            for done, (key, make) in enumerate(items):
                if key in failed:
                    continue
                left = max(deadline - time.perf_counter(), 0.0)
                slots = (ROUNDS - round_) * len(items) - done  # this one and those after it
                if kind == "gpu":
                    torch.backends.cuda.matmul.allow_tf32 = key == "tf32"
                rate, n = _best_rate(clock, make, left / slots,
                                     reached.get(key, (1, 1) if key == BANDWIDTH else sizes))
                reached[key] = (n, n)
                if rate is None:
                    failed.add(key)
                    continue
                rates.setdefault(key, []).append(rate)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    bandwidth = max(rates.get(BANDWIDTH, [0.0])) or None
    float32 = max(rates.get("float32", [0.0]))
    peaks: dict[str, float] = {}
    left_out: dict[str, str] = {}
    for dtype in makers:
        best = max(rates.get(dtype, [0.0]))
        if dtype in failed or not best:
            left_out[dtype] = "not run on this device (the product raised)"
        elif dtype != "float32" and best <= float32 / 1000:
            # emulated far below float32 (no kernel for it): no peak to divide by
            left_out[dtype] = f"emulated: {best / float32:.2g} x float32's rate"
        else:
            peaks[dtype] = best
    spread = {key: (max(r) - min(r)) / max(r) for key, r in rates.items()
              if key == BANDWIDTH or key in peaks}
    if not bandwidth or "float32" not in peaks:
        raise RuntimeError(f"calibrate: could not time a float32 matmul and a copy on "
                           f"{resolved} within {budget_s:g} s; give a larger budget_s")
    calibration = Calibration(rounds, spread, left_out)
    label = name or (torch.cuda.get_device_name(resolved) if kind == "gpu" else "cpu")
    identity = None
    if kind == "gpu":  # what names it in DEVICES, whose links it keeps (links are not timed)
        props = torch.cuda.get_device_properties(resolved)
        identity = (torch.cuda.get_device_name(resolved), props.total_memory,
                    props.multi_processor_count)
    return label, peaks, bandwidth, identity, calibration
