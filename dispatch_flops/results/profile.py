"""``Profile``: the immutable result of one or more runs, and every view of it.

A Profile is plain data: rows (one per module stack, phase and op overload, with their counts
in ``_records.ROW`` order), module facts (names in tree order, types, parameters, forward
calls, call spans, bytes saved for backward) and run facts (model, options, device, dtype,
wall time, steps, rank). A live ``FlopCounter`` makes one when its block ends
(``fc.to_profile()``); ``Profile.from_json`` reads one back; ``Profile.merge`` adds runs of the
same model (steps, ranks) and keeps the parts. Every view is computed from the rows once and
kept: a Profile never changes.

>>> with FlopCounter(model) as fc:
...     model(x).sum().backward()
>>> p = fc.to_profile()
>>> p.total.flops, p.by_module()["blocks.0"].exclusive.macs, print(p.table())
>>> Profile.merge([p, p]).per_step().total == p.total
True
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field, replace
from operator import add
from typing import Iterable, Optional

import torch

from dispatch_flops.compat.torch_getters import TorchCompat
from dispatch_flops.engine.records import ROW
from dispatch_flops.results.roofline import DEVICES, DeviceSpec, Roofline, device_spec
from dispatch_flops.results.stats import (
    BACKWARD,
    CATEGORIES,
    COUNTS,
    ESTIMATED,
    FORWARD,
    GLOBAL,
    MODEL_PHASES,
    PHASES,
    ROOT,
    UNSUPPORTED,
    Coverage,
    ModuleStats,
    OpRecord,
    Stats,
    credited,
    frozen_mapping,
)
from dispatch_flops.views import export
from dispatch_flops.views.table import module_table

SCHEMA_VERSION = 2  # of to_dict() / to_json(): docs/schema.md; bump on a breaking change


@dataclass(frozen=True)
class ModuleFacts:
    """What a run knew of the model's modules. ``names`` in ``named_modules()`` order (the
    root, ``""``, alone without a model); ``types`` and ``params`` parallel to it; ``calls``
    and ``spans`` (ns inside forward calls, timing on) by name; ``saved`` (bytes saved for
    backward, ``saved_activations=True``) by the module stack that saved them."""

    names: tuple = (ROOT,)
    types: tuple = ("",)
    params: tuple = (0,)
    calls: dict = field(default_factory=dict)
    spans: dict = field(default_factory=dict)
    saved: dict = field(default_factory=dict)
    # compiled graphs (torch.compile): {stack of the module that ran them: (runs, forward ns,
    # backward ns)} (ns with timing on), and the modules whose forward ran inside one (their
    # own time does not exist: the graph runs fused kernels; see Profile.in_graphs)
    graph_runs: dict = field(default_factory=dict)
    in_graphs: tuple = ()


@dataclass(frozen=True)
class RunFacts:
    """What a run was: the model's label, the counter's options, the device and dtype, the
    block's wall time (timing on), the steps it holds (``merge`` adds them), and the rank and
    world size (``None`` outside ``torch.distributed``). ``dtensor_ops``: the DTensor-level
    calls the rank's counts unwrap, at their global (logical) shapes: ``(overload, shapes,
    calls, flops, macs)`` each (see ``Profile.logical``)."""

    model: str = GLOBAL  # the root's label: the model's class name
    has_model: bool = False
    attention: str = "dense"
    timing: bool = False
    saved_activations: bool = False
    repeats: int = 1
    wall_s: Optional[float] = None
    steps: int = 1
    dtype: str = "float32"
    device: Optional[str] = None
    device_name: Optional[str] = None
    rank: Optional[int] = None
    world_size: Optional[int] = None
    # formulas that failed on some call (their calls are reported unsupported), one line each
    pricing_errors: tuple = ()
    dtensor_ops: tuple = ()
    # torch.backends.cuda.matmul.allow_tf32 when the block began: fp32 matmuls run on tf32
    # tensor cores, and MFU divides their flops by the tf32 peak
    allow_tf32: bool = False


def _accumulate(into: dict, key, counts: tuple) -> None:
    total = into.get(key)
    into[key] = list(counts) if total is None else list(map(add, total, counts))


def _graph_phase_ns(forward: int, backward: int, phase: Optional[str]) -> int:
    """ns of a compiled graph's runs (``forward`` and ``backward`` ns) in ``phase`` (None:
    all)."""
    return (forward if phase in (None, FORWARD) else 0) + \
        (backward if phase in (None, BACKWARD) else 0)


def _check_phase(phase: Optional[str]) -> None:
    if phase is not None and phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES} or None (all phases), got {phase!r}")


UTILISATION_FLOPS = ("contraction", "all")  # mfu/hfu numerators: 2 x MACs, or every op's


def _flops_figure(flops: str):
    """The ``Stats`` -> flops figure ``mfu``/``hfu`` divide: 2 x MACs or all-ops flops."""
    if flops == "contraction":
        return lambda stats: 2 * stats.macs
    if flops == "all":
        return lambda stats: stats.flops
    raise ValueError(f"flops must be one of {UTILISATION_FLOPS}, got {flops!r}")


_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
                 "tf32": "tf32", "float8_e4m3fn": "fp8 e4m3", "float8_e5m2": "fp8 e5m2"}


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _peaks_text(spec: DeviceSpec, per_peak: dict) -> str:
    """MFU's denominator in words: one dtype's dense peak, or each dtype's (mixed)."""
    dtypes = sorted(per_peak, key=lambda d: -per_peak[d])
    scale, unit = (1e12, "TFLOPS") if min(map(spec.peak_flops, dtypes)) >= 1e12 else (
        1e9, "GFLOPS")

    def peak(d):
        return f"{spec.peak_flops(d) / scale:.4g}"

    if len(dtypes) == 1:
        d = dtypes[0]
        return f"{peak(d)} {unit} {_SHORT_DTYPES.get(d, d)} dense, {spec.name}"
    each = ", ".join(f"{_SHORT_DTYPES.get(d, d)} {peak(d)}" for d in dtypes)
    return f"per-op dtype peaks ({each} {unit} dense), {spec.name}"


def as_profile(run) -> "Profile":
    """A Profile, or a counter's (``to_profile()``)."""
    if isinstance(run, Profile):
        return run
    to_profile = getattr(run, "to_profile", None)
    if to_profile is None:
        raise TypeError(f"expected a Profile or a FlopCounter, got {type(run).__name__}")
    return to_profile()


class Profile(TorchCompat):
    """The result of one or more runs: every view, export and plot reads one. See the
    module's docstring; make one with ``FlopCounter.to_profile()``, ``Profile.from_json`` or
    ``Profile.merge``."""

    def __init__(self, rows: Iterable[tuple], module_facts: ModuleFacts, run: RunFacts, *,
                 parts: tuple = (), trace: Optional[tuple] = None,
                 views: Optional[dict] = None, ranks: tuple = ()):
        self._rows = tuple(rows)
        self.module_facts = module_facts
        self.run = run
        self.parts = tuple(parts)  # the Profiles merged into this one, in order
        # gathered from ranks (dispatch_flops.distributed.gather): each rank's, in rank order
        self.ranks = tuple(ranks)
        self._trace = trace  # (events, dropped) of a run counted with trace=True
        # views computed so far; a harvest whose rows and facts equal the last one's shares
        # them (the same data gives the same views)
        self._views: dict = {} if views is None else views

    # -- run facts --------------------------------------------------------------------------
    @property
    def timing(self) -> bool:
        return self.run.timing

    @property
    def attention(self) -> str:
        return self.run.attention

    @property
    def repeats(self) -> int:
        return self.run.repeats

    @property
    def steps(self) -> int:
        return self.run.steps

    @property
    def wall_s(self) -> Optional[float]:
        """Seconds the block(s) took (timing on), else ``None``."""
        return self.run.wall_s

    @property
    def root_label(self) -> str:
        """The root's name in tables: the model's class name, "global" without a model."""
        return self.run.model

    @property
    def has_model(self) -> bool:
        return self.run.has_model

    @property
    def saved_activations(self) -> bool:
        return self.run.saved_activations

    @property
    def dtype(self) -> torch.dtype:
        """The model's parameter dtype (float32 without a model)."""
        return getattr(torch, self.run.dtype, torch.float32)

    def __enter__(self):
        raise RuntimeError("a Profile holds a finished run and cannot count; count with a new "
                           "FlopCounter")

    def __exit__(self, *exc) -> None:
        pass

    def __repr__(self) -> str:
        total = self.total
        return (f"Profile({self.root_label}, {len(self.module_facts.names)} modules, "
                f"{total.calls} op calls, {total.flops} flops, steps={self.steps})")

    def _cached(self, key, compute):
        value = self._views.get(key)
        if value is None:
            value = self._views[key] = compute()
        return value

    # -- records and sums -------------------------------------------------------------------
    def records(self) -> list[OpRecord]:
        """Every (module stack, phase, op overload) with its counts."""
        timed = self.timing
        return list(self._cached("records", lambda: tuple(
            OpRecord(module=stack[-1], stack=stack, phase=phase, operator=operator,
                     overload=overload, category=category,
                     stats=Stats.of(counts[:-1], counts[-1], timed), dtype=dtype)
            for (stack, phase, operator, overload, category, dtype), counts in self._rows)))

    def _sum(self, keep, graph_ns: int = 0) -> Stats:
        total = [0] * len(ROW)
        for key, counts in self._rows:
            if keep(key):
                total = list(map(add, total, counts))
        return Stats.of(total[:-1], total[-1] + graph_ns, self.timing)

    def _graph_ns(self, phase: Optional[str]) -> int:
        """ns of the compiled graphs' runs in ``phase`` (all phases: None)."""
        return sum(_graph_phase_ns(forward, backward, phase)
                   for _, forward, backward in self.module_facts.graph_runs.values())

    @property
    def total(self) -> Stats:
        """Everything counted, all phases."""
        return self._cached("total", lambda: self._sum(lambda key: True, self._graph_ns(None)))

    def by_phase(self) -> dict[str, Stats]:
        """``{phase: Stats}`` for every phase of ``PHASES``."""
        return dict(self._cached("phases", lambda: {
            p: self._sum(lambda key, p=p: key[1] == p, self._graph_ns(p)) for p in PHASES}))

    @property
    def in_graphs(self) -> tuple:
        """Names of the modules whose forward ran inside a compiled graph (``torch.compile``):
        their counts are exact, but they have no time of their own (``latency_s`` is None):
        the graph runs fused kernels and is timed whole, in the time of the module that ran
        it (see ``graph_runs``)."""
        return self.module_facts.in_graphs

    @property
    def graph_runs(self) -> dict:
        """``{stack of the module that ran them: (runs, forward s, backward s)}`` of the
        compiled graphs run (seconds None without timing)."""
        timed = self.timing
        return {stack: (runs, forward / 1e9 if timed else None,
                        backward / 1e9 if timed else None)
                for stack, (runs, forward, backward) in self.module_facts.graph_runs.items()}

    def model_flops(self) -> int:
        """Forward + backward flops: what the model needs, recompute and optimizer not
        included (the numerator of MFU)."""
        phases = self.by_phase()
        return sum(phases[p].flops for p in MODEL_PHASES)

    @property
    def logical(self) -> Stats:
        """The DTensor-level calls at their global shapes (calls, flops, MACs): the figure of
        the unsharded program, which this rank's counts split into local shard work and
        collectives. Zero without DTensors."""
        ops = self.run.dtensor_ops
        return Stats(calls=sum(o[2] for o in ops), flops=sum(o[3] for o in ops),
                     macs=sum(o[4] for o in ops))

    def imbalance(self, phase: Optional[str] = None) -> dict[str, dict[str, tuple]]:
        """Over the gathered ranks, per module: ``{"flops" | "comm_bytes" | "latency_s":
        (min, mean, max)}`` of its inclusive counts (latency only when timed). ``ValueError``
        on a Profile that was not gathered (``dispatch_flops.distributed.gather``)."""
        if not self.ranks:
            raise ValueError("imbalance needs a gathered Profile: dispatch_flops.distributed"
                             ".gather(fc) on every rank")
        per_rank = [r.by_module(phase) for r in self.ranks]
        metrics = ("flops", "comm_bytes") + (("latency_s",) if self.timing else ())
        out = {}
        for name in self.by_module(phase):
            row = {}
            for metric in metrics:
                values = [getattr(m[name], metric) or 0 if name in m else 0 for m in per_rank]
                row[metric] = (min(values), sum(values) / len(values), max(values))
            out[name] = row
        return out

    def hardware_flops(self) -> int:
        """Every flop executed: forward, backward, recompute and optimizer (that of HFU)."""
        return self.total.flops

    def by_operator(self, phase: Optional[str] = None) -> dict[str, Stats]:
        """``{"aten.mm": Stats}`` over the whole run (or one phase)."""
        _check_phase(phase)

        def compute():
            sums: dict[str, list] = {}
            for (_, p, operator, _, _, _), counts in self._rows:
                if phase is None or p == phase:
                    _accumulate(sums, operator, counts)
            return {op: Stats.of(t[:-1], t[-1], self.timing) for op, t in sums.items()}

        return dict(self._cached(("operators", phase), compute))

    def module_names(self) -> list[str]:
        """Module names in ``named_modules()`` order (the table's tree order)."""
        return list(self.module_facts.names)

    def module_types(self) -> dict[str, str]:
        """``{name: class name}`` of every module."""
        return dict(zip(self.module_facts.names, self.module_facts.types))

    def by_module(self, phase: Optional[str] = None) -> dict[str, ModuleStats]:
        """``{name: ModuleStats}`` for every module that ran (names of ``named_modules()``;
        ``ROOT`` == "" is the root model, or everything when no model was given)."""
        _check_phase(phase)
        return dict(self._cached(("modules", phase), lambda: self._modules(phase)))

    def _modules(self, phase: Optional[str]) -> dict[str, ModuleStats]:
        facts, timed = self.module_facts, self.timing
        calls = facts.calls
        inclusive: dict[str, list] = {}
        exclusive: dict[str, list] = {}
        operators: dict[str, dict] = {}
        forward_ns: dict[str, int] = {}
        credits: dict[tuple, set] = {}
        for (stack, p, operator, _, _, _), counts in self._rows:
            if phase is not None and p != phase:
                continue
            _accumulate(exclusive, stack[-1], counts)
            names = credits.get(stack)
            if names is None:
                names = credits[stack] = credited(stack, calls)
            for name in names:
                _accumulate(inclusive, name, counts)
                _accumulate(operators.setdefault(name, {}), operator, counts)
                if p == FORWARD:
                    forward_ns[name] = forward_ns.get(name, 0) + counts[-1]
        if timed:
            # a compiled graph's runs are timed whole: their time is the time of the module
            # that ran them (and its callers), as an op's would be
            for stack, (_, forward, backward) in facts.graph_runs.items():
                ns = _graph_phase_ns(forward, backward, phase)
                if not ns:
                    continue
                only_time = (0,) * (len(ROW) - 1) + (ns,)
                _accumulate(exclusive, stack[-1], only_time)
                for name in credited(stack, calls):
                    _accumulate(inclusive, name, only_time)
                    if phase in (None, FORWARD):
                        forward_ns[name] = forward_ns.get(name, 0) + forward
        if timed and phase in (None, FORWARD):
            # a called module's forward latency is its call spans, hook to hook (what its
            # caller waits for, Python between its ops included); backward stays the sum of
            # its ops' times. Spans replace the forward ops' times, never add to them.
            for name, span_ns in facts.spans.items():
                total = inclusive.setdefault(name, [0] * len(ROW))
                total[-1] += span_ns - forward_ns.get(name, 0)
        saved: dict[str, int] = {}
        own_saved: dict[str, int] = {}
        if self.saved_activations and phase in (None, FORWARD):
            for stack, n in facts.saved.items():
                own_saved[stack[-1]] = own_saved.get(stack[-1], 0) + n
                for name in credited(stack, calls):
                    saved[name] = saved.get(name, 0) + n
        names = set(inclusive) | {n for n, c in calls.items() if c}
        if not self.has_model:
            names.add(ROOT)
        params = dict(zip(facts.names, facts.params))
        order = {name: i for i, name in enumerate(facts.names)}
        zero = (0,) * len(ROW)

        def stats(counts, has_time=timed) -> Stats:
            return Stats.of(counts[:-1], counts[-1], has_time)

        with_saved = self.saved_activations
        # a module run inside a compiled graph has no time of its own (None, not a zero)
        in_graphs = set(facts.in_graphs)
        return {
            name: ModuleStats(
                name=name,
                calls=calls.get(name, 0),
                params=params.get(name, 0),
                inclusive=stats(inclusive.get(name, zero), timed and name not in in_graphs),
                exclusive=stats(exclusive.get(name, zero), timed and name not in in_graphs),
                by_operator=frozen_mapping({op: stats(c)
                                            for op, c in operators.get(name, {}).items()}),
                saved_bytes=saved.get(name, 0) if with_saved else None,
                saved_bytes_exclusive=own_saved.get(name, 0) if with_saved else None,
            )
            for name in sorted(names, key=lambda n: (order.get(n, len(order)), n))
        }

    def _calls_in(self, category: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for (_, _, operator, _, c, _), counts in self._rows:
            if c == category:
                out[operator] = out.get(operator, 0) + counts[0]
        return out

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
        read, written = COUNTS.index("bytes_read"), COUNTS.index("bytes_written")
        for key, counts in self._rows:
            calls[key[4]] += counts[0]
            moved[key[4]] += counts[read] + counts[written]
        return Coverage(frozen_mapping(calls), frozen_mapping(moved))

    # -- time -------------------------------------------------------------------------------
    def _require_timing(self, what: str) -> None:
        if not self.timing:
            raise ValueError(f"{what} needs measured time: count with FlopCounter(..., "
                             f"timing=True) or dispatch_flops.profile(...)")

    def top_ops_by_time(self, k: int = 10) -> list[tuple[str, Stats]]:
        """The ``k`` operators that took the most time, longest first; operators with no time
        of their own (run only inside compiled graphs, timed whole) are left out."""
        self._require_timing("top_ops_by_time")
        timed = [item for item in self.by_operator().items() if item[1].latency_s]
        return sorted(timed, key=lambda item: -item[1].latency_s)[:k]

    def top_modules_by_time(self, k: int = 10, *, inclusive: bool = False
                            ) -> list[tuple[str, ModuleStats]]:
        """The ``k`` modules that took the most time: by the time of the ops they ran
        directly (default), or by their inclusive latency (the root first, then its parts)."""
        self._require_timing("top_modules_by_time")

        def latency(m: ModuleStats) -> float:
            return (m.latency_s if inclusive else m.exclusive.latency_s) or 0.0

        return sorted(self.by_module().items(), key=lambda item: -latency(item[1]))[:k]

    # -- roofline ---------------------------------------------------------------------------
    def device(self, device: Optional[DeviceSpec] = None) -> DeviceSpec:
        """``device`` when given; else the built-in spec of the GPU the run was made on, or of
        the current GPU. ``ValueError`` when there is none, naming the device and how to
        pass a ``DeviceSpec``."""
        if device is not None:
            if not isinstance(device, DeviceSpec):
                raise TypeError(f"device must be a DeviceSpec, got {type(device).__name__}")
            return device
        found = device_spec(self.run.device_name) if self.run.device_name else None
        if found is None:
            found = device_spec()
        if found is None:
            raise ValueError(f"unknown device {self._device_label()!r}: no built-in "
                             f"DeviceSpec for it (built in: {sorted(DEVICES)}); pass "
                             "device=DeviceSpec(name, {'bfloat16': flop_s}, bytes_s) or "
                             "DeviceSpec.cpu(flop_s, bytes_s)")
        return found

    def _device_label(self) -> str:
        return self.run.device_name or self.run.device or "cpu"

    def roofline_by_operator(self, device: Optional[DeviceSpec] = None, dtype=None
                             ) -> dict[str, Roofline]:
        """Each operator against ``device``'s roofs (see ``device``) at ``dtype`` (the
        model's parameter dtype when None)."""
        spec, dtype = self.device(device), dtype or self.dtype
        return {op: spec.roofline(stats, dtype) for op, stats in self.by_operator().items()}

    def roofline_by_module(self, device: Optional[DeviceSpec] = None, dtype=None
                           ) -> dict[str, Roofline]:
        """Each module (inclusive) against ``device``'s roofs; see ``roofline_by_operator``."""
        spec, dtype = self.device(device), dtype or self.dtype
        return {name: spec.roofline(m.inclusive, dtype) for name, m in self.by_module().items()}

    def mfu(self, device: Optional[DeviceSpec] = None, dtype=None, *,
            flops: str = "contraction") -> float:
        """Model flops utilisation: the time forward + backward flops take at peak / the wall
        time of the block. Each op's flops run at the dense peak of its own compute dtype
        (its first floating-point argument's: bf16, fp16, fp8, fp32; fp32 contractions at
        the tf32 peak when ``torch.backends.cuda.matmul.allow_tf32`` was on), so a run
        mixing dtypes is divided fairly; ``dtype=`` divides every flop by that one dtype's
        peak instead. ``flops="contraction"`` (default): 2 x MACs, the field's model flops
        (PaLM, Megatron, torchtitan count the contractions); ``flops="all"``:
        ``model_flops()``, every op's arithmetic (element-wise work too). ``ValueError`` on
        an untimed run, an unknown device (pass ``device=DeviceSpec(...)``) or a dtype the
        device has no peak for; ``mfu_text`` says which instead of raising."""
        return self._utilisation("mfu", MODEL_PHASES, device, dtype, flops)[0]

    def hfu(self, device: Optional[DeviceSpec] = None, dtype=None, *,
            flops: str = "contraction") -> float:
        """Hardware flops utilisation: every flop executed (recompute and optimizer too) at
        the peak of its dtype / wall time; as ``mfu`` (``"all"``: ``hardware_flops()``)."""
        return self._utilisation("hfu", PHASES, device, dtype, flops)[0]

    def mfu_text(self, device: Optional[DeviceSpec] = None, dtype=None, *,
                 flops: str = "contraction") -> str:
        """MFU with its denominator, as printed: ``"MFU 41.3 % of 989.4 TFLOPS bf16 dense,
        H100-SXM"`` (``"... of per-op dtype peaks (bf16 989.4, fp32 66.9 TFLOPS dense)
        ..."`` for mixed dtypes), or why there is none: ``"no MFU: unknown device 'cpu'
        (...)"``."""
        return self._utilisation_text("mfu", MODEL_PHASES, device, dtype, flops)

    def hfu_text(self, device: Optional[DeviceSpec] = None, dtype=None, *,
                 flops: str = "contraction") -> str:
        """HFU with its denominator, or why there is none; see ``mfu_text``."""
        return self._utilisation_text("hfu", PHASES, device, dtype, flops)

    def _utilisation_text(self, what: str, phases, device, dtype, flops: str) -> str:
        _flops_figure(flops)  # a bad ``flops`` is the caller's error, raised
        try:
            value, peaks = self._utilisation(what, phases, device, dtype, flops)
        except ValueError as e:
            return f"no {what.upper()}: {e}"
        return f"{what.upper()} {100 * value:.1f} % of {peaks}"

    def flops_by_dtype(self, phase: Optional[str] = None, *,
                       flops: str = "contraction") -> dict[Optional[str], int]:
        """``{compute dtype: flops}`` of the ops that do arithmetic (one phase, or all):
        the numerators MFU divides by each dtype's peak. ``None``: ops without a
        floating-point argument, and runs read from files written before dtypes were kept
        (MFU takes the model's dtype for them)."""
        _check_phase(phase)
        out: dict = {}
        for (d, _), n in self._flops_by_dtype(PHASES if phase is None else (phase,),
                                              flops).items():
            out[d] = out.get(d, 0) + n
        return out

    def _flops_by_dtype(self, phases, flops: str) -> dict:
        """``{(dtype, contraction): flops}``: ``contraction`` for rows of ops with MACs."""
        _flops_figure(flops)
        macs = ROW.index("macs")
        index = macs if flops == "contraction" else ROW.index("flops")
        scale = 2 if flops == "contraction" else 1
        out: dict = {}
        for key, counts in self._rows:
            if key[1] in phases:
                n = scale * counts[index]
                if n:
                    part = (key[5], counts[macs] > 0)
                    out[part] = out.get(part, 0) + n
        return out

    def _peak_dtype(self, dtype: Optional[str], contraction: bool, spec: DeviceSpec) -> str:
        """The peak an op of compute ``dtype`` runs at: the model's dtype when unknown; fp32
        contractions at tf32 when allow_tf32 was on (and the device has tensor cores)."""
        dtype = dtype or self.run.dtype
        if (dtype == "float32" and contraction and self.run.allow_tf32
                and "tf32" in spec.peak_flops_by_dtype):
            return "tf32"
        return dtype

    def _utilisation(self, what: str, phases, device, dtype, flops: str) -> tuple:
        """``(utilisation, the denominator in words)``."""
        _flops_figure(flops)
        self._require_timing(what)
        if not self.wall_s:
            raise ValueError(f"{what} needs a finished, timed block: read it after the block")
        spec = self.device(device)
        by_dtype = self._flops_by_dtype(phases, flops)
        per_peak: dict[str, int] = {}
        if dtype is not None:  # one peak for every flop, as asked
            per_peak[_dtype_name(dtype)] = sum(by_dtype.values())
        else:
            for (d, contraction), n in by_dtype.items():
                peak = self._peak_dtype(d, contraction, spec)
                per_peak[peak] = per_peak.get(peak, 0) + n
        if not per_peak:
            per_peak[self._peak_dtype(None, True, spec)] = 0
        seconds = sum(n / spec.peak_flops(d) for d, n in per_peak.items())
        devices = len(self.ranks) or 1  # gathered: flops summed over ranks, wall the longest
        return seconds / (self.wall_s * devices), _peaks_text(spec, per_peak)

    # -- output -----------------------------------------------------------------------------
    def table(self, depth: int = 2, *, columns: Optional[list] = None,
              width: Optional[int] = None, ops: int = 0, ranks: bool = False) -> str:
        """The module tree to ``depth`` (0 = root only): each module's type, calls,
        parameters, counts in human units and % of total. It fits ``width`` characters (the
        terminal's, 100 when output is not a terminal) by abbreviating headers, dropping the
        least needed columns, then shortening module names; ``columns`` (keys of
        ``dispatch_flops.views.table.COLUMN_KEYS``, in order) picks them instead. ``ops=k``
        lists each module's k operators with the most flops under its row. ``ranks=True``
        (a gathered Profile) adds min / max over ranks columns."""
        if ranks and not self.ranks:
            raise ValueError("table(ranks=True) needs a gathered Profile: "
                             "dispatch_flops.distributed.gather(fc)")
        return module_table(self, depth, columns=columns, width=width, ops=ops, ranks=ranks)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict:
        """Everything above as JSON-serialisable plain data (docs/schema.md)."""
        facts, run = self.module_facts, self.run
        return {
            "schema_version": SCHEMA_VERSION,
            "model": run.model,
            "has_model": run.has_model,
            "attention": run.attention,
            "timing": run.timing,
            "saved_activations": run.saved_activations,
            "repeats": run.repeats,
            "wall_s": run.wall_s,
            "steps": run.steps,
            "dtype": run.dtype,
            "allow_tf32": run.allow_tf32,
            "device": run.device,
            "device_name": run.device_name,
            "rank": run.rank,
            "world_size": run.world_size,
            "pricing_errors": list(run.pricing_errors),
            "dtensor_ops": [{"overload": o, "shapes": [list(s) for s in shapes], "calls": c,
                             "flops": f, "macs": m} for o, shapes, c, f, m in run.dtensor_ops],
            "modules": [
                {"name": name, "type": kind, "calls": facts.calls.get(name, 0), "params": n,
                 "forward_span_ns": facts.spans.get(name)}
                for name, kind, n in zip(facts.names, facts.types, facts.params)
            ],
            "saved": [{"stack": list(stack), "bytes": n} for stack, n in facts.saved.items()],
            "graph_runs": [{"stack": list(stack), "runs": runs, "forward_ns": forward,
                            "backward_ns": backward}
                           for stack, (runs, forward, backward) in facts.graph_runs.items()],
            "in_graphs": list(facts.in_graphs),
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

    @classmethod
    def from_dict(cls, data: dict, source: str = "data") -> "Profile":
        """A Profile from ``to_dict()``'s data; ``ValueError`` naming what is missing."""
        if not isinstance(data, dict) or "schema_version" not in data:
            raise ValueError(f"{source} is not a dispatch_flops run: write one with "
                             "fc.to_json(path)")
        if data["schema_version"] != SCHEMA_VERSION:
            raise ValueError(f"{source} has schema_version {data['schema_version']!r}; this "
                             f"dispatch_flops reads version {SCHEMA_VERSION} (re-export the "
                             "run with this version)")
        missing = [k for k in ("model", "records", "modules", "timing", "attention")
                   if k not in data]
        if missing:
            raise ValueError(f"{source} is not a dispatch_flops run (missing {missing}); "
                             "write one with fc.to_json(path)")
        _check(data, _RUN_TYPES, source)
        for i, m in enumerate(data["modules"]):
            _check(m, _MODULE_TYPES, f"{source}: modules[{i}]")
        for i, r in enumerate(data["records"]):
            _check(r, _RECORD_TYPES, f"{source}: records[{i}]")
            _check(r["stats"], _STATS_TYPES, f"{source}: records[{i}].stats")
        run_fields = {f: data[f] for f in RunFacts.__dataclass_fields__ if f != "model"
                      and f in data}
        run_fields["pricing_errors"] = tuple(run_fields.get("pricing_errors", ()))
        run_fields["dtensor_ops"] = tuple(
            (o["overload"], tuple(tuple(s) for s in o["shapes"]), o["calls"], o["flops"],
             o["macs"]) for o in run_fields.get("dtensor_ops", ()))
        run = RunFacts(model=data["model"], **run_fields)
        modules = data["modules"]
        facts = ModuleFacts(
            names=tuple(m["name"] for m in modules) or (ROOT,),
            types=tuple(m.get("type", "") for m in modules) or ("",),
            params=tuple(m["params"] for m in modules) or (0,),
            calls={m["name"]: m["calls"] for m in modules},
            spans={m["name"]: m["forward_span_ns"] for m in modules
                   if m.get("forward_span_ns") is not None},
            saved={tuple(s["stack"]): s["bytes"] for s in data.get("saved", [])},
            graph_runs={tuple(g["stack"]): (g["runs"], g["forward_ns"], g["backward_ns"])
                        for g in data.get("graph_runs", [])},
            in_graphs=tuple(data.get("in_graphs", [])),
        )
        rows: dict[tuple, list] = {}
        for r in data["records"]:
            stats = r["stats"]
            latency = stats.get("latency_s")
            counts = tuple(stats.get(c, 0) for c in COUNTS) + (
                round(latency * 1e9) if latency else 0,)
            key = (tuple(r["stack"]), r["phase"], r["operator"], r["overload"], r["category"],
                   r.get("dtype"))
            _accumulate(rows, key, counts)
        return cls([(k, tuple(v)) for k, v in rows.items()], facts, run)

    def to_json(self, path) -> None:
        """Write ``to_dict()`` as JSON (``schema_version`` 2, docs/schema.md), whole or not
        at all; ``Profile.from_json(path)`` reads it back."""
        text = json.dumps(self.to_dict(), indent=1) + "\n"
        export.write_text(path, text)

    @classmethod
    def from_json(cls, path) -> "Profile":
        """The Profile a ``to_json`` file holds."""
        with open(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{os.fspath(path)} is not JSON: {e}") from None
        return cls.from_dict(data, source=os.fspath(path))

    def to_csv(self, path) -> None:
        """One row per module x phase x operator (see ``dispatch_flops.export.COLUMNS``)."""
        export.write_csv(self, path)

    def to_dataframe(self):
        """The rows of ``to_csv`` as a pandas DataFrame (needs pandas)."""
        return export.dataframe(self)

    @property
    def trace(self) -> Optional[tuple]:
        """``(events, dropped)`` of a run counted with ``trace=True``, else None."""
        return self._trace

    def to_chrome_trace(self, path) -> None:
        """Module calls and op calls on their timeline, as Trace Event Format JSON for
        Perfetto (ui.perfetto.dev) or chrome://tracing. Needs a run with ``trace=True``."""
        export.write_chrome_trace(self, path)

    # -- combining runs ---------------------------------------------------------------------
    @classmethod
    def merge(cls, runs: Iterable) -> "Profile":
        """Runs of the same model (counters or Profiles: steps, repeats, ranks) as one: calls,
        counts, latencies and wall times summed, ``steps`` added. The merged runs are kept in
        ``parts``; merging merged Profiles keeps their parts (so merge is associative).
        ``ValueError`` when the runs are of different models or options."""
        profiles = [as_profile(r) for r in runs]
        if not profiles:
            raise ValueError("merge needs at least one run")
        first = profiles[0]
        for i, p in enumerate(profiles[1:], 1):
            why = _difference(first, p)
            if why:
                raise ValueError(f"cannot merge run {i} with run 0: {why}")
        rows: dict[tuple, list] = {}
        calls: dict[str, int] = {}
        spans: dict[str, int] = {}
        saved: dict[tuple, int] = {}
        graph_runs: dict[tuple, list] = {}
        for p in profiles:
            for key, counts in p._rows:
                _accumulate(rows, key, counts)
            for into, facts in ((calls, p.module_facts.calls), (spans, p.module_facts.spans),
                                (saved, p.module_facts.saved)):
                for k, v in facts.items():
                    into[k] = into.get(k, 0) + v
            for stack, times in p.module_facts.graph_runs.items():
                _accumulate(graph_runs, stack, times)
        in_graphs = {n for p in profiles for n in p.module_facts.in_graphs}
        walls = [p.wall_s for p in profiles]
        errors = tuple(dict.fromkeys(e for p in profiles for e in p.run.pricing_errors))
        logical: dict[tuple, list] = {}
        for p in profiles:
            for overload, shapes, *counts in p.run.dtensor_ops:
                _accumulate(logical, (overload, shapes), tuple(counts))
        run = replace(first.run, steps=sum(p.steps for p in profiles),
                      wall_s=None if None in walls else sum(walls),
                      repeats=min(p.repeats for p in profiles), pricing_errors=errors,
                      dtensor_ops=tuple(k + tuple(v) for k, v in logical.items()))
        facts = replace(first.module_facts, calls=calls, spans=spans, saved=saved,
                        graph_runs={k: tuple(v) for k, v in graph_runs.items()},
                        in_graphs=tuple(n for n in first.module_facts.names if n in in_graphs))
        parts = tuple(q for p in profiles for q in (p.parts or (p,)))
        return cls([(k, tuple(v)) for k, v in rows.items()], facts, run, parts=parts)

    def per_step(self) -> "Profile":
        """The mean step: every count, time and the wall time divided by ``steps`` (an
        integer where it divides exactly, a float where it does not)."""
        n = self.steps
        if n == 1:
            return self

        def mean(value):
            return value // n if value % n == 0 else value / n

        facts = replace(self.module_facts,
                        calls={k: mean(v) for k, v in self.module_facts.calls.items()},
                        spans={k: mean(v) for k, v in self.module_facts.spans.items()},
                        saved={k: mean(v) for k, v in self.module_facts.saved.items()},
                        graph_runs={k: tuple(map(mean, v))
                                     for k, v in self.module_facts.graph_runs.items()})
        run = replace(self.run, steps=1,
                      wall_s=None if self.wall_s is None else self.wall_s / n)
        rows = [(key, tuple(mean(v) for v in counts)) for key, counts in self._rows]
        return Profile(rows, facts, run)

    def with_medians(self, runs: list["Profile"]) -> "Profile":
        """This run with every op's, module span's and the wall time replaced by the median
        over ``runs`` (this one among them) that ran the same ops; ``repeats`` says how many
        did (see ``dispatch_flops.profile``)."""
        keys = [key for key, _ in self._rows]
        alike = [r for r in runs if [key for key, _ in r._rows] == keys]
        rows = [(key, counts[:-1] + (statistics.median_low([r._rows[i][1][-1] for r in alike]),))
                for i, (key, counts) in enumerate(self._rows)]
        spans = {name: statistics.median_low([r.module_facts.spans.get(name, 0) for r in alike])
                 for name in self.module_facts.spans}
        graph_runs = {stack: (runs,) + tuple(
            statistics.median_low([r.module_facts.graph_runs.get(stack, (0, 0, 0))[i]
                                   for r in alike]) for i in (1, 2))
            for stack, (runs, *_) in self.module_facts.graph_runs.items()}
        walls = [r.wall_s for r in alike if r.wall_s is not None]
        run = replace(self.run, repeats=len(alike),
                      wall_s=statistics.median_low(walls) if walls else self.wall_s)
        return Profile(rows, replace(self.module_facts, spans=spans, graph_runs=graph_runs), run,
                       trace=self._trace)


def since(later: Profile, earlier: Profile) -> Profile:
    """What ``later`` counted after ``earlier``, both snapshots of one counter's run (taken
    inside its block with ``to_profile()``): calls, counts, times and module calls
    subtracted; rows that counted nothing left out. ``profile_generate`` cuts a run into
    steps with it."""
    rows = {key: list(counts) for key, counts in later._rows}
    for key, counts in earlier._rows:
        rows[key] = [a - b for a, b in zip(rows.get(key, (0,) * len(counts)), counts)]

    def minus(a: dict, b: dict) -> dict:
        out = {k: v - b.get(k, 0) for k, v in a.items()}
        return {k: v for k, v in out.items() if v}

    facts = replace(later.module_facts,
                    calls=minus(later.module_facts.calls, earlier.module_facts.calls),
                    spans=minus(later.module_facts.spans, earlier.module_facts.spans),
                    saved=minus(later.module_facts.saved, earlier.module_facts.saved),
                    graph_runs={k: tuple(a - b for a, b in zip(
                        v, earlier.module_facts.graph_runs.get(k, (0, 0, 0))))
                        for k, v in later.module_facts.graph_runs.items()
                        if v != earlier.module_facts.graph_runs.get(k)})
    return Profile([(k, tuple(v)) for k, v in rows.items() if any(v)], facts, later.run)


# what from_dict reads, with its type: a missing or mistyped field is named in the error
_RUN_TYPES = {"model": str, "records": list, "modules": list, "timing": bool, "attention": str,
              "has_model": (bool, type(None)), "steps": (int, type(None)),
              "wall_s": (float, int, type(None)), "allow_tf32": bool}
_MODULE_TYPES = {"name": str, "calls": int, "params": int}
_RECORD_TYPES = {"stack": list, "phase": str, "operator": str, "overload": str,
                 "category": str, "stats": dict, "dtype": (str, type(None))}
_STATS_TYPES = {**{c: int for c in COUNTS}, "latency_s": (float, int, type(None))}
# files written before them
_OPTIONAL = ("has_model", "steps", "wall_s", "comm_bytes", "dtype", "allow_tf32")


def _check(data, types: dict, where: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where} is {type(data).__name__}, not an object")
    for key, kind in types.items():
        if key not in data:
            if key in _OPTIONAL:
                continue  # optional
            raise ValueError(f"{where}: field {key!r} is missing")
        value = data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{where}: field {key!r} is {value!r}, not "
                             f"{getattr(kind, '__name__', 'of the right type')}")


def _difference(a: Profile, b: Profile) -> str:
    """Why two runs cannot be merged ("" when they can)."""
    if a.root_label != b.root_label or a.has_model != b.has_model:
        return f"different models ({a.root_label!r} and {b.root_label!r})"
    if a.module_facts.names != b.module_facts.names:
        return f"different module trees ({a.root_label}: modules differ)"
    if a.module_facts.params != b.module_facts.params:
        return f"different parameter counts ({a.root_label}: a module's parameters differ)"
    for option in ("attention", "timing", "saved_activations", "allow_tf32"):
        if getattr(a.run, option) != getattr(b.run, option):
            return (f"different {option} ({getattr(a.run, option)!r} and "
                    f"{getattr(b.run, option)!r}): count both runs with the same options")
    return ""
