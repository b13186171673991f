"""Saved activations (``FlopCounter(saved_activations=True)``): the bytes of the tensors
autograd saves for backward, charged to the module stack that saved them.

A ``SavedActivations`` is the pack/unpack pair of a ``saved_tensors_hooks`` the counter enters
for its block. Each tensor's storage is charged once (to its first saver), parameters'
storages never; what activation checkpointing saves again while it recomputes forward is not
charged (it was when forward first ran). It asks the tracker one thing, where a tensor saved
now belongs (``ModuleTracker.saving_frame``), and the tracker tells it of every module call
(``module_called``) and of every new step (``step_begins``).

>>> saved = SavedActivations(tracker, model)
>>> tracker.watch_saved(saved)
>>> with saved_tensors_hooks(saved.pack, saved.unpack):
...     model(x)
>>> saved.by_stack(tracker.ledger.frames)  # {module stack: bytes}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from torch import Tensor, nn

from dispatch_flops.engine.counting.skip import SKIP_FRAMES
from dispatch_flops.engine.torch_private import (
    pop_saved_tensors_hooks,
    push_saved_tensors_hooks,
    top_saved_tensors_hooks,
)

if TYPE_CHECKING:
    from dispatch_flops.engine.counting.ledger import Frame
from dispatch_flops.engine.counting.tracker import ModuleTracker

# the attribute that marks a pack this module put in place of a user's (``_wrap_inner_hooks``)
_NOTED = "_dispatch_flops_noted"
_THEIRS = "_dispatch_flops_theirs"  # (SavedActivations, the user's pack) a noting pack wraps


class SavedActivations:
    """Bytes saved for backward, per frame of ``tracker``: the storages of the tensors
    autograd packs, each once, parameters' (those of ``model``) never.

    The user's own ``saved_tensors_hooks`` keep working: ones entered before the counter are
    called from ours (``pack``/``unpack``), ones entered inside the block are wrapped when the
    next module call starts (``module_called``)."""

    def __init__(self, tracker: ModuleTracker, model: Optional[nn.Module]):
        self._saving_frame = tracker.saving_frame
        self._seen: set[int] = set()  # storages charged (their ``_cdata``)
        self._param_storages = {
            p.untyped_storage()._cdata for p in model.parameters()
        } if model is not None else set()
        self._outer_hooks = top_saved_tensors_hooks(False)  # the user's, entered before us
        self._bytes: dict[Frame, int] = {}  # bytes charged to each frame

    def note(self, tensor: Tensor) -> None:
        """Charge ``tensor``'s storage to the frame saving it (once per storage)."""
        frame = self._saving_frame()
        if frame is None:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            return
        key = storage._cdata
        if key not in self._seen and key not in self._param_storages:
            self._seen.add(key)
            self._bytes[frame] = self._bytes.get(frame, 0) + storage.nbytes()

    def pack(self, tensor: Tensor) -> Any:
        """``saved_tensors_hooks`` pack hook: note the bytes, then hand the tensor to the
        user's hooks entered before the counter (as it is, without them)."""
        self.note(tensor)
        outer = self._outer_hooks
        return tensor if outer is None else outer[0](tensor)

    def unpack(self, packed: Any) -> Any:
        """``saved_tensors_hooks`` unpack hook: the user's outer unpack, if any."""
        outer = self._outer_hooks
        return packed if outer is None else outer[1](packed)

    def module_called(self) -> None:
        """A module call starts: hooks the user entered inside the block since sit above
        ours, and torch calls only the innermost. Put in their place the same hooks behind a
        pack that notes the bytes first (their ``__exit__`` pops whatever is innermost, so the
        stack stays as they left it). Activation checkpointing's own hooks are left alone:
        what it saves is recomputed."""
        top = top_saved_tensors_hooks(False)
        if top is None or getattr(top[0], "__self__", None) is self or \
                getattr(top[0], _NOTED, False) or \
                getattr(top[0], "__module__", "") == "torch.utils.checkpoint":
            return
        their_pack, their_unpack = top
        note = self.note

        def pack(tensor: Tensor) -> Any:
            note(tensor)
            return their_pack(tensor)

        _mark_noted(pack)
        vars(pack)[_THEIRS] = (self, their_pack)
        pop_saved_tensors_hooks()
        push_saved_tensors_hooks(pack, their_unpack)

    def leave(self) -> None:
        """Take this counter's hooks off the saved-tensors stack wherever they are (torch's
        ``__exit__`` pops the innermost: a user's hooks entered in the block and exited after
        it would be popped in our place), the hooks above put back as their owners entered
        them (without our noting wrapper). Nothing changes when ours are not there: safe to
        call again."""
        above = []
        found = False
        while True:
            top = top_saved_tensors_hooks(False)
            if top is None:
                break
            pop_saved_tensors_hooks()
            if getattr(top[0], "__self__", None) is self:
                found = True
                break
            above.append(top)
        for pack, unpack in reversed(above):
            owner, theirs = vars(pack).get(_THEIRS, (None, pack)) \
                if hasattr(pack, "__dict__") else (None, pack)
            push_saved_tensors_hooks(theirs if found and owner is self else pack, unpack)

    def step_begins(self) -> None:
        """The model's root module is called again: a new step, whose tensors may reuse the
        storages of the last one's."""
        self._seen.clear()

    def by_stack(self, frames: Iterable[Frame]) -> dict[tuple, int]:
        """Bytes saved for backward by the ops run directly under each stack, in the order of
        ``frames`` (the ledger's: every frame a tensor can be charged to)."""
        charged = self._bytes
        if not charged:
            return {}
        out = {}
        for frame in frames:
            n = charged.get(frame)
            if n:
                out[frame.stack] = n
        return out


def _mark_noted(pack: Callable) -> None:
    """Mark ``pack`` as one that notes the bytes already: no counter wraps it again."""
    vars(pack)[_NOTED] = True  # a function's attributes, which a type checker does not know


# torch.compile(model) runs the model's own module call, hooks and all, outside dynamo and
# compiles the first frame it meets below it: the hooks' frames are ours, never dynamo's
if SKIP_FRAMES is not None:
    for _hook in (SavedActivations.pack, SavedActivations.unpack):
        SKIP_FRAMES(_hook.__code__)
