"""A finished run read back from ``to_json``: a ``FlopCounter`` whose reports read stored
records and module facts instead of a live tracker.

The live reports ask the tracker four things: the module names in tree order, each
module's forward calls, its forward call spans (timing on) and which modules an op stack is
credited to. ``StoredModules`` answers them from the JSON's ``modules`` list, so
``by_module``, ``table``, the roofline views and every export run the very same code on a
loaded run as on a live one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch

from ._results import FORWARD, ROOT, ModuleStats, OpRecord, Stats
from ._roofline import DeviceSpec, device_spec
from ._tracker import ModuleTracker
from .counter import SCHEMA_VERSION, FlopCounter

_REQUIRED = ("schema_version", "model", "attention", "timing", "repeats", "wall_s",
             "by_module", "records", "modules")


class StoredModules:
    """The module facts of a finished run, asked the questions the reports ask a tracker."""

    def __init__(self, modules: list[dict]):
        self.names = [m["name"] for m in modules]
        self._calls = {m["name"]: m["calls"] for m in modules}
        self._spans = {m["name"]: m["forward_span_ns"] for m in modules
                       if m["forward_span_ns"] is not None}

    def call_counts(self) -> dict[str, int]:
        return dict(self._calls)

    def spans(self) -> dict[str, int]:
        return dict(self._spans)

    def credited(self, stack: tuple, calls: dict[str, int]) -> set[str]:
        return ModuleTracker.credited(self, stack, calls)  # uses names only, never the tracker

    def frames(self) -> list:
        return []  # nothing is counted into a stored run


def _record(d: dict) -> OpRecord:
    return OpRecord(module=d["module"], stack=tuple(d["stack"]), phase=d["phase"],
                    operator=d["operator"], overload=d["overload"], category=d["category"],
                    stats=Stats(**d["stats"]))


class LoadedFlopCounter(FlopCounter):
    """A counter read from JSON (``FlopCounter.from_json``): reports, exports and plots; no
    counting, no trace.

    >>> fc = FlopCounter.from_json("run.json")
    >>> print(fc.table(depth=3)); fc.by_module()["blocks.0"].flops
    """

    def __init__(self, data: dict, source: str = "JSON"):
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise ValueError(f"{source} is not a dispatch_flops run (missing {missing}); "
                             "write one with fc.to_json(path)")
        if data["schema_version"] != SCHEMA_VERSION:
            raise ValueError(f"{source} has schema_version {data['schema_version']!r}; this "
                             f"dispatch_flops reads version {SCHEMA_VERSION}")
        super().__init__(None, attention=data["attention"], timing=data["timing"])
        self._data = data
        self.root_label = data["model"]
        self.repeats = data["repeats"]
        self._records = [_record(r) for r in data["records"]]
        self._tracker = StoredModules(data["modules"])
        self._params = {m["name"]: m["params"] for m in data["modules"]}
        # saved_bytes are stored per module, not per frame: by_module restores them
        self.saved_activations = any(m.get("saved_bytes") is not None
                                     for m in data["by_module"].values())

    def __enter__(self):
        raise RuntimeError("a counter read from JSON holds a finished run and cannot count; "
                           "count with a new FlopCounter")

    def records(self) -> list[OpRecord]:
        return list(self._records)

    @property
    def wall_s(self) -> Optional[float]:
        return self._data["wall_s"]

    def by_module(self, phase: Optional[str] = None) -> dict[str, ModuleStats]:
        modules = super().by_module(phase)
        if self._data["has_model"] and ROOT in modules:
            # a live counter with a model lists the root only once it ran or was charged
            root_ran = self._tracker.call_counts().get(ROOT) or any(
                phase is None or r.phase == phase for r in self._records)
            if not root_ran:
                del modules[ROOT]
        if self.saved_activations and phase in (None, FORWARD):
            stored = self._data["by_module"]
            modules = {name: replace(m, saved_bytes=stored[name]["saved_bytes"],
                                     saved_bytes_exclusive=stored[name]["saved_bytes_exclusive"])
                       if name in stored else m for name, m in modules.items()}
        return modules

    def _dtype(self, dtype):
        if dtype is not None:
            return dtype
        return getattr(torch, self._data["dtype"], torch.float32)

    def _device(self, device: Optional[DeviceSpec]) -> DeviceSpec:
        if device is None and self._data.get("device_name"):
            found = device_spec(self._data["device_name"])  # the GPU the run was made on
            if found is not None:
                return found
        return super()._device(device)

    def _run_info(self) -> dict:
        info = super()._run_info()  # the modules, from StoredModules: checks they read back
        info.update({k: self._data[k] for k in ("dtype", "device", "device_name", "has_model")})
        return info
