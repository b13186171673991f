"""What the peer drop-ins (``fvcore``, ``thop``, ``ptflops``, ``calflops``) share: a registry
holding one peer's pricing conventions on top of this package's formulas, and one way to run a
model's forward under a counter built on it.

A peer prices some ops by a convention of its own (thop: a batch norm is 2 flops an element,
4 with an affine; ptflops: a ReLU is one MAC an element). A ``PeerRegistry`` holds those ops'
formulas; every other op is priced by ``REGISTRY``. Within a peer registry, ``Cost.macs`` is the
peer's figure for the op, whatever the peer calls it (fvcore "flops", thop and ptflops "MACs"):
a contraction keeps this package's MACs, a convention op gets the peer's number. The counters
built on it are private to the drop-ins, so that reading never meets a user's views.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Optional

import torch
from torch import nn

from dispatch_flops.counter import FlopCounter
from dispatch_flops.formulas import REGISTRY, Category, Cost, Entry, Registry
from dispatch_flops.workflows.untouched import Untouched, composites_whole


class PeerRegistry(Registry):
    """A peer's conventions, and ``base``'s formulas for every op they leave out.

    >>> conventions = PeerRegistry()
    >>> conventions.figure(torch.ops.aten.relu, lambda x, *, out_shape: numel(out_shape))
    >>> with FlopCounter(model, registry=conventions) as fc:
    ...     model(x)
    >>> fc.total.macs  # the peer's figure
    """

    def __init__(self, base: Registry = REGISTRY):
        super().__init__()
        self.base = base

    def lookup(self, op) -> Entry:
        entry = super().lookup(op)
        return self.base.lookup(op) if entry.category is Category.UNSUPPORTED else entry

    def figure(self, ops, fn: Callable[..., float]) -> None:
        """Price ``ops`` (packets, overloads, or a list) at ``fn(*args, out_shape=..., **kwargs)``,
        the peer's figure for one call (rounded to an int)."""

        def formula(*args, out_shape, **kwargs) -> Cost:
            value = int(round(fn(*args, out_shape=out_shape, **kwargs)))
            return Cost(2 * value, value)

        formula.__name__ = getattr(fn, "__name__", "figure")
        self.formula(ops, override=True)(formula)


def numel(shape) -> int:
    """Elements of a tensor of ``shape`` (a ``torch.Size``); 0 for None."""
    return math.prod(shape) if shape is not None else 0


def run_forward(model: nn.Module, call: Callable[[], Any], registry: Optional[Registry], *,
                inputs: Any = (), rules: Optional["ModuleRules"] = None, inference: bool = True,
                eval_mode: bool = True, grad: bool = False) -> FlopCounter:
    """Count ``call()`` (the model's forward, and its backward with ``grad``) under a counter
    on ``registry``, as the peers run it: in eval mode (``eval_mode``), without grad unless
    ``grad``, and with composite ops seen whole when ``inference`` (``aten.linear``,
    ``aten.batch_norm``: the level jit traces and module hooks see; no inference tensor is
    made). ``rules`` (a peer's module rules) are installed around the call. The model and
    the leaf tensors of ``inputs`` are given back as they were found (``Untouched``: train
    flags, hooks, attributes, buffers, gradients, RNG), whatever ends the call.

    torch's fused module fast paths (``nn.MultiheadAttention``'s
    ``_native_multi_head_attention``, ``nn.TransformerEncoderLayer``'s
    ``_transformer_encoder_layer_fwd``, ``nn.TransformerEncoder``'s nested-tensor path) are
    switched off for the call: the peers never take them (fvcore traces, thop, ptflops and
    calflops run with grad on), so their modules run as their parts (``linear1``,
    ``norm1``, ``self_attn``), priced by the peer's conventions and charged to those
    submodules, as each peer sees them."""
    with Untouched(model, inputs), slow_paths():
        if eval_mode:
            model.eval()
        if grad:
            modes: Any = torch.enable_grad()
        else:
            modes = composites_whole() if inference else torch.no_grad()
        with rules if rules is not None else contextlib.nullcontext(), modes, \
                FlopCounter(model, registry=registry) as counter:
            call()
    return counter


@contextlib.contextmanager
def slow_paths():
    """torch's fused module fast paths off for the block (one switch, ``torch.backends.mha``,
    gates all three), the previous setting restored after."""
    backend = getattr(torch.backends, "mha", None)
    if backend is None or not hasattr(backend, "set_fastpath_enabled"):
        yield
        return
    before = backend.get_fastpath_enabled()
    backend.set_fastpath_enabled(False)
    try:
        yield
    finally:
        backend.set_fastpath_enabled(before)


def annotated_repr(model: nn.Module, items: Callable[[nn.Module, str], list]) -> str:
    """``print(model)``'s tree with each module's figures inside its parentheses (``items``:
    the texts for a module and its dotted name, before its ``extra_repr()``), as ptflops'
    and calflops' detailed printouts show it."""

    def describe(module: nn.Module, name: str) -> str:
        texts = list(items(module, name))
        if module.extra_repr():
            texts.append(module.extra_repr())
        children = [f"({key}): " + describe(sub, name + ("." if name else "") + key)
                    .replace("\n", "\n  ")
                    for key, sub in module._modules.items() if sub is not None]
        joined = ", ".join(texts)
        if not children:
            return f"{module._get_name()}({joined})"
        return module._get_name() + "(\n  " + "\n  ".join(([joined] if joined else []) +
                                                          children) + "\n)"

    return describe(model, "")


def parameters_of(model: nn.Module) -> int:
    """Every parameter of ``model``, shared ones once (thop 2.x's figure; ptflops and
    calflops count the trainable ones)."""
    return sum(p.numel() for p in model.parameters())


class ModuleRules:
    """A peer's rules for module types (thop's ``custom_ops``, ptflops'
    ``custom_modules_hooks``): ``rule(module, inputs, output)`` adds the module's figure to
    ``module.<attribute>``, as the peer's rules do. A ruled module's figure replaces what the
    engine counted inside it (an outer ruled module's, those of ruled modules inside it).

    >>> with ModuleRules(model, {MyBlock: my_rule}, "total_ops") as rules:
    ...     counter = run_forward(model, lambda: model(x), registry)
    >>> rules.figure(counter)
    """

    def __init__(self, model: nn.Module, rules: dict, attribute: str, start: Any = 0,
                 root_adds: bool = False):
        for kind, rule in rules.items():
            if not isinstance(kind, type) or not callable(rule):
                raise TypeError(f"module rules map nn.Module classes to rule(module, inputs, "
                                f"output), got {kind!r}: {rule!r}")
        self.model, self.rules, self.attribute, self.start = model, rules, attribute, start
        # thop 0.1.1 adds a rule on the model's own class to its children's counts (its
        # ``dfs_count`` starts from the root's ``total_ops``); ptflops replaces there too
        self.root_adds = root_adds
        self.modules: dict = {}  # name -> ruled module (first name of a shared one)
        self.values: dict = {}  # id(module) -> its figure, read on exit
        self._hooks: list = []
        self._displaced: list = []

    def rule_of(self, module: nn.Module) -> Optional[Callable]:
        """The rule of the first class in ``module``'s MRO that has one."""
        for kind in type(module).__mro__:
            if kind in self.rules:
                return self.rules[kind]
        return None

    def __enter__(self) -> "ModuleRules":
        for name, module in self.model.named_modules():
            rule = self.rule_of(module)
            if rule is None:
                continue
            if self.attribute in module.__dict__:
                self._displaced.append((module, module.__dict__[self.attribute]))
            module.__dict__[self.attribute] = self.start() if callable(self.start) else self.start
            self.modules[name] = module
            self._hooks.append(module.register_forward_hook(_rule_hook(rule)))
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        for module in self.modules.values():
            self.values[id(module)] = float(module.__dict__.pop(self.attribute, 0))
        for module, value in self._displaced:
            module.__dict__[self.attribute] = value

    def outermost(self) -> list:
        """Names of ruled modules not inside another ruled module."""
        names = sorted(n for n in self.modules if n or not self.root_adds)
        # the root ("") holds every other name: unless it adds, its rule replaces them all
        return [n for n in names
                if not any(o == "" or n.startswith(o + ".") for o in names if o != n)]

    def covers(self, stack) -> bool:
        """Whether a record with this module stack ran inside a ruled module."""
        return any(name in self.modules for name in stack if name or not self.root_adds)

    def ruled(self, inside: str = "") -> float:
        """The outermost ruled modules' figures, of those in module ``inside`` (all by
        default)."""
        prefix = inside + "." if inside else ""
        root = self.values.get(id(self.modules[""]), 0.0) if (
            self.root_adds and not inside and "" in self.modules) else 0.0
        return root + sum(self.values.get(id(self.modules[name]), 0.0)
                          for name in self.outermost()
                          if not inside or name == inside or name.startswith(prefix))

    def figure(self, counter: FlopCounter, inside: str = "") -> float:
        """The peer's figure for module ``inside`` (the root by default): the engine's records
        outside ruled modules plus the outermost ruled modules' own figures."""
        return float(sum(r.stats.macs for r in counter.records()
                         if inside in r.stack and not self.covers(r.stack))) + self.ruled(inside)

def _rule_hook(rule: Callable):
    def hook(module, inputs, output) -> None:  # a rule's return value is never the output
        rule(module, inputs, output)

    return hook
