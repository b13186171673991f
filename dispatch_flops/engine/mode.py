"""The dispatch mode: runs each op, then hands it to a cheap per-op recorder.

The per-op path is the hot path. It keeps only ints (never a tensor), resolves each
OpOverload once, and leaves all aggregation to report time.
"""

from __future__ import annotations

import inspect
import os
import sys
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import ValuesView
from functools import partial
from types import FrameType
from typing import Any, Callable, NamedTuple, Optional

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from dispatch_flops.engine import flex as _flex
from dispatch_flops.engine.masks import tally_of
from dispatch_flops.engine.nested import (
    PerSequence,
    nested_shapes,
    per_sequence,
    tensor_values,
)
from dispatch_flops.engine.records import (
    CALLS,
    NS,
    SIGNATURE,
    PricingError,
    Signature,
    engine_cache,
)
from dispatch_flops.engine.skip import SKIP_FRAMES as _SKIP_FRAMES
from dispatch_flops.engine.torch_private import NestedTensor as _Jagged
from dispatch_flops.engine.torch_private import TorchDispatchMode
from dispatch_flops.engine.torch_private import current_autograd_node as _current_node
from dispatch_flops.engine.torch_private import disable_current_modes as _disable_current_modes
from dispatch_flops.engine.torch_private import (
    get_current_dispatch_mode_stack as _get_current_dispatch_mode_stack,
)
from dispatch_flops.engine.torch_private import pop_mode as _pop_mode
from dispatch_flops.engine.torch_private import push_mode as _push_mode
from dispatch_flops.engine.torch_private import top_saved_tensors_hooks as _top_saved_tensors_hooks
from dispatch_flops.engine.tracker import ACCUMULATE_GRAD_SEQ as _ACCUMULATE_GRAD_SEQ
from dispatch_flops.engine.tracker import RECOMPUTE_I, ModuleTracker, phase_of
from dispatch_flops.formulas import (
    ZERO_COST,
    Category,
    Cost,
    Movement,
    PackedWeight,
    Registry,
    SparseInfo,
)
from dispatch_flops.formulas.attention import CAUSAL_DIAGONAL_FORMULAS
from dispatch_flops.results.stats import PRICED

# the hot path builds records as literals, [0, 0, signature], and indexes them with literals
# (a global's load per op is measurable): in the order named here
assert (CALLS, NS, SIGNATURE) == (0, 1, 2)
_BACKWARD_I = phase_of(node=True, recompute=False, optimizer=False)
_REENTRANT_I = phase_of(node=True, recompute=True, optimizer=False)

# how torch.utils.checkpoint shows it is re-running forward inside backward: non-reentrant,
# under its recomputation saved-tensors hook; reentrant, inside its autograd Function's node
_RECOMPUTATION_HOOK = "_recomputation_hook.__init__.<locals>.pack_hook"
_REENTRANT = "CheckpointFunctionBackward"
# each autograd node class's backward phase (an index into PHASES): the reentrant node's is
# recompute. Asked once per class: a node's name() is a C++ call and a new string
_NODE_PHASE: dict = {}


def node_phase(node) -> int:
    if len(_NODE_PHASE) > 4096:  # autograd Function classes made on the fly: bounded
        _NODE_PHASE.clear()
    phase = _NODE_PHASE[node.__class__] = _REENTRANT_I if node.name() == _REENTRANT \
        else _BACKWARD_I
    return phase

# subclasses the mode lets run an op first (``_unwrapping``), and the dispatch key of the
# fake mode DTensor's sharding propagation runs under
_UNWRAPPED = frozenset(("DTensor", "AsyncCollectiveTensor"))
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_COMMUNICATION = Category.COMMUNICATION


def _unwrapping(types) -> Optional[str]:
    """The name of the subclass among ``types`` that the mode lets run an op first (it
    returns ``NotImplemented``), None when there is none. A DTensor runs the op as local ops
    on its shards and the collectives that redistribute them, which come back to the mode and
    are counted (what this rank executes); the DTensor-level call is kept apart, at its global
    shapes (``CountingMode._logical``). An AsyncCollectiveTensor unwraps into
    ``wait_tensor`` and the op."""
    for t in types:
        if t.__name__ in _UNWRAPPED and t.__module__.startswith("torch.distributed"):
            return t.__name__
    return None

# per-overload kinds, small ints for the hot path
VIEW, COPY, WRITE, FORMULA, UNKNOWN = range(5)
_MOVEMENT_KIND = {Movement.NONE: VIEW, Movement.COPY: COPY, Movement.WRITE: WRITE}


def real_bytes(t: Tensor) -> int:
    """Bytes a tensor really occupies: an expanded (stride-0) dim holds one element."""
    try:
        strides = t.stride()
    except RuntimeError:  # sparse / nested layouts have no strides
        return t.nbytes
    if 0 not in strides:  # transposed or sliced: every element is real
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


# In a signature, marks the strides of a tensor that is not contiguous (an expanded one reads
# fewer bytes than its shape says); private, so no argument can be mistaken for them.
_STRIDED = object()


def _tensor_key(t: Tensor) -> tuple:
    if t.is_contiguous():
        return (t.shape, t.dtype)
    if t.is_sparse:  # would key as a dense tensor of strides 0 (see __torch_dispatch__)
        raise _EXOTIC
    return (t.shape, t.dtype, _STRIDED, t.stride())


# A Python float in a signature is kept only where a formula can tell it apart: the values
# formulas test (0, 1, 2, -1, the infinities: "is alpha 1", "is p 2"); any other float is
# keyed as one, so the step sizes an optimizer or scheduler passes as floats make no new
# signature each step (the formula contract in formulas/_registry.py says so).
_TOLD_APART = frozenset((0.0, 1.0, 2.0, -1.0, float("inf"), float("-inf")))
_FLOAT = object()
_KWARGS = object()  # in a signature: the keyword arguments follow


def _key(v):
    """A hashable stand-in for one argument: a tensor becomes its shape and dtype (and its
    strides when not contiguous), a list or tuple a tuple of those, a float its class (see
    ``_TOLD_APART``). Never holds a tensor."""
    if isinstance(v, Tensor):
        return _tensor_key(v)
    if v.__class__ is list or v.__class__ is tuple:
        return tuple([_tensor_key(x) if isinstance(x, Tensor) else _scalar_key(x) for x in v])
    return _scalar_key(v)


def _scalar_key(v):
    return _FLOAT if v.__class__ is float and v not in _TOLD_APART else v


def _shape(v):
    """One argument as a formula sees it: tensors as shapes, lists as lists."""
    if isinstance(v, Tensor):
        return v.shape
    if v.__class__ is list or v.__class__ is tuple:
        return [x.shape if isinstance(x, Tensor) else x for x in v]
    if isinstance(v, torch.ScriptObject):  # a process group, a reduce op: plain data
        return _script_key(v)
    return v


def _dtype(v):
    if isinstance(v, Tensor):
        return v.dtype
    if v.__class__ is list or v.__class__ is tuple:
        return [x.dtype if isinstance(x, Tensor) else None for x in v]
    return None


# integer operands a contraction runs at its own peak for (``_int_mm``: int8 x int8 ->
# int32 on int8 tensor cores; quantized tensors' int8 kernels), filed under "int8"
_INT8_OPERANDS = {torch.int8: "int8", torch.qint8: "int8", torch.quint8: "int8"}


def compute_dtype(args) -> Optional[str]:
    """The name of the first floating-point tensor argument's dtype ("bfloat16",
    "float8_e4m3fn", "float4_e2m1fn_x2"), looking into lists of tensors; without one,
    "int8" when an argument is int8 (or a quantized int8 tensor); None otherwise. Once per
    signature, never per call."""
    int8 = None
    for a in _leaf_tensors(args):
        if a.dtype.is_floating_point:
            return str(a.dtype).replace("torch.", "")
        if int8 is None:
            int8 = _INT8_OPERANDS.get(a.dtype)
    return int8


def _leaf_tensors(args):
    """The tensors among ``args``, in order, looking into (nested) lists and tuples."""
    for a in args:
        if a.__class__ is list or a.__class__ is tuple:
            yield from _leaf_tensors(a)
        elif isinstance(a, Tensor):
            yield a


def formula_call(args, kwargs, out, resolved, layouts=None) -> tuple:
    """``(args, out_shape, kwargs)`` for the formula contract (see ``formulas._registry``),
    with the opt-in keywords the formula declares (``resolved.keywords``, rows of
    ``KEYWORDS``); ``layouts``: each argument's ``SparseInfo`` or None (None: every one
    dense, as on the hot path; see ``_exotic_call`` for the others)."""
    kw = {k: _shape(v) for k, v in kwargs.items()} if kwargs else {}
    for keyword in resolved.keywords:
        kw[keyword.name] = keyword.value(args, resolved, layouts)
    return [_shape(a) for a in args], _shape(out), kw


class Keyword(NamedTuple):
    """One opt-in keyword of the formula contract: a formula whose signature names ``name``
    is given ``value(args, resolved, layouts)`` (the call's arguments, the op's resolution,
    each argument's ``SparseInfo`` or None); ``signed``: the value joins the call's signature
    (the price depends on what the shapes do not say). Worked out once per signature, never
    per op."""

    name: str
    value: Callable[..., Any]
    signed: bool = False


# The formula contract's keywords, one row each (formulas._registry's docstring lists them):
# a new keyword is a row here and a bullet there.
KEYWORDS: tuple[Keyword, ...] = (
    Keyword("dtypes", lambda args, resolved, layouts: [_dtype(a) for a in args]),
    Keyword("layouts", lambda args, resolved, layouts: layouts or [None] * len(args)),
    Keyword("group_size", lambda args, resolved, layouts: group_size(args, resolved.group_arg)),
    Keyword("group_rank", lambda args, resolved, layouts: group_rank(args, resolved.group_arg)),
    Keyword("int_values", lambda args, resolved, layouts: [int_values(a) for a in args],
            signed=True),
)


# -- collectives: keyed and priced by the size of their process group and the rank in it -----
def _process_group(v):
    """The ProcessGroup a collective's argument names: the object itself, its TorchScript
    box (c10d ops), or its name (functional collectives)."""
    from torch.distributed import ProcessGroup
    if isinstance(v, str):
        from dispatch_flops.engine.torch_private import (
            resolve_process_group as _resolve_process_group,
        )

        # private API: its stub asks for torch's GroupName, a NewType of the str we have
        return _resolve_process_group(v)  # type: ignore[arg-type]
    if isinstance(v, torch.ScriptObject):
        return ProcessGroup.unbox(v)
    return v


def group_size(args, position) -> int:
    """The size of the process group a collective was called on (``position``: its
    argument's index); 1 when the op names none."""
    if position is None or position >= len(args):
        return 1
    return _process_group(args[position]).size()


def group_rank(args, position) -> int:
    """This process's rank in the process group a collective was called on (``position``:
    its argument's index); 0 when the op names none."""
    if position is None or position >= len(args):
        return 0
    return _process_group(args[position]).rank()


def _script_key(v):
    """A stable stand-in for a TorchScript object argument (a new Python box every call): a
    process group by its size and this process's rank in it (all a price depends on), a
    quantised op's packed weights as a ``PackedWeight``, anything else by its type."""
    name = v._type().name()
    if name == "ProcessGroup":
        group = _process_group(v)
        return (name, group.size(), group.rank())
    if name.endswith("PackedParamsBase"):
        return _packed_weight(name, v)
    return (name,)


def _packed_weight(name: str, v):
    """What a formula needs of packed weights: read once per signature, out of sight of
    every mode and below autograd (unpacking builds tensors through ops). The type's
    name when they cannot be read."""
    try:
        with torch._C._DisableTorchDispatch(), torch._C._AutoDispatchBelowAutograd():
            if name.startswith("Linear"):
                weight, bias = v.unpack()
                return PackedWeight(name, tuple(weight.shape), bias is not None)
            return PackedWeight(name, tuple(v.weight().shape), v.bias() is not None,
                                tuple(v.stride()), tuple(v.padding()), tuple(v.dilation()),
                                int(v.groups()), bool(v.transpose()))
    except Exception:  # a backend's packed type this reading does not know
        return (name,)


def _collective_signature(sig: list, resolved, args, out) -> list:
    """A collective's signature: its TorchScript arguments by ``_script_key`` and its group's
    size and this process's rank in it (a group name outlives a group); the output (a
    ``Work`` among it) left out."""
    sig = [_script_key(x) if isinstance(x, torch.ScriptObject) else x for x in sig]
    sig.append(group_size(args, resolved.group_arg))
    sig.append(group_rank(args, resolved.group_arg))
    return sig


def _output_signature(sig: list, resolved, args, out) -> list:
    sig.append(_key(out))
    return sig


# a 1-D integer tensor argument up to this long is read for a formula that takes
# ``int_values`` (cumulative sequence lengths): a batch's worth of ints, never activations
INT_VALUES_MAX = 65_536


def int_values(v) -> Optional[tuple]:
    """The values of ``v`` for a formula that takes ``int_values``: a tuple for a small 1-D
    integer tensor on the CPU, read once per tensor (``engine.nested``); None for any other
    argument, and for a tensor on an accelerator (reading it would make the host wait for
    the device at every call: the formula prices without it) or without data (fake, meta)."""
    if not isinstance(v, Tensor) or v.dtype not in (torch.int32, torch.int64) \
            or v.dim() != 1 or v.device.type != "cpu" or v.numel() > INT_VALUES_MAX:
        return None
    try:
        return tensor_values(v)
    except Exception:  # no data to read (a fake or meta tensor)
        return None


def _keyword_signature(sig: list, resolved, args, out) -> list:
    """A signature with the values of the signed keywords the formula takes (``int_values``),
    and the output."""
    for keyword in resolved.keywords:
        if keyword.signed:
            value = keyword.value(args, resolved, None)
            sig.append(tuple(value) if value.__class__ is list else value)
    sig.append(_key(out))
    return sig


def moved_bytes(resolved, args, kwargs, out) -> tuple[int, int]:
    """(bytes read, bytes written) of one call: tensor inputs read (``out=`` tensors are
    written, not read; fills read nothing), outputs written; an op that returns nothing
    writes what it mutates."""
    read = 0
    if resolved.kind != WRITE:
        read = _bytes(args)
        if kwargs:
            read += _bytes([v for k, v in kwargs.items() if k not in resolved.write_only])
    if isinstance(out, Tensor):
        written = out.nbytes if out.is_contiguous() else real_bytes(out)
    elif out.__class__ is list or out.__class__ is tuple:
        written = _bytes(out)
    elif out is None and resolved.mutated:
        written = _bytes([args[i] for i in resolved.mutated if i < len(args)])
    else:
        written = 0
    return read, written


def _work_out(resolved, args, kwargs, out) -> Signature:
    """The ``Signature`` of one call: the formula's arguments (None without a formula) and
    the bytes it reads and writes. ``_Exotic`` for a nested tensor among the arguments (its
    shape hashes, but no formula can price it)."""
    for a in args:
        if isinstance(a, Tensor) and a.is_nested:
            raise _EXOTIC
    call = formula_call(args, kwargs, out, resolved) if resolved.kind == FORMULA else None
    signature = Signature(call, *moved_bytes(resolved, args, kwargs, out),
                          resolved.dtype or compute_dtype(args))
    if resolved.decompose is not None:
        resolved.decompose(signature, args, kwargs)
    return signature


# -- the slow path: tensors the hot path cannot key ------------------------------------------
class _Exotic(Exception):
    """A call with a sparse, nested or symbolically sized tensor: see ``_exotic_call``."""


_EXOTIC = _Exotic()


class _Unpriced(Exception):
    """A call no formula can price: nested tensors, symbolic sizes without a size hint, a
    sparse argument to a formula that does not take ``layouts``."""


_SPARSE_LAYOUTS = {torch.sparse_coo: "sparse_coo", torch.sparse_csr: "sparse_csr",
                   torch.sparse_csc: "sparse_csc", torch.sparse_bsr: "sparse_bsr",
                   torch.sparse_bsc: "sparse_bsc"}


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _hint(v):
    """A size or scalar as a plain number: a symbolic one (fake tensors under a ShapeEnv,
    dynamic shapes at compile time) by its hint; ``_Unpriced`` for one without a hint
    (unbacked)."""
    if isinstance(v, _SYMBOLIC):
        node = v.node
        if not node.has_hint():
            raise _Unpriced
        return node.hint
    return v


def _sparse_parts(t: Tensor) -> tuple:
    """(values, index tensors) of a sparse tensor: what it really stores. Its accessors are
    ops: they run below autograd (a view of a leaf that requires grad is autograd's work:
    done inside dispatch it can block, and it is not the user's) and out of sight of every
    dispatch mode (a counter below this one would count them as the user's)."""
    with torch._C._DisableTorchDispatch(), torch._C._AutoDispatchBelowAutograd():
        if t.layout is torch.sparse_coo:
            return t._values(), (t._indices(),)
        if t.layout in (torch.sparse_csr, torch.sparse_bsr):
            return t.values(), (t.crow_indices(), t.col_indices())
        return t.values(), (t.ccol_indices(), t.row_indices())


def _described(t: Tensor) -> tuple:
    """``(key, shape, bytes, SparseInfo or None)`` of a tensor the hot path cannot key: a
    sparse one (keyed and priced by what it stores: values and indices) or one with symbolic
    sizes (by their hints). ``_Unpriced`` for a nested tensor."""
    if t.is_nested:
        raise _Unpriced
    shape = torch.Size([_hint(s) for s in t.shape])
    layout = _SPARSE_LAYOUTS.get(t.layout)
    if layout is None:
        strides = tuple(_hint(s) for s in t.stride())
        elements = 1
        for size, stride in zip(shape, strides):
            if stride or not size:
                elements *= size
        return (shape, t.dtype, strides), shape, elements * t.element_size(), None
    values, indices = _sparse_parts(t)
    stored = values.numel()
    nbytes = values.nbytes + sum(i.nbytes for i in indices)
    return (shape, t.dtype, layout, stored), shape, nbytes, SparseInfo(layout, stored)


def _nested_bytes(t: Tensor) -> int:
    """Bytes a nested tensor holds, read from its metadata alone: ``values()`` is an op (a
    mode below would see it) that autograd records, and inside dispatch, on a leaf that
    requires grad, it blocks forever. A jagged one holds its values, offsets and lengths
    (plain tensors it keeps as attributes); a strided one (C++) answers ``nbytes`` from its
    sizes."""
    if isinstance(t, _Jagged):
        parts = (t._values, t._offsets, t._lengths)
        return sum(_loose_bytes(p) for p in parts if p is not None)
    return t.nbytes


def _loose_bytes(v) -> int:
    """Bytes of what ``v`` really holds, as well as they can be told (0 where not)."""
    if isinstance(v, Tensor):
        try:
            return _nested_bytes(v) if v.is_nested else _described(v)[2]
        except (_Unpriced, RuntimeError, AttributeError, TypeError):
            return 0
    if v.__class__ is list or v.__class__ is tuple:
        return sum(_loose_bytes(x) for x in v)
    return 0


def _exotic_call(resolved, key: int, args, kwargs, out) -> tuple:
    """``(signature key, Signature)`` of a call with sparse or symbolically sized tensors:
    tensors described by ``_described`` (sparse ones pass a ``SparseInfo`` per argument to a
    formula that takes ``layouts``). ``_Unpriced`` when no formula can price it."""

    def part(v):  # (key, formula's view, bytes, sparse info)
        if isinstance(v, Tensor):
            if v.is_nested:
                shapes = nested_shapes(v)
                if shapes is None:
                    raise _Unpriced
                return shapes, shapes, _nested_bytes(v), None
            return _described(v)
        if v.__class__ is list or v.__class__ is tuple:
            parts = [part(x) for x in v]
            return (tuple(p[0] for p in parts), [p[1] for p in parts],
                    sum(p[2] for p in parts), None)
        if isinstance(v, torch.ScriptObject):  # as the formula sees it on the hot path
            described = _script_key(v)
            return described, described, 0, None
        v = _hint(v)
        return _scalar_key(v), v, 0, None

    a = [part(x) for x in args]
    kw = {k: part(v) for k, v in kwargs.items()} if kwargs else {}
    o = part(out)
    if resolved.kind == FORMULA and not resolved.with_layouts and (
            any(p[3] for p in a) or any(p[3] for p in kw.values()) or o[3]):
        raise _Unpriced  # its formula would price the dense shapes
    read = 0
    if resolved.kind != WRITE:
        read = sum(p[2] for p in a) + sum(p[2] for k, p in kw.items()
                                           if k not in resolved.write_only)
    written = o[2]
    if out is None and resolved.mutated:
        written = sum(a[i][2] for i in resolved.mutated if i < len(a))
    call = None
    if resolved.kind == FORMULA:
        formula_kw = {k: p[1] for k, p in kw.items()}
        sparse = [p[3] for p in a]
        for keyword in resolved.keywords:
            formula_kw[keyword.name] = keyword.value(args, resolved, sparse)
        call = ([p[1] for p in a], o[1], formula_kw)
        try:  # nested tensors: one formula call per sequence (see engine.nested)
            call = per_sequence(*call) or call
        except ValueError:
            raise _Unpriced from None
    sig = (key, _EXOTIC, tuple(p[0] for p in a), tuple((k, p[0]) for k, p in kw.items()), o[0])
    return sig, Signature(call, read, written, resolved.dtype or compute_dtype(args))


# The signatures every counter shares (per registry version) are the
# last SIGNATURES_KEPT a counter made a record of, the least recently used out first: a process
# that meets a new shape every step (sequence lengths that vary) keeps at most a few MB of them
# (1 to 1.5 KB each), not one per shape for ever. A transformer's training step makes 100 to
# 150; a record keeps the signature it was given: what a counter counted never depends on it.
SIGNATURES_KEPT = 1024


def _call_entry(shared: OrderedDict, sig: tuple, resolved, args, kwargs, out) -> Signature:
    """What ``_work_out`` gives for ``sig``, from ``shared`` (every counter's: models repeat
    shapes across layers and steps, so a signature is worked out, and priced, once) when it
    is there. Pure data (shapes, ints), never a tensor. Called when a record is made, never
    per op: a record, once made, holds its signature."""
    entry = shared.get(sig)
    if entry is None:
        entry = shared[sig] = _work_out(resolved, args, kwargs, out)
        if len(shared) > SIGNATURES_KEPT:
            try:
                shared.popitem(last=False)
            except KeyError:  # another thread's counter emptied it meanwhile
                pass
    else:
        try:
            shared.move_to_end(sig)
        except KeyError:  # another thread's counter let it go meanwhile
            pass
    return entry


class _Resolved:
    __slots__ = ("func", "run", "category", "kind", "view", "formula", "keywords",
                 "with_layouts", "write_only", "mutated", "out_in_signature", "decompose",
                 "signed", "group_arg", "tally", "dtype")

    def __init__(self, func, category, kind, formula, keywords, write_only,
                 out_in_signature):
        self.func = func
        # what runs the op: the overload's C++ entry when calling the overload would only
        # forward to it (``OpOverload.__call__`` is one Python frame around ``_op``)
        self.run = func._op if type(func) is torch._ops.OpOverload else func
        self.category = category  # the registry's verdict when resolved: what was counted
        self.kind = kind
        self.view = kind == VIEW
        self.formula = formula
        self.keywords = keywords  # the rows of KEYWORDS the formula declares
        # the formula declares ``layouts``: it prices calls with sparse arguments
        self.with_layouts = any(keyword.name == "layouts" for keyword in keywords)
        self.write_only = write_only
        # positions of the arguments an op that returns nothing writes (``_foreach_add_``,
        # ``_fused_adamw_``): what it writes is what it mutates
        self.mutated = tuple(
            i for i, a in enumerate(func._schema.arguments)
            if not a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        ) if not func._schema.returns else ()
        # the output's shape is not a function of the inputs' (nonzero, masked_select), or
        # the op is the user's and we cannot know: then it is part of the signature. A
        # collective takes this path too, to key its process group (``signed``)
        self.group_arg = next((i for i, a in enumerate(func._schema.arguments)
                               if a.name in ("process_group", "group_name")), None)
        communicates = category is Category.COMMUNICATION
        self.out_in_signature = out_in_signature or communicates
        self.signed = _collective_signature if communicates else _output_signature
        # for a composite op (seen whole under inference_mode): prices a call by counting
        # its decomposition (``CountingMode._decomposed``); None for every other op
        self.decompose = None
        # counts the masked (query, key) pairs of an attention op's mask tensor into the
        # call's record (``engine.masks``); None for every op that takes no mask
        self.tally = tally_of(func)
        self.dtype: Optional[str] = None  # the registry's, where it names the compute dtype

    def unpriced(self) -> "_Resolved":
        """The same op, for calls no formula can price: unsupported (bytes counted)."""
        return _Resolved(self.func, Category.UNSUPPORTED, UNKNOWN, None, (),
                         self.write_only, self.out_in_signature)

    def price(self, call) -> Cost:
        """The formula's ``Cost`` of one call (``call``: ``(args, out_shape, kwargs)`` as the
        formula contract has them, see ``formula_call``); zero for an op without a formula
        (no arithmetic, or unsupported: see its category)."""
        if call is None:
            return ZERO_COST
        if call.__class__ is PerSequence:  # a nested call: the sum over its sequences
            costs = [(count, self.formula(*args, out_shape=out_shape, **kwargs))
                     for count, (args, out_shape, kwargs) in call]

            def total(field: str):  # None (the engine's bytes) if any sequence says None
                values = [(count, getattr(cost, field)) for count, cost in costs]
                if any(value is None for _, value in values):
                    return None
                return sum(count * value for count, value in values)
            return Cost(total("flops"), total("macs"), total("bytes_read"),
                        total("bytes_written"), total("comm_bytes"))
        args, out_shape, kwargs = call
        return self.formula(*args, out_shape=out_shape, **kwargs)




class CountingMode(TorchDispatchMode):
    """Counts every op into the accumulators of the tracker's frames: ``frame.acc[phase]
    [id(overload) or signature]`` is an op record (see ``_records``). ``tracker`` keeps
    ``forward_acc`` pointed at the running frame's accumulator for ops with no autograd node
    (forward, optimizer, recompute); see ``_tracker.phase_of``.

    Dicts on the hot path are keyed by ``id(func)``: ``OpOverload.__hash__`` is a Python-level
    call, and overloads are long-lived singletons (``resolved[id].func`` keeps each alive)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps each mode's __torch_dispatch__ in torch._disable_dynamo, so that
        # torch.compile never traces it: two Python frames and four eval-frame switches on every
        # op, as much as a fifth of what a do-nothing mode costs. Where this torch can, the same
        # guarantee is given once instead, to the code object (below the class).
        return _SKIP_FRAMES is None

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile compiles under this mode (every mode is off while it compiles) and
        # runs the compiled code under it, instead of skipping the frame and caching the skip
        # (pytorch#190286); compiled graphs count through _compiled.Graph
        return True

    def __init__(self, registry: Registry, runner=None):
        super().__init__()
        # runs each op when not None: a _timing.Timer (timing on) or a _meta.MetaRunner; its
        # add(record, NS, token) counts the call
        self.runner = runner
        self.registry = registry
        # resolutions and worked-out signatures, shared by every counter on the same registry
        # version (the engine's cache: a registration starts a new one)
        cache = engine_cache(registry)
        self.resolved = cache.resolutions
        self._shared = cache.signatures
        self._shared_logical = cache.logical
        self.forward_acc: dict = {}
        self.recomputing = False
        self.stepping = False  # the tracker's innermost optimizer step counts (see _recheck)
        # frames seen running inside that step (see _recheck)
        self._in_step: tuple[FrameType, ...] = ()
        self.tracker: Optional[ModuleTracker] = None  # see bind; None again once it closes
        # the DTensor-level ops this mode let DTensor unwrap (``_unwrapping``): their global
        # (logical) figure, and the plain-tensor ops run outside them, each at its shard
        # factor: {key: [calls, Signature or None, resolution, shapes, factor]}
        self.logical: dict = {}
        # point-to-point transfers a workflow has told apart before they run (pipeline
        # stages: ``workflows.pipeline``): {id(tensor): (tensor, accumulator)}, each sent or
        # received tensor's transfer counted into that accumulator (the stage's forward or
        # backward) instead of the running frame's; and the actions it noted, as run facts
        self.p2p_tags: dict = {}
        self.pipeline: list = []
        # what tells a DTensor's own local work from the plain-tensor ops around it (see
        # ``_local``): the (caller frame, instruction, autograd node) of the last DTensor-level
        # call, its global output's elements, and the shard factor of the tensors made so far
        self._dtensor_call: tuple = ()
        self._dtensor_numel = 0
        self._caller: Optional[FrameType] = None
        self._shards = WeakIdKeyDictionary()

    def _tagged(self, args, acc: dict) -> dict:
        """The accumulator a tagged tensor among a communication op's arguments names (its
        tag used up: a tensor is sent or received once), else ``acc``."""
        tags = self.p2p_tags
        for a in args:
            for t in (a if a.__class__ is list or a.__class__ is tuple else (a,)):
                if isinstance(t, Tensor):
                    tag = tags.pop(id(t), None)
                    if tag is not None and tag[0] is t:
                        return tag[1]
        return acc

    def bind(self, tracker: ModuleTracker) -> None:
        """Take backward frames from ``tracker``, which also keeps ``forward_acc`` current."""
        self.tracker = tracker
        self._boundary_seqs = tracker.boundary_seqs  # the tracker appends; we only bisect
        self._boundary_frames = tracker.boundary_frames
        # (node, accumulator, sequence number) of the last autograd node seen
        self._last: tuple = (None, None, -1)
        self._book = tracker.ledger.records  # every record made goes here too (see Ledger)

    def watch_steps(self, on: bool) -> None:
        """Whether the tracker's innermost optimizer step counts now: while it does, each op
        with no autograd node first checks that the step still runs (``_recheck``)."""
        self.stepping = on
        self._in_step = ()

    def _recheck(self, caller) -> None:
        """An op with no autograd node (``caller``: its Python caller) while the tracker is in
        a state that may have ended without the hook that ends it: a recomputation (it runs
        only inside backward: a BaseException ended it, and torch runs no always-call hook for
        those) or an optimizer step (one that raised ran no post-hook). Asked only then: the
        ops of other phases keep the plain path."""
        tracker = self.tracker
        if tracker is None:
            self.recomputing = self.stepping = False
            return
        if self.recomputing:
            tracker.end_recompute()
        if not self.stepping:
            return
        # The frames between an op and its step, seen once, stay inside the step while they
        # run (a function's callers are fixed); an optimizer runs its ops from a few of them,
        # so an op's caller, or one a frame or two above it, is known. Inside the step one
        # always is (the step's own frame): none means the step is over.
        frame, known = caller, self._in_step
        if known:
            while frame is not None and frame not in known:
                frame = frame.f_back
        if frame is None or not known:
            self._in_step = tracker.check_steps(caller)

    guarded = False  # counts only while its block's frame runs (GuardedCountingMode)

    def current_acc(self) -> Optional[dict]:
        """The accumulator an op run now counts into, as the hot path finds it (inlined
        there): for calls that reach the mode outside ``__torch_dispatch__`` (the flex
        operators, ``engine.flex``). None when the mode is not bound to a tracker."""
        if self.tracker is None:
            return None
        node = _current_node()
        if node is None or self.recomputing:
            return self.forward_acc
        seq = node._sequence_nr()
        if seq == _ACCUMULATE_GRAD_SEQ:
            return self.tracker.frame_of_accumulation(node).acc[_BACKWARD_I]
        frame = self._boundary_frames[bisect_right(self._boundary_seqs, seq) - 1]
        phase = _NODE_PHASE.get(node.__class__)
        acc = frame.acc[phase if phase is not None else node_phase(node)]
        hooks = _top_saved_tensors_hooks(False)
        if hooks is not None and hooks[0].__qualname__ == _RECOMPUTATION_HOOK:
            acc = self._recompute_acc(hooks[0], seq)
        return acc

    def book(self, rec: list) -> None:
        """Keep a record made outside the hot path in the ledger's book (see ``bind``)."""
        self._book.append(rec)

    def _recompute_acc(self, hook, seq: int) -> dict:
        """Where an op that non-reentrant checkpointing re-runs outside any module call goes:
        the recompute phase of the frame holding the modules this recomputation (``hook``)
        re-ran (the checkpointed function's module), or, before any, of the unpacking node's
        frame."""
        tracker = self.tracker
        assert tracker is not None  # a mode counts only while bound to its tracker
        home_hook, home = tracker.recompute_home
        if home_hook is not hook:
            home = self._boundary_frames[bisect_right(self._boundary_seqs, seq) - 1]
        return home.acc[RECOMPUTE_I]

    def _resolve(self, func) -> _Resolved:
        entry = self.registry.lookup(func)
        formula = entry.formula
        keywords: tuple[Keyword, ...] = ()
        if formula is not None:  # a formula, an estimate, or a no-arithmetic op's bytes
            kind = FORMULA
            parameters = inspect.signature(formula).parameters
            keywords = tuple(keyword for keyword in KEYWORDS if keyword.name in parameters)
        elif entry.category is Category.NO_ARITHMETIC:
            kind = _MOVEMENT_KIND[entry.movement]
        else:
            kind = UNKNOWN
        write_only = frozenset(
            a.name
            for a in func._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        )
        out_in_signature = (
            torch.Tag.dynamic_output_shape in func.tags or func.namespace != "aten"
        )
        resolved = _Resolved(func, entry.category, kind, formula, keywords, write_only,
                             out_in_signature)
        resolved.dtype = entry.dtype
        if any(keyword.signed for keyword in keywords):
            # their values join the signature (a call's price depends on them)
            resolved.out_in_signature = True
            resolved.signed = _keyword_signature
        if _decomposable(func, entry):
            resolved.category, resolved.kind = Category.EXACT, FORMULA
            resolved.decompose = partial(self._decomposed, func)
        self.resolved[id(func)] = resolved
        return resolved

    def _decomposed(self, func, signature: Signature, args, kwargs) -> None:
        """Price ``signature`` (a call of composite op ``func`` with ``args``) by what its
        decomposition counts: the composite's kernel run on fake copies of the tensors (same
        shapes, dtypes and device, no data), under a counting mode of its own, as no_grad would
        run it. Its bytes stay the composite's
        own (inputs read, outputs written: what a fused kernel would move). A decomposition
        that fails leaves the call priced by the op's formula, or unsupported."""
        from dispatch_flops.engine.torch_private import FakeTensorMode

        fake = FakeTensorMode(allow_non_fake_inputs=True)
        fake.cache_enabled = False  # torch's cache is process-wide: an entry per shape, kept

        def to_fake(v):
            if isinstance(v, Tensor):
                return fake.from_tensor(v)
            return [to_fake(x) for x in v] if v.__class__ in (list, tuple) else v

        inner = CountingMode(self.registry)
        inner.forward_acc, inner._book, inner.recomputing = {}, [], False
        try:
            # every other mode off: this pricing run's ops are not the user's (a counter below
            # this one would count them)
            with _disable_current_modes():
                fake_args = [to_fake(a) for a in args]
                fake_kwargs = {k: to_fake(v) for k, v in (kwargs or {}).items()}
                with torch.no_grad(), fake, inner:  # fake tensors keep the device: same kernels
                    # the C++ composite kernel, as eager runs it (``decompose`` would prefer a
                    # Python decomposition registered for tracing, which may differ)
                    func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *fake_args,
                                **fake_kwargs)
            totals = dict.fromkeys(("flops", "macs", "masked_flops", "masked_macs"), 0)
            for key, rec in inner.forward_acc.items():
                if rec[SIGNATURE] is not None:
                    op = key if key.__class__ is int else key[0]
                    unit = dict(zip(PRICED, rec[SIGNATURE].unit(inner.resolved[op])))
                    for name in totals:
                        totals[name] += rec[CALLS] * unit[name]
        except Exception:  # data-dependent, or a kernel meta cannot run: the formula prices
            return
        # the masked share too (an is_causal SDPA's): model flops as the kernel's own call has
        signature.set_cost(**totals)

    def _exotic_record(self, key: int, resolved: _Resolved, acc: dict, args, kwargs, out):
        """The record of a call the hot path cannot key (see ``_exotic_call``); a call no
        formula can price goes to the op's unsupported twin (keyed ``-key``), its bytes
        counted as well as they can be."""
        try:
            sig, signature = _exotic_call(resolved, key, args, kwargs, out)
        except _Unpriced:
            if -key not in self.resolved:
                self.resolved[-key] = resolved.unpriced()
            read = _loose_bytes(list(args) + list((kwargs or {}).values()))
            written = _loose_bytes(out)
            sig, signature = (-key, _EXOTIC, read, written), Signature(None, read, written)
        rec = acc.get(sig)
        if rec is None:
            rec = acc[sig] = [0, 0, signature]
            self._book.append(rec)
        return rec

    # -- tensor subclasses that unwrap to local work (the slow path) --------------------------
    def _run_sharding_propagation_uncounted(self) -> None:
        """From now on, run without counting the ops that run under a fake tensor mode or
        that DTensor's sharding propagation makes (``_outside_sharding_propagation``). Called
        whenever the mode lets a DTensor run an op (after the first, it sets what is set):
        DTensor works out the global shapes of its ops on fake tensors under this mode, and,
        for an op with no sharding rule of its own (the CPU flash attention, hardswish),
        traces the op's decomposition on meta tensors once per candidate placement
        (``torch.distributed.tensor._decompositions``, thousands of ops for one attention):
        those ops are its bookkeeping, not work this rank executes."""
        # An instance attribute shadows the class's __torch_dispatch__ (torch looks it up on
        # the mode object): only a mode that has met a DTensor pays for the fake-mode check
        # on every op; every other mode keeps the plain hot path.
        self.__dict__["__torch_dispatch__"] = self._outside_sharding_propagation

    def _outside_sharding_propagation(self, func, types, args=(), kwargs=None):
        # the caller's frame; None when no Python frame made the call (an autograd device
        # thread running backward)
        caller = sys._getframe().f_back
        if torch._C._get_dispatch_mode(_FAKE) is not None or \
                _origin(caller)[1] is _PROPAGATION:
            return func(*args, **kwargs) if kwargs else func(*args)
        return self._followed(func, types, args, kwargs, caller)

    def _followed(self, func, types, args, kwargs, caller):
        """Count the call (``caller``: the frame that made it), then follow it into the
        logical figure (``_local``)."""
        self._caller = caller
        out = type(self).__torch_dispatch__(self, func, types, args, kwargs)
        if out is not NotImplemented:
            self._local(func, args, kwargs, out, caller)
        return out

    def follow_local_tensors(self, model) -> None:
        """Follow plain-tensor ops into the logical figure from the first op on, when
        ``model`` holds DTensor parameters (tensor parallelism, FSDP2): otherwise from the
        first DTensor met (``_run_sharding_propagation_uncounted``)."""
        tensor = sys.modules.get("torch.distributed.tensor")
        if tensor is not None and model is not None and any(
                isinstance(p, tensor.DTensor) for p in model.parameters()):
            self._run_sharding_propagation_uncounted()

    def _local(self, func, args, kwargs, out, caller) -> None:
        """A plain-tensor op, once a DTensor was met. Run by DTensor as its own local work
        (from the call site and autograd node of the DTensor-level call it serves, or from
        DTensor's Python code): its outputs take the shard factor of that call's output
        (global elements / local ones), and the logical figure has the call already.
        Otherwise it is the user's (attention on the local heads tensor parallelism's
        ``use_local_output`` hands over, a loss): counted in the logical figure at its
        inputs' largest shard factor (one for a replica), which its outputs take. A
        collective keeps the global elements (an all-gather's output is whole)."""
        shards = self._shards
        resolved = self.resolved.get(id(func)) or self._resolve(func)
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
        if kind is _DTENSOR or _call_site(frame) == self._dtensor_call:
            whole = self._dtensor_numel
            inherited = shards.get(args[0]) if resolved.view and args and \
                isinstance(args[0], Tensor) else None
            for t in _tensors(out):
                local = inherited or (whole / t.numel() if whole and t.numel() else 1)
                if local > 1:
                    shards[t] = local
                elif t in shards:
                    del shards[t]
            return
        self._logical(func, args, kwargs, factor)
        if factor > 1:
            for t in _tensors(out):
                shards[t] = factor

    def _logical(self, func, args, kwargs, factor=None) -> None:
        """Count a DTensor-level call at its global shapes (``factor`` None), or a
        plain-tensor op at its shapes times ``factor``: worked out once per distinct call
        (shapes, dtypes and other arguments) in the process, on meta tensors, and priced when
        read (``logical_ops``)."""
        from dispatch_flops.engine.torch_private import tree_map_only
        kwargs = kwargs or {}
        call = (id(func), _logical_key(args), _logical_key(kwargs.items()) if kwargs else ())
        key = (factor,) + call
        rec = self.logical.get(key)
        if rec is None:
            resolved = self.resolved.get(id(func)) or self._resolve(func)
            shared = self._shared_logical
            worked = shared.get(call)  # every counter's: worked out once per process
            if worked is None:
                signature = None
                numel = 0
                try:
                    with _disable_current_modes():  # not the user's: no mode below sees them
                        meta_args, meta_kwargs = tree_map_only(
                            Tensor,
                            lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"),
                            (args, kwargs))
                        out = func(*meta_args, **meta_kwargs)
                    signature = _work_out(resolved, meta_args, meta_kwargs, out)
                    outputs = _tensors(out)
                    numel = outputs[0].numel() if outputs else 0
                except Exception:  # an op meta tensors cannot run: its calls are still listed
                    pass
                worked = shared[call] = (signature, numel)
                if len(shared) > SIGNATURES_KEPT:
                    try:
                        shared.popitem(last=False)
                    except KeyError:  # another thread's counter emptied it meanwhile
                        pass
            shapes = tuple(t.shape for t in _tensors(args) + (
                _tensors(kwargs.values()) if kwargs else []))
            rec = self.logical[key] = [0, worked[0], resolved, shapes, factor, worked[1]]
        rec[0] += 1
        if factor is None:  # the local work DTensor runs next is this call's
            caller = self._caller if "__torch_dispatch__" in self.__dict__ \
                else sys._getframe().f_back.f_back  # type: ignore[union-attr]
            frame, kind = _origin(caller)
            # a DTensor-level call DTensor's own code makes (redistributing a bias) is part
            # of the user's call around it, whose local op comes last
            if kind is None:
                self._dtensor_call = _call_site(frame)
                self._dtensor_numel = rec[5]

    def logical_ops(self, skipping_causal: bool = False) -> tuple:
        """``((overload, shapes, calls, flops, macs), ...)`` of the DTensor-level calls (at
        their global shapes) and of the plain-tensor ops run outside them (at their shapes,
        flops and MACs times their shard factor); flops and MACs 0 where they could not be
        priced. ``skipping_causal``: the deprecated ``attention="causal"`` (see
        ``records.Layout.units_skipping_causal``)."""
        flops_i, macs_i = PRICED.index("flops"), PRICED.index("macs")
        masked_i = PRICED.index("masked_flops"), PRICED.index("masked_macs")
        out: dict = {}
        for calls, signature, resolved, shapes, factor, _ in self.logical.values():
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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # The hot path: runs for every aten op. Keep it flat (no helper calls in the common
        # case) and keep only ints. Records are [calls, ns, signature] (see _records): calls
        # and times counted here, flops and bytes by the signature when it is read.
        if types:  # plain tensors: types == ()
            unwrapping = _unwrapping(types)
            if unwrapping is not None:  # it runs the op first: the mode says NotImplemented
                if unwrapping == "DTensor":
                    self._logical(func, args, kwargs)
                    self._run_sharding_propagation_uncounted()
                return NotImplemented
        key = id(func)
        resolved = self.resolved.get(key)
        if resolved is None:
            resolved = self._resolve(func)
        runner = self.runner
        if runner is None:
            out = resolved.run(*args, **kwargs) if kwargs else resolved.run(*args)
        else:
            out, elapsed = runner.run(resolved, args, kwargs)
        node = _current_node()
        if node is None:
            if self.recomputing or self.stepping:  # see _recheck
                caller = sys._getframe(1)
                if self.recomputing or caller not in self._in_step:
                    self._recheck(caller)
            acc = self.forward_acc
            if self.p2p_tags and resolved.category is _COMMUNICATION:  # see p2p_tags
                acc = self._tagged(args, acc)
        elif self.recomputing:  # the tracker points forward_acc at the recomputation
            acc = self.forward_acc
        else:
            last = self._last  # one read: device threads never see half an update
            if node is last[0]:  # a node runs several ops in a row (the same object while
                acc, seq = last[1], last[2]  # it lives: _last keeps it alive)
            else:
                # the frame entered last before the node was created; AccumulateGrad nodes
                # all carry the same sequence number and go to their parameter's module
                seq = node._sequence_nr()
                if seq == _ACCUMULATE_GRAD_SEQ:
                    tracker = self.tracker
                    assert tracker is not None  # a mode counts only while bound to one
                    acc = tracker.frame_of_accumulation(node).acc[_BACKWARD_I]
                else:
                    frame = self._boundary_frames[bisect_right(self._boundary_seqs, seq) - 1]
                    # reentrant checkpointing re-runs forward inside its own node's backward:
                    # the node's ops are recompute, in the frame where checkpoint was called
                    phase = _NODE_PHASE.get(node.__class__)
                    acc = frame.acc[phase if phase is not None else node_phase(node)]
                self._last = (node, acc, seq)
            if seq != _ACCUMULATE_GRAD_SEQ:  # AccumulateGrad saves nothing: never re-runs
                hooks = _top_saved_tensors_hooks(False)
                if hooks is not None and hooks[0].__qualname__ == _RECOMPUTATION_HOOK:
                    acc = self._recompute_acc(hooks[0], seq)
        if resolved.view:  # no arithmetic, no bytes: count the call
            rec = acc.get(key)
            if rec is None:
                rec = acc[key] = [0, 0, None]
                self._book.append(rec)
        else:
            # An op's flops and bytes are functions of its signature: the op and its arguments
            # as shapes and dtypes, plus strides where the tensor is not contiguous (an
            # expanded one reads fewer bytes than its shape says). Count calls per signature
            # here; each distinct one is worked out once (``_call_entry``) and priced when
            # results are read. Sparse, nested and symbolically sized tensors take the slow
            # path (sparse COO is the one that would key like a dense tensor: checked here;
            # the others raise on the way).
            try:
                # a jagged tensor answers shape and is_contiguous() through dispatch, where a
                # mode below would see them: straight to the slow path, which reads metadata
                if types and _Jagged in types:
                    raise _EXOTIC
                sig: list = [key]
                for a in args:
                    if isinstance(a, Tensor):
                        sig.append(a.shape)
                        sig.append(a.dtype)
                        if not a.is_contiguous():  # a sparse COO tensor never is
                            if a.is_sparse:
                                raise _EXOTIC
                            sig.append(_STRIDED)
                            sig.append(a.stride())
                    elif a.__class__ is list or a.__class__ is tuple:
                        # an int[] (sizes, dims; an aten list holds one type) as it is: a
                        # sixth of the signature's time went into keying them one by one
                        sig.append(tuple(a) if not a or a[0].__class__ is int else _key(a))
                    elif a.__class__ is float and a not in _TOLD_APART:
                        sig.append(_FLOAT)
                    else:
                        sig.append(a)
                if kwargs:  # after a marker no argument can be: names and keys in a row
                    sig.append(_KWARGS)
                    for k, v in kwargs.items():
                        sig.append(k)
                        if v.__class__ is float:  # the optimizers' alpha=, value=
                            sig.append(v if v in _TOLD_APART else _FLOAT)
                        elif v.__class__ is list or v.__class__ is tuple or \
                                isinstance(v, Tensor):
                            sig.append(_key(v))
                        else:  # dtype=, device=, layout=, memory_format=: as _key keys them
                            sig.append(v)
                if resolved.out_in_signature:  # see _Resolved.signed
                    sig = resolved.signed(sig, resolved, args, out)
                elif isinstance(out, Tensor):  # a scalar's type or the default dtype sets it
                    sig.append(out.dtype)
                signature = tuple(sig)
                rec = acc.get(signature)
                if rec is None:  # the record keeps its signature, worked out once
                    rec = acc[signature] = [0, 0, _call_entry(self._shared, signature,
                                                              resolved, args, kwargs, out)]
                    self._book.append(rec)
            except (_Exotic, RuntimeError, TypeError):
                rec = self._exotic_record(key, resolved, acc, args, kwargs, out)
        if resolved.tally is not None:  # a mask's values: see engine.masks
            resolved.tally(rec, args, kwargs, out)
        if runner is None:
            rec[0] += 1  # CALLS
        else:  # the runner counts the call and its time (NS), under a lock where it needs one
            runner.add(rec, 1, elapsed)
        return out


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


def _decomposable(func, entry) -> bool:
    """Whether ``func`` is a composite (CompositeImplicitAutograd: it reaches the mode whole
    only under inference_mode) priced by counting its decomposition: one with a built-in
    formula, an estimate, or none (a formula of the user's is kept; a no-arithmetic op stays
    one)."""
    if entry.category is Category.NO_ARITHMETIC or func.namespace != "aten":
        return False
    if entry.category is Category.EXACT and not getattr(
            entry.formula, "__module__", "").startswith("dispatch_flops.formulas"):
        return False
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                              "CompositeImplicitAutograd")
    except RuntimeError:  # an overload with no C++ registration (a Python-only twin)
        return False


class GuardedCountingMode(CountingMode):
    """A counting mode whose block a generator or coroutine owns (``tracker.block_frame``):
    while that frame is suspended, other code on its thread (the loop's other tasks, the
    generator's consumer) runs under this mode too; those ops are run, not counted (see
    ``ModuleTracker.sees``)."""

    guarded = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tracker = self.tracker
        assert tracker is not None  # a mode counts only while bound to its tracker
        if not tracker.sees(sys._getframe()):
            return func(*args, **kwargs) if kwargs else func(*args)
        return CountingMode.__torch_dispatch__(self, func, types, args, kwargs)

    def _outside_sharding_propagation(self, func, types, args=(), kwargs=None):
        tracker = self.tracker
        assert tracker is not None  # a mode counts only while bound to its tracker
        caller = sys._getframe().f_back
        if torch._C._get_dispatch_mode(_FAKE) is not None or \
                _origin(caller)[1] is _PROPAGATION or not tracker.sees(sys._getframe()):
            return func(*args, **kwargs) if kwargs else func(*args)
        return self._followed(func, types, args, kwargs, caller)


def exit_mode(mode: TorchDispatchMode, exc_type=None, exc=None, tb=None) -> None:
    """Take ``mode`` off the dispatch mode stack wherever it is. Counters exited out of order
    (``a.__enter__(); b.__enter__(); a.__exit__()``) would otherwise pop ``b``'s mode and
    leave ``a``'s counting: the modes above it are taken off and put back, and the lowest of
    them inherits the dispatch flags ``mode`` saved on entry (torch restores them in LIFO
    order)."""
    stack = _get_current_dispatch_mode_stack()
    if stack and stack[-1] is mode:
        mode.__exit__(exc_type, exc, tb)
        return
    if not any(m is mode for m in stack):
        return
    above = []
    while True:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    lowest = above[-1]
    for flags in ("old_dispatch_mode_flags", "old_non_infra_dispatch_mode_flags",
                  "old_without_ignore_compile_internals_dispatch_mode_flags"):
        mine, theirs = getattr(mode, flags, None), getattr(lowest, flags, None)
        if mine and theirs:
            theirs[-1] = mine.pop()
    for m in reversed(above):
        _push_mode(m)


# FlexAttention's operators reach the modes as themselves: counted whole (engine.flex)
_flex.install(CountingMode, GuardedCountingMode)

if _SKIP_FRAMES is not None:
    _SKIP_FRAMES(CountingMode.__torch_dispatch__.__code__)
    _SKIP_FRAMES(GuardedCountingMode.__torch_dispatch__.__code__)
