"""FlopCounter: the public entry point."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Optional

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from dispatch_flops.formulas import REGISTRY, Category, Registry

from ._meta import MetaRunner
from ._mode import CountingMode
from ._report import module_table
from ._results import (
    CATEGORIES,
    ESTIMATED,
    EXACT,
    FORWARD,
    MODEL_PHASES,
    NO_ARITHMETIC,
    PHASES,
    ROOT,
    UNSUPPORTED,
    Coverage,
    ModuleStats,
    OpRecord,
    Stats,
    frozen_mapping,
)
from ._roofline import DEVICES, DeviceSpec, Roofline, device_spec
from ._timing import Timer
from ._trace import TracingTimer
from ._tracker import ModuleTracker, shared_ledger

ATTENTION_MODES = ("dense", "causal")
SCHEMA_VERSION = 1  # of to_dict() / to_json(): docs/schema.md; bump on a breaking change
_CATEGORY_NAME = {
    Category.FORMULA: EXACT,
    Category.NO_ARITHMETIC: NO_ARITHMETIC,
    Category.ESTIMATED: ESTIMATED,
    Category.UNSUPPORTED: UNSUPPORTED,
}


def _check_phase(phase: Optional[str]) -> None:
    if phase is not None and phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES} or None (all phases), got {phase!r}")


class FlopCounter:
    """Counts the flops, MACs and bytes of every aten op run inside the block, attributed to
    the modules of ``model`` that ran them, forward and backward.

    >>> with FlopCounter(model) as fc:
    ...     model(x).sum().backward()
    >>> fc.total.flops, fc.by_module()["layers.0"].exclusive.macs
    >>> print(fc)  # the table

    ``attention="dense"`` (default) counts every (query, key) pair of attention;
    ``attention="causal"`` counts only the unmasked pairs when ``is_causal=True``.
    ``timing=True`` also measures latency: CUDA events around every CUDA op and module call
    (resolved with one synchronize when results are first read), ``perf_counter_ns`` on the
    CPU. For medians over warm repeats use ``dispatch_flops.profile``. ``trace=True`` (timing
    implied) also keeps when every op and module call started and ended, for
    ``to_chrome_trace``.
    Register custom formulas before entering the block.
    """

    def __init__(
        self,
        model: Optional[nn.Module] = None,
        *,
        attention: str = "dense",
        registry: Optional[Registry] = None,
        trace: bool = False,
        timing: bool = False,
        saved_activations: bool = False,
    ):
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        for flag, value in (("timing", timing), ("saved_activations", saved_activations)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be True or False, got {value!r}")
        self.saved_activations = saved_activations
        self.model = model
        self.attention = attention
        self.timing = timing
        self.registry = registry if registry is not None else REGISTRY
        self.root_label = type(model).__name__ if model is not None else "global"
        self._mode: Optional[CountingMode] = None
        self._tracker: Optional[ModuleTracker] = None
        self._active = False
        self._records: Optional[list[OpRecord]] = None
        self._params: Optional[dict[str, int]] = None
        self._timer: Optional[Timer] = None
        self._wall = [0]  # ns from entry to exit, when timing
        self._wall_start = None
        if not isinstance(trace, bool):
            raise TypeError(f"trace must be True or False, got {trace!r}")
        self.trace = trace  # a timeline: every op's and module call's start and end
        self.timing = timing or trace
        self.repeats = 1  # timed runs behind the latencies (``profile`` sets the median's)
        self._saved_hooks = None

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> "FlopCounter":
        if self._active:
            raise RuntimeError("this FlopCounter is already counting; nest a new FlopCounter")
        timer = (TracingTimer() if self.trace else Timer()) if self.timing else None
        runner = timer if timer is not None else MetaRunner() if self._on_meta() else None
        causal = self.attention == "causal"
        mode = CountingMode(self.registry, causal, runner)
        # frames and records are kept for the next counter on the same model (without a model
        # there is nothing to keep them with), unless times land in them after the block:
        # CUDA events resolved later, or a trace pointing at them
        shared = self.model is not None and (
            timer is None or (type(timer) is Timer and not timer.cuda))
        ledger = shared_ledger(self.registry.lookup_cache, self.model, causal) if shared \
            else None
        try:
            tracker = ModuleTracker(self.model, mode, timer, ledger)
            mode.bind(tracker)
            tracker.attach()
        except BaseException:
            if ledger is not None:
                ledger.busy = False
            raise
        saved_hooks = None
        try:
            mode.__enter__()
            if self.saved_activations:
                tracker.watch_saved()
                saved_hooks = saved_tensors_hooks(tracker.pack, tracker.unpack)
                try:
                    saved_hooks.__enter__()
                except BaseException:
                    mode.__exit__(None, None, None)
                    raise
        except BaseException:
            tracker.detach()
            tracker.close()
            raise
        self._saved_hooks = saved_hooks
        self._tracker, self._mode, self._active, self._records = tracker, mode, True, None
        self._timer, self._wall = timer, [0]
        if timer is not None:
            self._wall_start = timer.mark()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._saved_hooks is not None:
                self._saved_hooks.__exit__(exc_type, exc, tb)
                self._saved_hooks = None
            self._mode.__exit__(exc_type, exc, tb)
        finally:
            self._tracker.detach()
            self._tracker.close()
            if self._timer is not None:
                self._timer.span(self._wall, 0, self._wall_start, self._timer.mark())
            self._active = False
            self._records = None

    def _on_meta(self) -> bool:
        """Whether the model lives on the meta device (shape-only counting: see _meta)."""
        for p in self.model.parameters() if self.model is not None else ():
            return p.is_meta
        return False

    def _latency(self, ns: int) -> Optional[float]:
        return ns / 1e9 if self.timing else None

    @property
    def wall_s(self) -> Optional[float]:
        """Seconds from entering the block to leaving it (timing on), else ``None``."""
        if self._timer is None or self._active:
            return None
        self._timer.resolve()
        return self._wall[0] / 1e9

    def _param_counts(self) -> dict[str, int]:
        # read at report time, not on entry: counting is what must stay cheap
        if self._params is None:
            self._params = {} if self.model is None else {
                name: sum(p.numel() for p in module.parameters())
                for name, module in self.model.named_modules()
            }
        return self._params

    # -- raw records ----------------------------------------------------------------------
    def records(self) -> list[OpRecord]:
        """Every (module stack, phase, op overload) with its aggregated counts."""
        if self._mode is None:
            return []
        if self._records is not None:
            return list(self._records)
        mode = self._mode
        if self._timer is not None:
            self._timer.resolve()
        costs: dict[tuple, object] = {}  # one formula call per distinct signature
        records = []
        for frame in self._tracker.frames():
            for phase, acc in frame.accumulators():
                by_op: dict[int, list] = {}
                for key, (calls, flops, macs, read, written, ns, entry) in list(acc.items()):
                    if entry is not None:  # counted by signature, worked out here
                        op = key[0]
                        cost = costs.get(key)
                        if cost is None:
                            cost = costs[key] = mode.cost(op, entry)
                        flops, macs = calls * cost.flops, calls * cost.macs
                        read, written, key = calls * entry[1], calls * entry[2], op
                    total = by_op.get(key)
                    if total is None:
                        by_op[key] = [calls, flops, macs, read, written, ns]
                    else:
                        for i, value in enumerate((calls, flops, macs, read, written, ns)):
                            total[i] += value
                for key, counts in by_op.items():
                    func = mode.op(key)
                    records.append(
                        OpRecord(
                            module=frame.name,
                            stack=frame.stack,
                            phase=phase,
                            operator=str(func.overloadpacket),
                            overload=str(func),
                            category=_CATEGORY_NAME[mode.category(key)],
                            stats=Stats(*counts[:5], self._latency(counts[5])),
                        )
                    )
        if not self._active:
            self._records = records
        return list(records)

    # -- views ----------------------------------------------------------------------------
    @property
    def total(self) -> Stats:
        """Everything counted, all phases."""
        return sum((r.stats for r in self.records()), Stats())

    def by_phase(self) -> dict[str, Stats]:
        """``{"forward", "backward", "optimizer", "recompute": Stats}``."""
        out = {phase: Stats() for phase in PHASES}
        for r in self.records():
            out[r.phase] = out[r.phase] + r.stats
        return out

    def model_flops(self) -> int:
        """Forward + backward flops: what the model needs, recompute and optimizer not
        included (the numerator of MFU)."""
        phases = self.by_phase()
        return sum(phases[p].flops for p in MODEL_PHASES)

    def hardware_flops(self) -> int:
        """Every flop executed: forward, backward, recompute and optimizer (that of HFU)."""
        return self.total.flops

    def by_operator(self, phase: Optional[str] = None) -> dict[str, Stats]:
        """``{"aten.mm": Stats}`` over the whole run (or one phase)."""
        _check_phase(phase)
        out: dict[str, Stats] = defaultdict(Stats)
        for r in self.records():
            if phase is None or r.phase == phase:
                out[r.operator] = out[r.operator] + r.stats
        return dict(out)

    def by_module(self, phase: Optional[str] = None) -> dict[str, ModuleStats]:
        """``{name: ModuleStats}`` for every module that ran (names of ``named_modules()``;
        ``ROOT`` == "" is the root model, or everything when no model was given)."""
        _check_phase(phase)
        tracker = self._tracker
        calls = tracker.call_counts() if tracker is not None else {}
        inclusive: dict[str, Stats] = defaultdict(Stats)
        exclusive: dict[str, Stats] = defaultdict(Stats)
        operators: dict[str, dict[str, Stats]] = defaultdict(lambda: defaultdict(Stats))
        credited_cache: dict[tuple, set] = {}
        forward_op_s: dict[str, float] = {}
        for r in self.records():
            if phase is not None and r.phase != phase:
                continue
            exclusive[r.module] = exclusive[r.module] + r.stats
            credited = credited_cache.get(r.stack)
            if credited is None:
                credited = credited_cache[r.stack] = tracker.credited(r.stack, calls)
            for name in credited:
                inclusive[name] = inclusive[name] + r.stats
                operators[name][r.operator] = operators[name][r.operator] + r.stats
                if r.phase == FORWARD and r.stats.latency_s:
                    forward_op_s[name] = forward_op_s.get(name, 0.0) + r.stats.latency_s
        names = set(inclusive) | {n for n, c in calls.items() if c}
        if self.model is None or tracker is None:
            names.add(ROOT)
        saved: dict[str, int] = {}
        if self.saved_activations and phase in (None, FORWARD):
            for frame in tracker.frames():
                if frame.saved:
                    for name in tracker.credited(frame.stack, calls):
                        saved[name] = saved.get(name, 0) + frame.saved
        own_saved = {} if not saved else self._own_saved()
        if self.timing and phase in (None, FORWARD):
            # a called module's forward latency is its call spans, hook to hook (what its
            # caller waits for, Python between its ops included); backward stays the sum of
            # its ops' times. Spans replace the forward ops' times, never add to them.
            for name, span_ns in tracker.spans().items():
                stats = inclusive.get(name, Stats())
                latency = (stats.latency_s or 0.0) - forward_op_s.get(name, 0.0) + span_ns / 1e9
                inclusive[name] = replace(stats, latency_s=latency)
        return {
            name: ModuleStats(
                name=name,
                calls=calls.get(name, 0),
                params=self._param_counts().get(name, 0),
                inclusive=inclusive.get(name, Stats()),
                exclusive=exclusive.get(name, Stats()),
                by_operator=frozen_mapping(operators.get(name, {})),
                saved_bytes=saved.get(name, 0) if self.saved_activations else None,
                saved_bytes_exclusive=own_saved.get(name, 0) if self.saved_activations else None,
            )
            for name in self._ordered(names)
        }

    def _own_saved(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for frame in self._tracker.frames():
            out[frame.name] = out.get(frame.name, 0) + frame.saved
        return out

    def module_names(self) -> list[str]:
        """Module names in ``named_modules()`` order (the table's tree order)."""
        if self._tracker is None or not self._tracker.names:
            return [ROOT]
        return list(self._tracker.names)

    def _ordered(self, names: set) -> list[str]:
        order = {name: i for i, name in enumerate(self.module_names())}
        return sorted(names, key=lambda n: (order.get(n, len(order)), n))

    def _calls_in(self, category: str) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.records():
            if r.category == category:
                out[r.operator] += r.stats.calls
        return dict(out)

    def unsupported_ops(self) -> dict[str, int]:
        """``{"aten.foo": calls}`` for ops with no formula, no estimate, not declared zero-work:
        their bytes are counted, their flops are unknown."""
        return self._calls_in(UNSUPPORTED)

    def estimated_ops(self) -> dict[str, int]:
        """``{"aten.foo": calls}`` for ops priced by the family estimate of their tag
        (``torch.Tag.pointwise``: one flop per output element), not by a formula."""
        return self._calls_in(ESTIMATED)

    def coverage(self) -> Coverage:
        """Shares of the run's op calls, and of its bytes moved, priced by a formula, declared
        to do no arithmetic, estimated, or unknown."""
        calls = dict.fromkeys(CATEGORIES, 0)
        moved = dict.fromkeys(CATEGORIES, 0)
        for r in self.records():
            calls[r.category] += r.stats.calls
            moved[r.category] += r.stats.bytes_read + r.stats.bytes_written
        return Coverage(frozen_mapping(calls), frozen_mapping(moved))

    # -- timing views ---------------------------------------------------------------------
    def _require_timing(self, what: str) -> None:
        if not self.timing:
            raise ValueError(f"{what} needs measured time: count with FlopCounter(..., "
                             f"timing=True) or dispatch_flops.profile(...)")

    def top_ops_by_time(self, k: int = 10) -> list[tuple[str, Stats]]:
        """The ``k`` operators that took the most time, longest first."""
        self._require_timing("top_ops_by_time")
        ops = sorted(self.by_operator().items(), key=lambda item: -(item[1].latency_s or 0))
        return ops[:k]

    def top_modules_by_time(self, k: int = 10, *, inclusive: bool = False
                            ) -> list[tuple[str, ModuleStats]]:
        """The ``k`` modules that took the most time: by the time of the ops they ran
        directly (default), or by their inclusive latency (the root first, then its parts)."""
        self._require_timing("top_modules_by_time")

        def latency(m: ModuleStats) -> float:
            return (m.latency_s if inclusive else m.exclusive.latency_s) or 0.0

        return sorted(self.by_module().items(), key=lambda item: -latency(item[1]))[:k]

    def _device(self, device: Optional[DeviceSpec]) -> DeviceSpec:
        if device is not None:
            if not isinstance(device, DeviceSpec):
                raise TypeError(f"device must be a DeviceSpec, got {type(device).__name__}")
            return device
        found = device_spec()
        if found is None:
            raise ValueError("no built-in DeviceSpec for this device (built in: "
                             f"{sorted(DEVICES)}); pass device=DeviceSpec(name, "
                             "{'bfloat16': flop_s}, bytes_s) or DeviceSpec.cpu(flop_s, bytes_s)")
        return found

    def _dtype(self, dtype) -> torch.dtype:
        if dtype is not None:
            return dtype
        for p in self.model.parameters() if self.model is not None else ():
            if p.is_floating_point():
                return p.dtype
        return torch.float32

    def roofline_by_operator(self, device: Optional[DeviceSpec] = None, dtype=None
                             ) -> dict[str, Roofline]:
        """Each operator against ``device``'s roofs (the current GPU's built-in spec when
        None) at ``dtype`` (the model's parameter dtype when None)."""
        spec, dtype = self._device(device), self._dtype(dtype)
        return {op: spec.roofline(stats, dtype) for op, stats in self.by_operator().items()}

    def roofline_by_module(self, device: Optional[DeviceSpec] = None, dtype=None
                           ) -> dict[str, Roofline]:
        """Each module (inclusive) against ``device``'s roofs; see ``roofline_by_operator``."""
        spec, dtype = self._device(device), self._dtype(dtype)
        return {name: spec.roofline(m.inclusive, dtype) for name, m in self.by_module().items()}

    def mfu(self, device: Optional[DeviceSpec] = None, dtype=None) -> float:
        """Model flops utilisation: ``model_flops()`` / (wall time of the block x peak)."""
        return self._utilisation("mfu", self.model_flops(), device, dtype)

    def hfu(self, device: Optional[DeviceSpec] = None, dtype=None) -> float:
        """Hardware flops utilisation: ``hardware_flops()`` / (wall time x peak)."""
        return self._utilisation("hfu", self.hardware_flops(), device, dtype)

    def _utilisation(self, what: str, flops: int, device, dtype) -> float:
        self._require_timing(what)
        if not self.wall_s:
            raise ValueError(f"{what} needs a finished, timed block: read it after the block")
        return flops / (self.wall_s * self._device(device).peak_flops(self._dtype(dtype)))

    # -- output ---------------------------------------------------------------------------
    def table(self, depth: int = 2) -> str:
        """The module tree to ``depth`` (0 = root only) with human units and % of total."""
        return module_table(self, depth)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict:
        """Everything above as JSON-serialisable plain data."""
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.root_label,
            "attention": self.attention,
            "timing": self.timing,
            "repeats": self.repeats,
            "wall_s": self.wall_s,
            **self._run_info(),
            "total": self.total.to_dict(),
            "by_phase": {p: s.to_dict() for p, s in self.by_phase().items()},
            "model_flops": self.model_flops(),
            "hardware_flops": self.hardware_flops(),
            "by_module": {n: m.to_dict() for n, m in self.by_module().items()},
            "by_operator": {op: s.to_dict() for op, s in self.by_operator().items()},
            "unsupported_ops": self.unsupported_ops(),
            "estimated_ops": self.estimated_ops(),
            "coverage": self.coverage().to_dict(),
            "records": [r.to_dict() for r in self.records()],
        }

    # -- torch.utils.flop_counter.FlopCounterMode's surface ---------------------------------
    def get_total_flops(self) -> int:
        """Every flop counted, all phases (torch's ``FlopCounterMode.get_total_flops``)."""
        return self.total.flops

    def get_flop_counts(self) -> dict:
        """``{module: {op packet: flops}}`` as torch's ``FlopCounterMode`` keys them:
        ``"Global"`` for the whole run, the model's class name for the root, then
        ``"<class>.<module name>"``; inclusive, all phases, ops with flops only."""
        out = {}
        for name, m in self.by_module().items():
            counts = {_packet(op): s.flops for op, s in m.by_operator.items() if s.flops}
            if name == ROOT:
                out["Global"] = counts
                if self.model is None:
                    continue
            if counts:
                out[self.root_label + ("." + name if name else "")] = counts
        out.setdefault("Global", {})
        return out

    def get_table(self, depth: Optional[int] = None) -> str:
        """The module table, ``depth`` counted as torch's ``get_table`` counts it (1: the
        model, 2: its children; None: 2). ``table(depth)`` counts from 0 for the model."""
        return self.table(max((2 if depth is None else depth) - 1, 0))

    # -- export (dispatch_flops.export writes and reads these; see docs/schema.md) ---------
    def _run_info(self) -> dict:
        """What ``from_json`` needs besides the records: the model's dtype and device, and
        every module in tree order with its forward calls, parameters and call spans."""
        names = self.module_names()
        calls = self._tracker.call_counts() if self._tracker is not None else {}
        spans = self._tracker.spans() if self.timing and self._tracker is not None else {}
        params = self._param_counts()
        device = None if self.model is None else next(
            (p.device for p in self.model.parameters()), None)
        return {
            "dtype": str(self._dtype(None)).replace("torch.", ""),
            "device": device.type if device is not None else None,
            "device_name": torch.cuda.get_device_name(device)
            if device is not None and device.type == "cuda" else None,
            "has_model": self.model is not None,
            "modules": [
                {"name": name, "calls": calls.get(name, 0), "params": params.get(name, 0),
                 "forward_span_ns": spans.get(name)}
                for name in names
            ],
        }

    def to_json(self, path) -> None:
        """Write ``to_dict()`` as JSON (``schema_version`` 1, described in docs/schema.md);
        ``FlopCounter.from_json(path)`` reads it back."""
        from .export import write_json

        write_json(self, path)

    @classmethod
    def from_json(cls, path) -> "FlopCounter":
        """A finished counter read from ``to_json``'s file: every report, export and plot
        works on it (it cannot count again, nor give a trace)."""
        from .export import read_json

        return read_json(path)

    def to_csv(self, path) -> None:
        """One row per module x phase x operator (see ``dispatch_flops.export.COLUMNS``)."""
        from .export import write_csv

        write_csv(self, path)

    def to_dataframe(self):
        """The rows of ``to_csv`` as a pandas DataFrame (needs pandas)."""
        from .export import dataframe

        return dataframe(self)

    def to_chrome_trace(self, path) -> None:
        """Module calls and op calls on their timeline, as Trace Event Format JSON for
        Perfetto (ui.perfetto.dev) or chrome://tracing. Needs ``trace=True``."""
        from .export import write_chrome_trace

        write_chrome_trace(self, path)


def _packet(operator: str):
    """``"aten.mm"`` -> ``torch.ops.aten.mm``: the key torch's counter uses."""
    namespace, _, name = operator.partition(".")
    return getattr(getattr(torch.ops, namespace), name)
