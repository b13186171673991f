"""A Profile as plain data and back: ``to_dict`` (the JSON schema of docs/schema.md) and
``from_dict``, with every field a file must have checked, and mistakes named. Files are
written whole or not at all (``write_text``)."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from typing import TYPE_CHECKING, Optional, Union

from dispatch_flops.results.facts import ModuleFacts, RunFacts
from dispatch_flops.results.rows import Row, RowKey, accumulate
from dispatch_flops.results.stats import COUNTS, ROOT

if TYPE_CHECKING:
    from dispatch_flops.results.profile import Profile

SCHEMA_VERSION = 2  # of to_dict() / to_json(): docs/schema.md; bump on a breaking change
PathLike = Union[str, "os.PathLike[str]"]


def write_text(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a temporary file beside the file,
    renamed over it once written, so an error leaves any earlier file as it was and no
    temporary file behind. A symlink is followed (its target is written; the link stays).
    The file keeps the mode of the one it replaces; a new one gets the umask's, as ``open``
    gives. UTF-8, the encoding ``from_json`` reads; a lone surrogate (a module may be named
    anything) is written as its escape, ``\\ud800``, rather than lose the whole file."""
    target = os.path.realpath(os.fspath(path))
    try:
        mode: Optional[int] = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    fd, tmp = _create_beside(target)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace",
                       newline="") as f:
            f.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):  # the error to raise is the one that got here
            os.unlink(tmp)
        raise


def _create_beside(target: str) -> tuple[int, str]:
    """A new, empty file in ``target``'s folder: (its descriptor, its path). Created with
    mode 0o666 less the umask, as ``open`` creates (``mkstemp``'s 0o600 would make every
    export private)."""
    folder = os.path.dirname(target) or "."
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(folder, f".dispatch_flops-{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # a name taken: draw another
            continue
    raise FileExistsError(f"no free temporary file name in {folder}")


def to_dict(profile: Profile) -> dict:
    """``profile`` as JSON-serialisable plain data (docs/schema.md)."""
    facts, run = profile.module_facts, profile.run
    return {
        "schema_version": SCHEMA_VERSION,
        "model": profile.root_label,
        "has_model": run.has_model,
        "attention": run.attention,
        "timing": run.timing,
        "saved_activations": run.saved_activations,
        "repeats": run.repeats,
        "wall_s": run.wall_s,
        "steps": run.steps,
        "dtype": run.dtype,
        "allow_tf32": run.allow_tf32,
        "device": run.device,
        "device_name": run.device_name,
        "rank": run.rank,
        "world_size": run.world_size,
        "pricing_errors": list(run.pricing_errors),
        "dtensor_ops": [{"overload": o, "shapes": [list(s) for s in shapes], "calls": c,
                         "flops": f, "macs": m} for o, shapes, c, f, m in run.dtensor_ops],
        "modules": [
            {"name": name, "type": kind, "calls": facts.calls.get(name, 0), "params": n,
             "forward_span_ns": facts.spans.get(name)}
            for name, kind, n in zip(facts.names, facts.types, facts.params)
        ],
        "saved": [{"stack": list(stack), "bytes": n} for stack, n in facts.saved.items()],
        "graph_runs": [{"stack": list(stack), "runs": runs, "forward_ns": forward,
                        "backward_ns": backward}
                       for stack, (runs, forward, backward) in facts.graph_runs.items()],
        "in_graphs": list(facts.in_graphs),
        "total": profile.total.to_dict(),
        "by_phase": {p: s.to_dict() for p, s in profile.by_phase().items()},
        "model_flops": profile.model_flops(),
        "hardware_flops": profile.hardware_flops(),
        "by_module": {n: m.to_dict() for n, m in profile.by_module().items()},
        "by_operator": {op: s.to_dict() for op, s in profile.by_operator().items()},
        "unsupported_ops": profile.unsupported_ops(),
        "estimated_ops": profile.estimated_ops(),
        "coverage": profile.coverage().to_dict(),
        "records": [r.to_dict() for r in profile.records()],
    }


def from_dict(data: dict, source: str = "data") -> tuple[list[Row], ModuleFacts, RunFacts]:
    """The rows and facts ``to_dict()``'s data holds; ``ValueError`` naming what is missing
    or mistyped, and where."""
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError(f"{source} is not a dispatch_flops run: write one with "
                         "fc.to_json(path)")
    if data["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"{source} has schema_version {data['schema_version']!r}; this "
                         f"dispatch_flops reads version {SCHEMA_VERSION} (re-export the "
                         "run with this version)")
    missing = [k for k in ("model", "records", "modules", "timing", "attention")
               if k not in data]
    if missing:
        raise ValueError(f"{source} is not a dispatch_flops run (missing {missing}); "
                         "write one with fc.to_json(path)")
    _check(data, _RUN_TYPES, source)
    for i, m in enumerate(data["modules"]):
        _check(m, _MODULE_TYPES, f"{source}: modules[{i}]")
    for i, r in enumerate(data["records"]):
        _check(r, _RECORD_TYPES, f"{source}: records[{i}]")
        _check(r["stats"], _STATS_TYPES, f"{source}: records[{i}].stats")
    run_fields = {f: data[f] for f in RunFacts.__dataclass_fields__ if f != "model"
                  and f in data}
    run_fields["pricing_errors"] = tuple(run_fields.get("pricing_errors", ()))
    run_fields["dtensor_ops"] = tuple(
        (o["overload"], tuple(tuple(s) for s in o["shapes"]), o["calls"], o["flops"],
         o["macs"]) for o in run_fields.get("dtensor_ops", ()))
    run = RunFacts(model=data["model"], **run_fields)
    modules = data["modules"]
    facts = ModuleFacts(
        names=tuple(m["name"] for m in modules) or (ROOT,),
        types=tuple(m.get("type", "") for m in modules) or ("",),
        params=tuple(m["params"] for m in modules) or (0,),
        calls={m["name"]: m["calls"] for m in modules},
        spans={m["name"]: m["forward_span_ns"] for m in modules
               if m.get("forward_span_ns") is not None},
        saved={tuple(s["stack"]): s["bytes"] for s in data.get("saved", [])},
        graph_runs={tuple(g["stack"]): (g["runs"], g["forward_ns"], g["backward_ns"])
                    for g in data.get("graph_runs", [])},
        in_graphs=tuple(data.get("in_graphs", [])),
    )
    rows: dict[RowKey, list] = {}
    for r in data["records"]:
        stats = r["stats"]
        latency = stats.get("latency_s")
        counts = tuple(stats.get(c, 0) for c in COUNTS) + (
            round(latency * 1e9) if latency else 0,)
        key = RowKey(tuple(r["stack"]), r["phase"], r["operator"], r["overload"],
                     r["category"], r.get("dtype"))
        accumulate(rows, key, counts)
    return [(k, tuple(v)) for k, v in rows.items()], facts, run


# what from_dict reads, with its type: a missing or mistyped field is named in the error
_RUN_TYPES = {"model": str, "records": list, "modules": list, "timing": bool, "attention": str,
              "has_model": (bool, type(None)), "steps": (int, type(None)),
              "wall_s": (float, int, type(None)), "allow_tf32": bool}
_MODULE_TYPES = {"name": str, "calls": int, "params": int}
_RECORD_TYPES = {"stack": list, "phase": str, "operator": str, "overload": str,
                 "category": str, "stats": dict, "dtype": (str, type(None))}
_STATS_TYPES = {**{c: int for c in COUNTS}, "latency_s": (float, int, type(None))}
# files written before them
_OPTIONAL = ("has_model", "steps", "wall_s", "comm_bytes", "dtype", "allow_tf32")


def _check(data, types: dict, where: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where} is {type(data).__name__}, not an object")
    for key, kind in types.items():
        if key not in data:
            if key in _OPTIONAL:
                continue  # optional
            raise ValueError(f"{where}: field {key!r} is missing")
        value = data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{where}: field {key!r} is {value!r}, not "
                             f"{getattr(kind, '__name__', 'of the right type')}")
