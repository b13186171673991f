"""The formula registry: one place that says how every ATen op is priced.

The formula contract, stated once:

    formula(*args, out_shape, **kwargs) -> Cost

``args``/``kwargs`` are the op's own arguments with every ``Tensor`` replaced by its shape
(a ``torch.Size``; lists of tensors become lists of shapes). ``out_shape`` has the structure
of the op's output with the same replacement. A formula is plain arithmetic: it never sees
tensor values, devices or globals. 1 MAC = 2 flops; ``macs`` counts multiply-accumulates only.

An op falls in exactly one of three categories, kept apart everywhere:

* it has a formula (``FORMULA``);
* it does no arithmetic (``NO_ARITHMETIC``): views, metadata, copies, allocation; whether it
  moves bytes is part of its declaration (see ``Movement``);
* it is unknown (``UNSUPPORTED``): reported, never silently priced as zero.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Optional, Union

import torch
from torch._ops import OpOverload, OpOverloadPacket


class Cost(NamedTuple):
    """What one op call costs in arithmetic. ``flops`` includes the ``2 * macs``."""

    flops: int
    macs: int = 0


ZERO_COST = Cost(0, 0)

Formula = Callable[..., Cost]
OpLike = Union[OpOverload, OpOverloadPacket]


class Category(enum.Enum):
    FORMULA = "formula"
    NO_ARITHMETIC = "no_arithmetic"
    UNSUPPORTED = "unsupported"


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


UNSUPPORTED_ENTRY = Entry(Category.UNSUPPORTED)


def _as_op(op) -> OpLike:
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


def _packet_of(op: OpLike) -> OpOverloadPacket:
    return op.overloadpacket if isinstance(op, OpOverload) else op


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
        # for callers that cache what they derive from lookups; emptied on every change
        self.lookup_cache: dict = {}

    @staticmethod
    def _normalise(ops) -> list:
        ops = list(ops) if isinstance(ops, (list, tuple, set, frozenset)) else [ops]
        return [_as_op(op) for op in ops]

    def _put(self, ops: list, entry: Entry, override: bool) -> None:
        for op in ops:
            table = self._overloads if isinstance(op, OpOverload) else self._packets
            if op in table and not override:
                raise ValueError(
                    f"{op} is already registered; pass override=True to replace its formula"
                )
            table[op] = entry
        self.lookup_cache.clear()

    def formula(self, ops, *, override: bool = False) -> Callable[[Formula], Formula]:
        """Decorator: price ``ops`` (one op or a list; packets or overloads) with a formula."""

        ops = self._normalise(ops)  # fail at the decorator line, not later

        def decorate(fn: Formula) -> Formula:
            self._put(ops, Entry(Category.FORMULA, fn), override)
            return fn

        return decorate

    def no_arithmetic(
        self, ops: Iterable, movement: Movement, *, override: bool = False
    ) -> None:
        """Declare ``ops`` as doing no arithmetic, moving memory as ``movement`` says."""
        self._put(self._normalise(ops), Entry(Category.NO_ARITHMETIC, movement=movement), override)

    def lookup(self, op: OpOverload) -> Entry:
        """The one lookup: overload override, then packet, then unsupported."""
        entry = self._overloads.get(op)
        if entry is None:
            entry = self._packets.get(op.overloadpacket, UNSUPPORTED_ENTRY)
        return entry

    def has(self, op: OpLike) -> bool:
        op = _as_op(op)
        if isinstance(op, OpOverload):
            return self.lookup(op).category is not Category.UNSUPPORTED
        if op in self._packets:
            return True
        return any(o.overloadpacket is op for o in self._overloads)


REGISTRY = Registry()
register_formula = REGISTRY.formula


def has_formula(op: OpLike) -> bool:
    """Whether ``op`` is classified: it has a formula or is declared to do no arithmetic."""
    return REGISTRY.has(op)
