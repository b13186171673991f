"""How one call's arguments are keyed, shown to its formula, and weighed in bytes.

The hot path (``CountingMode.__torch_dispatch__``) inlines the common case of ``key_of``; a record's
``Signature`` is worked out here once (``work_out``). A tensor the hot path cannot key (sparse,
nested, symbolically sized) raises ``EXOTIC``: the slow path (``engine.counting.exotic``) takes the
call.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, NamedTuple, Optional

import torch
from torch import Tensor

from dispatch_flops.engine.counting.nested import PerSequence, tensor_values
from dispatch_flops.engine.counting.records import Signature
from dispatch_flops.engine.masks.op_tallies import shadow_tally_of, tally_of
from dispatch_flops.formulas import ZERO_COST, Category, Cost, Movement, PackedWeight

# per-overload kinds, small ints for the hot path
VIEW, COPY, WRITE, FORMULA, UNKNOWN = range(5)
# per-overload kinds by the registry's movement verdict
MOVEMENT_KIND = {Movement.NONE: VIEW, Movement.COPY: COPY, Movement.WRITE: WRITE}


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
STRIDED = object()


def _tensor_key(t: Tensor) -> tuple:
    if t.is_contiguous():
        return (t.shape, t.dtype)
    if t.is_sparse:  # would key as a dense tensor of strides 0 (see __torch_dispatch__)
        raise EXOTIC
    return (t.shape, t.dtype, STRIDED, t.stride())


# A Python float in a signature is kept only where a formula can tell it apart: the values
# formulas test (0, 1, 2, -1, the infinities: "is alpha 1", "is p 2"); any other float is
# keyed as one, so the step sizes an optimizer or scheduler passes as floats make no new
# signature each step (the formula contract in formulas/_registry.py says so).
TOLD_APART = frozenset((0.0, 1.0, 2.0, -1.0, float("inf"), float("-inf")))
FLOAT = object()
KWARGS = object()  # in a signature: the keyword arguments follow


def key_of(v):
    """A hashable stand-in for one argument: a tensor becomes its shape and dtype (and its
    strides when not contiguous), a list or tuple a tuple of those, a float its class (see
    ``TOLD_APART``). Never holds a tensor."""
    if isinstance(v, Tensor):
        return _tensor_key(v)
    if v.__class__ is list or v.__class__ is tuple:
        return tuple([_tensor_key(x) if isinstance(x, Tensor) else scalar_key(x) for x in v])
    return scalar_key(v)


def scalar_key(v):
    return FLOAT if v.__class__ is float and v not in TOLD_APART else v


def _shape(v):
    """One argument as a formula sees it: tensors as shapes, lists as lists."""
    if isinstance(v, Tensor):
        return v.shape
    if v.__class__ is list or v.__class__ is tuple:
        return [x.shape if isinstance(x, Tensor) else x for x in v]
    if isinstance(v, torch.ScriptObject):  # a process group, a reduce op: plain data
        return script_key(v)
    return v


def dtype_of(v):
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
    dense, as on the hot path; see ``exotic`` for the others)."""
    kw = {k: _shape(v) for k, v in kwargs.items()} if kwargs else {}
    for keyword in resolved.keywords:
        kw[keyword.name] = keyword.value(args, resolved, layouts)
    return [_shape(a) for a in args], _shape(out), kw


# The signatures every counter shares (per registry version and attention option) are the
# last SIGNATURES_KEPT a counter made a record of, the least recently used out first: a process
# that meets a new shape every step (sequence lengths that vary) keeps at most a few MB of them
# (1 to 1.5 KB each), not one per shape for ever. A transformer's training step makes 100 to
# 150; a record keeps the signature it was given: what a counter counted never depends on it.
SIGNATURES_KEPT = 1024


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


def script_key(v):
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


def collective_signature(sig: list, resolved, args, out) -> list:
    """A collective's signature: its TorchScript arguments by ``script_key`` and its group's
    size and this process's rank in it (a group name outlives a group); the output (a
    ``Work`` among it) left out."""
    sig = [script_key(x) if isinstance(x, torch.ScriptObject) else x for x in sig]
    sig.append(group_size(args, resolved.group_arg))
    sig.append(group_rank(args, resolved.group_arg))
    return sig


def output_signature(sig: list, resolved, args, out) -> list:
    sig.append(key_of(out))
    return sig


# a 1-D integer tensor argument up to this long is read for a formula that takes
# ``int_values`` (cumulative sequence lengths): a batch's worth of ints, never activations
INT_VALUES_MAX = 65_536


def int_values(v) -> Optional[tuple]:
    """The values of ``v`` for a formula that takes ``int_values``: a tuple for a small 1-D
    integer tensor on the CPU, read once per tensor (``engine.counting.nested``); None for any other
    argument, and for a tensor on an accelerator (reading it would make the host wait for
    the device at every call: the formula prices without it) or without data (fake, meta)."""
    if not isinstance(v, Tensor) or v.dtype not in (torch.int32, torch.int64) \
            or v.dim() != 1 or v.device.type != "cpu" or v.numel() > INT_VALUES_MAX:
        return None
    try:
        return tensor_values(v)
    except Exception:  # no data to read (a fake or meta tensor)
        return None


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
    Keyword("dtypes", lambda args, resolved, layouts: [dtype_of(a) for a in args]),
    Keyword("layouts", lambda args, resolved, layouts: layouts or [None] * len(args)),
    Keyword("group_size", lambda args, resolved, layouts: group_size(args, resolved.group_arg)),
    Keyword("group_rank", lambda args, resolved, layouts: group_rank(args, resolved.group_arg)),
    Keyword("int_values", lambda args, resolved, layouts: [int_values(a) for a in args],
            signed=True),
)


def keyword_signature(sig: list, resolved, args, out) -> list:
    """A signature with the values of the signed keywords the formula takes (``int_values``),
    and the output."""
    for keyword in resolved.keywords:
        if keyword.signed:
            value = keyword.value(args, resolved, None)
            sig.append(tuple(value) if value.__class__ is list else value)
    sig.append(key_of(out))
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


def work_out(resolved, args, kwargs, out) -> Signature:
    """The ``Signature`` of one call: the formula's arguments (None without a formula) and
    the bytes it reads and writes. ``Exotic`` for a nested tensor among the arguments (its
    shape hashes, but no formula can price it)."""
    for a in args:
        if isinstance(a, Tensor) and a.is_nested:
            raise EXOTIC
    call = formula_call(args, kwargs, out, resolved) if resolved.kind == FORMULA else None
    signature = Signature(call, *moved_bytes(resolved, args, kwargs, out),
                          resolved.dtype or compute_dtype(args))
    if resolved.decompose is not None:
        resolved.decompose(signature, args, kwargs)
    return signature


# -- the slow path: tensors the hot path cannot key ------------------------------------------
class Exotic(Exception):
    """A call with a sparse, nested or symbolically sized tensor: see ``_exotic_call``."""


EXOTIC = Exotic()


class Resolved:
    """What the counting mode knows of one overload, worked out once
    (``CountingMode.resolve``): how it runs, its category and kind, its formula and the
    keywords the formula declares, and its mask tallies."""

    __slots__ = ("func", "run", "category", "kind", "view", "formula", "keywords",
                 "with_layouts", "write_only", "mutated", "out_in_signature", "decompose",
                 "signed", "group_arg", "tally", "shadow", "dtype")

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
        self.signed = collective_signature if communicates else output_signature
        # for a composite op (seen whole under inference_mode): prices a call by counting
        # its decomposition (``mode._decomposed``); None for every other op
        self.decompose = None
        # counts the masked (query, key) pairs of an attention op's mask tensor into the
        # call's record (``engine.masks``); None for every op that takes no mask
        self.tally = tally_of(func)
        # keeps the values of a meta output built from shapes (``masks.shadows``): asked
        # only for a call whose output is on meta. None for every op that cannot build a mask
        self.shadow = shadow_tally_of(func)
        self.dtype: Optional[str] = None  # the registry's, where it names the compute dtype

    def unpriced(self) -> "Resolved":
        """The same op, for calls no formula can price: unsupported (bytes counted)."""
        return Resolved(self.func, Category.UNSUPPORTED, UNKNOWN, None, (),
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


def remembered(shared: OrderedDict, key, make: Callable[[], Any]):
    """``shared[key]``, made by ``make()`` when it is not there: a process's worked-out calls
    (signatures, DTensor's logical calls), shared by every counter on a registry version, the
    last ``SIGNATURES_KEPT`` used kept (a process meeting a new shape every step stays
    bounded). Asked when a record is made, never per op; another thread's counter may drop
    an entry meanwhile."""
    entry = shared.get(key)
    if entry is None:
        entry = shared[key] = make()
        if len(shared) > SIGNATURES_KEPT:
            try:
                shared.popitem(last=False)
            except KeyError:  # another thread's counter emptied it meanwhile
                pass
    else:
        try:
            shared.move_to_end(key)
        except KeyError:  # another thread's counter let it go meanwhile
            pass
    return entry
