"""The dispatch mode: runs each op, then hands it to a cheap per-op recorder.

The per-op path is the hot path. It keeps only ints (never a tensor), resolves each
OpOverload once, and leaves all aggregation to report time.
"""

from __future__ import annotations

from functools import partial
import inspect

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from dispatch_flops.formulas import Category, Movement, Registry

from ._results import BACKWARD, FORWARD

_current_node = torch._C._current_autograd_node

# per-overload kinds, small ints for the hot path
VIEW, COPY, WRITE, FORMULA, UNKNOWN = range(5)
_MOVEMENT_KIND = {Movement.NONE: VIEW, Movement.COPY: COPY, Movement.WRITE: WRITE}


def real_bytes(t: Tensor) -> int:
    """Bytes a tensor really occupies: an expanded (stride-0) dim holds one element."""
    if t.is_contiguous():
        return t.numel() * t.element_size()
    try:
        strides = t.stride()
    except RuntimeError:  # sparse / nested layouts have no strides
        return t.numel() * t.element_size()
    n = 1
    for size, stride in zip(t.shape, strides):
        if stride or not size:
            n *= size
    return n * t.element_size()


def _bytes(values) -> int:
    total = 0
    for v in values:
        if isinstance(v, Tensor):
            total += real_bytes(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, Tensor):
                    total += real_bytes(x)
    return total


def _shape(v):
    if isinstance(v, Tensor):
        return v.shape
    if isinstance(v, (list, tuple)):
        return [x.shape if isinstance(x, Tensor) else x for x in v]
    return v


class _Resolved:
    __slots__ = ("kind", "formula", "write_only")

    def __init__(self, kind, formula, write_only):
        self.kind = kind
        self.formula = formula
        self.write_only = write_only


class CountingMode(TorchDispatchMode):
    """Counts every op into ``frames[(stack, phase)][overload] = [calls, flops, macs, read,
    written]``. ``tracker`` supplies the module stack; see ``_tracker``."""

    def __init__(self, registry: Registry, tracker, causal_unmasked_only: bool):
        super().__init__()
        self.registry = registry
        self.tracker = tracker
        self.causal_unmasked_only = causal_unmasked_only
        self.frames: dict[tuple, dict] = {}
        self.resolved: dict = {}
        self._backward_by_seq: dict[int, dict] = {}
        self.forward_acc = self.frame(tracker.stack, FORWARD)

    def frame(self, stack: tuple, phase: str) -> dict:
        key = (stack, phase)
        acc = self.frames.get(key)
        if acc is None:
            acc = self.frames[key] = {}
        return acc

    def on_stack_change(self, stack: tuple) -> None:
        self.forward_acc = self.frame(stack, FORWARD)

    def category(self, func) -> Category:
        return self.registry.lookup(func).category

    def _resolve(self, func) -> _Resolved:
        entry = self.registry.lookup(func)
        formula = entry.formula
        if entry.category is Category.FORMULA:
            kind = FORMULA
            if "causal_unmasked_only" in inspect.signature(formula).parameters:
                formula = partial(formula, causal_unmasked_only=self.causal_unmasked_only)
        elif entry.category is Category.NO_ARITHMETIC:
            kind = _MOVEMENT_KIND[entry.movement]
        else:
            kind = UNKNOWN
        write_only = frozenset(
            a.name
            for a in func._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        )
        resolved = self.resolved[func] = _Resolved(kind, formula, write_only)
        return resolved

    def _backward_acc(self, node) -> dict:
        seq = node._sequence_nr()
        acc = self._backward_by_seq.get(seq)
        if acc is None:
            acc = self.frame(self.tracker.stack_of_node(node), BACKWARD)
            if seq != 2**64 - 1:  # AccumulateGrad nodes share one number; look them up each time
                self._backward_by_seq[seq] = acc
        return acc

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        out = func(*args, **kwargs)
        resolved = self.resolved.get(func) or self._resolve(func)
        node = _current_node()
        acc = self.forward_acc if node is None else self._backward_acc(node)
        rec = acc.get(func)
        if rec is None:
            rec = acc[func] = [0, 0, 0, 0, 0]
        rec[0] += 1
        kind = resolved.kind
        if kind == VIEW:
            return out
        if kind != WRITE:
            if resolved.write_only:
                rec[3] += _bytes(args) + _bytes(
                    v for k, v in kwargs.items() if k not in resolved.write_only
                )
            else:
                rec[3] += _bytes(args) + (_bytes(kwargs.values()) if kwargs else 0)
        rec[4] += _bytes((out,))
        if kind == FORMULA:
            cost = resolved.formula(
                *[_shape(a) for a in args],
                out_shape=_shape(out),
                **{k: _shape(v) for k, v in kwargs.items()},
            )
            rec[1] += cost.flops
            rec[2] += cost.macs
        return out
