"""``ProfileViews``: every question a run answers, written once. ``Profile`` is one (its
``to_profile()`` is itself) and ``FlopCounter`` is one (its ``to_profile()`` is the run it
counted), so the two answer the same views with the same signatures.

>>> with FlopCounter(model) as fc:
...     model(x).sum().backward()
>>> fc.by_module()["blocks.0"].exclusive.macs == fc.to_profile().by_module()["blocks.0"]...
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence, Union

import torch

from dispatch_flops.results import (
    aggregate,
    conventions,
    experts,
    present,
    schema,
    stages,
    utilisation,
)
from dispatch_flops.results.experts import ExpertStats
from dispatch_flops.results.protocols import ProfileLike
from dispatch_flops.results.roofline import DeviceSpec, Roofline
from dispatch_flops.results.stages import StageStats
from dispatch_flops.results.stats import (
    CATEGORIES,
    COUNTS,
    ESTIMATED,
    MODEL_PHASES,
    PHASES,
    UNSUPPORTED,
    Coverage,
    KernelTime,
    ModuleStats,
    OpRecord,
    Stats,
    frozen_mapping,
)
from dispatch_flops.results.torch_figures import torch_flop_counts
from dispatch_flops.results.utilisation import DeviceLike

DTypeLike = Union[torch.dtype, str, None]


class ProfileViews:
    """The views of a run, read from ``to_profile()``."""

    def to_profile(self) -> ProfileLike:
        raise NotImplementedError

    # -- sums -------------------------------------------------------------------------------
    def records(self) -> list[OpRecord]:
        """Every (module stack, phase, op overload) with its counts."""
        p = self.to_profile()
        return list(p.memo("records", lambda: aggregate.records(p)))

    @property
    def total(self) -> Stats:
        """Everything counted, all phases."""
        p = self.to_profile()
        return p.memo("total", lambda: aggregate.sum_rows(
            p, lambda key: True, aggregate.graph_ns(p, None)))

    def by_phase(self) -> dict[str, Stats]:
        """``{phase: Stats}`` for every phase of ``PHASES``."""
        p = self.to_profile()

        def of(phase: str) -> Stats:
            return aggregate.sum_rows(p, lambda key: key.phase == phase,
                                      aggregate.graph_ns(p, phase))

        return dict(p.memo("phases", lambda: {phase: of(phase) for phase in PHASES}))

    def model_flops(self) -> int:
        """Forward + backward flops the model needs: recompute and optimizer not included,
        nor the masked attention pairs the kernels computed (``Stats.masked_flops``); the
        numerator of MFU (docs/conventions.md, "Hardware and model flops")."""
        phases = self.by_phase()
        return sum(phases[p].model_flops for p in MODEL_PHASES)

    def hardware_flops(self) -> int:
        """Every flop executed: forward, backward, recompute and optimizer, masked attention
        pairs the kernels computed included (that of HFU)."""
        return self.total.flops

    def by_operator(self, phase: Optional[str] = None) -> dict[str, Stats]:
        """``{"aten.mm": Stats}`` over the whole run (or one phase)."""
        utilisation.check_phase(phase)
        p = self.to_profile()
        return dict(p.memo(("operators", phase), lambda: aggregate.by_operator(p, phase)))

    def by_module(self, phase: Optional[str] = None) -> dict[str, ModuleStats]:
        """``{name: ModuleStats}`` for every module that ran (names of ``named_modules()``;
        ``ROOT`` == "" is the root model, or everything when no model was given)."""
        utilisation.check_phase(phase)
        p = self.to_profile()
        return dict(p.memo(("modules", phase), lambda: aggregate.by_module(p, phase)))

    def by_type(self, phase: Optional[str] = None) -> dict[str, ModuleStats]:
        """``{class name: ModuleStats}``: what each kind of module costs (attention, MLP,
        norms, embeddings), largest first. ``inclusive``: every op run while a module of
        that class ran, once however deep they nest; ``exclusive``: the ops its modules ran
        directly (exclusive figures sum to ``total``). ``table(group="type")`` prints it.

        >>> with FlopCounter(model) as fc:
        ...     model(x)
        >>> fc.by_type()["CausalSelfAttention"].flops / fc.total.flops   # attention's share
        """
        utilisation.check_phase(phase)
        p = self.to_profile()
        return dict(p.memo(("types", phase), lambda: aggregate.by_type(p, phase)))

    def module_names(self) -> list[str]:
        """Module names in ``named_modules()`` order (the table's tree order)."""
        return list(self.to_profile().module_facts.names)

    def module_types(self) -> dict[str, str]:
        """``{name: class name}`` of every module."""
        facts = self.to_profile().module_facts
        return dict(zip(facts.names, facts.types))

    # -- what was priced how ----------------------------------------------------------------
    def unsupported_ops(self) -> dict[str, int]:
        """``{"aten.foo": calls}`` for ops with no formula, no estimate, not declared zero-work:
        their bytes are counted, their flops are unknown."""
        return aggregate.calls_in(self.to_profile(), UNSUPPORTED)

    def estimated_ops(self) -> dict[str, int]:
        """``{"aten.foo": calls}`` for ops priced by the family estimate of their tag
        (``torch.Tag.pointwise``: one flop per output element), not by a formula."""
        return aggregate.calls_in(self.to_profile(), ESTIMATED)

    def coverage(self) -> Coverage:
        """Shares of the run's op calls, and of its bytes moved, priced by a formula, declared
        to do no arithmetic, estimated, or unknown."""
        calls = dict.fromkeys(CATEGORIES, 0)
        moved = dict.fromkeys(CATEGORIES, 0)
        read, written = COUNTS.index("bytes_read"), COUNTS.index("bytes_written")
        for key, counts in self.to_profile().rows:
            calls[key.category] += counts[0]
            moved[key.category] += counts[read] + counts[written]
        return Coverage(frozen_mapping(calls), frozen_mapping(moved))

    @property
    def kernel_time(self) -> Optional[KernelTime]:
        """What kernel timing found (``KernelTime``: the attributed share, kernels no op
        launched, dropped records, sampled blocks); None unless the run was timed by its
        kernels (``timing=True`` on CUDA with Kineto recording)."""
        kernels = self.to_profile().run.kernels
        return KernelTime.of(kernels) if kernels else None

    # -- compiled graphs and ranks ----------------------------------------------------------
    @property
    def in_graphs(self) -> tuple:
        """Names of the modules whose forward ran inside a compiled graph (``torch.compile``):
        their counts are exact, but they have no time of their own (``latency_s`` is None):
        the graph runs fused kernels and is timed whole, in the time of the module that ran
        it (see ``graph_runs``)."""
        return self.to_profile().module_facts.in_graphs

    @property
    def graph_runs(self) -> dict[tuple, tuple[int, Optional[float], Optional[float]]]:
        """``{stack of the module that ran them: (runs, forward s, backward s)}`` of the
        compiled graphs run (seconds None without timing)."""
        p = self.to_profile()
        timed = p.timing
        return {stack: (runs, forward / 1e9 if timed else None,
                        backward / 1e9 if timed else None)
                for stack, (runs, forward, backward) in p.module_facts.graph_runs.items()}

    @property
    def logical(self) -> Stats:
        """The figure of the unsharded program (calls, flops, MACs), which this rank's counts
        split into local shard work and collectives: the DTensor-level calls at their global
        shapes, and the ops on plain tensors outside them times the shard factor of their
        inputs (attention on the local heads tensor parallelism hands over counts ``n``
        times, a loss on a replica once; docs/conventions.md). Zero without DTensors."""
        ops = self.to_profile().run.dtensor_ops
        return Stats(calls=sum(o[2] for o in ops), flops=sum(o[3] for o in ops),
                     macs=sum(o[4] for o in ops))

    def imbalance(self, phase: Optional[str] = None
                  ) -> dict[str, dict[str, tuple[float, float, float]]]:
        """Over the gathered ranks, per module: ``{"flops" | "comm_bytes" | "latency_s":
        (min, mean, max)}`` of its inclusive counts (latency only when timed), over the
        ranks whose model has the module (pipeline stages: a stage's modules on its rank; the
        root, the whole pipeline, over every rank). ``ValueError`` on a Profile that was not
        gathered (``dispatch_flops.distributed.gather``)."""
        p = self.to_profile()
        if not p.ranks:
            raise ValueError("imbalance needs a gathered Profile: dispatch_flops.distributed"
                             ".gather(fc) on every rank")
        per_rank = [(r.by_module(phase), frozenset(r.module_facts.names)) for r in p.ranks]
        metrics = ("flops", "comm_bytes") + (("latency_s",) if p.timing else ())
        out = {}
        for name in p.by_module(phase):
            row = {}
            having = [m for m, names in per_rank if name in names]
            for metric in metrics:
                values = [getattr(m[name], metric) or 0 if name in m else 0 for m in having]
                row[metric] = (min(values), sum(values) / len(values), max(values))
            out[name] = row
        return out

    def pipeline(self) -> dict[int, StageStats]:
        """``{stage: StageStats}``: each pipeline stage's forward and backward actions, the
        activation and gradient bytes it sent and received, and (timed) its busy and idle
        seconds and ``bubble`` (idle / wall), for a run counted with
        ``dispatch_flops.distributed.pipeline_stage`` (one stage), or gathered from such runs
        (every stage). {} outside a pipeline."""
        p = self.to_profile()
        return dict(p.memo("pipeline", lambda: stages.stage_stats(p)))

    def experts(self) -> dict[str, ExpertStats]:
        """``{MoE layer: ExpertStats}``: the tokens each expert of each MoE layer was given,
        their imbalance (max / mean), idle experts and the padding of capacity kernels (the
        rules that recognise experts: docs/distributed.md); summed over gathered ranks and
        merged runs. {} for a model without recognised experts."""
        p = self.to_profile()
        return dict(p.memo("experts", lambda: experts.expert_stats(p)))

    def experts_table(self) -> str:
        """``experts()`` as text, one line per MoE layer."""
        return present.presenter().experts_table(self.to_profile())

    # -- time -------------------------------------------------------------------------------
    def top_ops_by_time(self, k: int = 10) -> list[tuple[str, Stats]]:
        """The ``k`` operators that took the most time, longest first; operators with no time
        of their own (run only inside compiled graphs, timed whole) are left out."""
        p = self.to_profile()  # one snapshot inside the block
        utilisation.require_timing(p, "top_ops_by_time")
        timed = [item for item in p.by_operator().items() if item[1].latency_s]
        return sorted(timed, key=lambda item: -(item[1].latency_s or 0.0))[:k]

    def top_modules_by_time(self, k: int = 10, *, inclusive: bool = False
                            ) -> list[tuple[str, ModuleStats]]:
        """The ``k`` modules that took the most time: by the time of the ops they ran
        directly (default), or by their inclusive latency (the root first, then its parts)."""
        p = self.to_profile()  # one snapshot inside the block
        utilisation.require_timing(p, "top_modules_by_time")

        def latency(m: ModuleStats) -> float:
            return (m.latency_s if inclusive else m.exclusive.latency_s) or 0.0

        return sorted(p.by_module().items(), key=lambda item: -latency(item[1]))[:k]

    # -- a device's roofs: roofline, MFU, HFU -----------------------------------------------
    def device(self, device: Optional[DeviceLike] = None) -> DeviceSpec:
        """``device`` when given: a ``DeviceSpec``, a name (a key of ``DEVICES`` such as
        "H100-SXM", or the device's own, "NVIDIA H100 80GB HBM3") or a ``torch.device``, as
        every device argument below takes; else the built-in spec of the GPU the run was made
        on, or of the current GPU. ``ValueError`` when there is none, naming the device and
        how to pass a ``DeviceSpec``."""
        return utilisation.device_of(self.to_profile(), device)

    def roofline_by_operator(self, device: Optional[DeviceLike] = None,
                             dtype: DTypeLike = None) -> dict[str, Roofline]:
        """Each operator against ``device``'s roofs (see ``device``) at ``dtype`` (the
        model's parameter dtype when None)."""
        return utilisation.roofline_by_operator(self.to_profile(), device, dtype)

    def roofline_by_module(self, device: Optional[DeviceLike] = None,
                           dtype: DTypeLike = None) -> dict[str, Roofline]:
        """Each module (inclusive) against ``device``'s roofs; see ``roofline_by_operator``."""
        return utilisation.roofline_by_module(self.to_profile(), device, dtype)

    def mfu(self, device: Optional[DeviceLike] = None, dtype: DTypeLike = None, *,
            flops: str = "contraction") -> float:
        """Model flops utilisation: the time forward + backward flops take at peak / the wall
        time of the block. Each op's flops run at the dense peak of its own compute dtype
        (its first floating-point argument's: bf16, fp16, fp8, fp32; fp32 contractions at
        the tf32 peak when ``torch.backends.cuda.matmul.allow_tf32`` was on), so a run
        mixing dtypes is divided fairly; ``dtype=`` divides every flop by that one dtype's
        peak instead. ``flops="contraction"`` (default): 2 x model MACs, the field's model
        flops (PaLM, Megatron, torchtitan count the contractions); ``flops="all"``:
        ``model_flops()``, every op's arithmetic (element-wise work too). Both leave out the
        masked attention pairs (``Stats.model_macs``, ``model_flops``). ``ValueError`` on
        an untimed run, an unknown device (pass ``device=DeviceSpec(...)``) or a dtype the
        device has no peak for; ``mfu_text`` says which instead of raising. A figure above 1
        (100 %) is impossible: it comes with a ``UtilisationWarning`` naming the likely
        causes (a peak too low, a sparse datasheet figure, a wrong dtype). Not the
        ``ThroughputMeter``'s ``mfu_all_ops`` (every op's model flops at one peak over
        uncounted steps: ``mfu(flops="all", dtype=its dtype)`` over the same time)."""
        return utilisation.checked_utilisation(self.to_profile(), "mfu", MODEL_PHASES, device,
                                               dtype, flops)

    def hfu(self, device: Optional[DeviceLike] = None, dtype: DTypeLike = None, *,
            flops: str = "contraction") -> float:
        """Hardware flops utilisation: every flop executed (recompute and optimizer too) at
        the peak of its dtype / wall time; as ``mfu`` (``"all"``: ``hardware_flops()``)."""
        return utilisation.checked_utilisation(self.to_profile(), "hfu", PHASES, device,
                                               dtype, flops)

    def mfu_text(self, device: Optional[DeviceLike] = None, dtype: DTypeLike = None, *,
                 flops: str = "contraction") -> str:
        """MFU with its denominator, as printed: ``"MFU 41.3 % of 989.4 TFLOPS bf16 dense,
        H100-SXM datasheet"`` (``"... of per-op dtype peaks (bf16 989.4, fp32 66.9 TFLOPS
        dense) ..."`` for mixed dtypes; ``"..., calibrated on cpu"`` against
        ``DeviceSpec.calibrate()``), or why there is none: ``"no MFU: unknown device 'cpu'
        (...)"``; ``flops="all"`` says ``"MFU (all ops) ..."``. A figure above 100 % carries
        the reason it cannot be right."""
        return present.presenter().utilisation_text(self.to_profile(), "mfu", MODEL_PHASES,
                                                    device, dtype, flops)

    def hfu_text(self, device: Optional[DeviceLike] = None, dtype: DTypeLike = None, *,
                 flops: str = "contraction") -> str:
        """HFU with its denominator, or why there is none; see ``mfu_text``."""
        return present.presenter().utilisation_text(self.to_profile(), "hfu", PHASES, device,
                                                    dtype, flops)

    def conventions(self, tokens: Optional[int] = None, tokens_per_s: Optional[float] = None,
                    device: Optional[DeviceLike] = None,
                    dtype: DTypeLike = None) -> conventions.Conventions:
        """The field's MFU conventions side by side, per token: the run's measured flops,
        6N with and without embeddings, PaLM's 6N + 12·L·H·Q·T (and causal-halved),
        torchtitan's 6(N − E) + 12·L·H·Q·T and Megatron's ``num_floating_point_operations``,
        each from what the run saw (parameters in the module tree, attention calls, layers),
        with the named differences between them (``results.conventions``). ``tokens``: the
        tokens the counted run processed (default: ``b·s`` of its attention calls). Given
        ``tokens_per_s`` (a measured throughput), the MFU under each, against ``device``
        (see ``device``) at ``dtype`` (the model's when None). ``print()`` it for the table.

        >>> print(fc.conventions(tokens_per_s=2973, device=DEVICES["A100-SXM4-80GB"]))
        """
        return conventions.conventions(self.to_profile(), tokens, tokens_per_s,
                                       utilisation.as_spec(device), dtype)

    def flops_by_dtype(self, phase: Optional[str] = None, *,
                       flops: str = "contraction") -> dict[Optional[str], int]:
        """``{compute dtype: flops}`` of the ops that do arithmetic (one phase, or all):
        the numerators MFU divides by each dtype's peak. ``"int8"``: ops whose operands are
        int8 and none floating point (``torch._int_mm``). ``None``: ops without a
        floating-point or int8 argument, and runs read from files written before dtypes were
        kept (MFU takes the model's dtype for them)."""
        utilisation.check_phase(phase)
        out: dict[Optional[str], int] = {}
        phases = PHASES if phase is None else (phase,)
        for (d, _), n in utilisation.flops_by_dtype(self.to_profile(), phases, flops).items():
            out[d] = out.get(d, 0) + n
        return out

    # -- torch's FlopCounterMode getters (torch's figure: 2 x MACs) -------------------------
    def get_total_flops(self) -> int:
        """2 × MACs of everything counted, all phases (torch's
        ``FlopCounterMode.get_total_flops``; ``total.flops`` is this package's all-ops
        figure)."""
        return 2 * self.total.macs

    def get_flop_counts(self) -> dict[str, dict[Any, int]]:
        """``{module: {op packet: 2 × MACs}}`` as torch's ``FlopCounterMode`` keys them
        (``results.torch_figures.torch_flop_counts``), as plain dicts."""
        return {k: dict(v) for k, v in torch_flop_counts(self.to_profile()).items()}

    def get_table(self, depth: Optional[int] = None) -> str:
        """torch's ``get_table``: modules to ``depth`` (None: 2; the model is 1), torch's
        layout and figure. ``table(depth)`` is this package's table."""
        return present.presenter().torch_table(self.get_flop_counts(),
                                               2 if depth is None else depth)

    # -- output -----------------------------------------------------------------------------
    def table(self, depth: int = 2, *, columns: Optional[Sequence[str]] = None,
              width: Optional[int] = None, ops: int = 0, ranks: bool = False,
              group: Optional[str] = None) -> str:
        """The module tree to ``depth`` (0 = root only): each module's type, calls,
        parameters, counts in human units and % of total. It fits ``width`` characters (the
        terminal's, 100 when output is not a terminal) by abbreviating headers, dropping the
        least needed columns, then shortening module names; ``columns`` (keys of
        ``dispatch_flops.views.table.COLUMN_KEYS``, in order) picks them instead. ``ops=k``
        lists each module's k operators with the most flops under its row. ``ranks=True``
        (a gathered Profile) adds min / max over ranks columns. ``group="type"``: a row per
        module class instead of per module (``by_type()``), with its own flops beside."""
        if not isinstance(depth, int) or depth < 0:  # a caller's error, said before any read
            raise ValueError(f"depth must be an int >= 0 (0 shows the root only), got "
                             f"{depth!r}")
        p = self.to_profile()
        if ranks and not p.ranks:
            raise ValueError("table(ranks=True) needs a gathered Profile: "
                             "dispatch_flops.distributed.gather(fc)")
        return present.presenter().table(p, depth, columns=columns, width=width, ops=ops,
                                         ranks=ranks, group=group)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        """Everything above as JSON-serialisable plain data (docs/schema.md)."""
        return schema.to_dict(self.to_profile())

    def to_json(self, path: schema.PathLike) -> None:
        """Write ``to_dict()`` as JSON (``schema_version`` 2, docs/schema.md), whole or not
        at all; ``Profile.from_json(path)`` reads it back."""
        schema.write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    def to_csv(self, path: schema.PathLike) -> None:
        """One row per module x phase x operator (see ``dispatch_flops.export.COLUMNS``)."""
        present.presenter().write_csv(self.to_profile(), path)

    def to_dataframe(self) -> Any:
        """The rows of ``to_csv`` as a pandas DataFrame (needs pandas)."""
        return present.presenter().dataframe(self.to_profile())

    def to_chrome_trace(self, path: schema.PathLike) -> None:
        """Module calls and op calls on their timeline, as Trace Event Format JSON for
        Perfetto (ui.perfetto.dev) or chrome://tracing. Needs a run with ``trace=True``,
        read after the block."""
        present.presenter().write_chrome_trace(self.to_profile(), path)


# the views ProfileViews answers (a test checks that Profile and FlopCounter have each)
VIEWS = tuple(name for name in vars(ProfileViews)
              if not name.startswith("_") and name != "to_profile") + ("__str__",)
