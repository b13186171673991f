"""A fake CUDA for the timer's CUDA branch, on a machine without a GPU.

Tensors stay real CPU tensors; the fake only makes the timer believe some are on ``cuda:N``
(``_timing.cuda_index`` answers from the tensor's dtype: ``dtypes={torch.float32: 0}``), and
stands in for what the timer asks of ``torch.cuda``: ``Event``, ``synchronize``,
``current_stream`` (and the C call behind it), ``is_available``, ``is_initialized``,
``device_count``, ``current_device``, ``is_current_stream_capturing``. ``HostDevices``, a
dispatch mode entered below the counter, runs ``device=cuda`` factories and copies on the CPU
(called as ops: ``torch.ops.aten._to_copy.default(x, device=...)``; a CPU build of torch
refuses ``x.to("cuda")`` before any dispatch).

Each device has a virtual clock: every event recorded on it advances the clock by ``TICK_NS``
and stamps the event with it, so an op with nothing recorded between its two events took
exactly one tick. The device runs ``lag`` records behind the host: an event completes once
``lag`` more have been recorded on its device, or the device is synchronized. Like CUDA, an
event raises when asked for ``elapsed_time`` before both events are recorded and completed,
or across devices, and when re-recorded on another device's stream; an event recorded during
graph capture cannot be queried.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dispatch_flops.engine.timing import clock as _timing

TICK_NS = 1000


class FakeStream:
    def __init__(self, stream_id: int, device_index: int) -> None:
        self.stream_id = stream_id
        self.device_index = device_index


class FakeCuda:
    def __init__(self, dtypes=None, devices: int = 2, lag: int = 8) -> None:
        self.dtypes = {torch.float32: 0} if dtypes is None else dtypes
        self.devices = devices
        self.lag = lag
        self.initialized = False
        self.capturing = False
        self.fail_elapsed = 0  # when > 0: the elapsed_time call that fails, counting from 1
        self.current = 0  # current device
        self.issued = [0] * devices  # events recorded on each device
        self.done = [0] * devices  # of which completed
        self.recorded: Counter = Counter()  # (device, stream id) -> events recorded there
        self.synced: list[int] = []
        self.created = 0  # Event objects made
        self._streams = threading.local()  # device -> stream id, per thread
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                fake.created += 1
                self.device = None
                self.seq = None
                self.at = None
                self.captured = False

            def record(self, stream=None) -> None:
                stream = stream if stream is not None else fake.current_stream()
                device = stream.device_index
                if self.device is not None and self.device != device:
                    raise RuntimeError(f"Event device {self.device} does not match recording "
                                       f"stream's device {device}.")
                fake.initialized = True
                self.device, self.captured = device, fake.capturing
                fake.issued[device] += 1
                self.seq = fake.issued[device]
                self.at = self.seq * TICK_NS
                fake.done[device] = max(fake.done[device], self.seq - fake.lag)
                fake.recorded[device, stream.stream_id] += 1

            def query(self) -> bool:
                if self.captured:
                    raise RuntimeError("CUDA error: operation not permitted when stream is "
                                       "capturing (907)")
                return self.seq is None or fake.done[self.device] >= self.seq

            def elapsed_time(self, end) -> float:
                if self.seq is None or end.seq is None:
                    raise RuntimeError("Both events must be recorded before calculating "
                                       "elapsed time.")
                if self.device != end.device:
                    raise RuntimeError("CUDA error: invalid resource handle (events on "
                                       "different devices)")
                if not (self.query() and end.query()):
                    raise RuntimeError("Both events must be completed before calculating "
                                       "elapsed time.")
                if fake.fail_elapsed:
                    fake.fail_elapsed -= 1
                    if not fake.fail_elapsed:
                        raise RuntimeError("CUDA error: an illegal memory access was encountered")
                return (end.at - self.at) / 1e6  # ms

        self.Event = Event

    # -- what the timer asks of torch.cuda ---------------------------------------------------
    def stream_id(self, device: int) -> int:
        return getattr(self._streams, "ids", {}).get(device, 0)

    def get_current_stream(self, device: int) -> tuple:
        device = self.current if device is None else device
        return (self.stream_id(device), device, 1)

    def current_stream(self, device=None) -> FakeStream:
        if device is None:
            index = self.current
        elif isinstance(device, int):
            index = device
        else:
            index = torch.device(device).index or 0
        return FakeStream(self.stream_id(index), index)

    def synchronize(self, device=None) -> None:
        device = self.current if device is None else device
        self.done[device] = self.issued[device]
        self.synced.append(device)

    def cuda_index(self, t) -> int:
        return self.dtypes.get(t.dtype, -1)

    @contextlib.contextmanager
    def stream(self, device: int, stream_id: int):
        """``torch.cuda.stream`` for this thread: ops on ``device`` go to ``stream_id``."""
        ids = self._streams.__dict__.setdefault("ids", {})
        before = ids.get(device, 0)
        ids[device] = stream_id
        try:
            yield
        finally:
            ids[device] = before

    def install(self, monkeypatch) -> "FakeCuda":
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "is_initialized", lambda: self.initialized)
        monkeypatch.setattr(cuda, "device_count", lambda: self.devices)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "Event", self.Event)
        monkeypatch.setattr(cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(cuda, "current_stream", self.current_stream)
        monkeypatch.setattr(cuda, "is_current_stream_capturing", lambda: self.capturing)
        monkeypatch.setattr(cuda, "_lazy_init", lambda: None)
        monkeypatch.setattr(torch._C, "_cuda_getCurrentStream", self.get_current_stream,
                            raising=False)
        monkeypatch.setattr(_timing, "_cuda_current_stream", self.get_current_stream)
        monkeypatch.setattr(_timing, "cuda_index", self.cuda_index)
        monkeypatch.setattr(_timing, "_STATE", _timing._CudaState())  # pools and queues
        return self

    # -- what the tests read -----------------------------------------------------------------
    def pending(self) -> int:
        """Event pairs queued in the timer's process-wide state."""
        return sum(len(s.pending) for s in _timing._STATE.streams.values())

    def records_on(self, device: int) -> int:
        return sum(n for (d, _), n in self.recorded.items() if d == device)


class HostDevices(TorchDispatchMode):
    """Runs ops that ask for a CUDA device (``aten._to_copy(x, device=cuda)``, factories) on
    the CPU: entered below the counter, it sees the op after the counter has."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = torch.device("cpu")
        return func(*args, **kwargs)
