"""Op records, named once, and the one function that turns counted frames into rows.

The dispatch mode counts each op call into an *op record*, a list it indexes on the hot path:

    rec[CALLS]      calls counted
    rec[NS]         measured ns (timing on)
    rec[SIGNATURE]  the ``Signature`` every call of the record shares, or None for a view
                    (no arithmetic, no bytes) and for a record priced as it runs
    rec[SUMS]       for a record priced as it runs (a signature that cannot be hashed, such as
                    symbolic sizes): its ``PRICED`` counts summed over calls; else None

An op's flops and bytes are a function of its signature (the op, its arguments' shapes,
dtypes and strides), so a signature is worked out once (``Signature``) and priced once
(``Signature.unit``), and a record only counts calls. ``Captured`` copies a ledger's counts
when a counter ends and turns them into Profile rows when read: one row per (module stack,
phase, overload), counts in ``COUNTS`` order then ns.
"""

from __future__ import annotations

import weakref
from operator import itemgetter
from typing import Optional

from dispatch_flops.formulas import ELEMENT_COSTS

from ._results import COUNTS, PHASES, PRICED

CALLS, NS, SIGNATURE, SUMS = range(4)
ROW = COUNTS + ("ns",)  # a row's counts: every Stats count, then measured ns

_calls = itemgetter(CALLS)
_ns = itemgetter(NS)

CATEGORY_NAMES = {"formula": "exact", "no_arithmetic": "no_arithmetic",
                  "estimated": "estimated", "unsupported": "unsupported"}


class Signature:
    """One distinct call of an op, worked out from its arguments: the formula's arguments
    (``call``: ``(args, out_shape, kwargs)`` as the formula contract has them, or None for an
    op without a formula) and the bytes it reads and writes. Pure data (shapes, ints), never
    a tensor; priced once, when first read (``unit``)."""

    __slots__ = ("call", "bytes_read", "bytes_written", "_unit")

    def __init__(self, call, bytes_read: int, bytes_written: int):
        self.call = call
        self.bytes_read = bytes_read
        self.bytes_written = bytes_written
        self._unit: Optional[tuple] = None

    def unit(self, resolved) -> tuple:
        """What one call counts, in ``PRICED`` order (``resolved``: the op's resolution)."""
        if self._unit is None:
            self._unit = priced(resolved, self.call, self.bytes_read, self.bytes_written)
        return self._unit


def priced(resolved, call, bytes_read: int, bytes_written: int) -> tuple:
    """One call's ``PRICED`` counts: the formula's flops and MACs (zero without a formula),
    the bytes moved: the engine's figures unless the formula's ``Cost`` gives its own (an
    op that touches part of a tensor)."""
    cost = resolved.price(call)
    if cost.bytes_read is not None:
        bytes_read = cost.bytes_read
    if cost.bytes_written is not None:
        bytes_written = cost.bytes_written
    values = {"flops": cost.flops, "macs": cost.macs, "bytes_read": bytes_read,
              "bytes_written": bytes_written}
    return tuple(values[name] for name in PRICED)


class EngineCache:
    """What the engine derives from one registry at one version: op resolutions and worked-out
    signatures (per attention option), and each model's ledger. The formula library holds
    none of it; a registration (or a change to ``ELEMENT_COSTS``, which formulas read) bumps
    a version, and the next counter starts a new cache."""

    __slots__ = ("version", "resolutions", "signatures", "ledgers", "__weakref__")

    def __init__(self, version: tuple):
        self.version = version
        self.resolutions: dict = {}  # option -> {id(overload): resolution}
        self.signatures: dict = {}  # option -> {signature key: Signature}
        self.ledgers: dict = {}  # (id(model), option) -> (weakref to model, Ledger)


_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def engine_cache(registry) -> EngineCache:
    """The engine's cache for ``registry`` as it is now."""
    version = (registry.version, ELEMENT_COSTS.version)
    cache = _CACHES.get(registry)
    if cache is None or cache.version != version:
        cache = _CACHES[registry] = EngineCache(version)
    return cache


class Layout:
    """Which row each of a ledger's first ``n`` records counts toward, and (once priced) what
    one call of it counts. Records and frames are only ever appended, so a layout stays valid
    for its ledger until the ledger grows."""

    __slots__ = ("n", "keys", "row_of", "signatures", "summed", "units", "memo")

    def __init__(self, ledger, resolutions: dict):
        records = ledger.records
        self.n = len(records)
        index = {id(rec): i for i, rec in enumerate(records)}
        rows: dict[tuple, int] = {}
        self.keys: list[tuple] = []  # (stack, phase, operator, overload, category) per row
        self.row_of = [0] * self.n
        # (signature, resolution) per record, None for a view (nothing priced)
        self.signatures: list = [None] * self.n
        self.summed: list[int] = []  # records priced as they ran: their SUMS are read
        self.units: Optional[list] = None  # PRICED per call of each record, priced when read
        self.memo: Optional[tuple] = None  # (counts, rows) of the last rows made
        for frame in ledger.frames:
            for phase, acc in zip(PHASES, frame.acc):
                for key, rec in acc.items():
                    i = index.get(id(rec))
                    if i is None:  # made after this layout's records
                        continue
                    op = key if key.__class__ is int else key[0]
                    resolved = resolutions[op]
                    row = rows.get((frame.stack, phase, op))
                    if row is None:
                        row = rows[(frame.stack, phase, op)] = len(self.keys)
                        func = resolved.func
                        self.keys.append((frame.stack, phase, str(func.overloadpacket),
                                          str(func), CATEGORY_NAMES[resolved.category.value]))
                    self.row_of[i] = row
                    if rec[SIGNATURE] is not None:
                        self.signatures[i] = (rec[SIGNATURE], resolved)
                    elif rec[SUMS] is not None:
                        self.summed.append(i)

    def priced_units(self) -> list:
        if self.units is None:
            zero = (0,) * len(PRICED)
            self.units = [zero if s is None else s[0].unit(s[1]) for s in self.signatures]
        return self.units


class Captured:
    """A ledger's counts as they were when captured, with the layout that reads them: cheap
    to take (columns copied in C), priced and summed into rows only when read (``rows``)."""

    __slots__ = ("layout", "calls", "ns", "sums")

    def __init__(self, ledger, resolutions: dict):
        records = ledger.records
        layout = ledger.layout
        if layout is None or layout.n != len(records):
            layout = ledger.layout = Layout(ledger, resolutions)
        self.layout = layout
        self.calls = list(map(_calls, records))
        self.ns = list(map(_ns, records))
        self.sums = tuple(tuple(records[i][SUMS]) for i in layout.summed)

    def rows(self) -> tuple:
        """``((key, counts), ...)``: ``key`` is ``(stack, phase, operator, overload,
        category)``, ``counts`` in ``ROW`` order; in the order the frames and ops were first
        met; rows that counted nothing are left out. Counts equal to the layout's last rows'
        give those rows again (the same tuple)."""
        layout, calls, ns = self.layout, self.calls, self.ns
        memo = (calls, ns, self.sums)
        if layout.memo is not None and layout.memo[0] == memo:
            return layout.memo[1]
        units = layout.priced_units()
        width = len(ROW)
        totals: list[Optional[list]] = [None] * len(layout.keys)
        summed = dict(zip(layout.summed, self.sums))
        for i, n in enumerate(calls):
            if not n and not ns[i]:
                continue
            row = layout.row_of[i]
            total = totals[row]
            if total is None:
                total = totals[row] = [0] * width
            total[0] += n
            extra = summed.get(i)
            if extra is None:
                for j, per_call in enumerate(units[i], 1):
                    total[j] += n * per_call
            else:  # priced as it ran: the sums themselves
                for j, value in enumerate(extra, 1):
                    total[j] += value
            total[-1] += ns[i]
        rows = tuple((layout.keys[r], tuple(t)) for r, t in enumerate(totals) if t is not None)
        layout.memo = (memo, rows)
        return rows
