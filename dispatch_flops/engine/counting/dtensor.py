"""DTensor's logical accounting: the DTensor-level calls a counting mode lets DTensor unwrap
(counted at their global shapes) and the plain-tensor ops around them (at their shard factor),
kept apart from what this rank executes, which the mode counts as usual. The slow path: a
mode that never meets a DTensor never reaches this module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import ValuesView
from types import FrameType
from typing import Optional

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from dispatch_flops.engine.counting.calls import remembered, work_out
from dispatch_flops.engine.counting.records import PricingError
from dispatch_flops.engine.torch_private import current_autograd_node as _current_node
from dispatch_flops.engine.torch_private import disable_current_modes as _disable_current_modes
from dispatch_flops.formulas import Category
from dispatch_flops.formulas.attention import CAUSAL_DIAGONAL_FORMULAS
from dispatch_flops.results.stats import PRICED

# subclasses the mode lets run an op first (``unwrapping``), and the dispatch key of the
# fake mode DTensor's sharding propagation runs under
_UNWRAPPED = frozenset(("DTensor", "AsyncCollectiveTensor"))
_FAKE = torch._C._TorchDispatchModeKey.FAKE


def unwrapping(types) -> Optional[str]:
    """The name of the subclass among ``types`` that the mode lets run an op first (it
    returns ``NotImplemented``), None when there is none. A DTensor runs the op as local ops
    on its shards and the collectives that redistribute them, which come back to the mode and
    are counted (what this rank executes); the DTensor-level call is kept apart, at its global
    shapes (``LogicalFigure.logical``). An AsyncCollectiveTensor unwraps into
    ``wait_tensor`` and the op."""
    for t in types:
        if t.__name__ in _UNWRAPPED and t.__module__.startswith("torch.distributed"):
            return t.__name__
    return None

class LogicalFigure:
    """The DTensor-level (logical) figure of one counting mode: the calls it let DTensor
    unwrap (``unwrapping``), at their global shapes, and the plain-tensor ops run outside
    them, each at its shard factor. Made by the mode when it first meets a DTensor (or a
    model with DTensor parameters: ``follow_local_tensors``); read by ``logical_ops``.

    >>> figure = mode.dtensor_figure()
    >>> figure.logical_ops()  # ((overload, shapes, calls, flops, macs), ...)
    """

    def __init__(self, mode):
        self.mode = mode
        # {key: [calls, Signature or None, resolution, shapes, factor, global elements]}
        self.records: dict = {}
        # what tells a DTensor's own local work from the plain-tensor ops around it (see
        # ``local``): the (caller frame, instruction, autograd node) of the last DTensor-level
        # call, its global output's elements, and the shard factor of the tensors made so far
        self.dtensor_call: tuple = ()
        self.dtensor_numel = 0
        self.caller: Optional[FrameType] = None
        self.shards = WeakIdKeyDictionary()

    def run_sharding_propagation_uncounted(self) -> None:
        """From now on, run without counting the ops that run under a fake tensor mode or
        that DTensor's sharding propagation makes (``outside_sharding_propagation``). Called
        whenever the mode lets a DTensor run an op (after the first, it sets what is set):
        DTensor works out the global shapes of its ops on fake tensors under this mode, and,
        for an op with no sharding rule of its own (the CPU flash attention, hardswish),
        traces the op's decomposition on meta tensors once per candidate placement
        (``torch.distributed.tensor._decompositions``, thousands of ops for one attention):
        those ops are its bookkeeping, not work this rank executes."""
        # only a mode that has met a DTensor pays for the fake-mode check on every op
        self.mode.divert(outside_sharding_propagation)

    def followed(self, func, types, args, kwargs, caller):
        """Count the call (``caller``: the frame that made it), then follow it into the
        logical figure (``local``)."""
        self.caller = caller
        mode = self.mode
        out = mode.counted(func, types, args, kwargs)
        if out is not NotImplemented:
            self.local(func, args, kwargs, out, caller)
        return out

    def local(self, func, args, kwargs, out, caller) -> None:
        """A plain-tensor op, once a DTensor was met. Run by DTensor as its own local work
        (from the call site and autograd node of the DTensor-level call it serves, or from
        DTensor's Python code): its outputs take the shard factor of that call's output
        (global elements / local ones), and the logical figure has the call already.
        Otherwise it is the user's (attention on the local heads tensor parallelism's
        ``use_local_output`` hands over, a loss): counted in the logical figure at its
        inputs' largest shard factor (one for a replica), which its outputs take. A
        collective keeps the global elements (an all-gather's output is whole)."""
        shards = self.shards
        resolved = self.mode.resolved.get(id(func)) or self.mode.resolve(func)
        inputs = _tensors(args) + (_tensors(kwargs.values()) if kwargs else [])
        factor = 1
        if shards:
            for t in inputs:
                factor = max(factor, shards.get(t, 1))
        if resolved.category is Category.COMMUNICATION:
            if inputs:
                factor = factor * inputs[0].numel()
            for t in _tensors(out):
                if t.numel() and factor / t.numel() > 1:
                    shards[t] = factor / t.numel()
                elif t in shards:
                    del shards[t]
            return
        frame, kind = _origin(caller)
        if kind is _DTENSOR or _call_site(frame) == self.dtensor_call:
            whole = self.dtensor_numel
            inherited = shards.get(args[0]) if resolved.view and args and \
                isinstance(args[0], Tensor) else None
            for t in _tensors(out):
                local = inherited or (whole / t.numel() if whole and t.numel() else 1)
                if local > 1:
                    shards[t] = local
                elif t in shards:
                    del shards[t]
            return
        self.logical(func, args, kwargs, factor)
        if factor > 1:
            for t in _tensors(out):
                shards[t] = factor

    def logical(self, func, args, kwargs, factor=None) -> None:
        """Count a DTensor-level call at its global shapes (``factor`` None), or a
        plain-tensor op at its shapes times ``factor``: worked out once per distinct call
        (shapes, dtypes and other arguments) in the process, on meta tensors, and priced when
        read (``logical_ops``)."""
        kwargs = kwargs or {}
        call = (id(func), _logical_key(args), _logical_key(kwargs.items()) if kwargs else ())
        key = (factor,) + call
        rec = self.records.get(key)
        if rec is None:
            resolved = self.mode.resolved.get(id(func)) or self.mode.resolve(func)
            shared = self.mode.logical_signatures
            # every counter's: worked out once per process
            worked = remembered(shared, call, lambda: _on_meta(func, resolved, args, kwargs))
            shapes = tuple(t.shape for t in _tensors(args) + (
                _tensors(kwargs.values()) if kwargs else []))
            rec = self.records[key] = [0, worked[0], resolved, shapes, factor, worked[1]]
        rec[0] += 1
        if factor is None:  # the local work DTensor runs next is this call's
            caller = self.caller if self.mode.diverted \
                else sys._getframe().f_back.f_back  # type: ignore[union-attr]
            frame, kind = _origin(caller)
            # a DTensor-level call DTensor's own code makes (redistributing a bias) is part
            # of the user's call around it, whose local op comes last
            if kind is None:
                self.dtensor_call = _call_site(frame)
                self.dtensor_numel = rec[5]

    def logical_ops(self, skipping_causal: bool = False) -> tuple:
        """``((overload, shapes, calls, flops, macs), ...)`` of the DTensor-level calls (at
        their global shapes) and of the plain-tensor ops run outside them (at their shapes,
        flops and MACs times their shard factor); flops and MACs 0 where they could not be
        priced. ``skipping_causal``: the deprecated ``attention="causal"`` (see
        ``records.Layout.units_skipping_causal``)."""
        flops_i, macs_i = PRICED.index("flops"), PRICED.index("macs")
        masked_i = PRICED.index("masked_flops"), PRICED.index("masked_macs")
        out: dict = {}
        for calls, signature, resolved, shapes, factor, _ in self.records.values():
            flops = macs = 0
            if signature is not None:
                try:
                    unit = signature.unit(resolved)
                    flops, macs = unit[flops_i] * calls, unit[macs_i] * calls
                    if skipping_causal and resolved.formula in CAUSAL_DIAGONAL_FORMULAS:
                        flops -= unit[masked_i[0]] * calls
                        macs -= unit[masked_i[1]] * calls
                except PricingError:
                    pass
            if factor is not None and factor != 1:
                flops, macs = round(flops * factor), round(macs * factor)
            key = (str(resolved.func), tuple(tuple(shape) for shape in shapes))
            total = out.get(key, (0, 0, 0))
            out[key] = (total[0] + calls, total[1] + flops, total[2] + macs)
        return tuple(k + v for k, v in out.items())

def _on_meta(func, resolved, args, kwargs) -> tuple:
    """``(Signature or None, elements of the first output)`` of ``func`` run on meta copies
    of ``args`` (an op meta tensors cannot run: its calls are still listed, unpriced)."""
    from dispatch_flops.engine.torch_private import tree_map_only
    try:
        with _disable_current_modes():  # not the user's: no mode below sees them
            meta_args, meta_kwargs = tree_map_only(
                Tensor, lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"),
                (args, kwargs))
            out = func(*meta_args, **meta_kwargs)
        outputs = _tensors(out)
        return work_out(resolved, meta_args, meta_kwargs, out), \
            outputs[0].numel() if outputs else 0
    except Exception:
        return None, 0


def outside_sharding_propagation(mode, func, types, args=(), kwargs=None):
    """``mode``'s ``__torch_dispatch__`` once it met a DTensor (see
    ``LogicalFigure.run_sharding_propagation_uncounted``): DTensor's sharding propagation
    and whatever runs under a fake tensor mode are run, not counted; the rest is counted and
    followed into the logical figure."""
    # the caller's frame; None when no Python frame made the call (an autograd device
    # thread running backward)
    caller = sys._getframe().f_back
    if torch._C._get_dispatch_mode(_FAKE) is not None or \
            _origin(caller)[1] is _PROPAGATION or \
            (mode.guarded and not mode.tracker.sees(sys._getframe())):
        # a guarded mode's block is suspended (``GuardedCountingMode``): run, not counted
        return func(*args, **kwargs) if kwargs else func(*args)
    return mode.dtensor.followed(func, types, args, kwargs, caller)


def _logical_key(values) -> tuple:
    """A hashable stand-in for a call's arguments (``values``): tensors by shape and dtype,
    lists and tuples (and kwargs' pairs) item by item, anything unhashable by its type."""
    out = []
    for v in values:
        if isinstance(v, Tensor):
            out.append((tuple(v.shape), v.dtype))
        elif v.__class__ is list or v.__class__ is tuple:
            out.append(_logical_key(v))
        else:
            try:
                hash(v)
            except TypeError:
                v = type(v)
            out.append(v)
    return tuple(out)


def _tensors(values) -> list:
    """The tensors among ``values``: a tensor, or a list, tuple or dict view of them (one
    level deep); none in anything else."""
    if isinstance(values, Tensor):
        return [values]
    if isinstance(values, (list, tuple, ValuesView)):
        return [v for v in values if isinstance(v, Tensor)]
    return []


# Where an op comes from: the first frame up the stack that is not one the call passes through
# (``OpOverload.__call__``; the functional collectives, an AsyncCollectiveTensor's dispatch; a
# DeviceMesh working out its coordinates, for whoever builds it: the fake mesh of DTensor's
# sharding propagation, DTensor's dispatch, the user),
# and whether it is DTensor's own code (to_local, redistribute, its Python dispatch path) or
# its sharding propagation (ops on fake or meta tensors at global shapes: never counted)
_DTENSOR, _PASSING, _PROPAGATION = "dtensor", "passing", "propagation"
_TENSOR_PACKAGE = os.path.join("torch", "distributed", "tensor", "")
_PLACES = ((_TENSOR_PACKAGE + "_decompositions.py", _PROPAGATION),
           (_TENSOR_PACKAGE + "_sharding_prop.py", _PROPAGATION),
           (_TENSOR_PACKAGE, _DTENSOR),
           (os.path.join("torch", "distributed", "device_mesh.py"), _PASSING),
           (os.path.join("torch", "distributed", "_mesh_layout.py"), _PASSING),
           (os.path.join("torch", "distributed", "_functional_collectives"), _PASSING),
           (os.path.join("torch", "_ops.py"), _PASSING))
_CODE_KINDS: dict = {}  # code object -> _DTENSOR, _PASSING, _PROPAGATION or None (the user's)


def _call_site(frame) -> tuple:
    """Where a call is made: the frame and instruction (none on a thread without Python
    frames), and the autograd node running (backward)."""
    if frame is None:
        return (None, -1, _current_node())
    return (frame, frame.f_lasti, _current_node())


def _origin(frame) -> tuple:
    """``(frame, kind)`` an op called from ``frame`` comes from (see ``_PLACES``);
    ``(None, None)`` past the stack's top."""
    while frame is not None:
        code = frame.f_code
        kind = _CODE_KINDS.get(code, 0)
        if kind == 0:
            if len(_CODE_KINDS) > 4096:
                _CODE_KINDS.clear()
            kind = _CODE_KINDS[code] = next(
                (k for place, k in _PLACES if place in code.co_filename), None)
        if kind is not _PASSING:
            return frame, kind
        frame = frame.f_back
    return None, None
