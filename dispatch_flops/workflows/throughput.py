"""``ThroughputMeter``: tokens/s, MFU and HFU of a training loop, timed on steps that are
not counted.

Counting a step slows it (every op goes through the dispatch mode: about 1.9x on a tiny
Llama), so the time of a counted step says little about the run. The meter counts a few steps
(every ``every``-th one, and any step whose input signature it has not priced yet) and only
times the others: a timed step runs with no counter (at most a forward pre-hook on the
model that notes its inputs' shapes), between two clock reads (two CUDA events on the current
stream on a GPU, read back lazily: no synchronisation per step; ``time.perf_counter``
otherwise). A timed step's flops are those of the last counted
step with the same input signature (the shapes and dtypes of its batch).

What is timed: from the step's start to its end, as its caller brackets it (``with
meter.step(batch):``, or a callback's step-begin and step-end hooks): forward, backward, the
optimizer, whatever runs between. Loading the next batch between steps is not timed.

The numerators, one function each (``step_model_flops``, ``step_hardware_flops``): model
flops are the counted step's forward + backward flops, every op's arithmetic
(``Profile.model_flops()``); hardware flops are every flop it executed, activation
recomputation, gradient clipping and the optimizer included (``Profile.hardware_flops()``).
The denominator is one declared peak: the device's dense peak for one dtype, so that

    mfu_all_ops = model_flops / (step_s * peak_flop_s)
    hfu_all_ops = hardware_flops / (step_s * peak_flop_s)

hold exactly for the figures the meter reports (and the callbacks log). They are named apart
from ``Profile.mfu()`` / ``hfu()``, the field's MFU: 2 x model MACs (contractions only), each op
at the peak of its own dtype. Both are right; they answer different questions (how busy every
op's arithmetic kept one peak, checkable by hand from a log line; how busy the contractions
kept the tensor cores), and on one H200 run read 17.9 % and 17.1 %. The old names ``mfu`` /
``hfu`` remain on the readings as deprecated aliases. docs/training.md has the whole story.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Iterator, Mapping, Optional

import torch
from torch import nn

from dispatch_flops.counter import FlopCounter
from dispatch_flops.results.profile import Profile
from dispatch_flops.results.roofline import DeviceSpec, DTypeLike, device_spec
from dispatch_flops.results.stats import check_int
from dispatch_flops.views.text import throughput_text

METRICS = ("model_flops", "hardware_flops", "tokens_per_s", "step_s", "mfu_all_ops",
           "hfu_all_ops", "peak_flop_s")
# the readings' old names: deprecated aliases (a DeprecationWarning names the new one)
RENAMED = {"mfu": "mfu_all_ops", "hfu": "hfu_all_ops"}
_STEP_FLOPS_KEPT = 256  # input signatures whose flops are kept (the least recently used go)
_HISTORY_KEPT = 4096  # timed steps kept in ``history`` (the totals count every one)
# frames of these packages are skipped to point a warning at the user's own call
_LIBRARIES = ("dispatch_flops", "transformers", "lightning", "pytorch_lightning", "torch",
              "accelerate", "contextlib")


def step_model_flops(profile: Profile) -> int:
    """``mfu_all_ops``' numerator for one counted step: forward + backward flops, every op's
    arithmetic. The one place that says what "model flops" are for the meter and the callbacks."""
    return profile.model_flops()


def step_hardware_flops(profile: Profile) -> int:
    """``hfu_all_ops``' numerator for one counted step: every flop executed (recompute,
    clipping and the optimizer too). The one place that says what "hardware flops" are."""
    return profile.hardware_flops()


def input_signature(value: Any) -> Any:
    """A hashable summary of a batch (or a model call's arguments) that decides whether two
    steps do the same work: every tensor's shape and dtype, the structure around them
    (mappings, lists, tuples and named tuples, dataclasses by their fields), flags (bools, a
    string, None) by value, a list of strings by its length (texts differ every step, their
    count is the batch); numbers by type (an int argument such as transformers'
    ``num_items_in_batch`` changes from step to step, not the work done); any other object is
    ``OPAQUE`` with its type: the meter cannot tell its steps apart (and says so)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, Mapping):
        return ("map",) + tuple((str(k), input_signature(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, str) for v in value):
            return ("strings", len(value))
        return (type(value).__name__,) + tuple(input_signature(v) for v in value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, complex)):
        return type(value).__name__
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and hasattr(value, "dtype"):  # a NumPy array and the like
        return ("array", shape, str(value.dtype))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,) + tuple(
            (f.name, input_signature(getattr(value, f.name))) for f in dataclasses.fields(value))
    return (OPAQUE, type(value).__name__)


OPAQUE = "opaque"  # in a signature: an object whose shapes the meter cannot see


def _opaque(signature: Any) -> Optional[str]:
    """The type name of the first object a signature could not see into, or None."""
    if isinstance(signature, tuple):
        if len(signature) == 2 and signature[0] == OPAQUE:
            return signature[1]
        for part in signature:
            found = _opaque(part)
            if found is not None:
                return found
    return None


def batch_tokens(value: Any) -> int:
    """Token ids in a batch: its ``input_ids``, else its first integer tensor's elements
    (searching dicts, lists and tuples in order); 0 when there is none."""
    if isinstance(value, torch.Tensor):
        return 0 if value.is_floating_point() or value.is_complex() else value.numel()
    if isinstance(value, Mapping):
        ids = value.get("input_ids")
        return batch_tokens(ids) if ids is not None else _first_tokens(value.values())
    if isinstance(value, (list, tuple)):
        return _first_tokens(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return batch_tokens(fields)
    return 0


def _first_tokens(values) -> int:
    for v in values:
        n = batch_tokens(v)
        if n:
            return n
    return 0


class _Rates:
    """tokens/s, all-ops MFU and HFU from a step time, its tokens and flops, and one peak: the
    same arithmetic for one step (``StepTiming``) and for their means (``ThroughputReading``).
    """

    step_s: float
    tokens: float
    model_flops: float
    hardware_flops: float
    peak_flop_s: Optional[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    @property
    def mfu_all_ops(self) -> Optional[float]:
        """Every op's model flops at one peak: ``model_flops / (step_s * peak_flop_s)``; not
        ``Profile.mfu()`` (2 x model MACs, each op at its dtype's peak)."""
        return None if self.peak_flop_s is None else \
            self.model_flops / (self.step_s * self.peak_flop_s)

    @property
    def hfu_all_ops(self) -> Optional[float]:
        """Every flop executed at one peak: ``hardware_flops / (step_s * peak_flop_s)``."""
        return None if self.peak_flop_s is None else \
            self.hardware_flops / (self.step_s * self.peak_flop_s)

    @property
    def mfu(self) -> Optional[float]:
        """Deprecated: ``mfu_all_ops`` (named apart from ``Profile.mfu()``)."""
        _renamed("mfu")
        return self.mfu_all_ops

    @property
    def hfu(self) -> Optional[float]:
        """Deprecated: ``hfu_all_ops`` (named apart from ``Profile.hfu()``)."""
        _renamed("hfu")
        return self.hfu_all_ops


def _renamed(old: str) -> None:
    warnings.warn(f"ThroughputReading.{old} / StepTiming.{old} is now {RENAMED[old]}: every "
                  f"op's flops at one peak, named apart from Profile.{old}() (2 x model MACs at "
                  f"each op's dtype peak); the logged key is {RENAMED[old]!r} too",
                  DeprecationWarning, stacklevel=3)


@dataclass(frozen=True)
class StepTiming(_Rates):
    """One timed (uncounted) step: its time and the flops of the last counted step with its
    input signature. ``mfu_all_ops`` / ``hfu_all_ops`` are ``None`` without a peak."""

    index: int  # the step's number, from 0 (warm-up steps included)
    step_s: float
    tokens: int
    model_flops: int
    hardware_flops: int
    peak_flop_s: Optional[float]


@dataclass(frozen=True)
class ThroughputReading(_Rates):
    """Timed steps summed up: means per step (``step_s``, ``model_flops``,
    ``hardware_flops``, ``tokens``), and from those very figures ``tokens_per_s = tokens /
    step_s``, ``mfu_all_ops = model_flops / (step_s * peak_flop_s)`` and ``hfu_all_ops``
    likewise, so a log line can be checked by hand. ``peak``: the peak in words (``None``,
    with ``mfu_all_ops`` and ``hfu_all_ops``, when there is none). ``counted_steps``: steps
    counted in the same stretch (their time is in no figure); ``unpriced_steps``: timed
    steps whose input signature was never counted (left out: no flops for them).

    >>> reading = meter.reading()
    >>> print(reading)   # 12 timed steps: 0.0213 s/step, ..., MFU (all ops, one peak) 41.3 % ...
    """

    steps: int
    step_s: float
    tokens: float
    model_flops: float
    hardware_flops: float
    peak_flop_s: Optional[float]
    peak: Optional[str]
    counted_steps: int
    unpriced_steps: int

    def metrics(self) -> dict[str, float]:
        """What a callback logs: ``model_flops``, ``hardware_flops``, ``tokens_per_s``,
        ``step_s`` and, with a peak, ``mfu_all_ops``, ``hfu_all_ops`` and ``peak_flop_s``
        (plain floats);
        ``tokens_per_s`` left out when the steps had no token ids (pass ``tokens=``)."""
        out = {"model_flops": float(self.model_flops),
               "hardware_flops": float(self.hardware_flops), "step_s": self.step_s}
        if self.tokens:  # no token ids (float inputs, tokens= not given): no figure, not 0.0
            out["tokens_per_s"] = self.tokens_per_s
        mfu, hfu = self.mfu_all_ops, self.hfu_all_ops
        if self.peak_flop_s is not None and mfu is not None and hfu is not None:
            out.update(mfu_all_ops=mfu, hfu_all_ops=hfu, peak_flop_s=self.peak_flop_s)
        return out

    def __str__(self) -> str:
        return throughput_text(self)


@dataclass(frozen=True)
class _StepFlops:
    model_flops: int
    hardware_flops: int


class _Totals:
    """Running sums over timed steps (exact integers for flops and tokens)."""

    def __init__(self) -> None:
        self.steps = self.tokens = self.model_flops = self.hardware_flops = 0
        self.seconds = 0.0
        self.counted = self.unpriced = 0

    def add(self, step: StepTiming) -> None:
        self.steps += 1
        self.seconds += step.step_s
        self.tokens += step.tokens
        self.model_flops += step.model_flops
        self.hardware_flops += step.hardware_flops


class ThroughputMeter:
    """Times training steps without counting them, and reports tokens/s, model and hardware
    flops per step, all-ops MFU and HFU (``mfu_all_ops``: every op's model flops at one
    peak, not ``Profile.mfu()``'s 2 x MACs at each dtype's) from those uncounted steps. A
    step is counted (a
    ``FlopCounter(model)`` around it, its time left out of every figure) when it is the first
    after ``warmup`` untouched ones, every ``every``-th step from there, and whenever its input
    signature (shapes and dtypes of its batch) has not been counted yet; every other step is
    timed only, and priced with the last counted step of the same signature.

    >>> meter = ThroughputMeter(model, device=DeviceSpec.cpu(1e11, 2e10), every=50)
    >>> for batch in loader:
    ...     with meter.step(batch):
    ...         model(**batch).loss.backward()
    ...         optimizer.step(); optimizer.zero_grad()
    >>> print(meter.reading())

    ``device``: the peaks (default: the current CUDA device's built-in spec; none on a CPU,
    where a warning says how to give one). ``dtype``: the dtype whose peak divides every flop
    (default: the dtype of most of the first counted step's contraction flops; fp32 at the
    tf32 peak when ``allow_tf32`` was on). A batch given to ``step``/``begin`` is the step's
    signature and tokens (``input_ids``, or its first integer tensor); without one, the
    model's inputs seen during the step are (a forward pre-hook, held only for the step).
    ``tokens=`` overrides the count. ``counting`` says whether the running step is counted;
    ``profile`` is the last counted step's ``Profile``; ``history`` the latest timed steps.
    """

    def __init__(self, model: Optional[nn.Module] = None, *, device: Optional[DeviceSpec] = None,
                 dtype: Optional[DTypeLike] = None, every: int = 100, warmup: int = 1):
        check_int("every", every, 1)
        check_int("warmup", warmup, 0)
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        if device is not None and not isinstance(device, DeviceSpec):
            raise ValueError(f"device must be a DeviceSpec or None, got {device!r}")
        if dtype is not None and device is not None:
            device.peak_flops(dtype)  # a dtype the device has no peak for: said now
        self.model, self.device, self.dtype = model, device, dtype
        self.every, self.warmup = every, warmup
        self.profile: Optional[Profile] = None  # the last counted step's
        self.history: deque[StepTiming] = deque(maxlen=_HISTORY_KEPT)
        self.peak_flop_s: Optional[float] = None
        self.peak: Optional[str] = None  # the peak in words, once known
        self._step_flops: OrderedDict[Any, _StepFlops] = OrderedDict()
        self._firsts: set = set()  # the first batch of every priced signature
        self._index = 0  # the next step's number
        self._open: Optional[dict] = None  # the running step
        self._recount = False  # a timed step had a signature never counted: count the next
        self._pending: deque = deque()  # CUDA steps whose events have not been read yet
        self._total, self._since = _Totals(), _Totals()
        self._peak_resolved = False
        self._warned: set[str] = set()
        self._clock = time.perf_counter
        self._early_peak()

    # -- the running step ----------------------------------------------------------------
    @property
    def counting(self) -> bool:
        """Whether the running step is a counted one."""
        return self._open is not None and self._open["counted"] and not self._open["untouched"]

    def should_count(self, batch: Any = None) -> bool:
        """Whether the next step would be counted (given its (first) batch, when known)."""
        i = self._index - self.warmup
        if i < 0:
            return False
        if i % self.every == 0 or self._recount:
            return True
        return batch is not None and input_signature(batch) not in self._firsts

    @contextmanager
    def step(self, batch: Any = None, *, tokens: Optional[int] = None) -> Iterator[None]:
        """One training step: counted or timed (see the class). A step that raises is
        left out."""
        self.begin(batch, tokens=tokens)
        try:
            yield
        except BaseException:
            self.abandon()
            raise
        self.end()

    def begin(self, batch: Any = None, *, tokens: Optional[int] = None) -> bool:
        """Start a step (``end`` finishes it); True when it is counted. For loops a
        ``with`` cannot wrap (callbacks)."""
        if self._open is not None:
            raise RuntimeError("ThroughputMeter.begin: a step is running; end() it first")
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                                   or tokens < 0):
            if not (isinstance(tokens, float) and math.isfinite(tokens) and tokens >= 0 and
                    tokens == int(tokens)):
                raise ValueError(f"tokens must be a non-negative whole number (the step's "
                                 f"tokens), got {tokens!r}")
            tokens = int(tokens)
        index = self._index
        untouched = index < self.warmup
        counted = not untouched and self.should_count(batch)
        self._index += 1
        step: dict = {"index": index, "untouched": untouched, "counter": None, "hook": None,
                      "parts": [], "tokens": 0, "given_tokens": tokens, "start": None,
                      "cuda": None, "counted": counted, "profiles": [], "segments": [],
                      "paused": False}
        self._open = step
        if untouched:
            return False
        if batch is not None:
            self.note(batch)
        elif self.model is not None:
            step["hook"] = self.model.register_forward_pre_hook(self._note_call,
                                                                with_kwargs=True)
        if counted:
            self._recount = False
            step["counter"] = FlopCounter(self.model)
            step["counter"].__enter__()
        else:
            step["cuda"] = self._cuda_device()
            step["start"] = self._read_clock(step["cuda"])
        return counted

    def pause(self) -> None:
        """Work that is not the step's begins inside it (a validation loop the trainer
        runs between two micro-batches): it is in neither the step's flops nor its time, until
        ``resume``. No step running, or paused already: nothing to do."""
        step = self._open
        if step is None or step["untouched"] or step["paused"]:
            return
        step["paused"] = True
        if step["hook"] is not None:  # the work's model calls are not the step's inputs
            step["hook"].remove()
            step["hook"] = True
        counter = step["counter"]
        if counter is not None:
            step["counter"] = None
            counter.__exit__(None, None, None)
            step["profiles"].append(counter.to_profile())
        elif step["start"] is not None:
            step["segments"].append((step["start"], self._read_clock(step["cuda"])))
            step["start"] = None

    def resume(self) -> None:
        """The step goes on after ``pause``."""
        step = self._open
        if step is None or not step["paused"]:
            return
        step["paused"] = False
        if step["hook"] is True and self.model is not None:
            step["hook"] = self.model.register_forward_pre_hook(self._note_call,
                                                                with_kwargs=True)
        if step["counted"]:
            step["counter"] = FlopCounter(self.model)
            step["counter"].__enter__()
        else:
            step["start"] = self._read_clock(step["cuda"])

    def note(self, batch: Any) -> None:
        """Add a (micro-)batch to the running step: its signature and tokens."""
        step = self._open
        if step is not None and not step["untouched"]:
            signature = input_signature(batch)
            step["parts"].append(signature)
            step["tokens"] += batch_tokens(batch)
            self._check_seen(signature)

    def _check_seen(self, signature: Any) -> None:
        opaque = _opaque(signature)
        if opaque is not None:
            self._warn("opaque", f"a batch holds a {opaque}, whose tensors the meter cannot "
                       "see: steps of different shapes look alike and are priced as one; "
                       "pass the step a mapping, tuple or dataclass of tensors (or tokens=)")

    def _note_call(self, module, args, kwargs) -> None:
        step = self._open
        if step is not None:
            signature = input_signature((args, kwargs))
            step["parts"].append(signature)
            self._check_seen(signature)
            ids = kwargs.get("input_ids", args[0] if args else None)
            step["tokens"] += batch_tokens(ids) if isinstance(ids, torch.Tensor) else 0

    def end(self) -> Optional[StepTiming]:
        """Finish the running step. A timed step's record (``None`` for a counted step, an
        untouched warm-up step, or a timed one whose inputs were never counted); on a GPU its
        time is read later, and this returns ``None`` too (see ``reading``)."""
        step, self._open = self._open, None
        if step is None or step["untouched"]:
            return None
        stop = self._read_clock(step["cuda"]) if step["start"] is not None else None
        if step["hook"] is not None and step["hook"] is not True:
            step["hook"].remove()
        signature = tuple(step["parts"])
        tokens = step["given_tokens"] if step["given_tokens"] is not None else step["tokens"]
        counter = step["counter"]
        if counter is not None:
            counter.__exit__(None, None, None)
            step["profiles"].append(counter.to_profile())
        if step["counted"]:
            self._counted_step(signature, *step["profiles"])
            return None
        if stop is not None:
            step["segments"].append((step["start"], stop))
        segments = step["segments"]
        if not segments:
            return None
        stop = segments[-1][1]
        price = self._step_flops.get(signature)
        if price is None:
            self._recount = True
            self._total.unpriced += 1
            self._since.unpriced += 1
            return None
        self._step_flops.move_to_end(signature)
        pending = (step["index"], segments, stop, tokens, price)
        if isinstance(stop, float):
            return self._add(pending)
        self._pending.append(pending)
        self._fold(wait=False)
        return None

    def abandon(self) -> None:
        """Drop the running step (training stopped or raised inside it): the counter is
        left and the hook removed; nothing is recorded."""
        step, self._open = self._open, None
        if step is None:
            return
        if step["hook"] is not None and step["hook"] is not True:
            step["hook"].remove()
        if step["counter"] is not None:
            try:
                step["counter"].__exit__(None, None, None)
            except Exception:
                pass

    # -- what was counted ------------------------------------------------------------------
    def _counted_step(self, signature: Any, profile: Profile, *more: Profile) -> None:
        """A counted step: ``profile`` (and ``more``, its parts after each ``pause``)."""
        parts = (profile,) + more
        self.profile = profile if not more else Profile.merge(parts)
        self._step_flops[signature] = _StepFlops(sum(map(step_model_flops, parts)),
                                         sum(map(step_hardware_flops, parts)))
        self._step_flops.move_to_end(signature)
        while len(self._step_flops) > _STEP_FLOPS_KEPT:
            self._step_flops.popitem(last=False)
        self._firsts = {key[0] for key in self._step_flops if key}
        self._total.counted += 1
        self._since.counted += 1
        if not self._peak_resolved:
            self._peak_resolved = True
            self._resolve_peak(profile)

    def _early_peak(self) -> None:
        """The peak known from the start when the device has one: at ``dtype``, else the
        model's parameter dtype. Without ``dtype`` the first counted step decides again
        (its main dtype); no step is timed before it, so every figure has one peak."""
        spec = self.device
        if spec is None and torch.cuda.is_available():
            try:
                spec = device_spec()
            except ValueError:
                return
        if spec is None:
            return
        dtype = self.dtype
        if dtype is None and self.model is not None:
            dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()),
                         None)
        try:
            self._set_peak(spec, dtype if dtype is not None else torch.float32)
        except ValueError:
            return
        self._peak_resolved = self.dtype is not None

    def _set_peak(self, spec: DeviceSpec, dtype: DTypeLike) -> None:
        self.peak_flop_s = spec.peak_flops(dtype)
        name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
        scale, unit = (1e12, "TFLOPS") if self.peak_flop_s >= 1e12 else (1e9, "GFLOPS")
        self.peak = f"{self.peak_flop_s / scale:.4g} {unit} {name} dense, {spec.name}"

    def _resolve_peak(self, profile: Profile) -> None:
        spec = self.device
        if spec is None:
            try:
                spec = device_spec()
            except ValueError as e:  # a GPU without a built-in spec
                self._warn("no-peak", f"no mfu_all_ops / hfu_all_ops: {e}")
                return
        if spec is None:
            self._warn("no-peak", "no mfu_all_ops / hfu_all_ops: no peak for this device (a "
                       "CPU, or a GPU without a built-in spec); pass "
                       "device=DeviceSpec.cpu(flop_s, bytes_s) with your CPU's figures, "
                       "device=DeviceSpec.calibrate() to measure them, "
                       "or device=DeviceSpec(name, {'bfloat16': flop_s}, bytes_s)")
            return
        dtype = self.dtype if self.dtype is not None else _main_dtype(profile, spec)
        try:
            self._set_peak(spec, dtype)
        except ValueError as e:
            self.peak_flop_s = self.peak = None
            self._warn("no-peak", f"no mfu_all_ops / hfu_all_ops: {e}; pass dtype=... (a "
                       "dtype it has)")

    # -- clocks ----------------------------------------------------------------------------
    def _cuda_device(self) -> Optional[torch.device]:
        if self.model is not None:
            for p in self.model.parameters():
                return p.device if p.device.type == "cuda" else None
        return torch.device("cuda", torch.cuda.current_device()) \
            if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def _read_clock(self, device: Optional[torch.device]) -> Any:
        """The host clock (seconds), or a CUDA event recorded on ``device``'s current stream
        (read when it has completed: no synchronisation here)."""
        if device is None:
            return self._clock()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event

    def _fold(self, wait: bool) -> None:
        """Read the CUDA steps whose end event has completed (all of them when ``wait``)."""
        while self._pending:
            stop = self._pending[0][2]
            if not wait and not stop.query():
                return
            if wait:
                stop.synchronize()
            self._add(self._pending.popleft())

    def _add(self, pending: tuple) -> StepTiming:
        index, segments, _, tokens, price = pending
        seconds = sum(stop - start if isinstance(stop, float) else
                      start.elapsed_time(stop) / 1e3 for start, stop in segments)
        step = StepTiming(index, seconds, tokens, price.model_flops, price.hardware_flops,
                          self.peak_flop_s)
        self.history.append(step)
        self._total.add(step)
        self._since.add(step)
        return step

    # -- readings --------------------------------------------------------------------------
    def reading(self) -> Optional[ThroughputReading]:
        """Every timed step so far, summed up (waits for a GPU's pending steps); ``None``
        before the first timed step."""
        self._fold(wait=True)
        return self._read(self._total)

    def window(self) -> Optional[ThroughputReading]:
        """The timed steps since the last ``take``, summed up; ``None`` when there is none."""
        self._fold(wait=True)
        return self._read(self._since)

    def take(self) -> Optional[ThroughputReading]:
        """``window()``, then a new window starts (a logger's reading at each write)."""
        reading, self._since = self.window(), _Totals()
        return reading

    def _read(self, totals: _Totals) -> Optional[ThroughputReading]:
        if not totals.steps or totals.seconds <= 0:
            return None
        n = totals.steps
        if not totals.tokens:
            self._warn("no-tokens", "no tokens/s: no step's batch had token ids (input_ids, "
                       "or an integer tensor: float inputs have none); pass the count, "
                       "meter.step(batch, tokens=n)")
        reading = ThroughputReading(
            steps=n, step_s=totals.seconds / n, tokens=totals.tokens / n,
            model_flops=totals.model_flops / n, hardware_flops=totals.hardware_flops / n,
            peak_flop_s=self.peak_flop_s, peak=self.peak, counted_steps=totals.counted,
            unpriced_steps=totals.unpriced)
        mfu = reading.mfu_all_ops
        if mfu is not None and mfu > 1:
            self._warn("above-1", f"mfu_all_ops {mfu:.3g} is above 100 % of {self.peak}: the "
                       "peak is too low for what ran (a figure for another dtype, a measured "
                       "peak below what the device reaches, a clock-throttled datasheet "
                       "figure), or the step's flops include work it did not time")
        return reading

    def _warn(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"dispatch_flops ThroughputMeter: {text}", RuntimeWarning,
                          stacklevel=_user_stacklevel())


def _main_dtype(profile: Profile, spec: DeviceSpec) -> str:
    """The dtype most of a step's contraction flops ran in (the model's when it has none);
    fp32 at the tf32 peak when ``allow_tf32`` was on and the device has one."""
    by_dtype = {d: n for d, n in profile.flops_by_dtype(flops="contraction").items() if d}
    dtype = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else \
        str(profile.dtype).removeprefix("torch.")
    if dtype == "float32" and profile.run.allow_tf32 and "tf32" in spec.peak_flops_by_dtype:
        return "tf32"
    return dtype


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points ``warnings.warn`` (called from the function calling
    this) at the first frame outside this package and the training libraries: the user's
    ``trainer.train()`` or loop."""
    frame: Optional[FrameType] = sys._getframe(2)
    level = 2
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not any(name == lib or name.startswith(lib + ".") for lib in _LIBRARIES):
            return level
        frame, level = frame.f_back, level + 1
    return 2
