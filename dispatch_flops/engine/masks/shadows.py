"""Masks built from shapes on meta and fake tensors, their values computed on the CPU
(shadows), and a compiled graph's masks made from its inputs, counted at each run (recipes).

A meta tensor has no values, but a mask built from shapes alone has the values it would have
on any device: the ops that build one are run again on the CPU (``shadow_tally_of`` in
``masks.op_tallies``: asked only for a call whose output is meta). In a compiled graph's
fake run a mask made from the graph's inputs (a padding ``attention_mask`` passed in) is
noted as the ops that make it (``Recipe``), and counted at each run from the run's real inputs
(``InputMasks``, ``InputCount``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from dispatch_flops.engine.masks.eager import EAGER
from dispatch_flops.engine.masks.fake_runs import FAKE_RUNS
from dispatch_flops.engine.masks.tally import (
    Tally,
    causal_keeps,
    has_values,
    masked_entries,
    masked_in,
)
from dispatch_flops.engine.torch_private import FakeTensor as _FAKE
from dispatch_flops.engine.torch_private import disable_current_modes as _disable_current_modes


# -- masks built from shapes on the meta device ----------------------------------------------
# A meta tensor has no values, but a mask built from shapes alone (SDPA's math decomposition
# makes its causal mask with ``ones(...).tril()`` and ``where``; transformers builds causal,
# sliding-window and padding masks from ``arange`` and comparisons) has the values it would
# have on any device. The ops below, met with meta outputs whose tensor inputs are all such
# masks (or plain values), are run again on the CPU: the result is the mask's *shadow*, kept
# while the meta tensor lives (a weak reference) and read where a mask's values are read. A
# scores tensor that adds such a mask to values nobody knows (``q·kᵀ + mask``) keeps the
# mask's shadow for its masked entries only (``MASKING``): the scores are finite, so an
# entry is masked exactly where the mask masks.
class _Shadows:
    """Weak map from a meta tensor to a CPU tensor (its values, or for ``MASKING`` where it
    is masked)."""

    def __init__(self):
        self.kept: dict = {}  # id(meta tensor) -> (weakref, CPU tensor)

    def get(self, t) -> Any:  # a Tensor (a Recipe in ``RECIPES``), or None
        found = self.kept.get(id(t))
        return found[1] if found is not None and found[0]() is t else None

    def put(self, t: Tensor, value: Any) -> None:
        if len(self.kept) >= 4096:
            for key in [k for k, v in self.kept.items() if v[0]() is None]:
                del self.kept[key]
            while len(self.kept) >= 4096:
                del self.kept[next(iter(self.kept))]
        key = id(t)

        def dropped(ref, key=key) -> None:  # the meta tensor is gone: so are its values
            if self.kept.get(key, (None,))[0] is ref:
                del self.kept[key]
        self.kept[key] = (weakref.ref(t, dropped), value)


SHADOWS = _Shadows()
MASKING = _Shadows()
UNVALUED = _Shadows()  # scores that a mask without values was added to
_NO_VALUES = torch.empty(0)  # their entry (a strong reference to the scores would keep them)
# elements (16 MB of float32): a larger mask is left without values, as any meta tensor, so
# that counting a full-size model on meta stays fast and small (a 70 B model's 4,096-token
# causal mask would be 16.7 M elements per layer)
SHADOW_MOST = 1 << 22
_SHADOWED = ("ones", "zeros", "full", "scalar_tensor", "arange", "new_ones", "new_zeros",
             "new_full", "tril", "triu", "where", "le", "lt", "ge", "gt", "eq", "ne",
             "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and",
             "logical_or", "logical_not", "masked_fill", "add", "sub", "mul", "neg",
             "view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "transpose",
             "permute", "slice", "select", "alias", "clone", "_to_copy", "index", "remainder",
             "floor_divide", "abs", "minimum", "maximum", "clamp")
_AS_VIEW = frozenset(("view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze",
                      "transpose", "permute", "slice", "select", "alias"))


# while a compiled graph's fake run is on (engine.graphs.compiled, fake_runs.FAKE_RUNS), its fake
# tensors' masks built from shapes are followed as on meta (a composite priced whole on fake
# tensors keeps the masked share of the kernel its decomposition runs, docs/conventions.md: not
# followed there)


def _valueless(t: Tensor) -> bool:
    """Whether ``t`` is a meta tensor, or a fake one of a compiled graph's fake run: no
    values, and masks built from shapes followed."""
    return t.is_meta or bool(FAKE_RUNS) and isinstance(t, _FAKE)


def _on_cpu(v, found: list):
    """``v`` with each meta tensor replaced by its shadow; ``found[0]`` False if one has none
    (and the meta tensors without one collected in ``found[1]``). In a compiled graph's
    fake run, a fake tensor that is one of the graph's inputs, or made from them
    (``RECIPES``), is replaced by its ``_Input`` or ``Recipe`` (``found[2]`` True)."""
    if isinstance(v, Tensor):
        if not _valueless(v):
            found[0] = found[0] and has_values(v) and v.device.type == "cpu"
            return v
        shadow = SHADOWS.get(v)
        if shadow is None and FAKE_RUNS:
            at = FAKE_RUNS[-1].inputs.get(id(v))
            made = _Input(at) if at is not None else RECIPES.get(v)
            if made is not None:
                found[2] = True
                return made
        if shadow is None:
            found[0] = False
            found[1].append(v)
        return shadow
    if isinstance(v, (list, tuple)):
        return type(v)(_on_cpu(x, found) for x in v)
    if isinstance(v, torch.device) and v.type == "meta":
        return torch.device("cpu")
    return v


def _shadow_tally(func, name: str) -> Callable:
    def tally(rec, args, kwargs, out) -> None:
        if not isinstance(out, Tensor) or not (out.__class__ is Tensor and out.is_meta or
                                               _valueless(out)) or \
                name not in _AS_VIEW and out.numel() > SHADOW_MOST:
            return
        found: list = [True, [], False]
        cpu_args = _on_cpu(args, found)
        cpu_kwargs = {k: _on_cpu(v, found) for k, v in (kwargs or {}).items()}
        if "device" in (kwargs or {}) or not any(isinstance(a, Tensor) for a in args):
            cpu_kwargs["device"] = torch.device("cpu")  # a factory
        if FAKE_RUNS and (found[2] or name == "where"):
            if _recipe(func, name, args, cpu_args, cpu_kwargs, found, out):
                return
        if not found[0]:
            if name in ("add", "sub") and len(found[1]) == 1:
                _masking(args, found[1][0], out)
            elif name in ("add", "sub") and len(found[1]) == 2:
                _unvalued_scores(out)
            return
        try:
            with _disable_current_modes(), torch.no_grad():
                value = func(*cpu_args, **cpu_kwargs)
        except Exception:  # an argument this op takes only on meta: no shadow
            return
        if isinstance(value, Tensor) and value.shape == out.shape:
            SHADOWS.put(out, value)

    return tally


# -- masks made from a compiled graph's inputs ------------------------------------------------
# A padding ``attention_mask`` passed into a compiled model is one of the graph's inputs: its
# fake tensor has no values while the graph is priced, and it changes from run to run. The
# shadowed ops above, met in a fake run with such an input (or what was made from one)
# among their arguments, are noted as a *recipe* instead (``RECIPES``): the op, its arguments
# with each input as its position (``_Input``), masks built from shapes as their CPU values,
# and a value nobody knows that a mask is added to or selected with (T5's position bias,
# ``where(mask, bias, min)``) as zeros (``_Finite``: finite, so an entry is masked exactly
# where the mask masks it, as ``MASKING`` takes scores). An SDPA call whose mask has a recipe
# is counted at each run of the graph (``InputMasks``): the recipe evaluated on the run's
# real inputs, its masked pairs added.
class _Input:
    """The graph's input at position ``at``, in a recipe."""

    __slots__ = ("at",)

    def __init__(self, at: int):
        self.at = at


class _Finite:
    """A value nobody knows, finite (zeros), of ``shape`` and ``dtype``, in a recipe."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


def _inputs_of(v, into: set) -> set:
    if isinstance(v, _Input):
        into.add(v.at)
    elif isinstance(v, Recipe):
        into.update(v.inputs)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _inputs_of(x, into)
    return into


class Recipe:
    """How a tensor of a compiled graph is made from the graph's inputs: ``func`` over
    ``args`` and ``kwargs``, whose inputs, recipes and unknown values are ``_Input``,
    ``Recipe`` and ``_Finite``."""

    __slots__ = ("func", "args", "kwargs", "inputs")

    def __init__(self, func, args, kwargs):
        self.func, self.args, self.kwargs = func, args, kwargs
        found: set = set()
        _inputs_of(args, found)
        _inputs_of(tuple(kwargs.values()), found)
        self.inputs = tuple(sorted(found))

    def value(self, inputs, device, memo: dict) -> Tensor:
        """The tensor this makes from the graph's real ``inputs``, on ``device`` (``memo``:
        the recipes evaluated so far, by id)."""
        done = memo.get(id(self))
        if done is None:
            args = _evaluated(self.args, inputs, device, memo)
            kwargs = {k: device if k == "device" else _evaluated(v, inputs, device, memo)
                      for k, v in self.kwargs.items()}
            done = memo[id(self)] = self.func(*args, **kwargs)
        return done


def _evaluated(v, inputs, device, memo):
    if isinstance(v, _Input):
        return inputs[v.at]
    if isinstance(v, Recipe):
        return v.value(inputs, device, memo)
    if isinstance(v, _Finite):
        return torch.zeros((), dtype=v.dtype, device=device).expand(v.shape)
    if isinstance(v, Tensor):  # a mask built from shapes: its CPU values
        return v if v.device == device else v.to(device)
    if isinstance(v, (list, tuple)):
        return type(v)(_evaluated(x, inputs, device, memo) for x in v)
    return v


RECIPES = _Shadows()  # fake tensor of a fake run -> its Recipe
_FINITE_OPS = ("where", "add", "sub")  # where a value nobody knows may meet a mask


def _recipe(func, name: str, args, cpu_args, cpu_kwargs, found: list, out: Tensor) -> bool:
    """Note ``out``'s recipe (a fake run's op over the graph's inputs, or selecting a value
    nobody knows with a mask built from shapes); whether one was noted."""
    unknown = found[1]
    if unknown:
        # only a float operand nobody knows, next to a mask: never a where's condition
        if name not in _FINITE_OPS or not (found[2] or name == "where") or \
                len(unknown) != 1 or not unknown[0].dtype.is_floating_point or \
                name == "where" and args[0] is unknown[0]:
            return False
        cpu_args = tuple(_Finite(a.shape, a.dtype) if a is unknown[0] else c
                         for a, c in zip(args, cpu_args))
    elif not found[2]:
        return False
    RECIPES.put(out, Recipe(func, cpu_args, cpu_kwargs))
    return True


class _PerRun:
    """A count made from a compiled graph's real inputs at each run (``count``), kept while
    the inputs its recipe reads are the same tensors, unchanged (their versions)."""

    __slots__ = ("recipe", "last")

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.last: Optional[tuple] = None  # (key, weak references, count)

    def of(self, inputs):
        read = [inputs[i] for i in self.recipe.inputs]
        key = tuple((id(t), t._version) if isinstance(t, Tensor) else t for t in read)
        last = self.last
        if last is not None and last[0] == key and \
                all(ref is None or ref() is t for ref, t in zip(last[1], read)):
            return last[2]
        device = next((t.device for t in read if isinstance(t, Tensor)), torch.device("cpu"))
        with _disable_current_modes(), torch.no_grad():
            n = self.count(self.recipe.value(inputs, device, {}), device)
        self.last = (key, [weakref.ref(t) if isinstance(t, Tensor) else None for t in read],
                     n)
        return n

    def count(self, mask: Tensor, device):
        raise NotImplementedError


class InputCount(_PerRun):
    """The masked entries of scores plus a mask made from a compiled graph's inputs (the
    softmax of attention written as plain ops, SDPA's math decomposition), at each run."""

    __slots__ = ()

    def count(self, mask: Tensor, device):
        return masked_entries(mask).sum()


class InputMasks(_PerRun):
    """An SDPA call of a compiled graph whose mask is made from the graph's inputs (a
    ``Recipe``): at each run (forward, or ``backward``), its masked pairs counted from the
    run's real inputs into ``tally``; evaluated again only when an input the recipe reads
    is another tensor or was changed in place (its version)."""

    __slots__ = ("tally", "total", "s_q", "s_k", "causal", "backward")

    def __init__(self, tally: Tally, recipe: Recipe, total: int, s_q: int, s_k: int, causal,
                 backward: bool):
        super().__init__(recipe)
        self.tally, self.total = tally, total
        self.s_q, self.s_k, self.causal, self.backward = s_q, s_k, causal, backward

    def count(self, mask: Tensor, device):
        keeps = causal_keeps(self.s_q, self.s_k, device, self.causal == 2) \
            if self.causal else None
        return masked_in(mask, self.total, keeps)

    def __call__(self, inputs) -> None:
        with _disable_current_modes():  # as math_path._RunCharge: nothing here is the user's op
            self.tally.add(self.of(inputs))


def _masking(args, unknown: Tensor, out: Tensor) -> None:
    """``out = unknown ± mask``: masked where the mask is (finite scores)."""
    for a in args[:2]:
        if isinstance(a, Tensor) and a is not unknown:
            shadow = SHADOWS.get(a) if _valueless(a) else (
                a if has_values(a) else None)
            if shadow is not None and shadow.dtype.is_floating_point:
                try:
                    MASKING.put(out, shadow.expand(out.shape))
                except RuntimeError:
                    pass
            return


def _unvalued_scores(out: Tensor) -> None:
    """``out = scores ± mask``, neither with values, right after the contraction that made as
    many scores: attention over a mask nobody knows (a user's meta padding mask). The softmax
    that reads ``out`` counts the call as unvalued."""
    scores = EAGER.scores
    if scores is not None and scores[1] == out.numel() and scores[2] == out.shape[-1]:
        UNVALUED.put(out, _NO_VALUES)


def _shadow_tallies() -> dict:
    found: dict = {}
    for name in _SHADOWED:
        packet = getattr(torch.ops.aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            if torch.Tag.inplace_view in op.tags or op._schema.name.endswith("_") or \
                    overload.startswith("out"):
                continue
            found[op] = _shadow_tally(op, name)
    return found


# kept apart from the mask tallies (``masks.op_tallies``): view, add, mul... are among the
# commonest ops, and a shadow tally works only when their output is on meta (the mode asks
# that first)
SHADOW_TALLIES = _shadow_tallies()
