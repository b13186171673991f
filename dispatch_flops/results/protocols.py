"""What this room's functions read of a run, as Protocols: ``ProfileLike``, ``ConventionsLike``.

``Profile`` (``results.profile``) is made of this room's functions: its views (``queries``,
``aggregate``, ``utilisation``), its combinations (``combine``, ``stages``), its file
(``schema``); and each of those functions reads a Profile. Typed against the class, every one
of them would import the module that imports it. They name ``ProfileLike`` instead: what they
read of a run, which ``Profile`` has (mypy checks it wherever a Profile is handed in). The
presenter port (``results.present``) carries these to the views, which read them as the
classes they are. This module imports nothing of the functions it types.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Protocol, Sequence, TypeVar

import torch

from dispatch_flops.results.facts import ModuleFacts, RunFacts
from dispatch_flops.results.rows import Row
from dispatch_flops.results.stats import Coverage, ModuleStats, OpRecord, Stats

__all__ = ["ConventionsLike", "P", "ProfileLike"]

T = TypeVar("T")
P = TypeVar("P", bound="ProfileLike")  # a function that derives a run returns its kind


class ProfileLike(Protocol):
    """A run as the results' functions read it: its data (``results.profile.Profile``'s
    fields), ``replace`` to derive one, ``memo`` to keep a view, and the views that others
    are computed from."""

    @property
    def module_facts(self) -> ModuleFacts: ...

    @property
    def run(self) -> RunFacts: ...

    @property
    def parts(self) -> tuple: ...

    @property
    def ranks(self) -> tuple: ...

    @property
    def rows(self) -> tuple[Row, ...]: ...

    @property
    def trace(self) -> Optional[tuple]: ...

    @property
    def timing(self) -> bool: ...

    @property
    def steps(self) -> int: ...

    @property
    def wall_s(self) -> Optional[float]: ...

    @property
    def root_label(self) -> str: ...

    @property
    def has_model(self) -> bool: ...

    @property
    def saved_activations(self) -> bool: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def memo(self, key: Any, compute: Callable[[], T]) -> T: ...

    def replace(self: P, *, rows: Iterable[Row] = ..., module_facts: ModuleFacts = ...,
                run: RunFacts = ..., parts: Sequence[Any] = ..., trace: Optional[tuple] = ...,
                ranks: Sequence[Any] = ...) -> P: ...

    # the views the others read (results.queries.ProfileViews: their docstrings)
    @property
    def total(self) -> Stats: ...

    def records(self) -> list[OpRecord]: ...

    def by_phase(self) -> dict[str, Stats]: ...

    def model_flops(self) -> int: ...

    def hardware_flops(self) -> int: ...

    def by_operator(self, phase: Optional[str] = None) -> dict[str, Stats]: ...

    def by_module(self, phase: Optional[str] = None) -> dict[str, ModuleStats]: ...

    def unsupported_ops(self) -> dict[str, int]: ...

    def estimated_ops(self) -> dict[str, int]: ...

    def coverage(self) -> Coverage: ...


class ConventionsLike(Protocol):
    """The field's MFU conventions as the port carries them (``results.conventions``'s
    ``Conventions``, whose ``__str__`` asks the port)."""

    @property
    def model(self) -> str: ...

    @property
    def shape(self) -> Any: ...  # results.conventions.Shape

    @property
    def rows(self) -> tuple: ...

    @property
    def differences(self) -> tuple: ...

    @property
    def tokens_per_s(self) -> Optional[float]: ...

    @property
    def device(self) -> Optional[str]: ...

    @property
    def dtype(self) -> Optional[str]: ...

    @property
    def peak_flops(self) -> Optional[float]: ...
