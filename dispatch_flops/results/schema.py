"""A Profile as plain data and back: ``to_dict`` (the JSON schema of docs/schema.md), and
``from_dict`` and ``loads`` (JSON text, parsed as it is read), every field checked against
``validate``'s bounds and mistakes named. Files are written whole or not at all
(``write_text``)."""

from __future__ import annotations

import contextlib
import json
import json.decoder
import os
import secrets
import stat
from operator import add, itemgetter
from typing import Any, Callable, Iterable, Iterator, NoReturn, Optional, Union

from dispatch_flops.results import validate
from dispatch_flops.results.facts import KERNEL_FACTS, ModuleFacts, RunFacts
from dispatch_flops.results.protocols import ProfileLike
from dispatch_flops.results.rows import Row, RowKey
from dispatch_flops.results.stats import COUNTS, ROOT
from dispatch_flops.results.validate import (
    CATEGORY_NAMES,
    COUNT_LIMIT,
    DTYPE_NAMES,
    PHASE_NAMES,
    SECONDS_LIMIT,
)

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


def to_dict(profile: ProfileLike) -> dict:
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
        "unvalued_masks": run.unvalued_masks,
        "dtensor_ops": [{"overload": o, "shapes": [list(s) for s in shapes], "calls": c,
                         "flops": f, "macs": m} for o, shapes, c, f, m in run.dtensor_ops],
        "attention_calls": [dict(zip(_ATTENTION_FIELDS, (list(c[0]),) + tuple(c[1:])))
                            for c in run.attention_calls],
        "parameters": [{"group": g, "count": n} for g, n in run.parameters],
        "pipeline": [dict(zip(_PIPELINE_FIELDS, action)) for action in run.pipeline],
        "experts": [{"layer": layer, "tokens": list(tokens), "rows": list(rows), "calls": calls}
                    for layer, tokens, rows, calls in run.experts],
        "modules": [
            {"name": name, "type": kind, "calls": facts.calls.get(name, 0), "params": n,
             # per_step() means may be fractions of a ns: the file holds whole ns
             "forward_span_ns": _whole(facts.spans.get(name)),
             **({"forward_idle_ns": round(facts.idle[name])} if name in facts.idle else {})}
            for name, kind, n in zip(facts.names, facts.types, facts.params)
        ],
        **({"kernels": {k: round(v) for k, v in run.kernels.items()}} if run.kernels else {}),
        "saved": [{"stack": list(stack), "bytes": n} for stack, n in facts.saved.items()],
        "graph_runs": [{"stack": list(stack), "runs": runs, "forward_ns": forward,
                        "backward_ns": backward}
                       for stack, (runs, forward, backward) in facts.graph_runs.items()],
        "in_graphs": list(facts.in_graphs),
        "total": profile.total.to_dict(),
        "by_phase": {str(p): s.to_dict() for p, s in profile.by_phase().items()},
        "model_flops": profile.model_flops(),
        "hardware_flops": profile.hardware_flops(),
        "by_module": {n: m.to_dict() for n, m in profile.by_module().items()},
        "by_operator": {op: s.to_dict() for op, s in profile.by_operator().items()},
        "unsupported_ops": profile.unsupported_ops(),
        "estimated_ops": profile.estimated_ops(),
        "coverage": profile.coverage().to_dict(),
        "records": [r.to_dict() for r in profile.records()],
    }


def _whole(ns):
    return None if ns is None else round(ns)


def from_dict(data: dict, source: str = "data") -> tuple[list[Row], ModuleFacts, RunFacts]:
    """The rows and facts ``to_dict()``'s data holds, every field checked (``validate``):
    ``ValueError`` naming what is missing, mistyped or out of range, and where
    (``"run.json: records[3].stats.flops is -5, below 0"``)."""
    _check_run(data, source)
    return rows_of(data["records"], source), *_facts(data)


def loads(text: Union[str, bytes], source: str) -> tuple[list[Row], ModuleFacts, RunFacts]:
    """``from_dict(json.loads(text))``, read as it is parsed: the records become rows one by
    one and the views (``total``, ``by_module``, ...: computed again from the rows) are
    dropped as soon as they are parsed, so a file never stands whole in memory as Python
    objects. ``ValueError`` for what is not JSON, nests too deep, or ``from_dict`` refuses."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode(json.detect_encoding(text), "surrogatepass")
        except UnicodeDecodeError as e:
            raise ValueError(f"{source} is not JSON: {e}") from None
    try:
        return _Reader(text, source).read()
    except RecursionError:  # the parser's own guard against a stack overflow
        raise ValueError(f"{source} nests deeper than any dispatch_flops run: not read") \
            from None


# keys of to_dict() that are views of the records: parsed (to find their end), then dropped
_VIEWS = frozenset(("total", "by_phase", "model_flops", "hardware_flops", "by_module",
                    "by_operator", "unsupported_ops", "estimated_ops", "coverage"))
# the C parser of the standard library, driven one value at a time
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_string = json.decoder.scanstring  # type: ignore[attr-defined]
_space = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]


class _Reader:
    """Reads a JSON text's top-level object key by key, and its ``records`` array value by
    value (once the text has said it is this schema's version)."""

    def __init__(self, text: str, source: str):
        self.text = text
        self.source = source

    def fail(self, message: str, at: int) -> NoReturn:
        error = json.JSONDecodeError(message, self.text, at)
        raise ValueError(f"{self.source} is not JSON: {error}")

    def value(self, at: int) -> tuple[Any, int]:
        try:
            return _scan(self.text, at)
        except StopIteration as e:
            self.fail("Expecting value", e.value)
        except ValueError as e:  # JSONDecodeError, or an integer too long to convert
            raise ValueError(f"{self.source} is not JSON: {e}") from None

    def skip(self, at: int) -> int:
        return _space(self.text, at).end()

    def read(self) -> tuple[list[Row], ModuleFacts, RunFacts]:
        text, source = self.text, self.source
        at = self.skip(0)
        if text[at:at + 1] != "{":  # not an object: from_dict says what it is
            data, at = self.value(at)
            self.end(at)
            return from_dict(data, source)
        head: dict = {}
        rows: Optional[list[Row]] = None
        at = self.skip(at + 1)
        if text[at:at + 1] == "}":
            at += 1
        else:
            while True:
                if text[at:at + 1] != '"':
                    self.fail("Expecting property name enclosed in double quotes", at)
                try:
                    key, at = _string(text, at + 1)
                except ValueError as e:
                    raise ValueError(f"{source} is not JSON: {e}") from None
                at = self.skip(at)
                if text[at:at + 1] != ":":
                    self.fail("Expecting ':' delimiter", at)
                at = self.skip(at + 1)
                if (key == "records" and text[at:at + 1] == "["
                        and head.get("schema_version") == SCHEMA_VERSION):
                    end = [at]
                    rows = rows_of(self.records(at, end), source)
                    at = end[0]
                    head.pop(key, None)  # a key given twice: the last one counts, as in json
                else:
                    value, at = self.value(at)
                    if key not in _VIEWS:
                        head[key] = value
                        if key == "records":
                            rows = None
                at = self.skip(at)
                if text[at:at + 1] == ",":
                    at = self.skip(at + 1)
                    continue
                if text[at:at + 1] != "}":
                    self.fail("Expecting ',' delimiter", at)
                at += 1
                break
        self.end(at)
        if rows is None:
            return from_dict(head, source)
        head["records"] = []  # read already
        _check_run(head, source)
        return rows, *_facts(head)

    def records(self, at: int, end: list) -> Iterator[Any]:
        """The values of the array at ``at``, one at a time; ``end[0]`` is set past it."""
        text = self.text
        at = self.skip(at + 1)
        if text[at:at + 1] == "]":
            end[0] = at + 1
            return
        while True:
            value, at = self.value(at)
            yield value
            at = self.skip(at)
            if text[at:at + 1] == ",":
                at = self.skip(at + 1)
            elif text[at:at + 1] == "]":
                end[0] = at + 1
                return
            else:
                self.fail("Expecting ',' delimiter", at)

    def end(self, at: int) -> None:
        at = self.skip(at)
        if at != len(self.text):
            self.fail("Extra data", at)


def _check_run(data: Any, source: str) -> None:
    """``ValueError`` unless ``data`` is a run of this schema whose fields (all but each
    record) are good."""
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError(f"{source} is not a dispatch_flops run: write one with "
                         "fc.to_json(path)")
    if data["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"{source} has schema_version {validate.shown(data['schema_version'])}"
                         f"; this dispatch_flops reads version {SCHEMA_VERSION} (re-export "
                         "the run with this version)")
    missing = [k for k in ("model", "records", "modules", "timing", "attention")
               if k not in data]
    if missing:
        raise ValueError(f"{source} is not a dispatch_flops run (missing {missing}); "
                         "write one with fc.to_json(path)")
    validate.require(data, _RUN, source)


def _facts(data: dict) -> tuple[ModuleFacts, RunFacts]:
    """The facts of checked data."""
    run_fields = {f: data[f] for f in RunFacts.__dataclass_fields__ if f != "model"
                  and f in data}
    run_fields["pricing_errors"] = tuple(run_fields.get("pricing_errors", ()))
    run_fields["kernels"] = dict(run_fields.get("kernels", {}))
    run_fields["dtensor_ops"] = tuple(
        (o["overload"], tuple(tuple(s) for s in o["shapes"]), o["calls"], o["flops"],
         o["macs"]) for o in run_fields.get("dtensor_ops", ()))
    run_fields["attention_calls"] = tuple(
        (tuple(c["stack"]),) + tuple(c[f] for f in _ATTENTION_FIELDS[1:])
        for c in run_fields.get("attention_calls", ()))
    run_fields["parameters"] = tuple((g["group"], g["count"])
                                     for g in run_fields.get("parameters", ()))
    run_fields["pipeline"] = tuple(tuple(a[f] for f in _PIPELINE_FIELDS)
                                   for a in run_fields.get("pipeline", ()))
    run_fields["experts"] = tuple((e["layer"], tuple(e["tokens"]), tuple(e["rows"]), e["calls"])
                                  for e in run_fields.get("experts", ()))
    run = RunFacts(model=data["model"], **run_fields)
    modules = data["modules"]
    facts = ModuleFacts(
        names=tuple(m["name"] for m in modules) or (ROOT,),
        types=tuple(m.get("type", "") for m in modules) or ("",),
        params=tuple(m["params"] for m in modules) or (0,),
        calls={m["name"]: m["calls"] for m in modules},
        spans={m["name"]: m["forward_span_ns"] for m in modules
               if m.get("forward_span_ns") is not None},
        idle={m["name"]: m["forward_idle_ns"] for m in modules
              if m.get("forward_idle_ns") is not None},
        saved={tuple(s["stack"]): s["bytes"] for s in data.get("saved", [])},
        graph_runs={tuple(g["stack"]): (g["runs"], g["forward_ns"], g["backward_ns"])
                    for g in data.get("graph_runs", [])},
        in_graphs=tuple(data.get("in_graphs", [])),
    )
    return facts, run


def rows_of(records: Iterable[Any], source: str) -> list[Row]:
    """The rows of a run's records (``to_dict()["records"]``), each record checked; records
    of one row (a file written by hand) are summed. Strings and stacks repeated across
    records are kept once."""
    rows: dict[RowKey, tuple] = {}
    strings: dict = {}
    keep = strings.setdefault
    for i, record in enumerate(records):
        row = _plain_row(record, keep)
        if row is None:  # named, or taken as what it is (a str subclass, an int latency)
            validate.require(record, _RECORD, source, f"records[{i}]")
            row = _checked_row(record, keep)
        key, counts = row
        total = rows.get(key)
        rows[key] = counts if total is None else tuple(map(add, total, counts))
    return list(rows.items())


_counts_of = itemgetter(*COUNTS)
_INT, _STR = frozenset((int,)), frozenset((str,))


def _plain_row(r: Any, keep: Callable) -> Optional[Row]:
    """The row of a record as ``to_dict`` writes it, checked at the cost of a few lookups
    (every record of a file comes here): exact JSON types, every name known, every value in
    bounds. None for anything else, which ``_RECORD`` checks field by field."""
    if r.__class__ is not dict:
        return None
    stats, stack = r.get("stats"), r.get("stack")
    if (stats.__class__ is not dict or stack.__class__ is not list or not stack
            or not _STR.issuperset(map(type, stack))):
        return None
    try:
        counts = _counts_of(stats)
        latency = stats["latency_s"]
        phase = PHASE_NAMES[r["phase"]]
        category = CATEGORY_NAMES[r["category"]]
        operator, overload = r["operator"], r["overload"]
        dtype = r.get("dtype")
        if dtype is not None:
            dtype = DTYPE_NAMES[dtype]
    except (KeyError, TypeError):  # missing, unknown, or not a name at all
        return None
    if (operator.__class__ is not str or overload.__class__ is not str
            or not _INT.issuperset(map(type, counts))
            or min(counts) < 0 or max(counts) >= COUNT_LIMIT):
        return None
    if latency is None:
        ns = 0
    elif latency.__class__ is float and 0.0 <= latency < SECONDS_LIMIT:  # NaN fails too
        ns = round(latency * 1e9)
    else:
        return None
    stack = tuple(stack)
    return (RowKey(keep(stack, stack), phase, keep(operator, operator),
                   keep(overload, overload), category, dtype), counts + (ns,))


def _checked_row(r: dict, keep: Callable) -> Row:
    """The row of a record ``_RECORD`` passed."""
    stats = r["stats"]
    latency = stats["latency_s"]
    counts = tuple(stats.get(c, 0) for c in COUNTS) + (round(latency * 1e9) if latency else 0,)
    stack = tuple(r["stack"])
    return (RowKey(keep(stack, stack), PHASE_NAMES[r["phase"]], r["operator"], r["overload"],
                   CATEGORY_NAMES[r["category"]], DTYPE_NAMES.get(r.get("dtype"))), counts)


# counts files written before them lack (read as 0)
_LATER_COUNTS = ("comm_bytes", "comm_alg_bytes", "masked_flops", "masked_macs")
# what from_dict reads, and how each field is checked: (check, required); a reader ignores
# keys it does not know (docs/schema.md), so those are not checked
_STATS = validate.obj({**{c: (validate.count, c not in _LATER_COUNTS) for c in COUNTS},
                       "latency_s": (validate.optional(validate.seconds), True)})
_RECORD = validate.obj({
    "stack": (validate.stack, True), "phase": (validate.phase, True),
    "operator": (validate.text, True), "overload": (validate.text, True),
    "category": (validate.category, True), "stats": (_STATS, True),
    "dtype": (validate.optional(validate.dtype), False)})
_MODULE = validate.obj({
    "name": (validate.text, True), "type": (validate.text, False),
    "calls": (validate.count, True), "params": (validate.count, True),
    "forward_span_ns": (validate.optional(validate.ns), False),
    "forward_idle_ns": (validate.optional(validate.ns), False)})
_KERNELS = validate.obj({name: (validate.count, False) for name in KERNEL_FACTS})
_SAVED = validate.obj({"stack": (validate.stack, True), "bytes": (validate.count, True)})
_GRAPH_RUN = validate.obj({
    "stack": (validate.stack, True), "runs": (validate.count, True),
    "forward_ns": (validate.ns, True), "backward_ns": (validate.ns, True)})
_DTENSOR_OP = validate.obj({
    "overload": (validate.text, True),
    "shapes": (validate.list_of(validate.shape, "shapes"), True),
    **{c: (validate.count, True) for c in ("calls", "flops", "macs")}})
_ATTENTION_FIELDS = ("stack", "batch", "heads", "q_len", "k_len", "head_dim", "value_dim",
                     "causal", "calls")
_ATTENTION_CALL = validate.obj({
    "stack": (validate.stack, True), "causal": (validate.optional(validate.flag), True),
    **{f: (validate.count, True) for f in _ATTENTION_FIELDS[1:] if f not in ("stack", "causal")}})
_PARAMETER_GROUP = validate.obj({"group": (validate.text, True),
                                 "count": (validate.count, True)})
_PIPELINE_FIELDS = ("stage", "action", "microbatch", "start_ns", "ns", "sent", "received")
_PIPELINE_ACTION = validate.obj({
    "stage": (validate.count, True), "action": (validate.one_of(
        {a: a for a in ("F", "B", "I", "W")}, "pipeline action"), True),
    "microbatch": (validate.count, True), "start_ns": (validate.ns, True),
    "ns": (validate.ns, True), "sent": (validate.count, True),
    "received": (validate.count, True)})
_EXPERT_LAYER = validate.obj({
    "layer": (validate.text, True), "calls": (validate.count, True),
    "tokens": (validate.list_of(validate.count, "token counts"), True),
    "rows": (validate.list_of(validate.count, "row counts"), True)})
# files written before them lack the fields that are not required
_RUN = validate.obj({
    "model": (validate.text, True), "timing": (validate.flag, True),
    "attention": (validate.text, True),
    "records": (validate.list_of(lambda record: None, "records"), True),  # each: rows_of
    "modules": (validate.list_of(_MODULE, "modules"), True),
    "has_model": (validate.optional(validate.flag), False),
    "saved_activations": (validate.flag, False), "repeats": (validate.positive, False),
    "wall_s": (validate.optional(validate.seconds), False),
    "steps": (validate.positive, False), "dtype": (validate.dtype, False),
    "allow_tf32": (validate.flag, False), "device": (validate.optional(validate.text), False),
    "device_name": (validate.optional(validate.text), False),
    "rank": (validate.optional(validate.count), False),
    "world_size": (validate.optional(validate.positive), False),
    "pricing_errors": (validate.names, False),
    "unvalued_masks": (validate.count, False),
    "dtensor_ops": (validate.list_of(_DTENSOR_OP, "DTensor ops"), False),
    "attention_calls": (validate.list_of(_ATTENTION_CALL, "attention calls"), False),
    "parameters": (validate.list_of(_PARAMETER_GROUP, "parameter groups"), False),
    "pipeline": (validate.list_of(_PIPELINE_ACTION, "pipeline actions"), False),
    "experts": (validate.list_of(_EXPERT_LAYER, "expert layers"), False),
    "saved": (validate.list_of(_SAVED, "saved bytes"), False),
    "graph_runs": (validate.list_of(_GRAPH_RUN, "graph runs"), False),
    "in_graphs": (validate.names, False),
    "kernels": (_KERNELS, False)})
