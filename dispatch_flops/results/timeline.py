"""A run's timeline, as a Profile keeps it (``trace=True``): the event type the engine's
tracing timer fills and the Chrome trace export reads."""

from __future__ import annotations

from dataclasses import dataclass

OP = "op"  # one op call
MODULE = "module"  # one forward call of a module, hook to hook
BLOCK = "block"  # the whole ``with`` block


@dataclass(frozen=True)
class TraceEvent:
    """One slice of the timeline. ``start_ns``/``end_ns`` count from the counter's entry.
    Op events carry that one call's counts; module and block events carry zeros (the trace
    writer sums the ops inside them)."""

    kind: str  # OP, MODULE or BLOCK
    name: str  # operator packet ("aten.mm"), module name, or the root label for a block
    phase: str
    stack: tuple  # running module stack, root first
    start_ns: int
    end_ns: int
    overload: str = ""
    category: str = ""
    flops: int = 0
    macs: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    comm_bytes: int = 0  # a collective's bytes on the wire
    comm_alg_bytes: int = 0  # a collective's size S (NCCL-tests' algbw = S / time)
    # masked attention pairs' share of flops / macs, as the call's signature prices them (a
    # mask tensor's pairs, counted on the device, are in the Profile's rows, not per call)
    masked_flops: int = 0
    masked_macs: int = 0
