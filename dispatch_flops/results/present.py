"""The port through which a result's text and file views are made.

Every text a result prints (tables, ``*_text``, ``__str__``), CSV, DataFrames and traces are
the views room's work (``dispatch_flops.views``), and the results room never imports it:
``ProfileViews.table()``, ``experts_table()``, ``mfu_text()``, ``str(Conventions)`` and the
other output methods ask the ``Presenter`` that ``dispatch_flops.views`` installs here when it
is imported (importing ``dispatch_flops`` does). The method signatures and docstrings stay on
the result classes; results compute figures only (``tests/test_text_home.py``). The port
names no result class (each calls it): it carries a run as ``ProfileLike`` and conventions as
``ConventionsLike`` (``results.protocols``), which the views read as what they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence

if TYPE_CHECKING:
    from dispatch_flops.results.protocols import ConventionsLike, ProfileLike
    from dispatch_flops.results.roofline import DTypeLike
    from dispatch_flops.results.schema import PathLike
    from dispatch_flops.results.utilisation import DeviceLike


class Presenter(Protocol):
    def table(self, profile: ProfileLike, depth: int, *, columns: Optional[Sequence[str]],
              width: Optional[int], ops: int, ranks: bool, group: Optional[str] = None
              ) -> str: ...

    def torch_table(self, flop_counts: dict, depth: Optional[int]) -> str: ...

    def experts_table(self, profile: ProfileLike) -> str: ...

    def conventions_table(self, conventions: ConventionsLike) -> str: ...

    def utilisation_text(self, profile: ProfileLike, what: str, phases: Sequence[str],
                         device: Optional[DeviceLike], dtype: Optional[DTypeLike],
                         flops: str) -> str: ...

    def write_csv(self, profile: ProfileLike, path: PathLike) -> None: ...

    def dataframe(self, profile: ProfileLike) -> Any: ...

    def write_chrome_trace(self, profile: ProfileLike, path: PathLike) -> None: ...


_installed: list[Presenter] = []


def install(presenter: Presenter) -> None:
    """Make ``presenter`` the one that lays out every Profile's output."""
    _installed[:] = [presenter]


def presenter() -> Presenter:
    if not _installed:
        raise RuntimeError("no views installed: import dispatch_flops (its views room "
                           "installs the presenter)")
    return _installed[0]
