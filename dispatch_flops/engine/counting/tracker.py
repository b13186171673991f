"""Module tracker: which modules are running, for forward ops and for the backward ops
their autograd nodes run later.

Each distinct running stack of modules is one interned ``Frame``; a frame holds the per-op
accumulators of the ops run under it, one per phase. A forward pre/post hook pair moves the
tracker between frames (one dict lookup, no tuple building) and notes the autograd sequence
number (``torch.autograd._get_sequence_nr()``) at every move: a node created while the counter
reads ``s`` was created under the frame entered last at or before ``s``. In backward,
``torch._C._current_autograd_node()`` names the running node, so its ops go to the module
whose forward created it, whether or not that module's inputs required grad.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence

from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.hooks import RemovableHandle

from dispatch_flops.engine.counting.ledger import FORWARD_I, Clock, Frame, Ledger, Outside, phase_of
from dispatch_flops.engine.counting.model_cache import ModelFacts, facts_of
from dispatch_flops.engine.counting.records import engine_cache
from dispatch_flops.engine.counting.skip import SKIP_FRAMES
from dispatch_flops.engine.counting.step_replay import StepReplay
from dispatch_flops.engine.counting.steps import CLOSURE, OptimizerSteps, running, suspendable
from dispatch_flops.engine.torch_private import current_autograd_node as _current_node
from dispatch_flops.engine.torch_private import (
    get_current_dispatch_mode_stack as _get_current_dispatch_mode_stack,
)
from dispatch_flops.engine.torch_private import get_sequence_nr as _sequence_nr
from dispatch_flops.engine.torch_private import lookup, top_saved_tensors_hooks
from dispatch_flops.results.stats import ROOT, static_prefixes

if TYPE_CHECKING:
    from dispatch_flops.engine.counting.state import CountingState


class CountingModeLike(Protocol):
    """What the tracker and its step replay read of the counting mode (``engine.counting.mode``,
    which imports the tracker: the tracker names it by what it uses)."""

    runner: Any
    guarded: bool
    registry: Any  # a formulas.Registry

    def unbind(self) -> None: ...


class SavedWatcher(Protocol):
    """What the tracker tells of module calls and steps to the counter's saved activations
    (``engine.model.saved.SavedActivations``)."""

    def module_called(self) -> None: ...

    def step_begins(self) -> None: ...

ACCUMULATE_GRAD_SEQ = 2**64 - 1  # AccumulateGrad nodes carry the largest sequence number
# module boundaries kept for attributing backward ops (see _forget_oldest_boundaries)
BOUNDARY_WINDOW = 100_000
_getframe = sys._getframe
# torch's global hook dicts, where the tracker's hooks live (``engine.graphs.compiled`` hides them
# from compiles)
GLOBAL_HOOK_DICTS = tuple("torch.nn.modules.module._global_forward" + name for name in (
    "_pre_hooks", "_hooks", "_hooks_always_called")) + tuple(
    "torch.optim.optimizer._global_optimizer" + name for name in ("_pre_hooks", "_post_hooks"))
_get_ident = threading.get_ident


# what a context manager runs to enter its block; contextlib's own frames (ExitStack,
# ContextDecorator) stand between a block and its ``with`` statement
_ENTERING = frozenset(("__enter__", "__aenter__"))
_CONTEXTLIB = "contextlib"
_FIXTURES = "_pytest.fixtures"  # resumes a yield fixture: the test is its block


def block_frame(frame) -> Optional[FrameType]:
    """The generator or coroutine frame whose running is the block of a counter entered at
    ``frame``; None when the block is everything its thread runs until the counter exits.

    A counter counts what its thread runs while the frame that owns its block runs. That frame
    is ``frame`` unless ``frame`` is a context manager's: a ``__enter__`` or ``__aenter__``, or
    contextlib's; or a generator or coroutine one of them (or pytest, for a yield fixture)
    resumes, such as the body of an ``@contextmanager`` or ``@asynccontextmanager``, which is
    suspended at its ``yield`` exactly while the ``with`` block runs. Then the block is the one
    of the frame that entered that context manager, decided the same way. A generator or
    coroutine anything else resumes (a loop's ``next``, an event loop) owns its block: the code
    that runs while it is suspended is not its block."""
    while frame is not None:
        driver = frame.f_back
        if frame.f_code.co_name in _ENTERING or \
                frame.f_globals.get("__name__") == _CONTEXTLIB:
            frame = driver  # a context manager entering: its block is its caller's
        elif suspendable(frame) and driver is not None and (
                driver.f_code.co_name in _ENTERING or
                driver.f_globals.get("__name__") in (_CONTEXTLIB, _FIXTURES)):
            frame = driver  # the body of a context manager (or fixture) that it resumes
        else:
            break
    return frame if suspendable(frame) else None


def unwrap_compiled(module: nn.Module) -> nn.Module:
    """The module a ``torch.compile(module)`` child wraps (named as the child, without
    ``_orig_mod.``); any other module as it is."""
    while type(module).__name__ == "OptimizedModule":
        inner = getattr(module, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        module = inner
    return module


def walk_modules(model: nn.Module) -> tuple[dict[int, str], list[nn.Module], tuple]:
    """``{id(module): name}``, the modules and their names, in ``model.named_modules()``
    order with its names and de-duplication, walked without recursive generators: it runs on
    every counter's entry. A ``torch.compile(module)`` wrapper is not a module of its own: it and
    the module it wraps share the name, without ``_orig_mod.`` (the dict holds both ids, the
    list the module)."""
    name_of: dict[int, str] = {}
    modules: list[nn.Module] = []
    names: list[str] = []
    todo = [(ROOT, model)]
    while todo:
        name, module = todo.pop()
        if id(module) in name_of:
            continue
        inner = unwrap_compiled(module) if module.__class__.__name__ == "OptimizedModule" \
            else module
        if inner is not module:  # torch.compile(module): its calls are the module's
            name_of[id(module)] = name
            module = inner
            if id(module) in name_of:
                continue
        name_of[id(module)] = name
        modules.append(module)
        names.append(name)
        children = module._modules
        if children:
            prefix = name + "." if name else ""
            for key, child in reversed(list(children.items())):
                if child is not None:
                    todo.append((prefix + key, child))
    return name_of, modules, tuple(names)


class UserHooks:
    """Module forward hooks another room runs around the tracker's own, as torch's
    ``ModTracker.register_user_hooks`` gives: a pre-hook ``(module, args)`` runs before the
    tracker notes a module call (its frame, call count and start), a post-hook
    ``(module, args, output)`` after it notes the call's end (always, as the tracker's own
    post-hook). Every module call reaches them; they filter what they need. A counter holds one
    (``FlopCounter.user_hooks``) and hands it to the tracker it makes on entry, which puts the
    hooks registered by then around its own: a workflow registers before entering.

    >>> handle = counter.user_hooks.register(pre_fw_hook=snapshot, post_fw_hook=cut)
    >>> with counter:
    ...     model(x)
    >>> handle.remove()
    """

    def __init__(self) -> None:
        # ordered dicts: a RemovableHandle holds them weakly
        self.pre: OrderedDict[int, Callable] = OrderedDict()
        self.post: OrderedDict[int, Callable] = OrderedDict()

    def register(self, pre_fw_hook: Optional[Callable] = None,
                 post_fw_hook: Optional[Callable] = None) -> RemovableHandle:
        """Add the hooks given; ``handle.remove()`` takes both off."""
        handle = RemovableHandle(self.pre, extra_dict=self.post)
        if pre_fw_hook is not None:
            self.pre[handle.id] = pre_fw_hook
        if post_fw_hook is not None:
            self.post[handle.id] = post_fw_hook
        return handle

    def __bool__(self) -> bool:
        return bool(self.pre or self.post)

    def run_pre(self, module, args) -> None:
        for hook in list(self.pre.values()):
            hook(module, args)

    def run_post(self, module, args, output) -> None:
        for hook in list(self.post.values()):
            hook(module, args, output)


class ModuleTracker(OptimizerSteps):
    """Maintains the running frame of ``model`` through hooks it removes on detach, and tells
    the dispatch mode (through ``state.forward_acc``: ``engine.counting.state``) where ops with no
    autograd node go; notes the module boundaries backward ops are attributed by.

    >>> tracker = ModuleTracker(model, mode, CountingState(Ledger()))
    >>> tracker.attach(); model(x); tracker.detach()

    What the rest of the engine reads, as attributes: ``current`` (the running frame),
    ``root`` (the root's frame), ``ledger``, ``state``, ``root_calls``, ``every_module``,
    ``model``, ``mode``, ``timer``, ``thread``, ``shared``, ``graph_runs`` and
    ``graph_calls``. The module facts of a result are read from it by
    ``engine.model.module_facts``; saved activations are counted by ``engine.model.saved``.
    Other rooms' module hooks run around its own through ``user_hooks`` (``UserHooks``).
    """

    def __init__(self, model: Optional[nn.Module], mode: CountingModeLike, state: CountingState,
                 timer: Optional[Clock] = None, shared: bool = False,
                 guard: Optional[FrameType] = None, every_module: bool = False,
                 user_hooks: Optional[UserHooks] = None):
        self.model = model
        self.user_hooks = user_hooks if user_hooks is not None else UserHooks()
        self._user_handles: list[RemovableHandle] = []  # not hook_ids(): compiles see them
        # what a counter sees: module calls of the thread that entered it (and autograd's
        # threads running its backward); when it was entered in a generator or coroutine
        # (``guard``: that frame), only while that frame runs
        self.thread = _get_ident()
        self.guard = guard
        self._calls: list[tuple] = []  # (Frame, frame of the hook's caller) per module call
        # no model: name every module called, as torch's ModuleTracker does (``_discover``)
        self.every_module = every_module and model is None
        self.mode = mode
        self.timer = timer
        self._open: list = []  # (frame, start mark) of module calls running, when timing
        self.shared = shared  # a model's ledger, reset on close; else private
        self.state = state  # the counter's: this tracker writes the parts state.WRITERS say
        assert state.ledger is not None, "a counter's state has a ledger"
        self.ledger: Ledger = state.ledger
        self.root = self.ledger.root
        self.current = self.root
        self.root_calls = 0
        self._root_again = 0  # root calls running inside a root call (see _push)
        self._wrappers: list = []  # torch.compile wrappers of the model (see _wraps_model)
        self._modules: list[nn.Module] = []
        self._name_of: dict[int, str] = {}
        self._names: tuple[str, ...] = ()  # the model's module names, in _modules order
        self._param_owner: Optional[dict[int, str]] = None
        # what is known of the model as walked on entry, kept from counter to counter while
        # its modules and parameters stay the same (model_cache); None without a model
        self.model_facts: Optional[ModelFacts] = None
        self._accumulation_frames: dict[int, Frame] = {}
        self._first_frames: dict[str, Frame] = {}  # each module's first frame
        self._handles: list[RemovableHandle] = []
        # the optimizer steps running on this thread, innermost last: torch's wrapper of each
        # step() (its frame runs exactly as long as the step), ``CLOSURE`` where a step runs
        # the closure it was given (see _outside_the_step)
        self._steps: list = []
        # steps counted once then replayed (engine.counting.step_replay): not when timing, nor for a
        # block a generator owns
        self._replay: Optional[StepReplay] = StepReplay(self, engine_cache(
            mode.registry)) if timer is None and guard is None else None
        # told of module calls when the counter watches saved activations (``watch_saved``)
        self._saved: Optional[SavedWatcher] = None
        # what the compiled graphs run under this counter did (``compiled.GraphRuns``):
        # made by the first one that runs
        self.graph_runs: Any = None  # compiled.GraphRuns, made by compiled at a first run
        self.graph_calls = 0  # compiled graph calls that added their counts whole
        self._recompute_depth = 0  # module calls running inside backward (checkpointing)
        self._resume = self.root  # the frame to go back to when recomputing ends
        self._phase = FORWARD_I  # phase_of the tracker's state, asked when the state changes
        # with a model, ops run while none of its modules runs are ``other`` (see Outside)
        self.outside = self.ledger.outside if model is not None else self.root
        self._aim()
        if self.outside is not self.root:
            self.enter(self.outside)

    def resume(self, frame: Frame, forward_acc: dict) -> None:
        """Make ``frame`` the running one again, ops with no autograd node going to
        ``forward_acc``, with no boundary noted: a compiled graph's fake run, between its
        forward and its backward and when it ends (``engine.graphs.compiled``)."""
        self.current = frame
        self.state.aim(forward_acc)

    def _aim(self, phase_changed: bool = False) -> None:
        """Point the mode's ``forward_acc`` at the running frame's accumulator for the phase
        the tracker is in (``phase_of``, asked again when ``phase_changed``): the one place it
        is set."""
        if phase_changed:
            steps = self._steps
            self._phase = phase_of(node=False, recompute=self._recompute_depth > 0,
                                   optimizer=bool(steps) and steps[-1] is not CLOSURE)
        self.state.forward_acc = self.current.acc[self._phase]

    # -- lifecycle --------------------------------------------------------------------------
    def attach(self) -> None:
        """Global hooks: optimizer step pre/post, and (with a model) module forward pre/post,
        filtered to the model's modules by identity: a few registrations however large the
        model is."""
        try:
            self._handles.append(register_optimizer_step_pre_hook(self._step_begins))
            self._handles.append(register_optimizer_step_post_hook(self._step_ends))
            if self.model is None and not self.every_module:
                return
            if self.model is not None:
                self._name_of, self._modules, self._names = walk_modules(self.model)
                self.model_facts = facts_of(self.model, self._modules, self._names)
            user = self.user_hooks
            if user:  # global hooks run in the order registered: the user's around ours
                self._user_handles.append(register_module_forward_pre_hook(user.run_pre))
            self._handles.append(register_module_forward_pre_hook(self._push))
            self._handles.append(register_module_forward_hook(self._pop, always_call=True))
            if user:
                self._user_handles.append(register_module_forward_hook(user.run_post,
                                                                       always_call=True))
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        """Remove the hooks ``attach`` registered, and any of this tracker's hooks still in
        torch's global hook dicts (an interrupt landing between a registration and its handle
        reaching ``_handles``): safe to call again."""
        for handle in self._handles + self._user_handles:
            handle.remove()
        self._handles.clear()
        self._user_handles.clear()
        dicts = [lookup(name) for name in GLOBAL_HOOK_DICTS]
        for hooks in dicts:
            if not hooks:
                continue
            for key in [k for k, v in hooks.items() if any(
                    getattr(v, "__self__", None) is mine for mine in (self, self.user_hooks))]:
                for other in dicts:  # always_called holds the same key
                    if other is not None:
                        other.pop(key, None)
        # the counter keeps its SavedActivations; the two pointing at each other would keep
        # the model alive until the cyclic collector ran
        self._saved = None

    def hook_ids(self) -> list[int]:
        """The ids of the hooks in torch's global hook dicts that ``attach`` registered (a
        compile hides them: see ``engine.graphs.compiled``)."""
        return [handle.id for handle in self._handles]

    def mode_left_installed(self) -> bool:
        """Whether the mode is still on the dispatch mode stack (counters exited out of order,
        or a failed exit): it may go on counting into this tracker's ledger."""
        mode: object = self.mode
        return any(m is mode for m in _get_current_dispatch_mode_stack())

    def close(self, left_installed: bool) -> None:
        """Counting is over: free a shared ledger for the next counter (which settles the
        counts left in it: see ``Ledger.settle``). A ledger a mode may still count into
        (``left_installed``: see ``mode_left_installed``) is retired instead."""
        if left_installed:
            self.ledger.retire()
            return
        self._steps.clear()  # a step the block ended in: its frame is not kept alive
        if self._replay is not None:
            self._replay.abort()
        self.state.watch_steps(False)
        self.mode.unbind()
        if self.shared:
            self.ledger.busy = False

    # -- hooks ------------------------------------------------------------------------------
    def enter(self, frame: Frame) -> None:
        """Make ``frame`` the running frame (a module call starting or ending, a compiled
        graph's node running in its module's frame), and note the boundary: the autograd
        nodes made from now on are ``frame``'s (``boundary_seqs``, ``boundary_frames``)."""
        self.current = frame
        state = self.state
        state.forward_acc = frame.acc[self._phase]  # _aim, inlined: every module call
        state.boundary_seqs.append(_sequence_nr())
        state.boundary_frames.append(frame)
        if len(state.boundary_frames) > 2 * BOUNDARY_WINDOW:
            self._forget_oldest_boundaries()

    def _forget_oldest_boundaries(self) -> None:
        """Keep a counter open for a whole training run in bounded memory: only the last
        ``BOUNDARY_WINDOW`` module boundaries (a module call makes two) are kept, in place (the
        mode holds the lists). Backward ops of a node created before them go to the root's
        frame (the sentinel kept at the front): only a graph built over more than 50,000
        module calls before its backward runs loses any attribution."""
        del self.state.boundary_seqs[1: -BOUNDARY_WINDOW]
        del self.state.boundary_frames[1: -BOUNDARY_WINDOW]

    def sees(self, start) -> bool:
        """Whether a call made at Python frame ``start`` is this counter's: on its thread
        (or in backward, which autograd may run on its own threads), and, for a counter
        entered in a generator or coroutine, while that is running."""
        if _get_ident() != self.thread:
            return _current_node() is not None
        return self.guard is None or running(self.guard, start)

    def _discover(self, module: nn.Module) -> str:
        """Name a module first called with no model given, torch's way: its class name, and
        ``"<its name>.<child>"`` for everything inside it not named yet."""
        top = type(module).__name__
        relative, modules, _ = walk_modules(module)
        for m in modules:
            if id(m) not in self._name_of:
                rel = relative[id(m)]
                self._name_of[id(m)] = top + "." + rel if rel else top
                self._modules.append(m)  # keeps it alive: ids stay unique while counting
        self._param_owner = None  # parameters of new modules: build the map again
        self._accumulation_frames.clear()
        return self._name_of[id(module)]

    def _push(self, module, args) -> None:
        name = self._name_of.get(id(module))
        if name is None:  # not one of the model's modules: ops stay with the enclosing one
            if self._wraps_model(module):
                name = ROOT
            elif not self.every_module:
                return
            else:
                name = self._discover(module)
        caller = _getframe(1)
        if (_get_ident() != self.thread or self.guard is not None) and not self.sees(caller):
            return
        if _current_node() is not None:
            return self._push_recompute(name)
        if self._recompute_depth:  # recomputing runs inside backward: this one was ended
            self.end_recompute()  # by a BaseException (no always-call hook ran for it)
        calls = self._calls
        # Check that the innermost call is still running (one a KeyboardInterrupt ended left
        # no forward hook to end it) at every root call and every call not nested as the model
        # nests its modules; a call named inside the innermost one's is taken as inside it
        # (the check walks the Python stack, about 2 us a call on the tiny GPT: half the hook).
        # So until the next root call, a module inside an interrupted one, called directly,
        # counts inside it
        if calls and (name == ROOT or not name.startswith(calls[-1][0].dotted)) and \
                not running(calls[-1][1], caller):
            self._drop_ended(caller)
        saved = self._saved
        if saved is not None:
            saved.module_called()
        if not calls and self.current is not self.root:  # the model starts running
            self.enter(self.root)
        if name == ROOT:
            if not calls:
                self._root_again = 0  # none left over from a call an interrupt ended
            elif calls[-1][0] is self.root and running(calls[-1][1], caller):
                # the root again inside its own call (the module a torch.compile wrapper
                # runs eagerly, or a model calling itself): one call, one entry
                self._root_again += 1
                return
            self.root_calls += 1
            frame = self.root
            if self.current is self.root and saved is not None:
                saved.step_begins()
        else:
            child = self.current.children.get(name)
            frame = child if child is not None else self.current.child(name, self.ledger.frames)
            if name not in self._first_frames:  # per counter: a ledger's frames outlive it
                self._first_frames[name] = frame
            frame.calls += 1
            self.enter(frame)
        calls.append((frame, caller))
        if self.timer is not None:
            self._open.append((frame, self.timer.mark()))

    def _drop_ended(self, caller) -> None:
        """Forget module calls that ended without their forward hook: torch runs always-call
        hooks after an ``Exception`` only, so a ``KeyboardInterrupt`` (any ``BaseException``)
        raised in a module and caught outside it leaves its calls open. A call has ended when
        the frame that called its hook is no longer on the stack; the running frame goes back
        to the innermost call still running."""
        on_stack = set()
        frame = caller
        while frame is not None:
            on_stack.add(id(frame))
            frame = frame.f_back
        calls = self._calls
        while calls and id(calls[-1][1]) not in on_stack:
            ended, _ = calls.pop()
            if self.timer is not None:
                self._close(ended)
        self.enter(calls[-1][0] if calls else self.outside)

    def _push_recompute(self, name: str) -> None:
        """A module called while autograd runs a node: activation checkpointing re-running
        forward (reentrant or not). Its ops go to the recompute phase of the module's frame,
        placed where the module ran in forward; no call or time is added to forward's."""
        if not self._recompute_depth:
            self._resume = self.current
            first = self._first_frames.get(name)
            self.current = first.parent if first is not None and first.parent else self.root
            # for the ops between its module calls, with the recomputation they belong to
            hooks = top_saved_tensors_hooks(False)
            self.state.recompute_home = (hooks[0] if hooks is not None else None,
                                         self.current)
            self.state.recomputing = True
        self._recompute_depth += 1
        self._aim(phase_changed=True)
        if name != ROOT:
            self.enter(self.current.child(name, self.ledger.frames))

    def _pop(self, module, args, output) -> None:
        name = self._name_of.get(id(module))
        if name is None:
            return
        if (_get_ident() != self.thread or self.guard is not None) \
                and not self.sees(_getframe(1)):
            return
        if self._recompute_depth:
            return self._pop_recompute(name)
        if name == ROOT:
            if self._root_again:
                self._root_again -= 1
                return
            frame = self.root
        else:
            frame = self.current
            while frame.name != name:  # an inner module left without its hook running
                parent = frame.parent
                if parent is None:
                    return
                frame = parent
            parent = frame.parent
            assert parent is not None  # only the root has none, and it is named ROOT
            self.enter(parent)
        calls = self._calls
        while calls:
            if calls.pop()[0] is frame:
                break
        if self.timer is not None:
            self._close(frame)
        if not calls and self.outside is not self.root:  # none of the model's modules runs
            self.enter(self.outside)

    def _wraps_model(self, module) -> bool:
        """Whether ``module`` is a ``torch.compile`` wrapper of the model: its calls are the
        root's (the model's own hooks do not run inside compiled code). Named from then on
        (kept, so its id stays its own)."""
        if self.model is None or module.__class__.__name__ != "OptimizedModule" or \
                unwrap_compiled(module) is not self.model:
            return False
        self._name_of[id(module)] = ROOT
        self._wrappers.append(module)
        return True

    def _pop_recompute(self, name: str) -> None:
        if name != ROOT:
            frame = self.current
            while frame.name != name and frame.parent is not None:
                frame = frame.parent
            self.enter(frame.parent if frame.parent is not None else self.root)
        self._recompute_depth -= 1
        if not self._recompute_depth:
            self.end_recompute()

    def end_recompute(self) -> None:
        """Activation checkpointing's recomputation is over: the running frame and phase are
        the ones before it. Also called (by the mode, or at the next module call) when no
        autograd node runs any more: a BaseException ended the recomputation, and torch ran
        none of the always-call hooks that would have ended it."""
        self._recompute_depth = 0
        self.state.recomputing = False
        self.current = self._resume
        self._aim(phase_changed=True)

    # -- saved activations (FlopCounter(saved_activations=True): engine.model.saved) ------------
    def watch_saved(self, saved: SavedWatcher) -> None:
        """Tell ``saved`` of every module call this tracker sees from now on
        (``module_called``) and of every new step (``step_begins``: the root called while
        none of its modules runs)."""
        self._saved = saved

    def saving_frame(self) -> Optional[Frame]:
        """The frame a tensor saved for backward now is charged to: the running one (the
        root's while none of the model's modules runs); None while activation checkpointing
        recomputes forward (what it saves again was charged when forward first ran)."""
        if self._recompute_depth:
            return None
        current = self.current
        return current.root if isinstance(current, Outside) else current

    def _close(self, frame: Frame) -> None:
        """End the span of ``frame``'s module call (and of any inner call left unclosed)."""
        timer = self.timer
        assert timer is not None  # module calls are opened only when timing
        if not any(f is frame for f, _ in self._open):
            return
        while self._open:  # each mark is used once (a CUDA mark's events are pooled)
            inner, start = self._open.pop()
            timer.span(inner.span, 0, start, timer.mark())
            if inner is frame:
                return

    # -- backward ---------------------------------------------------------------------------
    def frame_of_accumulation(self, node) -> Frame:
        """The frame of an AccumulateGrad node: the first frame its parameter's module ran in
        (a module that never ran: its place under the modules that did)."""
        key = id(getattr(node, "variable", None))
        frame = self._accumulation_frames.get(key)
        if frame is None:
            owner = self.parameter_owner(key)
            frame = self.root if owner is None else self.frame_of_name(owner)
            self._accumulation_frames[key] = frame
        return frame

    def frame_of_name(self, name: str) -> Frame:
        """The first frame module ``name`` ran in; for a module that never ran, its place
        under its called static ancestors."""
        frame = self._first_frames.get(name)
        if frame is None:
            frame = self.root
            for prefix in static_prefixes(name)[:-1]:
                frame = self._first_frames.get(prefix, frame)
            frame = frame.child(name, self.ledger.frames)
        return frame

    # -- the modules, named (read by engine.model.module_facts and engine.graphs.compiled) ---------
    def modules(self) -> Sequence[nn.Module]:
        """The modules this tracker names: the model's, in ``named_modules()`` order (walked
        by ``attach``); with ``every_module``, each module met so far, in the order met. The
        tracker's own list: read it, never change it."""
        return self._modules

    def module_names(self) -> tuple[str, ...]:
        """The names of ``modules()``, in their order (the model's is ``ROOT``)."""
        if self.every_module:
            return tuple(self._name_of[id(m)] for m in self._modules)
        return self._names

    def module_name(self, module_id: int) -> Optional[str]:
        """The name of the module whose ``id()`` is ``module_id`` (a ``torch.compile``
        wrapper of the model: the model's), None for a module not among ``modules()``."""
        return self._name_of.get(module_id)

    def parameter_owner(self, parameter_id: int) -> Optional[str]:
        """The name of the first module in ``modules()`` holding the parameter whose
        ``id()`` is ``parameter_id``, None for a parameter of none of them."""
        owners = self._param_owner
        if owners is None:  # asked first (a gradient accumulated): build the map once,
            # kept with the model's facts (the same parameters under the same names)
            facts = self.model_facts
            def build() -> dict[int, str]:
                return _parameter_owners(self._modules, self._name_of)
            owners = self._param_owner = build() if facts is None else \
                facts.get("parameter_owners", build)
        return owners.get(parameter_id)

    def note_module_frame(self, name: str, frame: Frame) -> None:
        """Module ``name`` ran in ``frame`` (a compiled graph's node did): the frame its
        backward and recomputation go to, unless it ran in another one first."""
        self._first_frames.setdefault(name, frame)


# torch.compile(model) runs the model's own module call, hooks and all, outside dynamo and
# compiles the first frame it meets below it: the hooks' frames are ours, never dynamo's
if SKIP_FRAMES is not None:
    for _hook in (ModuleTracker._push, ModuleTracker._pop, ModuleTracker._step_begins,
                  ModuleTracker._step_ends):
        SKIP_FRAMES(_hook.__code__)


def _parameter_owners(modules, name_of: dict) -> dict[int, str]:
    """``{id(parameter): name}`` of the first of ``modules`` holding each parameter."""
    owners: dict[int, str] = {}
    for module in modules:
        name = name_of[id(module)]
        for p in module._parameters.values():
            if p is not None:
                owners.setdefault(id(p), name)
    return owners
