"""Optimizer steps counted in full until they repeat, then replayed from what they counted.

An optimizer step on the CPU runs about a dozen aten ops per parameter (AdamW, one tensor at a
time): on a small model, more than half a training step's ops. Built-in optimizers run the
same ops, with the same arguments' shapes, every step whose parameters, gradients, state and
hyperparameters look the same: what a step counts is a function of ``step_key``. So a step is
counted in full and what it added (each record's calls) kept, per optimizer; once two steps
with the same key added the same, the next ones with that key are *replayed*: the mode runs
each op and counts only its overload (one dict update, no signature), and the step's end
adds the kept counts. If the overloads counted differ from the kept step's (a branch on a
value the key does not hold), the kept counts are added with a warning, and that optimizer's
steps are counted in full from then on.

Left to full counting: timed counters, meta and guarded (generator) counters, DTensor or other
tensor-subclass parameters, sparse gradients, a step run with a closure (LBFGS), a step nested
in another, optimizers outside ``REPLAYED`` (their code may branch on values: RAdam on the step
number, ASGD on a state value), ``differentiable=True``, an optimizer with step hooks of its
own or global step hooks other than counters' (their ops would run inside the step), and
any step whose ops made records that read masks or went elsewhere than the step's own
accumulator.
A replayed step that raises counts none of its ops (a step counted in full counts those run).
A step that runs a compiled graph (``torch.compile`` of the step) is not learned: the graph adds
its counts itself.

``ENABLED = False`` counts every step in full.
"""

from __future__ import annotations

import warnings
import weakref
from collections import Counter
from typing import Optional

import torch
from torch import Tensor

from dispatch_flops.engine.counting.calls import FLOAT, TOLD_APART
from dispatch_flops.engine.counting.records import CALLS, SIGNATURE
from dispatch_flops.engine.counting.steps import OptimizerSteps
from dispatch_flops.engine.masks.tally import TALLY
from dispatch_flops.engine.torch_private import lookup

ENABLED = True

# torch's optimizers whose ops are a function of the key (no branch on a tensor's value or
# the step number): the step's own class, looked up by identity
REPLAYED = frozenset(
    cls for cls in (getattr(torch.optim, name, None) for name in (
        "SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adamax", "NAdam", "Adadelta"))
    if cls is not None)

_PARAMETER = torch.nn.Parameter
_STRIDED = torch.strided
_TENSOR = object()  # in a key: a tensor's shape and dtype follow
_SCALARS = (int, bool, str, type(None))

# hooks that run between a counter's step hooks (registered after its pre-hook, before its
# post-hook): their ops would be replayed as the step's
_GLOBAL_HOOKS = ("torch.optim.optimizer._global_optimizer_pre_hooks",
                 "torch.optim.optimizer._global_optimizer_post_hooks")

_DIFFERENT = (
    "dispatch_flops: {name}.step() ran other ops than the steps its counts were learned from "
    "({diff}); this step is counted as those were, and its steps are counted in full from "
    "now on")
_COMPILED = (
    "dispatch_flops: {name}.step() ran a compiled graph where its steps so far ran eagerly: "
    "the graph's counts are added, its other ops this step are not; its steps are counted in "
    "full from now on")


class Learned:
    """What one optimizer's step added to the counts, for the steps with ``key``:
    ``totals`` ((signature key, calls, Signature) per record), ``funcs`` (calls per
    overload id), ``confirmed`` once a second step with the same key added the same."""

    __slots__ = ("key", "totals", "funcs", "confirmed", "off")

    def __init__(self, key: tuple, totals: tuple):
        self.key = key
        self.totals = totals
        funcs: Counter = Counter()
        for sig, calls, _ in totals:
            funcs[sig if sig.__class__ is int else sig[0]] += calls
        self.funcs = dict(funcs)
        self.confirmed = False
        self.off = False  # a replay met other ops: this optimizer is counted in full


def _value_key(v):
    """A hashable stand-in for a hyperparameter or state value: what the step's ops can
    depend on. Floats as the signature keys them (``TOLD_APART`` values themselves, others one
    marker: a learning-rate schedule changes them every step), tensors by their metadata."""
    cls = v.__class__
    if cls is float:
        return v if v in TOLD_APART else FLOAT
    if cls in _SCALARS:
        return v
    if cls is tuple or cls is list:
        return tuple([_value_key(x) for x in v])
    if cls is Tensor or cls is _PARAMETER:  # the device is the parameter's (see step_key)
        return (_TENSOR, v.shape, v.dtype)
    return cls


def _state_key(kept: dict) -> tuple:
    """A parameter's optimizer state as its step's ops see it: each entry's name and, for a
    tensor, its dtype (a built-in optimizer makes its state tensors like the parameter, and
    ``load_state_dict`` casts them to it: their shape and device are the parameter's, keyed
    once; the step count's scalar tensor is a float32 where ``capturable``, in the key, does
    not put it on the device); a number by ``_value_key``. Read at every step: kept cheap."""
    key: list = []
    for name, value in kept.items():
        key.append(name)
        key.append(value.dtype if value.__class__ is Tensor else _value_key(value))
    return tuple(key)


def _only_counters_hook(optimizer) -> bool:
    """Whether every step hook that runs while a counter replays is a counter's: a hook of
    the user's may run other ops at each step. This optimizer's own hooks all run inside
    the counter's window (torch runs its pre-hooks after the global ones, its post-hooks
    before them), a global one may."""
    if getattr(optimizer, "_optimizer_step_pre_hooks", None) or \
            getattr(optimizer, "_optimizer_step_post_hooks", None):
        return False
    for name in _GLOBAL_HOOKS:
        hooks = lookup(name)
        for hook in (hooks or {}).values():
            if not isinstance(getattr(hook, "__self__", None), OptimizerSteps):
                return False
    return True


def step_key(optimizer) -> Optional[tuple]:
    """What a step of ``optimizer`` runs depends on, as a hashable; None when its steps are
    counted in full (see the module's docstring)."""
    cls = type(optimizer)
    if cls not in REPLAYED or not _only_counters_hook(optimizer):
        return None
    parts: list = [cls]
    state = optimizer.state
    for group in optimizer.param_groups:
        if group.get("differentiable"):
            return None
        hyper = []
        for name, value in group.items():
            if name != "params":
                hyper.append(name)
                hyper.append(_value_key(value))
        parts.append(tuple(hyper))
        for p in group["params"]:
            if p.__class__ is not _PARAMETER and p.__class__ is not Tensor:
                return None  # a tensor subclass (DTensor): its own dispatch
            grad = p.grad
            if grad is None:
                parts.append(None)
                continue
            if grad.__class__ is not Tensor or grad.layout is not _STRIDED:
                return None
            kept = state.get(p)
            # the parameter's device too (torch picks the foreach or fused path by it): its
            # gradient's is the same, and its state's is set by the flags keyed above
            # (capturable, fused) and follows the parameter when the state is loaded
            parts.append((p.shape, p.dtype, p.device, p.is_contiguous(), grad.shape,
                          grad.dtype, grad.is_contiguous(),
                          _state_key(kept) if kept else None))
    return tuple(parts)


class StepReplay:
    """One counter's view of its optimizer steps: ``begin`` at a step's pre-hook, ``end`` at
    its post-hook, ``abort`` when it ended without one. What is learned is kept in the
    engine cache (``cache.steps``: {optimizer, weakly: Learned}), shared by every counter on
    the same registry version: a registration prices signatures anew."""

    __slots__ = ("tracker", "state", "learned", "resolutions", "step", "key", "acc", "before",
                 "graph_calls", "replaying")

    def __init__(self, tracker, cache):
        # its mode replays only while it runs ops itself, untimed; weakly: the tracker keeps
        # this, and a cycle would keep the model alive until the cyclic collector ran
        self.tracker = weakref.ref(tracker)
        self.state = tracker.state
        self.learned: weakref.WeakKeyDictionary = cache.steps
        self.resolutions: dict = cache.resolutions  # to name overloads in a warning
        self.step = None  # the optimizer whose step is being learned or replayed
        self.key: Optional[tuple] = None
        self.acc: Optional[dict] = None  # the accumulator the step counts into
        self.before: Optional[dict] = None  # learning: each record's calls before the step
        self.graph_calls = 0  # the tracker's compiled graph calls when the step began
        self.replaying: Optional[Learned] = None

    def begin(self, optimizer) -> None:
        """A step of ``optimizer`` starts (the outermost, with no closure, on a counter that
        may replay): replay it if its key's counts are known, else note the counts before."""
        tracker = self.tracker()
        if tracker is None or not ENABLED or tracker.mode.runner is not None or \
                tracker.mode.guarded:
            return
        key = step_key(optimizer)
        if key is None:
            return
        state = self.state
        acc = state.forward_acc
        self.step, self.key, self.acc = optimizer, key, acc
        # a compiled graph adds its counts whole, outside the per-op path: a step that runs
        # one is not learned, and a replay that meets one is not added to
        self.graph_calls = tracker.graph_calls
        known = self.learned.get(optimizer)
        if known is not None and known.confirmed and not known.off and known.key == key:
            self.replaying = known
            state.replay = {}  # the mode counts each op's overload here (mode.py)
            return
        self.before = {sig: rec[CALLS] for sig, rec in acc.items()}

    def end(self, optimizer) -> None:
        """The step begun on ``optimizer`` ended (its post-hook ran)."""
        if optimizer is not self.step:
            return
        state = self.state
        acc, learned = self.acc, self.replaying
        assert acc is not None
        tracker = self.tracker()
        graphs = tracker is None or tracker.graph_calls != self.graph_calls
        if learned is not None:
            seen = state.replay
            state.replay = None
            if seen != learned.funcs or graphs:
                learned.off = True
                name = type(optimizer).__name__
                warnings.warn(_COMPILED.format(name=name) if graphs else _DIFFERENT.format(
                    name=name, diff=self._difference(seen or {}, learned.funcs)), stacklevel=3)
            if not graphs:  # the graph added its own counts
                self._add(acc, learned.totals)
        elif self.before is not None and state.forward_acc is acc and not graphs:
            self._learn(optimizer, acc)
        self._forget()

    def abort(self) -> None:
        """The step ended without its post-hook (it raised): a replay counts nothing."""
        self.state.replay = None
        self._forget()

    def _forget(self) -> None:
        self.step = self.key = self.acc = self.before = self.replaying = None
        self.graph_calls = 0

    def _learn(self, optimizer, acc: dict) -> None:
        before = self.before
        assert before is not None and self.key is not None
        totals = []
        for sig, rec in acc.items():
            calls = rec[CALLS] - before.get(sig, 0)
            if calls:
                if len(rec) > TALLY:  # it reads masks: counted in full every time
                    return
                totals.append((sig, calls, rec[SIGNATURE]))
        made = Learned(self.key, tuple(totals))
        known = self.learned.get(optimizer)
        if known is not None and known.off:
            return
        if known is not None and known.key == made.key and \
                _same(known.totals, made.totals):
            known.confirmed = True
        else:
            self.learned[optimizer] = made

    def _difference(self, seen: dict, kept: dict) -> str:
        """The overloads whose calls differ, for the warning (a few, by name)."""
        def name(op: int) -> str:
            resolved = self.resolutions.get(op)
            return str(resolved.func) if resolved is not None else str(op)

        diff = sorted(f"{name(op)} {seen.get(op, 0)} calls, learned {kept.get(op, 0)}"
                      for op in set(seen) | set(kept) if seen.get(op, 0) != kept.get(op, 0))
        return "; ".join(diff[:4]) + ("; ..." if len(diff) > 4 else "")

    def _add(self, acc: dict, totals: tuple) -> None:
        book = self.state.records
        for sig, calls, signature in totals:
            rec = acc.get(sig)
            if rec is None:
                rec = acc[sig] = [0, 0, signature]
                book.append(rec)
            rec[CALLS] += calls


def _same(a: tuple, b: tuple) -> bool:
    """Whether two steps added the same calls to the same records (in any order)."""
    return len(a) == len(b) and {sig: n for sig, n, _ in a} == {sig: n for sig, n, _ in b}


