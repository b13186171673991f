"""The dispatch mode: runs each op, then hands it to a cheap per-op recorder.

The per-op path is the hot path. It keeps only ints (never a tensor), resolves each
OpOverload once, and leaves all aggregation to report time.
"""

from __future__ import annotations

import inspect
from bisect import bisect_right
from functools import partial

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from dispatch_flops.formulas import Category, Movement, Registry

from ._results import BACKWARD, FORWARD
from ._tracker import ACCUMULATE_GRAD_SEQ as _ACCUMULATE_GRAD_SEQ

_current_node = torch._C._current_autograd_node

# per-overload kinds, small ints for the hot path
VIEW, COPY, WRITE, FORMULA, UNKNOWN, FORMULA_DTYPES = range(6)
_MOVEMENT_KIND = {Movement.NONE: VIEW, Movement.COPY: COPY, Movement.WRITE: WRITE}


def real_bytes(t: Tensor) -> int:
    """Bytes a tensor really occupies: an expanded (stride-0) dim holds one element."""
    if t.is_contiguous():
        return t.nbytes
    try:
        strides = t.stride()
    except RuntimeError:  # sparse / nested layouts have no strides
        return t.nbytes
    n = 1
    for size, stride in zip(t.shape, strides):
        if stride or not size:
            n *= size
    return n * t.element_size()


def _bytes(values) -> int:
    """Bytes of the tensors in ``values``, one level of lists/tuples deep (Tensor[] args)."""
    total = 0
    for v in values:
        if isinstance(v, Tensor):
            total += v.nbytes if v.is_contiguous() else real_bytes(v)
        elif v.__class__ is list or v.__class__ is tuple:
            for x in v:
                if isinstance(x, Tensor):
                    total += x.nbytes if x.is_contiguous() else real_bytes(x)
    return total


def _shape(v):
    if isinstance(v, Tensor):
        return v.shape
    if v.__class__ in (list, tuple):
        return [x.shape if isinstance(x, Tensor) else x for x in v]
    return v


def _dtype(v):
    if isinstance(v, Tensor):
        return v.dtype
    if v.__class__ in (list, tuple):
        return [x.dtype if isinstance(x, Tensor) else None for x in v]
    return None


def _cost_with_dtypes(formula, args, kwargs, out):
    """The formula call for formulas that opt in to ``dtypes`` (see the formula contract);
    kept off the common path so that the others never pay for it."""
    shapes, dtypes = [], []
    for a in args:
        if isinstance(a, Tensor):
            shapes.append(a.shape)
            dtypes.append(a.dtype)
        else:
            shapes.append(_shape(a))
            dtypes.append(_dtype(a))
    out_shape = out.shape if isinstance(out, Tensor) else _shape(out)
    if kwargs:
        return formula(*shapes, out_shape=out_shape, dtypes=dtypes,
                       **{k: _shape(v) for k, v in kwargs.items()})
    return formula(*shapes, out_shape=out_shape, dtypes=dtypes)


class _Resolved:
    __slots__ = ("func", "kind", "formula", "write_only")

    def __init__(self, func, kind, formula, write_only):
        self.func = func
        self.kind = kind
        self.formula = formula
        self.write_only = write_only


def _resolutions(registry: Registry, causal_unmasked_only: bool) -> dict:
    """Resolutions shared by every counter on the same registry and options. They live in
    the registry's own cache, which it empties on any change, so a newly registered formula
    is seen by the next counter."""
    return registry.lookup_cache.setdefault(("resolved", causal_unmasked_only), {})


class CountingMode(TorchDispatchMode):
    """Counts every op into ``frames[(stack, phase)][id(overload)] = [calls, flops, macs, read,
    written]``. ``tracker`` supplies the module stack; see ``_tracker``.

    Dicts on the hot path are keyed by ``id(func)``: ``OpOverload.__hash__`` is a Python-level
    call, and overloads are long-lived singletons (``resolved[id].func`` keeps each alive)."""

    def __init__(self, registry: Registry, tracker, causal_unmasked_only: bool):
        super().__init__()
        self.registry = registry
        self.tracker = tracker
        self.causal_unmasked_only = causal_unmasked_only
        self.frames: dict[tuple, dict] = {}
        self.resolved = _resolutions(registry, causal_unmasked_only)
        self._boundary_seqs = tracker.boundary_seqs  # the tracker appends; we only bisect
        self._backward_by_boundary: dict[int, dict] = {}
        self._backward_by_param: dict[int, dict] = {}
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

    def op(self, key: int):
        """The OpOverload behind a hot-path key."""
        return self.resolved[key].func

    def _resolve(self, func) -> _Resolved:
        entry = self.registry.lookup(func)
        formula = entry.formula
        if entry.category is Category.FORMULA or entry.category is Category.ESTIMATED:
            kind = FORMULA
            parameters = inspect.signature(formula).parameters
            if "causal_unmasked_only" in parameters:
                formula = partial(formula, causal_unmasked_only=self.causal_unmasked_only)
            if "dtypes" in parameters:
                kind = FORMULA_DTYPES
        elif entry.category is Category.NO_ARITHMETIC:
            kind = _MOVEMENT_KIND[entry.movement]
        else:
            kind = UNKNOWN
        write_only = frozenset(
            a.name
            for a in func._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        )
        resolved = self.resolved[id(func)] = _Resolved(func, kind, formula, write_only)
        return resolved

    def _backward_acc(self, node, seq: int) -> dict:
        """The backward frame of a node: by module boundary, or by parameter for the
        AccumulateGrad nodes (they all carry the same sequence number)."""
        if seq == _ACCUMULATE_GRAD_SEQ:
            param = id(getattr(node, "variable", None))
            acc = self._backward_by_param.get(param)
            if acc is None:
                acc = self._backward_by_param[param] = self.frame(
                    self.tracker.stack_of_node(node), BACKWARD
                )
            return acc
        boundary = bisect_right(self._boundary_seqs, seq)
        acc = self._backward_by_boundary[boundary] = self.frame(
            self.tracker.stack_of_node(node), BACKWARD
        )
        return acc

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # The hot path: runs for every aten op. Keep it flat (no helper calls in the common
        # case) and keep only ints.
        out = func(*args, **kwargs) if kwargs else func(*args)
        key = id(func)
        resolved = self.resolved.get(key)
        if resolved is None:
            resolved = self._resolve(func)
        node = _current_node()
        if node is None:
            acc = self.forward_acc
        else:
            # nodes made between the same two module boundaries share a frame: one bisect
            seq = node._sequence_nr()
            acc = self._backward_by_boundary.get(bisect_right(self._boundary_seqs, seq))
            if acc is None or seq == _ACCUMULATE_GRAD_SEQ:
                acc = self._backward_acc(node, seq)
        rec = acc.get(key)
        if rec is None:
            rec = acc[key] = [0, 0, 0, 0, 0]
        rec[0] += 1
        kind = resolved.kind
        if kind == VIEW:
            return out
        if kind != WRITE:
            read = 0
            for a in args:
                if isinstance(a, Tensor):
                    read += a.nbytes if a.is_contiguous() else real_bytes(a)
                elif a.__class__ is list or a.__class__ is tuple:
                    read += _bytes(a)
            if kwargs:
                write_only = resolved.write_only
                read += _bytes([v for k, v in kwargs.items() if k not in write_only])
            rec[3] += read
        if isinstance(out, Tensor):
            rec[4] += out.nbytes if out.is_contiguous() else real_bytes(out)
        elif out.__class__ is list or out.__class__ is tuple:
            rec[4] += _bytes(out)
        if kind == FORMULA:
            shapes = [a.shape if isinstance(a, Tensor) else _shape(a) for a in args]
            out_shape = out.shape if isinstance(out, Tensor) else _shape(out)
            if kwargs:
                cost = resolved.formula(
                    *shapes, out_shape=out_shape, **{k: _shape(v) for k, v in kwargs.items()}
                )
            else:
                cost = resolved.formula(*shapes, out_shape=out_shape)
            rec[1] += cost.flops
            rec[2] += cost.macs
        elif kind == FORMULA_DTYPES:
            cost = _cost_with_dtypes(resolved.formula, args, kwargs, out)
            rec[1] += cost.flops
            rec[2] += cost.macs
        return out
