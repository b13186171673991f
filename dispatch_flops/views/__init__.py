"""The views room: text, files and figures made from results: the module table (``table``),
every other text (``text``: expert load, the MFU conventions, MFU in words, a generation's
tables, a throughput reading), CSV, the DataFrame and the Chrome trace (``export``), torch's
and DeepSpeed's printouts (``torch_table``, ``deepspeed_printout``), paper tables as Markdown
and LaTeX (``paper_table``), plots (``plot``). It reads
``results`` only. Importing it installs the presenter through which ``Profile.table()`` and
the other output methods reach it (``results.present``); workflows call it directly."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from dispatch_flops.results import present
from dispatch_flops.results.profile import as_profile
from dispatch_flops.results.protocols import ConventionsLike, ProfileLike
from dispatch_flops.results.roofline import DTypeLike
from dispatch_flops.results.schema import PathLike
from dispatch_flops.results.utilisation import DeviceLike
from dispatch_flops.views import export, table, text, torch_table


class _Views:
    """The views room's ``results.present.Presenter``: the run the port carries is read as
    the Profile it is (``as_profile``)."""

    def table(self, profile: ProfileLike, depth: int, *, columns: Optional[Sequence[str]],
              width: Optional[int], ops: int, ranks: bool, group: Optional[str] = None
              ) -> str:
        return table.module_table(as_profile(profile), depth, columns=columns, width=width, ops=ops,
                                  ranks=ranks, group=group)

    def torch_table(self, flop_counts: dict, depth: Optional[int]) -> str:
        return torch_table.torch_table(flop_counts, depth)

    def experts_table(self, profile: ProfileLike) -> str:
        return text.experts_table(as_profile(profile))

    def conventions_table(self, conventions: ConventionsLike) -> str:
        return text.conventions_table(conventions)

    def utilisation_text(self, profile: ProfileLike, what: str, phases: Sequence[str],
                         device: Optional[DeviceLike], dtype: Optional[DTypeLike],
                         flops: str) -> str:
        return text.utilisation_text(as_profile(profile), what, phases, device, dtype, flops)

    def write_csv(self, profile: ProfileLike, path: PathLike) -> None:
        export.write_csv(as_profile(profile), path)

    def dataframe(self, profile: ProfileLike) -> Any:
        return export.dataframe(as_profile(profile))

    def write_chrome_trace(self, profile: ProfileLike, path: PathLike) -> None:
        export.write_chrome_trace(as_profile(profile), path)


present.install(_Views())
