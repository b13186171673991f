"""Plain, frozen result types handed to users. No counting logic lives here."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType
from typing import Iterable, Mapping, Optional

from dispatch_flops.formulas import Category
from dispatch_flops.results.format import duration, human


class StringEnum(str, enum.Enum):
    """A closed vocabulary whose members are their strings: ``Phase.FORWARD == "forward"``,
    hashes as ``"forward"`` (a dict keyed by members reads with plain strings, and a loaded
    Profile's plain strings meet a live run's members), and prints, formats, writes to CSV and
    JSON-dumps as ``forward``. A mixed-in enum's own ``str()`` is ``Phase.FORWARD``, and so is
    its ``format()`` (f-strings) since 3.11 (3.9/3.10: the value), hence ``__str__``;
    ``__format__`` too, rather than rely on ``Enum.__format__`` deferring to an overridden
    ``__str__``, a rule 3.11 and 3.12 each rewrote."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    def __repr__(self) -> str:  # as its string's: a live run's reprs read as a loaded one's
        return repr(self.value)


ROOT = ""  # the root model's key in by_module(); without a model, everything is charged here
# the root's one name wherever it is shown (tables, plots, reprs, the CLI): the model's class
# name (Profile.root_label), or this without a model. Ours, lower case like every name we
# print; torch's getters keep torch's own "Global" (results.torch_figures.TORCH_GLOBAL).
GLOBAL = "global"


class Phase(StringEnum):
    """Which part of a step an op belongs to. The tracker's ``phase_of`` is the one rule that
    decides it; every accumulator, report and export loops over ``PHASES``, so a new phase is
    a member here and a branch of that rule.

    >>> with FlopCounter(model) as fc:
    ...     model(x).sum().backward()
    >>> fc.by_phase()[Phase.BACKWARD].flops == fc.by_phase()["backward"].flops
    True
    """

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"  # ops run inside optimizer.step()
    RECOMPUTE = "recompute"  # forward ops re-run by activation checkpointing during backward
    # ops run while none of the model's modules is running, and the backward of what they
    # made: a loss computed after the model, gradient clipping, loss scaling (with a model)
    OTHER = "other"


# The vocabulary's members under their old names, importable as before (not in __all__):
# ``FORWARD is Phase.FORWARD``.
FORWARD = Phase.FORWARD
BACKWARD = Phase.BACKWARD
OPTIMIZER = Phase.OPTIMIZER
RECOMPUTE = Phase.RECOMPUTE
OTHER = Phase.OTHER
PHASES = tuple(Phase)  # in the order every accumulator (frame.acc[i]) and report uses
MODEL_PHASES = (FORWARD, BACKWARD)  # model flops: what the model needs, once

# How an op call was priced: the formula library's own vocabulary (``Category``, whose values
# are the names in reports and saved profiles, docs/schema.md), one name for one thing.
EXACT = Category.EXACT  # priced by a formula
NO_ARITHMETIC = Category.NO_ARITHMETIC  # declared to do no arithmetic (views, copies, allocation)
ESTIMATED = Category.ESTIMATED  # no formula; priced by the family its tag names, flagged
UNSUPPORTED = Category.UNSUPPORTED  # no formula: bytes counted, flops unknown
COMMUNICATION = Category.COMMUNICATION  # a collective or point-to-point op: comm_bytes on the wire
CATEGORIES = (EXACT, NO_ARITHMETIC, ESTIMATED, UNSUPPORTED, COMMUNICATION)


def _add_latency(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None:
        return b
    return a if b is None else a + b


@dataclass(frozen=True)
class Stats:
    """Counts for a set of op calls. ``flops`` includes ``2 * macs``. ``comm_bytes`` is what
    the collectives among them put on the wire from this rank (the bus convention of
    docs/conventions.md: ``comm_bytes / time`` is NCCL-tests' busbw), ``comm_alg_bytes``
    their sizes ``S`` (``comm_alg_bytes / time`` is NCCL-tests' algbw; torch.profiler's
    message sizes). ``latency_s`` is the measured time in seconds when timing was on,
    ``None`` when it was off.

    ``flops`` and ``macs`` are hardware figures: what the kernels executed. ``masked_flops``
    and ``masked_macs`` are the part of them spent on masked (query, key) pairs of attention
    (a causal, sliding-window or document mask computed densely, a BlockMask's partial
    blocks) and on a fused attention backward's recomputation of the scores: work that ran
    but that the model does not need. ``model_flops`` /
    ``model_macs`` are the rest (docs/conventions.md, "Hardware and model flops")."""

    calls: int = 0
    flops: int = 0
    macs: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    comm_bytes: int = 0
    comm_alg_bytes: int = 0
    masked_flops: int = 0  # of ``flops``: masked attention pairs, kernels' recompute, dropout
    masked_macs: int = 0  # of ``macs``: likewise
    latency_s: Optional[float] = None

    def __add__(self, other: "Stats") -> "Stats":
        counts = [getattr(self, f) + getattr(other, f) for f in COUNTS]
        latency = _add_latency(self.latency_s, other.latency_s)
        # mypy takes a *list for every field: it cannot tell COUNTS leaves latency_s out
        return Stats(*counts, latency)  # type: ignore[call-arg]

    @classmethod
    def of(cls, counts: Iterable[int], ns: int, timed: bool) -> "Stats":
        """Stats from integer ``counts`` in ``COUNTS`` order and ``ns`` of measured time
        (``latency_s`` stays ``None`` unless ``timed``)."""
        return cls(*counts, ns / 1e9 if timed else None)  # type: ignore[call-arg]

    @property
    def model_flops(self) -> int:
        """Flops the model needs: ``flops`` less the masked attention pairs' share."""
        return self.flops - self.masked_flops

    @property
    def model_macs(self) -> int:
        """MACs the model needs: ``macs`` less the masked attention pairs' share."""
        return self.macs - self.masked_macs

    @property
    def bytes(self) -> int:
        """Bytes moved: read + written."""
        return self.bytes_read + self.bytes_written

    @property
    def arithmetic_intensity(self) -> Optional[float]:
        """Flops per byte moved; ``None`` when nothing moved."""
        return self.flops / self.bytes if self.bytes else None

    @property
    def achieved_flops(self) -> Optional[float]:
        """Flops per second of measured time; ``None`` without a (positive) latency."""
        return self.flops / self.latency_s if self.latency_s else None

    @property
    def achieved_bandwidth(self) -> Optional[float]:
        """Bytes moved per second of measured time; ``None`` without a (positive) latency."""
        return self.bytes / self.latency_s if self.latency_s else None

    def to_dict(self) -> dict:
        return asdict(self)

    def __repr__(self) -> str:  # short: the fields, exact, are its attributes
        timed = "" if self.latency_s is None else f", latency {duration(self.latency_s)}"
        return (f"Stats({self.calls} calls, {human(self.flops, 'FLOPs')}, "
                f"{human(self.macs, 'MACs')}, {human(self.bytes, 'B')} moved{timed})")


# Stats' integer counts, in field order: every record, row and column of the engine and the
# exports is laid out by these names (a new per-op metric is a new Stats field)
COUNTS = tuple(f.name for f in fields(Stats) if f.name != "latency_s")
# the counts a formula and the op's tensors price per call: every count but ``calls``
PRICED = COUNTS[1:]


@dataclass(frozen=True)
class ModuleStats:
    """One module's counts: ``inclusive`` of everything it ran (children too), ``exclusive``
    of the ops it ran directly. ``flops``/``macs``/``bytes_*`` read the inclusive side.
    ``calls`` counts forward calls of the module (``Stats.calls`` counts op calls)."""

    name: str
    calls: int
    params: int
    inclusive: Stats
    exclusive: Stats
    by_operator: Mapping[str, Stats] = field(default_factory=dict)  # inclusive, per op
    # bytes of tensors saved for backward during forward (storage-deduplicated, parameters
    # excluded), inclusive and by the module's own ops; None unless saved_activations=True
    saved_bytes: Optional[int] = None
    saved_bytes_exclusive: Optional[int] = None
    # seconds the device sat idle inside the module's forward calls, waiting on the host
    # (their kernels' span minus the union of their kernels), charged to no op; None unless
    # timed by kernels (timing=True on CUDA)
    idle_s: Optional[float] = None

    @property
    def flops(self) -> int:
        return self.inclusive.flops

    @property
    def macs(self) -> int:
        return self.inclusive.macs

    @property
    def bytes_read(self) -> int:
        return self.inclusive.bytes_read

    @property
    def comm_bytes(self) -> int:
        return self.inclusive.comm_bytes

    @property
    def comm_alg_bytes(self) -> int:
        return self.inclusive.comm_alg_bytes

    @property
    def bytes_written(self) -> int:
        return self.inclusive.bytes_written

    @property
    def latency_s(self) -> Optional[float]:
        """Inclusive latency: the module's forward call spans (hook to hook) plus its
        backward ops' time; ``None`` when timing was off."""
        return self.inclusive.latency_s

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "calls": self.calls,
            "params": self.params,
            "inclusive": self.inclusive.to_dict(),
            "exclusive": self.exclusive.to_dict(),
            "by_operator": {op: s.to_dict() for op, s in self.by_operator.items()},
            "saved_bytes": self.saved_bytes,
            "saved_bytes_exclusive": self.saved_bytes_exclusive,
            **({"idle_s": self.idle_s} if self.idle_s is not None else {}),
        }

    def __repr__(self) -> str:
        return (f"ModuleStats({self.name!r}, {self.calls} calls, {human(self.params)} params, "
                f"{human(self.flops, 'FLOPs')} inclusive, "
                f"{human(self.exclusive.flops, 'FLOPs')} own)")


@dataclass(frozen=True)
class OpRecord:
    """Aggregated calls of one op overload in one module stack and phase."""

    module: str  # innermost running module: the exclusive owner
    stack: tuple  # the running module stack, root first
    phase: str  # a Phase (its value, a plain str, in a Profile read from a file)
    operator: str  # packet name, e.g. "aten.mm"
    overload: str  # e.g. "aten.mm.default"
    category: str  # a Category: EXACT, NO_ARITHMETIC, ESTIMATED, UNSUPPORTED or COMMUNICATION
    stats: Stats
    # the compute dtype of ops that do arithmetic (their first floating-point tensor
    # argument's, e.g. "bfloat16"): MFU's peak; None for ops without flops or floats
    dtype: Optional[str] = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stack"] = list(self.stack)
        return d


@dataclass(frozen=True)
class KernelTime:
    """What kernel timing (``timing=True`` on CUDA) found, summed over the blocks that
    recorded kernels (``measured_steps``) and those that reused each op signature's time
    (``reused_steps``). ``device_s``: every kernel, memcpy and memset the recorded blocks ran;
    ``attributed_s`` the part given to the ops that launched them, ``outside_s`` the part no
    op launched (rows ``kernel:<name>``); ``dropped``: records linked to a host event the trace
    lacked, ``unlinked``: records with no link at all (both counted in ``device_s`` and in a
    row outside every module); ``graph_replays``: CUDA graph launches; ``reused_s``: the op
    time the other blocks reused; ``drifts``: reusing blocks whose event wall drifted from it
    (the next block recorded again).

    >>> with FlopCounter(model, timing=True) as fc:  # on CUDA
    ...     model(x).sum().backward()
    >>> fc.kernel_time.attributed_share  # 1.0: every kernel time given to an op
    """

    device_s: float = 0.0
    attributed_s: float = 0.0
    outside_s: float = 0.0
    dropped: int = 0
    unlinked: int = 0
    graph_replays: int = 0
    measured_steps: int = 0
    reused_steps: int = 0
    reused_s: float = 0.0
    drifts: int = 0

    @property
    def attributed_share(self) -> float:
        """Share of the recorded device time given to ops (1.0 with none recorded)."""
        return self.attributed_s / self.device_s if self.device_s else 1.0

    @classmethod
    def of(cls, facts: Mapping) -> "KernelTime":
        """From ``RunFacts.kernels`` (ns and counts by ``KERNEL_FACTS``' names)."""
        seconds = {"device_ns", "attributed_ns", "outside_ns", "reused_ns"}
        return cls(**{(k[:-3] + "_s" if k in seconds else k):
                      (v / 1e9 if k in seconds else v) for k, v in facts.items()})


@dataclass(frozen=True)
class Coverage:
    """How the run's op calls were priced, counted by calls and by bytes moved (read +
    written). Both mappings have one key per category: ``EXACT`` (a formula),
    ``NO_ARITHMETIC`` (declared to do none: exactly priced at 0 flops), ``ESTIMATED``,
    ``UNSUPPORTED`` and ``COMMUNICATION`` (collectives: 0 flops, their bytes and wire bytes
    priced exactly).

    >>> with FlopCounter(model) as fc:
    ...     model(x)
    >>> fc.coverage().priced_exactly("calls"), fc.coverage().share(UNSUPPORTED, "bytes")
    """

    calls: Mapping[str, int]
    bytes_moved: Mapping[str, int]

    def _counts(self, by: str) -> Mapping[str, int]:
        if by == "calls":
            return self.calls
        if by == "bytes":
            return self.bytes_moved
        raise ValueError(f"by must be 'calls' or 'bytes', got {by!r}")

    def share(self, category: str, by: str = "calls") -> float:
        """The fraction (0..1) of calls or bytes in ``category``; 0.0 for an empty run."""
        if category not in CATEGORIES:
            raise ValueError(f"category must be one of {tuple(c.value for c in CATEGORIES)}, "
                             f"got {category!r}")
        counts = self._counts(by)
        whole = sum(counts.values())
        return counts[category] / whole if whole else 0.0

    def priced_exactly(self, by: str = "calls") -> float:
        """Share priced without estimate: by a formula, declared to do no arithmetic, or a
        collective."""
        return (self.share(EXACT, by) + self.share(NO_ARITHMETIC, by)
                + self.share(COMMUNICATION, by))

    def to_dict(self) -> dict:
        return {
            # plain strings for keys: what every JSON or YAML writer takes
            "calls": {str(c): n for c, n in self.calls.items()},
            "bytes_moved": {str(c): n for c, n in self.bytes_moved.items()},
            "share_by_calls": {str(c): self.share(c, "calls") for c in CATEGORIES},
            "share_by_bytes": {str(c): self.share(c, "bytes") for c in CATEGORIES},
        }

    def __repr__(self) -> str:
        def pair(share) -> str:
            return "/".join(f"{100.0 * share(by):.1f}%" for by in ("calls", "bytes"))

        return (f"Coverage(calls/bytes: priced exactly {pair(self.priced_exactly)}, estimated "
                f"{pair(lambda by: self.share(ESTIMATED, by))}, unsupported "
                f"{pair(lambda by: self.share(UNSUPPORTED, by))})")


def frozen_mapping(d: dict) -> Mapping:
    return MappingProxyType(dict(d))


def depth_of(name: str) -> int:
    """A module name's depth in the tree: 0 for the root, 1 for its children, ..."""
    return 0 if name == ROOT else name.count(".") + 1


def static_prefixes(name: str) -> list[str]:
    """'a.b.c' -> ['a', 'a.b', 'a.b.c']; the root has none."""
    if name == ROOT:
        return []
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def credited(stack: tuple, calls: Mapping[str, int]) -> set[str]:
    """Modules whose inclusive totals an op run under ``stack`` counts toward: every running
    module once, plus static ancestors never called themselves (ModuleList, ModuleDict)."""
    names = set(stack)
    for name in stack:
        for prefix in static_prefixes(name)[:-1]:
            if not calls.get(prefix):
                names.add(prefix)
    return names


def check_int(name: str, value, minimum: int) -> None:
    """``ValueError`` unless ``value`` is an int (not a bool) >= ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
