"""Module tracker: which modules are running, for forward ops and for the backward ops
their autograd nodes run later.

Forward pre/post hooks keep a stack of module names. At every push and pop the tracker notes
the autograd sequence number (``torch.autograd._get_sequence_nr()``): a node created while
the counter reads ``s`` was created under the stack noted last at or before ``s``. In backward,
``torch._C._current_autograd_node()`` names the running node, so its ops go to the module
whose forward created it, whether or not that module's inputs required grad.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Callable, Optional

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from ._results import ROOT

ACCUMULATE_GRAD_SEQ = 2**64 - 1  # AccumulateGrad nodes carry the largest sequence number


def static_prefixes(name: str) -> list[str]:
    """'a.b.c' -> ['a', 'a.b', 'a.b.c']; the root has none."""
    if name == ROOT:
        return []
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


class ModuleTracker:
    """Maintains the running module stack of ``model`` through hooks it removes on detach.

    >>> tracker = ModuleTracker(model, on_change=print)
    >>> tracker.attach(); model(x); tracker.detach()
    """

    def __init__(self, model: Optional[nn.Module], on_change: Callable[[tuple], None]):
        self.model = model
        self.on_change = on_change
        self.stack: tuple = (ROOT,)
        self.calls: Counter = Counter()
        self.boundary_seqs: list[int] = []
        self._stacks: list[tuple] = []
        self._handles: list = []
        self._param_owner: Optional[dict[int, str]] = None
        self._name_of: dict[int, str] = {}
        self.names: list[str] = []

    # -- lifecycle --------------------------------------------------------------------------
    def attach(self) -> None:
        """Two global module hooks, filtered to the model's modules by identity: one pair of
        registrations however large the model is."""
        if self.model is None:
            return
        for name, module in self.model.named_modules():
            self.names.append(name)
            self._name_of[id(module)] = name
        self._handles.append(register_module_forward_pre_hook(self._push))
        try:
            self._handles.append(register_module_forward_hook(self._pop, always_call=True))
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- hooks ------------------------------------------------------------------------------
    def _set(self, stack: tuple) -> None:
        self.stack = stack
        self.boundary_seqs.append(torch.autograd._get_sequence_nr())
        self._stacks.append(stack)
        self.on_change(stack)

    def _push(self, module, args) -> None:
        name = self._name_of.get(id(module))
        if name is None:  # not one of the model's modules: ops stay with the enclosing one
            return
        self.calls[name] += 1
        if name != ROOT:
            self._set(self.stack + (name,))

    def _pop(self, module, args, output) -> None:
        name = self._name_of.get(id(module))
        if name is None or name == ROOT:
            return
        stack = self.stack
        if stack[-1] != name and name in stack:
            # an inner module left without its hook running (not expected with always_call)
            stack = stack[: len(stack) - stack[::-1].index(name)]
        if stack[-1] == name:
            self._set(stack[:-1])

    # -- backward ---------------------------------------------------------------------------
    def stack_of_node(self, node) -> tuple:
        """The module stack under which an autograd node was created in forward."""
        seq = node._sequence_nr()
        if seq == ACCUMULATE_GRAD_SEQ:
            if self._param_owner is None:  # first gradient accumulation: build the map once
                self._param_owner = {}
                for name, p in self.model.named_parameters() if self.model is not None else ():
                    self._param_owner.setdefault(id(p), name.rpartition(".")[0])
            owner = self._param_owner.get(id(getattr(node, "variable", None)))
            if owner is None:
                return (ROOT,)
            chain = [p for p in static_prefixes(owner)[:-1] if self.calls[p]] + [owner]
            return (ROOT, *chain)
        i = bisect.bisect_right(self.boundary_seqs, seq) - 1
        return self._stacks[i] if i >= 0 else (ROOT,)


    def credited(self, stack: tuple) -> set[str]:
        """Modules whose inclusive totals an op run under ``stack`` counts toward: every running
        module once, plus static ancestors never called themselves (ModuleList, ModuleDict)."""
        names = set(stack)
        for name in stack:
            for prefix in static_prefixes(name)[:-1]:
                if not self.calls[prefix]:
                    names.add(prefix)
        return names
