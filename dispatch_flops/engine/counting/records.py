"""Op records, named once, and the one function that turns counted frames into rows.

The dispatch mode counts each op call into an *op record*, a list it indexes on the hot path:

    rec[CALLS]      calls counted
    rec[NS]         measured ns (timing on)
    rec[SIGNATURE]  the ``Signature`` every call of the record shares, or None for a view
                    (no arithmetic, no bytes)

An op's flops and bytes are a function of its signature (the op, its arguments' shapes,
dtypes and strides; sparse and symbolic tensors by what they store, see ``mode``), so a
signature is worked out once (``Signature``) and priced once (``Signature.unit``), and a
record only counts calls. ``Captured`` copies a ledger's counts when a counter ends and turns
them into Profile rows when read: one row per (module stack, phase, overload), counts in
``COUNTS`` order then ns. A formula that fails, or returns what is not a ``Cost`` of
integers within the bounds of ``results.validate`` (0 to 2**100 - 1), loses nothing else:
its calls are reported unsupported, with the error (``PricingError``), and warned about once.
"""

from __future__ import annotations

import operator
import warnings
import weakref
from collections import OrderedDict
from operator import itemgetter
from typing import Optional, Union

from dispatch_flops.engine.counting.nested import PerSequence
from dispatch_flops.engine.masks import tally as _tally
from dispatch_flops.engine.masks.tally import TALLY, read_all
from dispatch_flops.formulas import ELEMENT_COSTS, Cost
from dispatch_flops.formulas.attention import CAUSAL_DIAGONAL_FORMULAS
from dispatch_flops.formulas.costs import CostTable
from dispatch_flops.results import validate
from dispatch_flops.results.rows import ROW, RowKey
from dispatch_flops.results.stats import PHASES, PRICED, UNSUPPORTED

# an op record's slots; a fourth, masks.tally.TALLY, holds the masked pairs of an op that
# reads a mask, when present
CALLS, NS, SIGNATURE = range(3)
_FLOPS, _MACS = PRICED.index("flops"), PRICED.index("macs")
_MASKED_FLOPS, _MASKED_MACS = PRICED.index("masked_flops"), PRICED.index("masked_macs")
# where a tally's figures go in a row's counts (ROW: calls, then PRICED, then ns)
_ROW_FLOPS, _ROW_MACS = ROW.index("flops"), ROW.index("macs")
_ROW_MASKED_FLOPS, _ROW_MASKED_MACS = ROW.index("masked_flops"), ROW.index("masked_macs")

_calls = itemgetter(CALLS)
_ns = itemgetter(NS)


class PricingError(Exception):
    """A formula that raised, or returned what is not a ``Cost`` of counts
    (integers from 0 to 2**100 - 1: ``results.validate``)."""


class Signature:
    """One distinct call of an op, worked out from its arguments: the formula's arguments
    (``call``: ``(args, out_shape, kwargs)`` as the formula contract has them, or None for an
    op without a formula) and the bytes it reads and writes. Pure data (shapes, ints), never
    a tensor; priced once, when first read (``unit``). ``dtype``: the compute dtype, the
    name of the first floating-point tensor argument's dtype ("bfloat16"), "int8" for int8
    operands without one (``_int_mm``), None otherwise: MFU divides each op's flops by the
    peak of its dtype."""

    __slots__ = ("call", "bytes_read", "bytes_written", "dtype", "_unit")

    def __init__(self, call, bytes_read: int, bytes_written: int,
                 dtype: Optional[str] = None):
        self.call = call
        self.bytes_read = bytes_read
        self.bytes_written = bytes_written
        self.dtype = dtype
        # what one call counts, in PRICED order, or the PricingError its formula gave; None
        # until first read
        self._unit: Union[tuple, PricingError, None] = None

    def set_cost(self, flops: int, macs: int, masked_flops: int = 0,
                 masked_macs: int = 0) -> None:
        """Price the call now, with these flops and MACs, the masked share of them given
        (a composite's decomposition)."""
        self._unit = unit_of(Cost(flops, macs, masked_flops=masked_flops,
                                  masked_macs=masked_macs),
                             self.bytes_read, self.bytes_written, "a composite's decomposition")

    def unit(self, resolved) -> tuple:
        """What one call counts, in ``PRICED`` order (``resolved``: the op's resolution);
        ``PricingError`` when its formula fails (raised again on every read)."""
        unit = self._unit
        if unit is None:
            try:
                unit = unit_for(resolved, self.call, self.bytes_read, self.bytes_written)
            except Exception as e:  # a user's formula may raise anything
                unit = e if isinstance(e, PricingError) else PricingError(
                    f"{resolved.func} with {_shapes_of(self.call)}: the formula raised "
                    f"{type(e).__name__}: {e}")
            self._unit = unit
        if isinstance(unit, PricingError):
            raise unit
        return unit


def _shapes_of(call) -> str:
    if call is None:
        return "no arguments"
    if call.__class__ is PerSequence:  # a nested call: its first sequence's
        return f"{_shapes_of(call[0][1])} (sequence 1 of a nested call)"
    args, out_shape, kwargs = call
    shown = [tuple(a) if isinstance(a, (list, tuple)) else a for a in args]
    return f"args {shown}" + (f", kwargs {kwargs}" if kwargs else "")


def _count(name: str, value, where: str) -> int:
    """``value`` as a count, within the bounds every count of a Profile keeps
    (``results.validate``: an int from 0 to 2**100 - 1), else ``PricingError``."""
    if isinstance(value, bool):  # a flag, not a count
        problem: Optional[str] = f" is {value}, not an integer"
    else:
        try:
            value = operator.index(value)  # ints, numpy integers
        except TypeError:
            problem = f" is {validate.shown(value)}, not an integer"
        else:
            problem = validate.count(value)
    if problem is not None:
        raise PricingError(f"{where}: {name}{problem}")
    return value


def bytes_only(signature: "Signature") -> tuple:
    """A call's ``PRICED`` counts when its formula failed: the bytes it moved, flops unknown
    (zero, and the call reported unsupported)."""
    values = {"bytes_read": signature.bytes_read, "bytes_written": signature.bytes_written}
    return tuple(values.get(name, 0) for name in PRICED)


def unit_for(resolved, call, bytes_read: int, bytes_written: int) -> tuple:
    """One call's ``PRICED`` counts: the formula's flops and MACs (zero without a formula),
    the bytes moved: the engine's figures unless the formula's ``Cost`` gives its own (an
    op that touches part of a tensor). ``PricingError`` when the formula returns what is not
    a ``Cost`` of counts."""
    return unit_of(resolved.price(call), bytes_read, bytes_written,
                   f"{resolved.func} with {_shapes_of(call)}")


def unit_of(cost, bytes_read: int, bytes_written: int, where: str) -> tuple:
    """One call's ``PRICED`` counts from its ``Cost`` and the engine's byte figures (which the
    ``Cost`` may replace), each checked: ``PricingError`` unless counts (``_count``)."""
    if not isinstance(cost, Cost):
        raise PricingError(f"{where}: the formula returned {cost!r}, not a "
                           "dispatch_flops.Cost(flops, macs)")
    if cost.bytes_read is not None:
        bytes_read = _count("bytes_read", cost.bytes_read, where)
    if cost.bytes_written is not None:
        bytes_written = _count("bytes_written", cost.bytes_written, where)
    values = {"flops": _count("flops", cost.flops, where),
              "macs": _count("macs", cost.macs, where),
              "bytes_read": bytes_read, "bytes_written": bytes_written,
              "comm_bytes": _count("comm_bytes", cost.comm_bytes, where),
              "comm_alg_bytes": _count("comm_alg_bytes", cost.comm_alg_bytes, where),
              "masked_flops": _count("masked_flops", cost.masked_flops, where),
              "masked_macs": _count("masked_macs", cost.masked_macs, where)}
    if values["masked_flops"] > values["flops"] or values["masked_macs"] > values["macs"]:
        raise PricingError(f"{where}: masked work exceeds the work ({cost!r})")
    return tuple(values[name] for name in PRICED)


class EngineCache:
    """What the engine derives from one registry at one version: op resolutions and worked-out
    signatures, and each model's ledger. The formula library holds
    none of it; a registration (or a change to ``ELEMENT_COSTS``, which formulas read) bumps
    a version, and the next counter starts a new cache."""

    __slots__ = ("version", "resolutions", "signatures", "ledgers", "logical", "steps",
                 "__weakref__")

    def __init__(self, version: tuple):
        self.version = version
        self.resolutions: dict = {}  # {id(overload): resolution}
        # {signature key: Signature}, the last mode.SIGNATURES_KEPT met (an LRU)
        self.signatures: OrderedDict = OrderedDict()
        self.ledgers: dict = {}  # id(model) -> (weakref to model, Ledger)
        # {logical call key: (Signature or None, output elements)}, an LRU too
        self.logical: OrderedDict = OrderedDict()
        # {optimizer, weakly: engine.counting.step_replay.Learned}: what its steps count
        self.steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# formulas types it as the dict it is; its changes are counted (``CostTable.version``)
assert isinstance(ELEMENT_COSTS, CostTable)
_ELEMENT_COSTS: CostTable = ELEMENT_COSTS


def engine_cache(registry) -> EngineCache:
    """The engine's cache for ``registry`` as it is now."""
    version = (registry.version, _ELEMENT_COSTS.version)
    cache = _CACHES.get(registry)
    if cache is None or cache.version != version:
        cache = _CACHES[registry] = EngineCache(version)
    return cache


def tallied(records: list) -> list:
    """``[(index, Tally)]`` of ``records`` holding a mask's tally, looked for in each."""
    return [(i, rec[TALLY]) for i, rec in enumerate(records) if len(rec) > TALLY]


class Layout:
    """Which row each of a ledger's first ``n`` records counts toward, and what one call of it
    counts. A row of ops that do arithmetic is split by the ops' compute dtype (the
    signature's); other rows carry dtype None. Records and frames are only ever appended, so
    a layout stays valid for its ledger until the ledger grows. Made when a counter ends (or
    is read): the signatures met for the first time are priced then."""

    __slots__ = ("n", "keys", "row_of", "units", "errors", "memo", "causal", "_units_skipping",
                 "_tallied", "_tallied_at")

    def __init__(self, ledger, resolutions: dict):
        records = ledger.records
        self.n = len(records)
        index = {id(rec): i for i, rec in enumerate(records)}
        rows: dict[tuple, int] = {}
        # (stack, phase, operator, overload, category, dtype) per row
        self.keys: list[tuple] = []
        self.row_of = [0] * self.n
        zero = (0,) * len(PRICED)
        self.units: list[tuple] = [zero] * self.n  # PRICED per call of each record
        self.errors: list[str] = []  # formulas that failed (their calls: unsupported)
        self.memo: Optional[tuple] = None  # (counts, rows) of the last rows made
        # the records priced by a formula whose masked share is the causal diagonal alone
        # (``units_skipping_causal``)
        self.causal: list[int] = []
        self._units_skipping: Optional[list] = None
        self._tallied: list = []  # see tallies
        self._tallied_at = -1
        for frame in ledger.frames:
            for phase, acc in zip(PHASES, frame.acc):
                for key, rec in acc.items():
                    i = index.get(id(rec))
                    if i is None:  # made after this layout's records
                        continue
                    op = key if key.__class__ is int else key[0]
                    resolved = resolutions[op]
                    func = resolved.func
                    category = resolved.category
                    signature = rec[SIGNATURE]
                    dtype = None
                    if signature is not None:
                        try:
                            self.units[i] = signature.unit(resolved)
                        except PricingError as e:
                            self._failed(str(e))
                            self.units[i] = bytes_only(signature)
                            category = UNSUPPORTED
                        if self.units[i][_FLOPS]:
                            dtype = signature.dtype
                        # (a flex call's resolution, engine.counting.flex's, has no formula)
                        if getattr(resolved, "formula", None) in CAUSAL_DIAGONAL_FORMULAS:
                            self.causal.append(i)
                    row_key = (frame.stack, phase, op, category, dtype)
                    row = rows.get(row_key)
                    if row is None:
                        row = rows[row_key] = len(self.keys)
                        # plain strings, as a Profile read from a file holds them
                        self.keys.append(RowKey(frame.stack, str(phase),
                                                str(func.overloadpacket), str(func),
                                                str(category), dtype))
                    self.row_of[i] = row

    def tallies(self, records: list) -> list:
        """``[(index, Tally)]`` of the records holding a mask's tally (``records``: its
        ledger's, as many as it lays out), looked for again only when some record was given a
        tally since the last look (``tally.TALLIES_MADE``: read before looking, so a tally
        given during the look is looked for next time)."""
        made = _tally.TALLIES_MADE
        if self._tallied_at != made:
            self._tallied = tallied(records)
            self._tallied_at = made
        return self._tallied

    def units_skipping_causal(self) -> list:
        """``units``, with the kernels of the ``causal`` records taken to skip their masked
        pairs exactly: the deprecated ``attention="causal"`` (their masked share leaves the
        hardware figure; model flops stay)."""
        if self._units_skipping is None:
            units = list(self.units)
            for i in self.causal:
                unit = list(units[i])
                for work, masked in ((_FLOPS, _MASKED_FLOPS), (_MACS, _MASKED_MACS)):
                    unit[work] -= unit[masked]
                    unit[masked] = 0
                units[i] = tuple(unit)
            self._units_skipping = units
        return self._units_skipping

    def _failed(self, error: str) -> None:
        if error not in self.errors:
            self.errors.append(error)
            if error not in _WARNED:
                if len(_WARNED) >= WARNED_KEPT:  # messages name shapes, and shapes vary
                    _WARNED.clear()
                _WARNED.add(error)
                warnings.warn(f"dispatch_flops: {error}; its calls are reported unsupported",
                              RuntimeWarning, stacklevel=4)


# pricing errors warned about (once each per process; forgotten when WARNED_KEPT are kept)
_WARNED: set = set()
WARNED_KEPT = 1024


class Captured:
    """A ledger's counts as they were when captured, with the layout that reads them: cheap
    to take (columns copied in C), summed into rows only when read (``rows``)."""

    __slots__ = ("layout", "calls", "ns", "tallies", "unvalued_masks")

    def __init__(self, ledger, resolutions: dict, timed: bool = True):
        records = ledger.records
        layout = ledger.layout
        if layout is None or layout.n != len(records):
            layout = ledger.layout = Layout(ledger, resolutions)
        self.layout = layout
        self.calls = list(map(_calls, records))
        # untimed, no record holds a time: no second pass over them
        self.ns = list(map(_ns, records)) if timed else [0] * len(records)
        # {record index: (masked pairs, skipped pairs, Tally)}: device counts read here, once
        tallied = layout.tallies(records)
        read = read_all([tally for _, tally in tallied]) if tallied else []
        self.tallies = {i: counts + (tally,) for (i, tally), counts in zip(tallied, read)}
        # attention calls whose mask had no values (meta, fake): their pairs all kept
        self.unvalued_masks = sum(tally.unvalued for _, tally in tallied)

    @property
    def errors(self) -> tuple:
        """The pricing errors of the formulas this capture's records met."""
        return tuple(self.layout.errors)

    def rows(self, skipping_causal: bool = False) -> tuple:
        """``((key, counts), ...)``: ``key`` is ``(stack, phase, operator, overload,
        category, dtype)``, ``counts`` in ``ROW`` order; in the order the frames and ops were first
        met; rows that counted nothing are left out. Counts equal to the layout's last rows'
        give those rows again (the same tuple). ``skipping_causal``: the deprecated
        ``attention="causal"`` (``Layout.units_skipping_causal``)."""
        layout, calls, ns = self.layout, self.calls, self.ns
        memo = (calls, ns, {i: t[:2] for i, t in self.tallies.items()}, skipping_causal)
        if layout.memo is not None and layout.memo[0] == memo:
            return layout.memo[1]
        units = layout.units_skipping_causal() if skipping_causal else layout.units
        width = len(ROW)
        totals: list[Optional[list]] = [None] * len(layout.keys)
        for i, n in enumerate(calls):
            if not n and not ns[i]:
                continue
            row = layout.row_of[i]
            total = totals[row]
            if total is None:
                total = totals[row] = [0] * width
            total[0] += n
            for j, per_call in enumerate(units[i], 1):
                total[j] += n * per_call
            total[-1] += ns[i]
            found = self.tallies.get(i)
            if found is not None:
                masked, skipped, tally = found
                # a skipped pair: none of its work ran, its recomputation (in the formula's
                # masked share, backward) neither
                again_flops, again_macs = tally.again
                total[_ROW_FLOPS] -= skipped * (tally.flops_rate + again_flops)
                total[_ROW_MACS] -= skipped * (tally.macs_rate + again_macs)
                total[_ROW_MASKED_FLOPS] += masked * tally.flops_rate - skipped * again_flops
                total[_ROW_MASKED_MACS] += masked * tally.macs_rate - skipped * again_macs
        rows = tuple((layout.keys[r], tuple(t)) for r, t in enumerate(totals) if t is not None)
        layout.memo = (memo, rows)
        return rows
