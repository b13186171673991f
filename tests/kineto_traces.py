"""Activity traces in the shape Kineto produces, for the kernel join's tests (no GPU).

The CPU half is real: ``record_cpu`` runs a function under ``torch.profiler`` (CPU activity)
with a dispatch mode that opens the timer's ``df:op:<token>`` range around every op, as the
kernel timer does, and returns Kineto's Chrome trace (cpu_op events with their External ids,
nested as the profiler recorded them) and which op each token was. The GPU half is synthetic
but in Kineto's exact shape (libkineto's output_json.cpp and CuptiActivity.cpp): ``add_gpu``
puts a ``cudaLaunchKernel`` runtime event inside the innermost host op of each name it is
given, and the kernel on the device: ``"pid"`` the device, ``"tid"`` the stream, args with
``External id``, ``correlation``, ``grid``, ``block``...; ``ac2g`` flows between them; a
device clock that runs each kernel once both it is launched and the device is free.
"""

from __future__ import annotations

import json
import os
import tempfile
from itertools import count
from typing import Callable, Mapping, Optional

from torch._C._profiler import _RecordFunctionFast
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

OP_PREFIX = "df:op:"
MARK_PREFIX = "df:mark:"
RUNTIME_LAUNCH_CBID = 211  # cudaLaunchKernel_v7000
LAUNCH_LATENCY_US = 4.0  # host launch to earliest kernel start


class Annotating(TorchDispatchMode):
    """Opens ``df:op:<token>`` around each op it sees and notes the op's name per token."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[int, str] = {}
        self._next = count()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        token = next(self._next)
        self.ops[token] = str(func.overloadpacket).replace(".", "::", 1)
        with _RecordFunctionFast(f"{OP_PREFIX}{token}"):
            return func(*args, **(kwargs or {}))


def mark(mark_id: int) -> None:
    """The timer's module-boundary instant."""
    fast = _RecordFunctionFast(f"{MARK_PREFIX}{mark_id}")
    fast.__enter__()
    fast.__exit__(None, None, None)


def record_cpu(fn: Callable[[Annotating], None]) -> tuple[dict, dict]:
    """(Kineto's Chrome trace of ``fn(mode)`` run on the CPU under ``Annotating``, token ->
    op name)."""
    mode = Annotating()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(mode)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return trace, mode.ops


def add_gpu(trace: dict, kernels: Mapping[str, list], device: int = 0, stream: int = 7,
            first_correlation: int = 100000) -> list:
    """Add to ``trace`` a launch and device activities for the innermost host op of each name
    in ``kernels`` (``{"aten::addmm": [(kind, name, dur_us), ...]}``); returns the added
    device events. An op named twice in a nest (the mode's re-dispatch) launches from the
    inner one, as CUDA ops do."""
    events = trace["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    innermost = []
    for e in ops:
        if e["name"] not in kernels:
            continue
        end = e["ts"] + e["dur"]
        nested_same = any(o is not e and o["tid"] == e["tid"] and o["name"] == e["name"]
                          and e["ts"] <= o["ts"] and o["ts"] + o["dur"] <= end for o in ops)
        if not nested_same:
            innermost.append(e)
    innermost.sort(key=lambda e: e["ts"])
    correlation = count(first_correlation)
    free = 0.0
    added = []
    for op in innermost:
        at = op["ts"] + min(1.0, op["dur"] / 4)
        for kind, name, dur in kernels[op["name"]]:
            c = next(correlation)
            launch_dur = min(2.0, op["dur"] / 8)
            runtime = {"ph": "X", "cat": "cuda_runtime",
                       "name": "cudaLaunchKernel" if kind == "kernel" else "cudaMemcpyAsync",
                       "pid": op["pid"], "tid": op["tid"], "ts": round(at, 3),
                       "dur": round(launch_dur, 3),
                       "args": {"External id": op["args"]["External id"],
                                "cbid": RUNTIME_LAUNCH_CBID, "correlation": c}}
            start = max(free, at + LAUNCH_LATENCY_US)
            free = start + dur
            added.append(device_event(kind, name, start, dur, c, op["args"]["External id"],
                                      device, stream))
            events += [runtime, added[-1],
                       {"ph": "s", "id": c, "pid": op["pid"], "tid": op["tid"],
                        "ts": runtime["ts"], "cat": "ac2g", "name": "ac2g"},
                       {"ph": "f", "id": c, "pid": device, "tid": stream,
                        "ts": added[-1]["ts"], "cat": "ac2g", "name": "ac2g", "bp": "e"}]
            at += launch_dur
    return added


def device_event(kind: str, name: str, ts: float, dur: float, correlation: int,
                 external_id: Optional[int], device: int = 0, stream: int = 7) -> dict:
    """One device activity as Kineto writes it (no External id when nothing is linked)."""
    args: dict = {}
    if external_id:
        args["External id"] = external_id
    if kind == "kernel":
        args.update({"queued": 0, "device": device, "context": 1, "stream": stream,
                     "correlation": correlation, "registers per thread": 32,
                     "shared memory": 0, "blocks per SM": 0.5, "warps per SM": 2.0,
                     "grid": [66, 1, 1], "block": [128, 1, 1],
                     "est. achieved occupancy %": 6})
    else:
        args.update({"device": device, "context": 1, "stream": stream,
                     "correlation": correlation, "bytes": 4096,
                     "memory bandwidth (GB/s)": 4096 / (dur * 1000)})
    return {"ph": "X", "cat": kind, "name": name, "pid": device, "tid": stream,
            "ts": round(ts, 3), "dur": round(dur, 3), "args": args}


def launch(name: str, kind: str, tid: int, ts: float, dur: float, correlation: int,
           external_id: int = 0, pid: int = 1) -> dict:
    """A runtime or driver launch as Kineto writes it."""
    args: dict = {"cbid": RUNTIME_LAUNCH_CBID, "correlation": correlation}
    if external_id:
        args["External id"] = external_id
    return {"ph": "X", "cat": kind, "name": name, "pid": pid, "tid": tid, "ts": ts,
            "dur": dur, "args": args}


def host_op(name: str, tid: int, ts: float, dur: float, external_id: int,
            pid: int = 1) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": tid, "ts": ts,
            "dur": dur, "args": {"External id": external_id, "Record function id": 0}}


class SyntheticGpu:
    """A kernel timer's session for the CPU: Kineto records the CPU half for real (CPU
    activity), and ``stop()`` adds a GPU half in the neutral form the join reads: each
    innermost host op named in ``kernels`` launches its kernels (linked by its id), and each
    host range named ``launch:<kernel>`` (where a raw Triton or extension kernel would be
    launched, no op open) gets a ``cuLaunchKernel`` and its kernel, with no link. CUDA graphs
    (tests/fake_cuda_graph.py): no kernel runs inside a ``cuda_graph_capture`` range, and each
    ``launch_graph:<n>`` range (a replay) is a ``cudaGraphLaunch`` whose kernels are
    ``graphs[n]``'s ``(graph node tools id, name, us)``, all with the launch's correlation and
    linked to the range, as Kineto links a replay's kernels."""

    def __init__(self, kernels: Mapping[str, list], outside_us: float = 5.0,
                 graphs: Optional[Mapping[int, list]] = None) -> None:
        from dispatch_flops.engine.timing.kineto import KinetoSession

        self.session = KinetoSession(cuda=False)
        self.kernels = kernels
        self.outside_us = outside_us
        self.graphs = graphs if graphs is not None else {}
        self.started = self.stopped = 0

    def start(self) -> None:
        self.started += 1
        self.session.start()

    def stop(self):
        from dispatch_flops.engine.timing import kernels as K

        self.stopped += 1
        host, device = self.session.stop()
        host = list(host)
        ops = [e for e in host if e.kind == K.CPU_OP]
        correlation = count(200000)
        free = max((e.end_ns for e in host), default=0)
        captures = [e for e in ops if e.name == "cuda_graph_capture"]
        for e in sorted(ops, key=lambda e: e.start_ns):
            if any(c.thread == e.thread and c.start_ns <= e.start_ns and e.end_ns <= c.end_ns
                   for c in captures):
                continue  # captured: recorded into the graph, not run
            if e.name.startswith("launch_graph:"):
                c = next(correlation)
                host.append(K.HostEvent(K.RUNTIME, "cudaGraphLaunch", e.thread, e.start_ns,
                                        e.end_ns, 0, e.id, c))
                for node, name, dur in self.graphs.get(int(e.name.split(":")[1]), ()):
                    ns = round(dur * 1000)
                    device.append(K.DeviceActivity(K.KERNEL, name, 0, 7, free, free + ns, c,
                                                   e.id, graph_node=node))
                    free += ns
                continue
            if e.name.startswith("launch:"):
                c = next(correlation)
                host.append(K.HostEvent(K.DRIVER, "cuLaunchKernel", e.thread, e.start_ns,
                                        e.end_ns, 0, 0, c))
                ns = round(self.outside_us * 1000)
                device.append(K.DeviceActivity(K.KERNEL, e.name[len("launch:"):], 0, 7,
                                               free, free + ns, c, 0))
                free += ns
                continue
            if e.name not in self.kernels or any(
                    o is not e and o.thread == e.thread and o.name == e.name and
                    e.start_ns <= o.start_ns and o.end_ns <= e.end_ns for o in ops):
                continue
            for kind, name, dur in self.kernels[e.name]:
                ns = round(dur * 1000)
                device.append(K.DeviceActivity(kind, name, 0, 7, free, free + ns,
                                               next(correlation), e.id))
                free += ns + 1000  # host-bound: a gap between kernels
        return host, device


def raw_launch(name: str) -> None:
    """Where a raw kernel named ``name`` is launched (``SyntheticGpu`` gives it a launch)."""
    with _RecordFunctionFast(f"launch:{name}"):
        pass
