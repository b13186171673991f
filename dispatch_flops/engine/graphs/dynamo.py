"""The dynamo hook: every graph dynamo compiles wrapped in a ``compiled.Graph``, and compiled
models never left de-compiled.

**Never de-compile.** Dynamo refuses to compile a frame while a dispatch mode is on the stack,
and caches that refusal on the code object (pytorch#190286): one counted step used to leave
a compiled model eager for the rest of the process. Where torch has
``TorchDispatchMode.ignore_compile_internals`` (2.9 and later, PR#161648) the counting mode
says True: dynamo compiles and runs compiled code under it, with every mode switched off while
compiling. Dynamo would still trace the counter's global module and optimizer hooks into the
graphs it compiles meanwhile (a graph break at each module call, baked into the cache); the
counter takes its hooks out of torch's global hook dicts for the duration of every compile
(dynamo's compile start and end callbacks) and puts them back after.

Per torch version: 2.9 and later, as above (the counted step runs compiled). 2.8 (no
``ignore_compile_internals``): dynamo skips every frame under the mode, so the counted step
runs eagerly and is counted as eager, and caches the skip on each code object as an
exec strategy; ``_watch_skips`` notes those codes and ``_restore_skipped`` sets their strategy
back when the last counter leaves, so the compiled code (never dropped) runs again. Tested on
2.8.0 (tests/test_compiled.py::test_stays_compiled_after_counting fails there without it).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
import threading
import warnings
from typing import Callable

from dispatch_flops.engine.counting import active
from dispatch_flops.engine.counting.tracker import GLOBAL_HOOK_DICTS
from dispatch_flops.engine.graphs.compiled import Graph
from dispatch_flops.engine.torch_private import TorchDispatchMode, lookup

_COUNTING = active.COUNTING  # a counter counts: its hooks hidden from compiles
_LOCK = threading.RLock()  # _wrap_compiler may run inside a counter's import of dynamo


def has_ignore_compile_internals() -> bool:
    return hasattr(TorchDispatchMode, "ignore_compile_internals")


# -- installing ---------------------------------------------------------------------------
_INSTALLED: list[Callable] = []  # dynamo's own call_user_compiler, once wrapped
_DYNAMO = "torch._dynamo"  # the package: imported whole, compilers and callbacks included


# torch warns at every call of a compiled module (``OptimizedModule``) while any global module
# hook is installed, that the hook fires for the wrapper too. A counter's hooks are global and
# pass over the wrapper (the counter counts the module inside: ``unwrap``): the warning is
# about them, untrue, and repeated at every counted step (a "once" filter is not once: torch
# mutates the filters while it compiles, which resets Python's once-registry). Ignored, that
# message only; a user's own global hooks lose it too, which this filter is the price of.
_GLOBAL_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


def install() -> None:
    """Wrap every graph dynamo compiles from now on in a ``Graph`` (once per process): at
    once when dynamo is imported already, else the moment it is (``torch.compile`` imports
    it), so that importing this package does not import dynamo (seconds, for a process that
    never compiles) and no graph is compiled unseen."""
    warnings.filterwarnings("ignore", message=_GLOBAL_HOOKS_WARNING, category=UserWarning)
    if _DYNAMO in sys.modules:
        _wrap_compiler()
    elif not any(isinstance(f, _DynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _DynamoImport())


class _DynamoImport(importlib.abc.MetaPathFinder):
    """Calls ``_wrap_compiler`` right after the ``torch._dynamo`` package is imported (all of
    it: no graph can be compiled before), then takes itself off ``sys.meta_path``. A lookup
    that imports nothing (``importlib.util.find_spec``) or an import that fails leaves it in
    place; the loader found is wrapped, never changed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _DYNAMO:
            return None
        index = sys.meta_path.index(self) if self in sys.meta_path else None
        if index is not None:
            del sys.meta_path[index]  # the real finders answer, not this one
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            if index is not None:
                sys.meta_path.insert(index, self)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenWrap(spec.loader, self)
        return spec


class _ThenWrap(importlib.abc.Loader):
    """``loader``, which then wraps dynamo's compiler (``_wrap_compiler``)."""

    def __init__(self, loader, finder):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self.finder)
        _wrap_compiler()

    def __getattr__(self, name):  # resource readers and the like: the loader's own
        if name in ("loader", "finder"):
            raise AttributeError(name)
        return getattr(self.loader, name)


def _wrap_compiler() -> None:
    with _LOCK:
        if _INSTALLED:
            return
        if _DYNAMO not in sys.modules:  # no dynamo: nothing is compiled
            return
        # a torch that renamed it: one warning, graphs then run as compiled code, uncounted
        original = lookup("torch._dynamo.output_graph.OutputGraph.call_user_compiler")
        if original is None:
            return
        from torch._dynamo.output_graph import OutputGraph

        def call_user_compiler(self, gm, *args, **kwargs):
            compiled = original(self, gm, *args, **kwargs)
            if getattr(self, "export", False):
                return compiled
            backend = getattr(self, "compiler_fn", None)
            backend = getattr(backend, "compiler_name", None) or getattr(backend, "__name__",
                                                                         None)
            return Graph(gm, compiled, block_sparse=backend == "inductor")

        vars(call_user_compiler)["__wrapped__"] = original  # not a typed function attribute
        # a private torch class's method, patched: mypy flags any assignment to a method
        OutputGraph.call_user_compiler = call_user_compiler  # type: ignore[method-assign]
        _INSTALLED.append(original)
        if not has_ignore_compile_internals():
            _watch_skips()
        if _COUNTING:  # dynamo imported inside a counter's block: hide its hooks from now on
            _register_callbacks()


# -- torch < 2.9: the skips dynamo cached while a counter counted, undone -------------------
_SKIPPED: set = set()  # code objects dynamo skipped because a counting mode was on
_RESTORE: list = []  # set_code_exec_strategy and the strategy that lets dynamo look again


def _watch_skips() -> None:
    """Without ``ignore_compile_internals`` dynamo skips every frame it meets under a
    dispatch mode (its compiled code too: the frame runs eagerly, counted as eager) and
    caches the skip on the frame's code object: ``FrameExecStrategy(SKIP, DEFAULT)``, kept
    for every later call. torch 2.8 sets it from the frame callback's answer (in
    ``CatchErrorsWrapper``, where the mode check is) and can set it back
    (``set_code_exec_strategy``): the callback is wrapped to note the codes skipped while a
    counter counts, and ``_restore_skipped`` gives them back the default when the last
    counter leaves; their compiled code, never dropped, runs again."""
    found = [lookup(name) for name in (
        "torch._C._dynamo.eval_frame.set_code_exec_strategy",
        "torch._dynamo.types.FrameAction", "torch._dynamo.types.FrameExecStrategy",
        "torch.utils._python_dispatch.is_in_torch_dispatch_mode",
        "torch._dynamo.convert_frame.CatchErrorsWrapper.__call__")]
    if any(f is None for f in found):  # renamed (warned) or torch >= 2.9: not needed
        return
    set_code_exec_strategy, FrameAction, FrameExecStrategy, is_in_torch_dispatch_mode, \
        original = found
    from torch._dynamo.convert_frame import CatchErrorsWrapper as wrapper

    def __call__(self, frame, *args, **kwargs):
        result = original(self, frame, *args, **kwargs)
        if _COUNTING and getattr(result, "guarded_code", True) is None and \
                is_in_torch_dispatch_mode(include_infra_modes=False):
            _SKIPPED.add(frame.f_code)
        return result

    vars(__call__)["__wrapped__"] = original  # not a typed function attribute
    wrapper.__call__ = __call__  # type: ignore[method-assign]
    _RESTORE.append((set_code_exec_strategy,
                     FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT)))


def _restore_skipped() -> None:
    """Let dynamo look again at the codes it skipped while counters counted (see
    ``_watch_skips``)."""
    if not _RESTORE:
        return
    set_strategy, default = _RESTORE[0]
    while _SKIPPED:
        set_strategy(_SKIPPED.pop(), default)


# -- while a counter counts ---------------------------------------------------------------
def _hook_dicts():
    return [d for d in map(lookup, GLOBAL_HOOK_DICTS) if d is not None]


_HIDDEN: list = []  # (dict, key, value) taken out for a compile


def _hide_hooks(*_) -> None:
    """At a compile's start: take the counters' hooks out of torch's global hook dicts, so
    that dynamo neither traces them into the graph nor breaks it at every module call."""
    mine = set()
    for tracker in active.trackers():
        mine.update(tracker.hook_ids())
    if not mine:
        return
    for d in _hook_dicts():
        for key in [k for k in d if k in mine]:
            _HIDDEN.append((d, key, d.pop(key)))


def _show_hooks(*_) -> None:
    while _HIDDEN:
        d, key, value = _HIDDEN.pop()
        d[key] = value


def _callbacks():
    """dynamo's compile callbacks, where dynamo is imported (a counter does not import it:
    ``_wrap_compiler`` registers them if it is imported while a counter counts)."""
    if "torch._dynamo.callback" not in sys.modules:
        return None
    return lookup("torch._dynamo.callback.callback_handler")


def _register_callbacks() -> None:
    handler = _callbacks()
    if handler is not None:
        handler.register_start_callback(_hide_hooks)
        handler.register_end_callback(_show_hooks)


def _first_counter() -> None:
    """The first counter starts: its graphs count, its hooks are hidden from compiles."""
    with _LOCK:
        if not _INSTALLED and _DYNAMO in sys.modules:  # imported past the finder
            _wrap_compiler()
        _register_callbacks()


def _last_counter() -> None:
    """No counter counts any more: skipped codes back, compile callbacks off."""
    with _LOCK:
        _restore_skipped()
        handler = _callbacks()
        if handler is not None:
            for remove, fn in ((handler.remove_start_callback, _hide_hooks),
                               (handler.remove_end_callback, _show_hooks)):
                try:
                    remove(fn)
                except ValueError:
                    pass


active.when_first(_first_counter)
active.when_last(_last_counter)
