"""Facts about a model's modules and parameters kept from one counter to the next: a training
loop enters a fresh ``FlopCounter(model)`` every step, and working out the model's parameter
groups, expert layers, per-module parameter counts and whether it holds DTensor parameters on
every entry and read was most of what a counter cost with no op run at all (issue 42).

A model's facts are kept while its module tree and parameters are the same objects under the
same names: every entry walks the tree anyway (``tracker.walk_modules``, the source of truth),
and checks the walk's names, its modules and their parameters against those the facts were
worked out for. Identity is compared through weak references (a module or parameter freed and
another made at its address is a new object: its reference is a new one, and a dead
reference equals only itself), so the cache keeps nothing alive. A module added, removed,
replaced or renamed, or a parameter replaced or registered, makes new facts; a parameter
whose ``.data`` is swapped for one of another shape in place, or a module whose attributes
change, is not seen (the parameter counts read them).

>>> facts = facts_of(model, modules, names)
>>> facts.get("experts", lambda: expert_layers(names, modules))
"""

from __future__ import annotations

import sys
import weakref
from itertools import chain
from operator import attrgetter, is_
from typing import Any, Callable

from torch import nn

_parameters = attrgetter("_parameters")
_ref = weakref.ref

# model -> its facts; a model's entry goes with it
_FACTS: "weakref.WeakKeyDictionary[nn.Module, ModelFacts]" = weakref.WeakKeyDictionary()


def parameter_refs(modules) -> tuple:
    """Weak references to the parameters ``modules`` hold, in their order (shared ones as
    often as they are held); C-level iteration: it runs on every counter's entry."""
    held = chain.from_iterable(map(dict.values, map(_parameters, modules)))
    return tuple(map(_ref, [p for p in held if p is not None]))


class ModelFacts:
    """What has been worked out about one state of a model (names, modules, parameters):
    ``get(key, compute)`` computes each fact once, when first asked for."""

    __slots__ = ("names", "modules", "params", "values")

    def __init__(self, names: tuple, modules: tuple, params: tuple):
        self.names = names
        self.modules = modules  # weak references, in walk order
        self.params = params  # weak references (parameter_refs)
        self.values: dict[str, Any] = {}

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        values = self.values
        if key in values:
            return values[key]
        value = values[key] = compute()
        return value


def facts_of(model: nn.Module, modules, names: tuple) -> ModelFacts:
    """The facts of ``model`` as walked now (``modules`` named ``names``, from
    ``walk_modules``): those kept from an earlier counter while nothing they depend on has
    changed, else new ones."""
    refs = tuple(map(_ref, modules))
    params = parameter_refs(modules)
    facts = _FACTS.get(model)
    if facts is None or not (_same(facts.modules, refs) and _same(facts.params, params)
                             and facts.names == names):
        facts = _FACTS[model] = ModelFacts(names, refs, params)
    return facts


def _same(kept: tuple, now: tuple) -> bool:
    # by identity of the references, never ``==``: two live references compare their objects,
    # and two parameters' ``==`` is a tensor. A live object's reference is the same object
    # every time (``weakref.ref`` without a callback is shared); a dead one's is never reused
    return len(kept) == len(now) and all(map(is_, kept, now))


def holds_dtensor(modules) -> bool:
    """Whether any of ``modules`` holds a DTensor parameter (tensor parallelism, FSDP2); none
    can while ``torch.distributed.tensor`` was never imported."""
    tensor = sys.modules.get("torch.distributed.tensor")
    if tensor is None:
        return False
    dtensor = tensor.DTensor
    # by class: isinstance on a tensor subclass runs the metaclass's check (slow)
    classes = {type(p) for p in chain.from_iterable(map(dict.values, map(_parameters, modules)))}
    return any(issubclass(c, dtensor) for c in classes)
