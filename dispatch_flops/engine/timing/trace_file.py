"""Kineto's trace files read: the Chrome trace JSON torch.profiler writes
(``prof.export_chrome_trace``, ``tensorboard_trace_handler``; plain or gzip) into the records the
kernel join takes (``kernels.HostEvent``, ``kernels.DeviceActivity``), and what offline pricing
reads besides: every ``cpu_op`` with its recorded inputs (``OpEvent``) and every module call
(``ModuleEvent``, from ``with_modules``' ``python_function`` events "nn.Module: Name_i").

Pure data; nothing here touches torch or a GPU. What a real file holds decides, where it
differs from what the live path records:

- **Two External-id conventions.** The External id of a device record is the innermost
  RecordFunction open at its launch (libkineto's ``linkedActivity()->correlationId()``),
  shared by the op, its launch and its kernels. Since kineto PR#1001 (2024-10) a record with
  no linked op carries no External id; older traces set it to the record's own correlation
  (HTA's A100 trace: every one of its 7,747 device records). Read naively, such an id would
  be looked up among the host ops' ids and, where one collides, charge the kernel to an
  unrelated op. So a device record whose External id equals its correlation keeps it only
  where the host range with that id is the innermost one enclosing the record's launch on
  the launch's thread (what a real link always is); otherwise it has no link and is placed
  by its launch.
- **Times** are microseconds with three decimals (integral ns) in current traces, whole
  microseconds since the epoch in older ones; either is read as ns exactly
  (``kernels.us_to_ns``: through a double, 1.7e18 ns are 256 ns apart, enough to move a
  launch that shares its op's end edge out of the op).
- **Malformed files** raise ``TraceFileError`` (a ``ValueError``) naming what is wrong and what
  a valid file is.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from dispatch_flops.engine.timing.kernels import (  # noqa: F401 (the conventions: re-exported)
    DEVICE_KINDS,
    HOST_KINDS,
    LAUNCH_KINDS,
    NEW_CONVENTION,
    OLD_CONVENTION,
    DeviceActivity,
    HostEvent,
    unlink_own_correlations,
    us_to_ns,
)

PYTHON = "python_function"
MODULE_PREFIX = "nn.Module: "
WHAT_IS_VALID = ("a Chrome trace torch.profiler writes (prof.export_chrome_trace(path) or "
                 "tensorboard_trace_handler: JSON, plain or .gz, with a 'traceEvents' list)")


class TraceFileError(ValueError):
    """A file that is not a trace this reader can read; the message says why."""


@dataclass(frozen=True)
class OpEvent:
    """One ``cpu_op`` (an aten op, a custom op, or a host range such as autograd's
    ``evaluate_function``) with its recorded inputs (``record_shapes=True``; empty tuples
    without): per input its dims, type name (a dtype's C++ name for a tensor, "Scalar",
    "ScalarList", "TensorList", "" for None), strides and concrete value as text.
    ``sequence``: autograd's sequence number (forward ops that made a node, and backward ones
    that ran it), None where not recorded; ``index``: its place among the file's ops."""

    index: int
    name: str
    thread: int
    start_ns: int
    end_ns: int
    id: int = 0
    dims: tuple = ()
    types: tuple = ()
    strides: tuple = ()
    concrete: tuple = ()
    sequence: Optional[int] = None
    forward_thread: Optional[int] = None

    @property
    def recorded_inputs(self) -> bool:
        return bool(self.types) or bool(self.dims)


@dataclass(frozen=True)
class ModuleEvent:
    """One module's forward call: ``label`` as the profiler names it ("BertLayer_0": the
    class name and the instance's index among the instances of its class, in the order they
    were first called), on ``thread`` from ``start_ns`` to ``end_ns``."""

    label: str
    cls: str
    thread: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class TraceFile:
    """What a trace file holds: the join's records (``host``, ``device``), the ops and module
    calls, and the facts of its header. ``convention``: how its device records mark "no op"
    (``OLD_CONVENTION``: their own correlation; ``NEW_CONVENTION``: no External id; None:
    no device records). ``self_links``: device records whose External id was their own
    correlation (read as no link)."""

    source: str
    host: tuple
    device: tuple
    ops: tuple
    modules: tuple
    annotations: tuple  # user_annotation ranges: (name, thread, start_ns, end_ns)
    device_name: Optional[str] = None
    device_properties: tuple = ()
    record_shapes: Optional[bool] = None
    with_modules: Optional[bool] = None
    rank: Optional[int] = None
    world_size: Optional[int] = None
    rocm: bool = False
    convention: Optional[str] = None
    self_links: int = 0
    header: Mapping = field(default_factory=dict)


def load(source: Union[str, os.PathLike, Mapping, list]) -> tuple[str, dict]:
    """``(name, trace)``: a path read (gzip by its magic bytes, whatever its name), or a trace
    already loaded (a mapping, or the bare list of events the Chrome format also allows)."""
    if isinstance(source, Mapping):
        data: Any = source
        name = str(source.get("traceName") or "<trace>")
    elif isinstance(source, list):
        data, name = {"traceEvents": source}, "<trace>"
    else:
        name = os.fspath(source)
        try:
            with open(name, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise TraceFileError(f"cannot read trace {name!r}: {e.strerror or e}; expected "
                                 f"{WHAT_IS_VALID}") from None
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError) as e:
                raise TraceFileError(f"{name!r} is gzip but does not decompress ({e}); "
                                     f"expected {WHAT_IS_VALID}") from None
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise TraceFileError(f"{name!r} is not JSON ({e}); expected {WHAT_IS_VALID}"
                                 ) from None
        if isinstance(data, list):
            data = {"traceEvents": data}
    if not isinstance(data, Mapping) or not isinstance(data.get("traceEvents"), list):
        raise TraceFileError(f"{name!r} has no 'traceEvents' list; expected {WHAT_IS_VALID}")
    return name, dict(data)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _tuple(value: Any) -> tuple:
    if isinstance(value, (list, tuple)):
        return tuple(_tuple(v) if isinstance(v, list) else v for v in value)
    return ()


def read(source: Union[str, os.PathLike, Mapping, list]) -> TraceFile:
    """The trace at ``source`` (see ``load``), read: every complete event ("ph": "X") of the
    kinds the join and offline pricing use; flows, instants, counters and metadata are left
    out (the ids carry the same links)."""
    name, trace = load(source)
    host: list[HostEvent] = []
    device: list[DeviceActivity] = []
    ops: list[OpEvent] = []
    modules: list[ModuleEvent] = []
    annotations: list[tuple] = []
    for position, event in enumerate(trace["traceEvents"]):
        if not isinstance(event, Mapping):
            raise TraceFileError(f"{name!r}: event {position} is {type(event).__name__}, not "
                                 f"an object; expected {WHAT_IS_VALID}")
        if event.get("ph") != "X":
            continue
        kind = event.get("cat")
        label = str(event.get("name", ""))
        module = kind == PYTHON and label.startswith(MODULE_PREFIX)
        if kind not in DEVICE_KINDS and kind not in HOST_KINDS and not module:
            continue  # what is not read is not checked either
        args = event.get("args") or {}
        if not isinstance(args, Mapping):
            args = {}
        try:  # exactly: epoch microseconds through a double move edges (us_to_ns)
            start = us_to_ns(event.get("ts"))
            end = start + max(0, us_to_ns(event.get("dur", 0)))
        except ValueError as e:
            raise TraceFileError(f"{name!r}: event {position} ({label!r}) has a ts or dur that "
                                 f"is not a number ({e}); expected {WHAT_IS_VALID}, its "
                                 f"times in microseconds") from None
        thread = _int(event.get("tid"))
        external = _int(args.get("External id"))
        if kind in DEVICE_KINDS:
            device.append(DeviceActivity(
                kind, label, _int(args.get("device", event.get("pid"))),
                _int(args.get("stream", event.get("tid"))), start, end,
                _int(args.get("correlation")), external,
                _tuple(args.get("grid")), _tuple(args.get("block")),
                _int(args.get("graph node id"))))
        elif kind in LAUNCH_KINDS:
            host.append(HostEvent(kind, label, thread, start, end, 0, external,
                                  _int(args.get("correlation"))))
        elif kind in HOST_KINDS:
            host.append(HostEvent(kind, label, thread, start, end, external))
            if kind == "cpu_op":
                sequence = args.get("Sequence number")
                forward = args.get("Fwd thread id")
                ops.append(OpEvent(
                    len(ops), label, thread, start, end, external,
                    _tuple(args.get("Input Dims")), _tuple(args.get("Input type")),
                    _tuple(args.get("Input Strides")), _tuple(args.get("Concrete Inputs")),
                    None if sequence is None else _int(sequence, -1),
                    None if forward is None else _int(forward)))
            else:
                annotations.append((label, thread, start, end))
        else:  # a module's forward call (with_modules)
            called = label[len(MODULE_PREFIX):]
            modules.append(ModuleEvent(called, called.rpartition("_")[0] or called, thread,
                                       start, end))
    device, self_links, convention = unlink_own_correlations(host, device)
    props = trace.get("deviceProperties") or ()
    props = tuple(p for p in props if isinstance(p, Mapping)) if isinstance(props, list) else ()
    dist = trace.get("distributedInfo")
    if not isinstance(dist, Mapping):
        dist = {}
    header = {k: v for k, v in trace.items() if k != "traceEvents"}
    return TraceFile(
        source=name, host=tuple(host), device=tuple(device), ops=tuple(ops),
        modules=tuple(modules), annotations=tuple(annotations),
        device_name=str(props[0].get("name")) if props and props[0].get("name") else None,
        device_properties=props,
        record_shapes=_flag(trace.get("record_shapes")),
        with_modules=_flag(trace.get("with_modules")),
        rank=_int(dist.get("rank"), -1) if "rank" in dist else None,
        world_size=_int(dist.get("world_size"), -1) if "world_size" in dist else None,
        rocm=any(k in trace for k in ("roctracer_version", "hip_runtime_version")),
        convention=convention, self_links=self_links, header=header)


def _flag(value: Any) -> Optional[bool]:
    if value is None:
        return None
    return bool(_int(value)) if not isinstance(value, bool) else value
