"""Per-module activation bytes and input/output shapes, for the DeepSpeed-style profile.

Measured with the modules' own forward hooks, registered only while a profile runs and
apart from ``FlopCounter``: the counting hot path never pays for them.

*Activation bytes* of a module (AProfiler's "activation"): the bytes of the tensors its
forward returns, ``numel × element size`` of each distinct tensor in the output (tuples, lists,
dicts and registered pytrees walked), summed over all its forward calls in the profile. A
parent that returns its child's output counts those bytes too: the figure answers "how much
does this module hand to its caller", not "how much memory is live".
Input and output shapes are those of the module's first call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Optional

from torch import Tensor, nn

from dispatch_flops.engine.torch_private import tree_leaves


@dataclass(frozen=True)
class Activations:
    """What one module's forward calls returned, over a profile.

    >>> recorder = ActivationRecorder(model)
    >>> with recorder:
    ...     model(x)
    >>> recorder.results()["layers.0"].output_bytes
    """

    calls: int
    output_bytes: int  # bytes of every call's output tensors, summed
    input_shapes: tuple  # first call: the shapes of its tensor arguments (positional, then kw)
    output_shapes: tuple  # first call: the shapes of the tensors it returned


def _tensors(tree) -> list[Tensor]:
    """The tensors in ``tree``, each object once; mappings pytree does not know (an unregistered
    ``ModelOutput``) are walked by value."""
    out, seen, todo = [], set(), [tree]
    while todo:
        for leaf in tree_leaves(todo.pop()):
            if isinstance(leaf, Tensor):
                if id(leaf) not in seen:
                    seen.add(id(leaf))
                    out.append(leaf)
            elif isinstance(leaf, Mapping):
                todo.append(list(leaf.values()))
    return out


def _shapes(tensors: list[Tensor]) -> tuple:
    return tuple(tuple(t.shape) for t in tensors)


class ActivationRecorder:
    """Forward hooks on each module of ``model`` (but those ``skip`` names) recording
    ``Activations`` by module name; ``detach()`` removes every one of them.

    >>> with ActivationRecorder(model) as recorder:
    ...     model(x)
    >>> recorder.results()[""].output_shapes
    """

    def __init__(self, model: nn.Module, skip: Optional[Callable[[str], bool]] = None):
        self.model = model
        self.skip = skip
        self._records: dict[str, list] = {}  # name -> [calls, bytes, input shapes, output shapes]
        self._handles: list = []

    def attach(self) -> None:
        try:
            for name, module in self.model.named_modules():
                if self.skip is None or not self.skip(name):
                    self._handles.append(module.register_forward_hook(
                        self._hook(name), with_kwargs=True))
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> "ActivationRecorder":
        self.attach()
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def _hook(self, name: str):
        records = self._records

        def record(module, args, kwargs, output) -> None:
            outputs = _tensors(output)
            entry = records.get(name)
            if entry is None:
                entry = records[name] = [0, 0, _shapes(_tensors((args, kwargs))), _shapes(outputs)]
            entry[0] += 1
            entry[1] += sum(t.nbytes for t in outputs)

        return record

    def results(self) -> dict[str, Activations]:
        """``{module name: Activations}`` for every hooked module that ran."""
        return {name: Activations(*entry) for name, entry in self._records.items()}
