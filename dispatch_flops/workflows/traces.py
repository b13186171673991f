"""Any torch.profiler trace priced offline: ``from_trace(path)`` gives the Profile a counter
would have given for the run the trace recorded, with each op's kernel time from the trace.

What is priced. A trace records every op call the dispatcher entered (``cpu_op`` events,
nested as they ran) with its inputs' dims, dtypes, strides and scalar values
(``record_shapes=True``). A composite op (CompositeImplicitAutograd: ``aten::linear``,
``aten::layer_norm``, ``aten::scaled_dot_product_attention``) runs its decomposition as op
calls of their own, recorded inside it; every other op runs its kernel, and what it calls
inside is its own business. A dispatch mode sees exactly the outermost non-composite calls
(``docs/counting.md``), so those are the ones priced: one meta tensor per recorded tensor
(same shape, dtype and strides, no data), the overload picked by the recorded inputs' types,
the call run under the counting mode on meta, and priced by the formula registry as the live
counter prices it. A composite recorded with nothing inside it is priced by its own
decomposition, as under ``inference_mode``. Host ranges (``record_function``, autograd's
``evaluate_function``, ``CompiledFunction``) are walked into.

Where each op goes. Its module is the innermost module call (``with_modules=True``: "nn.Module:
Name_i" events) open around it on its thread, named by the profiler's labels joined with
dots below the root module (``"BertModel_0.BertEncoder_0.BertLayer_0"``). Its phase follows
the live rule (``engine.counting.ledger.phase_of``): inside autograd's evaluation of a node,
backward, charged to the module whose forward op made the node (the same autograd sequence
number); a module called inside backward, recompute; inside ``Optimizer.step``, optimizer;
outside every module of a trace that has modules, other; else forward.

What cannot be priced is listed, never zero in silence: an op with no shapes recorded, an
op this process does not know (a custom op of a package not imported), inputs that match no
overload, a scalar not recorded (torch before 2.3 records no ``Concrete Inputs``: a scalar
with no default is unknown), an op whose meta kernel fails. Each is an unsupported row
(bytes and flops unknown) with its kernel time, and a line in ``pricing_errors`` giving the
reason. An attention mask's values are not in a trace: its pairs are all kept in model flops
and the call is counted in ``unvalued_masks``, as on meta.

Kernel time. The trace's kernels are joined to the priced ops (``engine.timing.kernels.join``
over the file's records: ``trace_file.read``), so each row has the time of the kernels its
calls launched; kernels no op launched are ``kernel:<name>`` rows of the module open at their
launch; ``kernel_time`` states what was attributed, what was outside ops, and what had no
link. The device is the trace's (``deviceProperties``), so the roofline and MFU use its peaks.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from typing import Any, Mapping, Optional, Union

import torch

from dispatch_flops.engine.counting.calls import work_out
from dispatch_flops.engine.counting.mode import CountingMode
from dispatch_flops.engine.counting.records import CALLS, SIGNATURE, PricingError, bytes_only
from dispatch_flops.engine.masks.tally import TALLY
from dispatch_flops.engine.timing import kernels as _kernels
from dispatch_flops.engine.timing import trace_file
from dispatch_flops.formulas import REGISTRY, Registry
from dispatch_flops.results.facts import KERNEL_FACTS, ModuleFacts, RunFacts
from dispatch_flops.results.profile import Profile
from dispatch_flops.results.rows import KERNEL_ROW_PREFIX, ROW, RowKey
from dispatch_flops.results.stats import (
    BACKWARD,
    FORWARD,
    OPTIMIZER,
    OTHER,
    PRICED,
    RECOMPUTE,
    ROOT,
    UNSUPPORTED,
)

# a tensor's dtype as the profiler names it (its C++ type: caffe2's TypeMeta names)
_DTYPE_NAMES = {
    "float": "float32", "double": "float64", "c10::Half": "float16",
    "c10::BFloat16": "bfloat16", "long int": "int64", "long": "int64", "int64_t": "int64",
    "int": "int32", "short int": "int16", "short": "int16", "signed char": "int8",
    "unsigned char": "uint8", "bool": "bool", "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128", "c10::complex<c10::Half>": "complex32",
    "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2",
    "c10::Float8_e4m3fnuz": "float8_e4m3fnuz", "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
    "c10::Float8_e8m0fnu": "float8_e8m0fnu", "unsigned short": "uint16",
    "unsigned int": "uint32", "unsigned long": "uint64", "c10::qint8": "qint8",
    "c10::quint8": "quint8", "c10::qint32": "qint32",
}
DTYPES = {name: getattr(torch, dtype) for name, dtype in _DTYPE_NAMES.items()
          if isinstance(getattr(torch, dtype, None), torch.dtype)}
# a ScalarType argument (dtype=) is recorded as its enum value (c10/core/ScalarType.h's order)
_SCALAR_TYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
                 "complex32", "complex64", "complex128", "bool", "qint8", "quint8", "qint32",
                 "bfloat16", "quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8",
                 "bits16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz",
                 "float8_e4m3fnuz", "uint16", "uint32", "uint64")
SCALAR_TYPES = {i: getattr(torch, name) for i, name in enumerate(_SCALAR_TYPES)
                if isinstance(getattr(torch, name, None), torch.dtype)}
# a Python number wrapped in a 0-dim tensor by the dispatcher, as a dispatch mode sees it
# (its value is not recorded: a stand-in)
_WRAPPED = {"double": 0.5, "long int": 2, "c10::complex<double>": 0.5j, "bool": True}
_MEMORY_FORMATS = (torch.contiguous_format, torch.preserve_format, torch.channels_last,
                   torch.channels_last_3d)
_LAYOUTS = (torch.strided, torch.sparse_coo)

# recorded input types that are not a tensor's dtype
SCALAR, SCALAR_LIST, TENSOR_LIST, NONE = "Scalar", "ScalarList", "TensorList", ""
_OPTIMIZER_STEP = "Optimizer.step#"
_FLOPS = PRICED.index("flops")
_NAME = re.compile(r"^([A-Za-z_][\w]*)::([A-Za-z_]\w*)$")


class _Unpriced(Exception):
    """Why one recorded call cannot be priced."""


def from_trace(source: Union[str, os.PathLike, Mapping, list], *,
               registry: Optional[Registry] = None) -> Profile:
    """The Profile of the run a torch.profiler trace recorded: every recorded op priced from
    its recorded inputs by the formula registry (``registry``: the built-in one by default),
    attributed to its module call and phase, with its kernels' time. ``source``: a trace
    file (``prof.export_chrome_trace(path)``, ``tensorboard_trace_handler``; JSON, plain or
    .gz) or the trace already loaded. ``TraceFileError`` (a ``ValueError``) for a file that is
    not one. See the module's docstring for what is priced and what is listed instead."""
    recorded = trace_file.read(source)
    return _Pricer(recorded, registry if registry is not None else REGISTRY).profile()


class _Pricer:
    def __init__(self, recorded: trace_file.TraceFile, registry: Registry) -> None:
        self.recorded = recorded
        self.registry = registry
        self.cache: dict = {}  # an op's recorded call -> its pricing (or why not)
        self.errors: Counter = Counter()  # reason -> calls
        self.error_ns: Counter = Counter()
        # distinct recorded calls priced with stand-ins for scalars the trace lacks, by op
        self.guessed: Counter = Counter()
        # ... and with a string argument at its default (strings are not recorded)
        self.defaulted: Counter = Counter()
        ops = recorded.ops
        self.children, self.parent = _nest(ops)
        floating = Counter(DTYPES[t] for op in ops for t in op.types
                           if t in DTYPES and DTYPES[t].is_floating_point)
        self.default_dtype = floating.most_common(1)[0][0] if floating else torch.float32

    # -- which calls are priced ---------------------------------------------------------

    def counted(self) -> list:
        """``(op event, overload or None, reason or None)`` for every call a dispatch mode
        would have seen, in file order."""
        out: list = []
        roots = [i for i, p in enumerate(self.parent) if p < 0]
        stack = list(reversed(roots))
        ops = self.recorded.ops
        while stack:
            i = stack.pop()
            op = ops[i]
            kids = self.children.get(i, ())
            recorded_kids = [k for k in kids if ops[k].recorded_inputs]
            packet = _packet(op.name)
            if packet is None:
                if _NAME.match(op.name) and op.recorded_inputs and not recorded_kids:
                    out.append((op, None, f"{op.name}: not an op this process knows (import "
                                          f"the package that registers it to price it)"))
                    continue
                stack.extend(reversed(kids))  # a host range, or a custom op: what it ran
                continue
            if not op.recorded_inputs:
                if kids:
                    stack.extend(reversed(kids))
                    continue
                out.append((op, None, f"{op.name}: no inputs recorded (profile with "
                                      f"record_shapes=True)"))
                continue
            try:
                overload = _overload(packet, op)
            except _Unpriced as e:
                out.append((op, None, str(e)))
                continue
            if recorded_kids and _composite(overload):
                stack.extend(reversed(kids))  # its decomposition ran, recorded inside it
                continue
            out.append((op, overload, None))
        out.sort(key=lambda found: found[0].index)
        return out

    # -- pricing one call -----------------------------------------------------------------

    def price(self, op: trace_file.OpEvent, overload) -> tuple:
        """What one recorded call counts: per record the counting mode made of it (the op,
        or the ops of a composite's decomposition), ``(overload name, packet name, category,
        dtype, PRICED counts, calls, unvalued masks)``; ``_Unpriced`` when it cannot be."""
        key = (op.name, op.types, op.dims, op.strides, op.concrete)
        found = self.cache.get(key)
        if found is None:
            try:
                found = self._price(op, overload)
            except _Unpriced as e:
                found = e
            self.cache[key] = found
        if isinstance(found, _Unpriced):
            raise found
        return found

    def _price(self, op: trace_file.OpEvent, overload) -> tuple:
        mode = CountingMode(self.registry)  # its records are this call's alone
        resolved = mode.resolved.get(id(overload)) or mode.resolve(overload)
        if resolved.view:  # no arithmetic, no bytes: its arguments do not matter
            return (self._part(resolved, None, 1, 0),)
        args, kwargs, guessed, defaulted = _arguments(overload, op, self.default_dtype)
        if guessed:
            self.guessed[str(overload)] += 1
        if defaulted:
            self.defaulted[f"{overload}({', '.join(defaulted)})"] += 1
        try:
            with torch.no_grad(), mode:
                overload(*args, **kwargs)
        except Exception as e:
            return self._without_running(mode, overload, op, args, kwargs, e)
        parts = []
        # the call's own op, or what its decomposition ran (a composite's); no autograd node
        # on meta under no_grad: every record is in the forward accumulator
        for key, rec in mode.state.forward_acc.items():
            resolved = mode.resolved[key if key.__class__ is int else key[0]]
            parts.append(self._part(resolved, rec[SIGNATURE], rec[CALLS],
                                    1 if len(rec) > TALLY and rec[TALLY].unvalued else 0))
        return tuple(parts)  # empty: nothing ran (dropout in eval returns its input)

    def _without_running(self, mode, overload, op, args, kwargs, error) -> tuple:
        """A call whose meta kernel fails: priced without its output where it needs none
        (a view; an op that returns no tensor: ``item()``'s ``_local_scalar_dense``)."""
        resolved = mode.resolved.get(id(overload)) or mode.resolve(overload)
        if not any("Tensor" in str(r.type) for r in overload._schema.returns):
            return (self._part(resolved, work_out(resolved, args, kwargs, None), 1, 0),)
        raise _Unpriced(f"{overload}: its meta kernel failed "
                        f"({type(error).__name__}: {_first_line(error)})")

    def _part(self, resolved, signature, calls: int, unvalued: int) -> tuple:
        category = str(resolved.category)
        dtype = None
        if signature is None:  # a view: no arithmetic, no bytes
            unit: tuple = (0,) * len(PRICED)
        else:
            try:
                unit = signature.unit(resolved)
            except PricingError as e:
                self.errors[str(e)] += 0
                unit, category = bytes_only(signature), str(UNSUPPORTED)
            if unit[_FLOPS]:
                dtype = signature.dtype
        func = resolved.func
        return (str(func), str(func.overloadpacket), category, dtype,
                tuple(calls * u for u in unit), calls, unvalued)

    # -- the Profile ----------------------------------------------------------------------

    def profile(self) -> Profile:
        recorded = self.recorded
        ops = recorded.ops
        modules = recorded.modules
        names, types, module_of_call = _module_names(modules)
        call_nests = _nests((m.thread, m.start_ns, m.end_ns, k) for k, m in enumerate(modules))
        backward_ranges = _nests(
            (op.thread, op.start_ns, op.end_ns, op.index) for op in ops
            if op.name.startswith(_kernels.BACKWARD_PREFIX))
        optimizer_ranges = _nests(
            (thread, start, end, None) for name, thread, start, end in
            list(recorded.annotations) + [(o.name, o.thread, o.start_ns, o.end_ns) for o in ops]
            if name.startswith(_OPTIMIZER_STEP))
        has_model = bool(modules)

        def call_at(op) -> Optional[int]:
            nest = call_nests.get(op.thread)
            if nest is None:
                return None
            k = nest.innermost(op.start_ns, op.end_ns)
            return nest.values[k] if k >= 0 else None

        counted = self.counted()
        # a backward node's module: that of the forward calls that made it (sequence number)
        made_in: dict[int, Optional[int]] = {}
        for op in ops:
            if op.sequence is not None and op.sequence >= 0 and op.sequence not in made_in \
                    and not _inside(backward_ranges, op):
                made_in[op.sequence] = call_at(op)

        rows: dict = {}
        row_of: dict[int, RowKey] = {}
        last_node_call: dict[int, Optional[int]] = {}  # thread -> the last node's module
        unvalued = 0
        width = len(ROW)
        for op, overload, reason in counted:
            call = call_at(op)
            node = self._node(op, backward_ranges)
            if node is not None:
                if call is not None and _inside(backward_ranges, modules[call]):
                    phase = RECOMPUTE
                else:
                    seq = self._sequence(node)
                    matched = seq is not None and seq in made_in
                    call = made_in[seq] if seq is not None and matched else None
                    if not matched and ops[node].name.endswith("AccumulateGrad"):
                        # a parameter's gradient, stored: the live counter charges it to the
                        # parameter's module, which a trace does not name; the module of the
                        # node that produced it (evaluated just before on this thread) is
                        # that module for every parameter a module's own ops use
                        call = last_node_call.get(op.thread)
                    phase = BACKWARD if call is not None or not has_model else OTHER
                    if not ops[node].name.endswith("AccumulateGrad"):
                        last_node_call[op.thread] = call
            elif _inside(optimizer_ranges, op):
                phase, call = OPTIMIZER, None
            elif call is None and has_model:
                phase = OTHER
            else:
                phase = FORWARD
            stack = module_of_call[call] if call is not None else (ROOT,)
            parts: tuple = ()
            if reason is None:
                try:
                    parts = self.price(op, overload)
                except _Unpriced as e:
                    reason = str(e)
            if reason is not None:
                self.errors[reason] += 1
                operator = op.name.replace("::", ".", 1)
                parts = ((operator, operator, str(UNSUPPORTED), None, (0,) * len(PRICED), 1,
                          0),)
            for part_index, (name, packet, category, dtype, unit, calls, masks) in \
                    enumerate(parts):
                unvalued += masks
                key = RowKey(stack, str(phase), packet, name, category, dtype)
                counts = (calls,) + unit + (0,)
                total = rows.get(key)
                rows[key] = list(counts) if total is None else \
                    [a + b for a, b in zip(total, counts)]
                if part_index == 0:  # its kernels' time goes to the call's first record
                    row_of[op.index] = key

        found = _kernels.join(
            recorded.host, recorded.device,
            op_ranges=[(op.index, op.thread, op.start_ns, op.end_ns) for op, _, _ in counted
                       if op.index in row_of],
            call_ranges=[(k, m.thread, m.start_ns, m.end_ns) for k, m in enumerate(modules)])
        for index, ns in found.op_ns.items():
            key = row_of[index]
            rows[key][-1] += ns
            if key.category == str(UNSUPPORTED) and not key.operator.startswith(
                    KERNEL_ROW_PREFIX):
                self.error_ns[key.operator] += ns
        for out in found.outside:
            stack = module_of_call[out.call] if out.call is not None else (ROOT,)
            key = RowKey(stack, out.phase, KERNEL_ROW_PREFIX + out.name, out.name,
                         str(UNSUPPORTED), None)
            total = rows.setdefault(key, [0] * width)
            total[0] += out.calls
            total[-1] += out.ns

        timed = bool(recorded.device)
        calls_by_name: Counter = Counter()
        for k in range(len(modules)):
            calls_by_name[module_of_call[k][-1]] += 1
        spans: dict = defaultdict(int)
        idle: dict = defaultdict(int)
        for k, time in found.calls.items():
            name = module_of_call[k][-1]
            spans[name] += time.span_ns
            idle[name] += time.idle_ns
        facts = ModuleFacts(names=names, types=types, params=(0,) * len(names),
                            calls=dict(calls_by_name) if has_model else {ROOT: 1},
                            spans=dict(spans) if timed else {},
                            idle=dict(idle) if timed else {})
        step_ranges = [end - start for name, _, start, end in recorded.annotations
                       if name.startswith("ProfilerStep#")]
        steps = len(step_ranges)
        # the run's wall: its profiler steps', else its device records' first start to last end
        wall_ns = sum(step_ranges) if step_ranges else (
            max(a.end_ns for a in recorded.device) - min(a.start_ns for a in recorded.device)
            if recorded.device else 0)
        kernels: dict = {}
        if timed:
            kernels = {"device_ns": found.device_ns, "attributed_ns": found.attributed_ns,
                       "outside_ns": found.outside_ns, "dropped": found.dropped,
                       "unlinked": found.unlinked, "graph_replays": found.graph_replays,
                       "measured_steps": 1}
            kernels = {k: kernels.get(k, 0) for k in KERNEL_FACTS if k in kernels}
        dtypes = Counter(key.dtype for key in rows if key.dtype)
        run = RunFacts(
            model=types[0] if has_model and types[0] else "trace", has_model=has_model,
            timing=timed, steps=max(steps, 1), wall_s=wall_ns / 1e9 if timed and wall_ns
            else None,
            dtype=dtypes.most_common(1)[0][0] if dtypes else "float32",
            device="cuda" if timed else None, device_name=recorded.device_name,
            rank=recorded.rank if recorded.rank is not None and recorded.rank >= 0 else None,
            world_size=recorded.world_size if recorded.world_size and
            recorded.world_size > 0 else None,
            pricing_errors=self._error_lines(), kernels=kernels, unvalued_masks=unvalued)
        return Profile([(key, tuple(counts)) for key, counts in rows.items()], facts, run)

    def _error_lines(self) -> tuple:
        lines = []
        if self.defaulted:
            ops = ", ".join(sorted(self.defaulted))
            lines.append(f"priced with string arguments at their defaults (a trace records no "
                         f"strings): {ops}; a call made with another value (gelu's "
                         f"approximate='tanh') is priced as the default")
        if self.guessed:
            ops = ", ".join(sorted(self.guessed))
            lines.append(f"priced with stand-in scalars (this trace records no scalar values: "
                         f"torch before 2.3): {ops}; their flops are exact where the count does "
                         f"not depend on the value (pointwise ops)")
        for reason, calls in self.errors.most_common():
            lines.append(f"{reason} ({calls} call{'s' * (calls != 1)})" if calls else reason)
        return tuple(lines)

    def _node(self, op, backward_ranges) -> Optional[int]:
        """The autograd node evaluation (its ``evaluate_function`` op's index) ``op`` ran
        in, None outside backward."""
        nest = backward_ranges.get(op.thread)
        if nest is None:
            return None
        k = nest.innermost(op.start_ns, op.end_ns)
        return nest.values[k] if k >= 0 else None

    def _sequence(self, node: int) -> Optional[int]:
        """The sequence number of the node an ``evaluate_function`` range ran: its own, else
        that of the first op inside it that has one (the node's own range, "AddmmBackward0")."""
        op = self.recorded.ops[node]
        if op.sequence is not None and op.sequence >= 0:
            return op.sequence
        for k in self.children.get(node, ()):
            seq = self.recorded.ops[k].sequence
            if seq is not None and seq >= 0:
                return seq
        return None


# -- recorded calls into torch calls -------------------------------------------------------


def _packet(name: str):
    """The op packet ``ns::name`` names in this process, None for a host range or an op
    this process does not know."""
    found = _NAME.match(name)
    if found is None:
        return None
    namespace, op = found.groups()
    try:
        return getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return None


def _composite(overload) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(),
                                                              "CompositeImplicitAutograd")
    except RuntimeError:
        return False


_NUMBERS = frozenset(("IntType", "FloatType", "BoolType", "NumberType", "SymIntType",
                      "SymFloatType", "SymBoolType", "ComplexType"))


def _kind(t) -> tuple[str, bool]:
    """(what an argument of JIT type ``t`` holds, whether None is allowed)."""
    optional = t.kind() == "OptionalType"
    if optional:
        t = t.getElementType()
    kind = t.kind()
    if kind == "TensorType":
        return "tensor", optional
    if kind == "ListType":
        inner = t.getElementType()
        if inner.kind() == "OptionalType":
            inner = inner.getElementType()
        if inner.kind() == "TensorType":
            return "tensors", optional
        # a list of numbers; a list of names (Dimname[]: sum.dim_DimnameList) is no ScalarList
        return ("scalars" if inner.kind() in _NUMBERS else "other"), optional
    if kind in _NUMBERS:
        return "scalar", optional
    return "other", optional  # str, Device, Generator, Dimname...: recorded as ""


def _fits(schema, op: trace_file.OpEvent, strict: bool = True) -> bool:
    """Whether the recorded inputs' types fit ``schema``'s arguments. Strict: an input
    recorded as None ("") only where None or a default is allowed, or where the profiler
    records nothing (a string, a device); else anywhere (older torch records an int list or a
    list of optional tensors as "")."""
    arguments = schema.arguments
    types = op.types
    if len(arguments) != len(types):
        return False
    for argument, recorded in zip(arguments, types):
        kind, optional = _kind(argument.type)
        if recorded == NONE:
            if strict and kind != "other" and not optional and \
                    not argument.has_default_value():
                return False
        elif recorded == SCALAR:
            if kind != "scalar":
                return False
        elif recorded == SCALAR_LIST:
            if kind != "scalars":
                return False
        elif recorded == TENSOR_LIST:
            if kind != "tensors":
                return False
        elif kind != "tensor":  # a dtype's name: a tensor
            return False
    return True


def _overload(packet, op: trace_file.OpEvent):
    """The overload of ``packet`` whose schema the recorded inputs fit (the default first,
    out= variants last)."""
    names = sorted(packet.overloads(), key=lambda n: (n != "default", "out" in n, n))
    for strict in (True, False):
        for name in names:
            overload = getattr(packet, name)
            if _fits(overload._schema, op, strict):
                return overload
    raise _Unpriced(f"{op.name}: the recorded inputs fit no overload of "
                    f"it in this torch ({torch.__version__})")


def _shapes(op: trace_file.OpEvent) -> str:
    shown = [list(d) if t not in (SCALAR, NONE, SCALAR_LIST) else
             (c if c != "" else t or "None") for d, t, c in
             zip(op.dims, op.types, op.concrete or ("",) * len(op.types))]
    return f"inputs {shown}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:160] if text else type(e).__name__


def _value(text: str):
    text = text.strip()
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _scalar(argument, text: str):
    value = _value(text)
    real = str(getattr(argument, "real_type", argument.type))
    if "ScalarType" in real:
        if value not in SCALAR_TYPES:
            raise _Unpriced(f"dtype code {text!r} unknown")
        return SCALAR_TYPES[value]
    if "MemoryFormat" in real:
        return _MEMORY_FORMATS[value] if isinstance(value, int) and \
            0 <= value < len(_MEMORY_FORMATS) else None
    if "Layout" in real:
        return _LAYOUTS[value] if isinstance(value, int) and 0 <= value < len(_LAYOUTS) \
            else torch.strided
    kind = argument.type.kind()
    if kind == "OptionalType":
        kind = argument.type.getElementType().kind()
    if kind == "IntType" and isinstance(value, float):
        return int(value)
    if kind == "FloatType" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _tensor(dims, strides, dtype) -> torch.Tensor:
    dims = tuple(int(d) for d in dims)
    if strides and len(strides) == len(dims):
        return torch.empty_strided(dims, tuple(int(s) for s in strides), dtype=dtype,
                                   device="meta")
    return torch.empty(dims, dtype=dtype, device="meta")


def _stand_in(argument, dtype):
    """A value for a scalar the trace did not record: the call's dtype for a dtype, else 1
    of the argument's type (a pointwise op's count does not depend on it)."""
    real = str(getattr(argument, "real_type", argument.type))
    if "ScalarType" in real:
        return dtype
    if "MemoryFormat" in real or "Layout" in real:
        return None if "Optional" in real else torch.strided
    if "bool" in real:
        return True
    return 1.0 if "float" in real else 1


def _arguments(overload, op: trace_file.OpEvent, default_dtype
               ) -> tuple[list, dict, list, list]:
    """Meta tensors and values for one recorded call of ``overload``, the names of the
    scalars the trace did not record (stand-ins were used: ``_stand_in``), and the string
    arguments given their defaults (``name='value'``)."""
    guessed: list = []
    defaulted: list = []
    args: list = []
    kwargs: dict = {}
    n = len(op.types)
    dims = op.dims + ((),) * (n - len(op.dims))
    strides = op.strides + ((),) * (n - len(op.strides))
    concrete = op.concrete + ("",) * (n - len(op.concrete))
    first_dtype = next((DTYPES[t] for t in op.types if t in DTYPES), default_dtype)
    for argument, recorded, d, s, c in zip(overload._schema.arguments, op.types, dims,
                                           strides, concrete):
        kind, optional = _kind(argument.type)
        if recorded in _WRAPPED and not d and args and any(
                t in DTYPES and t != recorded for t in op.types):
            # a Python number passed where a tensor goes: the dispatcher wraps it in a 0-dim
            # tensor (double, long, complex, bool), which a dispatch mode sees as the number
            # itself (no bytes); its value is not recorded, nor needed by a pointwise count
            value: Any = _WRAPPED[recorded]
        elif recorded in DTYPES:
            value = _tensor(d, s, DTYPES[recorded])
        elif recorded == TENSOR_LIST:  # its dtypes are not recorded: the call's, else the trace's
            if not d:
                raise _Unpriced(f"{overload}: the shapes in its tensor list '{argument.name}' "
                                f"were not recorded (torch before 2.1 records none)")
            value = [_tensor(x, (), first_dtype) for x in d]
        elif recorded in (SCALAR, SCALAR_LIST) and isinstance(c, str) and c != "":
            if recorded == SCALAR:
                value = _scalar(argument, c)
            else:
                items = c.strip().strip("[]")
                value = [] if not items.strip() else \
                    [_value(x) for x in items.split(",")]
        elif recorded in (SCALAR, SCALAR_LIST):
            if argument.has_default_value() and argument.default_value is not None:
                value = argument.default_value
            elif recorded == SCALAR:  # torch before 2.3 records no values: a stand-in
                value = _stand_in(argument, first_dtype)
                guessed.append(argument.name)
            else:
                raise _Unpriced(f"{overload}: the value of "
                                f"'{argument.name}' was not recorded (torch before 2.3 records "
                                f"no Concrete Inputs)")
        elif recorded == NONE and kind == "other" and "Device" in str(argument.type):
            value = torch.device("meta")
        elif recorded == NONE:
            if kind == "other" and argument.has_default_value():
                value = argument.default_value
                if isinstance(value, str):  # the profiler records no strings
                    defaulted.append(f"{argument.name}={value!r}")
            elif optional:
                value = None
            elif argument.has_default_value():
                value = argument.default_value
            else:
                what = str(getattr(argument, "real_type", argument.type))
                raise _Unpriced(f"{overload}: '{argument.name}' "
                                f"({what}) is not in the trace (the profiler records it as "
                                f"None)")
        else:
            raise _Unpriced(f"{overload}: input type {recorded!r} not known")
        if kind == "other" and "Device" in str(argument.type):
            value = torch.device("meta")
        if argument.kwarg_only:
            kwargs[argument.name] = value
        else:
            args.append(value)
    return args, kwargs, guessed, defaulted


# -- the trace's structure -----------------------------------------------------------------


def _nest(ops) -> tuple[dict, list]:
    """Each op's children and parent (-1: none), by containment on its thread; ties in
    start time put the longer (outer) first, then file order."""
    parent = [-1] * len(ops)
    children: dict[int, list] = defaultdict(list)
    by_thread: dict[int, list] = defaultdict(list)
    for op in ops:
        by_thread[op.thread].append(op)
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda o: (o.start_ns, -o.end_ns, o.index))
        stack: list = []
        for op in thread_ops:
            while stack and stack[-1].end_ns <= op.start_ns:  # ended before: a sibling's
                stack.pop()
            if stack:
                parent[op.index] = stack[-1].index
                children[stack[-1].index].append(op.index)
            stack.append(op)
    return children, parent


def _nests(intervals) -> dict:
    """Per thread, a ``kernels.Nest`` of ``(thread, start, end, value)`` intervals."""
    by_thread: dict[int, list] = defaultdict(list)
    for thread, start, end, value in intervals:
        by_thread[thread].append((start, end, value))
    return {thread: _kernels.Nest(found) for thread, found in by_thread.items()}


def _inside(nests: dict, event) -> bool:
    nest = nests.get(event.thread)
    return nest is not None and nest.innermost(event.start_ns, event.end_ns) >= 0


def _module_names(modules) -> tuple[tuple, tuple, list]:
    """``(names, types, stack per module call)``: a module call's name is the labels of the
    calls open around it, from below the root, joined with dots. The root is the outermost
    module when every outermost call is of one module (``""``, its class the model's);
    otherwise a root of its own with each outermost module below it."""
    nests = _nests((m.thread, m.start_ns, m.end_ns, k) for k, m in enumerate(modules))
    chains: list = []
    for k, m in enumerate(modules):
        nest = nests[m.thread]
        j = nest.innermost(m.start_ns, m.end_ns)
        # the innermost containing itself is itself (or an identical twin): walk its parents
        chain = [nest.values[i] for i in nest.chain(j)]
        if k in chain:
            chain = chain[chain.index(k):]
        else:
            chain = [k] + chain
        chains.append(list(reversed(chain)))  # outermost first
    outermost = {modules[c[0]].label for c in chains}
    single_root = len(outermost) == 1
    names: list = [ROOT]
    types: list = [modules[chains[0][0]].cls if chains and single_root else ""]
    stacks: list = []
    seen = {ROOT}
    for chain in chains:
        labels = [modules[i].label for i in chain]
        if single_root:
            labels = labels[1:]
        stack = [ROOT]
        for depth in range(1, len(labels) + 1):
            name = ".".join(labels[:depth])
            stack.append(name)
            if name not in seen:
                seen.add(name)
                names.append(name)
                types.append(_class_of(labels[depth - 1]))
        stacks.append(tuple(stack))
    return tuple(names), tuple(types), stacks


def _class_of(label: str) -> str:
    return label.rpartition("_")[0] or label
