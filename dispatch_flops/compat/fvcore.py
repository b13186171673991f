"""fvcore's flop counting API (``fvcore.nn``: ``FlopCountAnalysis``, ``flop_count``,
``flop_count_table``, ``flop_count_str``, ``parameter_count``, ``ActivationCountAnalysis``),
counted by this package's engine instead of a jit trace, so a script switches by changing the
import:

>>> from dispatch_flops.compat.fvcore import FlopCountAnalysis, flop_count_table
>>> flops = FlopCountAnalysis(model, inputs)
>>> flops.total(), flops.by_operator(), flops.by_module()["layer1"]
>>> print(flop_count_table(flops))

fvcore's unit is kept: one "flop" is one multiply-accumulate (a MAC; fvcore#69), so
``total()`` is this package's ``total.macs`` for the contractions, plus fvcore's conventions
for the few other ops it prices (a batch norm is 1 an element, 2 with an affine in eval and
4 or 5 in training; group, layer and instance norms 4 or 5; bilinear upsampling 4 an output;
adaptive average pooling 1 an input). Ops are named as fvcore's jit trace names them
(``"linear"``, ``"conv"``, ``"matmul"``, ``"einsum"``, ``"batch_norm"``): the model runs below
autograd's kernels (``workflows.untouched.composites_whole``), where composite ops reach the
counter whole, at the level a trace records them, and is given back as it was found. What
fvcore has no handle for but is contraction work (attention kernels, ``baddbmm``, recurrent
kernels) is counted under its own name where fvcore would report it
unsupported (docs/migrating.md lists the differences).

Handles (``set_op_handle``, ``supported_ops``) take fvcore's ``(inputs, outputs)`` of jit
values; here they are given stand-ins built from the call's shapes and arguments, in the
order of the jit node's inputs (``isCompleteTensor()``, ``type().sizes()``, ``toIValue()``,
``node().inputs()`` for a list of tensors), so handles written with fvcore's ``get_shape``
work unchanged. ``prim::`` kinds (``prim::PythonOp.*``, ``prim::CallFunction``) exist only in
a trace: a handle for one is never called.
"""

from __future__ import annotations

import logging
import typing
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

import numpy as np
import torch
from torch import Tensor, nn

from dispatch_flops.compat._conventions import PeerRegistry, run_forward
from dispatch_flops.counter import FlopCounter
from dispatch_flops.formulas import Category
from dispatch_flops.workflows.untouched import composites_whole

# fvcore's handle: (inputs, outputs) of a jit node -> a number, or a Counter {name: number}
Handle = Callable[[List[Any], List[Any]], Any]

# the kind fvcore's trace gives every convolution (conv1d..3d, transposed, aten.convolution)
CONVOLUTION = "aten::_convolution"
_CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                           "conv_transpose3d", "convolution", "_convolution", "conv_tbc"})

# fvcore's list of ops that do no arithmetic (shape changes, copies, integer ops); ops the
# package declares no-arithmetic are ignored too, so views a trace never shows stay silent
_IGNORED_OPS: Set[str] = {
    "aten::Int", "aten::ScalarImplicit", "aten::__and__", "aten::arange", "aten::bitwise_not",
    "aten::cat", "aten::chunk", "aten::clamp", "aten::clamp_", "aten::constant_pad_nd",
    "aten::contiguous", "aten::copy_", "aten::detach", "aten::dropout", "aten::empty",
    "aten::eq", "aten::expand", "aten::flatten", "aten::floor", "aten::floor_divide",
    "aten::full", "aten::full_like", "aten::gather", "aten::ge", "aten::gt", "aten::index",
    "aten::index_put_", "aten::masked_fill", "aten::max", "aten::narrow", "aten::new_empty",
    "aten::new_full", "aten::new_zeros", "aten::nonzero", "aten::ones", "aten::permute",
    "aten::relu", "aten::relu_", "aten::remainder", "aten::reshape", "aten::roll",
    "aten::select", "aten::size", "aten::slice", "aten::split", "aten::split_with_sizes",
    "aten::squeeze", "aten::stack", "aten::t", "aten::to", "aten::transpose", "aten::type_as",
    "aten::unbind", "aten::unsqueeze", "aten::unsqueeze_", "aten::view", "aten::zeros",
    "aten::zeros_like",
}


# -- jit values, as handles read them --------------------------------------------------------
class _TensorType:
    def __init__(self, shape: torch.Size):
        self._shape = shape

    def sizes(self) -> List[int]:
        return list(self._shape)


class _Node:
    def __init__(self, inputs: list):
        self._inputs = inputs

    def inputs(self) -> Iterator["_Value"]:
        return iter(self._inputs)


class _Value:
    """A jit ``Value`` as fvcore's handles read one: a tensor (its shape), a list of
    tensors (``node().inputs()``), or a constant (``toIValue()``)."""

    def __init__(self, value: Any):
        self._value = value

    def isCompleteTensor(self) -> bool:  # noqa: N802 (torch._C.Value's name)
        return isinstance(self._value, torch.Size)

    def type(self) -> _TensorType:
        if not isinstance(self._value, torch.Size):
            raise TypeError(f"{self._value!r} is not a tensor")
        return _TensorType(self._value)

    def toIValue(self) -> Any:  # noqa: N802
        return self._value

    def node(self) -> _Node:
        items = self._value if isinstance(self._value, (list, tuple)) else []
        return _Node([_Value(v) for v in items])


def get_shape(val: Any) -> Optional[List[int]]:
    """The shape of a tensor value (jit's or a stand-in), None for anything else."""
    return val.type().sizes() if val.isCompleteTensor() else None


def _schema_values(overload, args: tuple, kwargs: dict) -> list:
    """The op's arguments in schema order, defaults filled: a jit node's inputs."""
    values = []
    for i, argument in enumerate(overload._schema.arguments):
        if i < len(args):
            values.append(args[i])
        elif argument.name in kwargs:
            values.append(kwargs[argument.name])
        else:
            values.append(argument.default_value if argument.has_default_value() else None)
    return values


def _as_convolution(name: str, values: list) -> list:
    """A convolution's arguments as ``aten::_convolution``'s 13 inputs (what fvcore's trace
    sees for every convolution)."""
    flags = [False, False, True, True]  # benchmark, deterministic, cudnn_enabled, allow_tf32
    if name == "_convolution":
        return values
    if name == "convolution":
        return values + flags
    x, w, bias, stride, padding = values[:5]
    if name.startswith("conv_transpose"):
        output_padding, groups, dilation = values[5:8]
        return [x, w, bias, stride, padding, dilation, True, output_padding, groups] + flags
    dilation, groups = values[5:7]
    spatial = len(w) - 2 if isinstance(w, torch.Size) else 1
    return [x, w, bias, stride, padding, dilation, False, [0] * spatial, groups] + flags


def _outputs(out_shape) -> list:
    if isinstance(out_shape, (tuple, list)) and not isinstance(out_shape, torch.Size):
        return [_Value(s) for s in out_shape]
    return [_Value(out_shape)]


# -- handles ---------------------------------------------------------------------------------
class _EngineMacs:
    """The handle of a contraction: its figure is this package's MACs for the call (read from
    the counter, no formula of its own). Called on jit values (fvcore's handle contract), it
    counts the node's op on meta tensors of the same shapes."""

    def __init__(self, op: str, name: Optional[str] = None):
        # ``name``: the name fvcore's handle reports (conv's Counter); None: the op kind's
        self.name = name
        self.__name__ = f"{op}_flop_jit"

    def __call__(self, inputs: List[Any], outputs: List[Any]) -> int:
        kind = outputs[0].node().kind()
        namespace, _, op = kind.partition("::")
        packet = getattr(getattr(torch.ops, namespace), op)
        schema = packet.default._schema.arguments if "default" in packet.overloads() else []
        args, kwargs = [], {}
        for i, value in enumerate(inputs):  # a node lists keyword-only arguments too
            if i < len(schema) and schema[i].kwarg_only:
                kwargs[schema[i].name] = _materialise(value)
            else:
                args.append(_materialise(value))
        with composites_whole(), FlopCounter() as counter:
            packet(*args, **kwargs)
        return counter.total.macs


def _materialise(value: Any) -> Any:
    """A jit value as an argument: a meta tensor of its shape, a list, or its constant."""
    if value.isCompleteTensor():
        return torch.empty(value.type().sizes(), device="meta")
    node = value.node()
    if node.kind() == "prim::ListConstruct":
        return [_materialise(v) for v in node.inputs()]
    return value.toIValue()


addmm_flop_jit = _EngineMacs("addmm")
bmm_flop_jit = _EngineMacs("bmm")
conv_flop_jit = _EngineMacs("conv", name="conv")
einsum_flop_jit = _EngineMacs("einsum")
linear_flop_jit = _EngineMacs("linear")
matmul_flop_jit = _EngineMacs("matmul")
mm_flop_jit = _EngineMacs("mm")


def _elements(shape) -> int:
    return int(np.prod(shape)) if shape is not None else 0


def norm_flop_counter(affine_arg_index: int) -> Handle:
    """fvcore's norm convention: 5 an element with an affine (the argument at
    ``affine_arg_index`` given), else 4."""

    def norm_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
        has_affine = get_shape(inputs[affine_arg_index]) is not None
        return _elements(get_shape(inputs[0])) * (5 if has_affine else 4)

    return norm_flop_jit


def batchnorm_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """fvcore's batch norm: a norm in training; in eval 1 an element, 2 with an affine."""
    training = inputs[5].toIValue()
    if training:
        return norm_flop_counter(1)(inputs, outputs)
    has_affine = get_shape(inputs[1]) is not None
    return _elements(get_shape(inputs[0])) * (2 if has_affine else 1)


def elementwise_flop_counter(input_scale: float = 1, output_scale: float = 0) -> Handle:
    """fvcore's element-count convention: ``input_scale`` an input element plus
    ``output_scale`` an output element."""

    def elementwise_flop(inputs: List[Any], outputs: List[Any]) -> float:
        count = 0.0
        if input_scale:
            count += input_scale * _elements(get_shape(inputs[0]))
        if output_scale:
            count += output_scale * _elements(get_shape(outputs[0]))
        return count

    return elementwise_flop


def generic_activation_jit(op_name: Optional[str] = None) -> Handle:
    """fvcore's activation count: the output's elements (under ``op_name`` when given)."""

    def activation_jit(inputs: List[Any], outputs: List[Any]) -> Union[int, typing.Counter[str]]:
        count = _elements(get_shape(outputs[0]))
        return count if op_name is None else Counter({op_name: count})

    return activation_jit


_DEFAULT_SUPPORTED_OPS: Dict[str, Handle] = {
    "aten::addmm": addmm_flop_jit,
    "aten::bmm": bmm_flop_jit,
    CONVOLUTION: conv_flop_jit,
    "aten::einsum": einsum_flop_jit,
    "aten::matmul": matmul_flop_jit,
    "aten::mm": mm_flop_jit,
    "aten::linear": linear_flop_jit,
    "aten::batch_norm": batchnorm_flop_jit,
    "aten::group_norm": norm_flop_counter(2),
    "aten::layer_norm": norm_flop_counter(2),
    "aten::instance_norm": norm_flop_counter(1),
    "aten::upsample_nearest2d": elementwise_flop_counter(0, 1),
    "aten::upsample_bilinear2d": elementwise_flop_counter(0, 4),
    "aten::adaptive_avg_pool2d": elementwise_flop_counter(1, 0),
    "aten::grid_sampler": elementwise_flop_counter(0, 4),  # fvcore assumes bilinear
}

_DEFAULT_ACTIVATION_OPS: Dict[str, Handle] = {
    CONVOLUTION: generic_activation_jit("conv"),
    "aten::addmm": generic_activation_jit(),
    "aten::bmm": generic_activation_jit(),
    "aten::einsum": generic_activation_jit(),
    "aten::matmul": generic_activation_jit(),
    "aten::linear": generic_activation_jit(),
}


# -- module names ----------------------------------------------------------------------------
def _named_modules_with_dup(model: nn.Module, prefix: str = "") -> Iterator[Tuple[str, nn.Module]]:
    """Every (name, module) pair, a shared module under each of its names."""
    yield prefix, model
    for name, module in model._modules.items():
        if module is not None:
            yield from _named_modules_with_dup(module, prefix + ("." if prefix else "") + name)


def _kind(operator: str) -> str:
    """A record's operator (``"aten.conv2d"``) as fvcore's trace names its node kind."""
    namespace, _, name = operator.partition(".")
    if namespace == "aten" and name in _CONVOLUTIONS:
        return CONVOLUTION
    return f"{namespace}::{name}"


def _simplify(kind: str) -> str:
    return kind.split("::", 1)[-1]


def _overloads_of(kind: str) -> list:
    """The overloads a handle for ``kind`` prices."""
    namespace, _, name = kind.partition("::")
    names = sorted(_CONVOLUTIONS) if kind == CONVOLUTION else [name]
    found = []
    ops = getattr(torch.ops, namespace, None) if namespace not in ("", "prim") else None
    for op_name in names:
        packet = getattr(ops, op_name, None) if ops is not None else None
        if isinstance(packet, torch._ops.OpOverloadPacket):
            found += [getattr(packet, overload) for overload in packet.overloads()]
    return found


class Statistics(typing.NamedTuple):
    counts: Dict[str, typing.Counter[str]]
    unsupported_ops: Dict[str, typing.Counter[str]]
    uncalled_mods: Set[str]


class JitModelAnalysis:
    """fvcore's ``JitModelAnalysis``: per-module statistics of ``model(*inputs)`` from the
    op handles set with ``set_op_handle`` (none by default), counted lazily on the first
    request and again after the handles change.

    >>> analysis = JitModelAnalysis(model, (x,)).set_op_handle("aten::linear", linear_flop_jit)
    >>> analysis.total("fc"), analysis.by_module_and_operator(), analysis.unsupported_ops()
    """

    # FlopCountAnalysis counts contraction work fvcore has no handle for under its own name
    _count_unhandled_contractions = False

    def __init__(self, model: nn.Module, inputs: Union[Tensor, Tuple[Any, ...]]) -> None:
        self._model = model
        self._inputs = inputs
        self._op_handles: Dict[str, Handle] = {}
        self._named_modules: Dict[str, nn.Module] = dict(_named_modules_with_dup(model))
        self._aliases: Dict[Union[nn.Module, str], str] = self._get_aliases(model)
        self._stats: Optional[Statistics] = None
        self._ignored_ops: Set[str] = set(_IGNORED_OPS)
        self.unsupported_ops_warnings(True)
        self.uncalled_modules_warnings(True)
        self.tracer_warnings("no_tracer_warning")
        self.ancestor_mode("owner")

    # -- fvcore's queries -------------------------------------------------------------------
    def total(self, module_name: str = "") -> int:
        stats = self._analyze()
        return sum(stats.counts[self.canonical_module_name(module_name)].values())

    def by_operator(self, module_name: str = "") -> typing.Counter[str]:
        stats = self._analyze()
        return stats.counts[self.canonical_module_name(module_name)]

    def by_module_and_operator(self) -> Dict[str, typing.Counter[str]]:
        return self._analyze().counts

    def by_module(self) -> typing.Counter[str]:
        stats = self._analyze()
        return Counter({name: sum(ops.values()) for name, ops in stats.counts.items()})

    def unsupported_ops(self, module_name: str = "") -> typing.Counter[str]:
        if self._stats is None:  # fvcore's contract: ask after a count
            raise RuntimeError("Analysis results should be computed before calling "
                               "unsupported_ops()")
        return self._stats.unsupported_ops[self.canonical_module_name(module_name)]

    def uncalled_modules(self) -> Set[str]:
        return self._analyze().uncalled_mods

    # -- fvcore's settings ------------------------------------------------------------------
    def set_op_handle(self, *args, **kwargs: Optional[Handle]) -> "JitModelAnalysis":
        """Set handles by op kind (``"aten::linear"``), as pairs or keywords; None ignores
        the op."""
        self._stats = None
        if len(args) % 2 != 0:
            raise TypeError("set_op_handle should be called with pairs of names and handles!")
        for name, handle in zip(args[::2], args[1::2]):
            kwargs[name] = handle
        for name, handle in kwargs.items():
            if handle is None:  # fvcore keeps a handle set before; leaving it out is the intent
                self._op_handles.pop(name, None)
                self._ignored_ops.add(name)
            else:
                self._op_handles[name] = handle
        return self

    def clear_op_handles(self) -> "JitModelAnalysis":
        self._op_handles = {}
        self._ignored_ops = set(_IGNORED_OPS)
        self._stats = None
        return self

    def canonical_module_name(self, name: str) -> str:
        if not isinstance(name, str):
            raise TypeError(f"module_name must be a string, got {type(name).__name__}")
        if name not in self._aliases:
            raise KeyError("Requested module name is not among the descendants of the "
                           "analyzed model.")
        return self._aliases[name]

    def copy(self, new_model: Optional[nn.Module] = None,
             new_inputs: Union[None, Tensor, Tuple[Any, ...]] = None) -> "JitModelAnalysis":
        model = self._model if new_model is None else new_model
        inputs = self._inputs if new_inputs is None else new_inputs
        return (JitModelAnalysis(model, inputs).set_op_handle(**self._op_handles)
                .unsupported_ops_warnings(self._enable_warn_unsupported_ops)
                .uncalled_modules_warnings(self._enable_warn_uncalled_mods)
                .tracer_warnings(self._warn_trace))

    def tracer_warnings(self, mode: str) -> "JitModelAnalysis":
        """Which warnings the model's run may raise: "all", "no_tracer_warning" (there is no
        trace here: the same as "all") or "none"."""
        if mode not in ("all", "no_tracer_warning", "none"):
            raise ValueError(f"Unrecognized tracer warning mode {mode}.")
        self._warn_trace = mode
        return self

    def ancestor_mode(self, mode: str) -> "JitModelAnalysis":
        """"owner": an op belongs to the module running it and that module's parents by name;
        "caller": to every module whose forward is running."""
        if mode not in ("owner", "caller"):
            raise ValueError(f"Unrecognized ancestor mode: {mode}")
        self._ancestor_mode = mode
        return self

    def unsupported_ops_warnings(self, enabled: bool) -> "JitModelAnalysis":
        self._enable_warn_unsupported_ops = enabled
        return self

    def uncalled_modules_warnings(self, enabled: bool) -> "JitModelAnalysis":
        self._enable_warn_uncalled_mods = enabled
        return self

    # -- counting ---------------------------------------------------------------------------
    def _get_aliases(self, model: nn.Module) -> Dict[Union[nn.Module, str], str]:
        aliases: Dict[Union[nn.Module, str], str] = {}
        for name, module in _named_modules_with_dup(model):
            if module not in aliases:
                aliases[module] = name
            aliases[name] = aliases[module]
        return aliases

    def _ancestors(self, name: str) -> Set[str]:
        parts = self.canonical_module_name(name).split(".")
        return {".".join(parts[:k]) for k in range(len(parts) + 1)}

    def _registry(self, names: Dict[str, Any], errors: List[BaseException]) -> PeerRegistry:
        """The handles that are not this package's MACs, as formulas: each prices a call
        from jit-like values of its arguments; ``names`` collects the names they report."""
        registry = PeerRegistry()
        for kind, handle in self._op_handles.items():
            if isinstance(handle, _EngineMacs):
                continue
            for overload in _overloads_of(kind):
                registry.figure(overload, _handle_formula(kind, overload, handle, names,
                                                          errors))
        return registry

    def _call(self) -> None:
        inputs = self._inputs
        if isinstance(inputs, tuple):
            self._model(*inputs)
        else:
            self._model(inputs)

    def _analyze(self) -> Statistics:
        if self._stats is not None:
            return self._stats
        names: Dict[str, Any] = {}
        errors: List[BaseException] = []
        registry = self._registry(names, errors)
        with warnings.catch_warnings():
            if self._warn_trace == "none":
                warnings.simplefilter("ignore")
            counter = run_forward(self._model, self._call, registry, inputs=self._inputs,
                                  eval_mode=False)
            records = counter.records()
        if errors:  # a handle raised, or gave no number: fvcore's query raises it
            raise errors[0]
        counts: Dict[str, typing.Counter[str]] = {}
        unsupported: Dict[str, typing.Counter[str]] = {}
        for _, module in _named_modules_with_dup(self._model):
            counts[self._aliases[module]] = Counter()
            unsupported[self._aliases[module]] = Counter()
        seen: Set[str] = set()
        for record in records:
            kind = _kind(record.operator)
            scopes = [self._aliases.get(name, name) for name in record.stack]
            seen.update(scopes)
            if self._ancestor_mode == "caller":
                ancestors = set(scopes)
            else:
                ancestors = self._ancestors(scopes[-1])
                seen.update(ancestors)
            macs = record.stats.macs
            handle = self._op_handles.get(kind)
            if handle is not None:
                reported = handle.name if isinstance(handle, _EngineMacs) else None
                shares = names.get(kind) or Counter({reported or _simplify(kind): 1.0})
                op_counts = Counter({n: round(macs * share) for n, share in shares.items()})
            elif self._ignored(kind, record.category):
                continue
            elif self._count_unhandled_contractions and macs:
                op_counts = Counter({_simplify(kind): macs})
            else:
                for name in ancestors:
                    unsupported[name][kind] += record.stats.calls
                continue
            for name in ancestors:
                counts[name] += op_counts  # a Counter's +=: zero counts drop out, as fvcore's
        stats = Statistics(counts, unsupported, set(self._aliases.values()) - seen)
        self._stats = stats
        self._warn_unsupported_ops(unsupported[""])
        self._warn_uncalled_mods(stats.uncalled_mods)
        return stats

    def _ignored(self, kind: str, category: str) -> bool:
        """fvcore's ignore list, and ops this package knows do no arithmetic (views, copies,
        the profiler's markers): a trace shows fewer of them, none is unsupported."""
        return kind in self._ignored_ops or category == Category.NO_ARITHMETIC

    def _warn_unsupported_ops(self, ops: typing.Counter[str]) -> None:
        if not self._enable_warn_unsupported_ops:
            return
        logger = logging.getLogger(__name__)
        for op, freq in ops.items():
            logger.warning("Unsupported operator {} encountered {} time(s)".format(op, freq))

    def _warn_uncalled_mods(self, uncalled_mods: Set[str]) -> None:
        if not self._enable_warn_uncalled_mods:
            return
        uncalled = sorted(name for name in uncalled_mods if self._has_forward(name))
        if uncalled:
            logging.getLogger(__name__).warning(
                "The following submodules of the model were never called during the trace "
                "of the graph. They may be unused, or they were accessed by direct calls to "
                ".forward() or via other python methods. In the latter case they will have "
                "zeros for statistics, though their statistics will still contribute to their "
                "parent calling module.\n" + ", ".join(uncalled))

    def _has_forward(self, name: str) -> bool:
        """Whether a module has a forward of its own (containers and Identity are not
        expected to be called)."""
        module = self._named_modules.get(name)
        if module is None:
            return False
        forward = type(module).forward
        return not any(forward is kind.forward for kind in
                       (nn.ModuleList, nn.ModuleDict, nn.Module, nn.Identity))


def _handle_formula(kind: str, overload, handle: Handle, names: Dict[str, Any],
                    errors: List[BaseException]):
    """A handle as a figure formula for ``overload``: fed jit-like values of the call. The
    names a handle reports go to ``names`` (a Counter's shares of its sum); what it raises, or
    a figure that is not a number, to ``errors``, raised by the query as fvcore raises it."""

    def handle_figure(*args, out_shape, **kwargs) -> float:
        try:
            values = _schema_values(overload, args, kwargs)
            if kind == CONVOLUTION:
                values = _as_convolution(overload._schema.name.split("::")[-1], values)
            result: Any = handle([_Value(v) for v in values], _outputs(out_shape))
            if isinstance(result, Mapping):
                shares = Counter({name: _number(kind, v) for name, v in result.items()})
                total = sum(shares.values())
                known = names.get(kind)
                if known is not None and total and not _same_shares(known, shares, total):
                    raise ValueError(f"the handle for {kind} returned {dict(result)}: its "
                                     f"names' shares differ from call to call "
                                     f"({dict(known)} before); the drop-in keeps one split "
                                     f"a kind")
                if known is None and (total or len(shares) == 1):
                    names[kind] = Counter({n: v / total if total else 1.0
                                           for n, v in shares.items()})
                return total
            return _number(kind, result)
        except BaseException as error:
            errors.append(error)
            raise

    return handle_figure


def _number(kind: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"Invalid type {type(value)} for the flop count of {kind}! A handle "
                         f"returns a number or a Counter of numbers.")
    return float(value)


def _same_shares(known: Counter, shares: Counter, total: float) -> bool:
    return set(known) == set(shares) and all(
        abs(known[n] - shares[n] / total) <= 1e-9 for n in shares)


class FlopCountAnalysis(JitModelAnalysis):
    """fvcore's ``FlopCountAnalysis``: MACs (fvcore's "flops") per module and per op, with
    fvcore's default handles.

    >>> flops = FlopCountAnalysis(model, (x,))
    >>> flops.total(), flops.by_operator()["conv"], flops.by_module()["layer1"]
    >>> flops.set_op_handle("aten::batch_norm", None)  # leave batch norms out, as in fvcore
    """

    _count_unhandled_contractions = True

    def __init__(self, model: nn.Module, inputs: Union[Tensor, Tuple[Any, ...]]) -> None:
        super().__init__(model=model, inputs=inputs)
        self.set_op_handle(**_DEFAULT_SUPPORTED_OPS)


class ActivationCountAnalysis(JitModelAnalysis):
    """fvcore's ``ActivationCountAnalysis``: output elements of the convolutions and
    matrix products, per module."""

    def __init__(self, model: nn.Module, inputs: Union[Tensor, Tuple[Any, ...]]) -> None:
        super().__init__(model=model, inputs=inputs)
        self.set_op_handle(**_DEFAULT_ACTIVATION_OPS)


def flop_count(model: nn.Module, inputs: Tuple[Any, ...],
               supported_ops: Optional[Dict[str, Handle]] = None
               ) -> Tuple[typing.DefaultDict[str, float], typing.Counter[str]]:
    """fvcore's ``flop_count``: ``({op: G "flops" (GMACs)}, {unsupported op: calls})``."""
    counter = FlopCountAnalysis(model, inputs).set_op_handle(**(supported_ops or {}))
    giga = defaultdict(float)
    for op, flops in counter.by_operator().items():
        giga[op] = flops / 1e9
    return giga, counter.unsupported_ops()


def activation_count(model: nn.Module, inputs: Tuple[Any, ...],
                     supported_ops: Optional[Dict[str, Handle]] = None
                     ) -> Tuple[typing.DefaultDict[str, float], typing.Counter[str]]:
    """fvcore's ``activation_count``: ``({op: M activations}, {unsupported op: calls})``."""
    counter = ActivationCountAnalysis(model, inputs).set_op_handle(**(supported_ops or {}))
    mega = defaultdict(float)
    for op, count in counter.by_operator().items():
        mega[op] = count / 1e6
    return mega, counter.unsupported_ops()


# -- printing --------------------------------------------------------------------------------
def parameter_count(model: nn.Module) -> typing.DefaultDict[str, int]:
    """Parameters under every name prefix (``""`` is the whole model)."""
    counts: typing.DefaultDict[str, int] = defaultdict(int)
    for name, parameter in model.named_parameters():
        parts = name.split(".")
        for k in range(len(parts) + 1):
            counts[".".join(parts[:k])] += parameter.numel()
    return counts


def _pipe_table(rows: List[List[str]], headers: List[str]) -> str:
    """A Markdown pipe table, left-aligned, cells' leading spaces kept (the indentation)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: List[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    rule = "|" + "|".join(":" + "-" * (w + 1) for w in widths) + "|"
    return "\n".join([line(headers), rule] + [line(r) for r in rows])


def parameter_count_table(model: nn.Module, max_depth: int = 3) -> str:
    """fvcore's table of parameters per module, to ``max_depth``, shapes for parameters."""
    counts = parameter_count(model)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}

    def size(x: int) -> str:
        for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
            if x > scale / 10:
                return f"{x / scale:.1f}{suffix}"
        return str(x)

    rows = [["model", size(counts.get("", 0))]]

    def fill(level: int, prefix: str) -> None:
        if level >= max_depth:
            return
        for name, value in counts.items():
            if name and name.count(".") == level and name.startswith(prefix):
                indent = " " * (level + 1)
                if name in shapes:
                    rows.append([indent + name, indent + str(shapes[name])])
                else:
                    rows.append([indent + name, indent + size(value)])
                    fill(level + 1, name + ".")

    fill(0, "")
    return _pipe_table(rows, ["name", "#elements or shape"])


def _format_size(x: int, sig_figs: int = 3, hide_zero: bool = False) -> str:
    """fvcore's number style: ``sig_figs`` decimals of K/M/G/T/P, trailing zeros dropped."""
    if hide_zero and x == 0:
        return ""

    def fmt(value: float) -> str:
        return f"{value:.{sig_figs}f}".rstrip("0").rstrip(".")

    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) > scale / 10:
            return fmt(x / scale) + suffix
    return fmt(x)


def _pretty_statistics(statistics: Dict[str, Dict[str, int]], sig_figs: int = 3,
                       hide_zero: bool = False) -> Dict[str, Dict[str, str]]:
    return {module: {name: _format_size(value, sig_figs, hide_zero)
                     for name, value in stats.items()}
            for module, stats in statistics.items()}


def _group_by_module(statistics: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    grouped: Dict[str, Dict[str, Any]] = defaultdict(dict)
    for stat, per_module in statistics.items():
        for module, value in per_module.items():
            grouped[module][stat] = value
    return dict(grouped)


def _indicate_uncalled_modules(statistics: Dict[str, Dict[str, str]], stat_name: str,
                               uncalled_modules: Set[str], uncalled_indicator: str = "N/A"
                               ) -> Dict[str, Dict[str, str]]:
    out = {module: dict(stats) for module, stats in statistics.items()}
    for module in uncalled_modules:
        out.setdefault(module, {})[stat_name] = uncalled_indicator
    return out


def _children(name: str, names) -> List[str]:
    prefix = name + ("." if name else "")
    return [m for m in names if m and m.count(".") == prefix.count(".") and m.startswith(prefix)]


def _remove_zero_statistics(statistics: Dict[str, Dict[str, int]],
                            force_keep: Optional[Set[str]] = None,
                            require_trivial_children: bool = False) -> Dict[str, Dict[str, int]]:
    """Modules whose statistics are all zero left out (the root, ``force_keep`` and, with
    ``require_trivial_children``, parents of kept modules stay)."""
    keep = force_keep if force_keep else {""}
    out: Dict[str, Dict[str, int]] = {}

    def visit(name: str) -> None:
        trivial_children = True
        for child in _children(name, statistics):
            visit(child)
            trivial_children &= child not in out
        if (any(value != 0 for value in statistics[name].values()) or name in keep
                or (require_trivial_children and not trivial_children)):
            out[name] = dict(statistics[name])

    visit("")
    return out


def _fill_missing_statistics(model: nn.Module, statistics: Dict[str, Dict[str, int]]
                             ) -> Dict[str, Dict[str, int]]:
    out = {name: dict(stat) for name, stat in statistics.items()}
    for module_name, _ in model.named_modules():
        for stat in out.values():
            stat.setdefault(module_name, 0)
    return out


def _model_stats_str(model: nn.Module, statistics: Dict[str, Dict[str, str]]) -> str:
    """``str(model)`` with each module's statistics as an extra line."""

    def indent(text: str) -> str:
        first, *rest = text.split("\n")
        return "\n".join([first] + ["  " + line for line in rest])

    def describe(module: nn.Module, name: str) -> str:
        extra = module.extra_repr().split("\n") if module.extra_repr() else []
        stats = ", ".join(f"{k}: {v}" for k, v in statistics.get(name, {}).items())
        if stats:
            extra.append(stats)
        children = [f"({key}): " + indent(describe(sub, name + ("." if name else "") + key))
                    for key, sub in module._modules.items() if sub is not None]
        text = module._get_name() + "("
        if len(extra) == 1 and not children:
            text += extra[0]
        elif extra or children:
            text += "\n  " + "\n  ".join(extra + children) + "\n"
        return text + ")"

    return describe(model, "")


def _fastforward(name: str, statistics: Dict[str, Dict[str, str]]) -> Tuple[str, Dict[str, str]]:
    """Walk down single children whose statistics agree with their parent's (wrappers), so
    the table shows one row for the chain."""
    children = _children(name, statistics)
    if len(children) != 1:
        return name, statistics[name]
    child = children[0]
    parent_stats, child_stats = statistics[name], statistics[child]
    if set(parent_stats) != set(child_stats) or any(
            parent_stats[k] != child_stats[k] and parent_stats[k] and child_stats[k]
            for k in parent_stats):
        return name, parent_stats
    statistics[child] = {k: parent_stats[k] or child_stats[k] for k in parent_stats}
    return _fastforward(child, statistics)


def _model_stats_table(statistics: Dict[str, Dict[str, str]], max_depth: int = 3,
                       stat_columns: Optional[List[str]] = None) -> str:
    if stat_columns is None:
        stat_columns = sorted({k for stats in statistics.values() for k in stats})
    rows: List[List[str]] = []

    def row(name: str, stats: Dict[str, str], level: int) -> List[str]:
        pad = " " * level
        return [pad + name] + [pad + stats[c] if c in stats else "" for c in stat_columns]

    root, root_stats = _fastforward("", statistics)
    rows.append(row(root or "model", root_stats, 0))
    root_prefix = root + ("." if root else "")

    def fill(level: int, prefix: str) -> None:
        if level > max_depth:
            return
        for name in _children(prefix[:-1] if prefix else "", statistics):
            name, stats = _fastforward(name, statistics)
            wrapped = root_prefix and name.startswith(root_prefix)
            shown = name[len(root_prefix):] if wrapped else name
            rows.append(row(shown, stats, level))
            fill(level + 1, name + ".")

    fill(1, root_prefix)
    return _pipe_table(rows, ["module"] + list(stat_columns))


def _module_statistics(flops: JitModelAnalysis, activations: Optional[JitModelAnalysis],
                       params_header: str, acts_header: str) -> Dict[str, Dict[str, int]]:
    for analysis in (flops, activations):
        if analysis is not None:
            analysis.unsupported_ops_warnings(False)
            analysis.uncalled_modules_warnings(False)
            analysis.tracer_warnings("none")
    stats: Dict[str, Dict[str, int]] = {params_header: dict(parameter_count(flops._model)),
                                        "#flops": dict(flops.by_module())}
    if activations is not None:
        stats[acts_header] = dict(activations.by_module())
    return stats


def flop_count_table(flops: FlopCountAnalysis, max_depth: int = 3,
                     activations: Optional[ActivationCountAnalysis] = None,
                     show_param_shapes: bool = True) -> str:
    """fvcore's table of parameters and "flops" (MACs) per module, to ``max_depth``."""
    params_header = "#parameters" + (" or shape" if show_param_shapes else "")
    acts_header = "#activations"
    model = flops._model
    stats = _group_by_module(_module_statistics(flops, activations, params_header, acts_header))
    stats = _remove_zero_statistics(stats, require_trivial_children=True)
    pretty = _pretty_statistics(stats, hide_zero=False)
    pretty = _indicate_uncalled_modules(pretty, "#flops", flops.uncalled_modules() & pretty.keys(),
                                        uncalled_indicator="")
    if activations is not None:
        pretty = _indicate_uncalled_modules(pretty, acts_header,
                                            activations.uncalled_modules() & pretty.keys(),
                                            uncalled_indicator="")
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for name in [m for m in pretty if m in shapes]:
        if show_param_shapes:
            pretty[name][params_header] = str(shapes[name])
        else:
            del pretty[name]
    columns = [params_header, "#flops"] + ([acts_header] if activations is not None else [])
    return _model_stats_table(pretty, max_depth=max_depth, stat_columns=columns)


def flop_count_str(flops: FlopCountAnalysis,
                   activations: Optional[ActivationCountAnalysis] = None) -> str:
    """fvcore's ``str(model)`` with each module's parameters and "flops" (MACs)."""
    model = flops._model
    stats = _module_statistics(flops, activations, "#params", "#acts")
    uncalled = flops.uncalled_modules() | (
        activations.uncalled_modules() if activations is not None else set())
    grouped = _group_by_module(_fill_missing_statistics(model, stats))
    grouped = _remove_zero_statistics(grouped, force_keep=uncalled)
    pretty = _pretty_statistics(grouped, sig_figs=2)
    pretty = _indicate_uncalled_modules(pretty, "#flops", flops.uncalled_modules())
    if activations is not None:
        pretty = _indicate_uncalled_modules(pretty, "#acts", activations.uncalled_modules())
    header = ""
    if uncalled:
        header = ("N/A indicates a possibly missing statistic due to how the module was "
                  "called. Missing values are still included in the parent's total.\n")
    return header + _model_stats_str(model, pretty)


__all__ = [
    "ActivationCountAnalysis", "FlopCountAnalysis", "Handle", "JitModelAnalysis",
    "activation_count", "addmm_flop_jit", "batchnorm_flop_jit", "bmm_flop_jit",
    "conv_flop_jit", "einsum_flop_jit", "elementwise_flop_counter", "flop_count",
    "flop_count_str", "flop_count_table", "generic_activation_jit", "get_shape",
    "linear_flop_jit", "matmul_flop_jit", "norm_flop_counter", "parameter_count",
    "parameter_count_table",
]
