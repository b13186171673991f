"""MoE expert load: which of a model's modules are experts, and how many tokens each expert
of each MoE layer was given (and, where the kernel pads them to a capacity, how many rows it
computed), read from the expert calls themselves.

Experts are recognised by module structure, in this order (docs/distributed.md, "MoE expert
load"):

1. **Fused experts**: a module whose class name ends in ``Experts`` with an int attribute
   ``num_experts`` (transformers' Mixtral, Qwen-MoE, DeepSeek, ... ``*Experts``), called as
   ``forward(hidden_states, top_k_index, top_k_weights)``: the layer's tokens per expert are
   the routing decision it is given, ``bincount(top_k_index)`` (token-expert pairs; ids at or
   past ``num_experts``, expert parallelism's sentinels, left out). Whatever kernel then runs
   (a loop over experts, ``batched_mm``, ``torch._grouped_mm``) computes those rows, no more.
2. **Capacity experts**: such a module (``*Experts``, ``num_experts``) called with one
   tensor ``[num_experts, capacity, d]`` (GShard / Switch dispatch): every expert computes
   ``capacity`` rows; its tokens are its rows that are not all zero, the rest padding.
3. **A list of experts**: an ``nn.ModuleList`` named ``experts`` (its last name) of two or
   more modules (one module per expert, called on its tokens, as with ``index_select`` or a
   mask): each call's tokens are the rows of its first tensor argument (all dims but the
   last); rows computed = tokens.

Each hook reads values (``bincount``, the zero rows): on a GPU that is one synchronisation
per MoE layer call. It runs with every dispatch mode off and without autograd, so the counts
never see it. On the meta device (shape-only counting) there are no values: nothing is
recorded. Only recognised modules get a hook: a model without experts pays nothing.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from dispatch_flops.engine.torch_private import disable_current_modes as _disable_current_modes
from dispatch_flops.engine.torch_private import lookup


def _fused(module: nn.Module) -> Optional[int]:
    if not type(module).__name__.endswith("Experts"):
        return None
    try:
        experts = getattr(module, "num_experts", None)
    except Exception:  # a config-backed __getattr__ raising KeyError: no expert count
        return None
    if isinstance(experts, int) and not isinstance(experts, bool) and experts > 0:
        return experts
    return None


def expert_layers(names: tuple, modules) -> list[tuple[str, nn.Module, int]]:
    """``(name, module, experts)`` of every MoE layer among ``modules`` (named ``names``),
    in tree order: a fused experts module, or a list of experts (see the module's rules)."""
    out: list[tuple[str, nn.Module, int]] = []
    for name, module in zip(names, modules):
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] == "experts" and \
                len(module) >= 2:
            out.append((name, module, len(module)))
        else:
            experts = _fused(module)
            if experts is not None:
                out.append((name, module, experts))
    return out


def _rows(t: torch.Tensor) -> int:
    return t.numel() // t.shape[-1] if t.dim() and t.shape[-1] else 0


class ExpertLoad:
    """Hooks on a model's MoE layers (``attach`` / ``detach``) adding, per layer, each
    expert's tokens and rows computed and the layer's calls: ``facts()`` is
    ``RunFacts.experts``."""

    def __init__(self, layers: list[tuple[str, nn.Module, int]]):
        self.layers = layers
        # name: [tokens per expert, rows computed per expert, calls, calls per expert]
        self.load: dict[str, list] = {}
        self._handles: list = []
        self._hooked: list = []  # (module, hook) of every hook registered

    def attach(self) -> None:
        for name, module, n in self.layers:
            if isinstance(module, nn.ModuleList):
                for i, expert in enumerate(module):
                    self._register(expert, self._listed(name, n, i))
            else:
                self._register(module, self._fused(name, n))

    def _register(self, module: nn.Module, hook) -> None:
        self._hooked.append((module, hook))  # first: detach finds it if no handle came back
        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def detach(self) -> None:
        """Remove the hooks, those whose handle an interrupt kept from us too: safe to call
        again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if lookup("torch.nn.Module._forward_pre_hooks") is not None:
            for module, hook in self._hooked:
                hooks = module._forward_pre_hooks
                for key in [k for k, v in hooks.items() if v is hook]:
                    del hooks[key]
                    module._forward_pre_hooks_with_kwargs.pop(key, None)
        self._hooked = []

    def _entry(self, name: str, n: int) -> list:
        entry = self.load.get(name)
        if entry is None:
            entry = self.load[name] = [[0] * n, [0] * n, 0, [0] * n]
        return entry

    def _listed(self, name: str, n: int, i: int):
        def pre_hook(module, args, kwargs) -> None:
            first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)),
                         None)
            if first is None:
                return
            entry = self._entry(name, n)
            rows = _rows(first)
            entry[0][i] += rows
            entry[1][i] += rows
            entry[3][i] += 1
            entry[2] = max(entry[3])  # the layer's calls: its busiest expert's

        return pre_hook

    def _fused(self, name: str, n: int):
        def pre_hook(module, args, kwargs) -> None:
            values = list(args) + [kwargs[k] for k in ("hidden_states", "top_k_index")
                                   if k in kwargs]
            tensors = [a for a in values if isinstance(a, torch.Tensor)]
            if not tensors or any(t.is_meta for t in tensors):
                return
            with _disable_current_modes(), torch.no_grad():
                if len(tensors) >= 2 and not tensors[1].is_floating_point():
                    ids = tensors[1].reshape(-1)
                    ids = ids[(ids >= 0) & (ids < n)]
                    tokens = torch.bincount(ids.long(), minlength=n)[:n].tolist()
                    rows = tokens
                elif tensors[0].dim() == 3 and tensors[0].shape[0] == n:
                    x = tensors[0]
                    tokens = (x != 0).any(dim=-1).sum(dim=-1).tolist()
                    rows = [x.shape[1]] * n
                else:
                    return
            entry = self._entry(name, n)
            entry[0] = [a + b for a, b in zip(entry[0], tokens)]
            entry[1] = [a + b for a, b in zip(entry[1], rows)]
            entry[2] += 1

        return pre_hook

    def facts(self) -> tuple:
        """``((layer, tokens per expert, rows per expert, calls), ...)`` in tree order."""
        return tuple((name, tuple(self.load[name][0]), tuple(self.load[name][1]),
                      self.load[name][2]) for name, _, _ in self.layers if name in self.load)


