"""``Profile``: the immutable result of one or more runs.

A Profile is plain data: rows (``results.rows``: one per module stack, phase and op overload,
with its counts), module facts and run facts (``results.facts``). A live ``FlopCounter``
makes one when its block ends (``fc.to_profile()``); ``Profile.from_json`` reads one back;
``Profile.merge`` adds runs of the same model (steps, ranks) and keeps the parts;
``replace`` derives one. Its views (``results.queries.ProfileViews``) are computed from the
rows once and kept: a Profile never changes. Serialisation is ``results.schema``, combining
runs ``results.combine``, rooflines and MFU ``results.utilisation``.

>>> with FlopCounter(model) as fc:
...     model(x).sum().backward()
>>> p = fc.to_profile()
>>> p.total.flops, p.by_module()["blocks.0"].exclusive.macs, print(p.table())
>>> Profile.merge([p, p]).per_step().total == p.total
True
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar

import torch

from dispatch_flops.results import combine, schema, validate
from dispatch_flops.results.combine import since
from dispatch_flops.results.facts import ModuleFacts, RunFacts
from dispatch_flops.results.queries import ProfileViews
from dispatch_flops.results.rows import Row, RowKey

__all__ = ["ModuleFacts", "Profile", "RunFacts", "as_profile", "since"]

T = TypeVar("T")
_KEEP: Any = object()  # replace(): a field not given keeps its value


def as_profile(run: Any) -> Profile:
    """A Profile, or a counter's (``to_profile()``)."""
    if isinstance(run, Profile):
        return run
    to_profile = getattr(run, "to_profile", None)
    if to_profile is None:
        raise TypeError(f"expected a Profile or a FlopCounter, got {type(run).__name__}")
    return to_profile()


class Profile(ProfileViews):
    """The result of one or more runs: every view, export and plot reads one. See the
    module's docstring; make one with ``FlopCounter.to_profile()``, ``Profile.from_json`` or
    ``Profile.merge``, and derive one with ``replace``."""

    def __init__(self, rows: Iterable[Row], module_facts: ModuleFacts, run: RunFacts, *,
                 parts: Sequence[Profile] = (), trace: Optional[tuple] = None,
                 views: Optional[dict] = None, ranks: Sequence[Profile] = ()):
        self._rows: tuple[Row, ...] = tuple(rows)  # the same tuple when given one: see _make
        # plain tuples: name them (rows given with a Profile's views, by ``alike``, are that
        # Profile's, named already: a counter read every step skips the walk over its rows)
        if views is None and not all(type(key) is RowKey for key, _ in self._rows):
            self._rows = tuple((key if type(key) is RowKey else RowKey(*key), counts)
                               for key, counts in self._rows)
        self.module_facts = module_facts
        self.run = run
        self.parts = tuple(parts)  # the Profiles merged into this one, in order
        # gathered from ranks (dispatch_flops.distributed.gather): each rank's, in rank order
        self.ranks = tuple(ranks)
        self._trace = trace  # (events, dropped) of a run counted with trace=True
        # views computed so far; a harvest whose rows and facts equal the last one's shares
        # them (the same data gives the same views)
        self._views: dict = {} if views is None else views

    def to_profile(self) -> Profile:
        return self

    def replace(self, *, rows: Iterable[Row] = _KEEP, module_facts: ModuleFacts = _KEEP,
                run: RunFacts = _KEEP, parts: Sequence[Profile] = _KEEP,
                trace: Optional[tuple] = _KEEP, ranks: Sequence[Profile] = _KEEP) -> Profile:
        """A Profile like this one but for the fields given (its views computed anew):
        ``p.replace(run=dataclasses.replace(p.run, wall_s=1.5))``."""
        def given(value, mine):
            return mine if value is _KEEP else value

        return type(self)(given(rows, self._rows), given(module_facts, self.module_facts),
                          given(run, self.run), parts=given(parts, self.parts),
                          trace=given(trace, self._trace), ranks=given(ranks, self.ranks))

    def alike(self, rows: tuple[Row, ...], module_facts: ModuleFacts, run: RunFacts,
              trace: Optional[tuple] = None) -> Profile:
        """A Profile of ``rows`` and facts that shares this one's views computed so far when
        it holds the same data (``rows`` this one's tuple, equal facts): a counter's harvest
        that counted what the last one did (the same data gives the same views)."""
        same = rows is self._rows and module_facts == self.module_facts and run == self.run
        return type(self)(rows, module_facts, run, trace=trace,
                          views=self._views if same else None)

    def memo(self, key: Any, compute: Callable[[], T]) -> T:
        """``compute()``'s value, computed once per key (a Profile never changes)."""
        value = self._views.get(key)
        if value is None:
            value = self._views[key] = compute()
        return value

    # -- the data ---------------------------------------------------------------------------
    @property
    def rows(self) -> tuple[Row, ...]:
        """``((RowKey, counts), ...)``: counts in ``results.rows.ROW`` order."""
        return self._rows

    @property
    def trace(self) -> Optional[tuple]:
        """``(events, dropped)`` of a run counted with ``trace=True``, else None."""
        return self._trace

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
        return validate.torch_dtype(self.run.dtype)

    def __enter__(self):
        raise RuntimeError("a Profile holds a finished run and cannot count; count with a new "
                           "FlopCounter")

    def __exit__(self, *exc) -> None:
        pass

    def __repr__(self) -> str:
        total = self.total
        return (f"Profile({self.root_label}, {len(self.module_facts.names)} modules, "
                f"{total.calls} op calls, {total.flops} flops, steps={self.steps})")

    # -- reading back -----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict, source: str = "data") -> Profile:
        """A Profile from ``to_dict()``'s data; ``ValueError`` naming what is missing."""
        rows, module_facts, run = schema.from_dict(data, source)
        return cls(rows, module_facts, run)

    @classmethod
    def from_json(cls, path: schema.PathLike) -> Profile:
        """The Profile a ``to_json`` file holds; ``ValueError`` naming what in it is not a
        run (docs/limits.md: what a file is checked for)."""
        source = os.fspath(path)
        try:  # the text alone: the bytes it was decoded from are freed before it is parsed
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"{source} is not JSON (not UTF-8 text: {e})") from None
        return cls(*schema.loads(text, source))

    # -- combining runs (results.combine says how each fact combines) ------------------------
    @classmethod
    def merge(cls, runs: Iterable[Any]) -> Profile:
        """Runs of the same model (counters or Profiles: steps, repeats, ranks) as one: calls,
        counts, latencies and wall times summed, ``steps`` added. The merged runs are kept in
        ``parts``; merging merged Profiles keeps their parts (so merge is associative).
        ``ValueError`` when the runs are of different models or options."""
        return combine.merge([as_profile(r) for r in runs])

    def per_step(self) -> Profile:
        """The mean step: every count, time and the wall time divided by ``steps`` (an
        integer where it divides exactly, a float where it does not)."""
        return combine.per_step(self)

    def with_medians(self, runs: Sequence[Profile]) -> Profile:
        """This run with every op's, module span's and the wall time replaced by the median
        over ``runs`` (this one among them) that ran the same ops; ``repeats`` says how many
        did (see ``dispatch_flops.measure``)."""
        return combine.with_medians(self, runs)
