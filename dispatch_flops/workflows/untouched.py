"""The user's model as it was found: what a drop-in (``compat``'s fvcore, thop, ptflops,
calflops) or ``paper_table`` runs on a model it was lent, it gives back unchanged, after
success, an exception or a KeyboardInterrupt at any point.

>>> with Untouched(model, inputs):
...     model.train(); model(x).sum().backward()  # counted; then all of it undone

What is put back (torchinfo restores train flags and hooks in ``finally``; this goes further,
since a drop-in runs backward and training steps the user never asked for):
- every module's train flag, attributes (``total_ops``, ``__flops__``, a cache its forward
  built), parameters, buffers and submodules (the same objects), and hooks of every kind;
- buffers' values (BatchNorm's running statistics, ``num_batches_tracked``);
- every parameter's and every input leaf's ``.grad``: the same tensor with the same values, or
  None (inside the block they start as None, so backward never adds into the user's);
- the global module and optimizer hooks;
- the RNG (CPU, and CUDA's when it was started): dropout in a counted step draws nothing the
  user's next step would have drawn.
Nothing is kept once the block ends.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torch.nn.modules import module as _module_globals
from torch.optim import optimizer as _optimizer_globals
from torch.utils._pytree import tree_leaves

# the global hook tables a counter (or a rule) may add to
_GLOBAL_HOOKS = (
    (_module_globals, "_global_forward_pre_hooks"),
    (_module_globals, "_global_forward_hooks"),
    (_module_globals, "_global_forward_hooks_always_called"),
    (_module_globals, "_global_forward_hooks_with_kwargs"),
    (_module_globals, "_global_backward_pre_hooks"),
    (_module_globals, "_global_backward_hooks"),
    (_module_globals, "_global_module_registration_hooks"),
    (_module_globals, "_global_parameter_registration_hooks"),
    (_module_globals, "_global_buffer_registration_hooks"),
    (_optimizer_globals, "_global_optimizer_pre_hooks"),
    (_optimizer_globals, "_global_optimizer_post_hooks"),
)


def _containers(module: nn.Module) -> List[Tuple[Any, Any]]:
    """The dicts and sets in ``module.__dict__`` (hooks of every kind, ``_parameters``,
    ``_buffers``, ``_modules``, ``_non_persistent_buffers_set``), each with a copy."""
    return [(value, value.copy()) for value in module.__dict__.values()
            if isinstance(value, (dict, set))]


class Untouched:
    """Snapshots ``model`` (and the leaf tensors in ``inputs``) on entry and puts every part
    back on exit, whatever ended the block. See the module docstring for what is kept."""

    def __init__(self, model: Optional[nn.Module], inputs: Any = ()):
        self.model = model
        self.inputs = inputs
        self._restore: List[Any] = []

    def __enter__(self) -> "Untouched":
        modules = list(self.model.modules()) if self.model is not None else []
        # taken whole before anything changes: an interrupt here has nothing to undo
        states = [(m, m.training, dict(m.__dict__), _containers(m)) for m in modules]
        leaves: dict = {id(t): t for m in modules for t in m._parameters.values()
                        if t is not None}
        leaves.update((id(t), t) for t in tree_leaves(self.inputs)
                      if isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad)
        grads = [(t, t.grad) for t in leaves.values()]
        buffers = [(b, b.detach().clone()) for m in modules for b in m._buffers.values()
                   if b is not None and not b.is_inference()]
        hooks = [(getattr(owner, name), getattr(owner, name).copy())
                 for owner, name in _GLOBAL_HOOKS if hasattr(owner, name)]
        rng = torch.random.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self._restore = [states, grads, buffers, hooks, (rng, cuda_rng)]
        try:
            for tensor, _ in grads:  # backward inside adds into None, never the user's grad
                tensor.grad = None
        except BaseException:
            self._put_back()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._put_back()

    def _put_back(self) -> None:
        if not self._restore:
            return
        states, grads, buffers, hooks, (rng, cuda_rng) = self._restore
        self._restore = []
        for table, saved in hooks:
            table.clear()
            table.update(saved)
        for module, training, attributes, containers in states:
            module.training = training
            for container, saved in containers:
                if container != saved:
                    container.clear()
                    container.update(saved)
            for name in [n for n in module.__dict__ if n not in attributes]:
                del module.__dict__[name]
            for name, value in attributes.items():
                if module.__dict__.get(name, _MISSING) is not value:
                    module.__dict__[name] = value
        with torch.no_grad():
            for buffer, value in buffers:
                buffer.copy_(value)
        for tensor, grad in grads:
            tensor.grad = grad
        torch.random.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


_MISSING = object()


@contextlib.contextmanager
def composites_whole() -> Iterator[None]:
    """No grad, with autograd's kernels skipped: composite ops (``aten.linear``,
    ``aten.batch_norm``) reach a counting mode whole, at the level a jit trace or a module
    hook sees them, as under ``inference_mode`` — without making inference tensors a model
    may keep (a cache built on its first forward that a later training step could not save
    for backward)."""
    with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
        yield


__all__ = ["Untouched", "composites_whole"]
