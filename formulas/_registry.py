"""The formula registry: one place that says how every ATen op is priced.

The formula contract, stated once:

    formula(*args, out_shape, **kwargs) -> Cost

``args``/``kwargs`` are the op's own arguments with every ``Tensor`` replaced by its shape
(a ``torch.Size``; lists of tensors become lists of shapes). ``out_shape`` has the structure
of the op's output with the same replacement (``None`` for ops that return nothing, such as
the in-place ``_foreach_*_`` ops). A formula is plain arithmetic: it never sees tensor values,
devices or globals. 1 MAC = 2 flops; ``macs`` counts multiply-accumulates only.

A formula is called once per distinct call signature and its result reused, so it must be a
function of what it is given. A Python float argument may change the result only through
whether it equals 0, 1, 2, -1 or an infinity ("is alpha 1", "is p 2"): calls whose floats
differ otherwise share a signature (an optimizer's step size changes every step), and the
formula sees the first such call's value.

Keyword parameters are opt-in: the engine passes them only to a formula whose signature
names them.

* ``dtypes``: a list parallel to the positional ``args``: the ``torch.dtype`` of a tensor, a
  list of dtypes for a tensor list, ``None`` for anything else. For formulas whose count
  depends on the dtype: complex-valued ops count real flops (a complex multiply is 6), and
  indexing tells a boolean mask from integer indices. Formulas that do not name it never
  pay for it.
* ``layouts``: a list parallel to the positional ``args``: a ``SparseInfo`` (layout, stored
  values) for a sparse tensor, ``None`` for anything else. A formula that names it prices calls
  with sparse arguments (the shapes it sees stay the dense shapes); a call with a sparse
  argument whose formula does not name it is reported unsupported (its bytes, the values and
  indices stored, are counted).
* ``int_values``: a list parallel to the positional ``args``: the values (a tuple) of a small
  1-D integer tensor argument on the CPU, ``None`` for anything else. For the few ops whose
  price is a function of such values (a varlen attention kernel's cumulative sequence
  lengths); the values join the call's signature. A tensor on an accelerator is not read
  (the host would wait for the device): the formula prices without it (a bound).
* ``group_size``: the size of the process group a collective was called on (1 when it names
  none).
* ``group_rank``: this process's rank in that group (0 when it names none): what an uneven
  all-to-all or a rooted collective sends depends on it.

The engine keeps these keywords in one table (``engine.counting.calls.KEYWORDS``): a new
keyword is a row there and a bullet here.

A formula returns a ``Cost`` of integers >= 0 (numpy integers are taken as ints). One that
raises, or returns anything else, loses nothing else of the run: its calls are reported
unsupported, with the error, and a warning says so.

Bytes. The engine counts every tensor input as read and every output as written (at its real
size: an expanded dim counts once). An op that touches only part of a tensor says so in its
``Cost``: ``bytes_read`` / ``bytes_written`` replace the engine's figure (``None`` keeps it).
Partial writes (``copy_`` into a slice, ``index_copy_``, ``index_put_``, ``scatter_``) read
their source and indices, the destination only where the op combines with it, and write the
region they address; gathers (``embedding``) read the rows they look up. Such a formula counts
dense bytes of the shapes it is given (``numel * dtype.itemsize``), so it names ``dtypes``.
A no-arithmetic op may have a bytes formula too (``Registry.no_arithmetic(..., bytes=f)``):
it stays in its category and its formula returns 0 flops.

Communication. A collective or point-to-point op (``c10d``, ``_c10d_functional``) is
registered with ``Registry.collective``; its formula returns a ``Cost`` with ``comm_bytes``,
what this rank puts on the wire (the ring convention in docs/conventions.md), its
``comm_alg_bytes``, the collective's size as NCCL-tests' algorithm bandwidth reads it, and 0
flops. It may name the keywords ``group_size`` and ``group_rank`` (above).

An op falls in exactly one of five categories, kept apart everywhere:

* it has a formula (``EXACT``: priced exactly by it);
* it does no arithmetic (``NO_ARITHMETIC``): views, metadata, copies, allocation, indexing;
  whether it moves bytes is part of its declaration (see ``Movement``);
* it has no formula, but a tag it carries (``torch.Tag.pointwise``, ``torch.Tag.reduction``)
  gives a sound family estimate (``ESTIMATED``): priced, and flagged as an estimate in every
  report;
* it is unknown (``UNSUPPORTED``): reported, never silently priced as zero;
* it communicates (``COMMUNICATION``): a collective, priced by its bytes on the wire.

An op may be named by its qualified name, a string (``"mylib::my_op"``, or
``"mylib::my_op.overload"``): a name of an op that exists is that op. A name of no op is a
``ValueError`` (a misspelt name would otherwise be accepted and never met), unless the
registration says ``lazy=True``: for an op registered only when a module is imported later
(a custom op's library; ``fsdp::all_gather_copy_in`` appears with ``torch.distributed.fsdp``),
the formula waits for the op and prices it from the moment it exists. ``Registry.has``
answers for ops that exist, and for a name of one that does not exist (yet), False.

The one lookup (``Registry.lookup``): overload override, then packet, then tag estimate, then
unsupported. A registered formula always wins over an estimate.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Optional, Union

import torch
from torch._ops import OpOverload, OpOverloadPacket


class Cost(NamedTuple):
    """What one op call costs. ``flops`` includes the ``2 * macs``; ``masked_flops`` and
    ``masked_macs`` are the part of them a mask made useless (attention). ``bytes_read`` and
    ``bytes_written`` are ``None`` (the engine's rule: every tensor input read, every output
    written) unless the op touches only part of a tensor; see "Bytes" in the module's
    docstring."""

    flops: int
    macs: int = 0
    bytes_read: Optional[int] = None
    bytes_written: Optional[int] = None
    comm_bytes: int = 0  # bytes this rank puts on the wire (collectives only)
    # the collective's size S (NCCL-tests' algbw = S / time; collectives only)
    comm_alg_bytes: int = 0
    # of flops / macs: the work spent on masked attention pairs and on a fused backward's
    # recomputation (hardware minus model flops, docs/conventions.md); at most flops / macs
    masked_flops: int = 0
    masked_macs: int = 0


ZERO_COST = Cost(0, 0)

Formula = Callable[..., Cost]
OpLike = Union[OpOverload, OpOverloadPacket]


class Category(str, enum.Enum):
    """How an op is priced (see "five categories" in the module's docstring). A member is its
    string: the value is the name reports and saved profiles use (``Category.EXACT ==
    "exact"``), and ``str()``, f-strings and ``format()`` give that value on every Python
    (a plain mixed-in enum's own give ``Category.EXACT``)."""

    EXACT = "exact"  # priced by a formula
    NO_ARITHMETIC = "no_arithmetic"
    ESTIMATED = "estimated"
    UNSUPPORTED = "unsupported"
    COMMUNICATION = "communication"
    # the library's old name for EXACT (an alias: Category.FORMULA is Category.EXACT), and
    # its old value, "formula", read as EXACT: code written against 0.1 keeps working
    FORMULA = "exact"

    @classmethod
    def _missing_(cls, value: object) -> Optional[Category]:
        return cls.EXACT if value == "formula" else None

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    def __repr__(self) -> str:  # as its string's (see results.stats.StringEnum)
        return repr(self.value)


class Movement(enum.Enum):
    """How an op that does no arithmetic touches memory."""

    NONE = "none"  # views, metadata, uninitialised allocation: no bytes move
    COPY = "copy"  # reads its tensor inputs and writes its outputs (clone, cat, copy_)
    WRITE = "write"  # writes its outputs only (zeros, fill_)


@dataclass(frozen=True)
class Entry:
    """How one ``OpOverload`` is priced: the result of a registry lookup."""

    category: Category
    formula: Optional[Formula] = None
    movement: Movement = Movement.COPY
    # the dtype the op computes in where its tensor arguments do not say (a quantised op
    # computes in "int8" on float32 or quint8 tensors); None: the engine's rule
    dtype: Optional[str] = None


UNSUPPORTED_ENTRY = Entry(Category.UNSUPPORTED)


class _Missing(str):
    """An op this torch does not have, as its qualified name (``"aten::_grouped_mm"``, and
    ``"aten::_grouped_mm.default"`` for an overload): registered like an op registered later,
    it is never met, so the library imports on every torch the package supports (>= 2.8)."""

    __slots__ = ()

    def __getattr__(self, attr: str) -> "_Missing":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self}.{attr}")


class namespace:
    """``torch.ops.<name>`` for the formula modules: an op the running torch lacks reads as
    a ``_Missing`` name instead of raising ``AttributeError`` at import."""

    def __init__(self, name: str):
        self._name = name
        self._ops = getattr(torch.ops, name)

    def __getattr__(self, op: str):
        try:
            return getattr(self._ops, op)
        except AttributeError:
            if op.startswith("__"):
                raise
            return _Missing(f"{self._name}::{op}")

    def present(self, names) -> list:
        """The ops among ``names`` that this torch has (lists of ops to register skip the
        rest): possibly none, which a registration takes as nothing to price on this torch."""
        return _Present(getattr(self._ops, n) for n in names if hasattr(self._ops, n))


class _Present(list):
    """``namespace.present``'s answer: the ops of a list this torch has, which may be none
    (an empty list given to a registration otherwise is a mistake: ``ValueError``)."""


def _existing(name: str) -> Optional[OpOverloadPacket]:
    """The packet a qualified name (``"namespace::name"``, or ``"namespace::name.overload"``)
    names, None while no such op is registered."""
    namespace_name, _, op = name.partition("::")
    try:
        found = getattr(getattr(torch.ops, namespace_name), op.split(".")[0])
    except (AttributeError, RuntimeError):
        return None
    return found if isinstance(found, OpOverloadPacket) else None


def _named_op(name: str, lazy: bool) -> Union[OpLike, str]:
    """The op a qualified name names, or, for a name of no op yet, the name itself when the
    registration is ``lazy`` (the op's library loads later) and a ``ValueError`` otherwise."""
    if isinstance(name, _Missing):  # the formula library's own: an op of another torch
        return name
    packet = _existing(name)
    overload = name.partition("::")[2].partition(".")[2]
    if packet is not None and not overload:
        return packet
    if packet is not None and overload in packet.overloads():
        return getattr(packet, overload)
    if lazy:
        return name
    if packet is not None:
        raise ValueError(f"{name!r}: {packet._qualified_op_name} has no overload {overload!r} "
                         f"(its overloads: {', '.join(packet.overloads())})")
    raise ValueError(
        f"no op named {name!r} exists: check the spelling (torch.ops.{name.replace('::', '.')} "
        "is not defined); for a custom op whose library is loaded later, register its name "
        "before with lazy=True (register_formula(name, lazy=True)): the formula prices the op "
        "from when it is defined")


def _as_op(op, lazy: bool = False) -> Union[OpLike, str]:
    if isinstance(op, str):  # "namespace::name"
        namespace_name, _, name = op.partition("::")
        if not namespace_name or not name or name.startswith("."):
            raise TypeError(f"expected an OpOverload (torch.ops.aten.mm.default), an "
                            f"OpOverloadPacket (torch.ops.aten.mm), a torch.library custom op "
                            f"or a qualified name 'namespace::name', got {op!r}")
        return _named_op(op, lazy)
    # A `torch.library.custom_op` returns a CustomOpDef; its overload is what dispatches.
    inner = getattr(op, "_opoverload", None)
    if inner is not None:
        return inner
    if isinstance(op, (OpOverload, OpOverloadPacket)):
        return op
    raise TypeError(
        f"expected an OpOverload (torch.ops.aten.mm.default), an OpOverloadPacket "
        f"(torch.ops.aten.mm) or a torch.library custom op, got {op!r}"
    )


def _check_formula(fn) -> None:
    """A formula must be callable as the contract calls it: ``fn(*args, out_shape=...)``."""
    if not callable(fn):
        raise TypeError(f"a formula must be a function fn(*args, out_shape, **kwargs) -> Cost, "
                        f"got {fn!r}")
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: taken on trust
        return
    kinds = {p.kind for p in parameters}
    takes_out = any(p.name == "out_shape" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                    for p in parameters) or inspect.Parameter.VAR_KEYWORD in kinds
    if not takes_out:
        raise TypeError(f"formula {getattr(fn, '__name__', fn)!r} must take the keyword "
                        "out_shape (the contract: fn(*args, out_shape, **kwargs) -> Cost)")


def _table_of(op) -> str:
    if isinstance(op, str):
        return "_named"
    return "_overloads" if isinstance(op, OpOverload) else "_packets"


class Registry:
    """Formulas keyed by ``OpOverloadPacket``, with optional per-``OpOverload`` overrides.

    >>> registry = Registry()
    >>> @registry.formula(torch.ops.aten.mm)
    ... def mm(a, b, *, out_shape):
    ...     return Cost(2 * a[0] * a[1] * b[1], a[0] * a[1] * b[1])
    """

    def __init__(self) -> None:
        self._packets: dict[OpOverloadPacket, Entry] = {}
        self._overloads: dict[OpOverload, Entry] = {}
        self._named: dict[str, Entry] = {}  # "namespace::name" of ops registered on import
        self._tag_estimates: dict[torch.Tag, Entry] = {}  # in registration order
        # bumped on every change: callers that cache what they derive from lookups compare it
        self.version = 0

    @staticmethod
    def _normalise(ops, lazy: bool = False) -> list:
        if isinstance(ops, (list, tuple, set, frozenset)):
            if not ops and not isinstance(ops, _Present):
                raise ValueError("no ops given: name at least one op (an OpOverload, an "
                                 "OpOverloadPacket, a custom op or a qualified name)")
            ops = list(ops)
        else:
            ops = [ops]
        return [_as_op(op, lazy) for op in ops]

    def _put(self, ops: list, entry: Entry, override: bool) -> None:
        if not override:
            for op in ops:
                # an overload's entry would shadow its packet's (a packet's entry never
                # replaces an overload's: those keep winning the lookup)
                if isinstance(op, OpOverload):
                    taken = op in self._overloads or op.overloadpacket in self._packets
                else:
                    taken = op in getattr(self, _table_of(op))
                if taken:
                    raise ValueError(f"{op} is already registered (it or its packet has a "
                                     "formula); pass override=True to replace it")
        for op in ops:
            getattr(self, _table_of(op))[op] = entry
        self.version += 1

    def formula(self, ops, *, override: bool = False, dtype: Optional[str] = None,
                lazy: bool = False) -> Callable[[Formula], Formula]:
        """Decorator: price ``ops`` (one op or a list; packets, overloads or qualified names)
        with a formula. ``dtype`` names the dtype the ops compute in ("int8" for a quantised
        GEMM) where the engine's rule, the first floating-point tensor argument's, would not
        say it. ``lazy=True`` takes a qualified name of an op not defined yet (its library
        loads later); without it such a name is a ``ValueError``."""

        ops = self._normalise(ops, lazy)  # fail at the decorator line, not later

        def decorate(fn: Formula) -> Formula:
            _check_formula(fn)
            self._put(ops, Entry(Category.EXACT, fn, dtype=dtype), override)
            return fn

        return decorate

    def no_arithmetic(
        self, ops: Iterable, movement: Movement, *, bytes: Optional[Formula] = None,
        override: bool = False, lazy: bool = False
    ) -> None:
        """Declare ``ops`` as doing no arithmetic, moving memory as ``movement`` says; or, for
        ops that touch part of a tensor, as ``bytes`` (a formula whose ``Cost`` has 0 flops
        and the bytes read and written) says. ``lazy``: as for ``formula``."""
        self._put(self._normalise(ops, lazy),
                  Entry(Category.NO_ARITHMETIC, bytes, movement=movement), override)

    def collective(self, ops, *, override: bool = False,
                   lazy: bool = False) -> Callable[[Formula], Formula]:
        """Decorator: price the communication ``ops`` with a formula whose ``Cost`` gives
        ``comm_bytes`` and ``comm_alg_bytes`` (and 0 flops); it may name ``group_size`` and
        ``group_rank`` (see the module's docstring). ``lazy``: as for ``formula``."""
        ops = self._normalise(ops, lazy)

        def decorate(fn: Formula) -> Formula:
            _check_formula(fn)
            self._put(ops, Entry(Category.COMMUNICATION, fn), override)
            return fn

        return decorate

    def estimate(self, tag: torch.Tag, fn: Formula, *, override: bool = False) -> None:
        """Price ops that carry ``tag`` and have no formula with ``fn``, flagged as estimated.
        The first registered tag an op carries wins."""
        if not isinstance(tag, torch.Tag):
            raise TypeError(f"expected a torch.Tag (torch.Tag.pointwise), got {tag!r}")
        if tag in self._tag_estimates and not override:
            raise ValueError(f"{tag} already has an estimate; pass override=True to replace it")
        _check_formula(fn)
        self._tag_estimates[tag] = Entry(Category.ESTIMATED, fn)
        self.version += 1

    def lookup(self, op: OpOverload) -> Entry:
        """The one lookup: overload override, then packet, then tag estimate, then unsupported."""
        entry = self._overloads.get(op)
        if entry is None:
            entry = self._packets.get(op.overloadpacket)
            if entry is None:
                entry = self._named_entry(op) if self._named else None
                if entry is None:
                    entry = self._estimate(op)
        return entry

    def _named_entry(self, op: OpOverload) -> Optional[Entry]:
        name = op._schema.name
        entry = self._named.get(f"{name}.{op._overloadname}")
        return entry if entry is not None else self._named.get(name)

    def _estimate(self, op: OpOverload) -> Entry:
        if self._tag_estimates:
            tags = op.tags
            for tag, entry in self._tag_estimates.items():
                if tag in tags:
                    return entry
        return UNSUPPORTED_ENTRY

    def has(self, op: Union[OpLike, str]) -> bool:
        """Whether ``op`` is classified: a formula or declared no-arithmetic. Estimates do not
        count: they are a fallback, not a classification. A qualified name answers for the
        op it names, False while no such op exists (a formula registered for it waits)."""
        op = _as_op(op, lazy=True)  # a name of no op (yet) is an answer here: False
        if isinstance(op, str):
            packet = _existing(op)
            if packet is None:
                return False
            op = packet
        if isinstance(op, OpOverload):
            category = self.lookup(op).category
            return category in (Category.EXACT, Category.NO_ARITHMETIC,
                                Category.COMMUNICATION)
        if op in self._packets or op._qualified_op_name in self._named:
            return True
        return any(o.overloadpacket is op for o in self._overloads)


REGISTRY = Registry()
register_formula = REGISTRY.formula


def has_formula(op: OpLike) -> bool:
    """Whether ``op`` is classified: it has a formula or is declared to do no arithmetic."""
    return REGISTRY.has(op)
